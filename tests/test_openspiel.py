"""flexmarl.envs.openspiel and policy_tables on real OpenSpiel games: the game's own legal
actions and returns; one deal in every seat; move labels with retries; exploitability of known
policies against OpenSpiel's own numbers; a model's policy table from its likelihood (a fake
engine's numbers, then a real model's through the torch engine); cross-play and ratings; an
OpenSpiel team end to end on real processes."""
from __future__ import annotations

import asyncio
import math
import types

import pytest

pytest.importorskip("pyspiel", reason="the envs extra: pip install -e '.[envs]'")

from flexmarl.envs.openspiel import (Match, RANDOM, SpielRules, load_game,  # noqa: E402
                                     openspiel_team, parse, play)
from flexmarl.envs.policy_tables import (Analysis, as_dict, count_infostates,  # noqa: E402
                                         cross_play, nash, nash_conv, reply_forms, uniform)
from flexmarl.envs.textarena import match  # noqa: E402
from flexmarl.protocol import GenerateReply  # noqa: E402
from flexmarl.team import AgentSpec  # noqa: E402
from tests.helpers.games import GameCtx  # noqa: E402

KUHN = SpielRules(game="kuhn_poker")


def always(text):
    return lambda agent, prompt: text


def test_a_reply_names_a_legal_action_by_its_first_bracket_or_whole():
    names = {0: "Pass", 1: "Bet"}
    assert parse("[Bet]", names) == 1
    assert parse(" [ pass ] because", names) == 0
    assert parse("bet.", names) == 1
    assert parse("I think [Raise] or [Bet]", names) is None  # its first bracket names none
    assert parse("[check]", names) is None and parse("", names) is None
    bids = {0: "[P0]Bid: 1", 9: "[P0]Bid: 10"}  # names with brackets, one a prefix of another
    assert parse("[[P0]Bid: 10]", bids) == 9 and parse("[[P0]Bid: 1] ok", bids) == 0


async def test_a_kuhn_game_is_played_by_openspiels_rules_and_pays_its_returns():
    """Both players bet: a showdown for 2 chips; the higher card wins +2, the other -2."""
    ctx = GameCtx(always("[Bet]"))
    rewards, moves, flags = await play(ctx, KUHN, ["p0", "p1"], seed=3)
    assert sorted(rewards.values()) == [-2.0, 2.0]
    assert [len(moves[0]), len(moves[1])] == [1, 1] and flags == {0: [False], 1: [False]}
    assert [turn for _, turn, _ in ctx.calls] == ["s0.m0", "s1.m0"]
    assert "[Pass] or [Bet]" in ctx.calls[0][2]


async def test_a_rejected_reply_is_asked_again_then_a_random_legal_action_plays_for_it():
    """p0 never names an action: two calls labelled as one move's attempts, both flagged and
    rewarded invalid_reward; a random legal action is played and the game goes on."""
    ctx = GameCtx(lambda agent, prompt: "[Bet]" if agent == "p1" else "hmm")
    rewards, moves, flags = await play(ctx, KUHN, ["p0", "p1"], seed=0)
    labels = [turn for agent, turn, _ in ctx.calls if agent == "p0"]
    assert labels[:2] == ["s0.m0", "s0.m0.retry1"]
    assert flags[0][:2] == [True, True] and len(moves[0]) == len(flags[0])
    assert set(rewards) == {0, 1} and sum(rewards.values()) == 0  # a whole game, zero-sum
    from flexmarl.envs.textarena import credit
    credit(ctx, KUHN, {"p0"}, ["p0", "p1"], rewards, moves, flags)
    assert all(value == -1.0 for agent, _, value, _ in ctx.rewards if agent == "p0")


