"""The simulator's cost model: service times from bytes, FLOPs and bandwidths (costs.toml).

    decode step  = max(weights + KV of the batch / (devices x HBM bandwidth x efficiency),
                       2 x params x batch / (devices x peak x decode_mfu)) + step overhead
    prefill      = 2 x params x prompt tokens / (devices x peak x prefill_mfu)
    train        = 6 x params x tokens / (active devices x peak x mfu), active devices =
                   min(slot devices, rows x max_devices_per_sequence); step = state passes
    swap out     = offload: each rank's shard to host memory of its node; the nodes in
                   parallel, a node's ranks sharing its host link: state bytes / (nodes x host
                   bandwidth per node x swap_host_efficiency)
    swap in      = onload (the same, back) when the agent is parked in the slot; from another
                   slot: move (rank to rank over the network, the nodes of the smaller side
                   limiting: state bytes / (min(nodes) x move bandwidth per node x
                   swap_move_efficiency)) + onload
    weight sync  = weight bytes / sync bandwidth (per instance, instances in parallel)
    colocation   = bytes the devices must hold for the next mode / (nodes x host bandwidth)
    state save   = staged: each rank's shards to host memory of its node (as swap out's host
                   transfer, the slot waits), then written to the scratch dir in memory (the
                   same again; the agent's next batch waits); the durable copy to disk:
                   state bytes / storage write bandwidth, in the background; a restore reads
                   the snapshot back from memory (the same as a stage)

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
    host_bandwidth_per_node: float
    sync_bandwidth: float
    move_bandwidth_per_node: float
    swap_host_efficiency: float
    swap_move_efficiency: float


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
    models: dict[str, Model]

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
        return m.weight_bytes / self.links.sync_bandwidth

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

    def state_write_s(self, m: Model) -> float:
        return self.state_bytes(m) / self.storage.write_bandwidth



    def host_transfer_s(self, num_bytes: float, devices: int) -> float:
        return num_bytes / (self.nodes(devices) * self.links.host_bandwidth_per_node)

    def nodes(self, devices: int) -> int:
        return max(1, math.ceil(devices / self.device.devices_per_node))

    # ------------------------------------------------------------------ swaps

    def offload_s(self, num_bytes: float, devices: int) -> float:
        """A slot's SwapOut: every rank's shard to host memory of its own node, nodes in
        parallel (the ranks of a node share its host link)."""
        return self.host_transfer_s(num_bytes, devices) / self.links.swap_host_efficiency

    def onload_s(self, num_bytes: float, devices: int) -> float:
        """A SwapIn of an agent parked in the slot: the same bytes back, in place."""
        return self.offload_s(num_bytes, devices)

    def move_s(self, num_bytes: float, src_devices: int, devices: int) -> float:
        """A SwapIn from another slot, before its onload: every rank pulls its slices from the
        source's ranks, all at once; each node's network link carries its ranks' share, so the
        side with fewer nodes limits."""
        nodes = min(self.nodes(src_devices), self.nodes(devices))
        return num_bytes / (nodes * self.links.move_bandwidth_per_node
                            * self.links.swap_move_efficiency)


def load_costs(path: str | Path = DEFAULT_PATH, **overrides: Any) -> Costs:
    """The cost model of `path`; `overrides` as {"section.key": value} (e.g. train.mfu=0.4)."""
    raw = tomllib.loads(Path(path).read_text())
    for key, value in overrides.items():
        section, _, name = key.partition(".")
        if section not in raw or name not in raw[section]:
            raise ValueError(f"cost model has no parameter {key!r}")
        raw[section][name] = value

    def build(cls: type, section: dict, where: str) -> Any:
        names = {f.name for f in fields(cls)} - {"name"}
        missing, unknown = names - set(section), set(section) - names
        if missing or unknown:
            raise ValueError(f"cost model [{where}]: missing {sorted(missing)}, unknown "
                             f"{sorted(unknown)}")
        return section

    models = {name: Model(name=name, **build(Model, sec, f"models.{name}"))
              for name, sec in raw.get("models", {}).items()}
    return Costs(Device(**build(Device, raw["device"], "device")),
                 Rollout(**build(Rollout, raw["rollout"], "rollout")),
                 Train(**build(Train, raw["train"], "train")),
                 Links(**build(Links, raw["links"], "links")),
                 Storage(**build(Storage, raw["storage"], "storage")), models)
