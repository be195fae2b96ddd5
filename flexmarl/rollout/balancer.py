"""Hierarchical load balancer of rollout instances: a pure object, no sockets, no clock of its own.

Two levels, as in the paper:

    intra-agent  route(agent, ...) ─► the agent's instance with the least outstanding work:
                 estimated tokens still to generate by the requests this balancer sent there
                 (n x expected length, learned per agent from finished requests), plus requests
                 the instance reports beyond those (other clients); sticky per episode (prefix
                 reuse) unless the episode's instance is `sticky_slack` tokens busier than the
                 least loaded one, so the tail never starves the others.
    inter-agent  plan_move(now) ─► when one agent's load per instance, averaged over
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

The caller owns time and I/O: the rollout pool (flexmarl.rollout.pool.InstancePool) feeds it
real requests and load reports, on real engines or on the simulator's (flexmarl.sim), which
drives the same pool on a virtual clock; this class is the same in both.
Strategies: `round_robin` (baseline), `least_loaded` (intra only), `hierarchical` (both).
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Callable

STRATEGIES = ("round_robin", "least_loaded", "hierarchical")


@dataclass(frozen=True, kw_only=True)
class BalancerConfig:
    """Routing and rebalancing policy (section `balance`)."""

    strategy: str = "hierarchical"
    """`round_robin`, `least_loaded` (intra-agent only) or `hierarchical` (intra + inter)."""
    sticky_slack_tokens: float = 64.0
    """Keep an episode on its instance unless that has this many more outstanding tokens than
    the least loaded instance of the agent (0: no stickiness)."""
    ratio: float = 5.0
    """Inter-agent: move an instance when the hot agent's load per instance exceeds this many
    times the cold agent's (the paper's threshold)."""
    min_load_tokens: float = 64.0
    """Inter-agent: ignore imbalance while the hot agent's load per instance is below this."""
    patience: int = 3
    """Inter-agent: consecutive plan_move() checks the imbalance must hold (hysteresis)."""
    cooldown_s: float = 10.0
    """Inter-agent: no new move this long after the last one finished."""
    min_instances: int = 1
    """Inter-agent: an agent never drops below this many instances."""
    length_smoothing: float = 0.2
    """Weight of each finished request in the per-agent expected response length (EWMA)."""
    check_interval_s: float = 1.0
    """Inter-agent: how often the caller runs plan_move() (the orchestrator, the simulator)."""
    demand_window_s: float = 10.0
    """Inter-agent: loads are averaged over about this long (exponentially) before comparing
    agents, so the phases of a step (one agent's turn, then the other's) do not look like
    shifts of demand. Several steps long is right."""
    cost_aware: bool = True
    """Inter-agent: move only when the move saves the hot agent more than it costs the donor
    (see the module docstring); False: the ratio test alone decides."""
    move_cost_s: float = 2.0
    """Inter-agent: the assumed seconds a move takes (weight load, beyond draining) until
    the first move has been timed."""
    ahead: bool = True
    """Inter-agent: also move an instance ahead of a stage, when the previous step's demand
    at the same phase says an agent is about to get busy while another stays idle (needs
    cost_aware: the same test of what it saves against what it costs)."""

    def __post_init__(self) -> None:
        def require(ok: bool, name: str, rule: str) -> None:
            if not ok:
                raise ValueError(f"balance.{name} {rule}, got {getattr(self, name)!r}")
        require(self.strategy in STRATEGIES, "strategy", f"must be one of {', '.join(STRATEGIES)}")
        require(self.sticky_slack_tokens >= 0, "sticky_slack_tokens", "must be >= 0")
        require(self.ratio > 1, "ratio", "must be > 1")
        require(self.min_load_tokens >= 0, "min_load_tokens", "must be >= 0")
        require(self.patience >= 1, "patience", "must be >= 1")
        require(self.cooldown_s >= 0, "cooldown_s", "must be >= 0")
        require(self.min_instances >= 1, "min_instances", "must be >= 1")
        require(0 < self.length_smoothing <= 1, "length_smoothing", "must be in (0, 1]")
        require(self.check_interval_s > 0, "check_interval_s", "must be > 0")
        require(self.demand_window_s > 0, "demand_window_s", "must be > 0")
        require(self.move_cost_s >= 0, "move_cost_s", "must be >= 0")


