"""Messages of the training layer: micro-batches, steps, swaps and saves of the trainer slots
(the table of who sends what: flexmarl.protocol)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from flexmarl.protocol.kinds import FlexKind
from runtime.protocol import message

__all__ = ["TrainBeginBatch", "TrainMicroBatch", "TrainStats", "TrainStep", "TrainStepDone",
           "ExportWeights", "SwapDone", "SendWeights", "SwapIn", "SwapOut", "Parked",
           "FetchShards", "ShardData", "DropParked", "SaveState", "AwaitSaved", "StateSaved",
           "ExportState", "TrainState", "SlotStatus", "SlotStatusReply"]

# ----------------------------------------------------------------------------- training

@message(FlexKind.TRAIN_BEGIN_BATCH)
@dataclass(slots=True)
class TrainBeginBatch:
    """Start a global batch. Its total number of trained (response) tokens is the loss
    normaliser, so accumulating its micro-batches gives exactly the full-batch gradient: give it
    here, or 0 to defer it to TrainStep (when micro-batches are trained while the rest of the
    batch is still being generated, the total is known only at the end)."""

    KIND: ClassVar[int]
    num_tokens: int = 0


@message(FlexKind.TRAIN_MICRO_BATCH)
@dataclass(slots=True)
class TrainMicroBatch:
    """Rows of prompt+response token ids, right-padded; all tensors are [rows, T] but advantages.

    old_logprobs[b, t] and ref_logprobs[b, t] are log p(input_ids[b, t] | input_ids[b, :t]) under
    the behaviour and reference policies, valid where response_mask[b, t] is 1.
    """

    KIND: ClassVar[int]
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    response_mask: torch.Tensor
    old_logprobs: torch.Tensor
    advantages: torch.Tensor
    """[rows]: one advantage per sequence (GRPO), broadcast over its response tokens."""
    ref_logprobs: torch.Tensor | None = None
    sampling: torch.Tensor | None = None
    """[rows, 3]: each row's temperature, top_k and top_p as sampled (greedy: 1, 0, 1); the
    trainer scores the row under that distribution. None: trainer.temperature, untruncated."""


@message(FlexKind.TRAIN_STATS)
@dataclass(slots=True)
class TrainStats:
    """What one accumulate() did."""

    KIND: ClassVar[int]
    loss: float
    num_tokens: int
    metrics: dict[str, float] = field(default_factory=dict)


@message(FlexKind.TRAIN_STEP)
@dataclass(slots=True)
class TrainStep:
    """Apply the accumulated gradient: one optimizer step, version += 1. `num_tokens` is the
    global batch's token count when TrainBeginBatch deferred it (0 otherwise)."""

    KIND: ClassVar[int]
    num_tokens: int = 0


@message(FlexKind.TRAIN_STEP_DONE)
@dataclass(slots=True)
class TrainStepDone:
    KIND: ClassVar[int]
    version: int
    grad_norm: float
    step_s: float
    skipped: bool = False
    """True when a non-finite gradient norm made the step skip the update (version still +1)."""
    samples: int = 0
    """Rows (samples) the step's gradient summed, as the trainer counted them since
    TrainBeginBatch: where the samples landed, not where they were sent from."""


@message(FlexKind.EXPORT_WEIGHTS)
@dataclass(slots=True)
class ExportWeights:
    """Ask a trainer for its full weights; the reply is a WeightUpdate. `publish` (the run's
    name for its published weights, flexmarl.weights.published): rank 0 writes them to a file
    on its host and the reply names it (WeightUpdate.source, no tensors); "": the tensors in
    the reply (tests and tools)."""

    KIND: ClassVar[int]
    publish: str = ""


@message(FlexKind.FETCH_WEIGHTS)
@dataclass(slots=True)
class FetchWeights:
    """Ask a holder of a published version for its tensors (`path`, a WeightUpdate.source's
    or one of its copies'): a rollout instance on another host asks the trainer's rank 0
    that published it, or an instance that holds it (flexmarl.weights.published.holders).
    Only a file the holder wrote or read itself is served. Reply: WeightUpdate."""

    KIND: ClassVar[int]
    path: str


@message(FlexKind.SWAP_DONE)
@dataclass(slots=True)
class SwapDone:
    KIND: ClassVar[int]
    num_bytes: int
    """Bytes that moved into the slot's device memory (all ranks)."""
    seconds: float
    how: str = ""
    """"here" (parked in this slot: copied back in place), "pulled" (from another slot's
    ranks), "fresh" (built from model_dir) or "restored" (a saved state or a TrainState)."""
    device: str = ""
    """Where the slot trains, as its start config placed it: "cpu gloo", "cuda:0 nccl" (the
    device, the process group's backend) and the GPUs the process sees, "visible=2,3"."""


@message(FlexKind.SEND_WEIGHTS)
@dataclass(slots=True)
class SendWeights:
    """To a trainer slot's rank 0: send the bound agent's weights, as `version`, to the
    rollout instances at `instances` (each `tensor_parallel_size` GPUs) through vLLM's
    weight-transfer engine `backend` ("nccl" or "ipc"), in `dtype`, within `timeout_s`
    (rollout.request_timeout_s: past it the transfer is aborted). Reply: WeightUpdateDone
    (its load_s: the whole transfer)."""

    KIND: ClassVar[int]
    version: int
    instances: list[str]
    backend: str = "nccl"
    tensor_parallel_size: int = 1
    dtype: str = "bfloat16"
    timeout_s: float = 300.0


