"""Who owns published weights on a host, and which files a process may hand out.

    <root>/flexmarl-weights-<run id>/      0700, a run's files on this host (root: /dev/shm,
        .lease                              the temp dir, or FLEXMARL_WEIGHTS_DIR)
        <agent>/<file>.safetensors          0600, written by one process (flexmarl.weights.published)

A run's directory is owned by whoever holds its lease: every process that writes there, reads
there for a while, or runs the run (the orchestrator) holds a shared flock on `.lease` for as
long as it may need the files (`lease`, released by `release`). `remove_orphans` (run by the
orchestrator, and by every trainer and rollout worker as it starts, on each machine) removes
a run directory only when it can take that lock exclusively: no live process, in any pid
namespace or container sharing the directory, holds it; it renames the directory away under
that lock before emptying it, so a process taking the lease meanwhile makes a fresh one. A lock is the kernel's and
dies with its holder; no pid is compared, so a run whose orchestrator is on another host or in
another pid namespace keeps its files. The run id is random (no pid in it).

FetchWeights hands out files by the path a request names. A process serves only files it wrote
or read itself (`register`), by identity: the path is opened with O_NOFOLLOW (and without
blocking: a FIFO is refused) and its device and inode must be the registered ones, which the
registration keeps open so no later file can be given that inode; so neither a file that
merely sits where published weights sit nor one swapped in later is served (`open_registered`).
Only this user's run directories are ever removed.
"""
from __future__ import annotations

import errno
import fcntl
import logging
import os
import shutil
import stat
import tempfile
import threading
from pathlib import Path

log = logging.getLogger(__name__)

PREFIX = "flexmarl-weights-"
"""A run's directory name: this, then the run's random id."""
LEASE = ".lease"
REMOVING = ".flexmarl-weights-removing-"
"""A run's directory renamed so while a sweep empties it (left over if that was cut short)."""
DIR_MODE, FILE_MODE = 0o700, 0o600

_LEASES: dict[tuple[str, str], int] = {}
"""(root, run) -> the descriptor whose shared lock this process holds on the run's lease."""
_LOCK = threading.RLock()
"""Guards the leases and the registry: threads of one process register and serve at once."""
_SERVABLE: dict[str, tuple[int, int, int]] = {}
"""path -> (device, inode, a descriptor held open) of a file this process wrote or read and
may serve."""


def run_name() -> str:
    """A fresh name for a run's published weights (a random id: no pid, see the docstring)."""
    return f"{PREFIX}{os.urandom(8).hex()}"


def roots() -> set[Path]:
    """Every place published weights may be on this host (flexmarl.weights.published.root
    picks one by the room left at each write)."""
    if env := os.environ.get("FLEXMARL_WEIGHTS_DIR"):
        return {Path(env)}
    return {Path(tempfile.gettempdir())} | ({Path("/dev/shm")} if os.path.isdir("/dev/shm")
                                            else set())


def private_dir(path: Path) -> Path:
    """`path` as a directory only its owner can enter (0700), made if missing; a symlink or
    another user's directory there is refused."""
    try:
        path.mkdir(mode=DIR_MODE)
    except FileExistsError:
        pass
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        raise PermissionError(f"{path} is not a directory of this user: published weights are "
                              "not written there (remove it, or set FLEXMARL_WEIGHTS_DIR)")
    if stat.S_IMODE(st.st_mode) != DIR_MODE:
        os.chmod(path, DIR_MODE)
    return path


def lease(run: str, root: Path, *, wait: bool = True) -> Path | None:
    """Hold `run`'s lease under `root` (its directory made if missing) until `release(run)`
    or this process ends; the run's directory there. Idempotent. `wait` False: None where a
    sweep holds the lease this instant (a reader on an event loop does not wait for it)."""
    key = (str(root), run)
    folder = root / run
    with _LOCK:
        if key in _LEASES:
            return folder
    for _ in range(LEASE_TRIES):
        _check_root(root)
        try:
            private_dir(folder)
            fd = os.open(folder / LEASE, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                         FILE_MODE)
        except FileNotFoundError:  # a sweep removed it between two of these steps: again
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            os.close(fd)
            return None
        try:
            linked = os.stat(folder / LEASE, follow_symlinks=False)
        except FileNotFoundError:
            linked = None
        held = os.fstat(fd)
        if linked is not None and (linked.st_dev, linked.st_ino) == (held.st_dev, held.st_ino):
            with _LOCK:
                if key in _LEASES:  # another thread of this process took it meanwhile
                    os.close(fd)
                else:
                    _LEASES[key] = fd
            return folder
        os.close(fd)  # swept while we waited: make it again
    raise RuntimeError(f"could not hold {folder}'s lease in {LEASE_TRIES} tries: something "
                       "keeps removing it (is another process sweeping a directory it does "
                       "not own?)")


LEASE_TRIES = 1000
"""Sweeps racing a lease retry it; this many in a row means something else is wrong."""


def _check_root(root: Path) -> None:
    """`root` made if missing (0700 where this makes it), and refused if other users may
    rename or replace what is in it (world-writable without the sticky bit, as /dev/shm and
    /tmp have it): they could swap a live run's directory for their own."""
    root.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    st = os.stat(root)
    if st.st_mode & stat.S_IWOTH and not st.st_mode & stat.S_ISVTX:
        raise PermissionError(f"{root} is writable by every user and not sticky: published "
                              "weights are not written there (chmod +t or 0700 it, or set "
                              "FLEXMARL_WEIGHTS_DIR to a directory of your own)")


