"""One-seat TextArena games (FrozenLake-v0) and seats played by several agents
(flexmarl.envs.seats): the held-out measure of a game played alone, the Seat's calls, labels
and credit, agents/frozenlake_pair.py's proposer and checker, the START copy of a Seat in a
two-player game; a one-seat game team end to end on real processes, with `flexmarl eval`."""
from __future__ import annotations

import asyncio
import collections
import json
import re
from pathlib import Path

import pytest

pytest.importorskip("textarena", reason="the envs extra: pip install -e '.[envs]'")

from flexmarl.envs.textarena import Game, Lineup, Seat, game_team  # noqa: E402
from flexmarl.team import AgentSpec, load_team  # noqa: E402
from tests.helpers.games import GameCtx  # noqa: E402

EXAMPLE = Path(__file__).resolve().parents[1] / "agents" / "frozenlake_pair.py"
STEPS = {(1, 0): "[down]", (-1, 0): "[up]", (0, 1): "[right]", (0, -1): "[left]"}


def board(prompt) -> list[list[str]]:
    """The last board of a FrozenLake prompt, one letter (or " ") per cell."""
    text = prompt[-1]["content"] if isinstance(prompt, list) else prompt
    last = text.rsplit("Current Board:", 1)[-1]
    return [[c.strip() or " " for c in line.strip("|").split("|")]
            for line in last.splitlines() if line.startswith("|")]


def solve(agent, prompt) -> str:
    """The first step of a shortest way to the goal that avoids every hole (breadth first)."""
    grid = board(prompt)
    cells = {(r, c): v for r, row in enumerate(grid) for c, v in enumerate(row)}
    start = next(p for p, v in cells.items() if v == "P")
    first = {start: None}
    queue = collections.deque([start])
    while queue:
        at = queue.popleft()
        if cells[at] == "G":
            while first[at] is not None and first[at] != start:
                at = first[at]
            return STEPS[(at[0] - start[0], at[1] - start[1])]
        for dr, dc in STEPS:
            nxt = (at[0] + dr, at[1] + dc)
            if cells.get(nxt, "H") != "H" and nxt not in first:
                first[nxt] = at
                queue.append(nxt)
    raise AssertionError(f"no way to the goal on {grid}")


async def _fixed(ctx, turn):
    return "[down]"


def test_a_one_seat_game_trains_alone_and_is_held_out_as_its_own_success_rate():
    """FrozenLake with one agent: no opponent and no frozen copy; each held-out board is
    played once (opponent "solo"): solved is a win (the reward reached 1), the reward is the
    return, every move is scored valid or not. A player walking into the wall loses its
    game with the share of the way it made; each rejected move gets invalid_reward."""
    team = game_team("FrozenLake-v0", [AgentSpec(name="p0", model="small")], train_games=4,
                     eval_games=3)
    assert [a.name for a in team.agents] == ["p0"]
    assert [(m.agent, m.opponent, m.seed) for m in team.heldout] == [
        ("p0", "solo", 1_000_000 + k) for k in range(3)]
    ctx = GameCtx(solve)
    asyncio.run(team.workflow(ctx, team.heldout[0]))
    # The steps that stay on the board, from the top-left corner (legal_moves).
    assert ctx.prompts[0][1][-1]["content"].endswith("Answer with [down] or [right].")
    moves = len(ctx.labels)
    assert ctx.labels == [("p0", f"g0.s0.m{k}") for k in range(moves)] and moves >= 6
    assert sorted(ctx.scores) == sorted(
        [("p0", "games.solo.invalid", 0.0)] * moves + [
            ("p0", "games.solo.win", 1.0), ("p0", "games.solo.draw", 0.0),
            ("p0", "games.solo.loss", 0.0), ("p0", "games.solo.return", 1.0)])
    assert ctx.rewards == [("p0", t, 1.0, 1 / moves) for _, t, _, _ in ctx.rewards]
    assert ctx.team == 1.0

    ctx = GameCtx(lambda agent, prompt: "[left]")  # the wall, twice: the game's end
    asyncio.run(team.workflow(ctx, Game("g", 0)))
    assert ctx.labels == [("p0", "s0.m0"), ("p0", "s0.m0.retry1")]
    assert [(v, w) for *_, v, w in ctx.rewards] == [(-1.0, 0.5), (-1.0, 0.5)]
    assert ctx.team == 0.0  # none of the way made
    ctx = GameCtx(lambda agent, prompt: "[left]")
    asyncio.run(team.workflow(ctx, team.heldout[1]))
    got = {n: v for _, n, v in ctx.scores if not n.endswith("invalid")}
    assert got == {"games.solo.win": 0.0, "games.solo.draw": 0.0, "games.solo.loss": 1.0,
                   "games.solo.return": 0.0}


