"""Each agent's whole training state per step, on disk: what a dead slot's agent is restored
from (its snapshot) and what `flexmarl run --resume RUN_DIR` restarts from.

    ROOT/                       RUN_DIR/state (or a temp dir: snapshots of a run saving none)
      AGENT/
        step-000041/            complete: a step dir only ever appears by a rename
          __0_0.distcp ...      format 2, written by the trainer ranks in parallel, each its own
          .metadata             shards (torch.distributed.checkpoint; flexmarl.training.
                                sharded_state), read back by a slot of any rank count
          meta.json             {"format": 2, "agent", "step", "version", "meta", "files":
                                 {name: [bytes, sha256]}}: "meta" is TrainState.meta
        step-000042/            format 1: state.safetensors, one file by one process
          state.safetensors     (`save`: tools, tests, states of runs before format 2);
          meta.json             meta.json has "sha256" and "bytes" of it instead of "files"
        .tmp-step-000043-XXXX/  a save in progress, or one a kill cut short: the next
                                StateCheckpoints(root) removes it

A save, by one process (`save`) or by the ranks (`begin`, their writes, `commit_step` by rank
0), fsyncs its files in a temp dir and renames the dir into place, so a kill at any instant
leaves either no step-NNNNNN or a complete one. A load checks every file against its sha256: a
state damaged after its save is refused, never resumed from. Tensors come back bit for bit
(0-dim ones included); meta is JSON, so tuples in it come back as lists. Bad arguments (an
agent name that cannot name a dir, a negative step) raise ValueError. One process at a time
may use a root: StateCheckpoints(root) removes the temp dirs it finds. The ranks of a slot on
other machines write into the same paths: the root must be on a file system they all see.
"""
from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import tempfile
import warnings
from pathlib import Path
from shutil import copyfile

import orjson
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from flexmarl.protocol import StateSaved, TrainState

log = logging.getLogger(__name__)

FORMAT = 1
"""One file written by one process (`save`)."""
SHARDED_FORMAT = 2
"""Each rank's shards, written by the ranks (torch.distributed.checkpoint)."""
STATE_DIR = "state"
STATE_FILE = "state.safetensors"
META_FILE = "meta.json"
TMP_PREFIX = ".tmp-"
OLD_PREFIX = ".old-"  # a step dir moved aside by a save replacing it
_STEP_DIR, _STEP_NAME = "step-{:06d}", re.compile(r"step-(\d{6,})")
_META_KEYS = {"format", "agent", "step", "version", "meta"}
_FILE_KEYS = {FORMAT: {"sha256", "bytes"}, SHARDED_FORMAT: {"files"}}


class CheckpointError(RuntimeError):
    """A state that cannot be saved or loaded; the message names the path and the fix."""


