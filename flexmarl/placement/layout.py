"""What goes where before any process starts: the trainer slots (their sizes, the time-shared
groups' own slots, devices.placement) and the GPU placement (flexmarl.placement.devices).

    team + trainer_pool + devices ─► slot_layout: the disaggregated agents' slots (shared, or
        one each with the LoRA agents of one base in one: trainer_pool.slots / slot_ranks /
        share_lora_base), then one slot per time-shared group, pinned to its agents
        ─► place_gpus: trainer ranks on GPUs of their own; a time-shared group's
        instances on its slot's GPUs (the two take turns: flexmarl.placement.timeshare),
        the other instances on GPUs of their own (or shared by memory: devices.colocate)
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from flexmarl import _compat, checks
from flexmarl.config.rollout import DIRECT, RolloutConfig
from flexmarl.config.sections import DevicesConfig
from flexmarl.config.training import TrainerPoolConfig
from flexmarl.config.sections import parse_gpus
from flexmarl.placement.devices import Ask, DevicePlacement, Host, place_devices
from flexmarl.placement.lora_units import lora_base, static_slots
from flexmarl.placement.timeshare import SLEEP_ON_CPU, time_shared_groups
from flexmarl.team import Team


@dataclass(frozen=True)
class SlotLayout:
    """The run's trainer slots: trainer-K has sizes[K] ranks; `pinned` (agent -> slot) gives
    each time-shared agent its group's slot; `groups`: the time-shared groups, in slot order."""

    sizes: list[int]
    pinned: dict[str, str] = field(default_factory=dict)
    groups: list[tuple[str, ...]] = field(default_factory=list)
    slot_of: dict[str, str] = field(default_factory=dict)
    """Static reservation (trainer_pool.slots = 0): each disaggregated agent's slot, its own or
    its LoRA base's (trainer_pool.share_lora_base; the TrainerPool binds them alike from the
    agents' model dirs). Empty for a shared pool."""

    def group_slot(self, agent: str) -> str:
        return self.pinned.get(agent, "")

    @property
    def lora_slots(self) -> dict[str, tuple[str, ...]]:
        """Static slots that several LoRA agents on one base share: slot -> its agents."""
        held: dict[str, list[str]] = {}
        for agent, slot in self.slot_of.items():
            held.setdefault(slot, []).append(agent)
        return {slot: tuple(agents) for slot, agents in held.items() if len(agents) > 1}


def slot_layout(team: Team, trainer_pool: TrainerPoolConfig,
                devices: DevicesConfig) -> SlotLayout:
    """The slots of the disaggregated agents (_slot_sizes; a static reservation gives the LoRA
    agents of one base one slot, trainer_pool.share_lora_base), then one per time-shared group
    (as many ranks as its largest agent needs); a ConfigError names a placement the team lacks,
    or the LoRA agents of one base that need different ranks."""
    trainable = [s.name for s in team.agents if s.trainable]
    try:
        groups = time_shared_groups(devices.placement, trainable, [s.name for s in team.agents])
    except ValueError as exc:
        raise checks.ConfigError(str(exc)) from None
    needs = {s.name: s.train_ranks or trainer_pool.ranks_per_agent
             for s in team.agents if s.trainable}
    shared = {a for g in groups for a in g}
    own = {a: n for a, n in needs.items() if a not in shared}
    bases = ({s.name: base for s in team.agents if s.name in own
              and (base := lora_base(s)) is not None}
             if trainer_pool.share_lora_base else {})
    sizes = _slot_sizes(trainer_pool, own, bases)
    slot_of = ({a: f"trainer-{k}" for k, (members, _) in enumerate(static_slots(own, bases))
                for a in members} if _static(trainer_pool) else {})
    pinned = {a: f"trainer-{len(sizes) + k}" for k, g in enumerate(groups) for a in g}
    return SlotLayout(sizes + [max(needs[a] for a in g) for g in groups], pinned, groups,
                      slot_of)