@pytest.mark.parametrize("env_id, players, kwargs, message", [
    ("FrozenLake-v0", ["p0"], {}, "neither an AgentSpec, a Seat"),
    ("FrozenLake-v0", [AgentSpec(name="p0", model="small")], {"opponents": ["start"]},
     "no opponents"),
    ("KuhnPoker-v0", [AgentSpec(name="p0", model="small")], {}, "does not play with 1"),
    ("FrozenLake-v0", [AgentSpec(name="p0", model="small"), "p0"], {"opponents": []},
     "does not play with 2"),
    ("FrozenLake-v0", [Seat("solo", [AgentSpec(name="a", model="small")], _fixed)], {},
     "reserved"),
])
def test_a_wrong_one_seat_team_is_refused_with_the_reason(env_id, players, kwargs, message):
    with pytest.raises((ValueError, TypeError), match=message):
        game_team(env_id, players, train_games=4, **kwargs)


def test_a_seat_is_checked_and_only_game_team_takes_one():
    a, b = AgentSpec(name="a", model="small"), AgentSpec(name="b", model="small")
    with pytest.raises(TypeError, match="coroutine"):
        Seat("pair", [a, b], solve)
    with pytest.raises(ValueError, match="repeat"):
        Seat("pair", [a, a], _fixed)
    with pytest.raises(ValueError, match="must start with a letter"):
        Seat("a pair", [a, b], _fixed)
    with pytest.raises(ValueError, match="already used"):
        game_team("TicTacToe-v0", [Seat("pair", [a, b], _fixed), a], train_games=4)
    with pytest.raises(ValueError, match="for TextArena's game_team"):  # openspiel_team's rule
        Lineup.of("kuhn_poker", [Seat("pair", [a, b], _fixed), "random"], ["random"], 1,
                  train_games=4, seed=0, eval_seed=100)


