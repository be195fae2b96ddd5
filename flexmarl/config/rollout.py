"""The rollout section (`rollout`): instances of every agent, their engine and its limits.

Ground floor: imports flexmarl.checks only. The engines' names, dtypes and weight transfers are
defined here (flexmarl.rollout.engine checks an engine's settings against them);
flexmarl.rollout.engine.engine_config turns this section into one instance's EngineConfig.
"""
from __future__ import annotations

from dataclasses import dataclass

from flexmarl.checks import parse_cpus, require

BACKENDS = ("vllm", "torch")
DTYPES = ("auto", "float32", "bfloat16", "float16")
TRANSFERS = ("auto", "stage", "nccl", "ipc")
DIRECT = ("nccl", "ipc")
"""The weight transfers sent from the trainer ranks straight to the engines (flexmarl.weights.direct)."""
@dataclass(kw_only=True, frozen=True)
class RolloutConfig:
    """Rollout instances of every agent (section `rollout`)."""

    backend: str = "auto"
    """`vllm`, `torch` (plain PyTorch generation, batched: for small models and machines
    without vLLM) or `auto`: vLLM where its instances get GPUs, else torch
    (flexmarl.launch.build.resolve_backend)."""
    instances_per_agent: int = 1
    """Rollout worker processes serving each agent's policy."""
    kv_cache_bytes: int = 256 << 20
    """vLLM on CPU: KV-cache size of each instance, in bytes (on GPU the cache is what
    gpu_memory_utilization leaves after the weights)."""
    max_model_len: int = 512
    """Longest prompt + completion, in tokens."""
    dtype: str = "auto"
    """Weights and activations of the engine: "auto" is float32 on CPU (log-probabilities
    comparable with the trainer's) and bfloat16 on GPU; or float32, bfloat16, float16."""
    tensor_parallel_size: int = 1
    """vLLM on GPU: GPUs of one instance (on one host; see flexmarl/placement/devices.py)."""
    gpu_memory_utilization: float = 0.85
    """vLLM on GPU: fraction of each of its GPUs' memory the engine takes (weights,
    activations, KV cache). With devices.colocate the trainer rank on the same GPU gets the
    rest: then 0.3-0.5 is typical."""
    enforce_eager: bool = True
    """vLLM: no CUDA graphs. false on GPU captures them: faster decoding, a slower start and
    more memory."""
    weight_transfer: str = "auto"
    """How a new policy version reaches the engines: "stage" (the trainer's rank 0 writes it
    once in /dev/shm on its host, flexmarl.weights.published; the instances load that file, or
    fetch it from rank 0 on another host; works everywhere, never through the run), "nccl" (vLLM's weight-transfer engine:
    trainer rank 0 broadcasts to the agent's instances over NCCL), "ipc" (CUDA IPC: instances
    on their trainer's GPUs, devices.colocate). "auto": nccl when vLLM and the trainers are on
    GPU and every agent has its own trainer slot, else stage (flexmarl.weights.direct)."""
    ready_timeout_s: float = 600.0
    """How long an instance may take to start (a cold vLLM start takes minutes on CPU)."""
    request_timeout_s: float = 300.0
    """Longest wait for one request to an instance (a generate call, a weight push); past it
    the instance is taken for hung: killed and replaced, its requests re-sent. Sized for a long
    generation on a loaded CPU machine."""
    cpus: str = "auto"
    """CPU cores of every rollout process, as "0", "0,2" or "0-3" (threads sized to match);
    "auto": half the cores when trainers run on CPU (flexmarl.placement.cores.role_cpus); "": no pinning."""
    max_num_seqs: int = 64
    """Most sequences an instance decodes together (vLLM's max_num_seqs; the torch engine's
    batch rows, though a request's own n samples always run together). 1 makes the torch
    engine run every request alone: its log-probabilities then do not depend on what arrived
    at the same time (a batch's padding changes the order of float sums)."""
    max_loras: int = 0
    """LoRA agents (AgentSpec.lora): adapters one instance serves and one batch mixes (vLLM's
    max_loras); 0: as many as the agents on its base model."""
    max_lora_rank: int = 0
    """LoRA agents: the largest adapter rank an instance serves (vLLM's max_lora_rank, one of
    flexmarl.models.lora.VLLM_LORA_RANKS); 0: the smallest of those that fits every agent's."""
    staging_dir: str = ""
    """vLLM: where a weight update is written for the engine core to read; "": /dev/shm (a
    container's /dev/shm may be too small: Docker's default is 64 MB)."""

    def __post_init__(self) -> None:
        require(self.backend in BACKENDS or self.backend == "auto", "rollout.backend",
                self.backend, f"must be one of {', '.join(BACKENDS)} or auto")
        require(self.dtype in DTYPES, "rollout.dtype", self.dtype,
                f"must be one of {', '.join(DTYPES)}")
        require(0 < self.gpu_memory_utilization < 1, "rollout.gpu_memory_utilization",
                self.gpu_memory_utilization, "must be in (0, 1)")
        require(self.weight_transfer in TRANSFERS, "rollout.weight_transfer",
                self.weight_transfer, f"must be one of {', '.join(TRANSFERS)}")
        for name in ("instances_per_agent", "kv_cache_bytes", "max_model_len", "max_num_seqs",
                     "tensor_parallel_size"):
            require(getattr(self, name) >= 1, f"rollout.{name}", getattr(self, name),
                     "must be >= 1")
        for name in ("max_loras", "max_lora_rank"):
            require(getattr(self, name) >= 0, f"rollout.{name}", getattr(self, name),
                    "must be >= 0 (0: sized to the team)")
        for name in ("ready_timeout_s", "request_timeout_s"):
            require(getattr(self, name) > 0, f"rollout.{name}", getattr(self, name),
                    "must be > 0")
        parse_cpus(self.cpus, "rollout.cpus")
