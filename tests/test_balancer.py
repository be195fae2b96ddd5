"""Load balancing: the pure Balancer, then the same class driven by the simulator.

Layers:
(a) Balancer alone, with hand-made requests and times: round robin, least outstanding work
    (tokens, not request counts), own in-flight counts against stale or larger reports, sticky
    episodes and their slack, learnt lengths, config errors, and the inter-agent level
    (patience, ratio, min_load_tokens, min_instances, compatible, cool-down, one move at a time,
    draining, finish/abort, the undo rule, the demand window).
(b) flexmarl.sim.workload, and flexmarl.sim.routing driving it through the real InstancePool on
    the cluster simulator's engines (virtual clock, cost model; deterministic, about a second
    each): the engine's timing as the routing runs see it, least_loaded against round_robin on
    a long-tailed stream, hierarchical moves toward the hot agent without flapping or losing a
    request.
"""
from __future__ import annotations

from dataclasses import dataclass

import pytest

from flexmarl.rollout.balancer import Balancer, BalancerConfig
from flexmarl.rollout.balancer import percentile
from flexmarl.sim.costs import load_costs
from flexmarl.sim.routing import RoutingConfig, initial_placement, move_times, run_routing
from flexmarl.sim.workload import (AgentProfile, Call, CallChain, SkewedWorkload,
                                   tokens_by_agent)

# A demand window this short makes plan_move compare the current loads (no averaging), so the
# inter-agent unit tests below read like the rule they test; the window has its own test. The
# ratio rule alone decides there (cost_aware off): the cost test has its own tests.
NOW = {"demand_window_s": 1e-9, "cost_aware": False}


def two_agents(compatible=None, **config) -> Balancer:
    bal = Balancer({"hot": ["h0", "h1"], "cold": ["c0", "c1", "c2"]},
                   BalancerConfig(**{**NOW, **config}), compatible=compatible)
    bal.plan_move(0.0)      # the caller's first check, before any request
    return bal


def load_up(bal: Balancer, agent: str, cost: float, prefix: str) -> list[str]:
    """As many requests of `cost` as the agent has instances (least_loaded spreads them one
    per instance when the instances are equally loaded); their ids."""
    ids = [f"{prefix}{i}" for i in range(len(bal.instances(agent)))]
    for rid in ids:
        bal.route(agent, rid, cost)
    return ids


def checks(bal: Balancer, times) -> list:
    return [bal.plan_move(t) for t in times]


# ============================================================================ (a) routing

def test_round_robin_cycles_and_ignores_load_and_episodes():
    bal = Balancer({"a": ["i0", "i1", "i2"]}, BalancerConfig(strategy="round_robin"))
    got = [bal.route("a", f"r{k}", cost=1000.0 if k == 0 else 1.0, episode="e")
           for k in range(7)]
    assert got == ["i0", "i1", "i2", "i0", "i1", "i2", "i0"]
    assert bal.stats.routed == {"i0": 3, "i1": 2, "i2": 2}


def test_least_loaded_counts_tokens_not_requests():
    bal = Balancer({"a": ["i0", "i1"]}, BalancerConfig(strategy="least_loaded"))
    assert bal.route("a", "big", 1000.0) == "i0"          # tie: the first
    assert [bal.route("a", f"s{k}", 100.0) for k in range(3)] == ["i1"] * 3
    # i1 has three requests against one on i0, but 300 tokens against 1000: it still wins.
    assert (bal.load("i0"), bal.load("i1")) == (1000.0, 300.0)
    assert bal.inflight("i1") == 3 and bal.inflight("i0") == 1
    assert bal.route("a", "next", 100.0) == "i1"
    bal.finish("big", samples=1, tokens=900)
    assert bal.load("i0") == 0.0 and bal.route("a", "after", 100.0) == "i0"


def test_own_inflight_beats_a_stale_report():
    bal = Balancer({"a": ["i0", "i1"]}, BalancerConfig(strategy="least_loaded"))
    assert bal.route("a", "r0", 500.0) == "i0"
    bal.report("i0", 0)     # sent before r0 arrived there: it must not make i0 look idle
    assert bal.load("i0") == 500.0
    assert bal.route("a", "r1", 100.0) == "i1"
    bal.report("nowhere", 3)    # an instance the balancer does not know: ignored


