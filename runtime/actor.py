"""Actor base: a mailbox, handlers by message type, named `*_loop` tasks, a shutdown state.

    listener.recv() ──► mailbox_loop ──► admit(env) ──► handler(msg, env) ──► reply (or Error)
                         (control first)  (hook, sync,   sequential, or a task per request
                                           arrival order) if concurrent=True
    other *_loop methods run beside it in the actor's TaskGroup

An actor owns its state; others reach it only through messages at `actor.address`.
Lifecycle: NEW -> RUNNING -> DRAINING (stop requested: no new bulk requests, in-flight ones
finish, `on_drain` runs) -> STOPPED (loops cancelled, connections and listener closed).
A failing handler becomes an Error reply; it never kills the loop.
"""
from __future__ import annotations

import asyncio
import enum
import inspect
import logging
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Callable

from runtime.codec import Envelope
from runtime.config import TransportConfig
from runtime.errors import TransportClosed
from runtime.protocol import FLAG_CONTROL, Ack, Error, Ping, Pong, Shutdown
from runtime.transport import Connection, Listener, bind, connect

log = logging.getLogger(__name__)


class ActorState(enum.Enum):
    NEW = "new"
    RUNNING = "running"
    DRAINING = "draining"
    STOPPED = "stopped"


def handler(msg_type: type, *, concurrent: bool = False) -> Callable:
    """Mark `async def on_x(self, msg, env)` as the handler of `msg_type`.

    A handler returns the reply message (None means Ack) for requests; for one-way messages the
    return value is ignored. `concurrent=True` serves each request in its own task (bounded by
    `max_concurrent`), for handlers that wait on other actors or on long work.
    """

    def mark(fn: Callable) -> Callable:
        if not inspect.iscoroutinefunction(fn):
            raise TypeError(f"handler {fn.__name__} must be an async def")
        fn._handles = (msg_type, concurrent)
        return fn

    return mark


