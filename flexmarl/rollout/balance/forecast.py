"""What the balancer learns of demand and throughput over time, for the inter-agent level.

    StepProfile    each agent's outstanding tokens at each check of a step; the previous
                   step's profile is the prediction of this one (the workflow repeats, so an
                   agent's stage comes back at about the same phase): predicted_tokens,
                   predicted_busy_s
    DemandAverage  each agent's load per instance averaged exponentially over a window, so
                   the phases of a step do not look like shifts of demand
    Rates          each agent's decode rate, tokens/s per serving instance while it had work
                   (EWMA over checks), from the tokens its finished requests generated

All times are the caller's (seconds on its clock); nothing here reads a clock.
"""
from __future__ import annotations

import math


class StepProfile:
    """Demand through this step and the previous one, as (seconds into the step, tokens)."""

    def __init__(self) -> None:
        self.start: float | None = None
        """When this step's rollout began; None before the first step."""
        self._profile: dict[str, list[tuple[float, float]]] = {}
        self._previous: dict[str, list[tuple[float, float]]] = {}

    @property
    def has_previous(self) -> bool:
        """A previous step was profiled: predictions can be read."""
        return self.start is not None and bool(self._previous)

    def step_started(self, now: float) -> None:
        """A new step's rollout begins: this step's profile becomes the prediction."""
        if self._profile:
            self._previous = self._profile
        self._profile = {}
        self.start = now

    def record(self, agent: str, now: float, tokens: float) -> None:
        """The agent's outstanding tokens at a check (ignored before the first step)."""
        if self.start is not None:
            self._profile.setdefault(agent, []).append((now - self.start, tokens))

    def predicted_tokens(self, agent: str, now: float, horizon_s: float) -> float:
        """The most outstanding tokens the agent had in the previous step over the same span
        of the step, [now, now + horizon_s], wrapping into the start of the next step past the
        previous step's length (0 without a previous step)."""
        if self.start is None:
            return 0.0
        t0 = now - self.start
        profile = self._previous.get(agent, [])
        length = max((t for t, _ in profile), default=0.0)
        wrap = t0 + horizon_s - length  # this much of the horizon falls in the next step
        return max((load for t, load in profile
                    if t0 <= t <= t0 + horizon_s or t <= wrap), default=0.0)

    def predicted_busy_s(self, agent: str, now: float, level: float) -> float:
        """How long, from this phase of the step on, the agent had at least `level`
        outstanding tokens in the previous step (its last such check; 0 without one)."""
        if self.start is None:
            return 0.0
        t0 = now - self.start
        return max((t - t0 for t, load in self._previous.get(agent, [])
                    if t >= t0 and load >= level), default=0.0)


class DemandAverage:
    """Loads per instance averaged exponentially over `window_s` of the caller's checks."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self.last_check: float | None = None
        self.first_check = float("-inf")
        """The first check's time: an average over less than a window is not trusted."""
        self._demand: dict[str, float] = {}

    def update(self, now: float, loads: dict[str, float]) -> dict[str, float]:
        """Fold one check's loads (agent -> load per instance) in; the averages."""
        if self.last_check is None:
            self.first_check = now
        dt = None if self.last_check is None else max(0.0, now - self.last_check)
        self.last_check = now
        w = 1.0 if dt is None else 1.0 - math.exp(-dt / self.window_s)
        for agent, load in loads.items():
            old = self._demand.get(agent)
            self._demand[agent] = load if old is None else old + w * (load - old)
        return dict(self._demand)


class Rates:
    """Tokens/s per serving instance, per agent, learnt from finished requests."""

    def __init__(self) -> None:
        self._finished: dict[str, float] = {}
        """agent -> tokens its finished requests generated since the last observe()."""
        self._rate: dict[str, float] = {}

    def finished(self, agent: str, tokens: float) -> None:
        self._finished[agent] = self._finished.get(agent, 0.0) + tokens

    def observe(self, agent: str, dt: float | None, serving: int) -> None:
        """One check, `dt` seconds after the last (None: the first), with `serving`
        instances: the tokens finished since then update the agent's rate."""
        done = self._finished.pop(agent, 0.0)
        if dt and done > 0 and serving:
            rate = done / dt / serving
            old = self._rate.get(agent)
            self._rate[agent] = rate if old is None else old + 0.3 * (rate - old)

    def get(self, agent: str) -> float | None:
        """The agent's rate; None until learnt."""
        return self._rate.get(agent)
