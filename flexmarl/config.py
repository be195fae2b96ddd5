"""Experiment config: one small dataclass per section, loaded from TOML plus `--set` overrides.

    DEFAULT_TOML ─► merge CONFIG file ─► merge --set section.key=value ─► --team
        ─► Config.from_dict: types checked by annotation, values by each section's
           __post_init__ ─► team.path resolved to an existing file

Every problem a user can fix raises one `ConfigError` whose message names `section.key`, says
what was wrong and how to fix it. The trainer section is `flexmarl.trainer.TrainerConfig` itself,
so its fields and rules live in one place.
"""
from __future__ import annotations

import dataclasses
import difflib
import math
import os
import tomllib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from flexmarl.balancer import BalancerConfig
from flexmarl.sections import ClusterConfig, GatewayConfig
from flexmarl.rollout.engine import BACKENDS, EngineConfig
from flexmarl.trainer import TrainerConfig
from runtime.config import SupervisorConfig, TransportConfig

__all__ = ["PIPELINE_MODES", "LOG_LEVELS", "DEFAULT_TOML", "ConfigError", "RunConfig", "TeamRef",
           "PipelineConfig", "RolloutConfig", "TrainerConfig", "TrainPlacement", "Config",
           "load_config", "resolve_team_path", "dump_toml", "parse_cpus", "role_cpus"]

PIPELINE_MODES = ("sync", "micro_batch", "one_step_off", "bounded")
"""Valid `pipeline.mode` values; each names a pipeline policy."""
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
PACKAGE_ROOT = Path(__file__).resolve().parent.parent
"""The repository root of an editable install: relative team paths are also looked up here."""


class ConfigError(ValueError):
    """A config problem the user can fix; the message names `section.key` and the fix."""


def _require(ok: bool, name: str, value: object, rule: str) -> None:
    if not ok:
        raise ConfigError(f"{name} {rule}, got {value!r}")


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
        _require(bool(self.name) and "/" not in self.name and self.name not in (".", ".."),
                 "run.name", self.name, "must be a non-empty directory name without '/'")
        _require(bool(self.out_dir), "run.out_dir", self.out_dir, "must not be empty")
        _require(self.seed >= 0, "run.seed", self.seed, "must be >= 0")
        _require(self.steps >= 1, "run.steps", self.steps, "must be >= 1")
        level = self.log_level.upper()
        _require(level in LOG_LEVELS, "run.log_level", self.log_level,
                 f"must be one of {', '.join(LOG_LEVELS)}")
        object.__setattr__(self, "log_level", level)


