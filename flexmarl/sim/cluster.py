"""The cluster simulator: the product's own scheduling code on simulated hardware.

    preset (team, workflow, nodes) + system (pipeline mode, balancing, trainer placement)
      ─► a fresh VirtualEventLoop (flexmarl.sim.clock)
      ─► real RolloutWorker actors on SimRolloutEngines, SimTrainer slots, all over local://
      ─► the real InstancePool + Balancer, TrainerPool + SlotAllocator, ExperienceStore,
         Orchestrator and PipelineRun, unchanged (the same classes `flexmarl run` uses)
      ─► per-step records (the run's metrics.jsonl records) + device accounting ─► SystemResult

Systems differ only in policy objects and placement, so every comparison is one workload, one
seed, one cost model (flexmarl.sim.layouts lays the devices out):

    system                 pipeline      balancing     trainers
    mas_rl                 sync          round_robin   colocated: every device hosts every
                                                       agent's instances and one trainer slot;
                                                       one mode resident at a time
    marti                  sync          round_robin   per agent, as MARTI's code runs: each
                                                       agent's devices (equal split) alternate
                                                       between its vLLM engines and its trainer;
                                                       its experience pass over all samples,
                                                       agent after agent; agents train in
                                                       parallel; broadcasts agent after agent,
                                                       each waking and re-sleeping the engines
    marti-lean             sync          round_robin   marti with the judgement calls in its
                                                       favour: its experience pass over each
                                                       agent's own samples, devices split by
                                                       the demand measured on the planner's
                                                       seeds (costs.toml [baselines])
    sync_static            sync          round_robin   one dedicated slot per agent
    one_step_off           one_step_off  round_robin   one dedicated slot per agent
    flexmarl               planned       planned       planned (flexmarl.sim.plan): shared or
                                                       one-per-agent disaggregated slots, or
                                                       time-shared groups (per agent or a few
                                                       agents each), with a zero-staleness
                                                       pipeline (micro_batch or sync)
    flexmarl+snapshots     as flexmarl, with the per-step recovery snapshots of
                           trainer_pool.snapshots (on by default in the product)
    flexmarl-one_step_off  one_step_off  as flexmarl   as flexmarl: what staleness 1 buys (not
                                                       an ablation: another promise)
    flexmarl-no_pipeline   sync          as flexmarl   the planned placement, no overlap
    flexmarl-no_balance    as flexmarl   round_robin   the planned placement, no balancing
    flexmarl-no_pool       planned among placements without a shared slot (one per agent,
                           disaggregated or time-shared)
    flexmarl-no_timeshare  planned among disaggregated placements (FlexMARL before issue 36)

LoRA agents (Preset.lora) run as in the product: the pool gets `adapters=` and a placement
keyed by unit (the LoRA agents on one base share its instances, each request naming its
adapter), syncs send adapters, trainer slots swap adapter states (flexmarl.sim.engines).

Planned on other seeds than the reported one (issue 54: compare's `plan_seeds`, an overlap
refused), FlexMARL's rows run the chosen placement on the reported seed, where nothing makes
it the fastest of its ablations: the planner's last round (the best with sync and with
round_robin) and its try of MARTI's layout (per agent, equal split; on GPU only with
allow_unverified) hold on the plan seeds. Every system runs with one trainer.kl_coef
(Preset.kl_coef: > 0, every trainer's reference forward priced), and every sync priced as its
code path runs (Costs, flexmarl.sim.layouts). The `marti` row follows MARTI's driver
(TsinghuaC3I/MARTI, marti/trainer/multi_agent_ppotrainer.py `fit`: generate_samples (wake_up,
generate, sleep), make_experience_batch, `ppo_train`: every agent's `reload_states`, `fit`
issued together and joined, `offload_states`; then `_broadcast_to_vllm` agent by agent:
wake_up, broadcast, sleep) and its launcher (marti/cli/multi_agent_train_ppo_ray.py: one
placement group per agent, vLLM and the actor on it with `colocate_all_models` and
`vllm_enable_sleep`). Checkpoints are priced for no system (costs.toml [baselines]); the
`flexmarl+snapshots` row shows what FlexMARL's per-step snapshots cost.
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Callable

from flexmarl.activity import ActivityLog
from flexmarl.clock import now
from flexmarl.config.balance import BalancerConfig
from flexmarl.config.pipeline import PipelineConfig
from flexmarl.config.rollout import RolloutConfig
from flexmarl.config.training import TrainerPoolConfig
from flexmarl.orchestrator.agents import AgentRuntime
from flexmarl.orchestrator.orchestrator import Orchestrator
from flexmarl.orchestrator.loop import PipelineRun
from flexmarl.orchestrator.policy import PipelinePolicy, make_pipeline
from flexmarl.rollout.pool import InstancePool
from flexmarl.weights.sync import WeightSync
from flexmarl.rollout.worker import RolloutWorker
from flexmarl.sim import bounds, clock, layouts, plan
from flexmarl.sim.costs import Costs, load_costs
from flexmarl.sim.engines import FOREVER_S, SimTokenizer, SimTrainer
from flexmarl.sim.presets import Preset, get_preset
from flexmarl.orchestrator.store import ExperienceStore
from flexmarl.training.pool import AgentTrainer, TrainerPool
from runtime.transport import connect



@dataclass(frozen=True)
class System:
    name: str
    pipeline: str
    balance: str
    trainers: str
    """colocated (one group for everything), per_agent (MARTI: each agent's own colocated
    group), static (one slot per agent) or shared (preset.shared_slots; a FlexMARL row runs
    the preset's time-shared groups instead when it has some)."""
    flexmarl: bool = False
    """Runs FlexMARL's planned placement (preset.train_devices, instances, timeshare)."""
    snapshots: bool = False
    """Pays the product's per-step recovery snapshot and durable state write
    (trainer_pool.snapshots); checkpoints are otherwise priced for no system."""
    experience: str = ""
    """MARTI's experience pass: "all" samples, each agent's "own", or "" (none)."""
    split: str = "equal"
    """MARTI's devices per agent: "equal", by "demand" measured on the planner's seeds, or by
    "params" (flexmarl.sim.layouts)."""


SYSTEMS: dict[str, System] = {s.name: s for s in (
    System("mas_rl", "sync", "round_robin", "colocated"),
    System("marti", "sync", "round_robin", "per_agent", experience="all"),
    System("marti-lean", "sync", "round_robin", "per_agent", experience="own", split="demand"),
    System("sync_static", "sync", "round_robin", "static"),
    System("one_step_off", "one_step_off", "round_robin", "static"),
    System("flexmarl", "micro_batch", "hierarchical", "shared", True),
    System("flexmarl+snapshots", "micro_batch", "hierarchical", "shared", True, snapshots=True),
    System("flexmarl-one_step_off", "one_step_off", "hierarchical", "shared", True),
    System("flexmarl-no_pipeline", "sync", "hierarchical", "shared", True),
    System("flexmarl-no_balance", "micro_batch", "round_robin", "shared", True),
    System("flexmarl-no_pool", "micro_batch", "hierarchical", "static", True),
    System("flexmarl-no_timeshare", "micro_batch", "hierarchical", "shared", True),
)}
PLANNED = ("flexmarl-no_pool", "flexmarl-no_timeshare")
"""Ablations that are the planner's best among a subset of its placements (plan.subset)."""


@dataclass
class SystemResult:
    system: str
    step_s: float
    """Mean step time over the measured steps (all but the first, which starts cold, and the
    last, which has no next rollout to overlap with), timed from the end of the rollout
    before the first to the end of the last one's rollout: every mode's window then holds
    the same rollouts (a record's emission lags its rollout by a step in one_step_off)."""
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
    snapshot_s: float = 0.0
    """Slot seconds per measured step spent taking recovery snapshots."""
    sync_s: float = 0.0
    """Slot seconds per measured step spent gathering or publishing weights for the syncs
    (pricing "new"; the instances' part is not in it)."""
    swap_out_s: float = 0.0
    """Slot seconds per measured step spent parking idle agents' states (SwapOut)."""
    swap_in_s: float = 0.0
    """... loading states back into the slot they are parked in (or restoring them)."""
    pulled_s: float = 0.0
    """... pulling states parked in another slot (a move, then the load)."""
    write_s: float = 0.0
    """Disk seconds per step the durable state copies take on average (every
    preset.save_every steps, in the background; more than step_s would make them the
    bottleneck)."""
    sync_bytes: float = 0.0
    """Bytes of the weight updates of a measured step, all agents together (the records'
    sync_bytes: a LoRA agent's adapter, a full agent's weights), each sent to every instance
    that serves the agent."""
    swap_bytes: float = 0.0
    """Bytes the trainer slots' swaps of a measured step moved (out and in; a LoRA agent's
    adapter state, plus its base where a slot's devices held another model)."""
    state_bytes: dict[str, float] = field(default_factory=dict)
    """Each trainable agent's training state on its slot's devices (a LoRA agent: the frozen
    base + its adapter's state)."""
    instance_bytes: dict[str, float] = field(default_factory=dict)
    """Weights one rollout instance of each unit holds (a LoRA unit: one base + every
    member's adapter)."""
    rollout_weight_bytes: float = 0.0
    """Weights over all rollout instances (what the model copies take of rollout memory)."""
    lora_instances: dict[str, dict] = field(default_factory=dict, repr=False)
    """Each LoRA unit's instance -> {"unit", "requests": adapter -> requests it served,
    "loads": adapter -> adapter loads, "versions": adapter -> the version its worker serves}."""
    records: list[dict] = field(default_factory=list, repr=False)
    micro_batches: list[tuple[float, str, int, int]] = field(default_factory=list, repr=False)
    """(time, agent, rows, tokens) of every micro-batch any slot trained."""
    marks: list[float] = field(default_factory=list, repr=False)
    """The simulated time at which each step's rollout ended."""
    emits: list[float] = field(default_factory=list, repr=False)
    """The simulated time at which each step's record was emitted."""

    def summary(self) -> dict:
        return {k: v for k, v in dataclasses.asdict(self).items()
                if k not in ("records", "micro_batches", "marks", "emits", "lora_instances")}


async def _run(preset: Preset, system: System, costs: Costs, steps: int, seed: int,
               policy: PipelinePolicy | None, balance: BalancerConfig | None) -> SystemResult:
    layout = layouts.build(preset, system, costs)
    models = layouts.agent_models(preset, costs)
    sizes = preset.sizes
    team = preset.team()
    workers = [RolloutWorker(name, f"local://{name}", engine, max_concurrent=1 << 20,
                             report_interval_s=1.0)
               for insts in layout.instances.values() for name, engine in insts]
    # The product's trainer runs the reference forward in its step; MARTI's experience pass.
    reference = costs.reference(preset.kl_coef) and layout.experience is None
    trainers = [SimTrainer(name, costs, models, group, devices, f"local://{name}",
                           sync=layout.sync, reference=reference)
                for name, (devices, group) in layout.slots.items()]
    for t in trainers:
        t.gate = layout.experience
    async with contextlib.AsyncExitStack() as stack:
        for actor in [*workers, *trainers]:
            await stack.enter_async_context(actor.serving())
        conns = {w.name: connect(w.address) for w in workers}
        placement = {a: [name for name, _ in insts] for a, insts in layout.instances.items()}
        activity = ActivityLog()
        model_dirs = {a: f"sim:{s}" for a, s in sizes.items()}
        adapters = preset.adapters()
        weights = WeightSync(models, None, model_dirs, timeout_s=FOREVER_S,
                             adapters={a: lora for a, (_, lora) in adapters.items()})
        pool = InstancePool(conns, placement, model_dirs,
                            RolloutConfig(request_timeout_s=FOREVER_S),
                            balance or BalancerConfig(strategy=system.balance), weights=weights,
                            activity=activity, signatures=dict(preset.models), adapters=adapters)
        slot_conns = {t.name: connect(t.address) for t in trainers}
        tpool = TrainerPool(slot_conns, {n: d for n, (d, _) in layout.slots.items()},
                            {a: AgentTrainer(f"sim:{sizes[a]}", {"kl_coef": preset.kl_coef},
                                             # time-shared: the agent's whole group trains it
                                             layout.ranks.get(a, models[a].train_devices))
                             for a in preset.trainable},
                            TrainerPoolConfig(slots=0 if layout.static else len(layout.slots),
                                              snapshots=system.snapshots,
                                              request_timeout_s=FOREVER_S))
        agents = {spec.name: AgentRuntime(spec, f"sim:{sizes[spec.name]}", SimTokenizer())
                  for spec in team.agents}
        store = ExperienceStore(preset.trainable)
        pipeline = PipelineConfig(tasks_per_step=preset.tasks_per_step,
                                  trajectories_per_task=preset.trajectories_per_task,
                                  max_concurrent_tasks=preset.max_concurrent_tasks
                                  or preset.tasks_per_step,
                                  max_concurrent_calls=1 << 20,
                                  micro_batch_groups=preset.micro_batch_groups)
        engines = [e for insts in layout.instances.values() for _, e in insts]
        marks: list[tuple[float, float, float, float, float]] = []

        def rollout_ended(stats: Any) -> None:
            """After each step's rollout: the engines' and trainers' accounting up to now."""
            for e in engines:  # bring their device accounting up to now
                e._advance()
                e._schedule()
            if layout.experience is not None:
                layout.experience.arm()
            compute = sum(t.compute_s for t in trainers)
            marks.append((now(), sum(g.active_device_s for g in layout.groups), compute,
                          sum(t.snapshot_s for t in trainers), sum(t.sync_s for t in trainers)))

        orch = Orchestrator(team, agents, store, pool, pipeline, seed=seed, activity=activity,
                            on_rollout_end=rollout_ended)
        emits: list[float] = []

        def emit(record: dict) -> None:
            emits.append(now())
            record["sim"] = {"t": now()}


        await pool.start()
        try:
            async with orch.serving():
                records = await PipelineRun(
                    orch, store, pool, tpool, activity, pipeline, steps, weights=pool.weights,
                    policy=policy or make_pipeline(system.pipeline), emit=emit,
                    saves=(lambda step: (step + 1) % preset.save_every == 0 or step + 1 == steps)
                    if system.snapshots else None).run()
        finally:
            await pool.close()
            await tpool.close()
            store.close()
            for conn in [*conns.values(), *slot_conns.values()]:
                await conn.aclose()
    total = preset.nodes * costs.device.devices_per_node
    # Steady state: from the end of step 0's rollout (it starts cold) to the end of the
    # rollout of the step before the last (which has no next rollout to overlap with).
    first, last = (1, len(records) - 2) if len(records) >= 3 else (0, len(records) - 1)
    measured = records[first:last + 1]
    t0, a0, c0, s0, y0 = marks[first - 1] if first else (0.0,) * 5
    t1, a1, c1, s1, y1 = marks[last]
    elapsed = t1 - t0
    tokens = sum(a["tokens"] for r in measured for a in r["agents"].values())
    swapped = {"out": 0.0, "in": 0.0, "pulled": 0.0}  # slot seconds of the measured window
    swap_bytes = 0
    for sw in tpool.swaps:
        if t0 < sw.at <= t1:
            swapped["out" if sw.direction == "out" else
                    "pulled" if sw.source not in ("", sw.slot) else "in"] += sw.seconds
            swap_bytes += sw.num_bytes
    units = layouts.unit_models(preset, costs)
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
        snapshot_s=(s1 - s0) / len(measured), sync_s=(y1 - y0) / len(measured),
        swap_out_s=swapped["out"] / len(measured), swap_in_s=swapped["in"] / len(measured),
        pulled_s=swapped["pulled"] / len(measured),
        write_s=sum(costs.state_write_s(models[a]) for a in preset.trainable)
        / preset.save_every if system.snapshots else 0.0,
        sync_bytes=sum(a.get("sync_bytes", 0) for r in measured for a in r["agents"].values())
        / len(measured), swap_bytes=swap_bytes / len(measured),
        state_bytes={a: costs.state_bytes(models[a]) for a in preset.trainable},
        instance_bytes={u: m.served_bytes for u, m in units.items()},
        rollout_weight_bytes=sum(len(layout.instances[u]) * units[u].served_bytes
                                 for u in units),
        lora_instances={w.name: {"unit": w.engine.agent_of(),
                                 "requests": dict(w.engine.adapter_requests),
                                 "loads": dict(w.engine.adapter_loads),
                                 "versions": dict(w.adapter_versions)}
                        for w in workers if w.engine.adapters},
        records=records, micro_batches=sorted(m for t in trainers for m in t.micro_batches),
        marks=[m[0] for m in marks], emits=emits)


