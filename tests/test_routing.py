"""Intra-agent routing: the strategies alone, the load ledger, then Balancer.route.

Layers:
(a) flexmarl.rollout.balance.routing alone: RoundRobin and LeastLoaded behind one interface
    (choose(key, candidates, load)), StickyEpisodes' slack; flexmarl.rollout.balance.loads:
    own requests against reports, learnt lengths, placement errors.
(b) Balancer.route/finish/report with hand-made requests: round robin, least outstanding work
    (tokens, not request counts), own in-flight counts against stale or larger reports, sticky
    episodes and their slack, learnt lengths, config errors.
"""
from __future__ import annotations

import pytest

from flexmarl.config.balance import BalancerConfig
from flexmarl.rollout.balance.loads import InstanceLoads
from flexmarl.rollout.balance.routing import (BalancerStats, LeastLoaded, RoundRobin,
                                              StickyEpisodes, strategy_for)
from flexmarl.rollout.balancer import Balancer


# ============================================================================ (a) strategies

def test_round_robin_takes_turns_per_key_and_ignores_load():
    rr = RoundRobin()
    heavy = {"i0": 1e9, "i1": 0.0, "i2": 0.0}.get
    assert [rr.choose("a", ["i0", "i1", "i2"], heavy) for _ in range(4)] == \
        ["i0", "i1", "i2", "i0"]
    assert rr.choose("b", ["j0", "j1"], heavy) == "j0"      # another key: its own turn
    assert rr.choose("a", ["i0", "i1"], heavy) == "i0"      # turn 4 of 2 candidates
    assert isinstance(strategy_for("round_robin"), RoundRobin)


def test_least_loaded_takes_the_least_and_the_first_among_equals():
    ll = LeastLoaded()
    loads = {"i0": 3.0, "i1": 1.0, "i2": 1.0}
    assert ll.choose("a", ["i0", "i1", "i2"], loads.get) == "i1"
    assert ll.choose("a", ["i2", "i1"], loads.get) == "i2"
    # A tuple load breaks ties: the same interface serves the donor choice (a plain number)
    # and the request's (tokens, then our requests there).
    assert ll.choose("a", ["i1", "i2"], lambda i: (loads[i], {"i1": 2, "i2": 0}[i])) == "i2"
    for name in ("least_loaded", "hierarchical"):
        assert isinstance(strategy_for(name), LeastLoaded)


def test_sticky_episodes_keep_within_slack_and_count_hits_and_breaks():
    stats = BalancerStats()
    sticky = StickyEpisodes(10.0, stats)
    loads = {"i0": 15.0, "i1": 0.0}
    assert sticky.keep("a", "ep", ["i0", "i1"], "i1", loads.get) == "i1"  # nothing remembered
    sticky.remember("a", "ep", "i0")
    sticky.remember("a", None, "i0")                                     # no episode: nothing
    assert sticky.keep("a", "ep", ["i0", "i1"], "i1", loads.get) == "i1"  # 15 > 10 busier
    assert (stats.sticky_hits, stats.sticky_breaks) == (0, 1)
    loads["i0"] = 10.0
    assert sticky.keep("a", "ep", ["i0", "i1"], "i1", loads.get) == "i0"  # within the slack
    assert sticky.keep("a", "ep", ["i0", "i1"], "i0", loads.get) == "i0"  # the choice itself
    assert (stats.sticky_hits, stats.sticky_breaks) == (2, 1)
    assert sticky.keep("a", "ep", ["i1"], "i1", loads.get) == "i1"        # not a candidate
    assert sticky.keep("b", "ep", ["i0", "i1"], "i1", loads.get) == "i1"  # per agent
    sticky.forget("i0")
    assert sticky.keep("a", "ep", ["i0", "i1"], "i1", loads.get) == "i1"
    sticky.remember("a", "ep", "i0")
    sticky.end("a", "ep")
    assert sticky.keep("a", "ep", ["i0", "i1"], "i1", loads.get) == "i1"
    assert (stats.sticky_hits, stats.sticky_breaks) == (2, 1)


