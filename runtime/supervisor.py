"""Supervisor: start worker processes, watch them, report deaths, stop them in order.

    start_worker(spec) ──spawn──► python -m runtime.worker SPEC ──► entry(ctx) -> Actor
         │  waits (ready_timeout_s) for          │ Ready(name, pid, address)   (control lane)
         │◄──────────────────────────────────────┤ Heartbeat every interval    (a thread's own
         │◄── stderr pipe ── tee thread: copied to our stderr, last lines kept    socket)
    proc_wait tasks ──► exit seen      ─┐        │
    heartbeat_watch_loop ─► silent     ─┴──► events: WorkerDied (once per worker)
    stop: Shutdown + SIGTERM to each process group ─► join (one deadline) ─► SIGKILL ─► reap

A worker is dead on evidence at once (its process exited: `exited`, with its code and last stderr
lines, whether before Ready or after); on silence only after heartbeat_timeout_s of silence that
this process was awake to hear (runtime.heartbeat.Silence: its own stalls are not the worker's).

Workers run in their own session (process group), so grandchildren (e.g. vLLM engine cores) are
signalled too; each worker also asks the kernel to SIGTERM it if the supervisor dies, so even a
SIGKILLed supervisor leaves no orphan behind.
"""
from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from runtime.actor import Actor, handler
from runtime.codec import Envelope
from runtime.config import SupervisorConfig, TransportConfig
from runtime.errors import WorkerStartError
from runtime.heartbeat import Silence
from runtime.protocol import Heartbeat, Ready, Shutdown
from runtime.zygote import Zygote

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
    nice: int = 0
    """Added to the process's niceness at start (0..19: lower CPU priority), e.g. for
    throughput work sharing cores with latency-critical processes."""
    role: str = ""
    """The kind of node that hosts it when workers go to nodes (runtime.registry: "rollout",
    "trainer"); a local Supervisor ignores it."""
    node: str = ""
    """The node that must host it (its GPUs were planned there); "": the registry picks the
    least busy node of its role. A local Supervisor ignores it."""
    group: str = ""
    """Workers a cluster engine places together on one machine (a trainer slot's ranks); "":
    its own group. A local Supervisor ignores it (runtime.ray_cluster reads it)."""
    group_size: int = 1
    """How many workers `group` has (its placement group's bundles)."""
    group_index: int = 0
    """This worker's bundle in its group (a trainer rank)."""
    gpus: float = 0.0
    """GPUs a cluster engine reserves for it (a rollout instance: its tensor-parallel size;
    a trainer rank: 1); here its GPUs come from env's CUDA_VISIBLE_DEVICES instead."""

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", self.name):
            raise ValueError(f"WorkerSpec.name {self.name!r} must be 1-64 letters, digits, '_', "
                             "'.' or '-'")
        module, sep, attr = self.entry.partition(":")
        if not sep or not module or not attr:
            raise ValueError(f"WorkerSpec.entry {self.entry!r} must be 'package.module:function'")
        if isinstance(self.nice, bool) or not isinstance(self.nice, int) or not 0 <= self.nice <= 19:
            raise ValueError(f"WorkerSpec.nice must be an int in 0..19, got {self.nice!r}")


def visible_devices(wanted: str, own: str | None) -> str:
    """A worker's CUDA_VISIBLE_DEVICES: `wanted` are indices of the GPUs this process sees, so
    they go through this process's own CUDA_VISIBLE_DEVICES when it has one ("1" under
    "4,5,6" is "5"), the way torch numbers devices."""
    if not own or not own.strip():
        return wanted
    mine = [d.strip() for d in own.split(",") if d.strip()]
    out = []
    for index in filter(None, (w.strip() for w in wanted.split(","))):
        if not index.isdigit() or int(index) >= len(mine):
            raise ValueError(f"GPU {index} asked for a worker, but this process sees only "
                             f"{len(mine)} (CUDA_VISIBLE_DEVICES={own})")
        out.append(mine[int(index)])
    return ",".join(out)


