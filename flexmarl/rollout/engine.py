"""The rollout engine interface and the config shared by every backend."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from flexmarl.config.rollout import BACKENDS, DTYPES, RolloutConfig, TRANSFERS
from flexmarl.protocol import Sample, SamplingParams

"""rollout.weight_transfer; an engine gets it resolved (never "auto")."""


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
    """Most sequences decoded together (vLLM's max_num_seqs; the torch engine's batch rows,
    a request's own samples always together)."""
    dtype: str = "auto"
    """Weights and activations; "auto": float32 on CPU (log-probabilities comparable to the
    trainer's), bfloat16 on GPU (either backend)."""
    staging_dir: str = ""
    """vLLM: directory weight updates are staged in ("": /dev/shm; rollout.staging_dir)."""
    tensor_parallel_size: int = 1
    """vLLM on GPU: GPUs of this instance (those CUDA_VISIBLE_DEVICES gives it)."""
    gpu_memory_utilization: float = 0.85
    """vLLM on GPU: fraction of each GPU's memory the engine takes."""
    enforce_eager: bool = True
    """vLLM: no CUDA graphs."""
    weight_transfer: str = "stage"
    """"stage" (WeightUpdate tensors, loaded in place), "nccl" or "ipc" (vLLM's weight-transfer
    engine; the trainer sends, flexmarl.weights.direct)."""
    adapters: tuple[str, ...] = ()
    """LoRA adapters this instance serves on its model (the agents' names): a request names
    one (Generate.adapter) or none (the base). Until its first `load_adapter`, an adapter is
    the base itself (PEFT starts B at 0). Empty: no LoRA."""
    max_lora_rank: int = 0
    """With adapters: the largest rank served (vLLM's max_lora_rank, one of
    flexmarl.models.lora.VLLM_LORA_RANKS)."""
    max_loras: int = 0
    """With adapters: adapters one batch may mix (vLLM's max_loras, >= len(adapters))."""
    device: str = "cpu"
    """The torch engine's device: "cpu", or "cuda" where the placement gave the instance a GPU
    (rollout.backend = "torch" with trainer.device = "cuda"). vLLM places itself."""
    sleep_mode: bool = False
    """The instance is time-shared with its agent's trainer (devices.placement): it is put to
    sleep while the trainer runs. vLLM: enable_sleep_mode (GPU only); the torch engine can
    always sleep."""

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"rollout.backend must be one of {BACKENDS}, got {self.backend!r}")
        if not self.model_dir:
            raise ValueError("rollout.model_dir is required (a model directory, see "
                             "flexmarl.models.ensure_model)")
        for name in ("max_model_len", "kv_cache_bytes", "max_num_seqs"):
            if getattr(self, name) <= 0:
                raise ValueError(f"rollout.{name} must be positive, got {getattr(self, name)}")
        if self.device not in ("cpu", "cuda"):
            raise ValueError(f"an engine's device must be \"cpu\" or \"cuda\", got {self.device!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"rollout.dtype must be one of {DTYPES}, got {self.dtype}")
        if self.weight_transfer not in TRANSFERS[1:]:
            raise ValueError(f"an engine's weight_transfer must be one of {TRANSFERS[1:]}, got "
                             f"{self.weight_transfer!r}")
        if self.adapters:
            if len(set(self.adapters)) != len(self.adapters):
                raise ValueError(f"an engine's adapters must be distinct, got {self.adapters}")
            if self.max_lora_rank < 1 or self.max_loras < len(self.adapters):
                raise ValueError(f"an engine serving adapters {list(self.adapters)} needs "
                                 f"max_lora_rank >= 1 and max_loras >= {len(self.adapters)}, "
                                 f"got {self.max_lora_rank} and {self.max_loras}")
            if self.weight_transfer != "stage":
                raise ValueError("LoRA adapters sync staged (rollout.weight_transfer = "
                                 f"\"stage\"), got {self.weight_transfer!r}")
        if self.weight_transfer != "stage" and self.backend != "vllm":
            raise ValueError(f"rollout.weight_transfer = {self.weight_transfer!r} needs "
                             'rollout.backend = "vllm" (its weight-transfer engines)')


class RolloutEngine(Protocol):
    """What the worker needs from a backend. Calls come from one event loop."""

    async def start(self) -> None: ...

    def tokenize(self, text: str) -> list[int]: ...

    async def generate(self, prompt_ids: list[int], params: SamplingParams,
                       adapter: str | None = None) -> tuple[list[Sample], list[float] | None]:
        """Samples of one prompt, and the prompt's log-probabilities if asked for; with
        `adapter` (one of config.adapters) through that LoRA adapter."""
        ...

    async def load_weights(self, tensors: dict[str, torch.Tensor]) -> None:
        """Replace the weights in place; called only while no request is running."""
        ...

    async def load_adapter(self, name: str, tensors: dict[str, torch.Tensor],
                           lora: dict) -> None:
        """Replace adapter `name` (one of config.adapters) by these tensors (PEFT's names;
        `lora`: its LoraSpec.as_dict()) in place; called only while no request is running."""
        ...

    async def sleep(self) -> None:
        """Release the engine's memory (weights offloaded, KV cache dropped); called only while
        no request runs. Nothing is served until wake_up."""
        ...

    async def wake_up(self) -> None:
        """Take the memory back, with the weights sleep offloaded."""
        ...

    async def close(self) -> None: ...

    # vLLM only, optional: `async def transfer(phase, info)`, one phase of a direct update
    # through its weight-transfer engine (flexmarl.weights.direct); and
    # `async def load_weights_file(path, version)`: a version published on this host
    # (flexmarl.weights.published), read by the engine itself instead of load_weights.
    # The simulator's, optional: `async def read_published(source)`, its own reading of a
    # WeightUpdate.source (the worker's is flexmarl.weights.published.read).


def engine_config(rollout: RolloutConfig, model_dir: str, *, seed: int, transfer: str = "stage",
                  device: str = "cpu") -> EngineConfig:
    """The settings of one instance serving the model in `model_dir` (`transfer`: the
    run's resolved weight_transfer; `device`: "cuda" when the placement gave the
    instance a GPU, for the torch engine)."""
    return EngineConfig(backend=rollout.backend, model_dir=model_dir, seed=seed,
                        max_model_len=rollout.max_model_len,
                        kv_cache_bytes=rollout.kv_cache_bytes,
                        max_num_seqs=rollout.max_num_seqs, staging_dir=rollout.staging_dir,
                        dtype=rollout.dtype,
                        tensor_parallel_size=rollout.tensor_parallel_size,
                        gpu_memory_utilization=rollout.gpu_memory_utilization,
                        enforce_eager=rollout.enforce_eager, weight_transfer=transfer,
                        device=device if rollout.backend == "torch" else "cpu")
