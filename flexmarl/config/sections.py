"""The sections of the run as a whole and of its upper parts: run, team, observe, cluster,
gateway, plan and devices. Each is validated in its __post_init__; every error names `section.key`.

The other sections are this package's other modules (pipeline.py, rollout.py, balance.py,
training.py) and runtime.config (`transport`, `supervisor`).
"""
from __future__ import annotations

from dataclasses import dataclass

from flexmarl.checks import ConfigError, parse_ranges, require

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
    steps: int = 20
    """Global steps: each samples one batch of tasks and updates every agent once."""
    log_level: str = "WARNING"
    """Python logging level of the driver and of worker processes (case-insensitive)."""
    save_state: bool = True
    """After each step, write every agent's whole training state under RUN_DIR/state
    (atomically; older steps pruned) so `flexmarl run --resume RUN_DIR` can go on."""
    save_every: int = 1
    """With save_state: write the states after every this many steps (and after the last).
    A resumed run goes on from the last step saved, redoing the steps after it. Large agents
    want more than 1: a 14B agent's state is ~237 GB (16 bytes/param), minutes of disk."""
    keep_every: int = 0
    """With save_state: the states after every this many steps stay (the others are pruned
    once a newer one is saved), for `flexmarl eval --step N` and the saved versions of
    `flexmarl eval --cross-play`; a multiple of save_every. 0: only the latest."""
    merge_adapters: bool = False
    """LoRA agents (AgentSpec.lora): their final checkpoints (RUN_DIR/checkpoints/AGENT/
    version-N, the adapter in PEFT's format) also hold merged/, the base with the adapter
    merged in: a whole model directory any loader takes."""

    def __post_init__(self) -> None:
        require(bool(self.name) and "/" not in self.name and self.name not in (".", ".."),
                 "run.name", self.name, "must be a non-empty directory name without '/'")
        require(bool(self.out_dir), "run.out_dir", self.out_dir, "must not be empty")
        require(self.seed >= 0, "run.seed", self.seed, "must be >= 0")
        require(self.steps >= 1, "run.steps", self.steps, "must be >= 1")
        require(self.save_every >= 1, "run.save_every", self.save_every,
                 "must be >= 1 (1: after every step)")
        require(self.keep_every >= 0 and self.keep_every % self.save_every == 0,
                "run.keep_every", self.keep_every,
                f"must be 0 or a multiple of run.save_every ({self.save_every})")
        level = self.log_level.upper()
        require(level in LOG_LEVELS, "run.log_level", self.log_level,
                 f"must be one of {', '.join(LOG_LEVELS)}")
        object.__setattr__(self, "log_level", level)