async def test_a_match_plays_one_deal_in_every_seat_and_scores_both_seats_and_returns():
    """The same seed deals the same cards whoever sits where: p0's card in seat 0 is the
    opponent's card in seat 1. Both bet always: the higher card wins 2 in its seat."""
    ctx = GameCtx(always("[Bet]"))
    await match(ctx, KUHN, Match("m", 7, "p0", RANDOM), {}, play)
    cards = [text.split("Your card")[0] for _, _, text in ctx.calls]
    seat0 = [t for agent, turn, t in ctx.calls if turn.startswith("g0.")][0]
    seat1 = [t for agent, turn, t in ctx.calls if turn.startswith("g1.")][0]
    assert seat0.split("\n")[1] != seat1.split("\n")[1] or cards  # both prompts seen
    state = load_game("kuhn_poker").new_initial_state()
    from flexmarl.envs.openspiel import chance, deal
    dealer = deal(7)
    dealt = [chance(state, dealer)]
    state.apply_action(dealt[0])
    dealt.append(chance(state, dealer))
    assert seat0.split("\n")[1] == str(dealt[0])  # the information state string: the card
    assert seat1.split("\n")[1].startswith(str(dealt[1]))
    scores = {name: value for _, name, value in ctx.scores}
    assert scores["games.random.unmoved"] == 0.0
    assert scores["games.random.win"] + scores["games.random.loss"] == 1.0
    assert {"games.random.seat0.win", "games.random.seat1.win",
            "games.random.return"} <= set(scores)


def test_exploitability_of_known_policies_is_openspiels():
    """Uniform random: 0.917 in Kuhn (11/12), 4.747 in Leduc; Kuhn's Nash family (alpha = 0.2:
    player 0 bets a J with alpha, calls with a Q alpha + 1/3, bets a K 3 alpha; player 1 bets
    a K, calls with a K, bets a J after a check 1/3, calls with a Q 1/3): 0."""
    kuhn, leduc = load_game("kuhn_poker"), load_game("leduc_poker")
    assert nash_conv(kuhn, uniform(kuhn)) == pytest.approx(11 / 12, abs=1e-9)
    assert nash_conv(leduc, uniform(leduc)) == pytest.approx(4.747222222, abs=1e-6)
    a = 0.2
    bet = {"0": a, "1": 0.0, "2": 3 * a, "0pb": 0.0, "1pb": a + 1 / 3, "2pb": 1.0,
           "0p": 1 / 3, "1p": 0.0, "2p": 1.0, "0b": 0.0, "1b": 1 / 3, "2b": 1.0}
    table = uniform(kuhn)
    for key, row in table.state_lookup.items():
        table.action_probability_array[row] = [1 - bet[key], bet[key]]
    assert nash_conv(kuhn, table) == pytest.approx(0.0, abs=1e-9)
    solved, value = nash(kuhn)
    assert value < 1e-3 and nash_conv(kuhn, solved) == pytest.approx(value)
    assert count_infostates(kuhn) == 12 and count_infostates(leduc) == 936


def _fake_generate(logp_of):
    """A generate whose prompt logprobs give each "[action]" tail the log-probability
    logp_of(state text, action name), spread over the tail's tokens."""
    async def generate(agent, msg):
        return GenerateReply(msg.request_id, 0, list(msg.prompt_ids), [],
                             [0.0] * (len(msg.prompt_ids) - 1))
    return generate