class StateCheckpoints:
    """ROOT/<agent>/step-<NNNNNN>/: see the module docstring."""

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
        tmp, _ = self.begin(agent, step)
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

    def begin(self, agent: str, step: int) -> tuple[Path, Path]:
        """A temp dir for the ranks to write `agent`'s state of `step` into, and the step dir
        `commit_step` moves it to once complete (by rank 0 of the writing slot)."""
        target = self._step_dir(agent, step)
        try:
            target.parent.mkdir(exist_ok=True)
            _fsync(self.root)  # a new agent dir must survive a machine crash too
            tmp = Path(tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{target.name}-", dir=target.parent))
        except OSError as e:
            raise CheckpointError(f"agent {agent!r} step {step} ({target}): cannot write the "
                                  f"state ({e}); free space on that disk or fix its "
                                  "permissions, then resume the run") from e
        return tmp, target

    def path(self, agent: str, step: int) -> Path:
        """`agent`'s step dir of `step` (whether or not a state is saved there)."""
        return self._step_dir(agent, step)

    def verify(self, agent: str, step: int) -> dict:
        """The record (meta.json) of `agent`'s state at `step` once every file of it is checked
        against its sha256; CheckpointError naming the path if it is missing or damaged."""
        path = self._step_dir(agent, step)
        meta_path = path / META_FILE
        if not path.is_dir():
            raise CheckpointError(f"no state saved for agent {agent!r} at step {step}: {path} "
                                  f"does not exist (saved steps: {self.steps(agent)})")
        damaged = _damaged(agent, step)
        try:
            record = orjson.loads(meta_path.read_bytes())
            if not isinstance(record, dict) or not _META_KEYS <= record.keys():
                raise ValueError(f"not a state record, whose keys are {sorted(_META_KEYS)}")
        except (OSError, ValueError) as e:  # orjson.JSONDecodeError is a ValueError
            raise CheckpointError(f"{meta_path}: unreadable ({e}); {damaged}") from e
        if record["format"] not in _FILE_KEYS or not _FILE_KEYS[record["format"]] <= record.keys():
            raise CheckpointError(f"{meta_path}: format {record['format']!r}, this flexmarl "
                                  f"reads formats {sorted(_FILE_KEYS)}; resume with the flexmarl "
                                  "that wrote it")
        if record["agent"] != agent or record["step"] != step:
            raise CheckpointError(f"{meta_path}: holds agent {record['agent']!r} step "
                                  f"{record['step']}, not agent {agent!r} step {step}: the dir "
                                  "was renamed or copied; move it back to where it was saved")
        files = (record["files"] if record["format"] == SHARDED_FORMAT
                 else {STATE_FILE: [record["bytes"], record["sha256"]]})
        for name, (size, sha) in files.items():
            try:
                digest, actual = _digest(path / name)
            except OSError as e:
                raise CheckpointError(f"{path / name}: unreadable ({e}); {damaged}") from e
            if actual != size:
                raise CheckpointError(f"{path / name}: {actual} bytes, saved as {size} "
                                      f"(truncated?); {damaged}")
            if digest != sha:
                raise CheckpointError(f"{path / name}: sha256 differs from {META_FILE}'s; "
                                      f"{damaged}")
        return record

    def ref(self, agent: str, step: int) -> StateSaved:
        """Where `agent`'s state of `step` is, once checked (`verify`): what a slot restores
        from (SwapIn.state_dir), no tensor read here."""
        record = self.verify(agent, step)
        files = record.get("files") or {STATE_FILE: [record.get("bytes", 0), ""]}
        return StateSaved(agent, step, record["version"], str(self.path(agent, step)),
                          sum(size for size, _ in files.values()))

    def load(self, agent: str, step: int) -> TrainState:
        """`agent`'s whole state saved at `step`, in this process (either format), checked
        against its sha256s; CheckpointError naming the path if it is missing or damaged.
        A slot restores a state from its dir instead (SwapIn.state_dir): no tensor of it
        passes through this process."""
        record = self.verify(agent, step)
        path = self._step_dir(agent, step)
        try:
            if record["format"] == SHARDED_FORMAT:
                tensors = read_whole(path) if record["files"] else {}
            else:  # memory-mapped: safe, as a saved file is only ever unlinked, never rewritten
                tensors = load_file(path / STATE_FILE)
        except Exception as e:
            raise CheckpointError(f"{path}: cannot read the tensors ({type(e).__name__}: {e}); "
                                  f"{_damaged(agent, step)}") from e
        return TrainState(agent, record["version"], tensors, record["meta"])

    def link(self, agent: str, step: int, source: Path | None) -> Path:
        """`agent`'s state in step dir `source` (of any root on this file system) also as its
        state of `step` here (an agent that did not update in between): hard links to the same
        files (no copy), a meta.json of its own, atomic like a save. None: an empty state (the
        agent never updated: a fresh trainer)."""
        if source is None:
            return self.save(agent, step, TrainState(agent, 0, {}, {}))
        record = orjson.loads((source / META_FILE).read_bytes())
        files = record["files"] if record["format"] == SHARDED_FORMAT else [STATE_FILE]
        tmp, target = self.begin(agent, step)
        try:
            for name in files:
                try:
                    os.link(source / name, tmp / name)
                except OSError:  # another file system (a resumed run's state into /dev/shm)
                    copyfile(source / name, tmp / name)
            return _commit(tmp, target, {**record, "step": step})
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise

    def copy_in(self, agent: str, step: int, source: Path) -> Path:
        """A complete step dir of another root (a snapshot in the scratch dir) as `agent`'s
        state of `step` here: each file copied by the kernel (copy_file_range: no byte in this
        process's memory) and fsynced, then renamed into place like a save."""
        record = orjson.loads((source / META_FILE).read_bytes())
        tmp, target = self.begin(agent, step)
        try:
            for p in source.iterdir():
                if p.name != META_FILE:
                    copyfile(p, tmp / p.name)
                    _fsync(tmp / p.name)
            return _commit(tmp, target, {**record, "step": step})
        except OSError as e:  # disk full, read-only, permissions
            shutil.rmtree(tmp, ignore_errors=True)
            raise CheckpointError(f"agent {agent!r} step {step} ({target}): cannot write the "
                                  f"state ({e}); free space on that disk or fix its "
                                  "permissions, then resume the run") from e
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise

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

    def prune(self, keep_from: int, keep_every: int = 0) -> None:
        """Delete every agent's states at steps < `keep_from`, but those after every
        `keep_every` steps (run.keep_every; 0: none kept)."""
        self._delete_where(lambda s: s < keep_from and not (keep_every
                                                            and (s + 1) % keep_every == 0))

    def keep_from(self, agent: str, step: int) -> None:
        """Delete `agent`'s states at steps < `step` (a scratch dir: its last only)."""
        self._delete_where(lambda s: s < step, agent)

    def drop_after(self, step: int) -> None:
        """Delete every agent's states at steps > `step` (a resumed run recomputes them)."""
        self._delete_where(lambda s: s > step)

    def _step_dir(self, agent: str, step: int) -> Path:
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"step must be an int >= 0, got {step!r}")
        if not isinstance(agent, str) or not _valid_agent(agent):
            raise ValueError(f"agent name {agent!r} cannot name a state directory")
        return self.root / agent / _STEP_DIR.format(step)

    def _delete_where(self, doomed, only: str | None = None) -> None:
        for agent in [only] if only is not None else self.agents():
            for step in filter(doomed, self.steps(agent)):
                # Renamed away first: rmtree removes files one by one, and a kill midway must
                # not leave a step dir that steps() lists but that holds no state any more.
                path = self._step_dir(agent, step)
                tmp = Path(tempfile.mkdtemp(prefix=f"{TMP_PREFIX}del-", dir=path.parent))
                os.rename(path, tmp / path.name)
                _fsync(path.parent)
                shutil.rmtree(tmp, ignore_errors=True)


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


