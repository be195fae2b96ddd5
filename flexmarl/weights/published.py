"""Published weights: a trainer writes each version once on its host, and the agent's rollout
instances read it there; the run passes the file's name, never the tensors.

    trainer's rank 0 (TrainerWorker.on_export, ExportWeights.publish = the run's name):
      export_weights() ─► publish(...) ─► <root>/<run>/<agent>/<random>.safetensors
        files of its own taken in turn: a version is written into a file of an earlier one,
        in place (memory speed), never into the newest (the version before: served until
        this one's sync) and never into one a reader holds; none free: a new file
      reply: WeightUpdate(version, {}, source={path, host, address, num_bytes, version, run,
        agent, copies})
    the run (flexmarl.weights.sync.WeightSync): keeps each agent's served source, sends
      WeightUpdate(version, {}, source) to the instances (flexmarl.weights.stage.push_weights),
      and adds to its `copies` every instance that now holds the version (WeightUpdateDone.held)
    each instance (RolloutWorker, before its gate closes): opened(source) ─► tensors
      "base" first: a model directory's weights (a partial update into an instance that
        changes hands or is new: its untrained layers are the model directory's)
      a file of the version on this host (the trainer's, or a copy): read at memory speed
        under its lock; else FetchWeights to its holders in turn (the trainer, then the
        instances that hold it), and the fetched version kept as this host's copy
        (keep_copy), which the instance serves in turn: a version outlives its trainer

No torn read, whatever the loop's order: a reader holds a shared flock on the file from the
version check until its copy is done (the engine's load, the FetchWeights reply's copy), and a
writer takes a file only with an exclusive lock it gets at once (flock LOCK_NB), else writes a
new one. So a reader two versions behind keeps its version intact, and a writer never waits for
a reader's copy (only, within one process, for the moment another thread maps a file). The version is in the file's header, checked under the lock: a file taken for a later
version tells its late reader so (FileNotFoundError), never hands it the newer weights.

<root> is /dev/shm where it exists and has room (memory speed, nothing on disk), else the
system's temp dir; FLEXMARL_WEIGHTS_DIR overrides it. Ownership (leases, 0700 directories,
0600 files, what FetchWeights may serve): flexmarl.weights.ownership. The run removes its own
dir on its host when it ends (remove); each worker's start, and the run's, the dirs nobody
holds a lease of on its machine (remove_orphans); a trainer removes what it wrote when it
stops (and the dir, if nobody else holds it).
"""
from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import logging
import mmap
import os
import re
import shutil
import socket
import tempfile
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, AsyncIterator, Awaitable, Callable, Iterator

import torch

from flexmarl.weights import ownership
from flexmarl.weights.base import weights_nbytes
from flexmarl.weights.ownership import PREFIX, remove_orphans, run_name  # noqa: F401

log = logging.getLogger(__name__)

LOCK_POLL_S = 0.005
"""An async reader's wait between tries for a file a writer is copying a version into (held
for a memory-speed copy)."""


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


def _check_run(run: str) -> None:
    _check_name(run, "the run's name")
    if not run.startswith(PREFIX):
        raise ValueError(f"published weights' run name must start with {PREFIX!r}: {run!r}")


def lease(run: str) -> None:
    """Hold `run`'s directories on this host (every root) until remove(run): the run's own
    process (the orchestrator), so its versions outlive a trainer that dies."""
    _check_run(run)
    for base in ownership.roots():
        ownership.lease(run, base)


_OWN: dict[tuple[str, str, str], list[str]] = {}
"""(root, run, agent) -> the files this process wrote for the agent, the newest last."""
_OWN_LOCK = threading.Lock()
"""One publish at a time in this process (each runs in a thread of its own)."""
_MAPS_LOCK = threading.RLock()
"""Guards the mapping caches: serve, load and publish run in threads side by side."""