async def test_a_policy_table_is_the_models_likelihood_of_each_legal_reply(tiny_model_dir):
    """A real (tiny) model through the torch engine: each row of the table is the softmax of
    the model's log-likelihood of "[Pass]" and "[Bet]" after the state's prompt, computed
    here again by a forward pass; legal_mass is the probability those replies have."""
    import torch
    from transformers import AutoModelForCausalLM

    from flexmarl.orchestrator.agents import AgentRuntime
    from flexmarl.rollout.engine import EngineConfig
    from flexmarl.rollout.torch_engine import TorchEngine

    spec = AgentSpec(name="p0", model=tiny_model_dir)
    analysis = Analysis(KUHN, {"p0": spec}, ["p0", "p0"])
    engine = TorchEngine(EngineConfig(model_dir=tiny_model_dir, seed=0, max_model_len=512))
    await engine.start()
    try:
        runtime = AgentRuntime(spec, tiny_model_dir, engine.tokenizer)

        async def generate(agent, msg):
            samples, prompt_lps = await engine.generate(msg.prompt_ids, msg.params, None)
            return GenerateReply(msg.request_id, 0, list(msg.prompt_ids), samples, prompt_lps)
        table, played, mass = await analysis.table(runtime, generate)
        measured = await analysis.measure({"p0": runtime}, generate)
    finally:
        await engine.close()
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    masses = []
    for key, row in table.state_lookup.items():
        state = table.states[row]
        messages, names = KUHN.prompt(state, state.current_player())
        prompt = runtime.encode(messages)
        lps = []
        for action in (0, 1):  # each form of the reply ("[Bet]", "Bet<end>", ...) added up
            p = 0.0
            for text, complete in reply_forms(names[action], names.values()):
                tail = runtime.tokenizer.encode(text, add_special_tokens=False)
                tail += [runtime.tokenizer.eos_token_id] if complete else []
                ids = torch.tensor([prompt + tail])
                with torch.no_grad():
                    logits = model(ids).logits[0, len(prompt) - 1:-1].float()
                p += math.exp(float(torch.log_softmax(logits, -1).gather(
                    1, torch.tensor(tail)[:, None]).sum()))
            lps.append(math.log(p))
        want = [math.exp(v) / sum(math.exp(u) for u in lps) for v in lps]
        assert list(table.action_probability_array[row]) == pytest.approx(want, abs=1e-4), key
        masses.append(sum(math.exp(v) for v in lps))
        # As played: both tries (retries=1) fail with (1 - m)^2, then a random action.
        fail = (1 - masses[-1]) ** 2
        assert list(played.action_probability_array[row]) == pytest.approx(
            [(1 - fail) * w + fail / 2 for w in want], abs=1e-4), key
    assert mass == pytest.approx(sum(masses) / len(masses), rel=1e-3)
    agent = measured["agents"]["p0"]
    assert agent["nash_conv"] == pytest.approx(nash_conv(KUHN.loaded, played), abs=1e-6)
    assert agent["nash_conv_chosen"] == pytest.approx(nash_conv(KUHN.loaded, table), abs=1e-6)
    assert measured["team_nash_conv"] == pytest.approx(agent["nash_conv"], abs=1e-6)
    assert set(agent["table"]) == set(table.state_lookup) and measured["uniform_nash_conv"] \
        == pytest.approx(11 / 12)


def test_cross_play_rates_nash_above_random_and_payoffs_are_zero_sum():
    kuhn = load_game("kuhn_poker")
    solved, _ = nash(kuhn)
    always_bet = uniform(kuhn)
    always_bet.action_probability_array[:] = [0.0, 1.0]
    result = cross_play(kuhn, {"random": uniform(kuhn), "nash": solved, "bet": always_bet},
                        deals=300)
    p = result["payoff"]
    for a in p:
        for b in p[a]:
            assert p[a][b] == pytest.approx(-p[b][a], abs=1e-9)  # zero-sum, seat-balanced
            assert result["win"][a][b] == pytest.approx(1 - result["win"][b][a])
    # Nash wins chips from both (the game's value is 0 seat-balanced; a Nash player cannot lose).
    assert p["nash"]["random"] > 0.1 and p["nash"]["bet"] > 0.0
    r = result["ratings"]
    assert r["nash"]["mu"] > r["random"]["mu"]
    assert result["nash_conv"]["nash"] < 1e-3 < result["nash_conv"]["bet"]


def test_an_openspiel_team_has_seats_opponents_matches_and_exact_measures():
    players = [AgentSpec(name=n, model="m") for n in ("p0", "p1")]
    team = openspiel_team("kuhn_poker", players, train_games=8, eval_games=3)
    assert [a.name for a in team.agents] == ["p0", "p1", "start"]
    # A rejected reply is worth the game's lowest return (Kuhn: -2), never more than a move.
    assert team.analysis.rules.invalid_reward == -2.0
    assert openspiel_team("kuhn_poker", players, invalid_reward=-1).analysis.rules \
        .invalid_reward == -1
    with pytest.raises(ValueError, match="invalid_reward"):
        openspiel_team("kuhn_poker", players, invalid_reward="worst")
    assert len(team.heldout) == 2 * 2 * 3 and team.analysis is not None
    three = openspiel_team("kuhn_poker", [*players, "random"], params={"players": 3},
                           eval_games=2)
    assert three.analysis is not None and len(three.heldout) == 2 * 2 * 2
    big = openspiel_team("tic_tac_toe", players, eval_games=2)
    assert big.analysis is None  # 5,000+ information states: no tables by default
    with pytest.raises(ValueError, match="2 players"):
        openspiel_team("kuhn_poker", players[:1])
    with pytest.raises(ValueError, match="no game 'nope'"):
        openspiel_team("nope", players)


