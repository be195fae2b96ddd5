"""Deterministic discrete-event simulator of rollout instances driven by a `Balancer`.

It drives the same `flexmarl.rollout.balancer.Balancer` the rollout pool uses, unchanged, with a model
of instances instead of engines, so routing and rebalancing policies can be compared in
seconds, on one seeded workload (`flexmarl.sim.workload`), without sockets, clocks or randomness
of its own (a heap of events; ties broken by insertion order):

    step s: episodes ─► at most max_concurrent_episodes at once, each a causal chain of calls
    call ─► cost = estimate(agent, n, max_tokens) ─► route(agent, id, cost, episode) ─► instance
    instance: FIFO queue of sequences ─► up to `slots` decoding together (continuous batching);
              a decode step takes step_base_s + step_per_seq_s x active sequences and gives each
              active sequence one token; a sequence of length L leaves after L steps; a request
              (its n sequences) is done when all have left ─► finish(id, samples=n, tokens=sum)
    every report_interval_s: report(instance, queued + running requests)   (stale in between)
    every check_interval_s:  plan_move(now) ─► begin_move ─► its requests finish normally
    (the balancer's config)  (inflight == 0) ─► move_cost_s reload ─► finish_move

Steps run back to back (no training phase between them): a step ends when its last episode has.
SimResult reports step times, each request's queue wait (dispatch to its first sequence's first
decode step), per-agent wait percentiles, per-instance busy time and tokens served, the moves
(cause and cost) and whether every dispatched request finished. Its `load_ratio` is max / min
over instances of tokens served over the whole run (`busy_ratio`: the same for busy time).

Engine model (SimConfig defaults), rough assumptions from this project's vLLM-on-CPU runs:
- slots = 64: the engine's `rollout.max_num_seqs` default (flexmarl.rollout.engine).
- step_base_s = 12 ms, step_per_seq_s = 0.3 ms (64 sequences: 31 ms a step, ~2,000 tokens/s):
  bench/pipeline.py's sync rollout took 2.37 s for ~100 dependent decode steps of ~32
  sequences with two instances sharing one core, i.e. ~12 ms per step per instance alone;
  the per-sequence slope is a guess at how batching amortises it for these small models.
- move_cost_s = 0.2 s: bench/weight_sync.py measured 0.02-0.06 s per in-place weight push of
  0.6-16 MB models; a move loads another agent's full weights and drops the prefix cache, so a
  few times that. Prefill and network time are not modelled (max_tokens-sized decode dominates).
- report_interval_s = 0.1 s: workers push on change, so a report is at most a burst old.
- max_concurrent_episodes = 32: the default pipeline runs 4 tasks x 8 trajectories at once.
  At that load 4 instances per agent are far from full (the policies differ by a few percent);
  bench/balance.py runs enough episodes at once to fill them, where routing matters.
"""
from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass

from flexmarl.rollout.balancer import Balancer, Move, percentile  # noqa: F401  (re-exported)
from flexmarl.sim.workload import Episode, SkewedWorkload