def simulate(preset: str | Preset, system: str | System, *, costs: Costs | None = None,
             steps: int | None = None, seed: int = 0, policy: PipelinePolicy | None = None,
             balance: BalancerConfig | None = None,
             plan_seeds: tuple[int, ...] = plan.PLAN_SEEDS,
             deployment: plan.Deployment = plan.Deployment()) -> SystemResult:
    """Run `system` on `preset` on a fresh virtual clock; `policy` / `balance` replace the
    system's pipeline policy / balancer config (the same objects `flexmarl run` builds). A
    shared pool of preset.shared_slots = "auto" is planned first (`plan_slots`, on
    `plan_seeds`, apart from `seed`), then run on `seed`."""
    preset = get_preset(preset) if isinstance(preset, str) else preset
    system = _system(system)
    costs = costs or load_costs()
    if (preset.train_devices or preset.instances or preset.timeshare) and not system.flexmarl:
        raise ValueError(f"{system.name} is a baseline: it runs on the cost model's slot "
                         "sizes and equal instances, not the planner's")
    if system.trainers == "shared" and preset.shared_slots == "auto" and not preset.timeshare:
        check_seeds(seed, plan_seeds)
        best = plan_slots(preset, system, costs=costs, steps=steps, seeds=plan_seeds,
                          deployment=deployment, policy=policy, balance=balance)[0]
        chosen = dataclasses.replace(system, balance=best.balance, pipeline=best.pipeline)
        return simulate(plan.preset_of(preset, best), chosen, costs=costs, steps=steps,
                        seed=seed, policy=policy, balance=balance)
    if preset.train_devices:
        costs = costs.with_train_devices(preset.train_devices)
    return clock.run(_run(preset, system, costs, steps or preset.steps, seed, policy,
                          balance))


