"""Hierarchical load balancer of rollout instances: a pure object, no sockets, no clock of its own.

Two levels, as in the paper:

    intra-agent  route(agent, ...) ─► the agent's instance with the least outstanding work:
                 estimated tokens still to generate by the requests this balancer sent there
                 (n x expected length, learned per agent from finished requests), plus requests
                 the instance reports beyond those (other clients); sticky per episode (prefix
                 reuse) unless the episode's instance is `sticky_slack` tokens busier than the
                 least loaded one, so the tail never starves the others.
    inter-agent  choose_move(now) ─► when one agent's load per instance, averaged over
                 `demand_window_s`, exceeds another's by more than `ratio` for `patience`
                 consecutive checks, move one instance of the cold agent to the hot one (never
                 below `min_instances`, one move at a time, then `cooldown_s` without moves; a
                 move undoing the previous one needs ratio squared): begin_move ─► (caller
                 drains it: no new requests; waits for inflight(instance) == 0; loads the hot
                 agent's weights) ─► finish_move.
                 A move is made only when it pays (`cost_aware`): the seconds it saves the hot
                 agent (its backlog over its instances, less the move's own time: draining the
                 instance and loading weights, learnt from earlier moves) must exceed what it
                 costs the donor over the same horizon: the donor's backlog, or the demand it
                 had at the same phase of the previous step (`step_started`: the workflow
                 repeats, so a donor whose stage is next, in this step or at the start of
                 the next, keeps its instances). The hot agent's demand lasts as long as its
                 backlog or as it stayed busy in the previous step from the same phase on;
                 with about one sequence per instance, a move gains nothing (a sequence
                 decodes no faster on an emptier instance). Rates (tokens/s per instance)
                 are learnt from finished requests.
                 Ahead of a stage (`ahead`): demand moves from agent to agent stage by stage
                 faster than a window can follow, so with no imbalance now the previous
                 step's profile is read one move's time ahead: an agent about to get `ratio`
                 times busier per instance than an idle one gets an instance before its stage
                 begins, if the same test of saving against cost passes.

The parts, each pure and tested on its own (flexmarl.rollout.balance):

    Balancer ── holds:
       ├── loads           InstanceLoads (balance/loads.py: each instance's agent, outstanding
       │                   work, reports, learnt lengths): what callers read
       ├── strategy        RoundRobin | LeastLoaded (balance/routing.py), + StickyEpisodes
       ├── chooser         MoveChooser (balance/moves.py): the ratio test, move_pays, ahead
       └── profile, demand, rates   StepProfile, DemandAverage, Rates (balance/forecast.py)

This class wires them: it routes and counts requests, feeds each check's observations to the
forecast, gates choose_move (one move at a time, cool-down, the first window) and carries a
move's state (begin_move ─► drained ─► finish_move | abort_move).

The caller owns time and I/O: the rollout pool (flexmarl.rollout.pool.InstancePool) feeds it
real requests and load reports, on real engines or on the simulator's (flexmarl.sim), which
drives the same pool on a virtual clock; this class is the same in both.
Strategies: `round_robin` (baseline), `least_loaded` (intra only), `hierarchical` (both).
"""
from __future__ import annotations

import math
from typing import Callable

from flexmarl.config.balance import BalancerConfig
from flexmarl.rollout.balance.forecast import DemandAverage, Rates, StepProfile
from flexmarl.rollout.balance.loads import InstanceLoads
from flexmarl.rollout.balance.moves import Move, MoveChooser
from flexmarl.rollout.balance.routing import BalancerStats, StickyEpisodes, strategy_for

__all__ = ["Balancer", "BalancerStats", "Move", "percentile"]