@pytest.mark.parametrize("game", ["tic_tac_toe", "leduc_poker", "goofspiel"])
async def test_any_game_plays_to_its_end_with_legal_moves_named(game):
    """Games of other kinds (perfect information, two betting rounds, simultaneous moves
    turned into turns) play to the end when the agent names the first legal action."""
    rules = SpielRules(game=game, num_players=2)

    def first(agent, prompt):
        import re
        listing = prompt[-1]["content"].rsplit("Answer with ", 1)[1]
        return re.match(r"(\[.*?\])(?:, | or |\.$)", listing)[1]
    ctx = GameCtx(first)
    rewards, moves, flags = await play(ctx, rules, ["p0", "p1"], seed=1)
    assert set(rewards) == {0, 1} and not any(any(f) for f in flags.values())
    assert len(ctx.calls) == sum(len(m) for m in moves.values()) > 1


@pytest.mark.slow
async def test_an_openspiel_team_trains_and_measures_its_policies(tiny_model_dir, tmp_path,
                                                                    no_leftover_children):
    """Kuhn Poker between two tiny models on real processes: two steps; eval.json has the
    seat-balanced games and each player's table and NashConv before and after training."""
    import orjson

    from flexmarl.config.load import load_config
    from flexmarl.launch.run import train
    from flexmarl.observe.rundir import RunDir

    from flexmarl.team import load_team
    team_file = tmp_path / "kuhn_team.py"  # a team file: flexmarl eval loads it from the run
    team_file.write_text(
        "from flexmarl import AgentSpec\nfrom flexmarl.envs.openspiel import openspiel_team\n"
        f"players = [AgentSpec(name=n, model={tiny_model_dir!r}) for n in ('p0', 'p1')]\n"
        "team = openspiel_team('kuhn_poker', players, train_games=8, eval_games=2, "
        "system='Play.', train_opponents={'self': 1, 'past': 1}, past_every=1)\n")
    team = load_team(str(team_file))
    config = load_config(overrides=[
        f"team.path={team_file}", "run.keep_every=1",  # the state after step 0 stays
        f"run.dir={tmp_path / 'run'}", "run.steps=2", "rollout.backend=torch",
        "pipeline.tasks_per_step=2", "pipeline.trajectories_per_task=2",
        "eval.modes=['sampled']", "eval.before_tasks=1", "observe.report=false"])
    result = await asyncio.wait_for(train(team, config, run_dir=RunDir.create(config),
                                          progress=False), 300)
    assert all(r["failed_trajectories"] == 0 for r in result.metrics)
    assert result.final_eval["failed"] == 0
    # Past versions joined the pool as the instances served them (the start's first).
    assert [v for v, _ in team.analysis.pool.tables["p0"]][0] == 0
    document = orjson.loads((tmp_path / "run" / "eval.json").read_bytes())
    for when in ("before", "after"):
        measured = document["policies"][when]
        assert set(measured["agents"]) == {"p0", "p1"}
        for agent in measured["agents"].values():
            assert 0.0 <= agent["nash_conv"] <= 6.0 and 0.0 < agent["legal_mass"] <= 1.0
            assert all(sum(p) == pytest.approx(1.0, abs=1e-5) for p in agent["table"].values())
    scores = result.heldout["p0"]["sampled"]["scores"]
    assert "games.start.return" in scores and "games.random.unmoved" in scores
    assert as_dict(uniform(load_game("kuhn_poker")))["0"] == [0.5, 0.5]
    # flexmarl eval --cross-play: start, the middle saved version, final, random and Nash;
    # the table of the final weights is the one the run measured after training.
    from flexmarl.launch.cli import main
    from flexmarl.launch.crossplay import cross_play_run
    from flexmarl.observe.report import write_report
    run_dir = tmp_path / "run"
    crossed = await cross_play_run(run_dir, deals=10)
    assert crossed["policies"] == ["start", "p0@0", "p1@0", "p0", "p1", "random", "nash"]
    after = document["policies"]["after"]["agents"]
    for agent in ("p0", "p1"):
        assert crossed["nash_conv"][agent] == pytest.approx(after[agent]["nash_conv"], abs=1e-4)
    assert crossed["nash_conv"]["start"] == pytest.approx(
        document["policies"]["before"]["agents"]["p0"]["nash_conv"], abs=1e-4)
    assert crossed["payoff"]["nash"]["random"] > 0.1
    page = write_report(run_dir).read_text()
    assert 'id="cross-play"' in page and "NashConv" in page
    with pytest.raises(SystemExit) as done:
        await asyncio.to_thread(main, ["eval", str(run_dir), "--cross-play", "--deals", "5"])
    assert done.value.code == 0