def check_seeds(seed: int, plan_seeds: tuple[int, ...]) -> None:
    """A ValueError where the planner's seeds include the reported one: the plan would see
    the workload it is judged on."""
    if not plan_seeds:
        raise ValueError("the planner needs at least one seed of its own (plan seeds)")
    if seed in plan_seeds:
        raise ValueError(f"plan seeds {', '.join(map(str, plan_seeds))} include the reported "
                         f"seed {seed}: the planner would choose on the workload it is judged on; "
                         "give plan seeds apart from the reported ones (bench/simulate.py "
                         "--plan-seeds)")


@dataclass
class PlanRun:
    """A candidate placement simulated on each of the planner's seeds (flexmarl.sim.plan
    reads step_s, records and rollout_instances)."""

    step_s: float
    """The mean step time over the seeds."""
    records: list[dict]
    """Every seed's per-step records (the demand splits count their tokens)."""
    rollout_instances: dict[str, int]
    """The first seed's (the same layout on every seed)."""


def _system(system: str | System) -> System:
    if isinstance(system, System):
        return system
    if system not in SYSTEMS:
        raise ValueError(f"unknown system {system!r}; systems: {', '.join(SYSTEMS)}")
    return SYSTEMS[system]


def plan_slots(preset: Preset, system: str | System = "flexmarl", *, costs: Costs,
               steps: int | None = None, seeds: tuple[int, ...] = plan.PLAN_SEEDS,
               progress: Callable[[plan.Placement], Any] | None = None,
               deployment: plan.Deployment = plan.Deployment(),
               **kwargs: Any) -> list[plan.Placement]:
    """The placements flexmarl.sim.plan evaluated for `system` on `seeds` (each candidate's
    step the mean over them), those the product runs in `deployment` first, best first."""
    system = _system(system)

    def run(p: Preset, strategy: str, pipeline: str) -> PlanRun:
        chosen = dataclasses.replace(system, balance=strategy, pipeline=pipeline)
        results = [simulate(p, chosen, costs=costs, steps=steps, seed=s, **kwargs)
                   for s in seeds]
        return PlanRun(sum(r.step_s for r in results) / len(results),
                       [rec for r in results for rec in r.records],
                       results[0].rollout_instances)

    if not seeds:
        raise ValueError("the planner needs at least one seed of its own (plan seeds)")
    return plan.plan(preset, costs, run, progress, pipeline=system.pipeline,
                     deployment=deployment)