def test_instance_loads_count_own_requests_reports_and_lengths():
    loads = InstanceLoads({"a": ["i0", "i1"], "b": ["i2"]}, length_smoothing=0.5)
    assert loads.agents == ["a", "b"] and loads.serving("a") == ["i0", "i1"]
    assert loads.learnt_len("a") is None and loads.estimate("a", n=2, max_tokens=8) == 16.0
    loads.count_in("r0", "a", "i0", 100.0)
    loads.count_in("r1", "a", "i0", 50.0)
    assert (loads.load("i0"), loads.inflight("i0"), loads.total("a")) == (150.0, 2, 150.0)
    assert loads.agent_load("a") == 75.0
    loads.report("i1", 2)                             # two of other clients, at mean cost 1
    assert loads.load("i1") == 2.0
    assert loads.count_out("r0", 2, 40) == "a"
    assert loads.learnt_len("a") == 20.0 and loads.load("i0") == 50.0
    assert loads.count_out("r1", 1, None) == "a"      # failed: teaches nothing
    assert loads.learnt_len("a") == 20.0 and loads.load("i0") == 0.0
    with pytest.raises(ValueError, match="not in flight"):
        loads.count_out("r1", 1, None)
    loads.add("b", "i3")
    assert loads.instances("b") == ["i2", "i3"] and loads.agent_of("i3") == "b"
    with pytest.raises(ValueError, match="already known"):
        loads.add("a", "i3")
    assert not loads.is_draining("i3")


# ============================================================================ (b) Balancer.route

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
    assert (bal.loads.load("i0"), bal.loads.load("i1")) == (1000.0, 300.0)
    assert bal.loads.inflight("i1") == 3 and bal.loads.inflight("i0") == 1
    assert bal.route("a", "next", 100.0) == "i1"
    bal.finish("big", samples=1, tokens=900)
    assert bal.loads.load("i0") == 0.0 and bal.route("a", "after", 100.0) == "i0"


def test_own_inflight_beats_a_stale_report():
    bal = Balancer({"a": ["i0", "i1"]}, BalancerConfig(strategy="least_loaded"))
    assert bal.route("a", "r0", 500.0) == "i0"
    bal.loads.report("i0", 0)     # sent before r0 arrived there: it must not make i0 look idle
    assert bal.loads.load("i0") == 500.0
    assert bal.route("a", "r1", 100.0) == "i1"
    bal.loads.report("nowhere", 3)    # an instance the balancer does not know: ignored


def test_a_report_with_more_requests_than_ours_adds_load():
    bal = Balancer({"a": ["i0", "i1"]}, BalancerConfig(strategy="least_loaded"))
    bal.route("a", "r0", 100.0)                       # i0
    bal.loads.report("i0", 3)                               # two more from other clients
    assert bal.loads.load("i0") == pytest.approx(300.0)     # each at our mean request cost
    bal.loads.report("i1", 2)                               # none of ours there
    assert bal.loads.load("i1") > 0
    assert bal.route("a", "r1", 100.0, episode=None) in ("i0", "i1")


def test_our_finishes_after_a_report_do_not_read_as_foreign_load():
    bal = Balancer({"a": ["i0", "i1"]}, BalancerConfig(strategy="least_loaded"))
    bal.route("a", "r0", 100.0)
    bal.loads.report("i0", 1)            # exact: r0 is the one request there
    bal.finish("r0", samples=1, tokens=50)
    assert bal.loads.load("i0") == 0.0   # nothing is left there, ours or anyone's


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
    assert bal.loads.estimate("a", n=4, max_tokens=128) == 4 * 128     # nothing learnt yet
    bal.route("a", "r0", 512.0)
    bal.finish("r0", samples=4, tokens=4 * 40)                    # first: taken as is
    assert bal.loads.expected_len("a", 128) == 40.0
    bal.route("a", "r1", 160.0)
    bal.finish("r1", samples=2, tokens=2 * 80)                    # 0.5 * 40 + 0.5 * 80
    assert bal.loads.expected_len("a", 128) == 60.0
    assert bal.loads.expected_len("a", 16) == 16.0                      # capped at max_tokens
    assert bal.loads.estimate("a", n=3, max_tokens=128) == 180.0
    bal.route("a", "r2", 180.0)
    bal.finish("r2")                                              # failed: teaches nothing
    assert bal.loads.expected_len("a", 128) == 60.0 and bal.loads.inflight("i0") == 0
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

