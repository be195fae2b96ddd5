"""The simulator's cost model: service times from bytes, FLOPs and bandwidths (costs.toml).

    decode step  = max(weights + KV of the batch / (devices x HBM bandwidth x efficiency),
                       2 x params x batch / (devices x peak x decode_mfu)) + step overhead
    prefill      = 2 x params x prompt tokens / (devices x peak x prefill_mfu)
    train        = 6 x params x tokens / (active devices x peak x mfu), active devices =
                   min(slot devices, rows x max_devices_per_sequence); step = state passes
    forward      = 2 x params x tokens / (devices x peak x mfu) (MARTI's experience pass)
    host copy    = bytes / (host rate x swap_host_efficiency), host rate = min(devices x
                   host link per device, nodes x host memory per node): each device its own
                   PCIe link, a node's devices sharing its host memory. Every host transfer
                   pays it, both ways: swaps out and in, snapshots, the colocated systems'
                   mode switches (the outgoing mode's bytes out, the incoming mode's in)
    move         = a SwapIn from another slot, before its onload: rank to rank over RDMA, the
                   side with fewer devices limiting: bytes / (min(devices) x RDMA per device x
                   swap_move_efficiency)
    weight sync  = weight bytes / (instance devices x RDMA per device x link efficiency), per
                   instance, instances in parallel; over NVLink where the trainer shares the
                   instance's devices (time-shared groups, MARTI)
    state save   = staged: each rank's shards to host memory (a host copy, the slot waits),
                   then written to the scratch dir in memory (the same again; the agent's next
                   batch waits); the durable copy to disk: state bytes / storage write
                   bandwidth, in the background; a restore reads the snapshot back from
                   memory (a host copy)

PROFILES names the cost files: "gpu" (costs.toml, the default: links from GPU measurements)
and "cpu-calibrated" (costs_cpu.toml: the swap path's efficiencies measured on this CPU
machine, the pessimistic row). A file may start with `extends = "other.toml"` and give only
what differs.
Attention FLOPs, prefix caching and preemption are left out (see bench/README.md).
"""
from __future__ import annotations

import dataclasses
import math
import tomllib
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

DEFAULT_PATH = Path(__file__).with_name("costs.toml")
PROFILES = {"gpu": DEFAULT_PATH, "cpu-calibrated": Path(__file__).with_name("costs_cpu.toml")}
"""Named cost files (bench/simulate.py --costs, plan.costs)."""


@dataclass(frozen=True)
class Device:
    memory_bytes: float
    hbm_bandwidth: float
    peak_flops: float
    devices_per_node: int


@dataclass(frozen=True)
class Rollout:
    decode_bandwidth_efficiency: float
    decode_step_overhead_s: float
    prefill_mfu: float
    decode_mfu: float
    max_num_seqs: int
    length_sigma: float
    max_response_tokens: int
    segment_tokens: int


@dataclass(frozen=True)
class Train:
    mfu: float
    flops_per_token_per_param: float
    max_devices_per_sequence: int
    state_bytes_per_param: float
    optimizer_passes: float
    state_memory_fraction: float


@dataclass(frozen=True)
class Links:
    host_link_per_device: float
    host_memory_per_node: float
    nvlink_per_device: float
    rdma_per_device: float
    link_efficiency: float
    swap_host_efficiency: float
    swap_move_efficiency: float


@dataclass(frozen=True)
class Baselines:
    experience_forwards: float
    offload_bytes_per_param: float


@dataclass(frozen=True)
class Storage:
    write_bandwidth: float


@dataclass(frozen=True)
class Model:
    name: str
    params: float
    layers: int
    kv_heads: int
    head_dim: int
    rollout_devices: int
    train_devices: int

    @property
    def weight_bytes(self) -> float:
        return 2.0 * self.params  # bf16

    @property
    def kv_bytes_per_token(self) -> float:
        return 2.0 * self.layers * self.kv_heads * self.head_dim * 2  # K and V, bf16


