"""Helpers shared by the balancer's tests (test_balancer.py, test_move_chooser.py): two agents, a
hot one and a cold one, loaded by hand and checked at hand-made times."""
from __future__ import annotations

from flexmarl.config.balance import BalancerConfig
from flexmarl.rollout.balancer import Balancer

# A demand window this short makes choose_move compare the current loads (no averaging), so the
# inter-agent unit tests read like the rule they test; the window has its own test. The ratio
# rule alone decides there (cost_aware off): the cost test has its own tests.
NOW = {"demand_window_s": 1e-9, "cost_aware": False}


def two_agents(compatible=None, **config) -> Balancer:
    bal = Balancer({"hot": ["h0", "h1"], "cold": ["c0", "c1", "c2"]},
                   BalancerConfig(**{**NOW, **config}), compatible=compatible)
    bal.choose_move(0.0)      # the caller's first check, before any request
    return bal


def load_up(bal: Balancer, agent: str, cost: float, prefix: str) -> list[str]:
    """As many requests of `cost` as the agent has instances (least_loaded spreads them one
    per instance when the instances are equally loaded); their ids."""
    ids = [f"{prefix}{i}" for i in range(len(bal.loads.instances(agent)))]
    for rid in ids:
        bal.route(agent, rid, cost)
    return ids


def checks(bal: Balancer, times) -> list:
    return [bal.choose_move(t) for t in times]
