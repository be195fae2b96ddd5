"""The inter-agent level: the forecast's parts alone, the chooser alone, then both through
Balancer.choose_move with hand-made requests and times.

Layers:
(a) flexmarl.rollout.balance.forecast: a step's profile read as the next step's prediction
    (its wrap into the next step), the demand average over a window, learnt rates.
(b) flexmarl.rollout.balance.moves.MoveChooser on a hand-made ledger: the ratio test and its
    streak, what a move's own time costs (learnt).
(c) Balancer.choose_move: patience, ratio, min_load_tokens, min_instances, compatible, the undo
    rule, the demand window, the cost test (move_pays), a donor whose stage is next, and a move
    ahead of a stage (ahead_pays).
"""
from __future__ import annotations

import math

import pytest

from flexmarl.config.balance import BalancerConfig, BalancerConfig as PartsConfig
from flexmarl.rollout.balance.forecast import DemandAverage, Rates, StepProfile
from flexmarl.rollout.balance.loads import InstanceLoads
from flexmarl.rollout.balance.moves import Move, MoveChooser
from flexmarl.rollout.balancer import Balancer
from tests.helpers.balancing import NOW, checks, load_up, two_agents


# ============================================================================ (a) forecast

def test_step_profile_predicts_from_the_previous_step_and_wraps_into_the_next():
    profile = StepProfile()
    profile.record("a", 1.0, 99.0)                    # before the first step: not recorded
    assert profile.predicted_tokens("a", 1.0, 5.0) == 0.0 and not profile.has_previous
    assert profile.predicted_busy_s("a", 1.0, 1.0) == 0.0
    profile.step_started(10.0)
    for t, tokens in ((10.0, 0.0), (12.0, 500.0), (15.0, 100.0), (18.0, 0.0)):
        profile.record("a", t, tokens)
    assert not profile.has_previous                   # this step is not a prediction yet
    profile.step_started(20.0)
    assert profile.has_previous
    assert profile.predicted_tokens("a", 21.0, 2.0) == 500.0      # phases 1-3: 500 at 2
    assert profile.predicted_tokens("a", 23.0, 1.0) == 0.0        # phases 3-4: nothing
    assert profile.predicted_tokens("a", 27.0, 3.0) == 500.0      # phases 7-10 wrap to 0-2
    assert profile.predicted_tokens("b", 21.0, 5.0) == 0.0        # never profiled
    assert profile.predicted_busy_s("a", 21.0, 100.0) == 4.0      # busy until phase 5
    assert profile.predicted_busy_s("a", 21.0, 200.0) == 1.0
    profile.step_started(30.0)                        # an empty step keeps the prediction
    assert profile.predicted_tokens("a", 31.0, 2.0) == 500.0


def test_demand_average_starts_at_the_first_loads_and_follows_over_the_window():
    avg = DemandAverage(10.0)
    assert avg.last_check is None and avg.first_check == float("-inf")
    assert avg.update(5.0, {"a": 100.0, "b": 0.0}) == {"a": 100.0, "b": 0.0}
    assert (avg.first_check, avg.last_check) == (5.0, 5.0)
    got = avg.update(15.0, {"a": 0.0, "b": 100.0})
    w = 1.0 - math.exp(-1.0)
    assert got == {"a": pytest.approx(100.0 * (1 - w)), "b": pytest.approx(100.0 * w)}
    assert avg.update(14.0, {"a": 50.0, "b": 50.0}) == got        # no time passed: unchanged
    assert avg.first_check == 5.0


def test_rates_learn_tokens_per_second_per_instance_while_there_is_work():
    rates = Rates()
    rates.finished("a", 400.0)
    rates.observe("a", None, 2)                       # the first check: nothing to divide by
    assert rates.get("a") is None
    rates.finished("a", 400.0)
    rates.observe("a", 2.0, 2)                        # 400 tokens / 2 s / 2 instances
    assert rates.get("a") == 100.0
    rates.observe("a", 1.0, 2)                        # no work finished: the rate stands
    assert rates.get("a") == 100.0
    rates.finished("a", 200.0)
    rates.observe("a", 1.0, 1)                        # 200/s: EWMA 0.3 toward it
    assert rates.get("a") == pytest.approx(130.0)
    assert rates.get("b") is None


# ============================================================================ (b) chooser

def _chooser(**config) -> tuple[MoveChooser, InstanceLoads]:
    loads = InstanceLoads({"hot": ["h0", "h1"], "cold": ["c0", "c1", "c2"]}, 0.2)
    cfg = PartsConfig(**{**NOW, "patience": 2, **config})
    return MoveChooser(cfg, loads, StepProfile(), Rates(), lambda src, dst: True), loads