def test_a_report_with_more_requests_than_ours_adds_load():
    bal = Balancer({"a": ["i0", "i1"]}, BalancerConfig(strategy="least_loaded"))
    bal.route("a", "r0", 100.0)                       # i0
    bal.report("i0", 3)                               # two more from other clients
    assert bal.load("i0") == pytest.approx(300.0)     # each at our mean request cost
    bal.report("i1", 2)                               # none of ours there
    assert bal.load("i1") > 0
    assert bal.route("a", "r1", 100.0, episode=None) in ("i0", "i1")


def test_our_finishes_after_a_report_do_not_read_as_foreign_load():
    bal = Balancer({"a": ["i0", "i1"]}, BalancerConfig(strategy="least_loaded"))
    bal.route("a", "r0", 100.0)
    bal.report("i0", 1)            # exact: r0 is the one request there
    bal.finish("r0", samples=1, tokens=50)
    assert bal.load("i0") == 0.0   # nothing is left there, ours or anyone's


def test_sticky_episode_stays_within_slack_and_leaves_beyond_it():
    bal = Balancer({"a": ["i0", "i1"]},
                   BalancerConfig(strategy="least_loaded", sticky_slack_tokens=100.0))
    assert bal.route("a", "e1", 50.0, episode="ep") == "i0"
    assert bal.route("a", "x1", 30.0) == "i1"
    # i0 (50) is 20 tokens busier than i1 (30): within the slack, the episode stays.
    assert bal.route("a", "e2", 10.0, episode="ep") == "i0"
    assert bal.stats.sticky_hits == 1
    bal.route("a", "x2", 500.0)                       # to i1 (30 < 60): i1 = 530
    bal.route("a", "x3", 600.0)                       # to i0 (60 < 530): i0 = 660
    # Now i0 is 130 tokens busier than i1: beyond the slack, the episode moves and stays there.
    assert bal.route("a", "e3", 10.0, episode="ep") == "i1"
    assert bal.stats.sticky_breaks == 1
    assert bal.route("a", "e4", 10.0, episode="ep") == "i1"
    bal.end_episode("a", "ep")
    hits, breaks = bal.stats.sticky_hits, bal.stats.sticky_breaks
    bal.route("a", "e5", 10.0, episode="ep")            # a fresh episode: neither kept nor broken
    assert (bal.stats.sticky_hits, bal.stats.sticky_breaks) == (hits, breaks)


def test_no_slack_means_no_stickiness_beyond_ties():
    bal = Balancer({"a": ["i0", "i1"]},
                   BalancerConfig(strategy="least_loaded", sticky_slack_tokens=0.0))
    assert bal.route("a", "e1", 10.0, episode="ep") == "i0"
    assert bal.route("a", "x", 5.0) == "i1"
    assert bal.route("a", "e2", 10.0, episode="ep") == "i1"   # i0 is 5 busier


def test_expected_length_is_learnt_as_an_ewma_capped_at_max_tokens():
    bal = Balancer({"a": ["i0"]}, BalancerConfig(length_smoothing=0.5))
    assert bal.estimate("a", n=4, max_tokens=128) == 4 * 128     # nothing learnt yet
    bal.route("a", "r0", 512.0)
    bal.finish("r0", samples=4, tokens=4 * 40)                    # first: taken as is
    assert bal.expected_len("a", 128) == 40.0
    bal.route("a", "r1", 160.0)
    bal.finish("r1", samples=2, tokens=2 * 80)                    # 0.5 * 40 + 0.5 * 80
    assert bal.expected_len("a", 128) == 60.0
    assert bal.expected_len("a", 16) == 16.0                      # capped at max_tokens
    assert bal.estimate("a", n=3, max_tokens=128) == 180.0
    bal.route("a", "r2", 180.0)
    bal.finish("r2")                                              # failed: teaches nothing
    assert bal.expected_len("a", 128) == 60.0 and bal.inflight("i0") == 0
    with pytest.raises(ValueError, match="not in flight"):
        bal.finish("r2")
    bal.route("a", "r3", 1.0)
    with pytest.raises(ValueError, match="already in flight"):
        bal.route("a", "r3", 1.0)