@dataclass(kw_only=True, frozen=True)
class TeamRef:
    """Which team to train (section `team`)."""

    path: str = "agents/math_duo.py"
    """Team file: relative paths are looked up in the current directory, then in the package
    root (so the default works from anywhere). `load_config` stores the resolved path."""

    def __post_init__(self) -> None:
        _require(bool(self.path), "team.path", self.path,
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
        _require(self.mode in PIPELINE_MODES, "pipeline.mode", self.mode,
                 f"must be one of {', '.join(PIPELINE_MODES)}")
        for name in ("tasks_per_step", "max_concurrent_tasks", "max_concurrent_calls",
                     "micro_batch_groups", "max_staleness"):
            _require(getattr(self, name) >= 1, f"pipeline.{name}", getattr(self, name),
                     "must be >= 1")
        _require(self.trajectories_per_task >= 2, "pipeline.trajectories_per_task",
                 self.trajectories_per_task,
                 "must be >= 2 (GRPO learns from reward differences within a group; a group "
                 "of one always has advantage 0)")
        _require(self.is_cap > 0, "pipeline.is_cap", self.is_cap, "must be > 0")
        _require(self.samples_per_request >= 0, "pipeline.samples_per_request",
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
        _require(self.backend in BACKENDS, "rollout.backend", self.backend,
                 f"must be one of {', '.join(BACKENDS)}")
        for name in ("instances_per_agent", "kv_cache_bytes", "max_model_len"):
            _require(getattr(self, name) >= 1, f"rollout.{name}", getattr(self, name),
                     "must be >= 1")
        _require(self.ready_timeout_s > 0, "rollout.ready_timeout_s", self.ready_timeout_s,
                 "must be > 0")
        parse_cpus(self.cpus, "rollout.cpus")

    def engine_config(self, model_dir: str, *, seed: int) -> EngineConfig:
        """The settings of one instance serving the model in `model_dir`."""
        return EngineConfig(backend=self.backend, model_dir=model_dir, seed=seed,
                            max_model_len=self.max_model_len, kv_cache_bytes=self.kv_cache_bytes)


@dataclass(kw_only=True, frozen=True)
class TrainPlacement:
    """Where each agent's trainer runs (section `train`); its optimizer is section `trainer`."""

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
        _require(self.ranks_per_agent >= 1, "train.ranks_per_agent", self.ranks_per_agent,
                 "must be >= 1")
        _require(self.slots >= 0, "train.slots", self.slots,
                 "must be >= 0 (0: one slot per trainable agent)")
        try:
            sizes = [int(x) for x in self.slot_ranks.split(",")] if self.slot_ranks else []
        except ValueError:
            sizes = [0]
        _require(all(n >= 1 for n in sizes), "train.slot_ranks", self.slot_ranks,
                 'must list the ranks of each shared slot, like "1,2" (or be empty)')
        parse_cpus(self.cpus, "train.cpus")


def parse_cpus(spec: str, name: str = "cpus") -> tuple[int, ...]:
    """ "0", "0,2", "0-3" or "0-1,4" as sorted core ids; "" is () (no pinning). "auto" is
    resolved by `role_cpus`, here it is ()."""
    if not spec.strip() or spec.strip() == "auto":
        return ()
    ids: set[int] = set()
    try:
        for part in spec.split(","):
            lo, _, hi = part.strip().partition("-")
            first, last = int(lo), int(hi or lo)
            if first < 0 or last < first:
                raise ValueError
            ids.update(range(first, last + 1))
    except ValueError:
        raise ConfigError(f"{name} must list CPU cores like \"0\", \"0,2\" or \"0-3\", got "
                          f"{spec!r}") from None
    available = _available_cpus()
    if available is not None and not ids <= set(available):
        raise ConfigError(f"{name} = {spec!r} names cores {sorted(ids - set(available))} that "
                          f"this process cannot use (available: {available})")
    return tuple(sorted(ids))


def _available_cpus() -> list[int] | None:
    return sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None


def role_cpus(config: "Config") -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The cores of rollout processes and of trainer processes; () means not pinned.

    "auto" (the default of both) splits this process's cores between the roles when trainers
    run on CPU: rollout gets the first half, training the second (one core each on a 2-core
    machine), each process's thread pool sized to its role's cores. Without it every torch
    process starts one thread per core and they fight over all of them: a training step of the
    default experiment measured about 4x slower unpinned on 2 cores (bench/README.md). With
    trainers on GPU, or a single core, "auto" pins nothing.
    """
    rollout = parse_cpus(config.rollout.cpus, "rollout.cpus")
    train = parse_cpus(config.train.cpus, "train.cpus")
    auto_r, auto_t = config.rollout.cpus.strip() == "auto", config.train.cpus.strip() == "auto"
    cores = _available_cpus() or []
    if not (auto_r or auto_t) or config.trainer.device != "cpu" or len(cores) < 2:
        return rollout, train
    half = len(cores) // 2
    if auto_r and auto_t:
        return tuple(cores[:half]), tuple(cores[half:])
    # One role explicit: the auto one gets the cores the other leaves (its half if unpinned).
    if auto_r:
        return (tuple(c for c in cores if c not in train) if train else tuple(cores[:half])), train
    return rollout, (tuple(c for c in cores if c not in rollout) if rollout else
                     tuple(cores[half:]))


@dataclass(kw_only=True, frozen=True)
class ObserveConfig:
    """Watching a run (section `observe`): dashboard, report, TensorBoard, W&B."""

    dashboard: bool = True
    """Serve the live dashboard, /api/status and /metrics (flexmarl.server) during the run."""
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
        _require(0 <= self.port <= 65535, "observe.port", self.port, "must be in 0..65535")
        _require(bool(self.host), "observe.host", self.host, "must not be empty")
        _require(self.wandb_mode in ("offline", "online"), "observe.wandb_mode",
                 self.wandb_mode, "must be offline or online")


@dataclass(kw_only=True, frozen=True)
class Config:
    """A whole experiment: one field per TOML section."""

    run: RunConfig = field(default_factory=RunConfig)
    team: TeamRef = field(default_factory=TeamRef)
    pipeline: PipelineConfig = field(default_factory=PipelineConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    train: TrainPlacement = field(default_factory=TrainPlacement)
    balance: BalancerConfig = field(default_factory=BalancerConfig)
    observe: ObserveConfig = field(default_factory=ObserveConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    gateway: GatewayConfig = field(default_factory=GatewayConfig)
    transport: TransportConfig = field(default_factory=TransportConfig)
    supervisor: SupervisorConfig = field(default_factory=SupervisorConfig)

    def to_dict(self) -> dict[str, dict[str, Any]]:
        """Plain data (tuples as lists), the inverse of `from_dict`."""
        return {s: {k: list(v) if isinstance(v, tuple) else v
                    for k, v in dataclasses.asdict(getattr(self, s)).items()}
                for s in SECTIONS}

    def to_toml(self) -> str:
        """TOML that `load_config` reads back to this config (None values are left out)."""
        return dump_toml(self.to_dict())

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, sources: Mapping[str, str] | None = None
                  ) -> Config:
        """Build and validate from `{section: {key: value}}`; missing keys take their defaults.

        `sources` maps "section.key" to where a value came from, for error messages.
        """
        sources = sources or {}
        _check_known(data, sources)
        built = {}
        for section, cls_ in SECTIONS.items():
            values = data.get(section, {})
            hints = typing.get_type_hints(cls_)
            kwargs = {k: _coerce(f"{section}.{k}", v, hints[k], sources.get(f"{section}.{k}"))
                      for k, v in values.items()}
            try:
                built[section] = cls_(**kwargs)
            except ConfigError:
                raise
            except ValueError as e:  # e.g. TrainerConfig's own checks
                raise ConfigError(str(e)) from None
        return cls(**built)


SECTIONS: dict[str, type] = {"run": RunConfig, "team": TeamRef, "pipeline": PipelineConfig,
                             "rollout": RolloutConfig, "trainer": TrainerConfig,
                             "train": TrainPlacement, "balance": BalancerConfig,
                             "observe": ObserveConfig, "cluster": ClusterConfig,
                             "gateway": GatewayConfig,
                             "transport": TransportConfig, "supervisor": SupervisorConfig}
"""TOML section name -> its dataclass, in file order."""

DEFAULT_TOML = (Path(__file__).with_name("default.toml")).read_text(encoding="utf-8")
"""The default experiment, every key with its default and a comment (flexmarl/default.toml)."""


def load_config(path: str | None = None, overrides: Sequence[str] = (), *,
                team: str | None = None) -> Config:
    """DEFAULT_TOML, then the TOML file at `path`, then `section.key=value` overrides, then
    `team` as team.path; validated, with team.path resolved to an existing file."""
    data = tomllib.loads(DEFAULT_TOML)
    sources = {f"{s}.{k}": "default" for s, keys in data.items() for k in keys}
    if path is not None:
        where = f"in {path}"
        _merge(data, _read_toml(path), sources, where)
    for item in overrides:
        section, key, value = _parse_override(item)
        _merge(data, {section: {key: value}}, sources, "from --set")
    if team is not None:
        _merge(data, {"team": {"path": team}}, sources, "from --team")
    config = Config.from_dict(data, sources=sources)
    resolved = resolve_team_path(config.team.path)
    return dataclasses.replace(config, team=TeamRef(path=str(resolved)))


def resolve_team_path(path: str) -> Path:
    """An existing team file: absolute, else relative to the current dir, else to PACKAGE_ROOT."""
    p = Path(path).expanduser()
    candidates = [p] if p.is_absolute() else [Path.cwd() / p, PACKAGE_ROOT / p]
    for c in candidates:
        if c.is_file():
            return c.resolve()
    looked = " and ".join(str(c) for c in candidates)
    raise ConfigError(f"team.path {path!r} does not exist (looked for {looked}); "
                      "pass --team PATH or set team.path")


# ------------------------------------------------------------------------------------ helpers

def _read_toml(path: str) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"config file {path!r} does not exist") from None
    except IsADirectoryError:
        raise ConfigError(f"config file {path!r} is a directory, not a TOML file") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config file {path!r} is not valid TOML: {e}") from None


def _merge(base: dict, extra: Mapping, sources: dict[str, str], where: str) -> None:
    """Deep-merge `extra` into `base` (sections are tables of leaf values)."""
    for section, table in extra.items():
        if not isinstance(table, Mapping):
            raise ConfigError(_not_a_section(section, table, where))
        dest = base.setdefault(section, {})
        if not isinstance(dest, dict):  # only if a caller merged a non-table before
            raise ConfigError(_not_a_section(section, dest, where))
        for key, value in table.items():
            dest[key] = value
            sources[f"{section}.{key}"] = where


def _not_a_section(name: str, value: object, where: str) -> str:
    owners = [s for s, cls in SECTIONS.items() if name in _field_names(cls)]
    hint = (f"; did you mean {name} under [{owners[0]}] ({owners[0]}.{name})?" if owners
            else f"; sections are {', '.join(SECTIONS)}")
    return f"{name} = {value!r} ({where}) is not a section table{hint}"


def _parse_override(item: str) -> tuple[str, str, Any]:
    """'section.key=value' -> (section, key, value); value is a TOML literal or a bare string."""
    lhs, eq, raw = item.partition("=")
    section, dot, key = lhs.strip().partition(".")
    if not eq or not dot or not section or not key or "." in key:
        raise ConfigError(f"--set expects section.key=value, got {item!r}")
    raw = raw.strip()
    cls = SECTIONS.get(section)
    if cls is not None and typing.get_type_hints(cls).get(key) is str and raw[:1] not in "\"'":
        # A string field takes the text as written, so `--set run.name=2024` is the name
        # "2024", not an int error; quote it to use TOML string syntax.
        return section, key, raw
    try:
        return section, key, tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return section, key, raw


def _field_names(cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(cls) if f.init]


def _check_known(data: Mapping[str, Any], sources: Mapping[str, str]) -> None:
    for section, table in data.items():
        if section not in SECTIONS:
            where = next((w for k, w in sources.items() if k.startswith(section + ".")), None)
            raise ConfigError(f"unknown section [{section}]{_at(where)}."
                              f"{_suggest(section, list(SECTIONS))} "
                              f"Valid sections: {', '.join(SECTIONS)}")
        if not isinstance(table, Mapping):
            raise ConfigError(_not_a_section(section, table, "in config"))
        valid = _field_names(SECTIONS[section])
        for key in table:
            if key not in valid:
                where = sources.get(f"{section}.{key}")
                raise ConfigError(f"unknown key {section}.{key}{_at(where)}."
                                  f"{_suggest(key, valid)} Valid keys of [{section}]: "
                                  f"{', '.join(valid)}")


def _suggest(word: str, choices: list[str]) -> str:
    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    return f" Did you mean {close[0]!r}?" if close else ""


def _at(where: str | None) -> str:
    return f" ({where})" if where else ""


_TYPE_NAMES = {bool: "a bool (true or false)", int: "an int", float: "a number", str: "a string"}


def _coerce(name: str, value: Any, hint: Any, where: str | None) -> Any:
    """`value` checked against the annotation `hint` (ints: no bools or floats; floats: ints
    too; tuples: lists too); returns it converted (int -> float, list -> tuple)."""
    ok, out = _match(value, hint)
    if ok:
        return out
    expected = _describe(hint)
    raise ConfigError(f"{name} expects {expected}, got {value!r} "
                      f"({type(value).__name__}){_at(where)}")


def _match(value: Any, hint: Any) -> tuple[bool, Any]:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        for arm in args:
            ok, out = _match(value, arm)
            if ok:
                return ok, out
        return False, None
    if hint is type(None):
        return value is None, None
    if hint is bool:
        return isinstance(value, bool), value
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool), value
    if hint is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        return ok, float(value) if ok else None
    if hint is str:
        return isinstance(value, str), value
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            return False, None
        elem = [args[0]] * len(value) if len(args) == 2 and args[1] is Ellipsis else list(args)
        if len(elem) != len(value):
            return False, None
        out = [_match(v, h) for v, h in zip(value, elem)]
        return all(ok for ok, _ in out), tuple(v for _, v in out)
    raise TypeError(f"config annotation {hint!r} is not supported")  # a programming error


def _describe(hint: Any) -> str:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        text = " or ".join(_describe(a) for a in args if a is not type(None))
        return text + (" (leave the key out for None)" if type(None) in args else "")
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return f"a list of {_describe(args[0])}s"
        return f"a list of {len(args)} ({', '.join(_describe(a) for a in args)})"
    return _TYPE_NAMES.get(hint, str(hint))


def dump_toml(data: Mapping[str, Mapping[str, Any]]) -> str:
    """TOML text of `{section: {key: scalar or list}}`; None values are left out (TOML has no
    null, and a missing key means the default)."""
    lines: list[str] = []
    for section, table in data.items():
        lines.append(f"[{section}]")
        lines.extend(f"{k} = {_toml_value(v)}" for k, v in table.items() if v is not None)
        lines.append("")
    return "\n".join(lines)


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, str):
        return '"' + "".join(_toml_char(c) for c in v) + '"'
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(f"cannot write {type(v).__name__} {v!r} as TOML")


_TOML_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f",
                 "\r": "\\r"}


def _toml_char(c: str) -> str:
    if c in _TOML_ESCAPES:
        return _TOML_ESCAPES[c]
    if ord(c) < 0x20 or ord(c) == 0x7F:
        return f"\\u{ord(c):04x}"
    return c
