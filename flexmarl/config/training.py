"""The training sections: `trainer` (one agent's trainer: optimizer, GRPO objective, precision,
placement) and `trainer_pool` (where each agent trains: slot sizes, sharing, snapshots, cores).

Ground floor: imports flexmarl.checks only, so the loader, the workers' arguments and the
simulator name them without torch.distributed (flexmarl.training takes them from here).
"""
from __future__ import annotations

from dataclasses import dataclass

from flexmarl.checks import parse_cpus, require

DEVICES = ("cpu", "cuda")
PARAM_DTYPES = ("float32", "bfloat16", "float16")
REDUCE_DTYPES = ("float32", "bfloat16")


@dataclass(kw_only=True)
class TrainerConfig:
    """Optimizer, GRPO objective and placement of one agent's trainer (section `trainer`)."""

    lr: float = 1e-6
    """AdamW learning rate."""
    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW moment decay rates, each in [0, 1)."""
    adam_eps: float = 1e-8
    """AdamW denominator epsilon."""
    weight_decay: float = 0.0
    """AdamW decoupled weight decay."""
    grad_clip: float = 1.0
    """Clip the global gradient norm to this value; 0 disables clipping (the norm is still
    reported)."""
    clip_eps: float = 0.2
    """PPO ratio clip: the ratio is kept in [1 - clip_eps, 1 + clip_eps_high]."""
    clip_eps_high: float | None = None
    """Upper clip (DAPO's "clip higher"); None means clip_eps."""
    kl_coef: float = 0.0
    """Weight of the per-token k3 KL estimate to the reference policy (as in GRPO). > 0: the
    trainer keeps a frozen copy of the agent's initial weights (the model directory it was
    built from) as the reference and scores every micro-batch under it too, unless the
    micro-batch brings its own ref_logprobs. Costs one more forward and the model's size again
    in memory (with `lora`, only the forward: the reference is the base, the adapter
    disabled)."""
    is_cap: float = 0.0
    """> 0: weight each token by the truncated importance ratio min(pi / pi_behaviour, is_cap)
    (decoupled objective for stale samples; set by pipeline.mode = "bounded"); 0: plain PPO
    ratio to the behaviour policy."""
    temperature: float = 1.0
    """Sampling temperature of the behaviour policy for micro-batches that do not say their
    rows' own (TrainMicroBatch.sampling, which the orchestrator always sends): logits are
    divided by it before the log-softmax so the importance ratio compares like with like."""
    train_layers: int = 0
    """> 0: train only the last `train_layers` decoder blocks and the final norm (embeddings
    and the LM head, tied in most small models, stay frozen); the optimizer holds state for
    those only and a weight sync sends only them. 0: train everything."""
    lora: dict | None = None
    """Train a LoRA adapter instead of the model (flexmarl.models.lora.LoraSpec.as_dict(); the
    run sets it from AgentSpec.lora): the base stays frozen as the model directory has it, the
    optimizer, the exported weights (PEFT's adapter tensors) and the saved state hold the
    adapter only, and the KL reference (kl_coef > 0) is the base itself (the adapter disabled)
    rather than a second copy. Excludes train_layers. None: no adapter."""
    seed: int = 0
    """Seed of torch's generators on every rank (the same on all ranks)."""
    device: str = "cpu"
    """`cpu` (gloo) or `cuda` (nccl, the current CUDA device of each rank)."""
    reshard_after_forward: bool = True
    """FSDP: free each block's gathered parameters after its forward (less memory, one more
    all-gather in backward)."""
    param_dtype: str = "float32"
    """Compute dtype of forward and backward: `float32`, `bfloat16` or `float16`. The parameters
    themselves (the master weights: FSDP's shards, what export_weights and export_state give)
    and AdamW's state stay float32; under FSDP this is MixedPrecisionPolicy(param_dtype=...)
    (each block's parameters are all-gathered in this dtype, its gradients come back float32),
    unsharded (world size 1) the forward passes run under torch.autocast. The log-probabilities
    and the loss are computed from float32 logits. `bfloat16` is the usual choice on GPUs;
    `float16` has no loss scaling here (small gradients may underflow)."""
    reduce_dtype: str = "float32"
    """FSDP: dtype of the gradient reduce-scatter across ranks (MixedPrecisionPolicy.reduce_dtype),
    `float32` or `bfloat16` (half the traffic, a coarser sum); the reduced gradient is kept
    float32. Works on gloo (CPU) and nccl; no effect at world size 1."""
    activation_checkpointing: bool = False
    """Recompute each decoder block's activations in backward instead of keeping them (much less
    activation memory, about a third more compute): Hugging Face's non-reentrant gradient
    checkpointing on the policy model, which keeps the parameter names."""
    logits_chunk_tokens: int = 64
    """Positions (rows x positions) whose full-vocabulary logits exist at once while scoring:
    the LM head is applied to the final hidden states a chunk at a time, each chunk
    recomputed in backward (flexmarl.training.logits), so the logits' memory is
    O(logits_chunk_tokens x vocabulary) whatever the micro-batch: 64 MiB a float32 copy at
    Gemma 3's 262,144 tokens (a micro-batch of 8 rows x 17 positions would be 136 MiB a copy
    whole), and scoring makes a few (temperature, top-k/top-p, log-softmax, entropy). Smaller
    saves memory, larger saves kernel launches; the numbers do not change."""
    compile: bool = False
    """torch.compile each decoder block of the policy in place (`block.compile()`, names kept):
    faster steps after a compile of some seconds to minutes at the first micro-batch (and at
    each new shape it cannot treat as dynamic); on CPU it needs a C++ compiler."""

    def __post_init__(self) -> None:
        if isinstance(self.betas, list):  # from TOML or JSON worker args
            self.betas = tuple(self.betas)
        _check(self.lr > 0, "lr", self.lr, "must be > 0")
        _check(len(self.betas) == 2 and all(0 <= b < 1 for b in self.betas), "betas",
               self.betas, "must be two numbers in [0, 1)")
        _check(self.adam_eps > 0, "adam_eps", self.adam_eps, "must be > 0")
        _check(self.weight_decay >= 0, "weight_decay", self.weight_decay, "must be >= 0")
        _check(self.grad_clip >= 0, "grad_clip", self.grad_clip, "must be >= 0 (0 disables)")
        _check(self.clip_eps > 0, "clip_eps", self.clip_eps, "must be > 0")
        _check(self.clip_eps_high is None or self.clip_eps_high > 0, "clip_eps_high",
               self.clip_eps_high, "must be > 0 or None")
        _check(self.kl_coef >= 0, "kl_coef", self.kl_coef, "must be >= 0")
        _check(isinstance(self.train_layers, int) and self.train_layers >= 0, "train_layers",
               self.train_layers, "must be an int >= 0 (0: train every layer)")
        if self.lora is not None:
            self.lora = _lora_dict(self.lora)
            _check(not self.train_layers, "lora", self.lora, "excludes trainer.train_layers "
                   f"(= {self.train_layers}): an adapter already trains only itself")
        _check(self.is_cap >= 0, "is_cap", self.is_cap, "must be >= 0 (0 disables)")
        _check(self.temperature > 0, "temperature", self.temperature,
               "must be > 0 (greedy rollouts are scored at temperature 1)")
        _check(isinstance(self.seed, int) and not isinstance(self.seed, bool), "seed", self.seed,
               "must be an int")
        _check(self.device in DEVICES, "device", self.device, f"must be one of {DEVICES}")
        _check(self.param_dtype in PARAM_DTYPES, "param_dtype", self.param_dtype,
               f"must be one of {PARAM_DTYPES}")
        _check(self.reduce_dtype in REDUCE_DTYPES, "reduce_dtype", self.reduce_dtype,
               f"must be one of {REDUCE_DTYPES}")
        _check(isinstance(self.logits_chunk_tokens, int) and not isinstance(
            self.logits_chunk_tokens, bool) and self.logits_chunk_tokens >= 1,
            "logits_chunk_tokens", self.logits_chunk_tokens, "must be an int >= 1")
        for name in ("activation_checkpointing", "compile"):
            _check(isinstance(getattr(self, name), bool), name, getattr(self, name),
                   "must be true or false")


def _lora_dict(value: object) -> dict:
    """trainer.lora checked as LoraSpec checks it, in its canonical form (LoraSpec.as_dict()),
    so that a bad adapter is refused with the config, before any model is built."""
    from flexmarl.team import LoraSpec  # a leaf: the validation AgentSpec.lora also runs

    fields = {"rank", "alpha", "dropout", "target_modules", "extra"}
    if not isinstance(value, dict):
        raise ValueError(f"trainer.lora must be a LoraSpec.as_dict() (a dict), got {value!r}")
    if value.keys() - fields or fields - {"extra"} - value.keys():
        raise ValueError(f"trainer.lora must have the keys {sorted(fields)} (extra optional) of "
                         f"LoraSpec.as_dict(), got {sorted(value)}")
    if isinstance(value["target_modules"], str):  # from_dict would split it into letters
        raise ValueError("trainer.lora target_modules must be a list of module names, got "
                         f"{value['target_modules']!r}")
    try:
        return LoraSpec.from_dict(value).as_dict()
    except (TypeError, ValueError) as exc:
        raise ValueError(f"trainer.lora: {exc}") from exc


def _check(ok: bool, name: str, value: object, rule: str) -> None:
    if not ok:
        raise ValueError(f"trainer.{name} {rule}, got {value!r}")


@dataclass(kw_only=True, frozen=True)
class TrainerPoolConfig:
    """Where each agent trains (section `trainer_pool`, flexmarl.training.pool.TrainerPool): slot
    sizes, sharing, snapshots and cores. The optimizer and loss are section `trainer`.
    Until FlexMARL 0.2 the old section name `[train]` is read too, with a warning."""

    ranks_per_agent: int = 1
    """FSDP ranks (processes) of each agent's trainer group."""
    cpus: str = "auto"
    """CPU cores of every trainer process, as in rollout.cpus; "auto": the other half."""
    slots: int | str = 0
    """0: static reservation, one trainer slot (a group of ranks_per_agent processes) per
    trainable agent, except that LoRA agents on one base share one (`share_lora_base`). N >= 1:
    a pool of N slots shared by all trainable agents, bound to an agent while it trains, idle
    agents' training state swapped out to host memory. "auto": the number the cluster
    simulator finds fastest for this team (section `plan`; resolved by `flexmarl run` at
    start, flexmarl.sim.team_plan.resolve_auto)."""
    share_lora_base: bool = True
    """With `slots` = 0 (and no `slot_ranks`): the LoRA agents (AgentSpec.lora) on one base
    model share one trainer slot, which holds the base once and swaps their adapters (each
    agent's adapter and AdamW state parked in the slot's host memory while another trains:
    flexmarl.training.parking.ResidentBase); full agents keep a slot each. The agents of one
    base must need the same ranks (AgentSpec.train_ranks; a ConfigError says so). false: one
    slot per agent, LoRA or not (the base once per agent's slot, no swaps: the behaviour
    before this setting). No effect on a shared pool (`slots` = N, `slot_ranks`)."""
    slot_ranks: str = ""
    """A shared pool of slots of different sizes, e.g. "1,2": one slot of 1 rank and one of 2
    (overrides `slots`); an agent needs AgentSpec.train_ranks (default ranks_per_agent)."""
    ready_timeout_s: float = 600.0
    """How long a trainer rank may take to start (its process, torch, the process group)."""
    collective_timeout_s: float = 1800.0
    """How long one torch.distributed collective of a trainer group may wait for a peer
    (torch's own default for gloo); idle followers hear from rank 0 well within it."""
    request_timeout_s: float = 300.0
    """Longest wait for one request to a trainer slot (a micro-batch, a step, a swap, an export);
    past it the slot is taken for hung and replaced (with snapshots) or the run stops."""
    snapshots: bool = True
    """The ranks save each agent's training state after each step (training/saves.py: on
    /dev/shm when every rank is on this machine): a dead trainer slot is replaced and its
    agent's batch re-accumulated from it (off: the run stops)."""
    nice: int | str = "auto"
    """Trainer processes' niceness (0..19); "auto": flexmarl.placement.cores.trainer_nice."""
    serial: bool | str = "auto"
    """Trainer requests one at a time, urgent agents first (flexmarl.orchestrator.lane);
    "auto": flexmarl.placement.cores.serial_trainers."""

    def __post_init__(self) -> None:
        require(self.ranks_per_agent >= 1, "trainer_pool.ranks_per_agent", self.ranks_per_agent,
                 "must be >= 1")
        require(self.slots == "auto" if isinstance(self.slots, str) else self.slots >= 0,
                "trainer_pool.slots", self.slots,
                'must be >= 0 (0: one slot per trainable agent) or "auto"')
        try:
            sizes = [int(x) for x in self.slot_ranks.split(",")] if self.slot_ranks else []
        except ValueError:
            sizes = [0]
        require(all(n >= 1 for n in sizes), "trainer_pool.slot_ranks", self.slot_ranks,
                 'must list the ranks of each shared slot, like "1,2" (or be empty)')
        for name in ("ready_timeout_s", "request_timeout_s", "collective_timeout_s"):
            require(getattr(self, name) > 0, f"trainer_pool.{name}", getattr(self, name),
                    "must be > 0")
        parse_cpus(self.cpus, "trainer_pool.cpus")
        require(self.nice == "auto" if isinstance(self.nice, str) else
                (not isinstance(self.nice, bool) and 0 <= self.nice <= 19),
                "trainer_pool.nice", self.nice, 'must be an int in 0..19 or "auto"')
        require(isinstance(self.serial, bool) or self.serial == "auto", "trainer_pool.serial",
                self.serial, 'must be true, false or "auto"')
        require(isinstance(self.share_lora_base, bool), "trainer_pool.share_lora_base",
                self.share_lora_base, "must be true or false")

    @property
    def static(self) -> bool:
        """Each trainable agent bound to one slot for the whole run: its own, or with
        `share_lora_base` the one of its LoRA base (swaps only among that base's adapters)."""
        if self.slots == "auto":
            raise ValueError('trainer_pool.slots = "auto" is resolved before the pool starts '
                             "(flexmarl.sim.team_plan.resolve_auto)")
        return not (self.slots or self.slot_ranks)
