"""The inter-agent level: which instance moves from which agent to which, and whether it pays.

    choose(now, demand, last) ─► Move | None, once per check (the balancer has already ruled out
        a check during a move, a cool-down or the first demand window)
      ratio test   the hottest agent whose averaged load per instance exceeds `ratio` times
                   another's (ratio squared to undo the last move) for `patience` consecutive
                   checks, above `min_load_tokens`; the donor never below `min_instances`
      move_pays    the seconds the move saves the hot agent (its backlog, or how long it stayed
                   busy from this phase of the previous step on, over one more instance, less
                   the move's own time: draining the instance and loading weights) against the
                   donor's loss over the same horizon and the likely trip back (cost_aware)
      ahead        no imbalance now: an agent the previous step's profile says is about to get
                   `ratio` times busier per instance than an idle one gets an instance one
                   move's time before its stage begins, if ahead_pays
    learn_move_s   a finished move's own time prices the next

Donor agent and donor instance are chosen by LeastLoaded (flexmarl.rollout.balance.routing),
the interface the intra-agent level routes with. Pure: loads, profile and rates are read from
the objects given at construction; time is the caller's.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from flexmarl import _compat
from flexmarl.config.balance import BalancerConfig
from flexmarl.rollout.balance.forecast import Rates, StepProfile
from flexmarl.rollout.balance.loads import InstanceLoads
from flexmarl.rollout.balance.routing import LeastLoaded


@dataclass(frozen=True)
class Move:
    """One instance changing hands, and why."""

    instance: str
    src: str
    dst: str
    src_load: float
    """Load per instance (estimated outstanding tokens) of the cold agent when chosen."""
    dst_load: float
    """... and of the hot agent."""


class MoveChooser:
    """See the module docstring; `compatible(src, dst)`: may an instance of src serve dst."""

    def __init__(self, config: BalancerConfig, loads: InstanceLoads, profile: StepProfile,
                 rates: Rates, compatible: Callable[[str, str], bool]) -> None:
        self.config = config
        self._loads = loads
        self._profile = profile
        self._rates = rates
        self._compatible = compatible
        self._least = LeastLoaded()
        self._streak: tuple[str, str] | None = None
        self._streak_len = 0
        self._move_s: float | None = None
        """Seconds a move took beyond draining (EWMA; None until one finished)."""

    def reset_streak(self) -> None:
        """No move may start now: an imbalance must hold `patience` checks again."""
        self._streak, self._streak_len = None, 0

    def choose(self, now: float, demand: dict[str, float], last: Move | None) -> Move | None:
        """One check: `demand` is each agent's averaged load per instance, `last` the last
        move made. A Move to carry out, or None."""
        c = self.config
        pair = self._hot_pair(demand, last)
        if pair is None or pair != self._streak:
            self._streak, self._streak_len = pair, (1 if pair else 0)
        else:
            self._streak_len += 1
        if pair is not None and self._streak_len >= c.patience:
            src, dst = pair
            # The donor's least busy instance drains fastest.
            instance = self._least.choose(src, self._loads.serving(src), self._loads.load)
            if not c.cost_aware or self.move_pays(now, src, dst, instance):
                self.reset_streak()
                return Move(instance, src, dst, demand[src], demand[dst])
            # It does not pay: the streak stands, the next check weighs it again.
        if c.ahead and c.cost_aware:  # no move for now's demand: one for the next stage's?
            return self._ahead(now)
        return None

    def _hot_pair(self, demand: dict[str, float], last: Move | None) -> tuple[str, str] | None:
        """(donor, hot agent) of the ratio test at this check, or None."""
        c = self.config
        for hot in sorted(demand, key=demand.get, reverse=True):
            if demand[hot] < c.min_load_tokens:
                return None

            def needed(cold: str) -> float:  # undoing the last move takes a larger imbalance
                undo = last is not None and (last.src, last.dst) == (hot, cold)
                return c.ratio ** 2 if undo else c.ratio

            donors = [a for a in self._loads.agents if a != hot and self._compatible(a, hot)
                      and len(self._loads.serving(a)) > c.min_instances
                      and demand[hot] > needed(a) * max(demand[a], 1.0)]
            if donors:
                return self._least.choose(hot, donors, demand.get), hot
        return None

    def move_pays(self, now: float, src: str, dst: str, instance: str) -> bool:
        """Does moving `instance` from `src` to `dst` save more seconds than it costs?

        The hot agent's demand is expected to last the longer of: its backlog at its
        instances' rate, and how long it stayed busy from the same phase of the previous step
        on. One more instance takes 1/(n+1) of what
        remains after the move's own time (drain + weight load); the donor loses as much of
        its own backlog (or predicted demand) over that horizon, and the instance will likely
        move again as demand moves on, so the saving must pay for that trip too."""
        loads = self._loads
        r_src, r_dst = self._rates.get(src), self._rates.get(dst)
        if not r_src or not r_dst:
            return False  # no rate learnt yet: a move cannot be priced
        serving = loads.serving(dst)
        if sum(loads.inflight(i) for i in serving) < 2 * len(serving):
            return False  # about one sequence per instance: more instances decode no faster
        n_dst = len(loads.serving(dst))
        move_s = loads.load(instance) / r_src + self.move_cost_s()
        busy = self.config.min_load_tokens * n_dst  # "has work": as for the ratio test
        hot_s = max(loads.total(dst) / (n_dst * r_dst),
                    self._profile.predicted_busy_s(dst, now, busy))
        gain_s = max(0.0, hot_s - move_s) / (n_dst + 1)
        loss_s = self._donor_loss_s(now, src, hot_s + move_s)
        return gain_s > loss_s + move_s / (n_dst + 1)

    def _ahead(self, now: float) -> Move | None:
        """A move ahead of the next stage: the agent whose demand, one move's time from now,
        was highest at that phase of the previous step, from the agent that had the least
        then (and has the least now), if the move pays (ahead_pays). No patience: the
        prediction is a whole step's observation, not one noisy check."""
        if not self._profile.has_previous:
            return None
        loads, profile = self._loads, self._profile
        lead = self.move_cost_s() + self.config.check_interval_s
        window = self.config.demand_window_s
        n = {a: max(len(loads.serving(a)), 1) for a in loads.agents}
        future = {a: profile.predicted_tokens(a, now + lead, window) / n[a] for a in loads.agents}
        dst = max(future, key=lambda a: (future[a], a))
        if future[dst] < self.config.min_load_tokens or loads.agent_load(dst) >= future[dst]:
            return None  # nobody about to get busy, or it already is (the ratio test's case)
        # No ratio squared for undoing the last move: stages come back every step, and the
        # cost test already charges the trip back.
        ratio = self.config.ratio

        def idle(a: str) -> float:  # its load now and what it had from now to past the lead
            return max(loads.agent_load(a), profile.predicted_tokens(a, now, lead + window) / n[a])
        donors = [a for a in loads.agents if a != dst and self._compatible(a, dst)
                  and len(loads.serving(a)) > self.config.min_instances
                  and future[dst] > ratio * max(idle(a), 1.0)]
        if not donors:
            return None
        src = self._least.choose(dst, donors, lambda a: (idle(a), a))
        instance = self._least.choose(src, loads.serving(src), loads.load)
        if not self.ahead_pays(now, src, dst, instance, lead):
            return None
        return Move(instance, src, dst, loads.agent_load(src), future[dst])

    def ahead_pays(self, now: float, src: str, dst: str, instance: str, lead: float) -> bool:
        """move_pays for a stage that has not begun: the hot agent's demand is the previous
        step's from `lead` seconds on (how long it stayed busy then), and there must be at
        least two expected answers per instance to share (with one each, another instance
        decodes nothing faster)."""
        loads = self._loads
        r_src, r_dst = self._rates.get(src), self._rates.get(dst)
        length = loads.learnt_len(dst)
        if not r_src or not r_dst or not length:
            return False
        n_dst = len(loads.serving(dst))
        window = self.config.demand_window_s
        if self._profile.predicted_tokens(dst, now + lead, window) < 2 * n_dst * length:
            return False
        move_s = loads.load(instance) / r_src + self.move_cost_s()
        busy = self.config.min_load_tokens * n_dst
        hot_s = self._profile.predicted_busy_s(dst, now + lead, busy)
        gain_s = hot_s / (n_dst + 1)
        loss_s = self._donor_loss_s(now, src, lead + hot_s)
        return gain_s > loss_s + move_s  # a prediction can be wrong: it must pay its whole trip

    def _donor_loss_s(self, now: float, src: str, horizon: float) -> float:
        """Seconds the donor loses over `horizon` with one instance fewer: its backlog (or the
        demand it had over that span of the previous step) spread over the instances left."""
        n_src = len(self._loads.serving(src))
        cold = max(self._loads.total(src), self._profile.predicted_tokens(src, now, horizon))
        return min(cold / (n_src * self._rates.get(src)), horizon) / max(n_src - 1, 1)

    def move_cost_s(self) -> float:
        """A move's own time beyond draining: learnt, or move_cost_s until one was timed."""
        return self._move_s if self._move_s is not None else self.config.move_cost_s

    def learn_move_s(self, seconds: float) -> None:
        """A move's weights loaded `seconds` after it drained (EWMA)."""
        self._move_s = seconds if self._move_s is None else \
            self._move_s + 0.3 * (seconds - self._move_s)


__getattr__ = _compat.renamed_getattr(__name__, globals())  # the old names, until REMOVED_IN