@dataclass
class GpuPlacement:
    """The run's GPU placement (None: no GPU worker) and its weight sync: which roles run on
    GPUs, and "stage", "nccl" or "ipc" (flexmarl.weights.direct)."""

    devices: DevicePlacement | None
    transfer: str
    rollout: bool
    trainer: bool

    def env(self, worker: str) -> dict[str, str]:
        return self.devices.env(worker) if self.devices is not None else {}

    def host(self, worker: str) -> str:
        # Local workers have no node; place_devices calls this machine "local".
        host = self.devices.host(worker) if self.devices is not None else ""
        return "" if host == LOCAL else host


LOCAL = "local"


def local_hosts(gpus: str) -> list[Host]:
    """This machine's GPUs the run may use (`gpus`: devices.gpus, of those torch sees)."""
    import torch
    return [Host(LOCAL, parse_gpus(gpus, torch.cuda.device_count()))]


def place_gpus(team: Team, sizes: list[int], hosts: list[Host], *, rollout: RolloutConfig,
              trainer_device: str, devices: DevicesConfig, trainer_pool: TrainerPoolConfig
              ) -> GpuPlacement:
    """Who gets GPUs (trainer ranks with trainer.device = "cuda"; vLLM instances whenever GPUs
    are there, torch-engine instances when the trainers are on GPU too), where
    (flexmarl.placement.devices), and how weights reach the engines."""
    have = any(h.gpus for h in hosts)
    r = rollout  # the section; `rollout` below: whether instances get GPUs
    trainer = trainer_device == "cuda"
    # vLLM on GPUs wherever there are some; the torch engine where the trainers are on GPU too
    # (a GPU node without vLLM), else on CPU as before.
    rollout = have and (r.backend == "vllm" or (r.backend == "torch" and trainer))
    dev = devices
    layout = slot_layout(team, trainer_pool, devices)
    # The run's slots (callers may hand in one per agent: _slot_sizes without the LoRA bases).
    sizes = layout.sizes if layout.groups or layout.lora_slots else sizes
    transfer = resolve_transfer(r.weight_transfer, vllm_on_gpu=rollout and r.backend == "vllm",
                                trainer_on_gpu=trainer, colocate=dev.colocate)
    if layout.groups:
        if r.backend == "vllm" and not have:
            raise checks.ConfigError(SLEEP_ON_CPU)
        if rollout != trainer:
            raise checks.ConfigError(
                f"devices.placement = {dev.placement!r}: a time-shared agent's engines and "
                "trainer take turns on the same devices, but here the engines run on "
                f"{'GPU' if rollout else 'CPU'} and the trainers on {'GPU' if trainer else 'CPU'}"
                ': set trainer.device = "cuda" with rollout.backend = "vllm" on a GPU machine, '
                'or both on CPU (rollout.backend = "torch", trainer.device = "cpu")')
        if transfer != "stage" and r.weight_transfer != "auto":
            raise checks.ConfigError(
                f"rollout.weight_transfer = {r.weight_transfer!r} sends from a trainer to awake "
                "engines, but a time-shared agent's trainer is parked while its engines run: "
                'use "stage" (or "auto") with devices.placement time_shared')
        transfer = "stage"
    if not (rollout or trainer):
        return GpuPlacement(None, transfer, False, False)
    # Static slots (one per agent, or per LoRA base): an instance goes near its agent's
    # trainer.
    group_of = layout.slot_of
    asks = []
    if trainer:
        asks += [Ask(f"trainer-{k}-{r}", "trainer", group=f"trainer-{k}",
                     memory=dev.trainer_memory_fraction)
                 for k, n in enumerate(sizes) for r in range(n)]
    if rollout:
        names = (f"rollout-{k}" for k in itertools.count())
        asks += [Ask(next(names), "rollout", r.tensor_parallel_size, label=spec.name,
                     memory=r.gpu_memory_utilization,
                     near=group_of.get(spec.name, "") if trainer else "",
                     inside=layout.group_slot(spec.name))
                 for spec in team.agents
                 for _ in range(spec.instances or r.instances_per_agent)]
    placed = place_devices(hosts, asks, colocate=dev.colocate, reserve=dev.reserve_fraction)
    unpaired = placed.unpaired(group_of) if transfer == "ipc" else []
    if unpaired:
        if r.weight_transfer == "ipc":
            raise checks.ConfigError(
                'rollout.weight_transfer = "ipc" needs every GPU of every instance to host a '
                "rank of its agent's trainer slot (one slot per agent; "
                f"rollout.tensor_parallel_size = {r.tensor_parallel_size} GPUs per instance, "
                "so at least as many trainer ranks, trainer_pool.ranks_per_agent, with room "
                f"for both on each GPU); {', '.join(unpaired)} are not. The placement is:\n"
                + placed.table())
        transfer = "stage"  # auto: instances apart from their trainers; NCCL cannot share a GPU
    return GpuPlacement(placed, transfer, rollout, trainer)