@pytest.mark.parametrize("key, bad", [
    ("strategy", "random"), ("sticky_slack_tokens", -1.0), ("ratio", 1.0),
    ("min_load_tokens", -1.0), ("patience", 0), ("cooldown_s", -1.0), ("min_instances", 0),
    ("length_smoothing", 0.0), ("length_smoothing", 1.5), ("check_interval_s", 0.0),
    ("demand_window_s", 0.0)])
def test_config_errors_name_the_key(key, bad):
    with pytest.raises(ValueError, match=rf"balance\.{key} .*{bad!r}"):
        BalancerConfig(**{key: bad})


def test_placement_errors():
    with pytest.raises(ValueError, match="'a' has no rollout instance"):
        Balancer({"a": []})
    with pytest.raises(ValueError, match="'i0' is placed twice"):
        Balancer({"a": ["i0"], "b": ["i0"]})


# ============================================================================ (a) moves

def test_plan_move_moves_cold_to_hot_only_after_patience_checks():
    bal = two_agents(patience=3)
    load_up(bal, "hot", 1000.0, "h")
    bal.route("cold", "c", 30.0)                       # c0: 30; c1, c2 idle
    assert checks(bal, [1.0, 2.0]) == [None, None]
    move = bal.plan_move(3.0)
    assert (move.src, move.dst) == ("cold", "hot")
    assert move.instance == "c1"                       # the donor's least loaded instance
    assert move.dst_load == 1000.0 and move.src_load == pytest.approx(10.0)


@pytest.mark.parametrize("strategy", ["round_robin", "least_loaded"])
def test_only_hierarchical_moves(strategy):
    bal = two_agents(strategy=strategy, patience=1)
    load_up(bal, "hot", 1000.0, "h")
    assert checks(bal, [1.0, 2.0, 3.0]) == [None] * 3


def test_an_imbalance_must_hold_for_consecutive_checks():
    bal = two_agents(patience=3)
    load_up(bal, "hot", 1000.0, "h")
    assert checks(bal, [1.0, 2.0]) == [None, None]
    bal.finish("h0")
    bal.finish("h1")                                    # gone at the third check
    assert bal.plan_move(3.0) is None
    load_up(bal, "hot", 1000.0, "again")
    assert checks(bal, [4.0, 5.0]) == [None, None]
    assert bal.plan_move(6.0) is not None


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
    assert three.plan_move(0.0) is None
    three.route("hot", "h", 1000.0)
    three.route("warm", "w", 20.0)
    move = three.plan_move(1.0)
    assert (move.src, move.dst) == ("warm", "hot")


def test_one_move_at_a_time_draining_then_finish_and_cooldown():
    bal = two_agents(patience=1, cooldown_s=10.0)
    load_up(bal, "hot", 1000.0, "h")
    bal.route("cold", "c-a", 10.0)                     # c0
    bal.route("cold", "c-b", 20.0)                     # c1
    move = bal.plan_move(1.0)
    assert move.instance == "c2"
    bal.route("cold", "c-c", 5.0)                      # c2 (idle) before the move starts
    bal.begin_move(move)
    assert bal.plan_move(2.0) is None                  # one move at a time
    with pytest.raises(RuntimeError, match="already in progress"):
        bal.begin_move(move)
    # Draining: no new request goes there; its own one is still in flight.
    assert all(bal.route("cold", f"n{k}", 1.0) != "c2" for k in range(6))
    assert bal.inflight("c2") == 1 and bal.agent_of("c2") == "cold"
    with pytest.raises(RuntimeError, match="still has 1 requests in flight"):
        bal.finish_move(move, 3.0)
    bal.finish("c-c", samples=1, tokens=5)
    bal.finish_move(move, 3.0)
    assert bal.agent_of("c2") == "hot" and "c2" in bal.instances("hot")
    assert "c2" not in bal.instances("cold") and bal.moves == [move]
    assert bal.route("hot", "to-new", 1.0) == "c2"     # the idle newcomer is least loaded
    # Cool-down: 10 s after the move finished, however hot the agent.
    load_up(bal, "hot", 5000.0, "more")
    assert checks(bal, [4.0, 8.0, 12.9]) == [None] * 3
    assert bal.plan_move(13.0) is not None


