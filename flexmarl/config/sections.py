"""The sections of the run's own parts: run, team, pipeline, rollout, trainer_pool, observe,
cluster and gateway. Each is validated in its __post_init__; every error names `section.key`.
The sections of lower components live beside them: `trainer` (flexmarl.training.trainer),
`balance` (flexmarl.rollout.balancer), `transport` and `supervisor` (runtime.config).
"""
from __future__ import annotations

from dataclasses import dataclass

from flexmarl.config.checks import parse_cpus, require
from flexmarl.rollout.engine import BACKENDS, EngineConfig

PIPELINE_MODES = ("sync", "micro_batch", "one_step_off", "bounded")
"""Valid `pipeline.mode` values; each names a pipeline policy."""
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


@dataclass(kw_only=True, frozen=True)
class RunConfig:
    """Identity, length and output of one run (section `run`)."""

    name: str = "default"
    """Run name; the run directory is `out_dir/name-YYYYmmdd-HHMMSS` unless `dir` is set."""
    out_dir: str = "runs"
    """Parent directory of timestamped run directories."""
    dir: str = ""
    """Explicit run directory (must be new or empty); empty means a timestamped one."""
    seed: int = 0
    """Experiment seed (task order, sampling seeds)."""
    steps: int = 40
    """Global steps: each samples one batch of tasks and updates every agent once."""
    log_level: str = "WARNING"
    """Python logging level of the driver and of worker processes (case-insensitive)."""
    save_state: bool = True
    """After each step, write every agent's whole training state under RUN_DIR/state
    (atomically; older steps pruned) so `flexmarl run --resume RUN_DIR` can go on."""

    def __post_init__(self) -> None:
        require(bool(self.name) and "/" not in self.name and self.name not in (".", ".."),
                 "run.name", self.name, "must be a non-empty directory name without '/'")
        require(bool(self.out_dir), "run.out_dir", self.out_dir, "must not be empty")
        require(self.seed >= 0, "run.seed", self.seed, "must be >= 0")
        require(self.steps >= 1, "run.steps", self.steps, "must be >= 1")
        level = self.log_level.upper()
        require(level in LOG_LEVELS, "run.log_level", self.log_level,
                 f"must be one of {', '.join(LOG_LEVELS)}")
        object.__setattr__(self, "log_level", level)


@dataclass(kw_only=True, frozen=True)
class TeamRef:
    """Which team to train (section `team`)."""

    path: str = "agents/math_duo.py"
    """Team file: relative paths are looked up in the current directory, then in the package
    root (so the default works from anywhere). `load_config` stores the resolved path."""

    def __post_init__(self) -> None:
        require(bool(self.path), "team.path", self.path,
                 "must name a team file; pass --team PATH or set team.path")


@dataclass(kw_only=True, frozen=True)
class PipelineConfig:
    """Batch shape and parallelism of rollouts (section `pipeline`)."""

    mode: str = "micro_batch"
    """Pipeline policy; one of PIPELINE_MODES."""
    tasks_per_step: int = 16
    """Tasks in one global batch."""
    trajectories_per_task: int = 8
    """GRPO group size: independent runs of the workflow per task."""
    max_concurrent_tasks: int = 4
    """Inter-query parallelism: tasks whose workflows run at once."""
    max_concurrent_calls: int = 16
    """Intra-query parallelism: concurrent generate calls of one task."""
    micro_batch_groups: int = 4
    """GRPO groups per trainer micro-batch."""
    samples_per_request: int = 0
    """Intra-query parallelism of one call's n samples: split them into requests of at most
    this many, spread over the agent's instances by the balancer; 0: one request per call."""
    max_staleness: int = 1
    """Mode `bounded`: the most versions a trained sample may lag its trainer (>= 1)."""
    is_cap: float = 2.0
    """Mode `bounded`: cap of the truncated importance weight pi / pi_behaviour (used unless
    trainer.is_cap is set)."""

    def __post_init__(self) -> None:
        require(self.mode in PIPELINE_MODES, "pipeline.mode", self.mode,
                 f"must be one of {', '.join(PIPELINE_MODES)}")
        for name in ("tasks_per_step", "max_concurrent_tasks", "max_concurrent_calls",
                     "micro_batch_groups", "max_staleness"):
            require(getattr(self, name) >= 1, f"pipeline.{name}", getattr(self, name),
                     "must be >= 1")
        require(self.trajectories_per_task >= 2, "pipeline.trajectories_per_task",
                 self.trajectories_per_task,
                 "must be >= 2 (GRPO learns from reward differences within a group; a group "
                 "of one always has advantage 0)")
        require(self.is_cap > 0, "pipeline.is_cap", self.is_cap, "must be > 0")
        require(self.samples_per_request >= 0, "pipeline.samples_per_request",
                 self.samples_per_request, "must be >= 0 (0: one request per call)")


