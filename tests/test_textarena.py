"""flexmarl.envs.textarena on real TextArena games (Kuhn Poker, Tic-Tac-Toe): the env's own rules,
invalid moves and rewards; credit and weights per move; legal moves; the global RNG left alone;
the team's held-out matches and their scores; a game team end to end on real processes."""
from __future__ import annotations

import asyncio
import dataclasses
import random
import sys
import types

import pytest

pytest.importorskip("textarena", reason="the envs extra: pip install -e '.[envs]'")

from flexmarl.envs.textarena import (Game, GameRules, Match, RANDOM, credit, game_team,  # noqa: E402
                                     legal_moves, make_env, outcome, play, trim)
from flexmarl.team import AgentSpec  # noqa: E402
from tests.helpers.games import GameCtx  # noqa: E402


def listed(prompt) -> list[str]:
    """The moves the instruction line names ("Your move? Answer with [a] or [b].")."""
    import re
    return re.findall(r"\[[^\]]*\]", prompt[-1]["content"].rsplit("\n", 1)[-1])


def first_legal(agent, prompt) -> str:
    return listed(prompt)[0]


KUHN = GameRules(env_id="KuhnPoker-v0", num_players=2, env_kwargs=(("max_rounds", 1),))


def test_a_kuhn_hand_is_played_by_the_envs_rules_and_scored_by_its_rewards():
    ctx = GameCtx(first_legal)  # always the first listed move: check, then check: showdown
    rewards, moves, flags = asyncio.run(play(ctx, KUHN, ["a", "b"], seed=3))
    assert sorted(rewards.values()) == [-1.0, 1.0]  # a showdown: one wins the pot
    assert [m.text for m in moves[1]] == ["[check]"] and [m.text for m in moves[0]] == ["[check]"]
    assert flags == {0: [False], 1: [False]}
    # player 1 moves first in round 1; the prompt is [system, observation + the instruction]
    assert [a for a, _ in ctx.prompts] == ["b", "a"]
    system, user = ctx.prompts[0][1]
    assert system["role"] == "system" and "Kuhn Poker" in user["content"]
    assert user["content"].endswith("Your move? Answer with [check] or [bet].")


def test_an_invalid_move_is_retried_once_then_loses_as_the_env_rules():
    script = {"b": ["I raise!", "[bet]"], "a": ["[call]"]}  # b: one bad move, then a bet
    ctx = GameCtx(lambda agent, prompt: script[agent].pop(0))
    rewards, moves, flags = asyncio.run(play(ctx, KUHN, ["a", "b"], seed=3))
    assert flags[1] == [True, False] and flags[0] == [False]
    assert "attempted an invalid move" in ctx.prompts[1][1][-1]["content"]  # the env said so
    # Each call labelled with its seat's move number (its accepted moves so far) and its
    # attempt: the retry is a turn of its own, not the seat's next move.
    assert ctx.labels == [("b", "s1.m0"), ("b", "s1.m0.retry1"), ("a", "s0.m0")]
    credit(ctx, KUHN, {"a", "b"}, ["a", "b"], rewards, moves, flags)
    by_text = {t: (v, w) for _, t, v, w in ctx.rewards}
    assert by_text["I raise!"] == (-1.0, 0.5)  # a rejected move: invalid_reward, weight 1/2
    assert by_text["[bet]"] == (rewards[1], 0.5)
    assert by_text["[call]"] == (rewards[0], 1.0)

    ctx = GameCtx(lambda agent, prompt: "nonsense")  # two in a row: the mover loses
    rewards, moves, flags = asyncio.run(play(ctx, KUHN, ["a", "b"], seed=3))
    assert rewards == {1: -1.0, 0: 1.0} and flags == {0: [], 1: [True, True]}
    assert outcome(rewards, 0) == "win" and outcome(rewards, 1) == "loss"
    plain = dataclasses.replace(KUHN, per_game_weight=False, invalid_reward=None)
    ctx.rewards.clear()
    credit(ctx, plain, {"b"}, ["a", "b"], rewards, moves, flags)
    assert [(v, w) for _, _, v, w in ctx.rewards] == [(-1.0, 1.0), (-1.0, 1.0)]