def test_abort_keeps_the_instance_and_wrong_moves_are_refused():
    bal = two_agents(patience=1)
    load_up(bal, "hot", 1000.0, "h")
    move = bal.plan_move(1.0)
    with pytest.raises(ValueError, match="serves cold, not hot"):
        bal.begin_move(type(move)(move.instance, "hot", "cold", 0.0, 0.0))
    bal.begin_move(move)
    bal.abort_move(move, 2.0)
    assert bal.agent_of(move.instance) == "cold" and bal.moves == []
    assert move.instance in {bal.route("cold", f"r{k}", 1.0) for k in range(3)}
    with pytest.raises(RuntimeError, match="not the move in progress"):
        bal.finish_move(move, 3.0)


def test_sticky_episodes_on_a_moved_instance_are_forgotten():
    bal = two_agents(patience=1)
    load_up(bal, "hot", 1000.0, "h")
    move = bal.plan_move(1.0)
    sticky = bal.route("cold", "ep-1", 1.0, episode="ep")
    move = type(move)(sticky, "cold", "hot", 0.0, 0.0)  # move the episode's own instance
    bal.finish("ep-1", samples=1, tokens=1)
    bal.begin_move(move)
    bal.finish_move(move, 2.0)
    hits, breaks = bal.stats.sticky_hits, bal.stats.sticky_breaks
    assert bal.route("cold", "ep-2", 1.0, episode="ep") != sticky
    assert (bal.stats.sticky_hits, bal.stats.sticky_breaks) == (hits, breaks)


def test_undoing_the_last_move_takes_ratio_squared():
    bal = two_agents(patience=1, cooldown_s=0.0, ratio=5.0)
    load_up(bal, "hot", 1000.0, "h")
    move = bal.plan_move(1.0)
    bal.begin_move(move)
    bal.finish_move(move, 1.0)                          # cold -> hot
    for rid in ("h0", "h1"):
        bal.finish(rid)
    bal.route("hot", "small", 30.0)                     # hot: 30 over 3 = 10 per instance
    load_up(bal, "cold", 100.0, "c")                    # cold: 100 per instance, 10x
    assert checks(bal, [2.0, 3.0]) == [None, None]      # 10x < 25x: not undone
    load_up(bal, "cold", 1000.0, "d")                   # 110x
    back = bal.plan_move(4.0)
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
            move = bal.plan_move(float(t))
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
    bal.plan_move(0.0)
    for agent in ("hot", "cold"):
        for rid in load_up(bal, agent, 200.0, f"warm-{agent}"):
            bal.finish(rid, samples=1, tokens=200)
    assert bal.plan_move(1.0) is None                  # nothing outstanding
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
    assert small.plan_move(2.0) is None
    assert small.move_pays(2.0, "cold", "hot", "c1") is False
    big = _priced()
    for k in range(2):
        load_up(big, "hot", 500.0, f"h{k}-")           # 10 s per instance
    big.route("cold", "c", 10.0)
    move = big.plan_move(2.0)
    assert (move.src, move.dst) == ("cold", "hot")
    # A slow move (learnt from a timed one: 9 s) makes the same backlog not worth it.
    big.begin_move(move)
    big.drained(move, 2.0, 11.0)
    big.finish_move(move, 11.0)
    assert big.move_pays(11.0, "cold", "hot", "c0") is False


def test_no_move_before_rates_are_learnt_nor_for_one_sequence_per_instance():
    bal = two_agents(cost_aware=True, patience=1)
    for k in range(3):
        load_up(bal, "hot", 100000.0, f"h{k}-")
    assert checks(bal, [1.0, 2.0]) == [None, None]  # no rate learnt
    one_each = _priced()
    load_up(one_each, "hot", 100000.0, "h")  # 1000 s per instance, but one sequence each:
    assert one_each.plan_move(2.0) is None   # another instance would not decode it faster


