"""Experiment config: one small dataclass per section, loaded from TOML plus `--set` overrides.

    DEFAULT_TOML ─► the team file's own config (Team.config) ─► merge CONFIG file
        ─► merge --set section.key=value ─► --team ─► Config.from_dict: types checked by annotation, values by each section's
           __post_init__ ─► team.path resolved to an existing file

Every problem a user can fix raises one `ConfigError` whose message names `section.key`, says
what was wrong and how to fix it. The trainer section is `flexmarl.training.trainer.TrainerConfig` itself,
so its fields and rules live in one place.
"""
from __future__ import annotations

import dataclasses
import difflib
import logging
import math
import tomllib
import types
import typing
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from flexmarl import _compat
from flexmarl.checks import ConfigError
from flexmarl.config.balance import BalancerConfig
from flexmarl.config.pipeline import EvalConfig, PipelineConfig
from flexmarl.config.rollout import RolloutConfig
from flexmarl.config.sections import (ClusterConfig, DevicesConfig, GatewayConfig, ObserveConfig,
    PlanConfig, RunConfig, TeamRef)
from flexmarl.config.training import TrainerConfig, TrainerPoolConfig
from runtime.config import SupervisorConfig, TransportConfig

__all__ = ["DEFAULT_TOML", "Config", "SECTIONS", "load_config", "resolve_team_path", "dump_toml"]

log = logging.getLogger(__name__)

PACKAGE_ROOT = Path(__file__).resolve().parents[2]
"""The repository root (the default team path is looked up there too)."""

WORKER_PRELOAD = ("flexmarl.training.worker", "flexmarl.rollout.worker",
                  "flexmarl.rollout.torch_engine")
"""supervisor.preload's default: the modules of FlexMARL's workers (torch, transformers and the
model code with them), imported once by the fork server the workers are forked from
(runtime.zygote): a worker is ready in a fraction of a second instead of about 4 s of imports
each (a run starts six on the default experiment, a replacement one more)."""