def publish(tensors: dict[str, torch.Tensor], run: str, agent: str, version: int,
            address: str) -> dict[str, Any]:
    """Write `tensors` as `agent`'s `version` under this host's root; the source that names
    it (WeightUpdate.source). The trainer's rank 0 calls it, in a thread.

    A file of an earlier version is rewritten in place (its pages are already there: a copy
    at memory speed, where a new tmpfs file first allocates and zeroes every page), but never
    the newest (the version before this one: served until this one's sync) and never one a
    reader holds (it may be two versions behind: a slow or joining instance, a fetch): then
    a new file. Files beyond the newest two go as soon as no reader holds them."""
    _check_run(run)
    _check_name(agent, "agent")
    num_bytes = weights_nbytes(tensors)
    base = root(num_bytes)
    folder = ownership.private_dir(ownership.lease(run, base) / agent)
    header = _header(tensors, version)
    with _OWN_LOCK:
        files = _OWN.setdefault((str(base), run, agent), [])
        path = next((old for old in files[:-1] if _recycle(old, header, tensors)), None)
        if path is not None:
            files.remove(path)
        else:
            path = _create(folder, f"{os.urandom(6).hex()}.safetensors", header, tensors)
        files.append(path)
        for old in files[:-2]:
            if _unlink_unheld(old):
                files.remove(old)
    return {"path": path, "host": host_id(), "address": address, "num_bytes": num_bytes,
            "version": version, "run": run, "agent": agent}


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


def _write_into(fd: int, path: str, header: bytes, tensors: dict[str, torch.Tensor]) -> bool:
    """`tensors` copied into the open file in place, if it has exactly this layout (the same
    size and header but for the version); False otherwise (nothing written). The caller holds
    the file's exclusive lock."""
    size = os.fstat(fd).st_size
    if size != len(header) + sum(t.numel() * t.element_size() for t in tensors.values()):
        return False
    mm = _mapped(_WRITE_MAPS, fd, path, writable=True)
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


def _locked(path: str, how: int) -> int | None:
    """`path` opened (no symlink followed) with the lock `how` taken at once; None if it is
    gone or another process holds a conflicting lock."""
    try:
        fd = ownership.open_regular(path, os.O_RDWR if how & fcntl.LOCK_EX else os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, how | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def _unlock(fd: int) -> None:
    # Explicitly: a cached mapping keeps the open file (and so the lock) alive past close().
    fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)


def _recycle(path: str, header: bytes, tensors: dict[str, torch.Tensor]) -> bool:
    """The version written into `path` (a file of an earlier one) if no reader holds it and
    its layout fits; False otherwise."""
    fd = _locked(path, fcntl.LOCK_EX)
    if fd is None:
        return False
    try:
        written = _write_into(fd, path, header, tensors)
        if not written:  # another layout (a partial update beside full ones): it goes
            _forget(path)
            os.unlink(path)
        return written
    finally:
        _unlock(fd)


def _unlink_unheld(path: str) -> bool:
    """`path` removed unless a reader holds it; whether it is gone."""
    fd = _locked(path, fcntl.LOCK_EX)
    if fd is None:
        return not os.path.lexists(path)
    try:
        _forget(path)
        os.unlink(path)
        return True
    finally:
        _unlock(fd)


def _create(folder: Path, name: str, header: bytes, tensors: dict[str, torch.Tensor], *,
            replace: bool = True) -> str:
    """A new file `folder/name` (0600) holding the version, written under a temporary name
    first so no reader sees it half written; its path. `replace` False: if `name` exists
    meanwhile (another process made it), that one stays and FileExistsError is raised."""
    tmp = folder / f".{os.urandom(6).hex()}.tmp"
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 ownership.FILE_MODE)
    path = str(folder / name)
    try:
        os.ftruncate(fd, len(header) + weights_nbytes(tensors))
        _write_into(fd, str(tmp), header, tensors)
        if replace:
            os.rename(tmp, path)
        else:
            os.link(tmp, path)  # never over another's: FileExistsError
            os.unlink(tmp)
        with _MAPS_LOCK:
            held = _WRITE_MAPS.pop(str(tmp), None)  # the same file (inode), its name now
            if held is not None:
                _WRITE_MAPS[path] = held
            ownership.register(path, fd)
        return path
    except BaseException:
        with _MAPS_LOCK:
            _WRITE_MAPS.pop(str(tmp), None)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    finally:
        os.close(fd)