@dataclass(frozen=True)
class WorkerDied:
    """Typed event: a worker exited or went silent without being asked to stop."""

    name: str
    pid: int
    reason: str
    """`exited` (the process ended) or `heartbeat_timeout` (silent; it has been killed)."""
    returncode: int | None
    silent_for_s: float
    """Silence since the worker's last heartbeat when the death was detected (time this process
    itself was stalled not counted)."""
    stderr_tail: tuple[str, ...] = ()
    """The last lines the worker wrote to stderr (its traceback, when it crashed)."""

    def describe(self) -> str:
        """One line for a log or an error: what happened, and the worker's last words."""
        return (f"worker {self.name} died: {self.reason} (pid {self.pid}, returncode "
                f"{self.returncode}, silent for {self.silent_for_s:.2f} s)"
                + last_words(self.stderr_tail))


def last_words(tail: tuple[str, ...]) -> str:
    """A worker's last stderr lines as the end of a message ("" when it wrote none)."""
    return ("; its last stderr lines:\n  " + "\n  ".join(tail)) if tail else ""


class StderrTail:
    """Copies a worker's stderr to this process's stderr (or appends it to the file `sink`) as
    it comes and keeps its last lines.

    A thread, not the event loop, reads the pipe: a busy loop must never leave a worker blocked
    on a full pipe, and a crash's traceback must be readable while the loop is still catching up.
    """

    def __init__(self, fd: int, keep: int = 20, sink: str | os.PathLike | None = None) -> None:
        self._fd = fd
        self._sink = sink
        self._lines: list[bytes] = [b""]
        self._keep = keep
        self._lock = threading.Lock()
        self.eof = threading.Event()
        threading.Thread(target=self._copy, name="stderr-tee", daemon=True).start()

    def _copy(self) -> None:
        # O_APPEND: the workers' tails share one log file, each write landing whole at its end.
        out = 2
        if self._sink is not None:
            try:
                out = os.open(self._sink, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            except OSError:  # the log's disk is gone: the console beats losing a traceback
                pass
        try:
            while data := os.read(self._fd, 65536):
                try:
                    os.write(out, data)
                except OSError:
                    pass
                with self._lock:
                    *done, rest = data.split(b"\n")
                    if done:
                        self._lines[-1] += done[0]
                        self._lines.extend(done[1:])
                        self._lines.append(rest)
                    else:
                        self._lines[-1] += rest
                    del self._lines[:-self._keep - 1]
        except OSError:
            pass
        finally:
            os.close(self._fd)
            if out != 2:
                os.close(out)
            self.eof.set()

    def tail(self) -> tuple[str, ...]:
        with self._lock:
            lines = [ln.decode(errors="replace").rstrip() for ln in self._lines]
        return tuple(ln for ln in lines if ln.strip())[-self._keep:]

    async def settled(self, timeout_s: float = 1.0) -> tuple[str, ...]:
        """The tail once the pipe is drained (all writers gone) or after `timeout_s` (a
        grandchild may hold the pipe open)."""
        await asyncio.to_thread(self.eof.wait, timeout_s)
        return self.tail()


@dataclass
class WorkerHandle:
    spec: WorkerSpec
    proc: Any
    """An asyncio.subprocess.Process, or a cluster engine's stand-in with the same pid,
    returncode and wait() (runtime.ray_cluster.RayProcess)."""
    stderr: StderrTail
    address: str = ""
    peer: Any = None
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

    remote = False
    """Its workers run on this machine (a registry's or a cluster engine's may not)."""

    def __init__(self, *, config: SupervisorConfig = SupervisorConfig(),
                 address: str = "ipc://*", transport: TransportConfig = TransportConfig(),
                 name: str = "supervisor", worker_log: str | os.PathLike | None = None) -> None:
        """`worker_log`: a file the workers' stdout and stderr are appended to (a run's log);
        None: they go to this process's stderr and stdout."""
        super().__init__(name, address, transport=transport)
        self.config = config
        self.worker_log = worker_log
        self.workers: dict[str, WorkerHandle] = {}
        self.events: asyncio.Queue[WorkerDied] = asyncio.Queue()
        self.silence = Silence(config.heartbeat_timeout_s, config.heartbeat_interval_s)
        self._ipc_dir: str | None = None
        self._zygote: Zygote | None = None
        self._zygote_lock = asyncio.Lock()

    # ------------------------------------------------------------------ start

    async def start_worker(self, spec: WorkerSpec) -> WorkerHandle:
        """Spawn a worker and return once it has sent Ready (or raise WorkerStartError)."""
        if self._tg is None or self.address is None:
            raise RuntimeError("start the supervisor first: async with supervisor.serving(): ...")
        old = self.workers.get(spec.name)
        if old is not None and old.alive:
            raise ValueError(f"a worker named {spec.name!r} is already running (pid {old.pid})")
        boot = {"name": spec.name, "entry": spec.entry, "args": spec.args,
                "bind": self._bind(spec),
                "supervisor": self.address, "supervisor_pid": os.getpid(),
                "supervisor_config": asdict(self.config), "transport": asdict(self.transport),
                "ready_timeout_s": spec.ready_timeout_s, "cpus": list(spec.cpus),
                "nice": spec.nice}
        handle = await self._spawn(spec, boot)
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
            self.silence.heard(spec.name)
            log.info("worker %s ready (pid %d) at %s", spec.name, handle.pid, handle.address)
            return handle
        handle.stopping = True  # its end is reported by this exception, not as an event
        # The process may have exited before the deadline with its exit not yet seen here (this
        # loop was busy): a zombie is an exit, to be reported as one, not as a slow start.
        too_slow = handle.alive and self._running(handle)
        self._signal(handle, signal.SIGKILL)  # it, or what it left behind (engine cores)
        await handle.exited.wait()
        last = last_words(await handle.stderr.settled())
        if too_slow and handle.proc.returncode == -signal.SIGKILL:
            raise WorkerStartError(
                f"worker {spec.name} ({spec.entry}) did not send Ready within {timeout_s:g} s; "
                "raise supervisor.ready_timeout_s (or WorkerSpec.ready_timeout_s) if it loads "
                f"something large{last}")
        raise WorkerStartError(f"worker {spec.name} ({spec.entry}) exited with code "
                               f"{handle.proc.returncode} before sending Ready{last}")

    def _bind(self, spec: WorkerSpec) -> str:
        if spec.bind != "ipc://*":
            return spec.bind
        # Socket files live in the supervisor's own directory, removed when it stops, so a
        # worker killed with -9 leaves no socket file behind.
        if self._ipc_dir is None:
            self._ipc_dir = tempfile.mkdtemp(prefix="flexmarl-workers-")
        return f"ipc://{os.path.join(self._ipc_dir, spec.name + '.sock')}"

    async def _spawn(self, spec: WorkerSpec, boot: dict[str, Any]) -> WorkerHandle:
        """Start the worker's process on this machine, in a session of its own."""
        env = {**os.environ, **spec.env}
        if "CUDA_VISIBLE_DEVICES" in spec.env:
            env["CUDA_VISIBLE_DEVICES"] = visible_devices(spec.env["CUDA_VISIBLE_DEVICES"],
                                                          os.environ.get("CUDA_VISIBLE_DEVICES"))
        if spec.cpus:
            env.setdefault("OMP_NUM_THREADS", str(len(spec.cpus)))
        read_end, write_end = os.pipe()
        try:
            zygote = await self._fork_server()
            if zygote is not None:
                proc = await zygote.spawn(boot, env, write_end)
            else:
                # With a log file, stdout too (vLLM logs to stdout) goes through the tail.
                proc = await asyncio.create_subprocess_exec(
                    sys.executable, "-m", "runtime.worker", json.dumps(boot), env=env,
                    stderr=write_end, stdout=write_end if self.worker_log is not None else None,
                    start_new_session=True)
        except BaseException:
            os.close(read_end)
            raise
        finally:
            os.close(write_end)  # the worker (and what it starts) hold the only write ends
        return WorkerHandle(spec, proc, StderrTail(read_end, sink=self.worker_log))

    async def _fork_server(self) -> Zygote | None:
        """The zygote workers are forked from (config.preload), started on first use; None:
        none configured, or it failed to start (then workers start as fresh interpreters)."""
        if not self.config.preload:
            return None
        async with self._zygote_lock:
            if self._zygote is not None and self._zygote.alive:
                return self._zygote
            if self._zygote is not None:
                log.warning("the workers' fork server exited; starting another")
                await self._zygote.close()
            self._zygote = Zygote(self.config.preload, stdout=self.worker_log is not None)
            read_end, write_end = os.pipe()
            tail = StderrTail(read_end, sink=self.worker_log)  # as a worker's: the run's log
            try:
                await self._zygote.start(self.config.ready_timeout_s, write_end)
            except Exception as exc:
                log.warning("the workers' fork server (supervisor.preload) did not start "
                            "(%s: %s%s); starting workers as fresh interpreters",
                            type(exc).__name__, exc, last_words(tail.tail()))
                await self._zygote.close()
                self.config = dataclasses.replace(self.config, preload=())
                self._zygote = None
            finally:
                os.close(write_end)  # the zygote (and its children) hold the only write ends
            return self._zygote

    def _running(self, handle: WorkerHandle) -> bool:
        """Its process still runs (a zombie has exited), whatever this loop has seen yet."""
        return pid_alive(handle.pid)

    async def _proc_wait(self, handle: WorkerHandle) -> None:
        await handle.proc.wait()
        handle.exited.set()
        if not handle.stopping and handle.ready.done():
            self._signal(handle, signal.SIGKILL)  # what it started (engine cores) goes too
            # A cluster engine's process may say more (its node lost: runtime.ray_cluster).
            self._report(handle, getattr(handle.proc, "reason", "exited"),
                         await handle.stderr.settled())
        if self.workers.get(handle.name) is handle:
            self.silence.forget(handle.name)

    def kill(self, name: str, reason: str = "killed") -> None:
        """Treat a live worker as dead (e.g. it stopped answering requests): WorkerDied with
        `reason` on `events`, then SIGKILL to its process group."""
        handle = self.workers.get(name)
        if handle is None or not handle.alive:
            return
        self._report(handle, reason)
        handle.stopping = True
        self._signal(handle, signal.SIGKILL)

    def _report(self, handle: WorkerHandle, reason: str, tail: tuple[str, ...] = ()) -> None:
        if handle.reported:
            return
        handle.reported = True
        event = WorkerDied(handle.name, handle.pid, reason, handle.proc.returncode,
                           round(self.silence.silent_for(handle.name), 3), tail)
        log.warning("%s", event.describe())
        self.events.put_nowait(event)

    # ------------------------------------------------------------------ watch

    @handler(Ready, concurrent=True)
    async def on_ready(self, msg: Ready, env: Envelope) -> None:
        handle = self.workers.get(msg.name)
        # pid 0: a cluster engine's worker whose pid has not reached us yet (it may say Ready
        # first); its name and the run's key vouch for it.
        if handle is None or (handle.pid and handle.pid != msg.pid):
            raise ValueError(f"Ready from unknown worker {msg.name!r} (pid {msg.pid})")
        handle.address, handle.peer = msg.address, env.peer
        self.silence.heard(msg.name)
        if not handle.ready.done():
            handle.ready.set_result(msg)

    @handler(Heartbeat)
    async def on_heartbeat(self, msg: Heartbeat, env: Envelope) -> None:
        handle = self.workers.get(msg.name)
        if handle is not None and handle.pid in (msg.pid, 0):
            self.silence.heard(msg.name)

    async def heartbeat_watch_loop(self) -> None:
        # A timer, not a poll of sockets: deaths by exit arrive through _proc_wait at once;
        # this only catches workers that are alive but silent (hung, stopped, partitioned).
        while True:
            await asyncio.sleep(self.config.heartbeat_interval_s)
            for name in self.silence.tick(time.monotonic()):
                handle = self.workers.get(name)
                if (handle is not None and handle.alive and not handle.stopping
                        and handle.ready.done()):
                    self._report(handle, "heartbeat_timeout")
                    handle.stopping = True
                    self._signal(handle, signal.SIGKILL)
                self.silence.forget(name)

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
        if self._zygote is not None:
            await self._zygote.close()
            self._zygote = None
        if self._ipc_dir is not None:
            shutil.rmtree(self._ipc_dir, ignore_errors=True)

    def _signal(self, handle: WorkerHandle, sig: int) -> None:
        try:
            os.killpg(handle.pid, sig)  # the worker leads its own process group
        except ProcessLookupError:
            pass