def test_a_random_player_only_plays_legal_moves_and_games_end():
    rules = GameRules(env_id="TicTacToe-v0", num_players=2)
    results = []
    for seed in range(30):
        ctx = GameCtx(first_legal, input_id=f"t{seed}")
        rewards, moves, flags = asyncio.run(play(ctx, rules, [RANDOM, "x"], seed))
        assert not any(flags[1]) and moves[0] == []  # the random seat makes no call
        results.append(outcome(rewards, 0))
    assert set(results) <= {"win", "draw", "loss"} and len(set(results)) >= 2
    env = make_env("TicTacToe-v0")
    env.reset(2, 0)
    _, observation = env.observe()
    assert legal_moves(env, observation) == [f"[{i}]" for i in range(9)]


def test_games_leave_the_global_random_alone_and_interleaved_deal_as_alone():
    def deal(seed, interleave):
        env = make_env("KuhnPoker-v0")
        env.reset(2, seed)
        other = make_env("KuhnPoker-v0")
        other.reset(2, seed + 1)
        cards = []
        for _ in range(6):  # 3 rounds of checks: a new deal each round
            _, obs = env.observe()
            if env.step("[check]"):
                break
            if interleave:
                other.step("[bet]")
            cards.append(obs.rsplit("Your card is:", 1)[-1][:5])
        return cards

    random.seed(123)
    expected = random.random()
    random.seed(123)
    alone = deal(7, interleave=False)
    assert random.random() == expected  # TextArena's reseeding stayed inside the env
    assert deal(7, interleave=True) == alone


def test_trim_keeps_the_rules_and_the_latest_moves():
    obs = "\n[GAME] rules " + "r" * 100 + "".join(f"\n[Player {i % 2}] move {i}" for i in range(50))
    cut = trim(obs, 200)
    assert len(cut) <= 200 and cut.startswith("\n[GAME] rules") and cut.endswith("move 49")
    assert "\n[...]\n" in cut and "move 0\n" not in cut
    assert trim(obs, 10_000) == obs
    assert len(trim("\n[GAME] " + "x" * 500 + "\n[GAME] last", 100)) <= 100


def test_a_game_team_has_its_players_a_frozen_start_copy_and_balanced_matches():
    spec = AgentSpec(name="p0", model="small")
    team = game_team("KuhnPoker-v0", [spec, AgentSpec(name="p1", model="small")],
                     train_games=10, eval_games={"start": 3, "random": 1})
    assert [(a.name, a.trainable) for a in team.agents] == [("p0", True), ("p1", True),
                                                            ("start", False)]
    assert {t.seed for t in team.tasks} == set(range(10))
    first = team.heldout[:4]
    assert {(m.agent, m.opponent) for m in first} == {("p0", "start"), ("p0", "random"),
                                                      ("p1", "start"), ("p1", "random")}
    assert [m.seed for m in team.heldout if (m.agent, m.opponent) == ("p1", "start")] == \
        [1_000_000, 1_000_001, 1_000_002]  # each deal once per pair, played in every seat
    assert len(team.heldout) == 8 and all(m.seed >= 1_000_000 for m in team.heldout)
    # Eval counts are games per (agent, opponent) pair, whatever each pair's number of games:
    # 2 is both start deals of each agent and the one random deal (a prefix of 2 x 4 tasks
    # would have taken all three start deals).
    from flexmarl.config.pipeline import EvalConfig
    from flexmarl.orchestrator.evaluate import heldout_tasks
    two = heldout_tasks(team, EvalConfig(final_tasks=2), final=True)
    assert sorted((m.agent, m.opponent, m.seed - 1_000_000) for m in two) == [
        ("p0", "random", 0), ("p0", "start", 0), ("p0", "start", 1),
        ("p1", "random", 0), ("p1", "start", 0), ("p1", "start", 1)]
    starter = game_team("TicTacToe-v0", [AgentSpec(name="starter", model="small"), RANDOM],
                        train_games=4, eval_games=1)  # only "start" and "start_N" are reserved
    assert [a.name for a in starter.agents] == ["starter", "start"]
    with pytest.raises(ValueError, match="reserved"):
        game_team("TicTacToe-v0", [AgentSpec(name="start_2", model="small"), RANDOM])
    shared = game_team("TicTacToe-v0", [spec, "p0"], train_games=4, eval_games=2,
                       opponents=["random"])
    assert [a.name for a in shared.agents] == ["p0"]
    assert [m.seed for m in shared.heldout] == [1_000_000, 1_000_001]