def test_a_donor_whose_stage_comes_next_keeps_its_instances():
    """The previous step had the cold agent busy right after this point of the step (its stage
    follows): the prediction counts that demand against the move, which then does not pay."""
    def step(bal: Balancer, start: float, *, cold_next: bool):
        bal.step_started(start)
        ids = load_up(bal, "hot", 500.0, f"h{start}-") + load_up(bal, "hot", 500.0, f"H{start}-")
        bal.route("cold", f"c{start}", 10.0)
        move = bal.plan_move(start + 1.0)
        for rid in ids + [f"c{start}"]:
            bal.finish(rid, samples=1, tokens=100)
        if cold_next:  # the cold agent's stage: 3000 tokens on each instance
            later = load_up(bal, "cold", 3000.0, f"n{start}-")
            bal.plan_move(start + 3.0)
            for rid in later:
                bal.finish(rid, samples=1, tokens=100)
        return move

    fresh = _priced()
    assert step(fresh, 10.0, cold_next=False) is not None  # no history: the move pays
    learnt = _priced()
    step(learnt, 10.0, cold_next=True)        # learnt (the move of this step left undone)
    learnt.step_started(20.0)
    assert learnt.predicted_tokens("cold", 21.0, 5.0) == 9000.0  # 3 instances x 3000
    assert step(learnt, 20.0, cold_next=True) is None


def _staged(ahead: bool = True, per_instance: int = 2) -> Balancer:
    """Step 1 (at 10 s): the cold agent's stage at phases 0-1 s (300 tokens on each of its 3
    instances), then the hot agent's at phases 6-13 s (`per_instance` requests of 500 tokens on
    each of its 2 instances); step 2 begins at 30 s with the cold agent's stage again."""
    bal = Balancer({"hot": ["h0", "h1"], "cold": ["c0", "c1", "c2"]},
                   BalancerConfig(demand_window_s=4.0, patience=1, cooldown_s=0.0,
                                  move_cost_s=2.0, ahead=ahead))
    bal.plan_move(0.0)
    for agent in ("hot", "cold"):  # rates: 100 tokens/s per instance
        for rid in load_up(bal, agent, 200.0, f"warm-{agent}"):
            bal.finish(rid, samples=1, tokens=200)
    bal.plan_move(1.0)
    bal.step_started(10.0)
    cold = load_up(bal, "cold", 300.0, "c")
    bal.plan_move(10.0)
    bal.plan_move(11.0)
    for rid in cold:
        bal.finish(rid, samples=1, tokens=300)
    for t in (12.0, 13.0, 14.0, 15.0):
        assert bal.plan_move(t) is None  # nobody busy, and no previous step to read ahead
    hot = [rid for k in range(per_instance) for rid in load_up(bal, "hot", 500.0, f"h{k}-")]
    for t in range(16, 24):
        bal.plan_move(float(t))  # the hot agent's stage (a move it finds is left undone)
    for rid in hot:
        bal.finish(rid, samples=1, tokens=500)
    bal.plan_move(24.0)
    bal.step_started(30.0)
    cold = load_up(bal, "cold", 300.0, "d")  # step 2 repeats step 1
    assert bal.plan_move(30.0) is None
    return bal, cold


def test_an_instance_moves_ahead_of_the_stage_that_needs_it():
    """In step 2, once the cold agent's stage is done, the previous step says the hot agent is
    about to need instances (8 s of work: one more instance saves 8/3 s, more than the 2 s
    move) that the cold one will not: one moves before the stage begins. Not without
    `ahead`, and not when the stage has one answer per instance (another instance would
    decode none faster)."""
    bal, cold = _staged()
    assert bal.predicted_tokens("hot", 35.0, 4.0) == 2000.0
    assert bal.plan_move(31.0) is None  # the cold agent is in its own stage
    for rid in cold:
        bal.finish(rid, samples=1, tokens=300)
    move = bal.plan_move(32.0)  # done: its instances idle until the next step's stage
    assert (move.src, move.dst) == ("cold", "hot") and move.dst_load == 1000.0
    assert move.src_load == 0.0  # 4 s before the hot agent's stage (phase 6)
    for kwargs in ({"ahead": False}, {"per_instance": 1}):
        other, cold = _staged(**kwargs)
        for rid in cold:
            other.finish(rid, samples=1, tokens=300)
        assert other.plan_move(32.0) is None, kwargs


# ============================================================================ (b) workload