def _damaged(agent: str, step: int) -> str:
    return (f"agent {agent!r} step {step} was damaged after its save (disk fault, partial "
            "copy, edit): restore its step dir from a copy, or start a new run")


def commit_step(tmp: str | os.PathLike, target: str | os.PathLike, agent: str, step: int,
                version: int, meta: dict) -> tuple[Path, int]:
    """Make what the ranks wrote into `tmp` (torch.distributed.checkpoint files, complete) the
    state of `agent` at `step`: each file's sha256 in meta.json, fsynced, the dir renamed to
    `target` (replacing one there). Rank 0 of the writing slot calls it. The step dir and the
    state's bytes."""
    tmp, target = Path(tmp), Path(target)
    try:
        files = {p.name: [*reversed(_digest(p))] for p in sorted(tmp.iterdir()) if p.is_file()}
        for p in tmp.iterdir():
            _fsync(p)
        record = {"format": SHARDED_FORMAT, "agent": agent, "step": step, "version": version,
                  "meta": meta, "files": files}
        return _commit(tmp, target, record), sum(size for size, _ in files.values())
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _commit(tmp: Path, target: Path, record: dict) -> Path:
    """meta.json into `tmp`, fsynced, then `tmp` renamed to `target` (the old one moved aside
    first, under a name _recover puts back if a kill comes between the renames)."""
    (tmp / META_FILE).write_bytes(orjson.dumps(record, option=orjson.OPT_INDENT_2))
    _fsync(tmp / META_FILE)
    _fsync(tmp)
    old = target.with_name(OLD_PREFIX + target.name)
    if target.exists():
        os.rename(target, old)
    os.rename(tmp, target)
    _fsync(target.parent)
    shutil.rmtree(old, ignore_errors=True)
    return target


def read_whole(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """Every tensor of a format-2 state dir, whole, in this process (no process group)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    from flexmarl.training.safe_dcp import SafeReader

    reader = SafeReader(str(path))  # .metadata is a pickle: read with an allow-list
    tensors = {name: torch.empty(md.size, dtype=md.properties.dtype)
               for name, md in reader.read_metadata().state_dict_metadata.items()
               if isinstance(md, TensorStorageMetadata)}
    with warnings.catch_warnings():  # "no process group: loading in a single process": meant
        warnings.simplefilter("ignore", UserWarning)
        dcp.load(tensors, storage_reader=reader, no_dist=True)
    return tensors


def read_record(path: str | os.PathLike) -> tuple[dict, dict[str, torch.Tensor] | None]:
    """A step dir's meta.json, and for format 1 its tensors (memory-mapped), for format 2
    None: its ranks read their own rows (flexmarl.training.sharded_state.read). Unchecked:
    StateCheckpoints.verify checks the sha256s first where the dir may be damaged."""
    path = Path(path)
    try:
        record = orjson.loads((path / META_FILE).read_bytes())
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{path / META_FILE}: unreadable ({e}): not a saved state's "
                              "dir, or a damaged one") from e
    if record.get("format") == FORMAT:
        return record, load_file(path / STATE_FILE)
    if record.get("format") != SHARDED_FORMAT:
        raise CheckpointError(f"{path / META_FILE}: format {record.get('format')!r}, this "
                              f"flexmarl reads formats {sorted(_FILE_KEYS)}")
    return record, None