_WRITE_MAPS: dict[str, tuple[tuple[int, int, int], mmap.mmap]] = {}
_READ_MAPS: dict[str, tuple[tuple[int, int, int], mmap.mmap]] = {}
"""path -> (its device, inode and size, its mapping), kept from one version to the next: a file is
rewritten in place, so the same mapping sees each version, and mapping a file's pages costs as
much as a third of copying them. A replaced file (another inode) is mapped anew; one gone is
dropped at the next read (its memory goes with the last view)."""


def _mapped(maps: dict, fd: int, path: Path | str, *, writable: bool) -> mmap.mmap:
    st = os.fstat(fd)
    key = (st.st_dev, st.st_ino, st.st_size)
    with _MAPS_LOCK:
        held = maps.get(str(path))
        if held is not None and held[0] == key:
            return held[1]
        if not writable:
            for gone in [p for p in maps if not os.path.exists(p)]:
                maps.pop(gone, None)
        # A writable map is not populated: for a new tmpfs file that allocates every page
        # holding the GIL (0.16 s per 384 MB, every thread stopped); the copy faults them in.
        mm = mmap.mmap(fd, st.st_size, flags=mmap.MAP_SHARED | (0 if writable else _POPULATE),
                       prot=mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0))
        maps[str(path)] = (key, mm)  # the old one, if any, is unmapped with its last view
        return mm


def _forget(path: Path | str) -> None:
    """Drop this process's mappings and registration of `path` (removed: its memory goes
    with the last mapping)."""
    with _MAPS_LOCK:
        _WRITE_MAPS.pop(str(path), None)
        _READ_MAPS.pop(str(path), None)
        ownership.unregister(str(path))


def _unversioned(header: bytes) -> bytes:
    return re.sub(rb'"version":"\d{20}"', b"", header)


# ----------------------------------------------------------------------------- readers

def _open_version(path: str, version: int | None, *, wait: bool = True) -> int:
    """`path` opened with a shared lock holding `version` (None: any); the descriptor.
    FileNotFoundError where it is gone or holds another version now. `wait` False:
    BlockingIOError while a writer copies a version in (the caller polls)."""
    fd = ownership.open_regular(path)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | (0 if wait else fcntl.LOCK_NB))
        held = _header_version(fd, path)
        if version is not None and held != version:
            fcntl.flock(fd, fcntl.LOCK_UN)
            raise FileNotFoundError(f"{path} holds version {held} now, not {version}: a "
                                    "newer version is served, load that one")
    except BaseException:
        os.close(fd)
        raise
    return fd


async def _open_version_async(path: str, version: int | None) -> int:
    while True:  # a writer holds its lock for a memory-speed copy: poll, never block the loop
        try:
            return _open_version(path, version, wait=False)
        except BlockingIOError:
            await asyncio.sleep(LOCK_POLL_S)


@contextlib.contextmanager
def holding(path: str, version: int | None = None) -> Iterator[dict[str, torch.Tensor]]:
    """A published file's tensors as read-only views of its pages (no copy), valid while
    this holds the file's shared lock: no writer can take it meanwhile."""
    fd = _open_version(path, version)
    try:
        yield _views(fd, path)
    finally:
        _unlock(fd)


def load(path: str, version: int | None = None) -> dict[str, torch.Tensor]:
    """A published file's tensors, copied under its lock (safe to keep). `version`: the one
    the source named, checked against the file's (its writer took the file for a later one:
    FileNotFoundError). The file is safetensors (header, then raw tensors): parsed here, no
    pickle."""
    with holding(path, version) as views:
        return {k: v.clone() for k, v in views.items()}


def serve(path: str) -> tuple[int, dict[str, torch.Tensor]]:
    """FetchWeights: the version and tensors (copies, made under the file's lock) of a file
    this process wrote or holds (flexmarl.weights.ownership.register), opened without
    following a link and checked to be that very file; FileNotFoundError for anything else."""
    fd = ownership.open_registered(path)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        version = _header_version(fd, path)
        return version, {k: v.clone() for k, v in _views(fd, path).items()}
    finally:
        _unlock(fd)