@dataclass(kw_only=True, frozen=True)
class TeamRef:
    """Which team to train (section `team`)."""

    path: str = "agents/smol_duo.py"
    """Team file: relative paths are looked up in the current directory, then in the package
    root (so the default works from anywhere). `load_config` stores the resolved path."""
    tasks: str = ""
    """A task file (.jsonl, .json, .csv, .parquet) or a `datasets` save_to_disk directory whose
    rows replace the team file's own tasks (flexmarl.launch.task_files); "" keeps them. Looked
    up like `path`: the current directory, then the package root."""
    prompt_field: str = "prompt"
    """With `tasks`: the column holding each task's prompt (text, or a list of chat messages)."""
    answer_field: str = "answer"
    """With `tasks`: the column holding the reference answer; "": none (every answer is "")."""
    id_field: str = ""
    """With `tasks`: a column of unique task ids; "": "{file stem}-{row index}"."""
    heldout: float = 0.0
    """With `tasks`: rows held out of training (for held-out accuracy), a count (50) or a
    fraction (0.1), after a shuffle by run.seed; 0: a DatasetDict's test/validation split if it
    has one, else the team file's own held-out tasks."""
    limit: int = 0
    """With `tasks`: read only the first this many rows (of each split); 0: all."""

    def __post_init__(self) -> None:
        require(bool(self.path), "team.path", self.path,
                 "must name a team file; pass --team PATH or set team.path")
        require(bool(self.prompt_field), "team.prompt_field", self.prompt_field,
                "must name the prompt column of team.tasks")
        seen: dict[str, str] = {}
        for key in ("prompt_field", "answer_field", "id_field"):
            column = getattr(self, key)
            require(column not in seen, f"team.{key}", column,
                    f"must name another column than team.{seen.get(column)}")
            if column:
                seen[column] = key
        require(self.heldout >= 0 and (self.heldout < 1 or float(self.heldout).is_integer()),
                "team.heldout", self.heldout,
                "must be a count of rows (0, 1, 2, ...) or a fraction in (0, 1)")
        require(self.limit >= 0, "team.limit", self.limit, "must be >= 0 (0: every row)")
        if not self.tasks:
            for key in ("prompt_field", "answer_field", "id_field", "heldout", "limit"):
                default = TeamRef.__dataclass_fields__[key].default
                require(getattr(self, key) == default, f"team.{key}", getattr(self, key),
                        "applies to a task file only: set team.tasks too, or leave it out")


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
    TOKEN`, or open /?token=TOKEN once: it sets a cookie); required when `host` is not
    loopback."""
    report: bool = True
    """Write RUN_DIR/report/report.html and its plots when the run ends."""
    tensorboard: bool = True
    """Also write the per-step metrics as TensorBoard event files (RUN_DIR/tensorboard)."""
    wandb: bool = False
    """Also log them to Weights & Biases (needs `pip install wandb`)."""
    wandb_project: str = "flexmarl"
    wandb_mode: str = "offline"
    """`offline` (files under RUN_DIR/wandb, no network; `wandb sync` later) or `online`."""
    stall_warn_s: float = 300.0
    """A run that stores no sample, finishes no step and updates no agent for this long is
    reported (log and dashboard) with what it waits for, again every stall_warn_s; 0: off."""

    def __post_init__(self) -> None:
        require(self.stall_warn_s >= 0, "observe.stall_warn_s", self.stall_warn_s,
                "must be >= 0 (0 turns the warning off)")
        require(0 <= self.port <= 65535, "observe.port", self.port, "must be in 0..65535")
        require(bool(self.host), "observe.host", self.host, "must not be empty")
        require(self.wandb_mode in ("offline", "online"), "observe.wandb_mode",
                 self.wandb_mode, "must be offline or online")


LAUNCHERS = ("local", "nodes", "ray")


@dataclass(kw_only=True, frozen=True)
class ClusterConfig:
    """Where the workers run (section `cluster`): this machine, `flexmarl-node`s
    (flexmarl/launch/nodes.py) or a Ray cluster (runtime/ray_cluster.py); docs/multinode.md."""

    launcher: str = "local"
    """"local": worker processes of this machine; "nodes": `flexmarl-node`s that join at
    cluster.listen (bare metal; setting cluster.listen alone means this too); "ray": actors
    on a Ray cluster (cluster.ray_address), placed in placement groups, still talking
    ZeroMQ (`pip install 'flexmarl[ray]'`)."""
    listen: str = ""
    """tcp://ADDR:PORT where `flexmarl-node`s join (`flexmarl run --listen`); empty: every
    worker is a local process."""
    ray_address: str = ""
    """With launcher "ray": "auto" (the Ray `ray start` made on this machine), a head's
    HOST:PORT or ray://HOST:PORT; "": a Ray of this run's own on this machine."""
    ray_worker_cpus: float = 1.0
    """With launcher "ray": the CPUs each worker's bundle asks Ray for (rollout instances and
    trainer ranks alike; GPUs come from the plan). Lower it to pack more workers on small
    CPU nodes."""
    rollout_nodes: int = 1
    """Nodes with role rollout (or any) the run waits for before it starts."""
    trainer_nodes: int = 1
    """Nodes with role trainer (or any) the run waits for."""
    join_timeout_s: float = 600.0
    """How long the run waits for them; then it stops, naming what is missing. With launcher
    "ray": how long a worker's placement group may wait for room on the cluster."""
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
        require(self.launcher in LAUNCHERS, "cluster.launcher", self.launcher,
                 f"must be one of {', '.join(LAUNCHERS)}")
        require(self.launcher != "nodes" or bool(self.listen), "cluster.launcher",
                 self.launcher, "needs cluster.listen = \"tcp://ADDR:PORT\" (where the "
                 "flexmarl-nodes join; `flexmarl run --listen`)")
        require(self.launcher != "ray" or not self.listen, "cluster.listen", self.listen,
                 "is for flexmarl-node joins; with cluster.launcher = \"ray\" leave it empty "
                 "(Ray places the workers)")
        require(self.launcher == "ray" or not self.ray_address, "cluster.ray_address",
                 self.ray_address, "is used only with cluster.launcher = \"ray\"")
        require(self.ray_worker_cpus > 0, "cluster.ray_worker_cpus", self.ray_worker_cpus,
                 "must be > 0")
        for name in ("rollout_nodes", "trainer_nodes", "instances_per_node"):
            require(getattr(self, name) >= 0, f"cluster.{name}", getattr(self, name),
                     "must be >= 0")
        for name in ("join_timeout_s", "node_timeout_s"):
            require(getattr(self, name) > 0, f"cluster.{name}", getattr(self, name),
                     "must be > 0")
        require(0 <= self.store_port <= 65535, "cluster.store_port", self.store_port,
                 "must be in 0..65535")

    @property
    def engine(self) -> str:
        """The launcher in effect: cluster.listen alone means "nodes"."""
        return "nodes" if self.listen else self.launcher

    @property
    def remote(self) -> bool:
        """Workers may run on other machines (placed there, pinned there, with their own
        view of devices and files): flexmarl-nodes or Ray."""
        return self.engine != "local"


@dataclass(kw_only=True, frozen=True)
class GatewayConfig:
    """Training an existing app through an OpenAI-compatible endpoint (section `gateway`)."""

    enabled: bool = False
    """Serve /v1/chat/completions etc.; the team's tasks and workflow are the app's episodes."""
    host: str = "127.0.0.1"
    port: int = 0
    """0: a free port (the address is printed)."""
    token: str = ""
    """API key every request must carry (Bearer); unset: one generated per run, written to
    RUN_DIR/gateway_token and given to `app` as OPENAI_API_KEY. Required when `host` is not
    loopback."""
    app: str = ""
    """A shell command the run starts once the gateway is up (with OPENAI_BASE_URL and
    OPENAI_API_KEY set) and stops at the end; its early exit fails the run."""
    eval_app: str = ""
    """A shell command that plays the app's held-out episodes (as `app` plays its training
    ones, with other problems) until it is stopped: `flexmarl eval RUN_DIR` serves the run's
    weights through a gateway, starts it, scores the first gateway_team(heldout=N) episodes
    and stops it (flexmarl.gateway.heldout). Empty: a gateway team cannot be evaluated."""
    episode_timeout_s: float = 300.0
    """An episode idle this long is expired: dropped from training as a failed trajectory."""
    seat_timeout_s: float = 600.0
    """A trajectory seat no episode took within this fails (the app stopped sending)."""

    def __post_init__(self) -> None:
        require(0 <= self.port <= 65535, "gateway.port", self.port, "must be in 0..65535")
        for name in ("episode_timeout_s", "seat_timeout_s"):
            require(getattr(self, name) > 0, f"gateway.{name}", getattr(self, name),
                     "must be > 0")


@dataclass(kw_only=True, frozen=True)
class PlanConfig:
    """How `flexmarl plan` and trainer_pool.slots = "auto" see this run on a cluster (section
    `plan`; flexmarl.sim.team_plan): the team's own workflow and tasks, run by the cluster
    simulator on the cost model's devices."""

    nodes: int = 0
    """Nodes of the cost model's devices (16 each by default); 0: cluster.rollout_nodes +
    cluster.trainer_nodes when cluster.listen is set, else 1."""
    models: str = ""
    """Each agent's size in the cost model, e.g. "solver=14b,checker=32b"; an agent left out
    is sized from its model's name (Qwen2.5-14B-Instruct: 14b)."""
    response_tokens: str = ""
    """Median response tokens per agent, "solver=256,checker=64", or one number for all; an
    agent left out: a quarter of its sampling.max_tokens. Lengths are lognormal around it."""
    costs: str = ""
    """The cost model file; "": flexmarl/sim/costs.toml."""
    steps: int = 4
    """Simulated steps per placement tried (the first and the last are not measured)."""

    def __post_init__(self) -> None:
        require(self.nodes >= 0, "plan.nodes", self.nodes, "must be >= 0 (0: from [cluster])")
        require(self.steps >= 3, "plan.steps", self.steps,
                "must be >= 3 (the first and the last step are not measured)")
        pairs(self.models, "plan.models")
        try:
            float(self.response_tokens)
        except ValueError:
            lengths = pairs(self.response_tokens, "plan.response_tokens")
            require(all(_positive(v) for v in lengths.values()), "plan.response_tokens",
                    self.response_tokens, "must give positive numbers of tokens")
        else:
            require(_positive(self.response_tokens), "plan.response_tokens",
                    self.response_tokens, "must be a positive number of tokens")


CORE_PLACEMENTS = ("auto", "split", "shared")
"""devices.cores: how rollout and training share a CPU machine's cores."""


@dataclass(kw_only=True, frozen=True)
class DevicesConfig:
    """GPUs of the run (section `devices`); see flexmarl/placement/devices.py."""

    gpus: str = "auto"
    """This machine's GPUs the run may use: "auto" (every visible one), "none" (no GPU:
    everything on CPU), or indices of visible GPUs like "0-3" or "0,2". Nodes report their own
    (flexmarl-node --devices)."""
    colocate: bool = False
    """Let workers share GPUs by memory: an instance takes rollout.gpu_memory_utilization of
    each of its GPUs, a trainer rank trainer_memory_fraction; false: every worker owns its
    GPUs."""
    trainer_memory_fraction: float = 0.4
    """With colocate: the share of its GPU's memory a trainer rank may use (set as torch's
    per-process memory fraction, so it cannot take the engine's)."""
    reserve_fraction: float = 0.1
    """With colocate: the share of each GPU's memory that no worker's share may take. CUDA
    contexts (about 0.5 GB per process), NCCL's buffers and vLLM's weight-receive buffers sit
    outside every share, and vLLM refuses to start unless the free memory covers its whole
    share: the shares on one GPU add up to at most 1 - reserve_fraction."""
    placement: str = "disaggregated"
    """Where each agent generates and trains. "disaggregated": rollout instances and trainer
    slots on devices of their own (slots shared by agents, trainer_pool.slots). "time_shared":
    each trainable agent's instances and its own trainer slot on one set of devices that
    alternate: the engines sleep while the agent trains (vLLM's sleep mode on GPU; the torch
    engine offloads its weights), the trainer is parked while they generate. Per agent:
    "solver=time_shared,checker=disaggregated"; agents joined by + share one group of devices
    and one slot: "solver+checker=time_shared" (flexmarl.placement.timeshare)."""
    cores: str = "auto"
    """How rollout and training share this machine's CPU cores when both run on them (trainers
    on CPU, not on nodes): "split" (rollout processes on half the cores, trainer processes on
    the other half, each with its role's cores as threads: rollout.cpus / trainer_pool.cpus),
    "shared" (both phases on every core: each agent gets one single-threaded rollout instance
    per core, and its trainer all the cores as threads; the phases hand the cores over as the
    work moves, flexmarl.placement.cores), or "auto": the one flexmarl.sim.cpu_cores prices
    faster for the team. Pins nothing where rollout.cpus or trainer_pool.cpus is set."""
    allow_unverified: bool = False
    """Let the planner (`flexmarl plan`, trainer_pool.slots = "auto") choose placements on paths
    that have never run on this hardware: time-shared placements on GPU (vLLM's sleep /
    wake_up with its trainer parked beside it). false: it chooses among the others and says
    which one it would have picked, and why not (flexmarl.sim.plan.refusal)."""

    def __post_init__(self) -> None:
        parse_gpus(self.gpus)
        require(self.cores in CORE_PLACEMENTS, "devices.cores", self.cores,
                f"must be one of {', '.join(CORE_PLACEMENTS)}")
        require(isinstance(self.allow_unverified, bool), "devices.allow_unverified",
                self.allow_unverified, "must be true or false")
        try:
            parse_placement(self.placement)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        require(0 < self.trainer_memory_fraction <= 1, "devices.trainer_memory_fraction",
                self.trainer_memory_fraction, "must be in (0, 1]")
        require(0 <= self.reserve_fraction < 1, "devices.reserve_fraction",
                self.reserve_fraction, "must be in [0, 1)")


def parse_gpus(spec: str, visible: int | None = None) -> tuple[int, ...] | None:
    """devices.gpus as GPU indices: None for "auto" (all `visible`, when that is known), () for
    "none", else the listed indices, each checked against `visible` when it is given."""
    text = spec.strip()
    if text == "auto":
        return None if visible is None else tuple(range(visible))
    if text == "none":
        return ()
    try:
        ids = parse_ranges(text)
    except ValueError:
        raise ConfigError(f'devices.gpus must be "auto", "none" or GPU indices like "0-3" or '
                          f'"0,2", got {spec!r}') from None
    if visible is not None and max(ids) >= visible:
        raise ConfigError(f"devices.gpus = {spec!r} names GPUs {sorted(i for i in ids if i >= visible)}"
                          f" but {visible} {'is' if visible == 1 else 'are'} visible here "
                          f'({_span(range(visible)) or "none"}); list visible ones, or "auto"')
    return tuple(sorted(ids))


def _span(ids) -> str:
    """[0, 1, 2, 5] -> "0-2,5"."""
    ids = sorted(ids)
    out, start = [], None
    for i, d in enumerate(ids):
        if start is None:
            start = d
        if i + 1 == len(ids) or ids[i + 1] != d + 1:
            out.append(f"{start}-{d}" if d > start else f"{d}")
            start = None
    return ",".join(out)


def pairs(text: str, name: str) -> dict[str, str]:
    """"a=1,b=2" -> {"a": "1", "b": "2"} ("" -> {}); a ConfigError naming `name` otherwise."""
    out: dict[str, str] = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = item.partition("=")
        require(bool(sep and key.strip() and value.strip()), name, text,
                'must be comma-separated AGENT=VALUE pairs, like "solver=14b,checker=32b"')
        out[key.strip()] = value.strip()
    return out


def _positive(value: str) -> bool:
    try:
        return float(value) > 0
    except ValueError:
        return False


def parse_placement(text: str) -> list[tuple[str, ...]] | str:
    """devices.placement: "disaggregated", "time_shared" (every trainable agent its own group),
    or per agent, comma-separated: "solver=time_shared,checker=disaggregated"; agents joined by
    "+" share one group: "solver+checker=time_shared". Returns the string for the two uniform
    values, else the time-shared groups (tuples of agent names); a ValueError names what is
    wrong."""
    text = text.strip()
    if text in ("disaggregated", "time_shared"):
        return text
    groups: list[tuple[str, ...]] = []
    seen: set[str] = set()
    for part in filter(None, (p.strip() for p in text.split(","))):
        names, sep, kind = part.partition("=")
        agents = tuple(a.strip() for a in names.split("+"))
        if not sep or kind.strip() not in ("time_shared", "disaggregated") or not all(agents):
            raise ValueError(
                f"devices.placement: cannot read {part!r}; give \"disaggregated\", "
                "\"time_shared\", or per agent \"solver=time_shared,checker=disaggregated\" "
                "(agents joined by + share one group of devices: \"solver+checker=time_shared\")")
        if seen & set(agents):
            raise ValueError(f"devices.placement names {sorted(seen & set(agents))} twice")
        seen |= set(agents)
        if kind.strip() == "time_shared":
            groups.append(agents)
        elif len(agents) > 1:
            raise ValueError(f"devices.placement: {part!r} joins agents that are not time "
                             "shared; write each disaggregated agent on its own")
    if not seen:
        raise ValueError("devices.placement is empty; give \"disaggregated\" or \"time_shared\"")
    return groups