def test_the_pair_proposes_checks_and_both_are_credited_per_call():
    """agents/frozenlake_pair.py: the checker says no to the first proposal of each move and
    the proposer is asked again; every call is labelled by its move, agent and call, and
    credited the game's reward (or -1 when the env rejected the move it was made for),
    weighted 1/k for each agent's k calls. The held-out board's scores are both agents'."""
    team = load_team(EXAMPLE)
    assert [a.name for a in team.agents] == ["proposer", "checker"]
    assert {(m.agent, m.opponent) for m in team.heldout} == {("pair", "solo")}
    checks, proposals = [], []

    def policy(agent, prompt):  # the checker rejects the first proposal, the second is played
        if agent == "checker":
            checks.append(prompt)
            return "[no]"
        proposals.append(prompt)
        return "[up]" if len(proposals) % 2 else solve(agent, prompt)
    ctx = GameCtx(policy)
    asyncio.run(team.workflow(ctx, Game("g", 1)))
    assert ctx.labels[:3] == [("proposer", "s0.m0.proposer"), ("checker", "s0.m0.checker"),
                              ("proposer", "s0.m0.proposer.call2")]
    assert len(ctx.labels) % 3 == 0 and ctx.team == 1.0  # solved, two proposals a move
    # The checker saw the seat's prompt, the proposal and the question.
    assert [m["role"] for m in checks[0]] == ["system", "user", "assistant", "user"]
    assert checks[0][2]["content"] == "[up]" and "[yes] or [no]" in checks[0][3]["content"]
    weights = collections.Counter()
    for agent, _, value, weight in ctx.rewards:
        assert value == 1.0
        weights[agent] += weight
    assert weights == pytest.approx({"proposer": 1.0, "checker": 1.0})  # each game counts once

    ctx = GameCtx(lambda agent, prompt: "[yes]" if agent == "checker" else "[left]")
    asyncio.run(team.workflow(ctx, team.heldout[0]))  # the wall twice: both moves rejected
    assert ctx.labels == [("proposer", "g0.s0.m0.proposer"), ("checker", "g0.s0.m0.checker"),
                          ("proposer", "g0.s0.m0.retry1.proposer"),
                          ("checker", "g0.s0.m0.retry1.checker")]
    assert [(a, v, w) for a, _, v, w in ctx.rewards] == [
        ("proposer", -1.0, 0.5), ("checker", -1.0, 0.5)] * 2
    scores = collections.defaultdict(list)
    for agent, name, value in ctx.scores:
        scores[agent, name].append(value)
    for agent in ("proposer", "checker"):
        assert scores[agent, "games.solo.invalid"] == [1.0, 1.0]  # per call of the agent
        assert scores[agent, "games.solo.win"] == [0.0]


def test_a_seat_function_may_reward_its_own_calls_and_must_name_its_agents():
    """A call the function rewarded itself keeps that reward and leaves the game's credit
    (and its weights) to the others; a call to an agent that is not the seat's fails."""
    async def judged(ctx, turn):
        [move] = await ctx.generate("mover", turn.prompt)
        [note] = await ctx.generate("critic", turn.prompt, turn="note")
        ctx.reward(note, 0.25)
        return move
    players = [Seat("pair", [AgentSpec(name="mover", model="small"),
                             AgentSpec(name="critic", model="small")], judged)]
    team = game_team("FrozenLake-v0", players, train_games=2, eval_games=1)
    ctx = GameCtx(lambda agent, prompt: solve(agent, prompt) if agent == "mover" else "ok")
    asyncio.run(team.workflow(ctx, Game("g", 1)))
    critic = [(v, w) for a, _, v, w in ctx.rewards if a == "critic"]
    mover = [(v, w) for a, _, v, w in ctx.rewards if a == "mover"]
    assert critic == [(0.25, 1.0)] * len(mover) and {v for v, _ in mover} == {1.0}
    assert sum(w for _, w in mover) == pytest.approx(1.0)
    assert ("critic", "s0.m0.critic.note") in ctx.labels

    async def stranger(ctx, turn):
        return (await ctx.generate("someone", turn.prompt))[0]
    team = game_team("FrozenLake-v0", [Seat("pair", [AgentSpec(name="a", model="small")],
                                            stranger)], train_games=2, eval_games=1)
    with pytest.raises(ValueError, match="not one of the seat's agents"):
        asyncio.run(team.workflow(GameCtx(solve), Game("g", 1)))

    async def nothing(ctx, turn):
        return None
    team = game_team("FrozenLake-v0", [Seat("pair", [AgentSpec(name="a", model="small")],
                                            nothing)], train_games=2, eval_games=1)
    with pytest.raises(TypeError, match="must return the move"):
        asyncio.run(team.workflow(GameCtx(solve), Game("g", 1)))


