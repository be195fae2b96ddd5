"""A node: hosts workers on this machine for a registry on another one (runtime.registry).

    NodeAgent ─► serves its own address (tcp://ADVERTISE:0, CURVE when keys are set)
      ─► NodeHello(name, host, roles, cpus, memory, devices, address) to the registry,
         retried until it is accepted (the registry may not be up yet) or join_timeout_s
      ◄─ StartWorker: an allow-listed entry point ─► the node's own Supervisor starts it, bound
         to tcp://ADVERTISE:0 with the node's transport ─► WorkerStarted(name, pid, address)
      ◄─ KillWorker ─► Supervisor.kill
      ─► Heartbeat every heartbeat_interval_s (from a thread); WorkerExited for every local
         WorkerDied
      ◄─ Shutdown (the run ended), the registry's connection closed (its process ended), or no
         Pong from it for registry_timeout_s (our own stalls not counted)
         ─► every worker stopped ─► the node exits, or with `stay` joins the next run

The registry only names entry points the node allows (`allowed_entries`) and environment
variables with allowed prefixes: a peer that passed CURVE still cannot make the node import
arbitrary code or preload a library. String arguments may hold `{registry_host}`, replaced by
the host this node reaches the registry at (e.g. a rendezvous store the registry hosts).
"""
from __future__ import annotations

import asyncio
import logging
import os
import socket
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from runtime.actor import Actor, handler
from runtime.codec import Envelope
from runtime.config import SupervisorConfig, TransportConfig
from runtime.errors import RequestTimeout, TransportClosed
from runtime.heartbeat import HeartbeatSender, Silence
from runtime.protocol import (Heartbeat, KillWorker, NodeHello, Ping, Shutdown, StartWorker,
                              WorkerExited, WorkerStarted)
from runtime.supervisor import Supervisor, WorkerSpec

log = logging.getLogger(__name__)

ROLES = ("rollout", "trainer", "any")
ENV_PREFIXES = ("FLEXMARL_", "VLLM_", "OMP_", "GLOO_", "NCCL_", "CUDA_", "HF_", "TORCH_")
"""Environment variables a registry may set for a node's workers (nothing like LD_PRELOAD)."""


class NodeJoinError(RuntimeError):
    """The registry never accepted this node (unreachable, wrong key, or it refused us)."""


@dataclass
class NodeOptions:
    """How a node joins and what it offers."""

    name: str
    registry: str
    """tcp://HOST:PORT of the registry (`flexmarl run --listen`)."""
    roles: tuple[str, ...] = ("any",)
    advertise: str = ""
    """Address other machines reach this one at; empty: the one used to reach the registry."""
    allowed_entries: tuple[str, ...] = ()
    cpus: tuple[int, ...] = ()
    """Cores every worker of this node is pinned to (); () leaves them unpinned."""
    devices: int = 0
    stay: bool = False
    """After a run, wait and join the next one instead of exiting."""
    join_timeout_s: float = 600.0
    heartbeat_interval_s: float = 1.0
    registry_timeout_s: float = 60.0
    """Silence of the registry after which this node gives up the run and stops its workers. A
    registry that exited is noticed at once (its connection closes); silence only means a hung
    or unreachable one, and a busy run process can leave Pings unanswered for a while."""
    transport: TransportConfig = field(default_factory=TransportConfig)
    supervisor: SupervisorConfig = field(default_factory=SupervisorConfig)

    def __post_init__(self) -> None:
        bad = [r for r in self.roles if r not in ROLES]
        if bad or not self.roles:
            raise ValueError(f"node roles must be among {', '.join(ROLES)}, got {self.roles}")
        if urlsplit(self.registry).scheme != "tcp":
            raise ValueError(f"the registry address must be tcp://HOST:PORT, got "
                             f"{self.registry!r}")
        if not self.allowed_entries:
            raise ValueError("a node needs the entry points it may start (allowed_entries)")


def registry_host(registry: str) -> str:
    return urlsplit(registry).hostname or "127.0.0.1"


def advertise_host(registry: str) -> str:
    """The local address this machine uses to reach `registry` (no packet is sent)."""
    host = registry_host(registry)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect((socket.gethostbyname(host), 9))
            return s.getsockname()[0]
        except OSError:
            return "127.0.0.1"


