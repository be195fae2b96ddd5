"""FlexMARL's message kinds (100 and up) and their typed dataclasses, in one place.

Built on the runtime's codec (`runtime.protocol.message`: msgpack, tensors as zero-copy frames,
no pickle; its own kinds are 1-99). Who sends each request, who handles it, and its reply:

    request          sent by                                   handled by         reply
    Generate         InstancePool.generate (rollout/pool.py),  RolloutWorker      GenerateReply
                     for every ctx.generate of a workflow      (rollout/worker.py)
    SubscribeLoad    InstancePool.start / a replacement        RolloutWorker      LoadReport,
                                                                                   then pushed
                                                                                   on change
    WeightUpdate     push_weights (weights/stage.py):          RolloutWorker      WeightUpdate-
                     the loop's sync, a moved or replacement                      Done
                     instance loading its agent's weights
    TrainBeginBatch  TrainSession (orchestrator/batch.py)      TrainerWorker,     None
    TrainMicroBatch  TrainSession                              rank 0 (training/  TrainStats
    TrainStep        TrainSession                              worker.py), which  TrainStepDone
    ExportWeights    TrainSession.export, TrainerPool.export   runs the call on   WeightUpdate
    SwapIn           TrainerPool (binding an agent to a slot)  every rank;        SwapDone
    SwapOut          TrainerPool (evicting an idle agent)      followers refuse   Parked
    DropParked       TrainerPool (the agent moved elsewhere)   requests           None
    SaveState        TrainerPool.save (snapshots, checkpoints) (rank 0)           StateSaved
    AwaitSaved       TrainerPool.save, after the binding       rank 0 (concurrent) StateSaved
    ExportState      tests and tools (the whole state here)    (rank 0)           TrainState
    FetchShards      a trainer rank pulling a parked agent     every rank, its    ShardData
                     (SwapIn with a source)                    own shards
    SlotStatus       anyone asking what a slot is doing        TrainerWorker      SlotStatus-
                     (answered at once, even mid-step)         (rank 0)           Reply

No tensor of a swap, a snapshot or a checkpoint passes through the process that sends these
messages: SwapOut parks each rank's shards in its own process (Parked.ranks says where), a SwapIn
puts them back or pulls them rank to rank (FetchShards, resharded); SaveState has the ranks write
their shards into a dir (flexmarl.training.state_files) that SwapIn.state_dir restores from. Only
ExportState and SwapIn.tensors carry a whole TrainState: for tests and tools on small models.
Kinds 116 and 117 (the retired Offload/Onload) are not reused.
"""
from __future__ import annotations

import math

from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, ClassVar

import torch

from runtime.protocol import message


class FlexKind(IntEnum):
    """Wire constants: never renumber, only append."""

    GENERATE = 100
    GENERATE_REPLY = 101
    SUBSCRIBE_LOAD = 102
    LOAD_REPORT = 103
    WEIGHT_UPDATE = 104
    WEIGHT_UPDATE_DONE = 105
    TRAIN_BEGIN_BATCH = 110
    TRAIN_MICRO_BATCH = 111
    TRAIN_STATS = 112
    TRAIN_STEP = 113
    TRAIN_STEP_DONE = 114
    EXPORT_WEIGHTS = 115
    # 116, 117: the retired Offload/Onload (one swap path: SwapOut/SwapIn); not reused
    SWAP_DONE = 118
    SWAP_IN = 119
    SWAP_OUT = 120
    TRAIN_STATE = 121
    EXPORT_STATE = 122
    PARKED = 123
    FETCH_SHARDS = 124
    SHARD_DATA = 125
    DROP_PARKED = 126
    WEIGHT_TRANSFER = 127
    SEND_WEIGHTS = 128
    SLOT_STATUS = 129
    SLOT_STATUS_REPLY = 130
    SAVE_STATE = 131
    AWAIT_SAVED = 133
    STATE_SAVED = 134  # (132: a staged-state reply, folded into this one; not reused)


# ----------------------------------------------------------------------------- rollout

@dataclass(slots=True)
class SamplingParams:
    """Per-request sampling settings, the same for every rollout backend."""

    n: int = 1
    """Independent samples of the same prompt (one GRPO group)."""
    temperature: float = 1.0
    """0 means greedy."""
    top_p: float = 1.0
    """Nucleus sampling: keep the most likely tokens whose probability adds up to top_p."""
    top_k: int = 0
    """Keep the k most likely tokens (ties kept); 0 (or -1, as in vLLM) keeps all. Top-k is
    applied before top-p, as vLLM does; the trainer scores each sample the same way."""
    max_tokens: int = 64
    stop: list[str] = field(default_factory=list)
    """Generation of a sample ends after any of these strings (kept out of the text)."""
    seed: int | None = None
    prompt_logprobs: bool = False
    """Also return the log-probability of every prompt token after the first (for scoring)."""

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ValueError(f"sampling.n must be >= 1, got {self.n}")
        if not (self.temperature >= 0 and math.isfinite(self.temperature)):  # NaN fails too
            raise ValueError(f"sampling.temperature must be a finite number >= 0, got "
                             f"{self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"sampling.top_p must be in (0, 1], got {self.top_p}")
        if self.top_k == -1:
            self.top_k = 0
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"sampling.top_k must be an int >= 0 (0 or -1: off), got "
                             f"{self.top_k!r}")
        if self.max_tokens < 1:
            raise ValueError(f"sampling.max_tokens must be >= 1, got {self.max_tokens}")


