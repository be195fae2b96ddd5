"""Supervisor: start worker processes, watch them, report deaths, stop them in order.

    start_worker(spec) ──spawn──► python -m runtime.worker SPEC ──► entry(ctx) -> Actor
         │  waits (ready_timeout_s) for          │ Ready(name, pid, address)   (control lane)
         │◄──────────────────────────────────────┤ Heartbeat every interval    (control lane)
    proc_wait tasks ──► exit seen      ─┐        │
    heartbeat_watch_loop ─► silent     ─┴──► events: WorkerDied (once per worker)
    stop: Shutdown + SIGTERM to each process group ─► join (one deadline) ─► SIGKILL ─► reap

Workers run in their own session (process group), so grandchildren (e.g. vLLM engine cores) are
signalled too; each worker also asks the kernel to SIGTERM it if the supervisor dies, so even a
SIGKILLed supervisor leaves no orphan behind.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from runtime.actor import Actor, handler
from runtime.codec import Envelope
from runtime.config import SupervisorConfig, TransportConfig
from runtime.errors import WorkerStartError
from runtime.protocol import Heartbeat, Ready, Shutdown

log = logging.getLogger(__name__)


def pid_alive(pid: int) -> bool:
    """True if `pid` is a live process on this host (a zombie has exited: not alive)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


@dataclass(frozen=True, kw_only=True)
class WorkerSpec:
    """What to start: `entry` is "package.module:function", called as function(ctx) -> Actor."""

    name: str
    entry: str
    args: dict[str, Any] = field(default_factory=dict)
    """JSON-serialisable arguments handed to the entry point as ctx.args."""
    bind: str = "ipc://*"
    """Address the worker's actor serves (tcp://HOST:0 to serve other hosts)."""
    env: dict[str, str] = field(default_factory=dict)
    """Extra environment variables for the process (process bootstrap only)."""
    ready_timeout_s: float | None = None
    """Overrides supervisor.ready_timeout_s for this worker (e.g. one that starts an engine)."""
    cpus: tuple[int, ...] = ()
    """Pin the process (and what it starts) to these CPU cores and size OpenMP's thread pool to
    them, so processes sharing a machine do not oversubscribe it; () leaves both alone."""
    role: str = ""
    """The kind of node that hosts it when workers go to nodes (runtime.registry: "rollout",
    "trainer"); a local Supervisor ignores it."""

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", self.name):
            raise ValueError(f"WorkerSpec.name {self.name!r} must be 1-64 letters, digits, '_', "
                             "'.' or '-'")
        module, sep, attr = self.entry.partition(":")
        if not sep or not module or not attr:
            raise ValueError(f"WorkerSpec.entry {self.entry!r} must be 'package.module:function'")


@dataclass(frozen=True)
class WorkerDied:
    """Typed event: a worker exited or went silent without being asked to stop."""

    name: str
    pid: int
    reason: str
    """`exited` (the process ended) or `heartbeat_timeout` (silent; it has been killed)."""
    returncode: int | None
    silent_for_s: float
    """Time since the worker's last heartbeat when the death was detected."""


@dataclass
class WorkerHandle:
    spec: WorkerSpec
    proc: asyncio.subprocess.Process
    address: str = ""
    peer: Any = None
    last_seen: float = field(default_factory=time.monotonic)
    ready: asyncio.Future = field(default_factory=lambda: asyncio.get_running_loop().create_future())
    exited: asyncio.Event = field(default_factory=asyncio.Event)
    stopping: bool = False
    reported: bool = False

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def alive(self) -> bool:
        return not self.exited.is_set()


