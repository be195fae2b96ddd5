"""The cluster simulator: the product's own scheduling code on simulated hardware.

    preset (team, workflow, nodes) + system (pipeline mode, balancing, trainer placement)
      ─► a fresh VirtualEventLoop (flexmarl.sim.clock)
      ─► real RolloutWorker actors on SimRolloutEngines, SimTrainer slots, all over local://
      ─► the real InstancePool + Balancer, TrainerPool + SlotAllocator, ExperienceStore,
         Orchestrator and PipelineRun, unchanged (the same classes `flexmarl run` uses)
      ─► per-step records (the run's metrics.jsonl records) + device accounting ─► SystemResult

Systems differ only in policy objects and placement, so every comparison is one workload, one
seed, one cost model:

    system                pipeline      balancing      trainers
    mas_rl                sync          round_robin    colocated: every device hosts every
                                                       agent's instances and one trainer slot;
                                                       one mode resident at a time (agents
                                                       generate and train in turn)
    marti                 sync          round_robin    one dedicated slot per agent
    one_step_off          one_step_off  round_robin    one dedicated slot per agent
    flexmarl              micro_batch   hierarchical   shared pool (preset.shared_slots)
    flexmarl-no_pipeline  sync          hierarchical   shared pool
    flexmarl-no_balance   micro_batch   round_robin    shared pool
    flexmarl-no_pool      micro_batch   hierarchical   one dedicated slot per agent

Devices not in trainer slots serve rollout, split equally between agents at the start.
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Callable

from flexmarl.activity import ActivityLog
from flexmarl.clock import now
from flexmarl.rollout.balancer import BalancerConfig
from flexmarl.orchestrator.agents import AgentRuntime
from flexmarl.orchestrator.orchestrator import Orchestrator
from flexmarl.orchestrator.loop import PipelineRun
from flexmarl.orchestrator.policy import PipelineConfig, PipelinePolicy, make_pipeline
from flexmarl.rollout.pool import InstancePool, RolloutConfig
from flexmarl.rollout.worker import RolloutWorker
from flexmarl.sim import clock
from flexmarl.sim.costs import Costs, Model, load_costs
from flexmarl.sim.engines import DeviceGroup, SimRolloutEngine, SimTokenizer, SimTrainer
from flexmarl.sim.presets import Preset, get_preset
from flexmarl.orchestrator.store import ExperienceStore
from flexmarl.training.pool import AgentTrainer, TrainerPool, TrainerPoolConfig
from runtime.transport import connect

FOREVER_S = 1e9  # request timeouts: simulated waits can be long; a hang raises SimulationStalled


@dataclass(frozen=True)
class System:
    name: str
    pipeline: str
    balance: str
    trainers: str
    """colocated, static (one slot per agent) or shared (preset.shared_slots)."""


SYSTEMS: dict[str, System] = {s.name: s for s in (
    System("mas_rl", "sync", "round_robin", "colocated"),
    System("marti", "sync", "round_robin", "static"),
    System("one_step_off", "one_step_off", "round_robin", "static"),
    System("flexmarl", "micro_batch", "hierarchical", "shared"),
    System("flexmarl-no_pipeline", "sync", "hierarchical", "shared"),
    System("flexmarl-no_balance", "micro_batch", "round_robin", "shared"),
    System("flexmarl-no_pool", "micro_batch", "hierarchical", "static"),
)}


@dataclass
class SystemResult:
    system: str
    step_s: float
    """Mean step time over the measured steps (all but the first, which starts cold, and the
    last, which has no next rollout to overlap with)."""
    tokens_per_s: float
    utilisation: float
    """Active device-seconds (decoding, prefilling, training) / (devices x measured time)."""
    devices: int
    rollout_instances: dict[str, int]
    trainer_slots: list[int]
    steps: list[float]
    moves: int = 0
    swaps: int = 0
    switches: int = 0
    train_compute_s: float = 0.0
    """Trainer compute seconds per measured step, all slots together."""
    records: list[dict] = field(default_factory=list, repr=False)

    def summary(self) -> dict:
        return {k: v for k, v in dataclasses.asdict(self).items() if k != "records"}


@dataclass
class _Layout:
    groups: list[DeviceGroup]
    instances: dict[str, list[tuple[str, SimRolloutEngine]]]
    slots: dict[str, tuple[int, DeviceGroup]]
    static: bool


def _layout(preset: Preset, system: System, costs: Costs) -> _Layout:
    """Which devices do what: rollout instances per agent, trainer slots (devices, group)."""
    models = {a: costs.models[size] for a, size in preset.models.items()}
    total = preset.nodes * costs.device.devices_per_node
    instances: dict[str, list] = {a: [] for a in models}
    counter = iter(range(1 << 30))

    def add(agent: str, group: DeviceGroup, model: Model) -> None:
        name = f"rollout-{next(counter)}"
        engine = SimRolloutEngine(costs, model, group, agent_of=lambda a=agent: a)
        instances[agent].append((name, engine))

    if system.trainers == "colocated":
        group = DeviceGroup("cluster", total, costs, colocated=True)
        per = {a: total // m.rollout_devices for a, m in models.items()}
        group.switch_bytes = lambda mode: (per[mode[1]] * models[mode[1]].weight_bytes
                                           if mode[0] == "rollout" else 0.0)
        for agent, model in models.items():
            for _ in range(per[agent]):
                add(agent, group, model)
        return _Layout([group], instances, {"trainer-0": (total, group)}, static=False)

    if system.trainers == "static":
        sizes = [m.train_devices for m in models.values()]
    else:
        sizes = [costs.models[size].train_devices for size in preset.shared_slots]
    slots = {f"trainer-{k}": (n, DeviceGroup(f"trainer-{k}", n, costs))
             for k, n in enumerate(sizes)}
    rollout_devices = total - sum(sizes)
    share = rollout_devices // len(models)
    group = DeviceGroup("rollout", rollout_devices, costs)
    for agent, model in models.items():
        count = share // model.rollout_devices
        if count < 1:
            raise ValueError(f"preset {preset.name}, system {system.name}: {rollout_devices} "
                             f"rollout devices leave agent {agent} no instance "
                             f"({model.rollout_devices} devices each); add nodes")
        for _ in range(count):
            add(agent, group, model)
    return _Layout([group] + [g for _, g in slots.values()], instances, slots,
                   static=system.trainers == "static")


async def _run(preset: Preset, system: System, costs: Costs, steps: int, seed: int,
               policy: PipelinePolicy | None, balance: BalancerConfig | None) -> SystemResult:
    layout = _layout(preset, system, costs)
    models = {a: costs.models[size] for a, size in preset.models.items()}
    team = preset.team()
    workers = [RolloutWorker(name, f"local://{name}", engine, max_concurrent=1 << 20,
                             report_interval_s=1.0)
               for insts in layout.instances.values() for name, engine in insts]
    trainers = [SimTrainer(name, costs, models, group, devices, f"local://{name}")
                for name, (devices, group) in layout.slots.items()]
    async with contextlib.AsyncExitStack() as stack:
        for actor in [*workers, *trainers]:
            await stack.enter_async_context(actor.serving())
        conns = {w.name: connect(w.address) for w in workers}
        placement = {a: [name for name, _ in insts] for a, insts in layout.instances.items()}
        activity = ActivityLog()
        pool = InstancePool(conns, placement, {a: f"sim:{s}" for a, s in preset.models.items()},
                            RolloutConfig(request_timeout_s=FOREVER_S),
                            balance or BalancerConfig(strategy=system.balance), activity=activity,
                            signatures=dict(preset.models), weights={a: {} for a in models})
        slot_conns = {t.name: connect(t.address) for t in trainers}
        tpool = TrainerPool(slot_conns, {n: d for n, (d, _) in layout.slots.items()},
                            {a: AgentTrainer(f"sim:{preset.models[a]}", {}, m.train_devices)
                             for a, m in models.items()},
                            TrainerPoolConfig(slots=0 if layout.static else len(layout.slots),
                                              snapshots=False, request_timeout_s=FOREVER_S))
        agents = {spec.name: AgentRuntime(spec, f"sim:{preset.models[spec.name]}", SimTokenizer())
                  for spec in team.agents}
        store = ExperienceStore(list(models))
        pipeline = PipelineConfig(tasks_per_step=preset.tasks_per_step,
                                  trajectories_per_task=preset.trajectories_per_task,
                                  max_concurrent_tasks=preset.tasks_per_step,
                                  max_concurrent_calls=1 << 20, micro_batch_groups=1)
        orch = Orchestrator(team, agents, store, pool, pipeline, seed=seed, activity=activity)
        engines = [e for insts in layout.instances.values() for _, e in insts]
        marks: list[tuple[float, float, float]] = []

        def emit(record: dict) -> None:
            for e in engines:  # bring their device accounting up to now
                e._advance()
                e._schedule()
            compute = sum(t.compute_s for t in trainers)
            marks.append((now(), sum(g.active_device_s for g in layout.groups), compute))
            record["sim"] = {"t": now()}

        await pool.start()
        try:
            async with orch.serving():
                records = await PipelineRun(
                    orch, store, pool, tpool, activity, pipeline, steps,
                    policy=policy or make_pipeline(system.pipeline), emit=emit).run()
        finally:
            await pool.close()
            await tpool.close()
            store.close()
            for conn in [*conns.values(), *slot_conns.values()]:
                await conn.aclose()
    total = preset.nodes * costs.device.devices_per_node
    # Steady state: from the end of step 0 (which starts cold) to the end of the step before
    # the last (which has no next rollout to overlap with).
    first, last = (1, len(records) - 2) if len(records) >= 3 else (0, len(records) - 1)
    measured = records[first:last + 1]
    t0, a0, c0 = marks[first - 1] if first else (0.0, 0.0, 0.0)
    t1, a1, c1 = marks[last]
    elapsed = t1 - t0
    tokens = sum(a["tokens"] for r in measured for a in r["agents"].values())
    return SystemResult(
        system.name, step_s=elapsed / len(measured),
        tokens_per_s=tokens / elapsed if elapsed else 0.0,
        utilisation=(a1 - a0) / (total * elapsed) if elapsed else 0.0,
        devices=total,
        rollout_instances={a: len(v) for a, v in layout.instances.items()},
        trainer_slots=[d for d, _ in layout.slots.values()],
        steps=[r["step_s"] for r in records],
        moves=sum(len(r["moves"]) for r in records),
        swaps=sum(len(r["swaps"]) for r in records),
        switches=sum(g.switches for g in layout.groups),
        train_compute_s=(c1 - c0) / len(measured),
        records=records)


def simulate(preset: str | Preset, system: str | System, *, costs: Costs | None = None,
             steps: int | None = None, seed: int = 0, policy: PipelinePolicy | None = None,
             balance: BalancerConfig | None = None) -> SystemResult:
    """Run `system` on `preset` on a fresh virtual clock; `policy` / `balance` replace the
    system's pipeline policy / balancer config (the same objects `flexmarl run` builds)."""
    preset = get_preset(preset) if isinstance(preset, str) else preset
    if isinstance(system, str):
        if system not in SYSTEMS:
            raise ValueError(f"unknown system {system!r}; systems: {', '.join(SYSTEMS)}")
        system = SYSTEMS[system]
    return clock.run(_run(preset, system, costs or load_costs(), steps or preset.steps, seed,
                          policy, balance))