def resolve_transfer(setting: str, *, vllm_on_gpu: bool, trainer_on_gpu: bool,
                     colocate: bool) -> str:
    """rollout.weight_transfer for this run: "auto" is nccl (ipc when colocated) where vLLM and
    the trainers are on GPU, else stage; an explicit direct mode without GPUs, nccl with
    colocate and ipc without it are errors naming the settings."""
    gpu = vllm_on_gpu and trainer_on_gpu
    if setting == "auto":
        return ("ipc" if colocate else "nccl") if gpu else "stage"
    if setting in DIRECT and not gpu:
        raise checks.ConfigError(
            f'rollout.weight_transfer = "{setting}" needs vLLM and the trainers on GPU (a CUDA '
            f"build of vllm, trainer.device = \"cuda\", GPUs placed by [devices]); here vLLM is "
            f"{'on GPU' if vllm_on_gpu else 'not on GPU'} and the trainers "
            f"{'are' if trainer_on_gpu else 'are not'}: use \"stage\" or \"auto\"")
    if setting == "nccl" and colocate:
        # place_devices seats each instance on its agent's trainer GPUs first (on one GPU:
        # always), and NCCL refuses two ranks of one group on one device.
        raise checks.ConfigError('rollout.weight_transfer = "nccl" cannot be used with '
                          "devices.colocate = true: instances then share GPUs with their "
                          "trainer, and NCCL refuses two ranks of one group on one GPU; use "
                          '"ipc" (or "auto") with colocate, or devices.colocate = false')
    if setting == "ipc" and not colocate:
        raise checks.ConfigError('rollout.weight_transfer = "ipc" needs each instance on its trainer\'s '
                          "GPUs: set devices.colocate = true, or use \"nccl\"")
    return setting


def _slot_sizes(trainer_pool: TrainerPoolConfig, needs: dict[str, int],
                bases: dict[str, str] | None = None) -> list[int]:
    """Ranks of each trainer slot: one per agent of its size (static; one per LoRA base for the
    agents in `bases`, agent -> its base: lora_units.static_slots), `trainer_pool.slots` of
    ranks_per_agent each, or the explicit `trainer_pool.slot_ranks` list (a shared pool).
    slots = "auto" (not planned yet): one per agent."""
    if trainer_pool.slot_ranks and needs:
        return [int(x) for x in trainer_pool.slot_ranks.split(",")]
    if trainer_pool.slots == "auto":
        return list(needs.values())
    if trainer_pool.slots and needs:
        return [trainer_pool.ranks_per_agent] * trainer_pool.slots
    try:
        return [ranks for _, ranks in static_slots(needs, bases or {})]
    except ValueError as exc:  # one base's agents need different ranks: the fixes named
        raise checks.ConfigError(str(exc)) from None


def _static(trainer_pool: TrainerPoolConfig) -> bool:
    """trainer_pool.static, False for slots = "auto" (not planned yet)."""
    return not trainer_pool.slot_ranks and trainer_pool.slots == 0


def check_devices(team: Team, remote: bool, *, rollout: RolloutConfig, trainer_device: str,
                  devices: DevicesConfig, trainer_pool: TrainerPoolConfig) -> None:
    """At start, for workers on this machine (not cluster.remote): the GPU placement fits (one
    PlacementError listing what was asked and what exists, before any process starts)."""
    if remote:
        return  # placed on the cluster's GPUs: the nodes' once they join, or Ray's
    place_gpus(team, slot_layout(team, trainer_pool, devices).sizes, local_hosts(devices.gpus),
              rollout=rollout, trainer_device=trainer_device, devices=devices,
              trainer_pool=trainer_pool)


__getattr__ = _compat.renamed_getattr(__name__, globals())  # the old names, until REMOVED_IN