class Supervisor(Actor):
    """Owns worker processes. Use `async with sup.serving():`; leaving it stops every worker."""

    def __init__(self, *, config: SupervisorConfig = SupervisorConfig(),
                 address: str = "ipc://*", transport: TransportConfig = TransportConfig(),
                 name: str = "supervisor") -> None:
        super().__init__(name, address, transport=transport)
        self.config = config
        self.workers: dict[str, WorkerHandle] = {}
        self.events: asyncio.Queue[WorkerDied] = asyncio.Queue()
        self._ipc_dir: str | None = None

    # ------------------------------------------------------------------ start

    async def start_worker(self, spec: WorkerSpec) -> WorkerHandle:
        """Spawn a worker and return once it has sent Ready (or raise WorkerStartError)."""
        if self._tg is None or self.address is None:
            raise RuntimeError("start the supervisor first: async with supervisor.serving(): ...")
        old = self.workers.get(spec.name)
        if old is not None and old.alive:
            raise ValueError(f"a worker named {spec.name!r} is already running (pid {old.pid})")
        bind = spec.bind
        if bind == "ipc://*":
            # Socket files live in the supervisor's own directory, removed when it stops, so a
            # worker killed with -9 leaves no socket file behind.
            if self._ipc_dir is None:
                self._ipc_dir = tempfile.mkdtemp(prefix="flexmarl-workers-")
            bind = f"ipc://{os.path.join(self._ipc_dir, spec.name + '.sock')}"
        boot = {"name": spec.name, "entry": spec.entry, "args": spec.args, "bind": bind,
                "supervisor": self.address, "supervisor_pid": os.getpid(),
                "supervisor_config": asdict(self.config), "transport": asdict(self.transport),
                "ready_timeout_s": spec.ready_timeout_s, "cpus": list(spec.cpus)}
        env = {**os.environ, **spec.env}
        if spec.cpus:
            env.setdefault("OMP_NUM_THREADS", str(len(spec.cpus)))
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "runtime.worker", json.dumps(boot), env=env,
            start_new_session=True)
        handle = WorkerHandle(spec, proc)
        self.workers[spec.name] = handle
        self._tg.create_task(self._proc_wait(handle), name=f"{self.name}.wait[{spec.name}]")
        timeout_s = spec.ready_timeout_s or self.config.ready_timeout_s
        exited = asyncio.ensure_future(handle.exited.wait())
        try:
            done, _ = await asyncio.wait([handle.ready, exited], timeout=timeout_s,
                                         return_when=asyncio.FIRST_COMPLETED)
        finally:
            exited.cancel()
        if handle.ready.done():
            handle.last_seen = time.monotonic()
            log.info("worker %s ready (pid %d) at %s", spec.name, proc.pid, handle.address)
            return handle
        handle.stopping = True  # its end is reported by this exception, not as an event
        if handle.alive:
            self._signal(handle, signal.SIGKILL)
            await handle.exited.wait()
            raise WorkerStartError(
                f"worker {spec.name} ({spec.entry}) did not send Ready within {timeout_s:g} s; "
                "raise supervisor.ready_timeout_s (or WorkerSpec.ready_timeout_s) if it loads "
                "something large")
        raise WorkerStartError(f"worker {spec.name} ({spec.entry}) exited with code "
                               f"{proc.returncode} before sending Ready; see its stderr above")

    async def _proc_wait(self, handle: WorkerHandle) -> None:
        await handle.proc.wait()
        handle.exited.set()
        if not handle.stopping and handle.ready.done():
            self._report(handle, "exited")
            self._signal(handle, signal.SIGKILL)  # what it started (engine cores) goes too

    def kill(self, name: str, reason: str = "killed") -> None:
        """Treat a live worker as dead (e.g. it stopped answering requests): WorkerDied with
        `reason` on `events`, then SIGKILL to its process group."""
        handle = self.workers.get(name)
        if handle is None or not handle.alive:
            return
        self._report(handle, reason)
        handle.stopping = True
        self._signal(handle, signal.SIGKILL)

    def _report(self, handle: WorkerHandle, reason: str) -> None:
        if handle.reported:
            return
        handle.reported = True
        event = WorkerDied(handle.name, handle.pid, reason, handle.proc.returncode,
                           round(time.monotonic() - handle.last_seen, 3))
        log.warning("worker %s (pid %d) died: %s (returncode %s, silent for %.2f s)",
                    event.name, event.pid, reason, event.returncode, event.silent_for_s)
        self.events.put_nowait(event)

    # ------------------------------------------------------------------ watch

    @handler(Ready, concurrent=True)
    async def on_ready(self, msg: Ready, env: Envelope) -> None:
        handle = self.workers.get(msg.name)
        if handle is None or handle.pid != msg.pid:
            raise ValueError(f"Ready from unknown worker {msg.name!r} (pid {msg.pid})")
        handle.address, handle.peer, handle.last_seen = msg.address, env.peer, time.monotonic()
        if not handle.ready.done():
            handle.ready.set_result(msg)

    @handler(Heartbeat)
    async def on_heartbeat(self, msg: Heartbeat, env: Envelope) -> None:
        handle = self.workers.get(msg.name)
        if handle is not None and handle.pid == msg.pid:
            handle.last_seen = time.monotonic()

    async def heartbeat_watch_loop(self) -> None:
        # A timer, not a poll of sockets: deaths by exit arrive through _proc_wait at once;
        # this only catches workers that are alive but silent (hung, stopped, partitioned).
        interval = self.config.heartbeat_interval_s
        while True:
            await asyncio.sleep(interval)
            now = time.monotonic()
            for handle in list(self.workers.values()):
                if (handle.alive and not handle.stopping and handle.ready.done()
                        and now - handle.last_seen > self.config.heartbeat_timeout_s):
                    self._report(handle, "heartbeat_timeout")
                    handle.stopping = True
                    self._signal(handle, signal.SIGKILL)

    # ------------------------------------------------------------------ stop

    async def stop_workers(self, names: list[str] | None = None) -> None:
        """Shutdown message and SIGTERM, join against one deadline, then SIGKILL; reap all."""
        handles = [h for h in self.workers.values()
                   if h.alive and (names is None or h.name in names)]
        if not handles:
            return
        for handle in reversed(handles):  # last started first: dependents before dependencies
            handle.stopping = True
            if handle.peer is not None:
                await self.push(handle.peer, Shutdown("supervisor stopping"), control=True)
            self._signal(handle, signal.SIGTERM)
        waits = [asyncio.ensure_future(h.exited.wait()) for h in handles]
        _, pending = await asyncio.wait(waits, timeout=self.config.stop_timeout_s)
        for fut in pending:
            fut.cancel()
        for handle in handles:
            if handle.alive:
                log.warning("worker %s (pid %d) ignored SIGTERM for %g s; killing it "
                            "(raise supervisor.stop_timeout_s if it needs longer to drain)",
                            handle.name, handle.pid, self.config.stop_timeout_s)
                self._signal(handle, signal.SIGKILL)
        for handle in handles:
            await handle.exited.wait()

    async def on_drain(self) -> None:
        await self.stop_workers()
        if self._ipc_dir is not None:
            shutil.rmtree(self._ipc_dir, ignore_errors=True)

    @staticmethod
    def _signal(handle: WorkerHandle, sig: int) -> None:
        try:
            os.killpg(handle.pid, sig)  # the worker leads its own process group
        except ProcessLookupError:
            pass
