"""Published weights: a trainer writes each version once on its host, and the agent's rollout
instances read it there; the run passes the file's name, never the tensors.

    trainer's rank 0 (TrainerWorker.on_export, ExportWeights.publish = the run's name):
      export_weights() ─► publish(...) ─► <root>/<run name>/<agent>/v<version % 2>-<pid>.safetensors
        two files in turn: a version overwrites the one two before it in place (memory speed;
        the one before stays, instances may still load it); the version is in the header
      reply: WeightUpdate(version, {}, source={path, host, address, num_bytes})
    the run (flexmarl.weights.sync.WeightSync): keeps each agent's served source, sends
      WeightUpdate(version, {}, source) to the instances (flexmarl.weights.stage.push_weights)
    each instance (RolloutWorker, before its gate closes): read(source) ─► tensors
      "base" first: a model directory's weights (a partial update into an instance that
        changes hands or is new: its untrained layers are the model directory's)
      the file itself where it is on this host (same host id, file present): read at memory
        speed; else FetchWeights(path) to the trainer's address: the bytes from its host

<root> is /dev/shm where it exists and has room (memory speed, nothing on disk), else the
system's temp dir; FLEXMARL_WEIGHTS_DIR overrides it. The run removes its own dir on its host
when it ends (remove) and dirs of runs whose process is gone (remove_orphans); a trainer on
another host removes what it wrote when it stops.
"""
from __future__ import annotations

import asyncio
import json
import logging
import mmap
import os
import re
import shutil
import socket
import tempfile
import warnings
from pathlib import Path
from typing import Any, Awaitable, Callable

import torch

from flexmarl.weights.base import weights_nbytes

log = logging.getLogger(__name__)

PREFIX = "flexmarl-weights-"
"""A run's name for its published weights starts with this, then the run's pid."""


def run_name() -> str:
    """A fresh name for this process's run (its pid first, for remove_orphans)."""
    return f"{PREFIX}{os.getpid()}-{os.urandom(4).hex()}"


def root(need_bytes: int = 0) -> Path:
    """Where published weights live on this host: FLEXMARL_WEIGHTS_DIR, else /dev/shm if it
    has room for `need_bytes` twice (this version and the one before), else the temp dir."""
    if env := os.environ.get("FLEXMARL_WEIGHTS_DIR"):
        return Path(env)
    if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK):
        if shutil.disk_usage("/dev/shm").free >= 2 * need_bytes:
            return Path("/dev/shm")
        log.warning("published weights go to %s: /dev/shm has %.2f GB free, a version needs "
                    "%.2f GB (twice: the served one stays while the next is written)",
                    tempfile.gettempdir(), shutil.disk_usage("/dev/shm").free / 1e9,
                    need_bytes / 1e9)
    return Path(tempfile.gettempdir())


def host_id() -> str:
    """This host, as a published source names it: FLEXMARL_HOST_ID, else the host name and
    the kernel's boot id (two containers of one name on different machines differ)."""
    if env := os.environ.get("FLEXMARL_HOST_ID"):
        return env
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = ""
    return f"{socket.gethostname()}:{boot}"


def _check_name(name: str, what: str) -> None:
    # Names become path parts: no separators, no "..", so nothing is written outside the run.
    if not name or not re.fullmatch(r"[A-Za-z0-9_.\-]+", name) or name in (".", ".."):
        raise ValueError(f"{what} {name!r} cannot name published weights (letters, digits, "
                         "'_', '-', '.')")


def publish(tensors: dict[str, torch.Tensor], run: str, agent: str, version: int,
            address: str) -> dict[str, Any]:
    """Write `tensors` as `agent`'s `version` under this host's root; the source that names
    it (WeightUpdate.source). The trainer's rank 0 calls it, in a thread.

    Two files per writer and agent, taken in turn by version parity: a version overwrites the
    one two before it, in place (its pages are already there: a copy at memory speed, where a
    new tmpfs file first allocates and zeroes every page). That one is served by nobody: the
    loop publishes v+1 only after v's sync, and a joiner loads the served v under the lock."""
    _check_name(run, "the run's name")
    if not run.startswith(PREFIX):
        raise ValueError(f"published weights' run name must start with {PREFIX!r}: {run!r}")
    _check_name(agent, "agent")
    num_bytes = weights_nbytes(tensors)
    folder = root(num_bytes) / run / agent
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"v{version % 2}-{os.getpid()}.safetensors"
    header = _header(tensors, version)
    if not _rewrite(path, header, tensors):
        tmp = folder / f".{path.name}.tmp"
        with open(tmp, "w+b") as f:
            f.truncate(len(header) + num_bytes)
        _rewrite(tmp, header, tensors)
        os.replace(tmp, path)
        held = _WRITE_MAPS.pop(str(tmp), None)  # the same file (inode), under its name now
        if held is not None:
            _WRITE_MAPS[str(path)] = held
    return {"path": str(path), "host": host_id(), "address": address, "num_bytes": num_bytes,
            "version": version}


