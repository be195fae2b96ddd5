"""Skewed multi-agent workloads for the routing comparison (flexmarl.sim.routing): pure, seeded.

A step is a batch of episodes; an episode is a `CallChain`, a causal chain of calls (the next
starts when the previous returns), each `Call(agent, n, max_tokens, lengths)`. `lengths` are
the response lengths its n samples will actually have: the simulated engines decode exactly
that many tokens, the balancer never sees them (it only learns from finished requests, as with
a real engine).

Two kinds of skew, as in multi-agent RL workflows:
- between agents: per round of an episode each agent is called a number of times drawn from its
  `calls` range (default: the solver 4-8 times per verifier call), with its own n and lengths;
- within an agent: lengths are lognormal (median x exp(sigma x N(0, 1))) capped at max_tokens,
  so a few samples run ~10x the median (sigma 1: p99 = 10.2 x median) and dominate their calls.

The same (config, step) always gives the same episodes: one random.Random per step, seeded from
(seed, step), so strategies compared on one workload see identical calls and lengths.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass, field


@dataclass(frozen=True)
class AgentProfile:
    """How one agent is called: per round of an episode, and per call."""

    name: str
    calls: tuple[int, int] = (1, 1)
    """Calls per round, uniform in [lo, hi] (inclusive)."""
    n: int = 1
    """Samples per call."""
    max_tokens: int = 256
    median_tokens: float = 32.0
    """Median response length of one sample (before the cap)."""
    sigma: float = 1.0
    """Lognormal shape: the tail's weight (0: every sample is median_tokens long)."""

    def __post_init__(self) -> None:
        lo, hi = self.calls
        if not 0 <= lo <= hi:
            raise ValueError(f"agent {self.name}: calls must be 0 <= lo <= hi, got {self.calls}")
        if self.n < 1 or self.max_tokens < 1 or self.median_tokens <= 0 or self.sigma < 0:
            raise ValueError(f"agent {self.name}: n, max_tokens, median_tokens must be positive "
                             f"and sigma >= 0")


@dataclass(frozen=True)
class Call:
    agent: str
    n: int
    max_tokens: int
    lengths: tuple[int, ...]
    """Actual response length of each of the n samples (1..max_tokens)."""

    @property
    def tokens(self) -> int:
        return sum(self.lengths)


@dataclass(frozen=True)
class CallChain:
    """One episode: its calls in order (named apart from the gateway's Episode)."""

    id: str
    calls: tuple[Call, ...]


def _default_agents() -> tuple[AgentProfile, ...]:
    # A solver that drafts often and long, a verifier that answers once and briefly. One sample
    # per call, as `ctx.generate` in this project's teams (groups span trajectories, not calls).
    return (AgentProfile("solver", calls=(4, 8), n=1, max_tokens=512, median_tokens=64, sigma=1.0),
            AgentProfile("verifier", calls=(1, 1), n=1, max_tokens=256, median_tokens=48,
                         sigma=0.75))


@dataclass(frozen=True, kw_only=True)
class SkewedWorkload:
    """Episodes of a multi-agent workflow: `rounds` rounds, each calling the agents in order."""

    agents: tuple[AgentProfile, ...] = field(default_factory=_default_agents)
    rounds: tuple[int, int] = (1, 2)
    """Rounds per episode, uniform in [lo, hi]."""
    episodes_per_step: int = 64
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.agents:
            raise ValueError("a workload needs at least one agent")
        if len({a.name for a in self.agents}) != len(self.agents):
            raise ValueError("agent names must be unique")
        if not 1 <= self.rounds[0] <= self.rounds[1] or self.episodes_per_step < 1:
            raise ValueError("rounds must be 1 <= lo <= hi and episodes_per_step >= 1")
        if not any(a.calls[0] >= 1 for a in self.agents):
            raise ValueError("some agent must be called at least once per round (calls lo >= 1)")

    @property
    def agent_names(self) -> list[str]:
        return [a.name for a in self.agents]

    def episodes(self, step: int) -> list[CallChain]:
        """The episodes of one step, in issue order."""
        # One generator per step: step k's episodes do not depend on how many steps ran before.
        rng = random.Random(self.seed * 1_000_003 + step)
        out = []
        for e in range(self.episodes_per_step):
            calls = []
            for _ in range(rng.randint(*self.rounds)):
                for a in self.agents:
                    for _ in range(rng.randint(*a.calls)):
                        calls.append(Call(a.name, a.n, a.max_tokens, tuple(
                            self._length(rng, a) for _ in range(a.n))))
            out.append(CallChain(f"s{step}e{e}", tuple(calls)))
        return out

    @staticmethod
    def _length(rng: random.Random, a: AgentProfile) -> int:
        x = rng.lognormvariate(math.log(a.median_tokens), a.sigma)
        return max(1, min(a.max_tokens, round(x)))


def tokens_by_agent(episodes: list[CallChain]) -> dict[str, int]:
    """Total response tokens per agent (the work a step asks of each agent's instances)."""
    out: dict[str, int] = {}
    for ep in episodes:
        for c in ep.calls:
            out[c.agent] = out.get(c.agent, 0) + c.tokens
    return out
