"""Each agent's whole training state per global step, on disk: what `flexmarl run --resume
RUN_DIR` restarts from after every process of the run was killed.

    RUN_DIR/state/
      AGENT/
        step-000041/            complete: a step dir only ever appears by a rename
          state.safetensors     TrainState.tensors ("model/...", "optim/.../exp_avg", "rng/cpu")
          meta.json             {"format": 1, "agent", "step", "version", "meta", "sha256",
                                 "bytes"}: "meta" is TrainState.meta, "sha256" the file's
        step-000042/
        .tmp-step-000043-XXXX/  a save in progress, or one a kill cut short: the next
                                StateCheckpoints(root) removes it

A save fsyncs its files in a temp dir and renames the dir into place, so a kill at any instant
leaves either no step-NNNNNN or a complete one. A load checks the file against the sha256: a
state damaged after its save is refused, never resumed from. Tensors come back bit for bit
(0-dim ones included); meta is JSON, so tuples in it come back as lists. Bad arguments (an
agent name that cannot name a dir, a negative step) raise ValueError. One process at a time
may use a root: StateCheckpoints(root) removes the temp dirs it finds.
"""
from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import orjson
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from flexmarl.protocol import TrainState
from flexmarl.observe.rundir import METRICS_FILE, read_metrics

log = logging.getLogger(__name__)

FORMAT = 1
STATE_DIR = "state"
STATE_FILE = "state.safetensors"
META_FILE = "meta.json"
TMP_PREFIX = ".tmp-"
OLD_PREFIX = ".old-"  # a step dir moved aside by a save replacing it
_STEP_DIR, _STEP_NAME = "step-{:06d}", re.compile(r"step-(\d{6,})")
_META_KEYS = {"format", "agent", "step", "version", "meta", "sha256", "bytes"}


class CheckpointError(RuntimeError):
    """A state that cannot be saved or loaded; the message names the path and the fix."""