class NodeAgent(Actor):
    """One node's actor; `await NodeAgent(options).run()` until the run ends (or forever with
    `stay`). See the module docstring."""

    def __init__(self, options: NodeOptions) -> None:
        self.options = options
        self.host = options.advertise or advertise_host(options.registry)
        super().__init__(options.name, f"tcp://{self.host}:0", transport=options.transport)
        self.sup: Supervisor | None = None
        self.joined = asyncio.Event()
        self.runs = 0
        """Runs this node has served (joined and released)."""

    async def node_loop(self) -> None:
        """Join, serve, and on release stop the workers; again with `stay`, else stop."""
        while True:
            self.sup = Supervisor(config=self.options.supervisor, transport=self.options.transport,
                                  name=f"{self.name}.supervisor")
            async with self.sup.serving():
                registry = self.connect(self.options.registry)
                await self._join(registry)
                self.runs += 1
                try:
                    await self._serve_run(registry)
                finally:
                    self.joined.clear()
                    await registry.aclose()
            log.warning("node %s: the run ended; its workers are stopped%s", self.name,
                        "; waiting for the next one" if self.options.stay else "")
            if not self.options.stay:
                self.stop()
                return

    async def _join(self, registry) -> None:
        o = self.options
        hello = NodeHello(self.name, self.host, list(o.roles), self.address or "", os.getpid(),
                          cpus=len(o.cpus) or os.cpu_count() or 0,
                          memory_bytes=_memory_bytes(), devices=o.devices)
        deadline = asyncio.get_running_loop().time() + o.join_timeout_s
        last: Exception | None = None
        while asyncio.get_running_loop().time() < deadline:
            try:
                await registry.request(hello, timeout_s=min(5.0, o.join_timeout_s))
                self.joined.set()
                log.warning("node %s joined %s as %s (workers at %s)", self.name, o.registry,
                            "/".join(o.roles), self.host)
                return
            except RequestTimeout as exc:  # not up yet, or it refuses our key (no answer)
                last = exc
            except Exception as exc:  # it answered with an error: say it and give up
                raise NodeJoinError(f"node {self.name}: {o.registry} refused to register it: "
                                    f"{exc}") from None
        raise NodeJoinError(
            f"node {self.name}: no answer from {o.registry} within {o.join_timeout_s:g} s "
            f"({last}); is `flexmarl run --listen` running there, and do both use the same CURVE "
            "key pair (transport.curve_secret_key_file / --key-file)?")

    async def _serve_run(self, registry) -> None:
        """Heartbeats and worker deaths to the registry until it releases us or goes silent."""
        o = self.options
        self._released = asyncio.Event()
        gone = asyncio.Event()
        registry.on_disconnect(gone.set)
        forward = asyncio.create_task(self._forward_deaths(registry))
        pid = os.getpid()
        beats = HeartbeatSender(o.registry, o.transport, lambda seq: Heartbeat(self.name, pid, seq),
                                o.heartbeat_interval_s, name=f"{self.name}.heartbeat")
        # One round (a Ping, its answer or deadline, a pause) takes up to 3 intervals.
        silence = Silence(o.registry_timeout_s, 3 * o.heartbeat_interval_s)
        silence.heard("registry")
        try:
            seq = 0
            while not self._released.is_set():
                seq += 1
                try:
                    await registry.request(Ping(seq), control=True,
                                           timeout_s=o.heartbeat_interval_s * 2)
                    silence.heard("registry")
                except (RequestTimeout, TransportClosed):
                    pass
                if gone.is_set() or silence.tick(asyncio.get_running_loop().time()):
                    why = ("its connection closed" if gone.is_set() else
                           f"it has not answered for {silence.silent_for('registry'):.0f} s")
                    log.error("node %s: the registry %s is gone (%s); stopping this node's "
                              "workers", self.name, o.registry, why)
                    return
                try:
                    await asyncio.wait_for(self._released.wait(), o.heartbeat_interval_s)
                except TimeoutError:
                    pass
        finally:
            beats.close()
            forward.cancel()

    async def _forward_deaths(self, registry) -> None:
        while True:
            event = await self.sup.events.get()
            await registry.send(WorkerExited(event.name, event.pid, event.reason,
                                             event.returncode, event.silent_for_s,
                                             list(event.stderr_tail)))

    @handler(StartWorker, concurrent=True)
    async def on_start_worker(self, msg: StartWorker, env: Envelope) -> WorkerStarted:
        if msg.entry not in self.options.allowed_entries:
            raise PermissionError(f"node {self.name} does not start {msg.entry!r}; it allows "
                                  f"{', '.join(self.options.allowed_entries)}")
        bad = [k for k in msg.env if not k.startswith(ENV_PREFIXES)]
        if bad:
            raise PermissionError(f"node {self.name} does not set environment variables "
                                  f"{bad} (allowed prefixes: {', '.join(ENV_PREFIXES)})")
        # Not `joined`: the registry may place work here the moment it has our hello, before
        # its reply to the hello reaches us.
        if self.sup is None:
            raise RuntimeError(f"node {self.name} has not joined a run")
        host = registry_host(self.options.registry)
        args = {k: v.replace("{registry_host}", host) if isinstance(v, str) else v
                for k, v in msg.args.items()}
        handle = await self.sup.start_worker(WorkerSpec(
            name=msg.name, entry=msg.entry, args=args, env=dict(msg.env),
            bind=f"tcp://{self.host}:0", ready_timeout_s=msg.ready_timeout_s or None,
            cpus=self.options.cpus))
        return WorkerStarted(handle.name, handle.pid, handle.address)

    @handler(KillWorker)
    async def on_kill_worker(self, msg: KillWorker, env: Envelope) -> None:
        if self.sup is not None:
            self.sup.kill(msg.name, msg.reason)

    @handler(Shutdown)
    async def on_shutdown(self, msg: Shutdown, env: Envelope) -> None:
        """The registry's run ended: release this node (its workers stop with the run)."""
        log.info("node %s released: %s", self.name, msg.reason or "run ended")
        if getattr(self, "_released", None) is not None:
            self._released.set()


def _memory_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 0