def ideal_step_s(preset: str | Preset, flexmarl: SystemResult, *, costs: Costs | None = None,
                 steps: int | None = None, seed: int = 0) -> float:
    """Perfect overlap: FlexMARL's step with training, swaps and syncs free (rollout alone),
    or its trainer work spread over its slots, whichever is longer."""
    costs = costs or load_costs()
    free = dataclasses.replace(
        costs, train=dataclasses.replace(costs.train, flops_per_token_per_param=0.0,
                                         optimizer_passes=0.0),
        links=dataclasses.replace(costs.links, host_bandwidth_per_node=math.inf,
                                  sync_bandwidth=math.inf))
    rollout_only = simulate(preset, "flexmarl", costs=free, steps=steps, seed=seed)
    return max(rollout_only.step_s, flexmarl.train_compute_s / len(flexmarl.trainer_slots))


def compare(preset: str | Preset, systems: list[str] | None = None, *,
            costs: Costs | None = None, steps: int | None = None, seed: int = 0,
            progress: Callable[[str, SystemResult], Any] | None = None) -> dict:
    """Every system on one workload and seed; the JSON-ready comparison."""
    preset = get_preset(preset) if isinstance(preset, str) else preset
    costs = costs or load_costs()
    results = {}
    for name in systems or list(SYSTEMS):
        results[name] = simulate(preset, name, costs=costs, steps=steps, seed=seed)
        if progress is not None:
            progress(name, results[name])
    out: dict[str, Any] = {"preset": preset.name, "seed": seed,
                           "steps": steps or preset.steps, "systems": {}}
    for name, r in results.items():
        out["systems"][name] = r.summary()
    if "flexmarl" in results:
        out["ideal_step_s"] = ideal_step_s(preset, results["flexmarl"], costs=costs,
                                           steps=steps, seed=seed)
        out["flexmarl_gap_to_ideal"] = results["flexmarl"].step_s / out["ideal_step_s"] - 1
    return out