def _views(fd: int, path: str) -> dict[str, torch.Tensor]:
    meta = _read_header(fd, path)
    meta.pop("__metadata__", None)
    if not meta:
        return {}
    start = 8 + int.from_bytes(os.pread(fd, 8, 0), "little")
    mm = _mapped(_READ_MAPS, fd, path, writable=False)
    out = {}
    with warnings.catch_warnings():  # read-only pages: the tensors are never written
        warnings.simplefilter("ignore", UserWarning)
        for name, m in meta.items():
            lo, hi = m["data_offsets"]
            t = torch.frombuffer(mm, dtype=torch.uint8, count=hi - lo, offset=start + lo)
            out[name] = t.view(_TORCH[m["dtype"]]).reshape(m["shape"])
    return out  # each view keeps the map alive (and so does _READ_MAPS, for the next version)


_POPULATE = getattr(mmap, "MAP_POPULATE", 0)
"""Linux: every page mapped in one call (a fault per 4 KB page costs as much as the copy)."""
_TORCH = {v: k for k, v in _DTYPES.items()}


def _read_header(fd: int, path: str) -> dict[str, Any]:
    n = int.from_bytes(os.pread(fd, 8, 0), "little")
    if not 0 < n < 100 << 20:
        raise ValueError(f"{path} is not a safetensors file (header of {n} bytes)")
    return json.loads(os.pread(fd, n, 8))


def _header_version(fd: int, path: str) -> int:
    meta = _read_header(fd, path).get("__metadata__") or {}
    if "version" not in meta:
        raise ValueError(f"{path} is not a published weights file (no version in its header)")
    return int(meta["version"])


def version_of(path: str) -> int:
    """The version a published file holds now (its header's metadata)."""
    fd = ownership.open_regular(path)
    try:
        return _header_version(fd, path)
    finally:
        os.close(fd)


def names_of(path: str) -> list[str]:
    """The tensor names a published file holds (its header only)."""
    fd = ownership.open_regular(path)
    try:
        return [k for k in _read_header(fd, path) if k != "__metadata__"]
    finally:
        os.close(fd)


# ----------------------------------------------------------------------------- sources

def holders(source: dict[str, Any]) -> list[dict[str, Any]]:
    """Where a source's version is: its trainer's file first, then the copies the run knows
    of (each {host, path, address}: an instance that holds the version and serves it)."""
    first = {k: source[k] for k in ("host", "path", "address") if source.get(k)}
    return [first, *source.get("copies", ())] if source.get("path") else []


def local_path(source: dict[str, Any]) -> str | None:
    """A file of the source's version on this host (its trainer's or a copy), if any."""
    here = host_id()
    return next((h["path"] for h in holders(source)
                 if h.get("host") == here and os.path.isfile(h["path"])), None)


def local(source: dict[str, Any]) -> bool:
    """The source's version can be read here: a file of it is on this host."""
    return local_path(source) is not None


@dataclass
class Opened:
    tensors: dict[str, torch.Tensor]
    """The version's tensors (its base's first): views of a file on this host while the
    `opened` block runs, or fetched."""
    path: str | None
    """The file on this host they are read from (locked until the block ends), or None
    (fetched)."""


@contextlib.asynccontextmanager
async def opened(source: dict[str, Any],
                 fetch: Callable[[dict[str, Any]], Awaitable[dict[str, torch.Tensor]]]
                 ) -> AsyncIterator[Opened]:
    """The tensors a source names, for the length of the block: its base model directory's
    first, then its version from a file on this host (held under its lock: load them inside
    the block), else `fetch(source)` (FetchWeights to its holders)."""
    ownership.drop_stale()
    tensors: dict[str, torch.Tensor] = {}
    if base := source.get("base"):
        from flexmarl.models import model_weights
        tensors.update(await asyncio.to_thread(model_weights, base))
    fd = path = None
    if source.get("path"):
        here = host_id()
        for h in holders(source):
            if h.get("host") != here:
                continue
            try:
                fd = await _open_version_async(h["path"], source.get("version"))
            except (OSError, ValueError) as exc:  # pruned, taken for a later version, or not
                log.debug("%s: %s; trying the next holder", h["path"], exc)  # weights at all
                continue
            path = h["path"]
            break
        if fd is None:
            if not any(h.get("address") for h in holders(source)):
                raise FileNotFoundError(
                    f"published weights {source['path']} are not on this host ({here}; "
                    f"published on {source.get('host')}) and their source names no trainer "
                    "or instance to fetch them from")
            tensors.update(await fetch(source))
    try:
        if fd is not None:
            tensors.update(_views(fd, path))
            _hold(path, fd)
        yield Opened(tensors, path)
    finally:
        if fd is not None:
            _unlock(fd)