@pytest.mark.parametrize("players, kwargs, message", [
    ([], {}, "one player per seat"),
    ([AgentSpec(name="p0", model="small"), "nobody"], {}, "neither an AgentSpec"),
    ([AgentSpec(name="p0", model="small"), AgentSpec(name="p0", model="small")], {},
     "already used"),
    ([AgentSpec(name="p0", model="small"), AgentSpec(name="p1", model="small", trainable=False)
      ], {"opponents": ["ghost"]}, "opponent 'ghost'"),
    ([AgentSpec(name="p0", model="small"), RANDOM], {"eval_seed": 5}, "overlap"),
    ([AgentSpec(name="p0", model="small"), RANDOM], {"eval_games": {"bogus": 1}}, "eval_games"),
    ([AgentSpec(name="p0", model="small", trainable=False), RANDOM], {}, "no seat"),
])
def test_a_wrong_game_team_is_refused_with_the_reason(players, kwargs, message):
    with pytest.raises(ValueError, match=message):
        game_team("KuhnPoker-v0", players, train_games=10, **kwargs)


def test_an_unknown_env_or_player_count_or_unknowable_moves_is_refused_at_build():
    spec = AgentSpec(name="p0", model="small")
    with pytest.raises(ValueError, match="no env 'Nope-v0'"):
        game_team("Nope-v0", [spec, RANDOM])
    with pytest.raises(ValueError, match="does not play with 3 players"):
        game_team("KuhnPoker-v0", [spec, "p0", "p0"], opponents=[])
    with pytest.raises(ValueError, match="needs the legal moves"):
        game_team("SimpleNegotiation-v0", [spec, RANDOM])


def test_a_match_plays_its_deal_in_every_seat_and_scores_each_and_both():
    """Duplicate format: the agent plays the deal in seat 0 and in seat 1 against its frozen
    start. p1 always bets, the start always folds: in seat 1 (first to act) p1 bets and the
    start folds, a win; in seat 0 the start's fold is no legal opening, twice, and the game
    ends before p1 ever had a turn: the start's forfeit, a win for p1 too (every game is
    scored as the game scored it; "unmoved" says how many ended so)."""
    team = game_team("KuhnPoker-v0", [AgentSpec(name="p0", model="small"),
                                      AgentSpec(name="p1", model="small")],
                     train_games=4, eval_games=2, env_kwargs={"max_rounds": 1})
    match = next(m for m in team.heldout if m.agent == "p1" and m.opponent == "start")
    ctx = GameCtx(lambda agent, prompt: "[bet]" if agent == "p1" else "[fold]")
    asyncio.run(team.workflow(ctx, match))
    assert {a for a, _ in ctx.prompts} == {"p1", "start"}
    assert sorted(ctx.scores) == [
        ("p1", "games.start.draw", 0.0), ("p1", "games.start.invalid", 0.0),
        ("p1", "games.start.loss", 0.0), ("p1", "games.start.return", 1.0),
        ("p1", "games.start.seat0.draw", 0.0), ("p1", "games.start.seat0.loss", 0.0),
        ("p1", "games.start.seat0.win", 1.0), ("p1", "games.start.seat1.draw", 0.0),
        ("p1", "games.start.seat1.loss", 0.0), ("p1", "games.start.seat1.win", 1.0),
        ("p1", "games.start.unmoved", 0.5), ("p1", "games.start.win", 1.0)]
    assert [(a, v) for a, _, v, _ in ctx.rewards] == [("p1", 1.0)]  # only the agent is credited
    assert {label for a, label in ctx.labels if a == "p1"} == {"g1.s1.m0"}
    # Both seats played: the seat-balanced rate is their mean.
    ctx = GameCtx(first_legal)  # check, check: a showdown, one seat's card wins
    asyncio.run(team.workflow(ctx, match))
    got = {n: v for _, n, v in ctx.scores}
    seats = [got[f"games.start.seat{i}.win"] for i in (0, 1)]
    assert got["games.start.win"] == sum(seats) / 2 and got["games.start.unmoved"] == 0.0
    ctx = GameCtx(first_legal)
    asyncio.run(team.workflow(ctx, Game("g", 5)))  # training: both seats credited, no score
    assert {a for a, *_ in ctx.rewards} == {"p0", "p1"} and ctx.scores == [] and ctx.team == 0.0
    assert isinstance(match, Match)


