"""The composition root: the one place a run's components are built, each handed its
collaborators at construction.

    RunSetup (flexmarl.launch.build) ─► start_workers: every rollout instance and trainer rank
        at once (engine starts overlap), on the placement flexmarl.placement decided; one
        console line counts them ready
    ─► compose, in this order (each built from the ones before it, nothing poked in later):
        AgentRuntimes            one per agent (its tokenizer, versions, gate)
        TimeShares               the time-shared groups' arbiters (pure; flexmarl.placement)
        TrainerPool(shares)      slots over the trainer ranks; gives the groups `park`
        transport                staged, or on GPUs the trainer ranks sending straight to the
                                 engines (DirectTransport over the trainer pool)
        WeightSync(transport)    each agent's version and served weights
        InstancePool(weights, shares)  the instances; gives the sync where each agent's are
                                 and the groups how to sleep and wake their engines
        ExperienceStore, Gateway (gateway.enabled), Orchestrator(pool)

The arbiters and the sync are built before the pools that hold what they act on; each pool,
handed them, says at its own construction what it holds (TimeShares.hold_engines,
hold_trainers, WeightSync.serve_from). No component reaches another through a third.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
from dataclasses import dataclass

from flexmarl.activity import ActivityLog
from flexmarl.config.rollout import DIRECT
from flexmarl.console import Bar, phase, ticking
from flexmarl.gateway.backend import Gateway
from flexmarl.launch.build import RunSetup
from flexmarl.launch.workers import (Workers, check_ray_gpus, grow, hosts, snapshots_in)
from flexmarl.models import load_tokenizer
from flexmarl.orchestrator.agents import AgentRuntime
from flexmarl.orchestrator.orchestrator import Orchestrator
from flexmarl.orchestrator.store import ExperienceStore
from flexmarl.placement.layout import GpuPlacement, SlotLayout, place_gpus, slot_layout
from flexmarl.placement.lora_units import LoraUnits, lora_units
from flexmarl.placement.timeshare import TimeShares
from flexmarl.rollout.pool import InstancePool
from flexmarl.training.pool import AgentTrainer, TrainerPool
from flexmarl.weights import published
from flexmarl.weights.direct import DirectTransport
from flexmarl.weights.sync import WeightSync
from runtime.lifecycle import Lifecycle
from runtime.registry import NodeRegistry
from runtime.supervisor import Supervisor, WorkerHandle, WorkerSpec

log = logging.getLogger(__name__)


@dataclass
class Parts:
    """The run's components once its workers are up, each built with what it uses."""

    sup: "Supervisor | NodeRegistry"
    agents: dict[str, AgentRuntime]
    pool: InstancePool
    trainers: TrainerPool
    weights: WeightSync
    shares: TimeShares
    store: ExperienceStore
    activity: ActivityLog
    orch: Orchestrator
    gateway: Gateway | None


@dataclass
class Started:
    """The workers as start_workers left them: their handles and the placement they run on."""

    workers: Workers
    layout: SlotLayout
    gpus: GpuPlacement
    units: LoraUnits
    instances: dict[str, list[WorkerSpec]]
    """unit (an agent, or a LoRA group) -> its rollout instances' specs."""
    slots: list[list[WorkerSpec]]
    """Slot K's ranks' specs."""
    handles: dict[str, WorkerHandle]


