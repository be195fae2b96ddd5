"""Routing comparison on the cluster simulator: a skewed workload through the real rollout pool.

    SkewedWorkload (flexmarl.sim.workload): steps of episodes, each a causal chain of calls
      ─► a fresh VirtualEventLoop (flexmarl.sim.clock)
      ─► real RolloutWorker actors on SimRolloutEngines (flexmarl.sim.engines: continuous
         batching, decode steps and prefill from the cost model flexmarl/sim/costs.toml),
         one per instance, all over local://
      ─► the real InstancePool + Balancer(strategy), built as flexmarl.sim.cluster builds them:
         its own in-flight accounting, the workers' pushed load reports, its rebalance loop
         and its moves (drain, then the hot agent's weights loaded: never synced, its model
         directory's, host -> device, Costs.host_load_s; pricing "old": weight_load_s)
      ─► per call: dispatch, its first sequence admitted to a batch, finish, instance
         ─► RoutingResult

It exercises routing alone: no orchestrator, trainer or weight sync (cluster.py runs those);
steps run back to back, a step ending when its last episode has, at most
`max_concurrent_episodes` episodes at once. One engine model serves both: only who decides a
sample's length differs. Here the workload does (it drew every length, so every strategy sees
identical work): a call's prompt carries its samples' exact lengths in its first n tokens,
where the cluster simulator's prompts carry a median the engine draws around. The cost model
decides how long the work takes.

Engine model (RoutingConfig defaults): every agent runs the cost model's `model` (14b: one
instance on 2 devices, tensor parallel 2), so instances can move between agents; an instance
decodes at most `max_num_seqs` sequences together (None: the cost model's), further ones wait
in its queue; a call's prompt is `prompt_tokens` long (its prefill stalls the batch); workers
push load reports on change, at most every `report_interval_s`.
"""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from dataclasses import dataclass

from flexmarl.clock import now
from flexmarl.config.balance import BalancerConfig
from flexmarl.config.rollout import RolloutConfig
from flexmarl.protocol import Generate, SamplingParams
from flexmarl.rollout.balancer import percentile
from flexmarl.rollout.moving import MoveRecord
from flexmarl.rollout.pool import InstancePool
from flexmarl.weights.sync import WeightSync
from flexmarl.rollout.worker import RolloutWorker
from flexmarl.sim import clock
from flexmarl.sim.cluster import FOREVER_S
from flexmarl.sim.costs import Costs, load_costs
from flexmarl.sim.devices import DeviceGroup
from flexmarl.sim.engines import TOKEN, SimRolloutEngine
from flexmarl.sim.workload import CallChain, SkewedWorkload
from runtime.transport import connect