def test_a_forfeit_counts_against_whoever_made_it_so_no_one_chooses_what_is_scored():
    """Both sides only ever write nonsense: in each seat's game the opener forfeits (two
    invalid moves) before the other has a turn. Each forfeit is the forfeiter's loss: the
    agent wins the game the start opens and loses the one it opens, 0.5 seat-balanced, as
    two identical players must. Leaving such games out instead would let an opener drop the
    games it would lose by forfeiting them (a red team's policy did: its win rate barely fell
    while its true return fell by half)."""
    team = game_team("KuhnPoker-v0", [AgentSpec(name="p0", model="small"),
                                      AgentSpec(name="p1", model="small")],
                     train_games=4, eval_games=1, env_kwargs={"max_rounds": 1})
    match = next(m for m in team.heldout if m.agent == "p0" and m.opponent == "start")
    ctx = GameCtx(lambda agent, prompt: "nonsense")
    asyncio.run(team.workflow(ctx, match))
    got = {}
    for _, name, value in ctx.scores:
        got.setdefault(name, []).append(value)
    assert got["games.start.invalid"] == [1.0, 1.0]  # its own two rejected openings
    assert got["games.start.win"] == [0.5] and got["games.start.unmoved"] == [1.0]
    assert got["games.start.return"] == [0.0]
    assert sorted([got["games.start.seat0.win"][0], got["games.start.seat1.win"][0]]) == [0, 1]


def test_a_failing_game_of_a_match_stops_the_others_and_raises_its_own_error():
    """The deal's games run at once: one that fails (here a call refused in game 1) cancels
    the others (game 0's call, waiting forever), so no call outlives its trajectory, and the
    trajectory fails with that game's error itself."""
    team = game_team("KuhnPoker-v0", [AgentSpec(name="p0", model="small"),
                                      AgentSpec(name="p1", model="small")],
                     train_games=4, eval_games=1, env_kwargs={"max_rounds": 1})
    match = next(m for m in team.heldout if m.agent == "p0" and m.opponent == "start")
    cancelled = []

    class Failing(GameCtx):
        async def generate(self, agent, prompt, *, turn=None, **kw):
            if turn.startswith("g1."):
                raise RuntimeError("game 1 broke")
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                cancelled.append(turn)
                raise

    with pytest.raises(RuntimeError, match="game 1 broke"):
        asyncio.run(team.workflow(Failing(first_legal), match))
    assert cancelled and all(t.startswith("g0.") for t in cancelled)


def test_a_prompt_too_long_for_the_context_is_cut_until_it_fits():
    """The default max_prompt_chars (4,000) against a small context: the prompt is halved
    until the agent takes it, and that size is kept for the player's next moves."""
    from flexmarl.checks import RequestError

    class Tight(GameCtx):
        async def generate(self, agent, prompt, **kw):
            if len(prompt[-1]["content"]) > 700:
                raise RequestError("the prompt has too many tokens", param="prompt")
            return await super().generate(agent, prompt, **kw)
    rules = GameRules(env_id="TicTacToe-v0", num_players=2)
    ctx = Tight(first_legal)
    rewards, moves, _ = asyncio.run(play(ctx, rules, ["x", "o"], seed=1))
    assert sum(len(m) for m in moves.values()) == len(ctx.prompts) >= 5  # every move played
    assert all(len(p[-1]["content"]) <= 700 for _, p in ctx.prompts)

    class Hopeless(GameCtx):
        async def generate(self, agent, prompt, **kw):
            raise RequestError("max_tokens asks for too many", param="max_tokens")
    # It stops at MIN_PROMPT_CHARS and says why, naming what to change beside the context.
    with pytest.raises(RequestError, match=r"too many; the game's transcript is cut to 250 "
                       r"characters already .*max_prompt_chars = 4000 .*lower the agent's "
                       r"max_tokens .*set max_prompt_chars below 250") as refused:
        asyncio.run(play(Hopeless(first_legal), rules, ["x", "o"], seed=1))
    assert refused.value.param == "max_tokens"