def test_the_chooser_needs_the_imbalance_for_patience_checks_and_picks_the_idlest_donor():
    chooser, loads = _chooser()
    loads.count_in("r0", "cold", "c0", 5.0)           # c1 is the donor's first idle instance
    demand = {"hot": 1000.0, "cold": 10.0}
    assert chooser.choose(1.0, demand, None) is None
    assert chooser.choose(2.0, demand, None) == Move("c1", "cold", "hot", 10.0, 1000.0)
    assert chooser.choose(3.0, demand, None) is None    # the streak starts again after a move
    chooser.reset_streak()
    assert chooser.choose(4.0, demand, None) is None
    # The last move went hot -> cold: moving back needs ratio squared, and 100 < 25 x 10.
    chooser.reset_streak()
    back = Move("h0", "hot", "cold", 0.0, 0.0)
    assert [chooser.choose(t, {"hot": 100.0, "cold": 10.0}, back) for t in (5.0, 6.0)] == \
        [None, None]
    chooser.reset_streak()                            # without that move, 100 > 5 x 10 moves
    assert [chooser.choose(t, {"hot": 100.0, "cold": 10.0}, None) for t in (7.0, 8.0)] == \
        [None, Move("c1", "cold", "hot", 10.0, 100.0)]


def test_a_move_costs_its_configured_time_until_one_is_timed():
    chooser, _ = _chooser(move_cost_s=2.0)
    assert chooser.move_cost_s() == 2.0
    chooser.learn_move_s(5.0)
    assert chooser.move_cost_s() == 5.0
    chooser.learn_move_s(15.0)                        # EWMA 0.3 toward 15
    assert chooser.move_cost_s() == pytest.approx(8.0)


# ============================================================================ (c) choose_move

def test_choose_move_moves_cold_to_hot_only_after_patience_checks():
    bal = two_agents(patience=3)
    load_up(bal, "hot", 1000.0, "h")
    bal.route("cold", "c", 30.0)                       # c0: 30; c1, c2 idle
    assert checks(bal, [1.0, 2.0]) == [None, None]
    move = bal.choose_move(3.0)
    assert (move.src, move.dst) == ("cold", "hot")
    assert move.instance == "c1"                       # the donor's least loaded instance
    assert move.dst_load == 1000.0 and move.src_load == pytest.approx(10.0)


def test_an_imbalance_must_hold_for_consecutive_checks():
    bal = two_agents(patience=3)
    load_up(bal, "hot", 1000.0, "h")
    assert checks(bal, [1.0, 2.0]) == [None, None]
    bal.finish("h0")
    bal.finish("h1")                                    # gone at the third check
    assert bal.choose_move(3.0) is None
    load_up(bal, "hot", 1000.0, "again")
    assert checks(bal, [4.0, 5.0]) == [None, None]
    assert bal.choose_move(6.0) is not None


def test_below_ratio_or_min_load_nothing_moves():
    bal = two_agents(patience=1, ratio=5.0, min_load_tokens=64.0)
    load_up(bal, "hot", 400.0, "h")
    load_up(bal, "cold", 100.0, "c")                   # 400 vs 100 per instance: 4x < 5x
    assert checks(bal, [1.0, 2.0]) == [None, None]
    quiet = two_agents(patience=1, min_load_tokens=64.0)
    load_up(quiet, "hot", 50.0, "h")                   # infinitely hotter, but 50 < 64 tokens
    assert checks(quiet, [1.0, 2.0]) == [None, None]


def test_min_instances_and_compatibility_limit_donors():
    bal = two_agents(patience=1, min_instances=3)      # cold has exactly 3
    load_up(bal, "hot", 1000.0, "h")
    assert checks(bal, [1.0, 2.0]) == [None, None]
    incompatible = two_agents(patience=1, compatible=lambda src, dst: False)
    load_up(incompatible, "hot", 1000.0, "h")
    assert checks(incompatible, [1.0, 2.0]) == [None, None]
    # Three agents: the coldest ("idle") cannot serve hot's model; "warm" can and donates.
    three = Balancer({"hot": ["h0"], "idle": ["i0", "i1"], "warm": ["w0", "w1"]},
                     BalancerConfig(**NOW, patience=1),
                     compatible=lambda src, dst: src != "idle")
    assert three.choose_move(0.0) is None
    three.route("hot", "h", 1000.0)
    three.route("warm", "w", 20.0)
    move = three.choose_move(1.0)
    assert (move.src, move.dst) == ("warm", "hot")