def test_a_seat_in_a_two_player_game_meets_its_own_starting_copies():
    """Tic-Tac-Toe, a Seat against the random player and against "start": the same function
    with the agents' frozen starting copies answering (one copy for both: one model), its
    calls labelled apart; only the Seat's own agents are credited and scored."""
    async def pair(ctx, turn):
        move = await turn.ask("mover")
        await turn.ask("critic", [{"role": "assistant", "content": move.text},
                                  {"role": "user", "content": "Good?"}])
        return move
    team = game_team("TicTacToe-v0", [Seat("pair", [AgentSpec(name="mover", model="small"),
                                                    AgentSpec(name="critic", model="small")],
                                           pair), "random"], train_games=2, eval_games=1)
    assert [a.name for a in team.agents] == ["mover", "critic", "start"]
    match = next(m for m in team.heldout if m.opponent == "start")
    ctx = GameCtx(lambda agent, prompt: re.findall(r"\[\d\]", prompt[1]["content"])[-1])
    asyncio.run(team.workflow(ctx, match))
    starts = [label for agent, label in ctx.labels if agent == "start"]
    assert starts and len(starts) == len(set(starts))  # both roles' calls apart
    assert {label.split(".")[-1] for label in starts} == {"mover", "critic"}
    assert {a for a, *_ in ctx.rewards} == {"mover", "critic"}
    assert {a for a, *_ in ctx.scores} == {"mover", "critic"}
    assert {n for _, n, _ in ctx.scores} >= {"games.start.seat0.win", "games.start.unmoved"}


@pytest.mark.slow
async def test_a_one_seat_game_trains_and_flexmarl_eval_measures_it_as_the_run_did(
        tiny_model_dir, tmp_path, capsys, no_leftover_children):
    """agents/frozenlake_pair.py's proposer and checker on the tiny model (its prompts cut to
    the tiny model's 512 tokens; the tiny model writes no move, so the step played is a legal
    one its reply picks: games that end apart, so both agents train): two steps, the before
    and after measurements of the pair alone; then `flexmarl eval RUN_DIR` of the final
    checkpoints, in this process, gives the scores
    the run's own final measurement gave (RUN_DIR/eval.json "after": the same deals, modes
    and seeds) and each agent's change from the run's before measurement."""
    from flexmarl.config.load import load_config
    from flexmarl.launch.run import train
    from flexmarl.observe.rundir import RunDir
    from tests.helpers.workers import flexmarl_cli as cli

    path = tmp_path / "pair.py"
    path.write_text(PAIR_FILE.format(example=EXAMPLE, model=tiny_model_dir))
    config = load_config(overrides=[
        f"run.dir={tmp_path / 'run'}", "run.steps=2", "rollout.backend=torch",
        f"team.path={path}", "pipeline.tasks_per_step=2", "pipeline.trajectories_per_task=2",
        "eval.modes=['sampled']", "eval.before_tasks=1", "eval.final_tasks=2",
        "observe.report=false"])
    result = await asyncio.wait_for(train(load_team(path), config,
                                          run_dir=RunDir.create(config), progress=False), 300)
    assert [r["step"] for r in result.metrics] == [0, 1]
    assert all(r["failed_trajectories"] == 0 for r in result.metrics)
    for agent in ("proposer", "checker"):
        assert sum(r["agents"][agent]["trained_samples"] for r in result.metrics) > 0
    assert result.final_eval["failed"] == 0 and result.final_eval["tasks"] == 2
    assert min(v for v, _ in result.final_eval["versions"].values()) >= 1  # trained weights
    after = result.final_eval["after"]["sampled"]["agents"]
    for agent in ("proposer", "checker"):
        scores = result.heldout[agent]["sampled"]["scores"]
        assert scores["games.solo.win"]["n"] == 2
        assert after[agent]["scores"]["games.solo.return"]["n"] == 2
        assert not any(".seat" in n or "unmoved" in n for n in scores)

    assert await cli("eval", str(result.run_dir), "--json") == 0
    out = capsys.readouterr().out.strip().splitlines()
    again = json.loads(out[-1])
    assert again["weights"] == "final" and again["mode"] == "sampled (n=1)"
    assert again["agents"] == after  # the same scores, every one of them
    assert again["heldout"] == result.heldout
    assert any(line.startswith("flexmarl: proposer vs solo: win ") for line in out)