def test_workload_is_seeded_skewed_and_long_tailed():
    w = SkewedWorkload(seed=3)
    a, b = w.episodes(0), w.episodes(0)
    assert a == b and a != w.episodes(1) and a != SkewedWorkload(seed=4).episodes(0)
    assert len(a) == w.episodes_per_step
    solver, verifier = w.agents
    per_round = []
    for ep in a:
        names = [c.agent for c in ep.calls]
        rounds = names.count("verifier")
        assert 1 <= rounds <= 2 and names[-1] == "verifier"
        per_round.append((len(names) - rounds) / rounds)
        for c in ep.calls:
            assert len(c.lengths) == c.n and all(1 <= x <= c.max_tokens for x in c.lengths)
    assert min(per_round) >= 4 and max(per_round) <= 8      # 4-8 solver calls per verifier call
    lengths = [x for ep in a for c in ep.calls if c.agent == "solver" for x in c.lengths]
    assert percentile(lengths, 0.99) > 5 * percentile(lengths, 0.5)   # a long tail
    totals = tokens_by_agent(a)
    assert totals["solver"] > 5 * totals["verifier"]
    with pytest.raises(ValueError, match="calls"):
        AgentProfile("x", calls=(3, 2))


# ============================================================================ (b) routing runs

COSTS = load_costs()
MODEL = COSTS.models["14b"]
PROMPT = 100
REL = 1e-9


def fixed(calls: int = 1, n: int = 1, length: int = 10, episodes: int = 1) -> SkewedWorkload:
    """One agent, every sample exactly `length` tokens."""
    return SkewedWorkload(agents=(AgentProfile("a", calls=(calls, calls), n=n, max_tokens=64,
                                               median_tokens=length, sigma=0.0),),
                          rounds=(1, 1), episodes_per_step=episodes)


def on_one_instance(workload, **config):
    return run_routing(workload, {"a": ["r0"]}, BalancerConfig(strategy="least_loaded"),
                       RoutingConfig(**{"steps": 1, "prompt_tokens": PROMPT, **config}))


def prefill() -> float:
    return COSTS.prefill_s(MODEL, PROMPT)


def decode(batch: int) -> float:
    """One decode step of `batch` sequences of PROMPT-token prompts (under one segment, the
    engine keeps the step time of the batch's arrival)."""
    return COSTS.decode_step_s(MODEL, batch, batch * PROMPT)


def test_engine_model_timing():
    # One sequence of 10 tokens: its prefill, then 10 decode steps (the cost model's).
    single = prefill() + 10 * decode(1)
    r = on_one_instance(fixed())
    assert r.step_s == [pytest.approx(single, rel=REL)] and r.requests[0].queue_wait == 0.0
    assert r.tokens_served == {"r0": 10} and r.busy_s["r0"] == pytest.approx(single, rel=REL)
    # One sequence at a time: the second request waits in the queue for the first to finish.
    r = on_one_instance(fixed(episodes=2), max_num_seqs=1)
    assert sorted(r.waits()) == [0.0, pytest.approx(single, rel=REL)]
    assert r.step_s == [pytest.approx(2 * single, rel=REL)]
    # n samples are n sequences decoded together, each prefilled: 3 prefills, 10 steps of 3.
    r = on_one_instance(fixed(n=3))
    assert r.step_s == [pytest.approx(3 * prefill() + 10 * decode(3), rel=REL)]
    assert r.tokens_served == {"r0": 30}
    # The calls of an episode run one after the other; an idle instance starts at once.
    r = on_one_instance(fixed(calls=2), steps=2)
    assert r.step_s == [pytest.approx(2 * single, rel=REL)] * 2 and len(r.requests) == 4
    assert r.waits() == [0.0] * 4 and r.all_finished


@dataclass(frozen=True)
class Script:
    """A workload of hand-written episodes, the same every step."""

    chains: tuple[CallChain, ...]

    def episodes(self, step: int) -> list[CallChain]:
        return list(self.chains)


