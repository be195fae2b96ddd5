"""Routing strategies: choose one instance among candidates. One interface for both levels.

    strategy.choose(key, candidates, load) ─► one of candidates
        key         whose choice it is (the agent routing a request; the donor agent giving
                    up an instance): round robin keeps one turn per key
        load        candidate ─► a comparable load (a number, or a tuple for tie-breaks)

    RoundRobin    each key's candidates in turn, whatever their load (the baseline)
    LeastLoaded   the candidate of least load; the first among equals
    StickyEpisodes  on top of a choice: keep an episode on the instance it used (its prefix is
                  cached there) unless that instance is `slack` tokens busier than the choice

The intra-agent level (flexmarl.rollout.balancer.Balancer.route) routes each request with the
configured strategy; the inter-agent level (flexmarl.rollout.balance.moves) picks the donor
agent and the donor's instance with LeastLoaded.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, Sequence


class Strategy(Protocol):
    def choose(self, key: str, candidates: Sequence[str], load: Callable[[str], Any]) -> str:
        """One of `candidates` (not empty)."""


class RoundRobin:
    """Each key's candidates in turn; load is not looked at."""

    def __init__(self) -> None:
        self._turns: dict[str, itertools.count] = {}

    def choose(self, key: str, candidates: Sequence[str], load: Callable[[str], Any]) -> str:
        turn = self._turns.setdefault(key, itertools.count())
        return candidates[next(turn) % len(candidates)]


class LeastLoaded:
    """The candidate of least `load`; ties go to the first (candidates keep placement order)."""

    def choose(self, key: str, candidates: Sequence[str], load: Callable[[str], Any]) -> str:
        return min(candidates, key=load)


def strategy_for(name: str) -> Strategy:
    """The intra-agent strategy of a BalancerConfig.strategy: `hierarchical` routes as
    `least_loaded` within an agent (it adds the inter-agent level)."""
    return RoundRobin() if name == "round_robin" else LeastLoaded()


@dataclass
class BalancerStats:
    routed: dict[str, int] = field(default_factory=dict)
    """instance -> requests routed to it."""
    sticky_hits: int = 0
    sticky_breaks: int = 0
    """Episodes moved off their instance because it was too busy."""


class StickyEpisodes:
    """Each episode's last instance per agent, and whether to keep it over a fresh choice."""

    def __init__(self, slack_tokens: float, stats: BalancerStats) -> None:
        self.slack_tokens = slack_tokens
        self._stats = stats
        self._where: dict[tuple[str, str], str] = {}

    def keep(self, agent: str, episode: str | None, candidates: Sequence[str], choice: str,
             load: Callable[[str], float]) -> str:
        """`choice`, or the episode's instance if it is a candidate at most slack_tokens
        busier (`load`: outstanding tokens); counts the hit or break in the stats."""
        sticky = self._where.get((agent, episode)) if episode is not None else None
        if sticky is not None and sticky in candidates and sticky != choice:
            if load(sticky) - load(choice) <= self.slack_tokens:
                self._stats.sticky_hits += 1
                return sticky
            self._stats.sticky_breaks += 1
        elif sticky == choice:
            self._stats.sticky_hits += 1
        return choice

    def remember(self, agent: str, episode: str | None, instance: str) -> None:
        if episode is not None:
            self._where[(agent, episode)] = instance

    def end(self, agent: str, episode: str) -> None:
        """The episode's trajectory is done."""
        self._where.pop((agent, episode), None)

    def forget(self, instance: str) -> None:
        """The instance is gone or serves another agent now: its episodes start afresh."""
        self._where = {k: v for k, v in self._where.items() if v != instance}
