"""The Balancer as coordinator: the gate of choose_move and the state machine of a move, with
hand-made requests and times (its parts have their own tests: test_routing.py for the
intra-agent level, test_move_chooser.py for the inter-agent one; test_sim_routing.py drives it on
the simulator).

Covered: only `hierarchical` moves; one move at a time, draining, finish and cool-down; abort
and refused moves; sticky episodes of a moved instance forgotten; a timed move prices the
next; an instance removed mid-move ends the move.
"""
from __future__ import annotations

import math

import pytest

from flexmarl.config.balance import BalancerConfig
from flexmarl.rollout.balancer import percentile
from tests.helpers.balancing import checks, load_up, two_agents


@pytest.mark.parametrize("strategy", ["round_robin", "least_loaded"])
def test_only_hierarchical_moves(strategy):
    bal = two_agents(strategy=strategy, patience=1)
    load_up(bal, "hot", 1000.0, "h")
    assert checks(bal, [1.0, 2.0, 3.0]) == [None] * 3


def test_one_move_at_a_time_draining_then_finish_and_cooldown():
    bal = two_agents(patience=1, cooldown_s=10.0)
    load_up(bal, "hot", 1000.0, "h")
    bal.route("cold", "c-a", 10.0)                     # c0
    bal.route("cold", "c-b", 20.0)                     # c1
    move = bal.choose_move(1.0)
    assert move.instance == "c2"
    bal.route("cold", "c-c", 5.0)                      # c2 (idle) before the move starts
    bal.begin_move(move)
    assert bal.choose_move(2.0) is None                  # one move at a time
    with pytest.raises(RuntimeError, match="already in progress"):
        bal.begin_move(move)
    # Draining: no new request goes there; its own one is still in flight.
    assert all(bal.route("cold", f"n{k}", 1.0) != "c2" for k in range(6))
    assert bal.loads.inflight("c2") == 1 and bal.loads.agent_of("c2") == "cold"
    with pytest.raises(RuntimeError, match="still has 1 requests in flight"):
        bal.finish_move(move, 3.0)
    bal.finish("c-c", samples=1, tokens=5)
    bal.finish_move(move, 3.0)
    assert bal.loads.agent_of("c2") == "hot" and "c2" in bal.loads.instances("hot")
    assert "c2" not in bal.loads.instances("cold") and bal.moves == [move]
    assert bal.route("hot", "to-new", 1.0) == "c2"     # the idle newcomer is least loaded
    # Cool-down: 10 s after the move finished, however hot the agent.
    load_up(bal, "hot", 5000.0, "more")
    assert checks(bal, [4.0, 8.0, 12.9]) == [None] * 3
    assert bal.choose_move(13.0) is not None


def test_abort_keeps_the_instance_and_wrong_moves_are_refused():
    bal = two_agents(patience=1)
    load_up(bal, "hot", 1000.0, "h")
    move = bal.choose_move(1.0)
    with pytest.raises(ValueError, match="serves cold, not hot"):
        bal.begin_move(type(move)(move.instance, "hot", "cold", 0.0, 0.0))
    bal.begin_move(move)
    bal.abort_move(move, 2.0)
    assert bal.loads.agent_of(move.instance) == "cold" and bal.moves == []
    assert move.instance in {bal.route("cold", f"r{k}", 1.0) for k in range(3)}
    with pytest.raises(RuntimeError, match="not the move in progress"):
        bal.finish_move(move, 3.0)


def test_sticky_episodes_on_a_moved_instance_are_forgotten():
    bal = two_agents(patience=1)
    load_up(bal, "hot", 1000.0, "h")
    move = bal.choose_move(1.0)
    sticky = bal.route("cold", "ep-1", 1.0, episode="ep")
    move = type(move)(sticky, "cold", "hot", 0.0, 0.0)  # move the episode's own instance
    bal.finish("ep-1", samples=1, tokens=1)
    bal.begin_move(move)
    bal.finish_move(move, 2.0)
    hits, breaks = bal.stats.sticky_hits, bal.stats.sticky_breaks
    assert bal.route("cold", "ep-2", 1.0, episode="ep") != sticky
    assert (bal.stats.sticky_hits, bal.stats.sticky_breaks) == (hits, breaks)


def test_a_timed_move_prices_the_next_and_a_removed_instance_ends_its_move():
    bal = two_agents(patience=1, cooldown_s=0.0)
    assert bal.chooser.move_cost_s() == BalancerConfig().move_cost_s
    load_up(bal, "hot", 1000.0, "h")
    move = bal.choose_move(1.0)
    bal.begin_move(move)
    bal.drained(move, 2.0, 1.0)                       # loaded "before" it drained: 0 s
    assert bal.chooser.move_cost_s() == 0.0
    bal.drained(move, 2.0, 12.0)                      # EWMA 0.3 toward 10 s
    assert bal.chooser.move_cost_s() == pytest.approx(3.0)
    bal.remove(move.instance)                         # it died while changing hands
    assert move.instance not in bal.loads.instances("cold") and bal.loads.is_draining(move.instance)
    with pytest.raises(RuntimeError, match="not the move in progress"):
        bal.finish_move(move, 3.0)
    assert bal.choose_move(3.0) is not None             # no move in progress any more
    assert bal.moves == []


def test_percentile_is_nearest_rank():
    assert math.isnan(percentile([], 0.5))
    assert percentile([3.0, 1.0, 2.0], 0.5) == 2.0
    assert percentile([3.0, 1.0, 2.0], 0.0) == 1.0 and percentile([3.0, 1.0, 2.0], 1.0) == 3.0
    assert percentile([float(k) for k in range(100)], 0.99) == 98.0