def _fake_runtime(name: str, version: int = 0):
    tokenizer = types.SimpleNamespace(encode=lambda text, add_special_tokens=False:
                                      [7 if "bet" in text.lower() else 8, 9])
    return types.SimpleNamespace(spec=types.SimpleNamespace(name=name), version=version,
                                 encode=lambda messages: [1, 2, 3], tokenizer=tokenizer)


def _answers(bet_logp: float, pass_logp: float, agents, versions=None):
    """A generate whose prompt logprobs give "[Bet]" bet_logp and "[Pass]" pass_logp (on the
    tail's first token), from the version the agent serves (`versions`: the version each
    reply says served it, in turn, instead)."""
    served = iter(versions or [])

    async def generate(agent, msg):
        ids = msg.prompt_ids
        first = bet_logp if ids[-2] == 7 else pass_logp
        version = next(served, None)
        return GenerateReply(msg.request_id, agents[agent].version if version is None
                             else version, list(ids), [],
                             [0.0] * (len(ids) - 3) + [first, 0.0])
    return generate


async def test_past_versions_are_snapshotted_every_k_versions_and_the_newest_kept():
    players = [AgentSpec(name=n, model="m") for n in ("p0", "p1")]
    team = openspiel_team("kuhn_poker", players, train_games=8, eval_games=1,
                          train_opponents={"self": 1, "past": 1}, past_every=2, past_keep=2)
    pool = team.analysis.pool
    agents = {"p0": _fake_runtime("p0"), "p1": _fake_runtime("p1")}
    # No eos token here: the forms counted are "[Bet]" and "[bet]", 0.3 each (Pass 0.1 each).
    generate = _answers(math.log(0.3), math.log(0.1), agents)  # legal replies: 0.8
    assert await pool.refresh(agents, generate) == [("p0", 0), ("p1", 0)]  # the start
    agents["p0"].version = 1
    assert await pool.refresh(agents, generate) == []  # not `every` versions on yet
    for v in (2, 4):
        agents["p0"].version = v
        assert await pool.refresh(agents, generate) == [("p0", v)]
    assert [v for v, _ in pool.tables["p0"]] == [2, 4]  # the newest past_keep
    _, table = pool.tables["p0"][-1]
    # As played: Bet 3/4 of legal replies, both tries failing (0.2^2) play a random action.
    fail = 0.2 ** 2
    assert table.action_probability_array[0] == pytest.approx(
        [(1 - fail) * 0.25 + fail / 2, (1 - fail) * 0.75 + fail / 2])
    # A snapshot whose replies came from two versions (a sync midway) is measured again.
    agents["p1"].version = 2
    mixed = _answers(math.log(0.3), math.log(0.1), agents, versions=[1] * 5 + [2] * 100)
    assert await pool.refresh(agents, mixed) == [("p1", 2)]
    assert [v for v, _ in pool.tables["p1"]] == [0, 2]