def test_a_request_arriving_while_an_instance_decodes_joins_its_batch_at_once():
    """Continuous batching: a call that reaches a busy instance starts at once (its queue wait
    is 0); its prefill stalls the running sequence, which then decodes in a batch of two."""
    long = CallChain("long", (Call("a", 1, 256, (100,)),))
    late = CallChain("late", (Call("b", 1, 256, (5,)), Call("a", 1, 256, (10,))))
    r = run_routing(Script((long, late)), {"a": ["r0"], "b": ["r1"]},
                    BalancerConfig(strategy="least_loaded"),
                    RoutingConfig(steps=1, prompt_tokens=PROMPT))
    first, joined = r.requests[0], r.requests[2]
    assert (first.id, joined.id) == ("longc0", "latec1") and joined.instance == "r0"
    assert joined.dispatched == pytest.approx(prefill() + 5 * decode(1), rel=REL)
    assert joined.queue_wait == 0.0 and joined.finished < first.finished
    alone = prefill() + 100 * decode(1)
    assert alone + prefill() < first.finished < alone + prefill() + 10 * decode(2) + 1e-9
    assert r.tokens_served == {"r0": 110, "r1": 5} and r.all_finished


def test_simulation_is_deterministic():
    def run():
        w = SkewedWorkload(seed=5, episodes_per_step=32)
        r = run_routing(w, initial_placement(w.agent_names, 2), BalancerConfig(),
                        RoutingConfig(steps=2))
        return r.step_s, r.waits(), [(m.instance, m.src, m.dst, m.at) for m in r.moves], \
            r.tokens_served
    assert run() == run()


def long_tailed_stream(seed: int) -> SkewedWorkload:
    """One agent, one sample per call, lengths lognormal with sigma 1.5 (p99 ~ 33 x median)."""
    return SkewedWorkload(agents=(AgentProfile("a", calls=(4, 8), n=1, max_tokens=1024,
                                               median_tokens=32, sigma=1.5),),
                          rounds=(1, 1), episodes_per_step=32, seed=seed)


def test_least_outstanding_work_beats_round_robin_on_a_long_tailed_stream():
    """4 instances of 4 sequences each, 16 episodes at once: a long sample holds a sequence
    slot for long, round robin keeps sending to an instance that has them, least_loaded sees
    it still busy."""
    config = RoutingConfig(max_num_seqs=4, max_concurrent_episodes=16, steps=2)
    waits, steps = {}, {}
    for strategy in ("round_robin", "least_loaded"):
        waits[strategy], steps[strategy] = [], 0.0
        for seed in range(3):
            r = run_routing(long_tailed_stream(seed), {"a": ["r0", "r1", "r2", "r3"]},
                            BalancerConfig(strategy=strategy), config)
            assert r.all_finished
            waits[strategy] += r.waits()
            steps[strategy] += sum(r.step_s)
    stats = {s: {"p50": percentile(w, 0.5), "p99": percentile(w, 0.99),
                 "mean": sum(w) / len(w), "step_s": steps[s]} for s, w in waits.items()}
    for s, v in stats.items():
        print(f"{s:<13} queue wait p50 {v['p50']:.3f} s  p99 {v['p99']:.3f} s  "
              f"mean {v['mean']:.3f} s  step time {v['step_s']:.1f} s (3 seeds x 2 steps)")
    rr, ll = stats["round_robin"], stats["least_loaded"]
    assert ll["p99"] < 0.8 * rr["p99"]
    assert ll["mean"] < 0.7 * rr["mean"]
    assert ll["step_s"] < rr["step_s"]


def skewed_run(strategy: str, **balance):
    w = SkewedWorkload(seed=0, episodes_per_step=128)
    return run_routing(w, initial_placement(w.agent_names, 4),
                       BalancerConfig(strategy=strategy, **balance),
                       RoutingConfig(max_concurrent_episodes=64, max_num_seqs=16, steps=4))