@dataclass(kw_only=True, frozen=True)
class RolloutConfig:
    """Rollout instances of every agent (section `rollout`)."""

    backend: str = "vllm"
    """`vllm` or `torch` (plain PyTorch generation, for small models and machines without vLLM)."""
    instances_per_agent: int = 1
    """Rollout worker processes serving each agent's policy."""
    kv_cache_bytes: int = 256 << 20
    """vLLM KV-cache size of each instance, in bytes."""
    max_model_len: int = 512
    """Longest prompt + completion, in tokens."""
    ready_timeout_s: float = 600.0
    """How long an instance may take to start (a cold vLLM start takes minutes on CPU)."""
    cpus: str = "auto"
    """CPU cores of every rollout process, as "0", "0,2" or "0-3" (threads sized to match);
    "auto": half the cores when trainers run on CPU (see `role_cpus`); "": no pinning."""

    def __post_init__(self) -> None:
        require(self.backend in BACKENDS, "rollout.backend", self.backend,
                 f"must be one of {', '.join(BACKENDS)}")
        for name in ("instances_per_agent", "kv_cache_bytes", "max_model_len"):
            require(getattr(self, name) >= 1, f"rollout.{name}", getattr(self, name),
                     "must be >= 1")
        require(self.ready_timeout_s > 0, "rollout.ready_timeout_s", self.ready_timeout_s,
                 "must be > 0")
        parse_cpus(self.cpus, "rollout.cpus")

    def engine_config(self, model_dir: str, *, seed: int) -> EngineConfig:
        """The settings of one instance serving the model in `model_dir`."""
        return EngineConfig(backend=self.backend, model_dir=model_dir, seed=seed,
                            max_model_len=self.max_model_len, kv_cache_bytes=self.kv_cache_bytes)


@dataclass(kw_only=True, frozen=True)
class TrainerPoolConfig:
    """Where each agent trains (section `trainer_pool`, flexmarl.training.pool.TrainerPool): slot
    sizes, sharing, snapshots and cores. The optimizer and loss are section `trainer`.
    Until FlexMARL 0.2 the old section name `[train]` is read too, with a warning."""

    ranks_per_agent: int = 1
    """FSDP ranks (processes) of each agent's trainer group."""
    cpus: str = "auto"
    """CPU cores of every trainer process, as in rollout.cpus; "auto": the other half."""
    slots: int = 0
    """0: static reservation, one trainer slot (a group of ranks_per_agent processes) per
    trainable agent. N >= 1: a pool of N slots shared by all trainable agents, bound to an agent
    while it trains, idle agents' training state swapped out to host memory."""
    slot_ranks: str = ""
    """A shared pool of slots of different sizes, e.g. "1,2": one slot of 1 rank and one of 2
    (overrides `slots`); an agent needs AgentSpec.train_ranks (default ranks_per_agent)."""
    snapshots: bool = True
    """Keep each agent's training state after each step in host memory: a dead trainer slot
    is replaced and its agent's batch re-accumulated from it (off: the run stops)."""

    def __post_init__(self) -> None:
        require(self.ranks_per_agent >= 1, "trainer_pool.ranks_per_agent", self.ranks_per_agent,
                 "must be >= 1")
        require(self.slots >= 0, "trainer_pool.slots", self.slots,
                 "must be >= 0 (0: one slot per trainable agent)")
        try:
            sizes = [int(x) for x in self.slot_ranks.split(",")] if self.slot_ranks else []
        except ValueError:
            sizes = [0]
        require(all(n >= 1 for n in sizes), "trainer_pool.slot_ranks", self.slot_ranks,
                 'must list the ranks of each shared slot, like "1,2" (or be empty)')
        parse_cpus(self.cpus, "trainer_pool.cpus")