def rollout_only(preset: Preset, system: System, *, costs: Costs, steps: int | None = None,
                 seed: int = 0) -> SystemResult:
    """`system`'s layout and balancer serving the workload with all else free
    (flexmarl.sim.bounds): one step ahead (one_step_off), and where devices alternate between
    modes (colocated, time-shared) also in sync, the faster of the two: there the order in
    which the steps' calls reach a group can make the overlapped run the slower one (mas_rl
    on `small` at GPU prices: 108.8 s one step ahead, 82.3 s for the system itself)."""
    free = dataclasses.replace(system, name=f"{system.name}/rollout_only",
                               pipeline="one_step_off")
    free_costs = bounds.free_training(costs)
    runs = [simulate(preset, free, costs=free_costs, steps=steps, seed=seed)]
    if system.trainers in ("colocated", "per_agent") or (system.flexmarl and preset.timeshare):
        runs.append(simulate(preset, dataclasses.replace(free, pipeline="sync"),
                             costs=free_costs, steps=steps, seed=seed))
    return min(runs, key=lambda r: r.step_s)


def compare(preset: str | Preset, systems: list[str] | None = None, *,
            costs: Costs | None = None, steps: int | None = None, seed: int = 0,
            plan_seeds: tuple[int, ...] = plan.PLAN_SEEDS,
            deployment: plan.Deployment = plan.Deployment(),
            progress: Callable[[str, SystemResult], Any] | None = None) -> dict:
    """Every system on one workload and seed, with the preset's bounds; the JSON-ready
    comparison. FlexMARL's placement is planned on `plan_seeds` (never the reported `seed`:
    a ValueError), among what the product runs in `deployment`; marti-lean's devices are split
    by the demand measured there (the planner's information, no more)."""
    preset = get_preset(preset) if isinstance(preset, str) else preset
    costs = costs or load_costs()
    names = systems or list(SYSTEMS)
    results: dict[str, SystemResult] = {}
    placements: list[plan.Placement] = []
    runs: dict[str, tuple[System, Preset]] = {n: (SYSTEMS[n], preset) for n in names}
    chosen_by: dict[str, plan.Placement] = {}
    best = None
    if preset.shared_slots == "auto":  # planned once, with flexmarl; its rows run on it
        check_seeds(seed, plan_seeds)
        placements = plan_slots(preset, "flexmarl", costs=costs, steps=steps, seeds=plan_seeds,
                                deployment=deployment)
        best = placements[0]
        demand = plan.agent_demand(preset, costs, best)
        for name in names:
            system = SYSTEMS[name]
            if not system.flexmarl:
                runs[name] = (system, dataclasses.replace(preset, shared_slots=best.slots,
                                                          demand=demand))
                continue
            chosen = best
            if name in PLANNED:  # the planner's best among the placements it keeps
                chosen = plan.subset(placements, name.split("-no_")[1], preset)
                if chosen is None:
                    continue
            chosen_by[name] = chosen
            # The chosen placement's pipeline and balancing, except what the row removes.
            runs[name] = (dataclasses.replace(
                system, pipeline=chosen.pipeline if system.pipeline == "micro_batch"
                else system.pipeline, balance=chosen.balance
                if system.balance == "hierarchical" else system.balance),
                plan.preset_of(preset, chosen))
    infeasible: dict[str, str] = {}
    for name in names:
        if name not in runs:
            infeasible[name] = "no placement of its kind the product runs here fits"
            continue
        system, on = runs[name]
        if (why := misfit(on, system, costs)) is not None:
            infeasible[name] = why
            continue
        results[name] = simulate(on, system, costs=costs, steps=steps, seed=seed)
        if progress is not None:
            progress(name, results[name])
    results = {name: results[name] for name in names if name in results}
    # One rollout-only run per layout and balancer among the systems, and FlexMARL's (the
    # zero-staleness bound is on its layout even when it is not compared).
    flex = runs.get("flexmarl") or (SYSTEMS["flexmarl"], plan.preset_of(preset, best)
                                    if best else preset)
    only: dict[tuple, SystemResult] = {}
    keys = {}
    extra = {} if misfit(flex[1], flex[0], costs) else {"flexmarl": flex}
    for name, (system, on) in {**{n: runs[n] for n in results}, **extra}.items():
        keys[name] = key = (system.trainers, system.balance, system.split, system.flexmarl,
                            _layout_key(on))
        if key not in only:
            only[key] = rollout_only(on, system, costs=costs, steps=steps, seed=seed)
    other = plan.would_have(placements)
    out: dict[str, Any] = {"preset": preset.name, "seed": seed, "costs": costs.name,
                           "pricing": costs.pricing, "kl_coef": preset.kl_coef,
                           "plan_seeds": list(plan_seeds) if best else [],
                           "steps": steps or preset.steps, "systems": {},
                           "planned": plan.describe(preset, costs, best) if best else None,
                           "would_have_picked": plan.describe(preset, costs, other)
                           if other else None,
                           "plan": [plan.describe(preset, costs, p) for p in placements]}
    own = {name: bounds.perfect_overlap_s(r, only[keys[name]]) for name, r in results.items()}
    flex_only = only.get(keys.get("flexmarl"))
    out["bounds"] = {
        "perfect_overlap_s": min(own.values()),
        "zero_staleness_s": flex_only.step_s + bounds.least_tail_s(preset, flex_only, costs)
        if flex_only else math.nan,
        "rollout_only_s": {_key_name(k): r.step_s for k, r in only.items()},
    }
    for name, r in results.items():
        row = r.summary()
        row["perfect_overlap_s"] = own[name]
        row["gap_to_perfect_overlap"] = r.step_s / out["bounds"]["perfect_overlap_s"] - 1
        row["gap_to_zero_staleness"] = r.step_s / out["bounds"]["zero_staleness_s"] - 1
        row["pipeline"], row["balance"] = runs[name][0].pipeline, runs[name][0].balance
        row["placement"], row["expressible"] = row_placement(
            *runs[name], costs, chosen_by.get(name))
        out["systems"][name] = row
    out["infeasible"] = infeasible
    return out