@dataclass(frozen=True)
class Move:
    """One instance changing hands, and why."""

    instance: str
    src: str
    dst: str
    src_load: float
    """Load per instance (estimated outstanding tokens) of the cold agent when planned."""
    dst_load: float
    """... and of the hot agent."""


@dataclass
class _Inflight:
    instance: str
    agent: str
    cost: float


@dataclass
class _Instance:
    agent: str
    own_requests: int = 0
    own_tokens: float = 0.0
    reported_requests: int = 0
    foreign_requests: int = 0
    """Requests of other clients at the last report: its count beyond ours then."""
    draining: bool = False


@dataclass
class BalancerStats:
    routed: dict[str, int] = field(default_factory=dict)
    """instance -> requests routed to it."""
    sticky_hits: int = 0
    sticky_breaks: int = 0
    """Episodes moved off their instance because it was too busy."""


class Balancer:
    """See the module docstring. Instance and agent names are plain strings."""

    def __init__(self, placement: dict[str, list[str]], config: BalancerConfig | None = None, *,
                 compatible: Callable[[str, str], bool] | None = None) -> None:
        self.config = config or BalancerConfig()
        self._instances: dict[str, _Instance] = {}
        self._agents: dict[str, list[str]] = {}
        for agent, names in placement.items():
            if not names:
                raise ValueError(f"agent {agent!r} has no rollout instance")
            self._agents[agent] = list(names)
            for name in names:
                if name in self._instances:
                    raise ValueError(f"instance {name!r} is placed twice")
                self._instances[name] = _Instance(agent)
        self._compatible = compatible or (lambda src, dst: True)
        self._inflight: dict[str, _Inflight] = {}
        self._episodes: dict[tuple[str, str], str] = {}
        self._expected_len: dict[str, float] = {}
        self._rr = {agent: itertools.count() for agent in self._agents}
        self._streak: tuple[str, str] | None = None
        self._streak_len = 0
        self._moving: Move | None = None
        self._cool_until = float("-inf")
        self._demand: dict[str, float] = {}
        self._last_check: float | None = None
        self._first_check = float("-inf")
        self.moves: list[Move] = []
        self.stats = BalancerStats()
        self._finished_tokens: dict[str, float] = {}
        """agent -> tokens its finished requests generated since the last check."""
        self._rate: dict[str, float] = {}
        """agent -> tokens/s per serving instance while it had work (EWMA over checks)."""
        self._move_s: float | None = None
        """Seconds a move took beyond draining (EWMA; None until one finished)."""
        self._step_start: float | None = None
        self._profile: dict[str, list[tuple[float, float]]] = {}
        """agent -> (seconds into the step, its outstanding tokens) at each check, this step."""
        self._previous: dict[str, list[tuple[float, float]]] = {}
        """The same for the previous step: the prediction of this one."""

    # ------------------------------------------------------------------ views

    @property
    def agents(self) -> list[str]:
        return list(self._agents)

    def instances(self, agent: str) -> list[str]:
        """The agent's instances, including one being drained away from it."""
        return list(self._agents[agent])

    def agent_of(self, instance: str) -> str:
        return self._instances[instance].agent

    def remove(self, instance: str) -> None:
        """The instance is gone (its process died): never routed to or moved again. Requests
        still in flight there finish (fail) through finish() as usual."""
        inst = self._instances[instance]
        if instance in self._agents[inst.agent]:
            self._agents[inst.agent].remove(instance)
        inst.draining = True
        if self._moving is not None and self._moving.instance == instance:
            self._moving = None
        for key in [k for k, v in self._episodes.items() if v == instance]:
            del self._episodes[key]

    def add(self, agent: str, instance: str) -> None:
        """A new instance of `agent` (e.g. the replacement of a dead one), routed at once."""
        if instance in self._instances:
            raise ValueError(f"instance {instance!r} is already known; give a new one a new name")
        self._instances[instance] = _Instance(agent)
        self._agents[agent].append(instance)

    def is_draining(self, instance: str) -> bool:
        """Being moved to another agent: no new requests go to it."""
        return self._instances[instance].draining

    def inflight(self, instance: str) -> int:
        """Requests this balancer routed to `instance` that have not finished."""
        return self._instances[instance].own_requests

    def expected_len(self, agent: str, max_tokens: int) -> float:
        """Expected response tokens of one sample: learned, at most max_tokens; max_tokens
        until the agent has finished a request."""
        return min(float(max_tokens), self._expected_len.get(agent, float(max_tokens)))

    def estimate(self, agent: str, *, n: int, max_tokens: int) -> float:
        """Estimated tokens a request will generate (its cost for routing)."""
        return n * self.expected_len(agent, max_tokens)

    def load(self, instance: str) -> float:
        """Outstanding work: our in-flight estimate, plus the requests the last report showed
        beyond ours then (other clients', each at our mean cost). Ours are counted exactly:
        a report older than our latest dispatches adds nothing for them, and one older than
        our latest finishes does not turn them into other clients' requests."""
        inst = self._instances[instance]
        mean = inst.own_tokens / inst.own_requests if inst.own_requests else \
            self._expected_len.get(inst.agent, 1.0)
        return inst.own_tokens + inst.foreign_requests * mean

    def agent_load(self, agent: str) -> float:
        """Load per serving (non-draining) instance of the agent."""
        serving = [i for i in self._agents[agent] if not self._instances[i].draining]
        return sum(self.load(i) for i in self._agents[agent]) / max(len(serving), 1)

    # ------------------------------------------------------------------ intra-agent

    def route(self, agent: str, request_id: str, cost: float, *, episode: str | None = None
              ) -> str:
        """Pick the instance for a request and count it in flight until finish()."""
        if request_id in self._inflight:
            raise ValueError(f"request {request_id!r} is already in flight")
        candidates = [i for i in self._agents[agent] if not self._instances[i].draining]
        if not candidates:
            raise RuntimeError(f"agent {agent!r} has no serving instance (all draining)")
        if self.config.strategy == "round_robin":
            choice = candidates[next(self._rr[agent]) % len(candidates)]
        else:
            choice = min(candidates, key=lambda i: (self.load(i), self._instances[i].own_requests))
            sticky = self._episodes.get((agent, episode)) if episode is not None else None
            if sticky is not None and sticky in candidates and sticky != choice:
                if self.load(sticky) - self.load(choice) <= self.config.sticky_slack_tokens:
                    choice = sticky
                    self.stats.sticky_hits += 1
                else:
                    self.stats.sticky_breaks += 1
            elif sticky == choice:
                self.stats.sticky_hits += 1
        if episode is not None:
            self._episodes[(agent, episode)] = choice
        inst = self._instances[choice]
        inst.own_requests += 1
        inst.own_tokens += cost
        self._inflight[request_id] = _Inflight(choice, agent, cost)
        self.stats.routed[choice] = self.stats.routed.get(choice, 0) + 1
        return choice

    def finish(self, request_id: str, *, samples: int = 1, tokens: int | None = None) -> None:
        """A request ended (or failed: tokens None); `tokens` generated over `samples` samples
        teach the agent's expected length."""
        req = self._inflight.pop(request_id, None)
        if req is None:
            raise ValueError(f"request {request_id!r} is not in flight")
        inst = self._instances[req.instance]
        inst.own_requests -= 1
        inst.own_tokens = max(0.0, inst.own_tokens - req.cost) if inst.own_requests else 0.0
        if tokens is not None:
            self._finished_tokens[req.agent] = self._finished_tokens.get(req.agent, 0.0) + tokens
        if tokens is not None and samples > 0:
            mean = tokens / samples
            old = self._expected_len.get(req.agent)
            a = self.config.length_smoothing
            self._expected_len[req.agent] = mean if old is None else (1 - a) * old + a * mean

    def report(self, instance: str, requests: int) -> None:
        """An instance's pushed load: requests queued or running there (from all clients)."""
        inst = self._instances.get(instance)
        if inst is not None:
            inst.reported_requests = requests
            inst.foreign_requests = max(0, requests - inst.own_requests)

    def end_episode(self, agent: str, episode: str) -> None:
        """Forget an episode's instance (its trajectory is done)."""
        self._episodes.pop((agent, episode), None)

    # ------------------------------------------------------------------ inter-agent

    def plan_move(self, now: float) -> Move | None:
        """One check of the inter-agent level; a Move to carry out, or None."""
        c = self.config
        if c.strategy != "hierarchical":
            return None
        dt = None if self._last_check is None else now - self._last_check
        self._observe(now, dt)
        loads = self._smoothed_loads(now)
        # An average over less than one window is mostly the run's first phase (every episode
        # in its first agent's call, the others idle): no move on it.
        if self._moving is not None or now < self._cool_until \
                or now - self._first_check < c.demand_window_s:
            self._streak, self._streak_len = None, 0
            return None
        last = self.moves[-1] if self.moves else None
        pair = None
        for hot in sorted(loads, key=loads.get, reverse=True):
            if loads[hot] < c.min_load_tokens:
                break

            def needed(cold: str) -> float:  # undoing the last move takes a larger imbalance
                undo = last is not None and (last.src, last.dst) == (hot, cold)
                return c.ratio ** 2 if undo else c.ratio

            donors = [a for a in self._agents if a != hot and self._compatible(a, hot)
                      and len(self._serving(a)) > c.min_instances
                      and loads[hot] > needed(a) * max(loads[a], 1.0)]
            if donors:
                pair = (min(donors, key=loads.get), hot)
                break
        if pair is None or pair != self._streak:
            self._streak, self._streak_len = pair, (1 if pair else 0)
        else:
            self._streak_len += 1
        if pair is not None and self._streak_len >= c.patience:
            src, dst = pair
            # The donor's least busy instance drains fastest.
            instance = min(self._serving(src), key=self.load)
            if not c.cost_aware or self.move_pays(now, src, dst, instance):
                self._streak, self._streak_len = None, 0
                return Move(instance, src, dst, loads[src], loads[dst])
            # It does not pay: the streak stands, the next check weighs it again.
        if c.ahead and c.cost_aware:  # no move for now's demand: one for the next stage's?
            return self._ahead(now)
        return None

    # ------------------------------------------------------------------ costs and prediction

    def step_started(self, now: float) -> None:
        """A new step's rollout begins: this step's demand profile becomes the prediction."""
        if self._profile:
            self._previous = self._profile
        self._profile = {}
        self._step_start = now

    def _observe(self, now: float, dt: float | None) -> None:
        """Per check: each agent's rate while it had work, and its demand profile."""
        for agent in self._agents:
            done = self._finished_tokens.pop(agent, 0.0)
            serving = len(self._serving(agent))
            if dt and done > 0 and serving:
                rate = done / dt / serving
                old = self._rate.get(agent)
                self._rate[agent] = rate if old is None else old + 0.3 * (rate - old)
            # Loads are estimates (n x the expected length): not profiled before an agent's
            # length is learnt (until then each request counts max_tokens, far too much).
            if self._step_start is not None and agent in self._expected_len:
                self._profile.setdefault(agent, []).append(
                    (now - self._step_start, self._total(agent)))

    def _total(self, agent: str) -> float:
        return sum(self.load(i) for i in self._agents[agent])

    def predicted_tokens(self, agent: str, now: float, horizon_s: float) -> float:
        """The most outstanding tokens the agent had in the previous step over the same span
        of the step, [now, now + horizon_s], wrapping into the start of the next step past the
        previous step's length (0 without a previous step)."""
        if self._step_start is None:
            return 0.0
        t0 = now - self._step_start
        profile = self._previous.get(agent, [])
        length = max((t for t, _ in profile), default=0.0)
        wrap = t0 + horizon_s - length  # this much of the horizon falls in the next step
        return max((load for t, load in profile
                    if t0 <= t <= t0 + horizon_s or t <= wrap), default=0.0)

    def predicted_busy_s(self, agent: str, now: float, level: float) -> float:
        """How long, from this phase of the step on, the agent had at least `level`
        outstanding tokens in the previous step (its last such check; 0 without one)."""
        if self._step_start is None:
            return 0.0
        t0 = now - self._step_start
        return max((t - t0 for t, load in self._previous.get(agent, [])
                    if t >= t0 and load >= level), default=0.0)

    def move_pays(self, now: float, src: str, dst: str, instance: str) -> bool:
        """Does moving `instance` from `src` to `dst` save more seconds than it costs?

        The hot agent's demand is expected to last the longer of: its backlog at its
        instances' rate, and how long it stayed busy from the same phase of the previous step
        on. One more instance takes 1/(n+1) of what
        remains after the move's own time (drain + weight load); the donor loses as much of
        its own backlog (or predicted demand) over that horizon, and the instance will likely
        move again as demand moves on, so the saving must pay for that trip too."""
        r_src, r_dst = self._rate.get(src), self._rate.get(dst)
        if not r_src or not r_dst:
            return False  # no rate learnt yet: a move cannot be priced
        serving = self._serving(dst)
        if sum(self._instances[i].own_requests for i in serving) < 2 * len(serving):
            return False  # about one sequence per instance: more instances decode no faster
        n_dst = len(self._serving(dst))
        move_s = self.load(instance) / r_src + self._move_cost()
        busy = self.config.min_load_tokens * n_dst  # "has work": as for the ratio test
        hot_s = max(self._total(dst) / (n_dst * r_dst), self.predicted_busy_s(dst, now, busy))
        gain_s = max(0.0, hot_s - move_s) / (n_dst + 1)
        loss_s = self._donor_loss_s(now, src, hot_s + move_s)
        return gain_s > loss_s + move_s / (n_dst + 1)

    def _ahead(self, now: float) -> Move | None:
        """A move ahead of the next stage: the agent whose demand, one move's time from now,
        was highest at that phase of the previous step, from the agent that had the least
        then (and has the least now), if the move pays (ahead_pays). No patience: the
        prediction is a whole step's observation, not one noisy check."""
        if self._step_start is None or not self._previous:
            return None
        lead = self._move_cost() + self.config.check_interval_s
        window = self.config.demand_window_s
        n = {a: max(len(self._serving(a)), 1) for a in self._agents}
        future = {a: self.predicted_tokens(a, now + lead, window) / n[a] for a in self._agents}
        dst = max(future, key=lambda a: (future[a], a))
        if future[dst] < self.config.min_load_tokens or self.agent_load(dst) >= future[dst]:
            return None  # nobody about to get busy, or it already is (the ratio test's case)
        # No ratio squared for undoing the last move: stages come back every step, and the
        # cost test already charges the trip back.
        ratio = self.config.ratio

        def idle(a: str) -> float:  # its load now and what it had from now to past the lead
            return max(self.agent_load(a), self.predicted_tokens(a, now, lead + window) / n[a])
        donors = [a for a in self._agents if a != dst and self._compatible(a, dst)
                  and len(self._serving(a)) > self.config.min_instances
                  and future[dst] > ratio * max(idle(a), 1.0)]
        if not donors:
            return None
        src = min(donors, key=lambda a: (idle(a), a))
        instance = min(self._serving(src), key=self.load)
        if not self.ahead_pays(now, src, dst, instance, lead):
            return None
        return Move(instance, src, dst, self.agent_load(src), future[dst])

    def ahead_pays(self, now: float, src: str, dst: str, instance: str, lead: float) -> bool:
        """move_pays for a stage that has not begun: the hot agent's demand is the previous
        step's from `lead` seconds on (how long it stayed busy then), and there must be at
        least two expected answers per instance to share (with one each, another instance
        decodes nothing faster)."""
        r_src, r_dst = self._rate.get(src), self._rate.get(dst)
        length = self._expected_len.get(dst)
        if not r_src or not r_dst or not length:
            return False
        n_dst = len(self._serving(dst))
        window = self.config.demand_window_s
        if self.predicted_tokens(dst, now + lead, window) < 2 * n_dst * length:
            return False
        move_s = self.load(instance) / r_src + self._move_cost()
        busy = self.config.min_load_tokens * n_dst
        hot_s = self.predicted_busy_s(dst, now + lead, busy)
        gain_s = hot_s / (n_dst + 1)
        loss_s = self._donor_loss_s(now, src, lead + hot_s)
        return gain_s > loss_s + move_s  # a prediction can be wrong: it must pay its whole trip

    def _donor_loss_s(self, now: float, src: str, horizon: float) -> float:
        """Seconds the donor loses over `horizon` with one instance fewer: its backlog (or the
        demand it had over that span of the previous step) spread over the instances left."""
        n_src = len(self._serving(src))
        cold = max(self._total(src), self.predicted_tokens(src, now, horizon))
        return min(cold / (n_src * self._rate[src]), horizon) / max(n_src - 1, 1)

    def _move_cost(self) -> float:
        return self._move_s if self._move_s is not None else self.config.move_cost_s

    def _smoothed_loads(self, now: float) -> dict[str, float]:
        """Each agent's load per instance, averaged exponentially over demand_window_s."""
        if self._last_check is None:
            self._first_check = now
        dt = None if self._last_check is None else max(0.0, now - self._last_check)
        self._last_check = now
        w = 1.0 if dt is None else 1.0 - math.exp(-dt / self.config.demand_window_s)
        for agent in self._agents:
            load = self.agent_load(agent)
            old = self._demand.get(agent)
            self._demand[agent] = load if old is None else old + w * (load - old)
        return dict(self._demand)

    def _serving(self, agent: str) -> list[str]:
        return [i for i in self._agents[agent] if not self._instances[i].draining]

    def begin_move(self, move: Move) -> None:
        """Stop routing to the instance; the caller waits for inflight() == 0, then reloads it."""
        if self._moving is not None:
            raise RuntimeError(f"a move is already in progress: {self._moving}")
        inst = self._instances[move.instance]
        if inst.agent != move.src:
            raise ValueError(f"instance {move.instance} serves {inst.agent}, not {move.src}")
        inst.draining = True
        self._moving = move

    def drained(self, move: Move, now: float, loaded: float) -> None:
        """The move's instance drained at `now` and its new weights loaded by `loaded`: the
        move's own cost, learnt for pricing the next (cost_aware)."""
        seconds = max(0.0, loaded - now)
        self._move_s = seconds if self._move_s is None else \
            self._move_s + 0.3 * (seconds - self._move_s)

    def finish_move(self, move: Move, now: float) -> None:
        """The instance now serves move.dst (its weights are loaded): route to it again."""
        self._end_move(move, now, done=True)

    def abort_move(self, move: Move, now: float) -> None:
        """The move failed: the instance keeps serving move.src."""
        self._end_move(move, now, done=False)

    def _end_move(self, move: Move, now: float, *, done: bool) -> None:
        if self._moving != move:
            raise RuntimeError(f"{move} is not the move in progress")
        inst = self._instances[move.instance]
        if done:
            if inst.own_requests:
                raise RuntimeError(f"instance {move.instance} still has {inst.own_requests} "
                                   "requests in flight; wait for them before finishing the move")
            self._agents[move.src].remove(move.instance)
            self._agents[move.dst].append(move.instance)
            inst.agent = move.dst
            inst.reported_requests = inst.foreign_requests = 0
            self._episodes = {k: v for k, v in self._episodes.items() if v != move.instance}
            self.moves.append(move)
        inst.draining = False
        self._moving = None
        self._cool_until = now + self.config.cooldown_s


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in [0, 1]) of request waits or latencies; nan for none."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]