class StateCheckpoints:
    """RUN_DIR/state/<agent>/step-<NNNNNN>/{state.safetensors, meta.json}"""

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        for agent_dir in filter(Path.is_dir, self.root.iterdir()):
            _recover(agent_dir)

    def save(self, agent: str, step: int, state: TrainState) -> Path:
        """Write `state` as `agent`'s state at global `step`, replacing any saved before, and
        return its step dir. CheckpointError (naming the step dir) if the state cannot be
        written as it is or the disk refuses it (full, read-only, permissions)."""
        target = self._step_dir(agent, step)
        where = f"agent {agent!r} step {step} ({target})"
        if state.agent != agent:
            raise CheckpointError(f"{where}: the state is agent {state.agent!r}'s; save it "
                                  "under its own agent name")
        tensors: dict[str, torch.Tensor] = {}
        storages: set[int] = set()
        for name, t in state.tensors.items():
            # safetensors writes a tensor named __metadata__ (then cannot read the file back),
            # and has no sparse layouts.
            kind = t.layout if isinstance(t, torch.Tensor) else type(t).__name__
            if name == "__metadata__" or kind != torch.strided:
                raise CheckpointError(f"{where}: cannot save {name!r} ({kind}): state.tensors "
                                      "must hold dense tensors, none named '__metadata__'")
            t = t.detach().cpu().contiguous()
            # safetensors refuses two names on one storage: copy only those, not every tensor
            # (a second copy of a multi-GB optimizer state would double peak memory).
            if t.untyped_storage().data_ptr() in storages:
                t = t.clone()
            storages.add(t.untyped_storage().data_ptr())
            tensors[name] = t
        try:
            target.parent.mkdir(exist_ok=True)
            _fsync(self.root)  # a new agent dir must survive a machine crash too
            tmp = Path(tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{target.name}-", dir=target.parent))
        except OSError as e:
            raise CheckpointError(f"{where}: cannot write the state ({e}); free space on that "
                                  "disk or fix its permissions, then resume the run") from e
        try:
            try:
                save_file(tensors, tmp / STATE_FILE)
            except SafetensorError as e:  # its I/O errors (disk full, ...) are not OSErrors
                raise OSError(f"safetensors: {e}") from e
            except (ValueError, TypeError, RuntimeError) as e:  # a dtype it lacks, ...
                raise CheckpointError(f"{where}: safetensors cannot write the tensors ({e}); "
                                      "convert them to a dtype it has") from e
            _fsync(tmp / STATE_FILE)
            digest, size = _digest(tmp / STATE_FILE)
            record = {"format": FORMAT, "agent": agent, "step": step, "version": state.version,
                      "meta": state.meta, "sha256": digest, "bytes": size}
            try:
                (tmp / META_FILE).write_bytes(orjson.dumps(record, option=orjson.OPT_INDENT_2))
            except orjson.JSONEncodeError as e:
                raise CheckpointError(f"{where}: state.meta is not JSON ({e}); keep only "
                                      "dicts, lists, strings, numbers, bools, None") from e
            _fsync(tmp / META_FILE)
            _fsync(tmp)
            old = target.with_name(OLD_PREFIX + target.name)
            if target.exists():  # replacing: move the old one aside, under a name _recover puts
                os.rename(target, old)  # back if a kill comes before the new one is in
            os.rename(tmp, target)
            _fsync(target.parent)
            shutil.rmtree(old, ignore_errors=True)
        except OSError as e:  # disk full, read-only, permissions: often without a file name
            _recover(target.parent)
            raise CheckpointError(f"{where}: cannot write the state ({e}); free space on that "
                                  "disk or fix its permissions, then resume the run") from e
        except Exception:
            _recover(target.parent)  # a kill (or KeyboardInterrupt) leaves it to __init__
            raise
        return target

    def load(self, agent: str, step: int) -> TrainState:
        """`agent`'s state saved at `step`, checked against its sha256; CheckpointError
        naming the path if it is missing or damaged."""
        path = self._step_dir(agent, step)
        meta_path, state_path = path / META_FILE, path / STATE_FILE
        if not path.is_dir():
            raise CheckpointError(f"no state saved for agent {agent!r} at step {step}: {path} "
                                  f"does not exist (saved steps: {self.steps(agent)})")
        damaged = (f"agent {agent!r} step {step} was damaged after its save (disk fault, "
                   "partial copy, edit): restore its step dir from a copy, or start a new run")
        try:
            record = orjson.loads(meta_path.read_bytes())
            if not isinstance(record, dict) or not _META_KEYS <= record.keys():
                raise ValueError(f"not a state record, whose keys are {sorted(_META_KEYS)}")
        except (OSError, ValueError) as e:  # orjson.JSONDecodeError is a ValueError
            raise CheckpointError(f"{meta_path}: unreadable ({e}); {damaged}") from e
        if record["format"] != FORMAT:
            raise CheckpointError(f"{meta_path}: format {record['format']!r}, this flexmarl "
                                  f"reads format {FORMAT}; resume with the flexmarl that wrote it")
        if record["agent"] != agent or record["step"] != step:
            raise CheckpointError(f"{meta_path}: holds agent {record['agent']!r} step "
                                  f"{record['step']}, not agent {agent!r} step {step}: the dir "
                                  "was renamed or copied; move it back to where it was saved")
        try:
            digest, size = _digest(state_path)
        except OSError as e:
            raise CheckpointError(f"{state_path}: unreadable ({e}); {damaged}") from e
        if size != record["bytes"]:
            raise CheckpointError(f"{state_path}: {size} bytes, saved as {record['bytes']} "
                                  f"(truncated?); {damaged}")
        if digest != record["sha256"]:
            raise CheckpointError(f"{state_path}: sha256 differs from {META_FILE}'s; {damaged}")
        try:  # memory-mapped: safe, as a saved file is only ever unlinked, never rewritten
            tensors = load_file(state_path)
        except Exception as e:
            raise CheckpointError(f"{state_path}: safetensors: {e}; {damaged}") from e
        return TrainState(agent, record["version"], tensors, record["meta"])

    def steps(self, agent: str) -> list[int]:
        """The steps `agent` has a complete saved state for, ascending."""
        d = self._step_dir(agent, 0).parent
        names = [p.name for p in d.iterdir() if p.is_dir()] if d.is_dir() else []
        return sorted(int(m[1]) for n in names
                      if (m := _STEP_NAME.fullmatch(n)) and n == _STEP_DIR.format(int(m[1])))

    def agents(self) -> list[str]:
        """The agents with at least one complete saved state, sorted."""
        return sorted(p.name for p in self.root.iterdir()
                      if p.is_dir() and _valid_agent(p.name) and self.steps(p.name))

    def prune(self, keep_from: int) -> None:
        """Delete every agent's states at steps < `keep_from`."""
        self._delete_where(lambda s: s < keep_from)

    def drop_after(self, step: int) -> None:
        """Delete every agent's states at steps > `step` (a resumed run recomputes them)."""
        self._delete_where(lambda s: s > step)

    def _step_dir(self, agent: str, step: int) -> Path:
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"step must be an int >= 0, got {step!r}")
        if not isinstance(agent, str) or not _valid_agent(agent):
            raise ValueError(f"agent name {agent!r} cannot name a state directory")
        return self.root / agent / _STEP_DIR.format(step)

    def _delete_where(self, doomed) -> None:
        for agent in self.agents():
            for step in filter(doomed, self.steps(agent)):
                # Renamed away first: rmtree removes files one by one, and a kill midway must
                # not leave a step dir that steps() lists but that holds no state any more.
                path = self._step_dir(agent, step)
                tmp = Path(tempfile.mkdtemp(prefix=f"{TMP_PREFIX}del-", dir=path.parent))
                os.rename(path, tmp / path.name)
                _fsync(path.parent)
                shutil.rmtree(tmp, ignore_errors=True)


