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
    weight sync  (pricing "new", issue 54: each price beside the product function it models)
                   gather    = bytes x (n - 1) / n / (link x link efficiency): the trainer's
                               n ranks all-gather the full weights (NVLink in a node, the
                               rails across nodes); paid by the trainer, its slot held
                   direct    = gather + bytes / (one rail x link efficiency): rank 0's NCCL
                               broadcast to every instance (flexmarl.weights.direct), pipelined:
                               each receiver gets the bytes once, whatever their number
                   published = publish (gather + rank 0's copy to host memory over its PCIe
                               link + one process writing the file into /dev/shm), once per
                               version; then per instance a read (the same host: the file is
                               mapped, nothing more; another host: the bytes fetched from the
                               trainer's host, whose link all remote receivers share) and a load
                               (host -> device over the instance's own PCIe links)
                   MARTI     = gather (ZeRO-3) + CUDA IPC over NVLink, agent after agent
    weight sync  (pricing "old", before issue 54) = weight bytes / (instance devices x RDMA per
                   device x link efficiency), per instance, instances in parallel, no gather;
                   over NVLink where the trainer shares the instance's devices (time-shared
                   groups, MARTI)
    state save   = staged: each rank's shards to host memory (a host copy, the slot waits),
                   then written to the scratch dir in memory (the same again; the agent's next
                   batch waits); the durable copy to disk: state bytes / storage write
                   bandwidth, in the background; a restore reads the snapshot back from
                   memory (a host copy)

LoRA adapter agents (Preset.lora; flexmarl.models.lora): a model key "14b+lora16" is the 14b
base with a rank-16 adapter on q/k/v/o_proj ("14b+lora16:q_proj,v_proj": other targets),
resolved by Costs.model; a rollout unit (the LoRA agents on one base) serves one base and its
members' adapters (Costs.unit_model). Their prices:

    adapter params  = layers x sum over targeted Linears (in, out) of rank x (in + out)
                      (PEFT's A: rank x in, B: out x rank), shapes from the model's config
                      (hidden, intermediate, heads); a model without them: hidden =
                      sqrt(params / (12 x layers)), intermediate = 4 x hidden (stated
                      approximation: a decoder block holds ~12 hidden^2 parameters)
    trainer state   = the frozen base's weights (bf16, as weight_bytes) + adapter params x
                      train.state_bytes_per_param (its weights, master copy, AdamW, grads)
    swap, snapshot  = the adapter's state only (the base stays on the slot's devices; a slot
                      whose devices hold another base, or a full agent, loads the base from host
                      memory too), as the product's swap does (flexmarl.training.parking:
                      each slot rank keeps one resident base for the LoRA agents on it)
    sync            = the adapter's weights (bf16) per instance; the base is never sent
    train           = train.lora_flops_per_token_per_param x base params (forward 2 +
                      activation gradients 2: no weight gradients for the frozen base) + the
                      full 6 x adapter params, per token; the optimizer steps the adapter only
    rollout         = one base per instance + every member's adapter (bf16) in memory; a
                      decode step reads them all and costs rollout.lora_step_overhead_s more
                      (multi-LoRA kernels), its FLOPs 2 x (params + the largest adapter)

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
PRICINGS = ("new", "old")
"""Costs.pricing: the weight syncs and reference forwards as issue 54 prices them, or before."""


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
    lora_step_overhead_s: float = 0.0
    """Added to a decode step of an instance serving LoRA adapters (costs.toml: Punica's)."""


@dataclass(frozen=True)
class Train:
    mfu: float
    flops_per_token_per_param: float
    max_devices_per_sequence: int
    state_bytes_per_param: float
    optimizer_passes: float
    state_memory_fraction: float
    lora_flops_per_token_per_param: float = 4.0
    """A LoRA agent's training FLOPs per base parameter per token (forward 2 + activation
    gradients 2; costs.toml says where the number comes from)."""


@dataclass(frozen=True)
class Links:
    host_link_per_device: float
    host_memory_per_node: float
    nvlink_per_device: float
    rdma_per_device: float
    link_efficiency: float
    swap_host_efficiency: float
    swap_move_efficiency: float
    host_write_per_process: float = 11.8e9
    """Bytes/s one process copies into a file in host memory (/dev/shm): a published
    version's write (costs.toml says where the number comes from)."""