async def test_training_games_meet_the_opponents_of_the_mix_and_past_ones_play_their_table():
    """Weights on "random" alone: in every game one learner seat (drawn per task, the same for
    all its games) and the other random. On "past" alone: the learner itself while the pool is
    empty, then a past version, which plays from its table (here: always Bet)."""
    players = [AgentSpec(name=n, model="m") for n in ("p0", "p1")]

    async def learners(team, task):
        out = []
        for trajectory in (0, 1):
            ctx = GameCtx(always("[Pass]"), input_id=task.task_id, trajectory=trajectory)
            await team.workflow(ctx, task)
            out.append({agent for agent, _, _ in ctx.calls})
        return out
    against_random = openspiel_team("kuhn_poker", players, train_games=8, eval_games=1,
                                    train_opponents={"random": 1})
    seen = []
    for task in against_random.tasks:
        first, second = await learners(against_random, task)
        assert len(first) == 1 and first == second
        seen.append(first.pop())
    assert set(seen) == {"p0", "p1"}  # either seat learns, drawn per task
    against_past = openspiel_team("kuhn_poker", players, train_games=8, eval_games=1,
                                  train_opponents={"past": 1})
    assert (await learners(against_past, against_past.tasks[0]))[0] == {"p0", "p1"}
    always_bet = uniform(load_game("kuhn_poker"))
    always_bet.action_probability_array[:] = [0.0, 1.0]
    against_past.analysis.pool.tables = {"p0": [(3, always_bet)], "p1": [(3, always_bet)]}
    for task in against_past.tasks[1:]:  # the first task's draw stays its own (per task)
        first, _ = await learners(against_past, task)
        assert len(first) == 1
    from flexmarl.envs.openspiel import TablePlayer
    rules = SpielRules(game="kuhn_poker")
    ctx = GameCtx(always("[Pass]"))
    rewards, moves, _ = await play(ctx, rules, ["p0", TablePlayer("p1@v3", always_bet)], 5)
    # p0 checks, the past p1 bets, p0 folds (Pass): p0 loses its ante.
    assert rewards == {0: -1.0, 1: 1.0} and len(moves[1]) == 0 and len(moves[0]) == 2


@pytest.mark.parametrize("mix, message", [
    ({"self": 1, "nobody": 1}, "keys among"), ({"self": -1, "random": 1}, "weights >= 0"),
    ({"self": 0}, "more than 0")])
def test_a_wrong_opponent_mix_is_refused_with_the_fix(mix, message):
    players = [AgentSpec(name=n, model="m") for n in ("p0", "p1")]
    with pytest.raises(ValueError, match=message):
        openspiel_team("kuhn_poker", players, train_opponents=mix)
    with pytest.raises(ValueError, match="too big"):
        openspiel_team("kuhn_poker", players, train_opponents={"past": 1}, exact=False)


def test_names_that_differ_only_by_case_are_two_moves_and_one_player_games_are_refused():
    """Chess: "Bxc3" (the bishop) and "bxc3" (the pawn) are both legal; each reply plays the
    move it spells, and a spelling that matches both only ignoring case plays neither."""
    names = {351: "Bxc3", 90: "bxc3", 7: "Ke2"}
    assert parse("[bxc3]", names) == 90 and parse("[Bxc3]", names) == 351
    assert parse("[BXC3]", names) is None and parse("[ke2]", names) == 7
    assert parse("Bxc3", names) == 351 and parse("bxc3.", names) == 90
    with pytest.raises(ValueError, match="one-player game"):
        openspiel_team("catch", [AgentSpec(name="p0", model="m")])


def test_cross_play_wins_are_beating_the_other_side_not_scoring_in_a_positive_sum_game():
    """Goofspiel scored by total points (both sides score): two identical uniform tables win
    about half their matches against each other whichever is listed first, and rate alike."""
    game = load_game("goofspiel", (("num_cards", 4), ("returns_type", "total_points")))
    for order in (("a", "b"), ("b", "a")):
        result = cross_play(game, {n: uniform(game) for n in order}, deals=300)
        assert abs(result["win"]["a"]["b"] - 0.5) < 0.1, result["win"]
        assert abs(result["ratings"]["a"]["mu"] - result["ratings"]["b"]["mu"]) < 3.0