@dataclass(frozen=True, kw_only=True)
class SimConfig:
    """Instances and driver; see the module docstring for why these defaults."""

    slots: int = 64
    """Sequences one instance decodes together; more wait in its FIFO queue."""
    step_base_s: float = 0.012
    step_per_seq_s: float = 0.0003
    """A decode step takes step_base_s + step_per_seq_s x active sequences."""
    max_concurrent_episodes: int = 32
    report_interval_s: float = 0.1
    move_cost_s: float = 0.2
    """Reload time of a moved instance, after it has drained."""
    steps: int = 4

    def __post_init__(self) -> None:
        for name in ("slots", "max_concurrent_episodes", "steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"sim.{name} must be >= 1, got {getattr(self, name)!r}")
        for name in ("step_base_s", "report_interval_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"sim.{name} must be > 0, got {getattr(self, name)!r}")
        for name in ("step_per_seq_s", "move_cost_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"sim.{name} must be >= 0, got {getattr(self, name)!r}")


@dataclass
class RequestRecord:
    id: str
    agent: str
    instance: str
    episode: str
    step: int
    n: int
    tokens: int
    dispatched: float
    started: float | None = None
    """When its first sequence began decoding."""
    finished: float | None = None

    @property
    def queue_wait(self) -> float:
        return self.started - self.dispatched


@dataclass
class MoveRecord:
    move: Move
    """The balancer's Move: instance, src, dst and the loads that caused it."""
    planned_at: float
    drained_at: float | None = None
    done_at: float | None = None

    @property
    def drain_s(self) -> float:
        return self.drained_at - self.planned_at

    @property
    def reload_s(self) -> float:
        return self.done_at - self.drained_at

    @property
    def cost_s(self) -> float:
        """Time the instance served nobody: drain + reload."""
        return self.done_at - self.planned_at


@dataclass
class CheckRecord:
    t: float
    loads: dict[str, float]
    """balancer.agent_load per agent at the check (estimated outstanding tokens per instance)."""
    instances: dict[str, int]


@dataclass
class SimResult:
    step_s: list[float]
    """Duration of each step: its start to its last episode's end."""
    requests: list[RequestRecord]
    moves: list[MoveRecord]
    checks: list[CheckRecord]
    busy_s: dict[str, float]
    """Per instance: time with at least one sequence decoding."""
    tokens_served: dict[str, int]
    placement: dict[str, list[str]]
    """Agent -> instances at the end."""
    inflight_at_end: dict[str, int]
    """balancer.inflight(instance) after the last event: all 0 when nothing was lost."""
    makespan_s: float

    @property
    def all_finished(self) -> bool:
        """Every dispatched request finished, and the balancer holds none in flight."""
        return all(r.finished is not None for r in self.requests) and \
            not any(self.inflight_at_end.values())

    def waits(self, agent: str | None = None) -> list[float]:
        return [r.queue_wait for r in self.requests if agent is None or r.agent == agent]

    def wait_stats(self) -> dict[str, dict[str, float]]:
        """Per agent (and "all"): p50, p99 and mean queue wait in seconds."""
        agents = sorted({r.agent for r in self.requests})
        out = {}
        for a in agents + ["all"]:
            w = self.waits(None if a == "all" else a)
            out[a] = {"p50": percentile(w, 0.5), "p99": percentile(w, 0.99),
                      "mean": sum(w) / len(w) if w else float("nan"), "requests": len(w)}
        return out

    @staticmethod
    def _ratio(values: dict[str, float]) -> float:
        lo, hi = min(values.values()), max(values.values())
        return hi / lo if lo > 0 else float("inf")

    @property
    def load_ratio(self) -> float:
        """Max / min over instances of tokens served in the whole run (1: perfectly even)."""
        return self._ratio(self.tokens_served)

    @property
    def busy_ratio(self) -> float:
        """Max / min over instances of busy time in the whole run."""
        return self._ratio(self.busy_s)

    @property
    def mean_step_s(self) -> float:
        return sum(self.step_s) / len(self.step_s)


class _Instance:
    """One engine: a FIFO queue of sequences and a decoding batch, advanced in whole steps.

    Steps are not simulated one by one: while the batch does not change, every step takes the
    same time, so the next event is the next step boundary where something happens (a sequence
    finishes, or a waiting one can be admitted)."""

    def __init__(self, name: str, agent: str, config: SimConfig) -> None:
        self.name, self.agent, self.c = name, agent, config
        self.queue: deque[tuple[str, int]] = deque()   # (request id, length) per sequence
        self.batch: list[tuple[int, int, str, int]] = []  # heap of (finish step, order, id, len)
        self.live: dict[str, int] = {}                 # request id -> sequences not finished
        self.k = 0                 # step counter at the anchor
        self.t = 0.0               # anchor: time of the last boundary (or of waking up)
        self.next_k: int | None = None
        self.epoch = 0             # invalidates boundary events scheduled before a reschedule
        self.busy_s = 0.0
        self.tokens = 0
        self._order = 0

    @property
    def step_s(self) -> float:
        return self.c.step_base_s + self.c.step_per_seq_s * len(self.batch)

    def admit(self, started: dict[str, float], now: float) -> None:
        while self.queue and len(self.batch) < self.c.slots:
            rid, length = self.queue.popleft()
            started.setdefault(rid, now)
            self._order += 1
            heapq.heappush(self.batch, (self.k + length, self._order, rid, length))


class Simulator:
    """One run: `Simulator(workload, balancer, config).run() -> SimResult`; the balancer's
    placement is the instances' at the start."""

    def __init__(self, workload: SkewedWorkload, balancer: Balancer,
                 config: SimConfig = SimConfig()) -> None:
        self.w, self.bal, self.c = workload, balancer, config
        self.instances = {name: _Instance(name, agent, config)
                          for agent in balancer.agents for name in balancer.instances(agent)}
        self._events: list[tuple] = []
        self._seq = 0
        self.now = 0.0
        self.records: dict[str, RequestRecord] = {}
        self._started: dict[str, float] = {}
        self._episode_of: dict[str, tuple[Episode, int]] = {}
        self.moves: list[MoveRecord] = []
        self.checks: list[CheckRecord] = []
        self.step_s: list[float] = []
        self._moving: MoveRecord | None = None
        self._done = False

    # ------------------------------------------------------------------ event loop

    def _push(self, t: float, kind: str, *args) -> None:
        self._seq += 1
        heapq.heappush(self._events, (t, self._seq, kind, args))

    def run(self) -> SimResult:
        self._start_step(0)
        self._push(self.c.report_interval_s, "report", 1)
        self._push(self.bal.config.check_interval_s, "check", 1)
        while self._events:
            self.now, _, kind, args = heapq.heappop(self._events)
            getattr(self, "_on_" + kind)(*args)
        return SimResult(
            step_s=self.step_s, requests=list(self.records.values()), moves=self.moves,
            checks=self.checks,
            busy_s={n: i.busy_s for n, i in self.instances.items()},
            tokens_served={n: i.tokens for n, i in self.instances.items()},
            placement={a: self.bal.instances(a) for a in self.bal.agents},
            inflight_at_end={n: self.bal.inflight(n) for n in self.instances},
            makespan_s=self.now)

    # ------------------------------------------------------------------ episodes

    def _start_step(self, step: int) -> None:
        self._step, self._step_start = step, self.now
        self._pending = deque(self.w.episodes(step))
        self._running = 0
        while self._pending and self._running < self.c.max_concurrent_episodes:
            self._launch(self._pending.popleft())

    def _launch(self, ep: Episode) -> None:
        self._running += 1
        self._next_call(ep, 0)

    def _next_call(self, ep: Episode, i: int) -> None:
        if i == len(ep.calls):
            self._end_episode(ep)
            return
        call = ep.calls[i]
        rid = f"{ep.id}c{i}"
        cost = self.bal.estimate(call.agent, n=call.n, max_tokens=call.max_tokens)
        name = self.bal.route(call.agent, rid, cost, episode=ep.id)
        inst = self.instances[name]
        assert inst.agent == call.agent, f"routed {call.agent} to {name} serving {inst.agent}"
        self.records[rid] = RequestRecord(rid, call.agent, name, ep.id, self._step, call.n,
                                          call.tokens, self.now)
        self._episode_of[rid] = (ep, i)
        inst.queue.extend((rid, length) for length in call.lengths)
        inst.live[rid] = call.n
        self._wake(inst)

    def _end_episode(self, ep: Episode) -> None:
        for agent in {c.agent for c in ep.calls}:
            self.bal.end_episode(agent, ep.id)
        self._running -= 1
        if self._pending:
            self._launch(self._pending.popleft())
        elif self._running == 0:
            self.step_s.append(self.now - self._step_start)
            if self._step + 1 < self.c.steps:
                self._start_step(self._step + 1)
            else:
                self._done = True   # periodic events stop; the heap drains

    def _request_done(self, rid: str) -> None:
        rec = self.records[rid]
        rec.started, rec.finished = self._started.pop(rid), self.now
        self.bal.finish(rid, samples=rec.n, tokens=rec.tokens)
        m = self._moving
        if m and m.drained_at is None and rec.instance == m.move.instance \
                and self.bal.inflight(rec.instance) == 0:
            self._drained(m)
        ep, i = self._episode_of.pop(rid)
        self._next_call(ep, i + 1)

    # ------------------------------------------------------------------ instances

    def _wake(self, inst: _Instance) -> None:
        """Sequences were queued: start decoding if idle, else admit at the next boundary if
        there is room (a running engine takes new requests between steps). A request arriving
        in the same instant as the step that woke the engine, or as a boundary (a follow-up of
        a call that just finished there), also waits for the next one: the engine has begun
        that step before the request reaches it."""
        if not inst.batch:
            inst.t = self.now
            inst.admit(self._started, self.now)
            self._schedule(inst)
        elif len(inst.batch) < self.c.slots:
            d = inst.step_s
            j = math.floor((self.now - inst.t) / d) + 1
            if inst.k + j < inst.next_k:
                self._schedule(inst, inst.k + j)

    def _schedule(self, inst: _Instance, k: int | None = None) -> None:
        inst.epoch += 1
        if not inst.batch:
            inst.next_k = None
            return
        inst.next_k = inst.batch[0][0] if k is None else k
        self._push(inst.t + (inst.next_k - inst.k) * inst.step_s, "boundary", inst.name,
                   inst.epoch, inst.next_k)

    def _on_boundary(self, name: str, epoch: int, k: int) -> None:
        inst = self.instances[name]
        if epoch != inst.epoch:
            return   # superseded by an earlier boundary (a wake-up)
        inst.busy_s += self.now - inst.t
        done = []
        while inst.batch and inst.batch[0][0] <= k:
            _, _, rid, length = heapq.heappop(inst.batch)
            inst.tokens += length
            inst.live[rid] -= 1
            if not inst.live[rid]:
                del inst.live[rid]
                done.append(rid)
        inst.k, inst.t = k, self.now
        inst.admit(self._started, self.now)
        self._schedule(inst)
        # Callers learn of finished requests after the engine has moved on: a follow-up call
        # to this instance waits for the next boundary, as with a real engine loop.
        for rid in done:
            self._request_done(rid)

    # ------------------------------------------------------------------ balancer upkeep

    def _on_report(self, i: int) -> None:
        for name, inst in self.instances.items():
            self.bal.report(name, len(inst.live))
        if not self._done:
            self._push((i + 1) * self.c.report_interval_s, "report", i + 1)

    def _on_check(self, i: int) -> None:
        if self._done:
            return
        self._push((i + 1) * self.bal.config.check_interval_s, "check", i + 1)
        self.checks.append(CheckRecord(self.now, {a: self.bal.agent_load(a)
                                                  for a in self.bal.agents},
                                       {a: len(self.bal.instances(a)) for a in self.bal.agents}))
        move = self.bal.plan_move(self.now)
        if move is None:
            return
        self.bal.begin_move(move)
        self._moving = MoveRecord(move, self.now)
        self.moves.append(self._moving)
        if self.bal.inflight(move.instance) == 0:
            self._drained(self._moving)

    def _drained(self, m: MoveRecord) -> None:
        assert not self.instances[m.move.instance].live, "drained instance still has requests"
        m.drained_at = self.now
        self._push(self.now + self.c.move_cost_s, "reload_done", m)

    def _on_reload_done(self, m: MoveRecord) -> None:
        self.bal.finish_move(m.move, self.now)
        self.instances[m.move.instance].agent = m.move.dst
        m.done_at = self.now
        self._moving = None


def placement(agents: list[str], per_agent: int) -> dict[str, list[str]]:
    """`per_agent` instances per agent, named r0, r1, ... (names outlive agents: moves)."""
    names = iter(f"r{j}" for j in range(len(agents) * per_agent))
    return {a: [next(names) for _ in range(per_agent)] for a in agents}


def simulate(workload: SkewedWorkload, balancer: Balancer,
             config: SimConfig = SimConfig()) -> SimResult:
    """Run `config.steps` steps of `workload` through `balancer` (mutated: it ends in the
    final placement, with its moves and stats)."""
    return Simulator(workload, balancer, config).run()