@dataclass(kw_only=True, frozen=True)
class Config:
    """A whole experiment: one field per TOML section."""

    run: RunConfig = field(default_factory=RunConfig)
    team: TeamRef = field(default_factory=TeamRef)
    pipeline: PipelineConfig = field(default_factory=PipelineConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    trainer_pool: TrainerPoolConfig = field(default_factory=TrainerPoolConfig)
    devices: DevicesConfig = field(default_factory=DevicesConfig)
    balance: BalancerConfig = field(default_factory=BalancerConfig)
    observe: ObserveConfig = field(default_factory=ObserveConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    gateway: GatewayConfig = field(default_factory=GatewayConfig)
    plan: PlanConfig = field(default_factory=PlanConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    transport: TransportConfig = field(default_factory=TransportConfig)
    supervisor: SupervisorConfig = field(
        default_factory=lambda: SupervisorConfig(preload=WORKER_PRELOAD))
    sources: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)
    """"section.key" -> where its value came from ("default", "in team file F", "in CONFIG",
    "from --set", "from --team"), as `load_config` merged them; empty where built otherwise."""

    def to_dict(self) -> dict[str, dict[str, Any]]:
        """Plain data (tuples as lists), the inverse of `from_dict`."""
        return {s: {k: list(v) if isinstance(v, tuple) else v
                    for k, v in dataclasses.asdict(getattr(self, s)).items()}
                for s in SECTIONS}

    def to_toml(self, *, annotate: bool = False) -> str:
        """TOML that `load_config` reads back to this config (None values are left out). With
        `annotate`, each value that is not the default's ends with a comment saying where it
        came from (`# in team file agents/kuhn_poker.py`, `# from --set`)."""
        notes = ({k: w for k, w in self.sources.items() if w != "default"} if annotate
                 else None)
        return dump_toml(self.to_dict(), notes=notes)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, sources: Mapping[str, str] | None = None
                  ) -> Config:
        """Build and validate from `{section: {key: value}}`; missing keys take their defaults.

        `sources` maps "section.key" to where a value came from, for error messages.
        """
        sources = dict(sources or {})
        data = _renamed(data, sources)
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
        return cls(**built, sources=sources)


SECTIONS: dict[str, type] = {"run": RunConfig, "team": TeamRef, "pipeline": PipelineConfig,
                             "rollout": RolloutConfig, "trainer": TrainerConfig,
                             "trainer_pool": TrainerPoolConfig, "devices": DevicesConfig,
                             "balance": BalancerConfig,
                             "observe": ObserveConfig, "cluster": ClusterConfig,
                             "gateway": GatewayConfig, "plan": PlanConfig, "eval": EvalConfig,
                             "transport": TransportConfig, "supervisor": SupervisorConfig}
"""TOML section name -> its dataclass, in file order."""

RENAMED: dict[str, str] = _compat.RENAMED_SECTIONS
"""Old section name -> new one. An old name is still read until FlexMARL 0.2, with a
FutureWarning (Python shows it by default) that names the new key; setting a key under both names
is an error."""

DEFAULT_TOML = (Path(__file__).with_name("default.toml")).read_text(encoding="utf-8")
"""The default experiment, every key with its default and a comment (flexmarl/config/default.toml)."""


def load_config(path: str | None = None, overrides: Sequence[str] = (), *,
                team: str | None = None, team_config: bool = True) -> Config:
    """The experiment's config, each layer over the one before:

        DEFAULT_TOML < the team file's own `config` (Team.config) < the TOML file at `path`
            < `section.key=value` overrides (--set) < `team` as team.path (--team)

    validated, with team.path resolved to an existing file. The team file is the one the
    last layer that names team.path names (else the default's); with `team_config` it is
    loaded to read its config (flexmarl.team.load_team: once per process per file); a file
    that fails to load adds nothing here, and whoever loads its team next (the run, the dry
    run) reports why in one line. `Config.sources` says where each value came from."""
    layers: list[tuple[Mapping[str, Any], str]] = []
    if path is not None:
        layers.append((_read_toml(path), f"in {path}"))
    for item in overrides:
        section, key, value = _parse_override(item)
        layers.append(({section: {key: value}}, "from --set"))
    if team is not None:
        layers.append(({"team": {"path": team}}, "from --team"))
    data = tomllib.loads(DEFAULT_TOML)
    sources = {f"{s}.{k}": "default" for s, keys in data.items() for k in keys}
    if team_config:
        carried = _team_file_config(_team_path(data, layers))
        if carried:
            layers.insert(0, carried)
    for extra, where in layers:
        # Old section names become new ones within their layer, so a later layer overrides
        # an earlier one whichever name each uses (both names in one layer: an error).
        if isinstance(extra, Mapping):
            extra = _renamed(extra, {f"{s}.{k}": where for s, t in extra.items()
                                     if isinstance(t, Mapping) for k in t})
        _merge(data, extra, sources, where)
    config = Config.from_dict(data, sources=sources)
    resolved = resolve_team_path(config.team.path)
    return dataclasses.replace(config, team=dataclasses.replace(config.team, path=str(resolved)))


def _team_path(data: Mapping[str, Any], layers: Sequence[tuple[Mapping[str, Any], str]]) -> str:
    """team.path as the layers set it (the last one that does), else the default's."""
    chosen = data["team"]["path"]
    for extra, _ in layers:
        table = extra.get("team")
        if isinstance(table, Mapping) and "path" in table:
            chosen = table["path"]
    if not isinstance(chosen, str) or not chosen:
        raise ConfigError(f"team.path must name a team file, got {chosen!r}; pass --team PATH")
    return chosen


def _team_file_config(team_path: str) -> tuple[dict[str, Any], str] | None:
    """The team file's own config as a layer (its values, where they come from), or None. A
    relative team.tasks it names is a file beside it, where one is there (the file and its
    data travel together)."""
    from flexmarl.team import load_team  # the team API imports torch-free modules only

    resolved = resolve_team_path(team_path)
    try:
        carried = load_team(resolved).config
    except Exception:  # reported by the caller's own load_team, with the run's one-line error
        log.debug("team file %s did not load; its config is not read", resolved, exc_info=True)
        return None
    if not carried:
        return None
    tasks = carried.get("team", {}).get("tasks")
    if isinstance(tasks, str) and tasks and not Path(tasks).expanduser().is_absolute() \
            and (resolved.parent / tasks).exists():
        carried = {**carried, "team": {**carried["team"], "tasks": str(resolved.parent / tasks)}}
    return carried, f"in team file {team_path}"


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


def _renamed(data: Mapping[str, Any], sources: dict[str, str]) -> dict[str, Any]:
    """`data` with every old section name (RENAMED) moved to its new one, each with a warning
    naming the new key; a key given under both names (not as a default) is a ConfigError."""
    data = dict(data)
    for old, new in RENAMED.items():
        table = data.pop(old, None)
        if table is None:
            continue
        if not isinstance(table, Mapping):
            raise ConfigError(_not_a_section(old, table, _at(sources.get(old)).strip()))
        merged = dict(data.get(new, {}))
        for key, value in table.items():
            where = sources.pop(f"{old}.{key}", "")
            if sources.get(f"{new}.{key}", "default") != "default":
                raise ConfigError(f"{old}.{key}{_at(where)} and {new}.{key}"
                                  f"{_at(sources[f'{new}.{key}'])} are the same setting "
                                  f"(section [{old}] is now [{new}]); keep only {new}.{key}")
            merged[key] = value
            sources[f"{new}.{key}"] = where or "the old section name"
            warnings.warn(f"config key {old}.{key}{_at(where)} is now {new}.{key}: section [{old}]"
                          f" was renamed [{new}]; the old name is read until FlexMARL "
                          f"{_compat.REMOVED_IN}",
                          FutureWarning, stacklevel=2)
        data[new] = merged
    return data


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
    cls = SECTIONS.get(RENAMED.get(section, section))
    if cls is not None and typing.get_type_hints(cls).get(key) is str and raw[:1] not in "\"'":
        # A string field takes the text as written, so `--set run.name=2024` is the name
        # "2024", not an int error; quote it to use TOML string syntax.
        return section, key, raw
    try:
        return section, key, tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return section, key, raw


AGENT_ONLY: dict[str, str] = {
    "trainer.lora": "a LoRA adapter is set per agent, with its rollout instances: "
                    "AgentSpec(lora=flexmarl.LoraSpec(rank=16, ...)) in the team file"}
"""Keys of a section's dataclass that only a run sets (from the team), never a config."""


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
            if f"{section}.{key}" in AGENT_ONLY and table[key] is not None:
                raise ConfigError(f"{section}.{key}{_at(sources.get(f'{section}.{key}'))} "
                                  f"cannot be set in a config: {AGENT_ONLY[f'{section}.{key}']}")
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
    if hint is dict:
        return isinstance(value, Mapping), dict(value) if isinstance(value, Mapping) else None
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


def dump_toml(data: Mapping[str, Mapping[str, Any]], *,
              notes: Mapping[str, str] | None = None) -> str:
    """TOML text of `{section: {key: scalar or list}}`; None values are left out (TOML has no
    null, and a missing key means the default). `notes` ("section.key" -> text) end their
    keys' lines as comments."""
    notes = notes or {}
    lines: list[str] = []
    for section, table in data.items():
        lines.append(f"[{section}]")
        for k, v in table.items():
            if v is None:
                continue
            note = notes.get(f"{section}.{k}")
            lines.append(f"{k} = {_toml_value(v)}" + (f"  # {_one_line(note)}" if note else ""))
        lines.append("")
    return "\n".join(lines)


def _one_line(text: str) -> str:
    return " ".join(text.splitlines())


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