async def read(source: dict[str, Any],
               fetch: Callable[[dict[str, Any]], Awaitable[dict[str, torch.Tensor]]]
               ) -> dict[str, torch.Tensor]:
    """The tensors a source names, copied (safe to keep: tests and tools; the rollout worker
    loads inside `opened`, with no copy)."""
    async with opened(source, fetch) as o:
        return {k: v.clone() if o.path else v for k, v in o.tensors.items()}


@contextlib.asynccontextmanager
async def held(path: str, version: int) -> AsyncIterator[None]:
    """A published file on this host held under its shared lock, holding `version`, for the
    block (an engine that reads the file itself: vLLM's engine core); registered as served."""
    ownership.drop_stale()
    fd = await _open_version_async(path, version)
    try:
        _hold(path, fd)
        yield
    finally:
        _unlock(fd)


def _hold(path: str, fd: int) -> None:
    """A reader of `path` (open as `fd`) may serve it, and holds its run on this host: the
    version outlives its writer while a reader here lives."""
    ownership.register(path, fd)
    folder = Path(path).parent.parent
    if folder.name.startswith(PREFIX):
        with contextlib.suppress(OSError, RuntimeError):  # a sweep this instant: not held
            ownership.lease(folder.name, folder.parent, wait=False)


def keep_copy(tensors: dict[str, torch.Tensor], source: dict[str, Any]) -> str:
    """A version fetched from another host, kept as this host's copy of it (one per host and
    version: the first instance to finish writes it, the others use that one), registered
    so this process serves it; its path. Copies of versions two or more before go once no
    reader holds them."""
    run = source.get("run") or Path(source["path"]).parent.parent.name
    agent = source.get("agent") or Path(source["path"]).parent.name
    version = int(source["version"])
    _check_run(run)
    _check_name(agent, "agent")
    folder = ownership.private_dir(
        ownership.lease(run, root(weights_nbytes(tensors))) / agent)
    name = f"copy-{version}.safetensors"
    path = str(folder / name)
    try:
        _create(folder, name, _header(tensors, version), tensors, replace=False)
    except FileExistsError:  # another instance of this host kept it first: that one serves
        fd = _open_version(path, version)
        _hold(path, fd)
        _unlock(fd)
    for old in folder.glob("copy-*.safetensors"):
        m = re.fullmatch(r"copy-(\d+)\.safetensors", old.name)
        if m and int(m[1]) < version - 1:
            _unlink_unheld(str(old))
    return path


# ----------------------------------------------------------------------------- removal

def remove(run: str) -> None:
    """This host's published weights of `run` (the run ended)."""
    _check_run(run)
    ownership.release(run)
    with _OWN_LOCK:
        for base in ownership.roots():
            with contextlib.suppress(OSError):  # swept meanwhile: nothing left to forget
                for f in list((base / run).glob("*/*.safetensors")):
                    _forget(f)
            shutil.rmtree(base / run, ignore_errors=True)
        for key in [k for k in _OWN if k[1] == run]:
            del _OWN[key]


def remove_own(run: str) -> None:
    """The files this process published for `run` on this host (a trainer stopping), and its
    hold of the run there: the run's directory goes too if no other process holds it (copies
    kept for the others on this host stay while one of them does)."""
    _check_run(run)
    with _OWN_LOCK:
        for key in [k for k in _OWN if k[1] == run]:
            for f in _OWN.pop(key):
                _forget(f)
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(f)
    with _MAPS_LOCK:
        for path in [p for p in _READ_MAPS if run in Path(p).parts]:
            _forget(path)
    ownership.drop(run)