def test_hierarchical_moves_toward_the_hot_agent_and_loses_nothing():
    r = skewed_run("hierarchical")
    rr = skewed_run("round_robin")
    print(f"hierarchical: {len(r.moves)} moves, step {r.mean_step_s:.1f} s vs round_robin "
          f"{rr.mean_step_s:.1f} s; load ratio {r.load_ratio:.2f} vs {rr.load_ratio:.2f}; "
          + "; ".join(f"{m.instance} {m.src}->{m.dst} at {move_times(m)[0]:.0f} s "
                      f"(loads {m.src_load:.0f}/{m.dst_load:.0f}, drain "
                      f"{m.drain_s:.2f} s + load {m.load_s:.2f} s)" for m in r.moves))
    # Toward the hot agent only, each instance once, never below min_instances, then no more.
    assert r.moves and all((m.src, m.dst) == ("verifier", "solver") for m in r.moves)
    assert len({m.instance for m in r.moves}) == len(r.moves) <= 3
    assert {a: len(v) for a, v in r.placement.items()} == {"solver": 4 + len(r.moves),
                                                           "verifier": 4 - len(r.moves)}
    assert all(m.dst_load > 5 * max(m.src_load, 1.0) for m in r.moves)
    assert r.mean_step_s < rr.mean_step_s and r.load_ratio < rr.load_ratio
    # Nothing lost: every dispatched request finished, the balancer holds none.
    assert r.all_finished and set(r.inflight_at_end.values()) == {0}
    # Each move drained: nothing routed to the instance from plan to done, its earlier
    # requests finished before the weights loaded, later ones are the new agent's. The load
    # takes the cost model's time for the agent's weights.
    assert any(m.drain_s > 0 for m in r.moves)
    eps = 1e-9   # move_times recomputes the instants from the pool's durations
    for m in r.moves:
        planned, drained, done = move_times(m)
        assert m.load_s == pytest.approx(COSTS.weight_load_s(MODEL), rel=REL)
        mine = [q for q in r.requests if q.instance == m.instance]
        assert not [q for q in mine if planned + eps < q.dispatched < done - eps]
        assert all(q.finished <= drained + eps for q in mine if q.dispatched < planned - eps)
        assert all(q.agent == m.dst for q in mine if q.dispatched >= done - eps)


def two_phase_workload(hot_calls: int, seed: int) -> SkewedWorkload:
    """Episodes of `hot_calls` calls of one agent, then one of another, all alike: the hot
    agent's demand is hot_calls x the cold one's, in phases (every step starts hot). Calls
    are short (16 tokens median: ~0.4 s on the 14b model), so a step's opening phase, when
    only the hot agent has calls, lasts a few checks, not a demand window: what the balancer
    sees is the sustained demand the tests are about."""
    profile = dict(n=1, max_tokens=64, median_tokens=16, sigma=0.5)
    return SkewedWorkload(agents=(AgentProfile("hot", calls=(hot_calls, hot_calls), **profile),
                                  AgentProfile("cold", calls=(1, 1), **profile)),
                          rounds=(1, 1), episodes_per_step=128, seed=seed)


def phase_run(hot_calls: int, seed: int, steps: int = 4):
    return run_routing(two_phase_workload(hot_calls, seed), initial_placement(["hot", "cold"], 4),
                       BalancerConfig(strategy="hierarchical"),
                       RoutingConfig(max_concurrent_episodes=32, max_num_seqs=16, steps=steps))


@pytest.mark.parametrize("seed", [0, 1])
def test_hierarchical_stops_under_the_ratio_and_does_not_flap(seed):
    """Demand 6:1 on 4 + 4 instances: moves go to the hot agent until its load per instance is
    under 5x the cold one's, well before the cold agent is down to one instance; none back."""
    r = phase_run(6, seed, steps=8)
    print(f"seed {seed}: moves " + ", ".join(f"{m.src}->{m.dst} at {move_times(m)[0]:.0f} s"
                                             for m in r.moves)
          + f"; run {r.makespan_s:.0f} s")
    assert r.moves and all((m.src, m.dst) == ("cold", "hot") for m in r.moves)
    assert len({m.instance for m in r.moves}) == len(r.moves)
    assert len(r.placement["cold"]) >= 2                  # stopped by the ratio, not the floor
    last = r.moves[-1].at
    after = [c for c in r.samples if c.t > last]
    assert len(after) > 0.7 * len(r.samples)              # it settled early and stayed
    mean = {a: sum(c.loads[a] for c in after) / len(after) for a in ("hot", "cold")}
    assert mean["hot"] < 5.0 * mean["cold"]
    assert r.all_finished


@pytest.mark.parametrize("seed", [0, 1])
def test_demand_under_the_ratio_moves_nothing(seed):
    r = phase_run(2, seed)                                # demand 2:1, ratio 5
    assert r.moves == [], [(m.instance, m.src, m.dst, m.at) for m in r.moves]