_DTYPES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
           torch.float64: "F64", torch.int64: "I64", torch.int32: "I32", torch.int16: "I16",
           torch.int8: "I8", torch.uint8: "U8", torch.bool: "BOOL"}


def _header(tensors: dict[str, torch.Tensor], version: int) -> bytes:
    """The safetensors header of `tensors` in order: its 8-byte length, then the JSON, padded
    to 8 bytes (safetensors' own layout: its reader, and any other, reads the file)."""
    meta, offset = {}, 0
    for name, t in tensors.items():
        if t.dtype not in _DTYPES:
            raise TypeError(f"{name}: dtype {t.dtype} cannot be published")
        n = t.numel() * t.element_size()
        meta[name] = {"dtype": _DTYPES[t.dtype], "shape": list(t.shape),
                      "data_offsets": [offset, offset + n]}
        offset += n
    meta["__metadata__"] = {"format": "pt", "version": f"{version:020d}"}  # fixed width
    blob = json.dumps(meta, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    return len(blob).to_bytes(8, "little") + blob


def _rewrite(path: Path, header: bytes, tensors: dict[str, torch.Tensor]) -> bool:
    """`tensors` copied into `path` in place, if it has exactly this layout (the same size
    and header but for the version); False otherwise (nothing written)."""
    try:
        f = open(path, "r+b")
    except FileNotFoundError:
        return False
    with f:
        size = os.fstat(f.fileno()).st_size
        if size != len(header) + sum(t.numel() * t.element_size() for t in tensors.values()):
            return False
        mm = _mapped(_WRITE_MAPS, f, path, writable=True)
        old = mm[:len(header)]
        if size and _unversioned(old) != _unversioned(header) and any(old):
            return False
        mm[:len(header)] = header
        offset = len(header)
        for t in tensors.values():
            n = t.numel() * t.element_size()
            if n:
                dst = torch.frombuffer(mm, dtype=torch.uint8, count=n, offset=offset)
                dst.copy_(t.detach().contiguous().view(-1).view(torch.uint8))
            offset += n
    return True


_WRITE_MAPS: dict[str, tuple[tuple[int, int], mmap.mmap]] = {}
_READ_MAPS: dict[str, tuple[tuple[int, int], mmap.mmap]] = {}
"""path -> (its inode and size, its mapping), kept from one version to the next: a file is
rewritten in place, so the same mapping sees each version, and mapping a file's pages costs as
much as a third of copying them. A replaced file (another inode) is mapped anew."""


def _mapped(maps: dict, f, path: Path | str, *, writable: bool) -> mmap.mmap:
    st = os.fstat(f.fileno())
    key = (st.st_ino, st.st_size)
    held = maps.get(str(path))
    if held is not None and held[0] == key:
        return held[1]
    mm = mmap.mmap(f.fileno(), st.st_size, flags=mmap.MAP_SHARED | _POPULATE,
                   prot=mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0))
    maps[str(path)] = (key, mm)  # the old one, if any, is unmapped with its last view
    return mm


def _forget(path: Path | str) -> None:
    """Drop this process's mappings of `path` (removed: its memory goes with the last one)."""
    _WRITE_MAPS.pop(str(path), None)
    _READ_MAPS.pop(str(path), None)


def _unversioned(header: bytes) -> bytes:
    return re.sub(rb'"version":"\d{20}"', b"", header)


def is_published(path: str) -> bool:
    """Whether `path` is a file `publish` wrote on this host (FetchWeights serves nothing
    else: a request names a path, and a trainer must not hand out any file it can read)."""
    try:
        resolved = Path(path).resolve(strict=True)
    except OSError:
        return False
    for base in _roots():
        if resolved.is_relative_to(base := base.resolve()):
            rel = resolved.relative_to(base)
            if (len(rel.parts) == 3 and rel.parts[0].startswith(PREFIX)
                    and re.fullmatch(r"v[01]-\d+\.safetensors", rel.parts[2])):
                return True
    return False


def _roots() -> set[Path]:
    """Every place `root` may pick (it picks by the room left at each write)."""
    if env := os.environ.get("FLEXMARL_WEIGHTS_DIR"):
        return {Path(env)}
    return {Path(tempfile.gettempdir())} | ({Path("/dev/shm")} if os.path.isdir("/dev/shm")
                                            else set())