@pytest.mark.parametrize("env_id", ["Nim-v0", "ThreePlayerTicTacToe-v0", "ConnectFour-v0"])
def test_a_game_team_with_the_documented_defaults_builds_and_plays(env_id):
    """Games the other tests do not name, built as docs/games.md shows (one AgentSpec per
    seat, nothing else): no refusal (a random opponent only where the game's legal moves are
    known), and a held-out match plays through every seat."""
    from flexmarl.envs.textarena import _knows_moves
    players = 3 if env_id.startswith("ThreePlayer") else 2
    specs = [AgentSpec(name=f"p{i}", model="small") for i in range(players)]
    team = game_team(env_id, specs, train_games=4, eval_games=1)
    opponents = {m.opponent for m in team.heldout}
    assert ("random" in opponents) == _knows_moves(env_id, players, None)
    assert "start" in opponents
    match = team.heldout[0]
    ctx = GameCtx(lambda agent, prompt: (listed(prompt) or ["[0]"])[0])
    asyncio.run(team.workflow(ctx, match))
    names = {n for _, n, _ in ctx.scores}
    assert f"games.{match.opponent}.unmoved" in names
    assert {f"games.{match.opponent}.seat{i}.win" for i in range(players)} >= {
        n for n in names if ".seat" in n and n.endswith(".win")}


def test_without_the_extra_the_error_names_it(monkeypatch):
    from flexmarl.envs import MissingExtra
    monkeypatch.setitem(sys.modules, "textarena", None)
    with pytest.raises(MissingExtra, match=r"pip install -e '\.\[envs\]'"):
        make_env("KuhnPoker-v0")


KUHN_TEAM_FILE = '''
from flexmarl import AgentSpec
from flexmarl.envs.textarena import game_team

team = game_team("KuhnPoker-v0", [AgentSpec(name=n, model="{model}") for n in ("p0", "p1")],
                 train_games=8, eval_games=3, system="Play.", env_kwargs={{"max_rounds": 1}},
                 max_prompt_chars=260)
'''