PAIR_FILE = '''
import importlib.util

from flexmarl import AgentSpec, SamplingParams
from flexmarl.envs.textarena import Seat, game_team

spec = importlib.util.spec_from_file_location("frozenlake_pair_example", "{example}")
example = importlib.util.module_from_spec(spec)
spec.loader.exec_module(example)


async def pair(ctx, turn):  # the example's calls; a legal step picked by the reply's length
    proposal = await example.propose_and_check(ctx, turn)
    return turn.moves[len(proposal.text) % len(turn.moves)]

team = game_team("FrozenLake-v0", [Seat("pair", [
    AgentSpec(name="proposer", model="{model}", sampling=SamplingParams(max_tokens=8)),
    AgentSpec(name="checker", model="{model}", sampling=SamplingParams(max_tokens=4))],
    pair)], train_games=8, eval_games=2, system="Play.", max_prompt_chars=200)
'''


def test_a_reward_of_one_is_not_a_solve_when_the_game_was_lost_or_forfeited():
    """The review's 2048 games: TextArena pays 2048's progress, capped at 1.0, on a lost board
    and on a forfeit by rejected moves; games.solo.win counts neither (solved())."""
    from flexmarl.envs.textarena import SoloRewards, make_env, outcome, solved

    env = make_env("2048-v0-mega-easy")  # target tile 64
    env.reset(1, 0)
    inner = env.env
    while hasattr(inner, "env"):
        inner = inner.env
    assert inner.target_tile == 64
    inner.state.game_state["board"] = [[32, 2, 4, 2], [2, 4, 2, 4], [4, 2, 4, 2], [2, 4, 2, 4]]
    assert not solved(env, {0: 1.0}, {})                      # lost at progress 1.0
    inner.state.game_state["board"][0][0] = 64
    assert solved(env, {0: 1.0}, {})                          # the target tile: solved
    assert not solved(env, {0: 1.0}, {0: {"invalid_move": True}})  # a forfeit never is
    lake = make_env("FrozenLake-v0")
    lake.reset(1, 0)
    assert solved(lake, {0: 1.0}, {0: {"reason": "goal"}}) and not solved(lake, {0: 0.5}, {})
    assert outcome(SoloRewards({0: 1.0}, solved=False), 0, solo=True) == "loss"
    assert outcome(SoloRewards({0: 1.0}, solved=True), 0, solo=True) == "win"
    assert outcome({0: -1.0}, 0, solo=True) == "loss"         # a reply that broke the env


def test_a_seat_function_that_raises_forfeits_the_game_and_the_game_still_counts(caplog):
    """A reply the function cannot parse (its own exception) is the seat's forfeit: a loss in
    the held-out measure, its move's calls rewarded as rejected, never a game that vanishes
    from the measure by failing (the review's suspicion); a failed model call still fails."""
    async def picky(ctx, turn):
        [proposal] = await ctx.generate("a", turn.prompt)
        raise KeyError(f"cannot parse {proposal.text!r}")
    team = game_team("FrozenLake-v0", [Seat("pair", [AgentSpec(name="a", model="small")],
                                            picky)], train_games=2, eval_games=1)
    ctx = GameCtx(lambda agent, prompt: "no idea")
    asyncio.run(team.workflow(ctx, team.heldout[0]))
    got = {n: v for _, n, v in ctx.scores if not n.endswith("invalid")}
    assert got["games.solo.loss"] == 1.0 and got["games.solo.win"] == 0.0
    assert [v for *_, v, _ in ctx.rewards] == [-1.0]  # game_team's invalid_reward
    assert "the seat forfeits the game" in caplog.text

    class Dead(GameCtx):
        async def generate(self, agent, prompt, **kwargs):
            raise ConnectionError("the rollout instance died")
    with pytest.raises(ConnectionError):
        asyncio.run(team.workflow(Dead(solve), team.heldout[0]))