@dataclass(frozen=True)
class Costs:
    device: Device
    rollout: Rollout
    train: Train
    links: Links
    storage: Storage
    baselines: Baselines
    models: dict[str, Model]
    name: str = "gpu"
    """The profile (or file) these costs came from, for tables."""

    # ------------------------------------------------------------------ rollout

    def decode_step_s(self, m: Model, batch: int, context_tokens: float) -> float:
        d, r = self.device, self.rollout
        memory = (m.weight_bytes + m.kv_bytes_per_token * context_tokens) / (
            m.rollout_devices * d.hbm_bandwidth * r.decode_bandwidth_efficiency)
        compute = 2.0 * m.params * batch / (m.rollout_devices * d.peak_flops * r.decode_mfu)
        return max(memory, compute) + r.decode_step_overhead_s

    def prefill_s(self, m: Model, prompt_tokens: int) -> float:
        return 2.0 * m.params * prompt_tokens / (
            m.rollout_devices * self.device.peak_flops * self.rollout.prefill_mfu)

    def kv_capacity_tokens(self, m: Model) -> float:
        free = m.rollout_devices * self.device.memory_bytes * 0.9 - m.weight_bytes
        return max(free, 0.0) / m.kv_bytes_per_token

    def weight_load_s(self, m: Model) -> float:
        """A trainer's weights onto one instance over RDMA (each of its devices a rail)."""
        link = self.links
        return m.weight_bytes / (m.rollout_devices * link.rdma_per_device * link.link_efficiency)

    def local_weight_load_s(self, m: Model) -> float:
        """The same from a trainer on the instance's own devices (NVLink / CUDA IPC)."""
        link = self.links
        return m.weight_bytes / (m.rollout_devices * link.nvlink_per_device
                                 * link.link_efficiency)

    # ------------------------------------------------------------------ training

    def active_train_devices(self, devices: int, rows: int) -> int:
        return max(1, min(devices, rows * self.train.max_devices_per_sequence))

    def train_s(self, m: Model, devices: int, rows: int, tokens: int) -> float:
        t = self.train
        return t.flops_per_token_per_param * m.params * tokens / (
            self.active_train_devices(devices, rows) * self.device.peak_flops * t.mfu)

    def optimizer_s(self, m: Model, devices: int) -> float:
        t = self.train
        return t.optimizer_passes * t.state_bytes_per_param * m.params / (
            devices * self.device.hbm_bandwidth)

    def state_bytes(self, m: Model) -> float:
        return self.train.state_bytes_per_param * m.params

    def min_train_devices(self, m: Model) -> int:
        """The fewest devices (a power of two) whose memory holds the model's training state
        within train.state_memory_fraction."""
        need = self.state_bytes(m) / (self.device.memory_bytes * self.train.state_memory_fraction)
        return 1 << max(0, math.ceil(math.log2(max(need, 1.0))))

    def with_train_devices(self, devices: dict[str, int]) -> "Costs":
        """These costs with the trainer slot of each named model size `devices[size]` big."""
        return dataclasses.replace(self, models={
            name: dataclasses.replace(m, train_devices=devices.get(name, m.train_devices))
            for name, m in self.models.items()})

    def forward_s(self, m: Model, devices: int, tokens: float) -> float:
        """One forward pass over `tokens` on `devices` (no backward)."""
        return 2.0 * m.params * tokens / (devices * self.device.peak_flops * self.train.mfu)

    def state_write_s(self, m: Model) -> float:
        return self.state_bytes(m) / self.storage.write_bandwidth

    def host_rate(self, devices: int) -> float:
        """Bytes/s between `devices` and their nodes' host memory, all at once: each device
        its own link, each node's memory shared by its devices."""
        link = self.links
        return min(devices * link.host_link_per_device,
                   self.nodes(devices) * link.host_memory_per_node)

    def host_transfer_s(self, num_bytes: float, devices: int) -> float:
        """A host copy (pinned memory) of `num_bytes` spread over `devices`."""
        if num_bytes <= 0:
            return 0.0
        return num_bytes / (self.host_rate(devices) * self.links.swap_host_efficiency)

    def nodes(self, devices: int) -> int:
        return max(1, math.ceil(devices / self.device.devices_per_node))

    # ------------------------------------------------------------------ swaps

    def offload_s(self, num_bytes: float, devices: int) -> float:
        """A slot's SwapOut: every rank's shard to host memory of its own node, all at once."""
        return self.host_transfer_s(num_bytes, devices)

    def onload_s(self, num_bytes: float, devices: int) -> float:
        """A SwapIn of an agent parked in the slot: the same bytes back, in place."""
        return self.offload_s(num_bytes, devices)

    def switch_s(self, out_bytes: float, in_bytes: float, devices: int) -> float:
        """A colocated group's change of mode: the outgoing mode's bytes to host memory, then
        the incoming mode's onto the devices (vLLM sleep / wake_up, a trainer's offload /
        reload), both at the swap path's host efficiency."""
        return self.offload_s(out_bytes, devices) + self.onload_s(in_bytes, devices)

    def move_s(self, num_bytes: float, src_devices: int, devices: int) -> float:
        """A SwapIn from another slot, before its onload: every rank pulls its slices from the
        source's ranks, all at once, each device over its own rail; the side with fewer
        devices limits."""
        return num_bytes / (min(src_devices, devices) * self.links.rdma_per_device
                            * self.links.swap_move_efficiency)


def load_costs(path: str | Path = DEFAULT_PATH, **overrides: Any) -> Costs:
    """The cost model of `path` (a file, or a name of PROFILES); `overrides` as
    {"section.key": value} (e.g. train.mfu=0.4)."""
    name = str(path) if str(path) in PROFILES else Path(path).stem
    raw = _read(Path(PROFILES.get(str(path), path)))
    for key, value in overrides.items():
        section, _, key_name = key.partition(".")
        if section not in raw or key_name not in raw[section]:
            raise ValueError(f"cost model has no parameter {key!r}")
        raw[section][key_name] = value

    def build(cls: type, section: dict, where: str) -> Any:
        names = {f.name for f in fields(cls)} - {"name"}
        missing, unknown = names - set(section), set(section) - names
        if missing or unknown:
            raise ValueError(f"cost model [{where}]: missing {sorted(missing)}, unknown "
                             f"{sorted(unknown)}")
        return section

    models = {m: Model(name=m, **build(Model, sec, f"models.{m}"))
              for m, sec in raw.get("models", {}).items()}
    return Costs(Device(**build(Device, raw["device"], "device")),
                 Rollout(**build(Rollout, raw["rollout"], "rollout")),
                 Train(**build(Train, raw["train"], "train")),
                 Links(**build(Links, raw["links"], "links")),
                 Storage(**build(Storage, raw["storage"], "storage")),
                 Baselines(**build(Baselines, raw["baselines"], "baselines")), models,
                 name="gpu" if name == "costs" else name)


def _read(path: Path) -> dict:
    """A cost file's tables; `extends = "base.toml"` (beside it) first, then its own keys."""
    raw = tomllib.loads(path.read_text())
    base = raw.pop("extends", None)
    if base is None:
        return raw
    merged = _read(path.with_name(base))
    for section, values in raw.items():
        if section == "models":
            for m, sec in values.items():
                merged.setdefault("models", {}).setdefault(m, {}).update(sec)
        else:
            merged.setdefault(section, {}).update(values)
    return merged