@dataclass(frozen=True, kw_only=True)
class RoutingConfig:
    """Instances and driver; see the module docstring."""

    model: str = "14b"
    """The cost model's model that every agent's instances serve."""
    max_num_seqs: int | None = 64
    """Sequences one instance decodes together (the cost model's rollout.max_num_seqs
    replaced; None keeps it): beyond it, sequences wait in the instance's queue."""
    prompt_tokens: int = 256
    """Prompt length of every call (at least its n: the prompt carries the n lengths)."""
    max_concurrent_episodes: int = 32
    report_interval_s: float = 0.1
    steps: int = 4

    def __post_init__(self) -> None:
        for name in ("prompt_tokens", "max_concurrent_episodes", "steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"routing.{name} must be >= 1, got {getattr(self, name)!r}")
        if self.max_num_seqs is not None and self.max_num_seqs < 1:
            raise ValueError(f"routing.max_num_seqs must be >= 1 or None, got "
                             f"{self.max_num_seqs!r}")
        if self.report_interval_s <= 0:
            raise ValueError(f"routing.report_interval_s must be > 0, got "
                             f"{self.report_interval_s!r}")

    def costs(self, costs: Costs | None = None) -> Costs:
        """`costs` (default: costs.toml) with this config's max_num_seqs."""
        costs = costs or load_costs()
        if self.model not in costs.models:
            raise ValueError(f"routing.model {self.model!r} is not in the cost model "
                             f"(models: {', '.join(costs.models)})")
        if self.max_num_seqs is None:
            return costs
        return dataclasses.replace(costs, rollout=dataclasses.replace(
            costs.rollout, max_num_seqs=self.max_num_seqs))


@dataclass
class CallRecord:
    """One call of one episode, as the driver saw it."""

    id: str
    agent: str
    episode: str
    step: int
    n: int
    tokens: int
    dispatched: float
    instance: str = ""
    """Where the balancer sent it (the reply names the instance that served it)."""
    started: float | None = None
    """When its first sequence joined an instance's batch (its prefill began)."""
    finished: float | None = None

    @property
    def queue_wait(self) -> float:
        return self.started - self.dispatched


@dataclass
class LoadSample:
    """The balancer's view, sampled at its own check interval (the pool's loop decides)."""

    t: float
    loads: dict[str, float]
    """balancer.loads.agent_load per agent (estimated outstanding tokens per instance)."""
    instances: dict[str, int]


def move_times(m: MoveRecord) -> tuple[float, float, float]:
    """(planned, drained, done) of one of the pool's moves: it is begun when planned, its
    instance drained after drain_s, the hot agent's weights loaded after load_s more."""
    drained = m.at - m.load_s
    return drained - m.drain_s, drained, m.at


@dataclass
class RoutingResult:
    step_s: list[float]
    """Duration of each step: its start to its last episode's end."""
    requests: list[CallRecord]
    moves: list[MoveRecord]
    """The pool's own records of the moves it made (cause, drain and load time)."""
    samples: list[LoadSample]
    busy_s: dict[str, float]
    """Per instance: time decoding or prefilling (its engine's device time / its devices)."""
    tokens_served: dict[str, int]
    placement: dict[str, list[str]]
    """Agent -> instances at the end."""
    inflight_at_end: dict[str, int]
    """balancer.loads.inflight(instance) after the run: all 0 when nothing was lost."""
    makespan_s: float

    @property
    def all_finished(self) -> bool:
        """Every dispatched call finished, and the balancer holds none in flight."""
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


class _ScriptedEngine(SimRolloutEngine):
    """The cluster simulator's engine, with each sample's length read from its prompt: token i
    (i < n) is sample i's exact length, as the workload drew it."""

    def lengths(self, prompt_ids: list[int], params: SamplingParams,
                adapter: str | None = None) -> list[int]:
        lengths = list(prompt_ids[:params.n])
        if len(lengths) < params.n or not all(1 <= x <= params.max_tokens for x in lengths):
            raise ValueError(f"a scripted prompt must start with its {params.n} sample "
                             f"lengths, each 1..{params.max_tokens}; got {lengths}")
        return lengths


def initial_placement(agents: list[str], per_agent: int) -> dict[str, list[str]]:
    """`per_agent` instances per agent, named r0, r1, ... (names outlive agents: moves)."""
    names = iter(f"r{j}" for j in range(len(agents) * per_agent))
    return {a: [next(names) for _ in range(per_agent)] for a in agents}


async def _run(workload: SkewedWorkload, placement: dict[str, list[str]],
               balance: BalancerConfig, config: RoutingConfig, costs: Costs) -> RoutingResult:
    model = costs.models[config.model]
    records: dict[str, CallRecord] = {}
    by_seed: dict[int, CallRecord] = {}

    def admitted(seed: int | None) -> None:
        rec = by_seed[seed]
        if rec.started is None:   # its first sequence: the queue wait ends
            rec.started = now()

    engines = {name: _ScriptedEngine(costs, model,
                                     DeviceGroup(name, model.rollout_devices, costs),
                                     on_admit=admitted)
               for names in placement.values() for name in names}
    workers = [RolloutWorker(name, f"local://{name}", engine, max_concurrent=1 << 20,
                             report_interval_s=config.report_interval_s)
               for name, engine in engines.items()]

    async with contextlib.AsyncExitStack() as stack:
        for worker in workers:
            await stack.enter_async_context(worker.serving())
        conns = {w.name: connect(w.address) for w in workers}
        # One model for every agent: equal signatures, so any instance may change hands; no
        # weights to hold (a move's load time is the cost model's).
        model_dirs = {a: f"sim:{config.model}" for a in placement}
        weights = WeightSync(placement, None, model_dirs, timeout_s=FOREVER_S)
        pool = InstancePool(conns, placement, model_dirs,
                            RolloutConfig(request_timeout_s=FOREVER_S), balance, weights=weights,
                            signatures={a: config.model for a in placement})
        bal = pool.balancer
        samples: list[LoadSample] = []
        step_s: list[float] = []

        async def sample_loads() -> None:
            while True:
                await asyncio.sleep(balance.check_interval_s)
                loads = bal.loads
                samples.append(LoadSample(now(), {a: loads.agent_load(a) for a in loads.agents},
                                          {a: len(loads.instances(a)) for a in loads.agents}))

        async def episode(step: int, ep: CallChain, slots: asyncio.Semaphore) -> None:
            async with slots:
                for i, call in enumerate(ep.calls):
                    if call.agent not in placement:
                        raise ValueError(f"episode {ep.id} calls agent {call.agent!r}, which "
                                         f"the placement gives no instance")
                    if call.n > config.prompt_tokens:
                        raise ValueError(f"routing.prompt_tokens {config.prompt_tokens} is "
                                         f"shorter than a call's {call.n} samples (the "
                                         f"prompt carries their lengths)")
                    rec = CallRecord(f"{ep.id}c{i}", call.agent, ep.id, step, call.n,
                                     call.tokens, now())
                    seed = len(records)   # unique per call: the engine's handle on it
                    records[rec.id] = by_seed[seed] = rec
                    prompt = list(call.lengths) + [TOKEN] * (config.prompt_tokens - call.n)
                    params = SamplingParams(n=call.n, max_tokens=call.max_tokens, seed=seed)
                    msg = Generate(rec.id, prompt_ids=prompt, params=params)
                    reply = await pool.generate(call.agent, msg, episode=ep.id)
                    rec.instance, rec.finished = reply.instance, now()
                for agent in {c.agent for c in ep.calls}:
                    bal.end_episode(agent, ep.id)

        await pool.start()
        sampler = asyncio.create_task(sample_loads(), name="routing.samples")
        try:
            for step in range(config.steps):
                started = now()
                pool.step_started()  # as the orchestrator does: the balancer's phase clock
                # FIFO semaphore: episodes start in issue order as earlier ones end.
                slots = asyncio.Semaphore(config.max_concurrent_episodes)
                await asyncio.gather(*(episode(step, ep, slots)
                                       for ep in workload.episodes(step)))
                step_s.append(now() - started)
        finally:
            sampler.cancel()
            await asyncio.gather(sampler, return_exceptions=True)
            await pool.close()
            for conn in conns.values():
                await conn.aclose()
        tokens = dict.fromkeys(engines, 0)
        for rec in records.values():
            tokens[rec.instance] += rec.tokens
        return RoutingResult(
            step_s=step_s, requests=list(records.values()), moves=list(pool.mover.moves),
            samples=samples,
            busy_s={n: e.group.active_device_s / e.devices for n, e in engines.items()},
            tokens_served=tokens, placement={a: bal.loads.instances(a) for a in bal.loads.agents},
            inflight_at_end={n: bal.loads.inflight(n) for n in engines}, makespan_s=now())


def run_routing(workload: SkewedWorkload, placement: dict[str, list[str]],
                balance: BalancerConfig = BalancerConfig(), config: RoutingConfig = RoutingConfig(),
                costs: Costs | None = None) -> RoutingResult:
    """Run `config.steps` steps of `workload` (a SkewedWorkload, or anything whose
    `episodes(step)` gives CallChains) on instances placed as `placement` (agent -> instance
    names), routed and moved by the real pool with `balance`, on a fresh virtual clock;
    `costs` defaults to flexmarl/sim/costs.toml (its max_num_seqs replaced by the config's)."""
    return clock.run(_run(workload, placement, balance, config, config.costs(costs)))