def test_the_closing_summary_and_the_report_show_each_players_nashconv(tmp_path):
    import orjson

    from flexmarl.launch.summary import summary
    from flexmarl.observe.report import _games

    policies = {"before": {"uniform_nash_conv": 0.9167, "agents": {
                    "p0": {"nash_conv": 1.4, "legal_mass": 0.01}}},
                "after": {"uniform_nash_conv": 0.9167, "agents": {
                    "p0": {"nash_conv": 0.7, "legal_mass": 0.9}}}}
    heldout = {"p0": {"sampled": {"before": -0.5, "after": 0.2, "se_change": 0.1,
                                  "tasks": 8}}}
    text = summary(types.SimpleNamespace(metrics=[], wall_s=1.0, heldout=heldout,
                                         final_eval={"tasks": 8, "policies": policies}))
    assert ("p0 NashConv   1.400 -> 0.700 (-50%; uniform random 0.917, Nash 0), legal "
            "replies 0.010 -> 0.900") in text
    (tmp_path / "eval.json").write_bytes(orjson.dumps({"heldout": heldout,
                                                       "policies": policies}))
    assert ("policies: p0 NashConv", "1.400 -> 0.700 (-50%; uniform random 0.917, Nash 0), "
            "legal replies 0.010 -> 0.900") in _games(tmp_path)


def test_cross_play_does_not_depend_on_the_order_of_the_policies():
    """The same tables given in another order: the same win shares and ratings (each pair
    samples from its own generator); with three players, each side alone is played."""
    kuhn = load_game("kuhn_poker")
    solved, _ = nash(kuhn)
    bet = uniform(kuhn)
    bet.action_probability_array[:] = [0.0, 1.0]
    tables = {"u": uniform(kuhn), "n": solved, "b": bet}
    first = cross_play(kuhn, tables, deals=100)
    second = cross_play(kuhn, dict(reversed(list(tables.items()))), deals=100)
    assert first["win"] == second["win"] and first["ratings"] == second["ratings"]
    three = load_game("kuhn_poker", (("players", 3),))
    result = cross_play(three, {"u": uniform(three), "b": uniform(three)}, deals=50)
    assert result["win"]["u"]["b"] is not None and result["win"]["b"]["u"] is not None


async def test_a_table_with_no_legal_reply_at_all_is_uniform_and_bad_logprobs_are_refused():
    players = [AgentSpec(name="p0", model="m")]
    analysis = Analysis(KUHN, {"p0": players[0]}, ["p0", "p0"])
    agents = {"p0": _fake_runtime("p0")}
    chosen, played, mass = await analysis.table(agents["p0"],
                                                _answers(-math.inf, -math.inf, agents))
    assert mass == 0.0 and (chosen.action_probability_array == 0.5).all()
    assert (played.action_probability_array == 0.5).all()
    with pytest.raises(RuntimeError, match="NaN or above 0"):
        await analysis.table(agents["p0"], _answers(math.nan, 0.0, agents))


def test_infinite_opponent_weights_and_reserved_names_are_refused():
    players = [AgentSpec(name=n, model="m") for n in ("p0", "p1")]
    with pytest.raises(ValueError, match="finite"):
        openspiel_team("kuhn_poker", players, train_opponents={"self": math.inf})
    with pytest.raises(ValueError, match="reserved"):
        openspiel_team("kuhn_poker", [players[0], AgentSpec(name="past", model="m")])


def test_the_forms_of_a_reply_are_those_the_parser_plays_and_no_other_actions():
    """Every form the table adds up parses to its action; a lower-case form only where no
    other action's name is the same ignoring case."""
    names = {0: "Pass", 1: "Bet"}
    for action, name in names.items():
        forms = reply_forms(name, names.values())
        assert [t for t, _ in forms] == [f"[{name}]", name, f"{name}.", f"[{name.lower()}]",
                                         name.lower(), f"{name.lower()}."]
        assert all(parse(text + " and more" * (not whole), names) == action
                   for text, whole in forms)
    assert [t for t, _ in reply_forms("Bxc3", ["Bxc3", "bxc3"])] == ["[Bxc3]", "Bxc3", "Bxc3."]
