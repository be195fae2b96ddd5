"""Published weights: a trainer writes each version once on its host, and the agent's rollout
instances read it there; the run passes the file's name, never the tensors.

    trainer's rank 0 (TrainerWorker.on_export, ExportWeights.publish = the run's name):
      export_weights() ─► publish(...) ─► <root>/<run name>/<agent>/v<version>-<pid>.safetensors
        written under a temporary name and renamed (a reader sees a whole file or none); the
        writer's older files of the agent go, but for the one before (instances may still be
        loading it while the next is written)
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
import logging
import os
import re
import shutil
import socket
import tempfile
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
    it (WeightUpdate.source). The trainer's rank 0 calls it, in a thread."""
    from safetensors.torch import save_file

    _check_name(run, "the run's name")
    if not run.startswith(PREFIX):
        raise ValueError(f"published weights' run name must start with {PREFIX!r}: {run!r}")
    _check_name(agent, "agent")
    num_bytes = weights_nbytes(tensors)
    folder = root(num_bytes) / run / agent
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"v{version}-{os.getpid()}.safetensors"
    tmp = folder / f".{path.name}.tmp"
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp))
    os.replace(tmp, path)
    for old in folder.glob(f"v*-{os.getpid()}.safetensors"):
        m = re.match(r"v(\d+)-", old.name)
        if m and int(m[1]) < version - 1:
            old.unlink(missing_ok=True)
    return {"path": str(path), "host": host_id(), "address": address, "num_bytes": num_bytes,
            "version": version}


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
                    and re.fullmatch(r"v\d+-\d+\.safetensors", rel.parts[2])):
                return True
    return False


def _roots() -> set[Path]:
    """Every place `root` may pick (it picks by the room left at each write)."""
    if env := os.environ.get("FLEXMARL_WEIGHTS_DIR"):
        return {Path(env)}
    return {Path(tempfile.gettempdir())} | ({Path("/dev/shm")} if os.path.isdir("/dev/shm")
                                            else set())


def version_of(path: str) -> int:
    """The version a published file holds (its name: v<version>-<pid>.safetensors)."""
    m = re.fullmatch(r"v(\d+)-\d+\.safetensors", Path(path).name)
    if m is None:
        raise ValueError(f"{path} is not a published weights file's name")
    return int(m[1])


def load(path: str) -> dict[str, torch.Tensor]:
    """A published file's tensors (safetensors' reader: no pickle)."""
    from safetensors.torch import load_file
    return load_file(path)


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
                tensors.update(await asyncio.to_thread(load, path))
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
        shutil.rmtree(base / run, ignore_errors=True)


def remove_own(run: str) -> None:
    """The files this process published for `run` on this host (a trainer stopping)."""
    _check_name(run, "the run's name")
    for base in _roots():
        for f in (base / run).glob(f"*/v*-{os.getpid()}.safetensors"):
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