@dataclass(frozen=True)
class Baselines:
    experience_forwards: float
    offload_bytes_per_param: float


@dataclass(frozen=True)
class Storage:
    write_bandwidth: float


LORA_DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")
"""LoraSpec's default target_modules: a key without ":targets" means these."""


@dataclass(frozen=True)
class Model:
    name: str
    params: float
    layers: int
    kv_heads: int
    head_dim: int
    rollout_devices: int
    train_devices: int
    hidden: int = 0
    """hidden_size of the model's config (0: unknown, approximated from params; see
    `linear_shapes`)."""
    intermediate: int = 0
    """intermediate_size (the MLP's width); 0: 4 x hidden."""
    heads: int = 0
    """num_attention_heads; 0: hidden / head_dim."""
    lora_rank: int = 0
    """> 0: a LoRA agent's model: this base (frozen) + an adapter of this rank."""
    lora_targets: tuple[str, ...] = ()
    """The adapter's target_modules (the Linears of `linear_shapes`)."""
    base: str = ""
    """A LoRA agent's (or a rollout unit's) base model key; "": the model itself."""
    served_adapters: tuple[float, ...] = ()
    """A rollout unit's instance: the parameters of each adapter it serves besides the base."""

    @property
    def weight_bytes(self) -> float:
        """The (base) model's weights, bf16."""
        return 2.0 * self.params  # bf16

    @property
    def is_adapter(self) -> bool:
        return self.lora_rank > 0

    def linear_shapes(self) -> dict[str, tuple[int, int]]:
        """(in, out) of each Linear of a decoder block a LoRA can target (Llama/Qwen2 names).
        Without the config's shapes: hidden = sqrt(params / (12 x layers)) (a block holds ~4
        hidden^2 of attention and ~8 hidden^2 of MLP), intermediate = 4 x hidden."""
        hidden = self.hidden or round(math.sqrt(self.params / (12 * self.layers)))
        inter = self.intermediate or 4 * hidden
        q = (self.heads or hidden // self.head_dim) * self.head_dim
        kv = self.kv_heads * self.head_dim
        return {"q_proj": (hidden, q), "k_proj": (hidden, kv), "v_proj": (hidden, kv),
                "o_proj": (q, hidden), "gate_proj": (hidden, inter), "up_proj": (hidden, inter),
                "down_proj": (inter, hidden)}

    @property
    def adapter_params(self) -> float:
        """A LoRA agent's adapter: rank x (in + out) per targeted Linear per layer (PEFT's
        lora_A is rank x in, lora_B out x rank); 0 for a full model."""
        if not self.is_adapter:
            return 0.0
        shapes = self.linear_shapes()
        return float(self.layers * sum(self.lora_rank * sum(shapes[t])
                                       for t in self.lora_targets))

    @property
    def trainable_params(self) -> float:
        """What trains (gradients, optimizer state): the adapter, or every parameter."""
        return self.adapter_params if self.is_adapter else self.params

    @property
    def adapter_bytes(self) -> float:
        """The adapter's weights, bf16 as the base's (0 for a full model)."""
        return 2.0 * self.adapter_params

    @property
    def sync_bytes(self) -> float:
        """What one weight sync sends to each instance: the adapter only, or the weights."""
        return self.adapter_bytes if self.is_adapter else self.weight_bytes

    @property
    def served_bytes(self) -> float:
        """Weights one rollout instance holds: the base and every adapter it serves (bf16)."""
        return self.weight_bytes + 2.0 * sum(self.served_adapters)

    @property
    def kv_bytes_per_token(self) -> float:
        return 2.0 * self.layers * self.kv_heads * self.head_dim * 2  # K and V, bf16


@dataclass(frozen=True)
class Costs:
    """The cost model: one formula per priced event (a decode step, a prefill, a train step, a
    swap, a sync, a switch...), each a method over the tables above. A table of formulas, not a
    class with jobs: it keeps more than 20 methods (the house's line for classes, STYLE.md) on
    purpose, so that every price the simulator charges is found in one place."""

    device: Device
    rollout: Rollout
    train: Train
    links: Links
    storage: Storage
    baselines: Baselines
    models: dict[str, Model]
    name: str = "gpu"
    """The profile (or file) these costs came from, for tables."""
    pricing: str = "new"
    """PRICINGS: "new" (issue 54: weight syncs as the product runs them, gathers priced, one
    KL setting for every system) or "old" (before: syncs over each instance's own rails or
    NVLink, no gather; MARTI's reference forward always, FlexMARL's never), to show both."""

    # ------------------------------------------------------------------ rollout

    def decode_step_s(self, m: Model, batch: int, context_tokens: float) -> float:
        d, r = self.device, self.rollout
        memory = (m.served_bytes + m.kv_bytes_per_token * context_tokens) / (
            m.rollout_devices * d.hbm_bandwidth * r.decode_bandwidth_efficiency)
        compute = 2.0 * _served_params(m) * batch / (
            m.rollout_devices * d.peak_flops * r.decode_mfu)
        lora = r.lora_step_overhead_s if m.served_adapters else 0.0
        return max(memory, compute) + r.decode_step_overhead_s + lora

    def prefill_s(self, m: Model, prompt_tokens: int) -> float:
        return 2.0 * _served_params(m) * prompt_tokens / (
            m.rollout_devices * self.device.peak_flops * self.rollout.prefill_mfu)

    def kv_capacity_tokens(self, m: Model) -> float:
        free = m.rollout_devices * self.device.memory_bytes * 0.9 - m.served_bytes
        return max(free, 0.0) / m.kv_bytes_per_token

    # ------------------------------------------------------------------ weight sync

    def weight_load_s(self, m: Model) -> float:
        """Pricing "old": a trainer's weights (a LoRA agent's: its adapter) onto one instance
        over RDMA, each of its devices a rail of its own, no gather."""
        link = self.links
        return m.sync_bytes / (m.rollout_devices * link.rdma_per_device * link.link_efficiency)

    def local_weight_load_s(self, m: Model) -> float:
        """The same from a trainer on the instance's own devices (NVLink / CUDA IPC): MARTI's
        `_broadcast_to_vllm` under colocate_all_models (both pricings); pricing "old" also
        FlexMARL's time-shared engines."""
        link = self.links
        return m.sync_bytes / (m.rollout_devices * link.nvlink_per_device
                               * link.link_efficiency)

    def gather_s(self, m: Model, devices: int) -> float:
        """The full weights gathered from a trainer's `devices` ranks (FSDP2's full state dict
        for flexmarl.weights.direct's send and flexmarl.weights.published.publish; MARTI's
        ZeRO-3 GatheredParameters): an all-gather, each rank receiving (n - 1) / n of the bytes
        (NCCL's bus bandwidth), over NVLink within a node, over the rails across nodes."""
        if devices <= 1:
            return 0.0
        link = self.links
        rate = (link.nvlink_per_device if devices <= self.device.devices_per_node
                else link.rdma_per_device) * link.link_efficiency
        return m.sync_bytes * (devices - 1) / devices / rate

    def broadcast_s(self, m: Model) -> float:
        """flexmarl.weights.direct: the trainer's rank 0 broadcasts the gathered weights over
        NCCL to every instance's devices. NCCL pipelines a broadcast (ring or tree), so every
        rank receives the bytes once and the time is bytes / bus bandwidth, which for broadcast
        is the algorithm bandwidth (nccl-tests PERFORMANCE.md): one rail, the source's, whatever
        the number of receivers."""
        return m.sync_bytes / (self.links.rdma_per_device * self.links.link_efficiency)

    def publish_s(self, m: Model, devices: int) -> float:
        """flexmarl.weights.published.publish, once per version, by the trainer's rank 0: the
        gather, the bytes to host memory over rank 0's own PCIe link (export_weights' CPU
        copy, at the pinned-copy rate: optimistic, it is pageable), then its copy into the
        version's file in /dev/shm (rewritten in place, mapped)."""
        link = self.links
        return (self.gather_s(m, devices)
                + m.sync_bytes / (link.host_link_per_device * link.swap_host_efficiency)
                + m.sync_bytes / link.host_write_per_process)

    def fetch_s(self, m: Model, receivers: int) -> float:
        """flexmarl.weights.published.read on another host than the trainer's: FetchWeights to
        the trainer, which sends the file's bytes to each of the `receivers` remote instances
        through its host's link (one rail), shared by all of them, so each waits for all.
        Read on the trainer's own host the file is mapped (safetensors' load_file): free here,
        its bytes paid by the load."""
        return m.sync_bytes * receivers / (self.links.rdma_per_device * self.links.link_efficiency)

    def host_load_s(self, m: Model) -> float:
        """An instance's load of weights in host memory (engine.load_weights after a published
        read; vLLM's weight loaders copy each host tensor into its device parameter, which is
        the load): host -> device over the instance's own PCIe links (one per device), each
        device its share of the node's host memory (every instance of a full node loading at
        once), at the pinned-copy efficiency."""
        link = self.links
        rate = min(m.rollout_devices * link.host_link_per_device,
                   link.host_memory_per_node * m.rollout_devices / self.device.devices_per_node)
        return m.sync_bytes / (rate * link.swap_host_efficiency)

    def sync_s(self, m: Model, devices: int, *, published: bool) -> float:
        """One sync of an agent whose trainer has `devices` ranks, to an instance on another
        host alone (the zero-staleness bound's tail): published (publish, fetch, load) or
        direct (gather, broadcast); pricing "old": weight_load_s."""
        if self.pricing == "old":
            return self.weight_load_s(m)
        if published:
            return self.publish_s(m, devices) + self.fetch_s(m, 1) + self.host_load_s(m)
        return self.gather_s(m, devices) + self.broadcast_s(m)

    def with_pricing(self, pricing: str) -> "Costs":
        """These costs under `pricing` (one of PRICINGS)."""
        if pricing not in PRICINGS:
            raise ValueError(f"unknown pricing {pricing!r}; pricings: {', '.join(PRICINGS)}")
        return dataclasses.replace(self, pricing=pricing)

    # ------------------------------------------------------------------ models

    def model(self, key: str) -> Model:
        """The model of a key: a size of the cost file ("14b"), or a LoRA agent's base and
        adapter ("14b+lora16", "14b+lora16:q_proj,v_proj"; lora_key)."""
        if key in self.models:
            return self.models[key]
        base, sep, spec = key.partition("+lora")
        if not sep or base not in self.models:
            raise KeyError(f"cost model has no model {key!r} (models: "
                           f"{', '.join(self.models)}; a LoRA agent's: BASE+loraRANK)")
        rank_text, _, targets_text = spec.partition(":")
        rank = int(rank_text)
        targets = tuple(targets_text.split(",")) if targets_text else LORA_DEFAULT_TARGETS
        m = self.models[base]
        unknown = [t for t in targets if t not in m.linear_shapes()]
        if rank < 1 or unknown:
            raise KeyError(f"LoRA model {key!r}: rank must be >= 1 and targets among "
                           f"{', '.join(m.linear_shapes())} (unknown: {unknown})")
        return dataclasses.replace(m, name=key, lora_rank=rank, lora_targets=targets, base=base)

    def unit_model(self, base: str, members: list[Model]) -> Model:
        """A rollout instance of a LoRA unit: `base` serving each member's adapter."""
        m = self.model(base)
        return dataclasses.replace(m, name=f"{base}+{len(members)} adapters", base=base,
                                   served_adapters=tuple(a.adapter_params for a in members))

    # ------------------------------------------------------------------ training

    def active_train_devices(self, devices: int, rows: int) -> int:
        return max(1, min(devices, rows * self.train.max_devices_per_sequence))

    def train_flops_per_token(self, m: Model) -> float:
        """Full: flops_per_token_per_param x params. LoRA: the base's forward and activation
        gradients (lora_flops_per_token_per_param x params: its weights get no gradient) +
        the adapter's whole forward and backward."""
        t = self.train
        if m.is_adapter:
            return t.lora_flops_per_token_per_param * m.params \
                + t.flops_per_token_per_param * m.adapter_params
        return t.flops_per_token_per_param * m.params

    def train_s(self, m: Model, devices: int, rows: int, tokens: int, *,
                reference: bool = False) -> float:
        """A micro-batch's forward and backward; `reference` (trainer.kl_coef > 0, pricing
        "new"): plus the frozen reference model's forward over it, 2 FLOPs per parameter per
        token (flexmarl.training.trainer's _reference_logprobs; a LoRA agent's reference is
        its base, the same FLOPs)."""
        flops = self.train_flops_per_token(m) + (2.0 * m.params if reference else 0.0)
        return flops * tokens / (
            self.active_train_devices(devices, rows) * self.device.peak_flops * self.train.mfu)

    def reference(self, kl_coef: float) -> bool:
        """Does FlexMARL's trainer run its reference forward? kl_coef > 0 (pricing "old":
        never, as before issue 54)."""
        return kl_coef > 0 and self.pricing != "old"

    def experience_forwards(self, kl_coef: float) -> float:
        """Forwards per agent in MARTI's experience pass: its actor's (baselines.
        experience_forwards), and its reference model's where kl_coef > 0, the one setting
        every system of a comparison runs with (pricing "old": the reference always)."""
        ref = self.pricing == "old" or kl_coef > 0
        return self.baselines.experience_forwards + (1.0 if ref else 0.0)

    def optimizer_s(self, m: Model, devices: int) -> float:
        """AdamW over what trains (a LoRA agent: its adapter only)."""
        t = self.train
        return t.optimizer_passes * t.state_bytes_per_param * m.trainable_params / (
            devices * self.device.hbm_bandwidth)

    def state_bytes(self, m: Model) -> float:
        """A trainer's state on its devices: every parameter's training state, or (LoRA) the
        frozen base's weights + the adapter's training state."""
        if m.is_adapter:
            return m.weight_bytes + self.train.state_bytes_per_param * m.adapter_params
        return self.train.state_bytes_per_param * m.params

    def swap_bytes(self, m: Model) -> float:
        """What a swap moves and a snapshot saves: the whole state, or (LoRA) the adapter's
        training state only (the frozen base stays resident in the slot, as in the product:
        flexmarl.training.parking.ResidentBase)."""
        if m.is_adapter:
            return self.train.state_bytes_per_param * m.adapter_params
        return self.state_bytes(m)

    def slot_capacity(self, m: Model, devices: int) -> int:
        """How many agents of model `m` have their training states on a slot of `devices` at
        once, within train.state_memory_fraction of its memory: full copies one state each,
        LoRA agents on one base the base once plus one adapter state each."""
        room = devices * self.device.memory_bytes * self.train.state_memory_fraction
        if m.is_adapter:
            each = self.swap_bytes(m)
            return max(0, int((room - m.weight_bytes) // each)) if room >= m.weight_bytes \
                else 0
        return int(room // self.state_bytes(m))

    def min_train_devices(self, m: Model) -> int:
        """The fewest devices (a power of two) whose memory holds the model's training state
        within train.state_memory_fraction."""
        need = self.state_bytes(m) / (self.device.memory_bytes * self.train.state_memory_fraction)
        return 1 << max(0, math.ceil(math.log2(max(need, 1.0))))

    def with_train_devices(self, devices: dict[str, int]) -> "Costs":
        """These costs with the trainer slot of each named model size `devices[size]` big (a
        LoRA key is added as its own model)."""
        models = {name: dataclasses.replace(m, train_devices=devices.get(name, m.train_devices))
                  for name, m in self.models.items()}
        for name, n in devices.items():
            if name not in models:
                models[name] = dataclasses.replace(self.model(name), train_devices=n)
        return dataclasses.replace(self, models=models)

    def forward_s(self, m: Model, devices: int, tokens: float) -> float:
        """One forward pass over `tokens` on `devices` (no backward)."""
        return 2.0 * m.params * tokens / (devices * self.device.peak_flops * self.train.mfu)

    def state_write_s(self, m: Model) -> float:
        return self.swap_bytes(m) / self.storage.write_bandwidth

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


def _served_params(m: Model) -> float:
    """Parameters a token of an instance passes through: the base and (a LoRA unit's) the
    largest adapter it serves (each sequence uses one)."""
    return m.params + max(m.served_adapters, default=0.0)


def lora_key(size: str, rank: int, targets: tuple[str, ...] = LORA_DEFAULT_TARGETS) -> str:
    """The model key of a LoRA agent on base `size` (Costs.model reads it back)."""
    return f"{size}+lora{rank}" + ("" if tuple(targets) == LORA_DEFAULT_TARGETS
                                   else ":" + ",".join(targets))


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
        optional = {f.name for f in fields(cls) if f.default is not dataclasses.MISSING}
        missing, unknown = names - optional - set(section), set(section) - names
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