async def compose(setup: RunSetup, work: str) -> Parts:
    """Workers started (on nodes once enough have joined), every component built over them
    (see the module docstring), saved states restored into the trainer pool."""
    sup, team, cluster, settings = setup.sup, setup.team, setup.cluster, setup.workers
    model_dirs, rollout = setup.model_dirs, settings.rollout
    if isinstance(sup, NodeRegistry):
        await sup.wait_for({"rollout": cluster.rollout_nodes, "trainer": cluster.trainer_nodes},
                           cluster.join_timeout_s, report=log.warning)
    started = await _start_with_progress(setup, work)
    workers, gpus = started.workers, started.gpus
    activity = ActivityLog()
    agents = {spec.name: AgentRuntime(spec, model_dirs[spec.name],
                                      load_tokenizer(model_dirs[spec.name]),
                                      max_model_len=rollout.max_model_len)
              for spec in team.agents}
    shares = TimeShares(started.layout.groups)
    trainers = _trainer_pool(setup, started, shares)
    transport = (DirectTransport(trainers, gpus.transfer,
                                 tensor_parallel_size=rollout.tensor_parallel_size,
                                 dtype=rollout.dtype, timeout_s=rollout.request_timeout_s)
                 if gpus.transfer in DIRECT else None)
    adapters = started.units.adapters()
    weights = WeightSync(list(agents), None, model_dirs, timeout_s=rollout.request_timeout_s,
                         transport=transport, rollout=shares.rollout,
                         adapters={a: lora for a, (_, lora) in adapters.items()})
    specs = [w for ws in started.instances.values() for w in ws]
    pool = InstancePool(
        {w.name: workers.connect(started.handles[w.name].address) for w in specs},
        {unit: [w.name for w in ws] for unit, ws in started.instances.items()}, model_dirs,
        rollout, setup.balance, weights=weights, activity=activity,
        lifecycle=Lifecycle(workers.respawn, kill=sup.kill, kind="rollout instance",
                            owners={w.name: w.name for w in specs},
                            attempts=settings.replace_attempts, devices=gpus.devices),
        shares=shares, adapters=adapters)
    if isinstance(sup, NodeRegistry):  # a rollout node joining now gets instances
        sup.started_run(on_join=lambda node: grow(pool, cluster.instances_per_node, node))
    if setup.first_step:  # checked here (sha256s); each slot's ranks read their own rows
        for name in trainers.agents:
            trainers.restore(name, await asyncio.to_thread(setup.saved.ref, name,
                                                           setup.first_step - 1))
    store = ExperienceStore([n for n, rt in agents.items() if rt.spec.trainable],
                            credit=setup.pipeline.credit)
    # With the gateway, the app's episodes are the tasks' trajectories.
    gateway = Gateway(agents, setup.gateway, setup.pipeline) if setup.gateway.enabled else None
    orch = Orchestrator(gateway.team(team) if gateway else team, agents, store, pool,
                        setup.pipeline, seed=setup.run.seed, activity=activity)
    return Parts(sup, agents, pool, trainers, weights, shares, store, activity, orch, gateway)


def _trainer_pool(setup: RunSetup, started: Started, shares: TimeShares) -> TrainerPool:
    """The slots over the started trainer ranks (with run.save_state every step's state is
    saved, even if trainer_pool.snapshots is off: a save is a snapshot)."""
    settings, sup, model_dirs = setup.workers, setup.sup, setup.model_dirs
    sizes = started.layout.sizes
    trainable = [spec for spec in setup.team.agents if spec.trainable]
    section = (dataclasses.replace(settings.trainer_pool, snapshots=True)
               if setup.saved is not None else settings.trainer_pool)
    published.remove_orphans()  # runs nobody holds (SIGKILLed): their versions hold /dev/shm
    run = published.run_name()
    # Held by this process until the pool removes it (TrainerPool.close): a version its
    # trainer published on this host outlives that trainer (instances joining load it).
    published.lease(run)
    return TrainerPool(
        {f"trainer-{k}": started.workers.connect(started.handles[f"trainer-{k}-0"].address)
         for k in range(len(sizes))},
        {f"trainer-{k}": n for k, n in enumerate(sizes)},
        {spec.name: AgentTrainer(model_dirs[spec.name], setup.trainer_configs[spec.name],
                                 spec.train_ranks or settings.trainer_pool.ranks_per_agent)
         for spec in trainable},
        section, lifecycle=Lifecycle(
            started.workers.respawn_slot, kill=sup.kill, groups=True, kind="trainer slot",
            owners={w.name: f"trainer-{k}" for k, ws in enumerate(started.slots) for w in ws},
            attempts=settings.replace_attempts, devices=started.gpus.devices),
        saved=setup.saved,
        scratch_in=snapshots_in(sup, [model_dirs[spec.name] for spec in trainable]),
        pinned=started.layout.pinned, shares=shares, publish=run)