@dataclass(slots=True)
class Sample:
    """One generated completion."""

    token_ids: list[int]
    logprobs: list[float]
    """Log-probability of each sampled token under the sampling distribution (temperature,
    top-k and top-p applied; the raw model distribution when greedy): the behaviour policy."""
    finish_reason: str
    """`stop` (end of sequence or a stop string) or `length` (max_tokens reached)."""
    text: str


@message(FlexKind.GENERATE)
@dataclass(slots=True)
class Generate:
    """Ask a rollout instance for completions of one prompt (token ids, or text to tokenize)."""

    KIND: ClassVar[int]
    request_id: str
    prompt_ids: list[int] | None = None
    prompt: str | None = None
    params: SamplingParams = field(default_factory=SamplingParams)

    def __post_init__(self) -> None:
        if (self.prompt_ids is None) == (self.prompt is None):
            raise ValueError("Generate needs exactly one of prompt_ids or prompt")


@message(FlexKind.GENERATE_REPLY)
@dataclass(slots=True)
class GenerateReply:
    """Completions, all generated by one policy version from the same prompt token ids."""

    KIND: ClassVar[int]
    request_id: str
    version: int
    prompt_ids: list[int]
    samples: list[Sample]
    prompt_logprobs: list[float] | None = None
    """With params.prompt_logprobs: log p(prompt[i] | prompt[:i]) for i >= 1."""
    instance: str = ""


@message(FlexKind.SUBSCRIBE_LOAD)
@dataclass(slots=True)
class SubscribeLoad:
    """Ask a rollout instance to push LoadReport messages to the sender whenever load changes."""

    KIND: ClassVar[int]


@message(FlexKind.LOAD_REPORT)
@dataclass(slots=True)
class LoadReport:
    """Pushed by a rollout instance to its subscribers."""

    KIND: ClassVar[int]
    instance: str
    version: int
    queued: int
    """Requests accepted but not yet running (e.g. waiting for a weight update to finish)."""
    running: int
    outstanding_tokens: int
    """Tokens still to generate by the requests queued and running, at most max_tokens each."""


# ----------------------------------------------------------------------------- weights

@message(FlexKind.WEIGHT_UPDATE)
@dataclass(slots=True)
class WeightUpdate:
    """Full weights of one policy version, named as in the Hugging Face checkpoint.

    `force` loads them even if `version` is not newer than the instance's: the instance changes
    hands (the balancer moved it to another agent, whose versions count on their own)."""

    KIND: ClassVar[int]
    version: int
    tensors: dict[str, torch.Tensor]
    force: bool = False
    complete: bool = True
    """False: only the tensors that train (trainer.train_layers); the rest stay as served."""


@message(FlexKind.WEIGHT_UPDATE_DONE)
@dataclass(slots=True)
class WeightUpdateDone:
    """A rollout instance now serves `version`; how long loading took and how much it was."""

    KIND: ClassVar[int]
    version: int
    num_bytes: int
    load_s: float


@message(FlexKind.WEIGHT_TRANSFER)
@dataclass(slots=True)
class WeightTransfer:
    """One phase of a weight update through vLLM's weight-transfer engine (GPU; the trainer
    sends, flexmarl.weights.direct): "init" (join the trainer's group: `info` is the
    engine's init info), "start" (gate closed, running requests finished, the engine ready to
    receive `version`), "update" (receive: `info` names the tensors, their dtypes and shapes),
    "finish" (the engine serves `version`, the gate opens), "abort" (the trainer's send
    failed: an instance in the middle of it stops). Reply: WeightUpdateDone."""

    KIND: ClassVar[int]
    phase: str
    version: int
    info: dict[str, Any] = field(default_factory=dict)


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


@message(FlexKind.EXPORT_WEIGHTS)
@dataclass(slots=True)
class ExportWeights:
    """Ask a trainer for its full weights; the reply is a WeightUpdate."""

    KIND: ClassVar[int]


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
    weight-transfer engine `backend` ("nccl" or "ipc"), in `dtype`. Reply: WeightUpdateDone
    (its load_s: the whole transfer)."""

    KIND: ClassVar[int]
    version: int
    instances: list[str]
    backend: str = "nccl"
    tensor_parallel_size: int = 1
    dtype: str = "bfloat16"


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
    state's layout, metadata and RNG (flexmarl.training.parking.pull_plan)."""

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
    """Set: the weights instead, as a model dir path/version-N (rank 0; replied once written)."""


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