@pytest.mark.slow
async def test_a_game_team_trains_and_is_measured_against_its_opponents(
        tiny_model_dir, tmp_path, capsys, no_leftover_children):
    """Kuhn Poker between two tiny models on real processes: two steps, then the before and
    after measurements of both players against the frozen start and the random player; then
    `flexmarl eval RUN_DIR` of the final checkpoints measures the matches as the run did (the
    same deals, modes and seeds: the scores of RUN_DIR/eval.json "after", and each agent's
    change from the run's before measurement, printed per agent and opponent)."""
    import json

    from flexmarl.config.load import load_config
    from flexmarl.launch.run import train
    from flexmarl.observe.rundir import RunDir
    from flexmarl.team import load_team
    from tests.helpers.workers import flexmarl_cli as cli

    path = tmp_path / "kuhn.py"
    path.write_text(KUHN_TEAM_FILE.format(model=tiny_model_dir))
    team = load_team(path)
    config = load_config(overrides=[
        f"run.dir={tmp_path / 'run'}", "run.steps=2", "rollout.backend=torch",
        f"team.path={path}", "pipeline.tasks_per_step=2", "pipeline.trajectories_per_task=2",
        "eval.modes=['sampled']", "eval.before_tasks=1", "observe.report=false"])
    result = await asyncio.wait_for(train(team, config, run_dir=RunDir.create(config),
                                          progress=False), 300)
    assert [r["step"] for r in result.metrics] == [0, 1]
    assert all(r["failed_trajectories"] == 0 for r in result.metrics)
    assert result.final_eval["failed"] == 0 and result.final_eval["tasks"] == 12
    before = result.final_eval["before"]["sampled"]
    assert before["tasks"] == 4 and "greedy" not in result.final_eval["after"]
    # eval.before_tasks=1 is one game per (agent, opponent) pair: the first 4 held-out
    # matches, one of each, as Team.heldout interleaves them (Team.heldout_round).
    first = [(m.agent, m.opponent) for m in team.heldout[:4]]
    assert sorted(first) == [(a, o) for a in ("p0", "p1") for o in ("random", "start")]
    for agent in ("p0", "p1"):
        scores = result.heldout[agent]["sampled"]["scores"]
        measured = before["agents"][agent]["scores"]
        for opponent in ("start", "random"):
            # Every deal says how many of its games ended before every seat moved (tiny
            # random models often forfeit the opening): those are scored like any other.
            unmoved = scores[f"games.{opponent}.unmoved"]
            assert unmoved["n"] == 3 and 0.0 <= unmoved["after"] <= 1.0
            assert measured[f"games.{opponent}.unmoved"]["n"] == 1
            cells = [scores.get(f"games.{opponent}.{k}") for k in ("win", "draw", "loss")]
            # Seat-balanced: per deal the mean over its seats, the three adding to 1, over
            # the 3 deals played.
            assert sum(c["after"] for c in cells) == pytest.approx(1.0), (agent, opponent)
            assert all(c["n"] == 3 for c in cells)
            for k, cell in zip(("win", "draw", "loss"), cells):
                if cell.get("before") is not None:
                    assert cell["before"] == measured[f"games.{opponent}.{k}"]["mean"]

    assert await cli("eval", str(result.run_dir), "--json") == 0
    out = capsys.readouterr().out.strip().splitlines()
    again = json.loads(out[-1])
    assert again["mode"] == "sampled (n=1)" and again["tasks"] == 12
    assert again["agents"] == result.final_eval["after"]["sampled"]["agents"]
    assert again["heldout"] == result.heldout
    assert sum(line.startswith(("flexmarl: p0 vs ", "flexmarl: p1 vs ")) for line in out) == 4


def test_the_closing_summary_and_the_report_show_win_rates_per_agent_and_opponent(tmp_path):
    import orjson

    from flexmarl.launch.summary import summary
    from flexmarl.observe.report import _games

    cell = {"before": 0.25, "after": 0.6875, "se_change": 0.031, "n": 400}
    heldout = {"p1": {"sampled": {"before": -0.5, "after": 0.2, "se_change": 0.1, "tasks": 800,
                                  "scores": {"games.start.win": cell,
                                             "games.start.seat0.win": {"after": 0.7, "n": 400},
                                             "games.start.seat1.win": {"after": 0.675,
                                                                       "n": 400},
                                             "games.start.unmoved": {"after": 0.0},
                                             "games.start.invalid": {"before": 0.87,
                                                                     "after": 0.1, "n": 900},
                                             "games.start.draw": {"before": 0, "after": 0}}}}}
    text = summary(types.SimpleNamespace(metrics=[], wall_s=1.0, heldout=heldout,
                                         final_eval={"tasks": 800}))
    assert ("p1 vs start   win 0.250 -> 0.688 ±0.031 (seat 0 0.700, seat 1 0.675), invalid "
            "moves 0.870 -> 0.100 (400 deals, each in every seat, sampled)") in text
    (tmp_path / "eval.json").write_bytes(orjson.dumps({"heldout": heldout}))
    assert _games(tmp_path)[0][0] == "held-out games: p1 vs start"
    assert _games(tmp_path / "missing") == []


def test_a_reply_that_breaks_the_env_is_its_players_forfeit_not_a_vanished_deal():
    """TextArena's Tic-Tac-Toe calls int() on the move: a 5,000-digit one raises inside the
    env. That is the replying seat's forfeit (a loss, its move flagged invalid), so a policy
    cannot drop a deal it is losing from the measurement by failing its game."""
    rules = GameRules(env_id="TicTacToe-v0", num_players=2)
    ctx = GameCtx(lambda agent, prompt: "[" + "9" * 5000 + "]" if agent == "p0"
                  else first_legal(agent, prompt))
    rewards, moves, flags = asyncio.run(play(ctx, rules, ["p0", "p1"], seed=0))
    assert rewards == {0: -1.0, 1: 1.0} and flags[0][-1] is True