class Balancer:
    """See the module docstring. Instance and agent names are plain strings."""

    def __init__(self, placement: dict[str, list[str]], config: BalancerConfig | None = None, *,
                 compatible: Callable[[str, str], bool] | None = None) -> None:
        self.config = config or BalancerConfig()
        self.loads = InstanceLoads(placement, self.config.length_smoothing)
        """The ledger: each instance's agent and outstanding work, learnt lengths (callers
        read instances, loads and in-flight counts here)."""
        self.stats = BalancerStats()
        self.strategy = strategy_for(self.config.strategy)
        # Round robin ignores load, so it keeps no episode on its instance either.
        self._sticky = self.config.strategy != "round_robin"
        self.episodes = StickyEpisodes(self.config.sticky_slack_tokens, self.stats)
        self.profile = StepProfile()
        self.demand = DemandAverage(self.config.demand_window_s)
        self.rates = Rates()
        self.chooser = MoveChooser(self.config, self.loads, self.profile, self.rates,
                                   compatible or (lambda src, dst: True))
        self.moves: list[Move] = []
        self._moving: Move | None = None
        self._cool_until = float("-inf")

    # ------------------------------------------------------------------ intra-agent

    def route(self, agent: str, request_id: str, cost: float, *, episode: str | None = None
              ) -> str:
        """Pick the instance for a request and count it in flight until finish()."""
        loads = self.loads
        if request_id in loads.requests:
            raise ValueError(f"request {request_id!r} is already in flight")
        candidates = loads.serving(agent)
        if not candidates:
            raise RuntimeError(f"agent {agent!r} has no serving instance (all draining)")
        # Ties in outstanding tokens go to the instance with fewer of our requests.
        choice = self.strategy.choose(agent, candidates,
                                      lambda i: (loads.load(i), loads.inflight(i)))
        if self._sticky:
            choice = self.episodes.keep(agent, episode, candidates, choice, loads.load)
        self.episodes.remember(agent, episode, choice)
        loads.count_in(request_id, agent, choice, cost)
        self.stats.routed[choice] = self.stats.routed.get(choice, 0) + 1
        return choice

    def finish(self, request_id: str, *, samples: int = 1, tokens: int | None = None) -> None:
        """A request ended (or failed: tokens None); `tokens` generated over `samples` samples
        teach the agent's expected length and its rate."""
        agent = self.loads.count_out(request_id, samples, tokens)
        if tokens is not None:
            self.rates.finished(agent, tokens)

    def end_episode(self, agent: str, episode: str) -> None:
        """Forget an episode's instance (its trajectory is done)."""
        self.episodes.end(agent, episode)

    def remove(self, instance: str) -> None:
        """The instance is gone (its process died): never routed to or moved again. Requests
        still in flight there finish (fail) through finish() as usual."""
        self.loads.retire(instance)
        if self._moving is not None and self._moving.instance == instance:
            self._moving = None
        self.episodes.forget(instance)

    # ------------------------------------------------------------------ inter-agent

    def step_started(self, now: float) -> None:
        """A new step's rollout begins: this step's demand profile becomes the prediction."""
        self.profile.step_started(now)

    def choose_move(self, now: float) -> Move | None:
        """One check of the inter-agent level; a Move to carry out, or None."""
        c = self.config
        if c.strategy != "hierarchical":
            return None
        last = self.demand.last_check
        dt = None if last is None else now - last
        loads = self.loads
        for agent in loads.agents:  # per check: each agent's rate and demand profile
            self.rates.observe(agent, dt, len(loads.serving(agent)))
            # Loads are estimates (n x the expected length): not profiled before an agent's
            # length is learnt (until then each request counts max_tokens, far too much).
            if loads.learnt_len(agent) is not None:
                self.profile.record(agent, now, loads.total(agent))
        demand = self.demand.update(now, {a: loads.agent_load(a) for a in loads.agents})
        # An average over less than one window is mostly the run's first phase (every episode
        # in its first agent's call, the others idle): no move on it.
        if self._moving is not None or now < self._cool_until \
                or now - self.demand.first_check < c.demand_window_s:
            self.chooser.reset_streak()
            return None
        return self.chooser.choose(now, demand, self.moves[-1] if self.moves else None)

    def begin_move(self, move: Move) -> None:
        """Stop routing to the instance; the caller waits for inflight() == 0, then reloads it."""
        if self._moving is not None:
            raise RuntimeError(f"a move is already in progress: {self._moving}")
        self.loads.drain(move.instance, move.src)
        self._moving = move

    def drained(self, move: Move, now: float, loaded: float) -> None:
        """The move's instance drained at `now` and its new weights loaded by `loaded`: the
        move's own cost, learnt for pricing the next (cost_aware)."""
        self.chooser.learn_move_s(max(0.0, loaded - now))

    def finish_move(self, move: Move, now: float) -> None:
        """The instance now serves move.dst (its weights are loaded): route to it again."""
        self._end_move(move, now, done=True)

    def abort_move(self, move: Move, now: float) -> None:
        """The move failed: the instance keeps serving move.src."""
        self._end_move(move, now, done=False)

    def _end_move(self, move: Move, now: float, *, done: bool) -> None:
        if self._moving != move:
            raise RuntimeError(f"{move} is not the move in progress")
        self.loads.undrain(move.instance, move.dst if done else None)
        if done:
            self.episodes.forget(move.instance)
            self.moves.append(move)
        self._moving = None
        self._cool_until = now + self.config.cooldown_s


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in [0, 1]) of request waits or latencies; nan for none."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]