def release(run: str) -> None:
    """Let go of this process's leases of `run` (its files may be removed once nobody holds
    one)."""
    with _LOCK:
        for key in [k for k in _LEASES if k[1] == run]:
            os.close(_LEASES.pop(key))


def remove_orphans() -> list[Path]:
    """Remove every run directory on this host whose lease nobody holds (its processes were
    SIGKILLed: on /dev/shm their versions hold memory); the directories removed. A directory
    of another user, or one whose lease is held, is left alone."""
    removed = [folder for base in roots() for folder in base.glob(f"{PREFIX}*")
               if _remove_unheld(folder)]
    for base in roots():  # what a sweep cut short left (renamed, so nobody holds it)
        for left in base.glob(f"{REMOVING}*"):
            if not left.is_symlink() and left.is_dir() and left.lstat().st_uid == os.geteuid():
                shutil.rmtree(left, ignore_errors=True)
    if removed:
        log.info("removed published weights of %d runs no process holds: %s", len(removed),
                 ", ".join(p.name for p in removed))
    return removed


def drop(run: str) -> None:
    """Let go of `run` here, and remove its directories if no other process holds them (the
    last holder on a host cleans up: a trainer or an instance on another host stopping)."""
    with _LOCK:
        roots_held = [Path(r) for r, name in _LEASES if name == run]
    release(run)
    for base in roots_held:
        _remove_unheld(base / run)


def _remove_unheld(folder: Path) -> bool:
    """`folder` (a run's directory) removed if it is this user's and nobody holds its lease;
    whether it is gone. A directory without a lease (a run from before leases, a torn start,
    or one being made this instant) gets one, taken exclusively before anything goes: a
    process making it waits for the lease, finds it unlinked and makes the run again."""
    try:
        st = os.lstat(folder)
    except FileNotFoundError:
        return False
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        return False  # a symlink, a file, or another user's: not ours to judge
    try:
        fd = os.open(folder / LEASE, os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
                     | os.O_NONBLOCK, FILE_MODE)
    except OSError:
        return False  # gone meanwhile, or a lease that is not a plain file
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False  # held: a live run
        # Out of the way first, under the lock: a process that takes the run's lease from
        # now on makes a fresh directory, never one this is still emptying.
        doomed = folder.with_name(f"{REMOVING}{os.urandom(6).hex()}")
        try:
            os.rename(folder, doomed)
        except OSError:
            return False
        shutil.rmtree(doomed, ignore_errors=True)
        return True
    finally:
        os.close(fd)


def register(path: str, fd: int) -> None:
    """This process may serve `path`: the file open as `fd` (written or read by it). The
    registration keeps the file open, so its inode cannot be reused by a file made later at
    that path (ext4 reuses freed inode numbers); registrations whose path no longer names
    their file are dropped at every registration and read (drop_stale): a removed version's
    memory stays held by a process only until it next reads or writes one, or ends."""
    st = os.fstat(fd)
    with _LOCK:
        drop_stale()
        if path in _SERVABLE:
            if _SERVABLE[path][:2] == (st.st_dev, st.st_ino):
                return
            unregister(path)
        _SERVABLE[path] = (st.st_dev, st.st_ino, os.dup(fd))


def drop_stale() -> None:
    """Drop the registrations whose path no longer names their file (removed or replaced:
    the file's memory is freed with its last descriptor). Called at every registration and
    read of a version, so a process holds at most the files it used last."""
    with _LOCK:
        for old, (dev, ino, _) in list(_SERVABLE.items()):
            try:
                now = os.stat(old, follow_symlinks=False)
                stale = (now.st_dev, now.st_ino) != (dev, ino)
            except OSError:  # gone, or a path component replaced by something else
                stale = True
            if stale:
                unregister(old)


def unregister(path: str) -> None:
    with _LOCK:
        held = _SERVABLE.pop(path, None)
        if held is not None:
            os.close(held[2])


def registered(path: str) -> bool:
    with _LOCK:
        return path in _SERVABLE


def open_regular(path: str | Path, flags: int = os.O_RDONLY) -> int:
    """`path` opened without following a link and without blocking (a FIFO planted there),
    refused unless it is a regular file (FileNotFoundError, naming why)."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOENT, errno.ENXIO):
            raise FileNotFoundError(f"{path} is gone or was replaced by a link") from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise FileNotFoundError(f"{path} is not a regular file")
    return fd


def open_registered(path: str) -> int:
    """`path` opened read-only if it is a file this process registered and still the same
    file (no symlink followed); FileNotFoundError otherwise, naming why."""
    with _LOCK:
        want = _SERVABLE.get(path)
    if want is None:
        raise FileNotFoundError(f"{path} is not weights this process published or holds")
    try:
        fd = open_regular(path)
    except FileNotFoundError as exc:
        raise FileNotFoundError(f"{exc}: not served (the instance loads a newer "
                                "version)") from None
    st = os.fstat(fd)
    if (st.st_dev, st.st_ino) != want[:2]:
        os.close(fd)
        raise FileNotFoundError(f"{path} is no longer the file this process published or "
                                "holds (replaced): not served")
    return fd