@dataclass(kw_only=True, frozen=True)
class ObserveConfig:
    """Watching a run (section `observe`): dashboard, report, TensorBoard, W&B."""

    dashboard: bool = True
    """Serve the live dashboard, /api/status and /metrics (flexmarl.observe.server) during the run."""
    host: str = "127.0.0.1"
    """Interface the dashboard listens on; loopback by default (0.0.0.0 exposes it)."""
    port: int = 0
    """Dashboard port; 0 picks a free one (the address is printed)."""
    token: str = ""
    """Secret the dashboard, /api/status and /metrics require when set (`Authorization: Bearer
    TOKEN` or `?token=TOKEN`); required when `host` is not loopback."""
    report: bool = True
    """Write RUN_DIR/report/report.html and its plots when the run ends."""
    tensorboard: bool = True
    """Also write the per-step metrics as TensorBoard event files (RUN_DIR/tensorboard)."""
    wandb: bool = False
    """Also log them to Weights & Biases (needs `pip install wandb`)."""
    wandb_project: str = "flexmarl"
    wandb_mode: str = "offline"
    """`offline` (files under RUN_DIR/wandb, no network; `wandb sync` later) or `online`."""

    def __post_init__(self) -> None:
        require(0 <= self.port <= 65535, "observe.port", self.port, "must be in 0..65535")
        require(bool(self.host), "observe.host", self.host, "must not be empty")
        require(self.wandb_mode in ("offline", "online"), "observe.wandb_mode",
                 self.wandb_mode, "must be offline or online")


@dataclass(kw_only=True, frozen=True)
class ClusterConfig:
    """Workers on other machines (section `cluster`); see flexmarl/launch/nodes.py."""

    listen: str = ""
    """tcp://ADDR:PORT where `flexmarl-node`s join (`flexmarl run --listen`); empty: every
    worker is a local process."""
    rollout_nodes: int = 1
    """Nodes with role rollout (or any) the run waits for before it starts."""
    trainer_nodes: int = 1
    """Nodes with role trainer (or any) the run waits for."""
    join_timeout_s: float = 600.0
    """How long the run waits for them; then it stops, naming what is missing."""
    node_timeout_s: float = 30.0
    """A node silent this long is lost: its workers are handled as dead. A node whose process
    ended is lost at once (its connection closes); this is for one that hangs or is cut off, and
    is sized so that a busy node on a loaded machine is not taken for dead (heartbeats come
    from a thread, and the run's own stalls are not counted against the node)."""
    store_port: int = 0
    """Port of the TCPStore trainer ranks rendezvous at (on the listen host); 0: a free one."""
    instances_per_node: int = 1
    """Rollout instances a rollout node that joins mid-run gets (each for the agent with the
    fewest instances then)."""

    def __post_init__(self) -> None:
        require(not self.listen or self.listen.startswith("tcp://"), "cluster.listen",
                 self.listen, "must be tcp://ADDR:PORT (or empty for one machine)")
        for name in ("rollout_nodes", "trainer_nodes", "instances_per_node"):
            require(getattr(self, name) >= 0, f"cluster.{name}", getattr(self, name),
                     "must be >= 0")
        for name in ("join_timeout_s", "node_timeout_s"):
            require(getattr(self, name) > 0, f"cluster.{name}", getattr(self, name),
                     "must be > 0")
        require(0 <= self.store_port <= 65535, "cluster.store_port", self.store_port,
                 "must be in 0..65535")


@dataclass(kw_only=True, frozen=True)
class GatewayConfig:
    """Training an existing app through an OpenAI-compatible endpoint (section `gateway`)."""

    enabled: bool = False
    """Serve /v1/chat/completions etc.; the team's tasks and workflow are the app's episodes."""
    host: str = "127.0.0.1"
    port: int = 0
    """0: a free port (the address is printed)."""
    token: str = ""
    """API key the app must send (Bearer); required when `host` is not loopback."""
    app: str = ""
    """A shell command the run starts once the gateway is up (with OPENAI_BASE_URL and
    OPENAI_API_KEY set) and stops at the end; its early exit fails the run."""
    episode_timeout_s: float = 300.0
    """An episode idle this long is expired: dropped from training as a failed trajectory."""
    seat_timeout_s: float = 600.0
    """A trajectory seat no episode took within this fails (the app stopped sending)."""

    def __post_init__(self) -> None:
        require(0 <= self.port <= 65535, "gateway.port", self.port, "must be in 0..65535")
        for name in ("episode_timeout_s", "seat_timeout_s"):
            require(getattr(self, name) > 0, f"gateway.{name}", getattr(self, name),
                     "must be > 0")