class Actor:
    """Base class of every actor. Subclasses add `@handler` methods and `*_loop` coroutines."""

    _handlers: dict[type, tuple[str, bool]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        table: dict[type, tuple[str, bool]] = {}
        for klass in reversed(cls.__mro__):
            for name, fn in vars(klass).items():
                if hasattr(fn, "_handles"):
                    msg_type, concurrent = fn._handles
                    table[msg_type] = (name, concurrent)
        cls._handlers = table

    def __init__(self, name: str, address: str = "local://*", *,
                 transport: TransportConfig = TransportConfig(), max_concurrent: int = 64,
                 drain_timeout_s: float = 10.0) -> None:
        self.name = name
        self.bind_address = address
        self.address: str | None = None
        self.transport = transport
        self.state = ActorState.NEW
        self.started = asyncio.Event()
        self.stopped = asyncio.Event()
        self._stop = asyncio.Event()
        self._slots = asyncio.Semaphore(max_concurrent)
        self._inflight: set[asyncio.Task] = set()
        self._drain_timeout_s = drain_timeout_s
        self._listener: Listener | None = None
        self._tg: asyncio.TaskGroup | None = None
        self._connections: list[Connection] = []

    # ------------------------------------------------------------------ lifecycle

    async def run(self) -> None:
        """Bind, run every `*_loop` until `stop()`, then drain and close. Returns when stopped."""
        if self.state is not ActorState.NEW:
            raise RuntimeError(f"actor {self.name} was already run (state {self.state.value})")
        self._listener = bind(self.bind_address, self.transport)
        self.address = self._listener.address
        try:
            await self.on_start()
            self.state = ActorState.RUNNING
            async with asyncio.TaskGroup() as tg:
                self._tg = tg
                loops = [tg.create_task(getattr(self, n)(), name=f"{self.name}.{n}")
                         for n in self._loop_names()]
                self.started.set()
                await self._stop.wait()
                self.state = ActorState.DRAINING
                await self.on_drain()
                if self._inflight:
                    await asyncio.wait(list(self._inflight), timeout=self._drain_timeout_s)
                for task in [*loops, *self._inflight]:
                    task.cancel()
        finally:
            self.state = ActorState.STOPPED
            try:
                await self.on_stop()
            finally:
                for conn in self._connections:
                    await conn.aclose()
                await self._listener.aclose()
                self.stopped.set()

    def stop(self) -> None:
        """Ask the actor to drain and stop; `run()` returns once it has."""
        self._stop.set()

    @asynccontextmanager
    async def serving(self) -> AsyncIterator["Actor"]:
        """Run the actor for the duration of an `async with` block (tests, embedding)."""
        task = asyncio.get_running_loop().create_task(self.run(), name=f"{self.name}.run")
        started = asyncio.ensure_future(self.started.wait())
        await asyncio.wait([task, started], return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            started.cancel()
            task.result()  # raises why the actor could not start
        try:
            yield self
        finally:
            self.stop()
            await task

    async def on_start(self) -> None:
        """Hook: runs once after binding, before any loop runs and before `started` is set
        (a worker sends Ready only after it): load models, start engines here."""

    async def on_stop(self) -> None:
        """Hook: runs once after every loop has stopped, before connections close."""

    async def on_drain(self) -> None:
        """Hook: runs once when draining starts, before in-flight requests are awaited."""

    def admit(self, env: Envelope) -> None:
        """Hook: runs synchronously in the mailbox for each request it accepts, in arrival
        order, before the request's handler starts (a concurrent one starts later, in its own
        task): where a request takes its place in an order that concurrent handlers keep
        (flexmarl.training.ordered). Must not raise."""

    def connect(self, address: str) -> Connection:
        """A connection owned by this actor, closed when it stops."""
        conn = connect(address, self.transport)
        self._connections.append(conn)
        return conn

    def _loop_names(self) -> list[str]:
        return sorted(n for n in dir(type(self))
                      if n.endswith("_loop") and inspect.iscoroutinefunction(getattr(type(self), n)))

    # ------------------------------------------------------------------ mailbox

    async def mailbox_loop(self) -> None:
        assert self._listener is not None
        while True:
            try:
                env = await self._listener.recv()
            except TransportClosed:
                return
            await self._dispatch(env)

    async def _dispatch(self, env: Envelope) -> None:
        entry = self._handlers.get(type(env.msg))
        if entry is None:
            await self._answer(env, Error("unknown_kind", f"actor {self.name} does not handle "
                                          f"{type(env.msg).__name__}"))
            return
        if self.state is ActorState.DRAINING and not env.flags & FLAG_CONTROL:
            await self._answer(env, Error("draining", f"actor {self.name} is shutting down"))
            return
        name, concurrent = entry
        method = getattr(self, name)
        self.admit(env)
        if not concurrent:
            await self._serve(method, env)
            return
        await self._slots.acquire()
        assert self._tg is not None
        task = self._tg.create_task(self._serve(method, env), name=f"{self.name}.{name}")
        self._inflight.add(task)
        task.add_done_callback(self._inflight.discard)
        task.add_done_callback(lambda _: self._slots.release())

    async def _serve(self, method: Callable, env: Envelope) -> None:
        try:
            result = await method(env.msg, env)
        except asyncio.CancelledError:
            raise
        except ValueError as exc:
            # A request the handler refused (the caller can fix it): one line, no traceback.
            log.warning("actor %s: %s refused %s: %s", self.name, method.__name__,
                        type(env.msg).__name__, exc)
            await self._answer(env, Error("handler", f"{type(exc).__name__}: {exc}"))
            return
        except Exception as exc:
            log.exception("actor %s: handler %s failed", self.name, method.__name__)
            await self._answer(env, Error("handler", f"{type(exc).__name__}: {exc}"))
            return
        await self._answer(env, Ack() if result is None else result)

    async def _answer(self, env: Envelope, msg: Any) -> None:
        if not env.req_id:
            if isinstance(msg, Error):
                log.warning("actor %s: one-way %s: %s", self.name, type(env.msg).__name__,
                            msg.message)
            return
        assert self._listener is not None
        await self._listener.reply(env, msg)

    async def push(self, peer: Any, msg: Any, *, control: bool = False) -> bool:
        """Send an unsolicited message to a peer that has contacted this actor."""
        assert self._listener is not None
        return await self._listener.push(peer, msg, control=control)

    # ------------------------------------------------------------------ built-in handlers

    @handler(Ping)
    async def on_ping(self, msg: Ping, env: Envelope) -> Pong:
        return Pong(msg.seq, msg.payload)

    @handler(Shutdown)
    async def on_shutdown(self, msg: Shutdown, env: Envelope) -> None:
        log.info("actor %s: shutdown requested (%s)", self.name, msg.reason or "no reason given")
        self.stop()

    @property
    def protocol_errors(self) -> int:
        return self._listener.stats.protocol_errors if self._listener else 0
