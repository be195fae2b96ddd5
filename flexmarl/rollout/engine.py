"""The rollout engine interface and the config shared by every backend."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from flexmarl.protocol import Sample, SamplingParams

BACKENDS = ("vllm", "torch")


@dataclass(kw_only=True, frozen=True)
class EngineConfig:
    """Settings of one rollout instance (section `rollout`)."""

    backend: str = "torch"
    """`vllm` or `torch`."""
    model_dir: str = ""
    """A Hugging Face model directory (config, safetensors, tokenizer)."""
    max_model_len: int = 512
    """Longest prompt + completion, in tokens."""
    seed: int = 0
    """Seed of requests that give none (vLLM engine seed; torch sampling generator)."""
    kv_cache_bytes: int = 256 << 20
    """vLLM: KV-cache size in bytes (on CPU a fraction of memory is unreliable, see notes)."""
    max_num_seqs: int = 64
    """vLLM: most sequences decoded together."""
    dtype: str = "float32"
    """Weights and activations; float32 keeps log-probabilities comparable to the trainer's."""
    staging_dir: str = ""
    """vLLM: directory weight updates are staged in ("": /dev/shm; rollout.staging_dir)."""

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"rollout.backend must be one of {BACKENDS}, got {self.backend!r}")
        if not self.model_dir:
            raise ValueError("rollout.model_dir is required (a model directory, see "
                             "flexmarl.models.ensure_model)")
        for name in ("max_model_len", "kv_cache_bytes", "max_num_seqs"):
            if getattr(self, name) <= 0:
                raise ValueError(f"rollout.{name} must be positive, got {getattr(self, name)}")
        if self.dtype not in ("float32", "bfloat16", "float16"):
            raise ValueError(f"rollout.dtype must be float32, bfloat16 or float16, got {self.dtype}")


class RolloutEngine(Protocol):
    """What the worker needs from a backend. Calls come from one event loop."""

    async def start(self) -> None: ...

    def tokenize(self, text: str) -> list[int]: ...

    async def generate(self, prompt_ids: list[int],
                       params: SamplingParams) -> tuple[list[Sample], list[float] | None]:
        """Samples of one prompt, and the prompt's log-probabilities if asked for."""
        ...

    async def load_weights(self, tensors: dict[str, torch.Tensor]) -> None:
        """Replace the weights in place; called only while no request is running."""
        ...

    async def close(self) -> None: ...