def row_placement(system: System, on: Preset, costs: Costs,
                  chosen: plan.Placement | None) -> tuple[str, bool]:
    """A row's placement in words, and whether FlexMARL's config can say it (plan.expressible;
    a baseline's layout: as FlexMARL's config would write it, mas_rl's one cluster-wide slot
    alternating with every engine it cannot)."""
    if chosen is not None:
        return f"{plan.label(costs, chosen)} ({plan.placement_key(chosen)})", \
            plan.expressible(chosen)
    if system.trainers == "colocated":
        return "colocated (every device: every agent's engines and one trainer slot)", False
    if system.trainers == "per_agent":
        devices = layouts.marti_split(on, costs, system.split)
        return (f"per agent, {'+'.join(map(str, devices))} devices (time_shared)",
                len(set(devices)) == 1)
    if system.trainers == "static":
        return "one slot per agent (disaggregated)", True
    return f"{len(on.shared_slots)} shared slots (disaggregated)", True


def _layout_key(p: Preset) -> tuple:
    return (p.shared_slots, tuple(sorted((p.train_devices or {}).items())),
            tuple(sorted((p.instances or {}).items())), p.timeshare, p.timeshare_devices)


def _key_name(key: tuple) -> str:
    trainers, balance, split, flexmarl, (slots, _, _, groups, _) = key
    where = ("time_shared" if groups else trainers) if flexmarl else \
        (trainers if split == "equal" else f"{trainers}/{split}")
    return f"{where}/{balance}" + ("/flexmarl" if flexmarl else "")


def misfit(preset: Preset, system: System, costs: Costs) -> str | None:
    """Why `system`'s layout does not fit `preset`'s cluster (None: it fits)."""
    if system.trainers == "shared" and preset.shared_slots == "auto":
        return None  # the planner only tries placements that fit
    if preset.train_devices:
        costs = costs.with_train_devices(preset.train_devices)
    try:
        layouts.build(preset, system, costs)
    except ValueError as exc:
        return str(exc)
    return None
