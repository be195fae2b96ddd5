"""The registry: nodes on other machines join it, and it places workers on them.

    flexmarl-node ──NodeHello──► NodeRegistry (listens on tcp://ADDR:PORT, CURVE)
                  ◄─ connect to the node's own address (StartWorker, KillWorker, Shutdown)
                  ──Heartbeat / WorkerExited──► liveness and deaths
    start_worker(spec) ─► a live node whose roles include spec.role (or "any"), the one with
                  fewest workers of that role ─► StartWorker ─► RemoteWorker(name, pid, address)
    node's connection closed (its process ended) ─► at once, or node silent for node_timeout_s
                  (its heartbeats come from a thread; our own stalls not counted) ─► each of its
                  workers is reported dead (reason node_lost)
    events: WorkerDied, as a Supervisor's: code that starts and watches workers takes either

`wait_for({"rollout": 2, "trainer": 1})` waits until enough nodes have joined (an "any" node
counts for either role, once) and says which are missing when it gives up. `on_join(node)` is
called for every node that joins after `started_run(on_join)`: the run can hand it work (elasticity).
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Callable

from runtime.actor import Actor, handler
from runtime.codec import Envelope
from runtime.config import TransportConfig
from runtime.errors import PeerDied, WorkerStartError
from runtime.heartbeat import Silence
from runtime.protocol import (Heartbeat, KillWorker, NodeHello, Shutdown, StartWorker,
                              WorkerExited, WorkerStarted)
from runtime.supervisor import WorkerDied, WorkerSpec
from runtime.transport import Connection

log = logging.getLogger(__name__)


class NodesMissing(TimeoutError):
    """Not enough nodes joined in time; the message says which roles are short."""


@dataclass
class NodeInfo:
    hello: NodeHello
    conn: Connection
    joined_at: float
    workers: dict[str, str] = field(default_factory=dict)
    """worker name -> its role."""
    alive: bool = True

    @property
    def name(self) -> str:
        return self.hello.name

    def serves(self, role: str) -> bool:
        return not role or role in self.hello.roles or "any" in self.hello.roles


@dataclass(frozen=True)
class RemoteWorker:
    name: str
    node: str
    pid: int
    address: str


class NodeRegistry(Actor):
    """See the module docstring. `async with NodeRegistry(addr).serving():`; leaving it releases
    every node (their workers stop)."""

    remote = True
    """Its workers run on other machines."""

    def __init__(self, address: str, *, transport: TransportConfig = TransportConfig(),
                 node_timeout_s: float = 30.0, start_timeout_s: float = 600.0) -> None:
        super().__init__("registry", address, transport=transport)
        self.node_timeout_s = node_timeout_s
        self.silence = Silence(node_timeout_s, min(1.0, node_timeout_s / 4))
        self.start_timeout_s = start_timeout_s
        self.nodes: dict[str, NodeInfo] = {}
        self.workers: dict[str, RemoteWorker] = {}
        self.events: asyncio.Queue[WorkerDied] = asyncio.Queue()
        self._on_join: Callable[[NodeInfo], None] | None = None
        self._changed = asyncio.Event()
        self._run_started = False

    # ------------------------------------------------------------------ nodes

    @handler(NodeHello, concurrent=True)
    async def on_hello(self, msg: NodeHello, env: Envelope) -> None:
        old = self.nodes.get(msg.name)
        if old is not None and old.alive and (old.hello.pid, old.hello.address) == (
                msg.pid, msg.address):
            return  # the same process again: our answer to its hello came too late for it
        if old is not None and old.alive:
            raise ValueError(f"a node named {msg.name!r} has joined already (from {old.hello.host}"
                             "); give each node its own --name")
        node = NodeInfo(msg, self.connect(msg.address), time.monotonic())
        self.nodes[msg.name] = node
        self.silence.heard(msg.name)
        # Evidence of death that needs no timeout: the node's process ended, its socket closed.
        node.conn.on_disconnect(lambda: self._lose(node, "its connection closed"))
        log.warning("node %s joined from %s as %s (%d cpus, %.1f GiB, %d devices)", msg.name,
                    msg.host, "/".join(msg.roles), msg.cpus, msg.memory_bytes / 2**30,
                    msg.devices)
        self._changed.set()
        if self._run_started and self._on_join is not None:
            self._on_join(node)

    @handler(Heartbeat)
    async def on_heartbeat(self, msg: Heartbeat, env: Envelope) -> None:
        node = self.nodes.get(msg.name)
        if node is not None and node.alive:
            self.silence.heard(msg.name)

    @handler(WorkerExited)
    async def on_worker_exited(self, msg: WorkerExited, env: Envelope) -> None:
        worker = self.workers.pop(msg.name, None)
        if worker is None:
            return  # killed through us, or a node lost before: reported already
        self.nodes[worker.node].workers.pop(msg.name, None)
        self._report(WorkerDied(msg.name, msg.pid, msg.reason, msg.returncode, msg.silent_for_s,
                                tuple(msg.stderr_tail)))

    async def node_watch_loop(self) -> None:
        while True:
            await asyncio.sleep(self.silence.tick_s)
            for name in self.silence.tick(time.monotonic()):
                node = self.nodes.get(name)
                if node is not None:
                    self._lose(node, f"silent for {self.silence.silent_for(name):.1f} s "
                                     f"(cluster.node_timeout_s = {self.node_timeout_s:g})")
                self.silence.forget(name)

    def _lose(self, node: NodeInfo, why: str) -> None:
        if not node.alive:
            return
        node.alive = False
        silent_s = round(self.silence.silent_for(node.name), 3)
        self.silence.forget(node.name)
        log.error("node %s lost (%s): its %d workers are dead", node.name, why,
                  len(node.workers))
        node.conn.fail_pending(PeerDied(f"node {node.name} lost: {why}"))
        for name in list(node.workers):
            worker = self.workers.pop(name, None)
            if worker is not None:
                self._report(WorkerDied(name, worker.pid, "node_lost", None, silent_s))
        node.workers.clear()
        self._changed.set()

    def _report(self, event: WorkerDied) -> None:
        log.warning("%s", event.describe())
        self.events.put_nowait(event)

    def alive(self) -> list[NodeInfo]:
        return [n for n in self.nodes.values() if n.alive]

    def missing(self, need: dict[str, int]) -> dict[str, int]:
        """role -> nodes still missing: dedicated nodes first, then "any" nodes fill the gaps."""
        nodes = self.alive()
        short = {r: max(0, k - sum(r in n.hello.roles for n in nodes)) for r, k in need.items()}
        spare = sum("any" in n.hello.roles for n in nodes)
        for role in short:
            used = min(spare, short[role])
            short[role] -= used
            spare -= used
        return {r: k for r, k in short.items() if k > 0}

    async def wait_for(self, need: dict[str, int], timeout_s: float,
                       report: Callable[[str], None] | None = None) -> None:
        """Until `need` (role -> nodes) is met; NodesMissing naming what is short after
        `timeout_s`. `report(line)` hears each change while waiting."""
        deadline = time.monotonic() + timeout_s
        while short := self.missing(need):
            if report is not None:
                report(f"waiting for nodes at {self.address}: " + ", ".join(
                    f"{k} more {r}" for r, k in short.items()) + f" (joined: "
                    f"{', '.join(n.name for n in self.alive()) or 'none'})")
            self._changed.clear()
            left = deadline - time.monotonic()
            try:
                await asyncio.wait_for(self._changed.wait(), max(left, 0))
            except TimeoutError:
                raise NodesMissing(
                    f"after {timeout_s:g} s the run still lacks " + ", ".join(
                        f"{k} {r} node(s)" for r, k in short.items()) + "; joined: " + (
                        ", ".join(f"{n.name} ({'/'.join(n.hello.roles)})" for n in self.alive())
                        or "none") + f". Start `flexmarl-node --connect {self.address} --role "
                    "ROLE` on the missing machines (same CURVE key pair), or lower "
                    "cluster.rollout_nodes / cluster.trainer_nodes") from None

    def started_run(self, on_join: Callable[[NodeInfo], None] | None = None) -> None:
        """From now on, nodes that join are handed to `on_join(node)`."""
        self._on_join = on_join
        self._run_started = True

    # ------------------------------------------------------------------ workers

    async def start_worker(self, spec: WorkerSpec) -> RemoteWorker:
        """Start `spec` on its node (spec.node), else on the least busy live node of its role."""
        nodes = [n for n in self.alive() if n.serves(spec.role)]
        if spec.node:  # placed there (its GPUs): that node or none
            nodes = [n for n in nodes if n.name == spec.node]
            if not nodes:
                raise WorkerStartError(f"{spec.name} was placed on node {spec.node}, which is "
                                       f"not live with role {spec.role!r}; live: "
                                       f"{', '.join(n.name for n in self.alive()) or 'none'}")
        if not nodes:
            raise WorkerStartError(f"no live node serves role {spec.role!r} to start "
                                   f"{spec.name}; joined: "
                                   f"{', '.join(n.name for n in self.alive()) or 'none'}")
        node = min(nodes, key=lambda n: (sum(r == spec.role for r in n.workers.values()),
                                         len(n.workers), n.joined_at))
        # Counted on the node from now: starts placed at the same time spread over the nodes.
        node.workers[spec.name] = spec.role
        timeout = (spec.ready_timeout_s or self.start_timeout_s) + 10.0
        try:
            started: WorkerStarted = await node.conn.request(
                StartWorker(spec.name, spec.entry, spec.args, spec.env,
                            spec.ready_timeout_s or 0.0), timeout_s=timeout)
            if not node.alive:  # lost while it started: the worker is as good as dead
                raise PeerDied(f"node {node.name} was lost")
        except Exception as exc:
            node.workers.pop(spec.name, None)
            raise WorkerStartError(f"node {node.name} could not start {spec.name}: "
                                   f"{exc}") from exc
        worker = RemoteWorker(started.name, node.name, started.pid, started.address)
        self.workers[worker.name] = worker
        log.info("worker %s started on node %s (pid %d) at %s", worker.name, node.name,
                 worker.pid, worker.address)
        return worker

    def kill(self, name: str, reason: str = "killed") -> None:
        """Report the worker dead now and have its node SIGKILL it."""
        worker = self.workers.pop(name, None)
        if worker is None:
            return
        node = self.nodes[worker.node]
        node.workers.pop(name, None)
        self._report(WorkerDied(name, worker.pid, reason, None, 0.0))
        if node.alive:
            task = asyncio.ensure_future(node.conn.request(KillWorker(name, reason),
                                                           timeout_s=10.0))
            task.add_done_callback(lambda t: t.cancelled() or t.exception())

    async def on_drain(self) -> None:
        """The run is over: release every node (they stop their workers)."""
        async def release(node: NodeInfo) -> None:
            try:
                await node.conn.request(Shutdown("the run ended"), timeout_s=5.0)
            except Exception as exc:
                log.info("releasing node %s: %s", node.name, exc)
        await asyncio.gather(*(release(n) for n in self.alive()))