def test_undoing_the_last_move_takes_ratio_squared():
    bal = two_agents(patience=1, cooldown_s=0.0, ratio=5.0)
    load_up(bal, "hot", 1000.0, "h")
    move = bal.choose_move(1.0)
    bal.begin_move(move)
    bal.finish_move(move, 1.0)                          # cold -> hot
    for rid in ("h0", "h1"):
        bal.finish(rid)
    bal.route("hot", "small", 30.0)                     # hot: 30 over 3 = 10 per instance
    load_up(bal, "cold", 100.0, "c")                    # cold: 100 per instance, 10x
    assert checks(bal, [2.0, 3.0]) == [None, None]      # 10x < 25x: not undone
    load_up(bal, "cold", 1000.0, "d")                   # 110x
    back = bal.choose_move(4.0)
    assert (back.src, back.dst) == ("hot", "cold")


def test_the_demand_window_averages_out_step_phases():
    """Agents taking turns (one busy while the other waits, as in a step's phases) have equal
    demand on average: with a window several phases long, nothing moves; comparing the loads
    of the moment instead (a tiny window), the first phase already moves an instance."""
    def run(window: float) -> list:
        bal = Balancer({"hot": ["h0", "h1"], "cold": ["c0", "c1"]},
                       BalancerConfig(demand_window_s=window, patience=3, cooldown_s=0.0,
                                      cost_aware=False))
        moves, outstanding = [], []
        for t in range(1, 61):
            if t % 6 == 1:                              # a new phase every 6 checks
                for rid in outstanding:
                    bal.finish(rid)
                busy = "hot" if (t // 6) % 2 == 0 else "cold"
                outstanding = load_up(bal, busy, 1000.0, f"{t}-")
            move = bal.choose_move(float(t))
            if move:
                moves.append(move)
                bal.begin_move(move)
                for rid in outstanding:                 # drained: the phase's work is done
                    bal.finish(rid)
                outstanding = []
                bal.finish_move(move, float(t))
        return moves

    assert run(1e-9)                                    # every phase looks like a shift
    # The average starts at the first check's loads (one agent idle), so the first phase is
    # seen as demand unless it is shorter than patience checks; a 60 s window then settles.
    assert len(run(60.0)) <= 1


def _priced(move_cost_s: float = 2.0) -> Balancer:
    """Two agents with learnt rates of 100 tokens/s per instance: each finished 200 tokens
    per instance over the 1 s between the first two checks."""
    bal = Balancer({"hot": ["h0", "h1"], "cold": ["c0", "c1", "c2"]},
                   BalancerConfig(demand_window_s=1e-9, patience=1, cooldown_s=0.0,
                                  move_cost_s=move_cost_s))
    bal.choose_move(0.0)
    for agent in ("hot", "cold"):
        for rid in load_up(bal, agent, 200.0, f"warm-{agent}"):
            bal.finish(rid, samples=1, tokens=200)
    assert bal.choose_move(1.0) is None                  # nothing outstanding
    return bal


def test_a_move_is_made_only_when_it_saves_more_than_it_costs():
    """Rates 100 tokens/s per instance; a move takes 2 s. Hot backlog 10 s per instance:
    one more instance saves (10 - 2) / 3 = 2.7 s, more than the donor's 0.1 s backlog over
    its 2 remaining instances plus the trip back (2 / 3 s): it moves. A backlog of 2.5 s
    saves 0.17 s, less than the trip back: nothing moves, however large the ratio."""
    small = _priced()
    for k in range(2):  # two requests per instance: throughput-bound, more instances help
        load_up(small, "hot", 125.0, f"h{k}-")         # 2.5 s per instance
    small.route("cold", "c", 10.0)
    assert small.choose_move(2.0) is None
    assert small.chooser.move_pays(2.0, "cold", "hot", "c1") is False
    big = _priced()
    for k in range(2):
        load_up(big, "hot", 500.0, f"h{k}-")           # 10 s per instance
    big.route("cold", "c", 10.0)
    move = big.choose_move(2.0)
    assert (move.src, move.dst) == ("cold", "hot")
    # A slow move (learnt from a timed one: 9 s) makes the same backlog not worth it.
    big.begin_move(move)
    big.drained(move, 2.0, 11.0)
    big.finish_move(move, 11.0)
    assert big.chooser.move_pays(11.0, "cold", "hot", "c0") is False


def test_no_move_before_rates_are_learnt_nor_for_one_sequence_per_instance():
    bal = two_agents(cost_aware=True, patience=1)
    for k in range(3):
        load_up(bal, "hot", 100000.0, f"h{k}-")
    assert checks(bal, [1.0, 2.0]) == [None, None]  # no rate learnt
    one_each = _priced()
    load_up(one_each, "hot", 100000.0, "h")  # 1000 s per instance, but one sequence each:
    assert one_each.choose_move(2.0) is None   # another instance would not decode it faster


def test_a_donor_whose_stage_comes_next_keeps_its_instances():
    """The previous step had the cold agent busy right after this point of the step (its stage
    follows): the prediction counts that demand against the move, which then does not pay."""
    def step(bal: Balancer, start: float, *, cold_next: bool):
        bal.step_started(start)
        ids = load_up(bal, "hot", 500.0, f"h{start}-") + load_up(bal, "hot", 500.0, f"H{start}-")
        bal.route("cold", f"c{start}", 10.0)
        move = bal.choose_move(start + 1.0)
        for rid in ids + [f"c{start}"]:
            bal.finish(rid, samples=1, tokens=100)
        if cold_next:  # the cold agent's stage: 3000 tokens on each instance
            later = load_up(bal, "cold", 3000.0, f"n{start}-")
            bal.choose_move(start + 3.0)
            for rid in later:
                bal.finish(rid, samples=1, tokens=100)
        return move

    fresh = _priced()
    assert step(fresh, 10.0, cold_next=False) is not None  # no history: the move pays
    learnt = _priced()
    step(learnt, 10.0, cold_next=True)        # learnt (the move of this step left undone)
    learnt.step_started(20.0)
    assert learnt.profile.predicted_tokens("cold", 21.0, 5.0) == 9000.0  # 3 instances x 3000
    assert step(learnt, 20.0, cold_next=True) is None


def _staged(ahead: bool = True, per_instance: int = 2) -> Balancer:
    """Step 1 (at 10 s): the cold agent's stage at phases 0-1 s (300 tokens on each of its 3
    instances), then the hot agent's at phases 6-13 s (`per_instance` requests of 500 tokens on
    each of its 2 instances); step 2 begins at 30 s with the cold agent's stage again."""
    bal = Balancer({"hot": ["h0", "h1"], "cold": ["c0", "c1", "c2"]},
                   BalancerConfig(demand_window_s=4.0, patience=1, cooldown_s=0.0,
                                  move_cost_s=2.0, ahead=ahead))
    bal.choose_move(0.0)
    for agent in ("hot", "cold"):  # rates: 100 tokens/s per instance
        for rid in load_up(bal, agent, 200.0, f"warm-{agent}"):
            bal.finish(rid, samples=1, tokens=200)
    bal.choose_move(1.0)
    bal.step_started(10.0)
    cold = load_up(bal, "cold", 300.0, "c")
    bal.choose_move(10.0)
    bal.choose_move(11.0)
    for rid in cold:
        bal.finish(rid, samples=1, tokens=300)
    for t in (12.0, 13.0, 14.0, 15.0):
        assert bal.choose_move(t) is None  # nobody busy, and no previous step to read ahead
    hot = [rid for k in range(per_instance) for rid in load_up(bal, "hot", 500.0, f"h{k}-")]
    for t in range(16, 24):
        bal.choose_move(float(t))  # the hot agent's stage (a move it finds is left undone)
    for rid in hot:
        bal.finish(rid, samples=1, tokens=500)
    bal.choose_move(24.0)
    bal.step_started(30.0)
    cold = load_up(bal, "cold", 300.0, "d")  # step 2 repeats step 1
    assert bal.choose_move(30.0) is None
    return bal, cold


def test_an_instance_moves_ahead_of_the_stage_that_needs_it():
    """In step 2, once the cold agent's stage is done, the previous step says the hot agent is
    about to need instances (8 s of work: one more instance saves 8/3 s, more than the 2 s
    move) that the cold one will not: one moves before the stage begins. Not without
    `ahead`, and not when the stage has one answer per instance (another instance would
    decode none faster)."""
    bal, cold = _staged()
    assert bal.profile.predicted_tokens("hot", 35.0, 4.0) == 2000.0
    assert bal.choose_move(31.0) is None  # the cold agent is in its own stage
    for rid in cold:
        bal.finish(rid, samples=1, tokens=300)
    move = bal.choose_move(32.0)  # done: its instances idle until the next step's stage
    assert (move.src, move.dst) == ("cold", "hot") and move.dst_load == 1000.0
    assert move.src_load == 0.0  # 4 s before the hot agent's stage (phase 6)
    for kwargs in ({"ahead": False}, {"per_instance": 1}):
        other, cold = _staged(**kwargs)
        for rid in cold:
            other.finish(rid, samples=1, tokens=300)
        assert other.choose_move(32.0) is None, kwargs