@message(FlexKind.SWAP_IN)
@dataclass(slots=True)
class SwapIn:
    """Bind a trainer slot to an agent (model_dir, TrainerConfig fields). Its state comes from:
    its shards parked in this slot (copied back in place); else `source`, the shard-server
    addresses of the ranks it is parked on (Parked.ranks of another slot: every rank here pulls
    its slices from them, resharded); else `state_dir`, a saved state (a snapshot or a
    checkpoint: flexmarl.training.state_files) every rank reads its own rows of; else
    `tensors`/`meta`, a whole TrainState to restore (tests and tools); else nothing: a fresh
    trainer from model_dir."""

    KIND: ClassVar[int]
    agent: str
    model_dir: str
    config: dict[str, Any]
    source: list[str] = field(default_factory=list)
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    state_dir: str = ""


@message(FlexKind.SWAP_OUT)
@dataclass(slots=True)
class SwapOut:
    """Park the slot's agent: every rank copies its own shards to host memory of its process
    and frees the device; the slot is then empty (the parked agent's state stays in it)."""

    KIND: ClassVar[int]


@message(FlexKind.PARKED)
@dataclass(slots=True)
class Parked:
    """Where a SwapOut left the agent's state: on the slot's ranks, `ranks[r]` the address of
    rank r (send it FetchShards). Carries no tensor."""

    KIND: ClassVar[int]
    agent: str
    version: int
    num_bytes: int
    """All ranks' shard bytes together."""
    seconds: float
    ranks: list[str]


@message(FlexKind.FETCH_SHARDS)
@dataclass(slots=True)
class FetchShards:
    """Ask one rank for slices of an agent parked on it: `pieces` [[name, lo, hi, _], ...]
    rows [lo, hi) of dim 0 of its local tensor `name` (hi -1: all of it); [] asks for the
    state's layout, metadata and RNG (flexmarl.training.parking.pull_pieces)."""

    KIND: ClassVar[int]
    agent: str
    pieces: list[list[Any]] = field(default_factory=list)


@message(FlexKind.SHARD_DATA)
@dataclass(slots=True)
class ShardData:
    KIND: ClassVar[int]
    tensors: dict[str, torch.Tensor]
    layout: dict[str, list[Any]] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)


@message(FlexKind.DROP_PARKED)
@dataclass(slots=True)
class DropParked:
    """Free the host copy of an agent parked in this slot (it now lives in another slot)."""

    KIND: ClassVar[int]
    agent: str


@message(FlexKind.SAVE_STATE)
@dataclass(slots=True)
class SaveState:
    """Write the bound agent's whole state into `tmp` (a collective: each rank its shards, by
    torch.distributed.checkpoint); rank 0 then moves it to `path` as its state of `step`
    (meta.json with each file's sha256, an atomic rename). Replied (StateSaved, path "") once
    the shards are in host memory: the slot goes on; AwaitSaved waits for the write."""

    KIND: ClassVar[int]
    tmp: str
    path: str
    step: int
    model_dir: str = ""
    """Set: the weights instead, as a model dir path/version-N (rank 0; replied once written);
    a LoRA agent's adapter in PEFT's format there."""
    merged: bool = False
    """With model_dir, for a LoRA agent: also the base with its adapter merged in, as
    path/version-N/merged (run.merge_adapters)."""


@message(FlexKind.AWAIT_SAVED)
@dataclass(slots=True)
class AwaitSaved:
    """Reply (StateSaved, or the error) once SaveState's write into `path` is in place."""

    KIND: ClassVar[int]
    path: str


@message(FlexKind.STATE_SAVED)
@dataclass(slots=True)
class StateSaved:
    """Where an agent's state is saved (metadata only: the tensors stay in the files)."""

    KIND: ClassVar[int]
    agent: str
    step: int
    version: int
    path: str
    num_bytes: int
    seconds: float = 0.0
    """SaveState's reply: the staging (path ""); AwaitSaved's: the wait for the write."""


@message(FlexKind.EXPORT_STATE)
@dataclass(slots=True)
class ExportState:
    """Reply with the agent's whole training state, gathered on rank 0, and keep it in the
    slot: for tests and tools on small models (runs save with SaveState)."""

    KIND: ClassVar[int]


@message(FlexKind.TRAIN_STATE)
@dataclass(slots=True)
class TrainState:
    """An agent's whole training state gathered on rank 0 (flexmarl.training.trainer.
    export_state's layout): ExportState's reply, a snapshot or a checkpoint."""

    KIND: ClassVar[int]
    agent: str
    version: int
    tensors: dict[str, torch.Tensor]
    meta: dict[str, Any]
    seconds: float = 0.0


@message(FlexKind.SLOT_STATUS)
@dataclass(slots=True)
class SlotStatus:
    """What a trainer slot holds and does: answered at once, also while a step or swap runs."""

    KIND: ClassVar[int]


@message(FlexKind.SLOT_STATUS_REPLY)
@dataclass(slots=True)
class SlotStatusReply:
    """The agent bound ("" when empty), those parked (shards in the ranks' host memory), the
    command running now (a rank.Command name, "" when idle) for how long, and the commands
    accepted after it, in the order they will run."""

    KIND: ClassVar[int]
    agent: str
    parked: list[str]
    running: str
    running_s: float
    queued: list[str]