def version_of(path: str) -> int:
    """The version a published file holds now (its header's metadata)."""
    with open(path, "rb") as f:
        meta = _read_header(f, path).get("__metadata__") or {}
    if "version" not in meta:
        raise ValueError(f"{path} is not a published weights file (no version in its header)")
    return int(meta["version"])


def load(path: str, version: int | None = None) -> dict[str, torch.Tensor]:
    """A published file's tensors: read-only views of its pages, mapped at once (no copy: the
    engine's load copies them into its parameters, once). `version`: the one the source named,
    checked against the file's (its writer took the file for a later one). The file is
    safetensors (header, then raw tensors): parsed here, no pickle."""
    with open(path, "rb") as f:
        meta = _read_header(f, path)
        held = int((meta.pop("__metadata__", None) or {}).get("version", -1))
        if version is not None and held != version:
            raise FileNotFoundError(f"{path} holds version {held} now, not {version}: a newer "
                                    "version is served, load that one")
        start = 8 + int.from_bytes(_pread(f, 8, 0), "little")
        if not meta:
            return {}
        mm = _mapped(_READ_MAPS, f, path, writable=False)
    out = {}
    with warnings.catch_warnings():  # read-only pages: the tensors are never written
        warnings.simplefilter("ignore", UserWarning)
        for name, m in meta.items():
            lo, hi = m["data_offsets"]
            dtype = _TORCH[m["dtype"]]
            t = torch.frombuffer(mm, dtype=torch.uint8, count=hi - lo, offset=start + lo)
            out[name] = t.view(dtype).reshape(m["shape"])
    return out  # each view keeps the map alive (and so does _READ_MAPS, for the next version)


_POPULATE = getattr(mmap, "MAP_POPULATE", 0)
"""Linux: every page mapped in one call (a fault per 4 KB page costs as much as the copy)."""
_TORCH = {v: k for k, v in _DTYPES.items()}


def _pread(f, n: int, offset: int) -> bytes:
    return os.pread(f.fileno(), n, offset)


def _read_header(f, path: str) -> dict[str, Any]:
    n = int.from_bytes(_pread(f, 8, 0), "little")
    if not 0 < n < 100 << 20:
        raise ValueError(f"{path} is not a safetensors file (header of {n} bytes)")
    return json.loads(_pread(f, n, 8))


def names_of(path: str) -> list[str]:
    """The tensor names a published file holds (its header only)."""
    with open(path, "rb") as f:
        return [k for k in _read_header(f, path) if k != "__metadata__"]


def local(source: dict[str, Any]) -> bool:
    """The source's file can be read here: published on this host and still there."""
    return source.get("host") == host_id() and os.path.isfile(source["path"])


async def read(source: dict[str, Any],
               fetch: Callable[[dict[str, Any]], Awaitable[dict[str, torch.Tensor]]]
               ) -> dict[str, torch.Tensor]:
    """The tensors a source names: its base model directory's first, then its file, read here
    if it is on this host, else `fetch(source)` (FetchWeights to its trainer)."""
    tensors: dict[str, torch.Tensor] = {}
    if base := source.get("base"):
        from flexmarl.models import model_weights
        tensors.update(await asyncio.to_thread(model_weights, base))
    if path := source.get("path"):
        if local(source):
            try:
                tensors.update(await asyncio.to_thread(load, path, source.get("version")))
                return tensors
            except FileNotFoundError:  # pruned or removed meanwhile: its trainer may have it
                pass
        if not source.get("address"):
            raise FileNotFoundError(f"published weights {path} are not on this host "
                                    f"({host_id()}; published on {source.get('host')}) and "
                                    "their source names no trainer to fetch them from")
        tensors.update(await fetch(source))
    return tensors


def remove(run: str) -> None:
    """This host's published weights of `run` (the run ended)."""
    _check_name(run, "the run's name")
    for base in _roots():
        for f in (base / run).glob("*/*.safetensors"):
            _forget(f)
        shutil.rmtree(base / run, ignore_errors=True)


def remove_own(run: str) -> None:
    """The files this process published for `run` on this host (a trainer stopping)."""
    _check_name(run, "the run's name")
    for base in _roots():
        for f in (base / run).glob(f"*/v*-{os.getpid()}.safetensors"):
            _forget(f)
            f.unlink(missing_ok=True)


def remove_orphans() -> None:
    """Published weights of runs whose process is gone (SIGKILLed): on /dev/shm they hold
    memory."""
    from runtime.supervisor import pid_alive

    for base in _roots():
        for d in base.glob(f"{PREFIX}*"):
            m = re.match(rf"{PREFIX}(\d+)-", d.name)
            if m and not pid_alive(int(m[1])):
                shutil.rmtree(d, ignore_errors=True)
