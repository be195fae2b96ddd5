"""FlexMARL's message kinds (100 and up) and their typed dataclasses, in one place.

Built on the runtime's codec (`runtime.protocol.message`): msgpack bodies, tensors as zero-copy
frames, no pickle. Rollout, training and weight-sync messages live here; the runtime's own kinds
(1-99) stay in `runtime.protocol`. Who sends each request, who handles it, and its reply:

    request          sent by                                   handled by         reply
    Generate         InstancePool.generate (rollout/pool.py),  RolloutWorker      GenerateReply
                     for every ctx.generate of a workflow      (rollout/worker.py)
    SubscribeLoad    InstancePool.start / a replacement        RolloutWorker      LoadReport,
                                                                                   then pushed
                                                                                   on change
    WeightUpdate     push_weights (rollout/weight_sync.py):    RolloutWorker      WeightUpdate-
                     the loop's sync, a moved or replacement                      Done
                     instance loading its agent's weights
    TrainBeginBatch  TrainSession (orchestrator/batch.py)      TrainerWorker,     None
    TrainMicroBatch  TrainSession                              rank 0 (training/  TrainStats
    TrainStep        TrainSession                              worker.py), which  TrainStepDone
    ExportWeights    TrainSession.export, TrainerPool.export   runs the call on   WeightUpdate
    SwapIn           TrainerPool (binding an agent to a slot)  every rank;        SwapDone
    SwapOut          TrainerPool (evicting an idle agent)      followers refuse   TrainState
    ExportState      TrainerPool.snapshot                      requests           TrainState

Kinds 116 and 117 (Offload, Onload: an in-place swap that nothing but tests sent) are retired;
SwapOut/SwapIn are the one swap path.
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
    seconds: float


@message(FlexKind.SWAP_IN)
@dataclass(slots=True)
class SwapIn:
    """Bind a trainer slot to an agent: build its trainer (model_dir, TrainerConfig fields) and,
    when `tensors` is not empty, restore the training state a SwapOut returned (anywhere)."""

    KIND: ClassVar[int]
    agent: str
    model_dir: str
    config: dict[str, Any]
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)


@message(FlexKind.SWAP_OUT)
@dataclass(slots=True)
class SwapOut:
    """Unbind the slot: reply with the agent's whole training state and free the slot."""

    KIND: ClassVar[int]


@message(FlexKind.EXPORT_STATE)
@dataclass(slots=True)
class ExportState:
    """Reply with the agent's whole training state and keep it in the slot: the snapshot a dead
    slot's agent is restored from, and what a resumable run writes to disk after each step."""

    KIND: ClassVar[int]


@message(FlexKind.TRAIN_STATE)
@dataclass(slots=True)
class TrainState:
    """An agent's training state out of its slot (flexmarl.training.trainer.export_state's layout)."""

    KIND: ClassVar[int]
    agent: str
    version: int
    tensors: dict[str, torch.Tensor]
    meta: dict[str, Any]
    seconds: float = 0.0