@dataclass(frozen=True)
class SaveSchedule:
    """Which steps' states a run writes: every `every`-th step and the last (run.save_every).
    `first_step` > 0: the run resumed from the states of step first_step - 1."""

    every: int
    steps: int
    first_step: int = 0

    def saves(self, step: int) -> bool:
        return (step + 1) % self.every == 0 or step + 1 == self.steps

    def last_saved(self, step: int) -> int:
        """The latest step <= `step` whose states are on disk once its record is out: a step
        this run saved, or the one it resumed from (-1: none yet)."""
        grid = (step + 1) // self.every * self.every - 1
        return step if self.saves(step) else max(grid if grid >= self.first_step else -1,
                                                 self.first_step - 1)


def resume_point(run_dir: str | os.PathLike, agents: list[str]) -> int:
    """The first global step a resumed run must (re)do: 1 + the last step s, at or before the
    last step record in RUN_DIR/metrics.jsonl (a torn last line is skipped), at which every
    agent has a state saved in RUN_DIR/state; 0 if there is no step record. With
    run.save_every > 1, s may come before the last record: the records after it are redone
    (`drop_records_after(run_dir, s)`). Step records but no such s: CheckpointError. States
    after s may exist (saved before a kill cut the step's record): drop_after(s)."""
    last = last_record_step(run_dir)
    if last is None:
        return 0
    root = Path(run_dir) / STATE_DIR  # StateCheckpoints() also finishes interrupted saves
    saved = StateCheckpoints(root).steps if root.is_dir() else lambda agent: []
    common = set.intersection(*(set(saved(a)) for a in agents)) if agents else {last}
    if points := [s for s in common if s <= last]:
        return max(points) + 1
    missing = [a for a in agents if last not in saved(a)]
    raise CheckpointError(
        f"cannot resume {run_dir} at step {last + 1}: no state saved at step {last} for "
        f"agent(s) {', '.join(map(repr, missing))} in {root}, nor at any earlier step for "
        "every agent; the run was made with run.save_state off, or its state dir was removed. "
        "Start a new run instead")


def last_record_step(run_dir: str | os.PathLike) -> int | None:
    """The step of the last step record in RUN_DIR/metrics.jsonl (None: no step record)."""
    try:
        records = read_metrics(Path(run_dir) / METRICS_FILE)
    except FileNotFoundError:
        return None
    steps = [r["step"] for r in records if isinstance(r, dict) and type(r.get("step")) is int]
    return steps[-1] if steps else None  # records go out in step order (PipelineRun)


def drop_records_after(run_dir: str | os.PathLike, step: int) -> int:
    """Cut RUN_DIR/metrics.jsonl after the last record of step <= `step` (the steps a resumed
    run redoes from the last saved states); returns how many records were cut. Truncated in
    place: a MetricsWriter open on the file appends after the cut (its file is O_APPEND)."""
    path = Path(run_dir) / METRICS_FILE
    data = path.read_bytes()
    keep, cut, offset = 0, 0, 0
    for line in data.splitlines(keepends=True):
        offset += len(line)
        try:
            record = orjson.loads(line) if line.strip() else None
        except orjson.JSONDecodeError:
            record = None  # a torn last line goes with what follows the cut
        later = isinstance(record, dict) and type(record.get("step")) is int \
            and record["step"] > step
        if later:
            cut += 1
        elif not cut:
            keep = offset
    if keep < len(data):
        with open(path, "rb+") as f:
            f.truncate(keep)
            f.flush()
            os.fsync(f.fileno())
    return cut


def _valid_agent(agent: str) -> bool:
    return bool(agent) and agent not in (".", "..") and "/" not in agent and os.sep not in agent


def _digest(path: Path) -> tuple[str, int]:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest(), os.fstat(f.fileno()).st_size


def _fsync(path: Path) -> None:
    """Make a file's bytes, or a dir's entries (names created, renamed, removed), durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _recover(agent_dir: Path) -> None:
    """Undo what interrupted saves and deletes left in `agent_dir`."""
    for p in sorted(agent_dir.iterdir()):
        put_back = agent_dir / p.name.removeprefix(OLD_PREFIX)
        if p.name.startswith(OLD_PREFIX) and not put_back.exists():
            log.info("%s: putting back the state a replacing save moved aside", p)
            os.rename(p, put_back)  # a kill came between the replace's two renames
            _fsync(agent_dir)
        elif p.name.startswith((TMP_PREFIX, OLD_PREFIX)):
            log.info("%s: removing the leftover of an interrupted save", p)
            shutil.rmtree(p, ignore_errors=True)  # not ours if a file: left alone