async def _start_with_progress(setup: RunSetup, work: str) -> Started:
    """start_workers, with one console line counting the workers ready and the time waited."""
    units = lora_units(setup.team, setup.model_dirs, setup.workers.rollout)
    instances = sum(units.instances(setup.team,
                                    setup.workers.rollout.instances_per_agent).values())
    if units.describe():
        phase(units.describe())
    backend = setup.workers.rollout.backend
    ready = {"rollout": 0, "trainer": 0}
    bar = Bar(f"waiting for {instances} rollout engine{'s' * (instances != 1)} ({backend}) and "
              "the trainers" + (" (a cold vLLM engine takes a minute or more on a CPU)"
                                if backend == "vllm" else ""))

    def on_ready(name: str) -> None:
        ready["trainer" if name.startswith("trainer") else "rollout"] += 1
        bar.update(note=f"ready: {ready['rollout']}/{instances} engines, "
                        f"{ready['trainer']} trainer ranks")

    with bar:
        tick = asyncio.create_task(ticking(bar), name="run.waiting")
        try:
            started = await start_workers(setup, work, on_ready)
        finally:
            tick.cancel()
        bar.close(line=f"{ready['rollout']} rollout engine{'s' * (instances != 1)} and "
                       f"{ready['trainer']} trainer rank{'s' * (ready['trainer'] != 1)} ready "
                       "in {elapsed}")
    return started


async def start_workers(setup: RunSetup, work: str, on_ready=None) -> Started:
    """Every rollout instance and trainer rank started at once (engine starts overlap), on the
    run's placement (slot sizes, GPU seats, LoRA units); `on_ready(name)` is told of each
    worker that has sent Ready."""
    sup, team, settings, model_dirs = setup.sup, setup.team, setup.workers, setup.model_dirs

    async def start_worker(spec: WorkerSpec) -> WorkerHandle:
        handle = await sup.start_worker(spec)
        if on_ready is not None:
            on_ready(spec.name)
        return handle

    layout = slot_layout(team, settings.trainer_pool, settings.devices)
    gpus = place_gpus(team, layout.sizes, hosts(settings.devices.gpus, sup),
                      rollout=settings.rollout, trainer_device=settings.trainer.device,
                      devices=settings.devices, trainer_pool=settings.trainer_pool)
    if gpus.devices is not None:
        check_ray_gpus(sup, gpus.devices)
        log.warning("GPU placement (%s weight sync):\n%s", gpus.transfer, gpus.devices.table())
    time_shared = frozenset(layout.pinned)
    units = lora_units(team, model_dirs, settings.rollout, time_shared=time_shared)
    workers = Workers(sup, settings, model_dirs, work, layout.sizes, gpus, time_shared, units)
    placed = {unit: [workers.rollout(unit) for _ in range(n)] for unit, n in
              units.instances(team, settings.rollout.instances_per_agent).items()}
    slots = [workers.trainer_slot(k) for k in range(len(layout.sizes))]
    specs = [w for ws in placed.values() for w in ws]
    trainers_started = asyncio.gather(*(start_worker(w) for ws in slots for w in ws))
    try:
        if gpus.rollout and settings.devices.colocate:
            # Engines sharing a GPU start one after another: vLLM sizes its KV cache from the
            # GPU's free memory, which another engine starting beside it changes meanwhile.
            started = [await start_worker(w) for w in specs]
        else:
            started = await asyncio.gather(*(start_worker(w) for w in specs))
    except BaseException:  # the run stops; the trainers' starts go on and are reaped with it
        trainers_started.add_done_callback(lambda f: f.cancelled() or f.exception())
        raise
    handles = {h.name: h for h in [*started, *await trainers_started]}
    return Started(workers, layout, gpus, units, placed, slots, handles)
