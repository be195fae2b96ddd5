"""Location-agnostic transport: one API over local://, inproc://, ipc:// and tcp://.

    Connection (client)                              Listener (server)
      request()/send() ──► bulk DEALER ────────┐
      request(control=True) ► control DEALER ──┴──► ROUTER ──► recv() ──► actor
      replies, pushes ◄───────────────────────────── reply()/push() ◄───────┘

A Connection holds two DEALER sockets to the same endpoint, one per lane. The ROUTER
fair-queues between its peers' pipes, so a control message waits behind at most one bulk
message of each other lane instead of behind a whole backlog of bulk data; and the control lane
has its own kernel buffers on TCP. The Listener reads its socket only when its owner asks for
the next message, so ZeroMQ's high-water marks give back-pressure end to end.

`local://name` is the same API without sockets or encoding: messages are handed over as objects
through asyncio queues of one event loop (strict control priority). The simulator runs on it.
Objects passed locally are shared, not copied: treat received messages as read-only.

tcp:// is plain on loopback only, unless `transport.curve_secret_key_file` turns on CURVE
(encryption and client keys checked against an allow-list, see runtime/curve.py).
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import os
import shutil
import tempfile
import weakref
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from runtime.codec import Envelope, decode, decode_header, encode
from runtime.config import TransportConfig
from runtime.curve import Gatekeeper, secure_tcp
from runtime.errors import ProtocolError, RemoteError, RequestTimeout, TransportClosed
from runtime.protocol import FLAG_CONTROL, FLAG_REPLY, Error

log = logging.getLogger(__name__)
SCHEMES = ("local", "inproc", "ipc", "tcp")
_MAX_LOGGED_PEERS = 4096


def scheme_of(address: str) -> str:
    scheme, sep, rest = address.partition("://")
    if not sep or scheme not in SCHEMES or not rest:
        raise ValueError(f"address {address!r} must look like local://name, inproc://name, "
                         "ipc:///path (or ipc://*), or tcp://host:port (port 0 picks one)")
    return scheme


def bind(address: str, config: TransportConfig = TransportConfig()) -> "Listener":
    """Serve `address`; the listener's `.address` is the real endpoint (port 0 resolved)."""
    if scheme_of(address) == "local":
        return LocalListener(address, config)
    return ZmqListener(address, config)


def connect(address: str, config: TransportConfig = TransportConfig()) -> "Connection":
    """A client of the listener at `address`. Must be called inside a running event loop."""
    if scheme_of(address) == "local":
        return LocalConnection(address, config)
    return ZmqConnection(address, config)


@dataclass
class ListenerStats:
    received: int = 0
    protocol_errors: int = 0
    dropped: int = 0
    """Replies and pushes not delivered: the peer left or stopped reading."""
    errors_by_peer: dict[Any, int] = field(default_factory=dict)


class Mailbox:
    """Two-lane inbound queue for one consumer: control messages are served first."""

    def __init__(self) -> None:
        self._lanes: tuple[deque, deque] = (deque(), deque())
        self._waiter: asyncio.Future | None = None
        self._closed = False

    def __len__(self) -> int:
        return len(self._lanes[0]) + len(self._lanes[1])

    def put(self, item: Any, control: bool) -> None:
        if self._closed:
            raise TransportClosed("mailbox is closed")
        self._lanes[0 if control else 1].append(item)
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def get(self) -> Any:
        while True:
            for lane in self._lanes:
                if lane:
                    return lane.popleft()
            if self._closed:
                raise TransportClosed("mailbox is closed")
            if self._waiter is not None:  # two consumers would steal each other's wake-ups
                raise RuntimeError("Mailbox has a single consumer: another recv() is waiting")
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None

    def close(self) -> None:
        self._closed = True
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)


def _expire(fut: asyncio.Future, exc: Exception) -> None:
    if not fut.done():
        fut.set_exception(exc)


class _Requests:
    """Request ids and reply futures of one client, shared by its transports."""

    def __init__(self, address: str, config: TransportConfig) -> None:
        self.address = address
        self.config = config
        self._ids = itertools.count(1)
        self.pending: dict[int, asyncio.Future] = {}
        self.inbox = Mailbox()

    def new(self) -> tuple[int, asyncio.Future]:
        req_id = next(self._ids)
        fut = asyncio.get_running_loop().create_future()
        self.pending[req_id] = fut
        return req_id, fut

    def forget(self, req_id: int) -> None:
        fut = self.pending.pop(req_id, None)
        if fut is not None:
            fut.cancel()

    def deliver(self, env: Envelope) -> None:
        if env.flags & FLAG_REPLY:
            fut = self.pending.pop(env.req_id, None)
            if fut is not None and not fut.done():
                fut.set_result(env.msg)
        else:
            self.inbox.put(env, bool(env.flags & FLAG_CONTROL))

    async def wait(self, req_id: int, fut: asyncio.Future, msg: Any,
                   timeout_s: float | None, *, deadline_s: float | None = None) -> Any:
        """Wait `timeout_s` for the reply; the error names `deadline_s`, the request's whole
        deadline, when part of it was already spent sending."""
        timeout_s = self.config.request_timeout_s if timeout_s is None else timeout_s
        deadline_s = timeout_s if deadline_s is None else deadline_s
        # A timer on the future itself: cheaper than asyncio.wait_for on the hot path.
        timer = asyncio.get_running_loop().call_later(timeout_s, _expire, fut, RequestTimeout(
            f"no reply to {type(msg).__name__} from {self.address} within {deadline_s:g} s; "
            "check that the peer is alive, or raise transport.request_timeout_s"))
        try:
            reply = await fut
        finally:
            timer.cancel()
            self.pending.pop(req_id, None)
        if isinstance(reply, Error):
            raise RemoteError(reply.code, reply.message)
        return reply

    def fail_pending(self, exc: Exception) -> None:
        for fut in self.pending.values():
            if not fut.done():
                fut.set_exception(exc)
        self.pending.clear()

    def fail_all(self, exc: Exception) -> None:
        self.fail_pending(exc)
        self.inbox.close()


# ----------------------------------------------------------------------------- ZeroMQ

def _context() -> zmq.asyncio.Context:
    # One context per process, so inproc:// endpoints are reachable from every actor.
    return zmq.asyncio.Context.instance()


def make_socket(kind: int, config: TransportConfig, *, bind: str | None = None,
                connect: str | None = None, sync: bool = False) -> zmq.asyncio.Socket:
    """The one socket factory: limits, linger and buffers are set here and nowhere else.
    `sync`: a blocking socket of the same context, for a thread of its own (heartbeats)."""
    sock = _context().socket(kind, socket_class=zmq.Socket) if sync else _context().socket(kind)
    try:
        sock.setsockopt(zmq.LINGER, config.linger_ms)
        sock.setsockopt(zmq.SNDHWM, config.sndhwm)
        sock.setsockopt(zmq.RCVHWM, config.rcvhwm)
        # A single frame past the limit is refused by libzmq itself (it drops that peer) before
        # it is buffered; multi-frame messages past the limit are refused by the decoder.
        sock.setsockopt(zmq.MAXMSGSIZE, config.max_message_bytes)
        if kind == zmq.ROUTER:
            sock.setsockopt(zmq.ROUTER_MANDATORY, 1)  # a reply to a gone peer errors, not vanishes
        endpoint = bind or connect or ""
        if endpoint.startswith("tcp://"):
            if config.tcp_buffer_bytes:
                sock.setsockopt(zmq.SNDBUF, config.tcp_buffer_bytes)
                sock.setsockopt(zmq.RCVBUF, config.tcp_buffer_bytes)
            sock.setsockopt(zmq.TCP_KEEPALIVE, 1)
            if "[" in endpoint:
                sock.setsockopt(zmq.IPV6, 1)
            secure_tcp(sock, config, endpoint, server=bind is not None)
        if bind is not None:
            if bind.startswith("tcp://") and bind.endswith(":0"):
                bind = bind[:-2] + ":*"  # ephemeral port chosen by the kernel, read back below
            sock.bind(bind)
            if endpoint.startswith("tcp://") and config.curve_secret_key_file:
                Gatekeeper.instance().bound(sock)
        elif connect is not None:
            sock.connect(connect)
        return sock
    except BaseException:
        sock.close(linger=0)
        raise


class ZmqListener:
    """ROUTER-side endpoint: receive requests and one-way messages, reply, push."""

    def __init__(self, address: str, config: TransportConfig) -> None:
        self.config = config
        self._ipc_dir: str | None = None
        if address == "ipc://*":
            # libzmq's own ipc wildcard reports a relative path; a private directory gives an
            # absolute one that no other process can race for, removed again on close.
            self._ipc_dir = tempfile.mkdtemp(prefix="flexmarl-ipc-")
            address = f"ipc://{os.path.join(self._ipc_dir, 'sock')}"
        self._sock = make_socket(zmq.ROUTER, config, bind=address)
        self.address: str = self._sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self.stats = ListenerStats()
        self._closed = False

    async def recv(self) -> Envelope:
        """Next well-formed message; malformed ones are counted, logged once per peer, dropped."""
        while True:
            try:
                frames = await self._sock.recv_multipart(copy=False)
            except zmq.ZMQError as exc:
                raise TransportClosed(f"listener {self.address} closed ({exc})") from None
            peer = frames[0].bytes
            try:
                env = decode(frames[1:], config=self.config, peer=peer)
            except ProtocolError as exc:
                await self._reject(peer, frames, exc)
                continue
            self.stats.received += 1
            return env

    async def _reject(self, peer: bytes, frames: list, exc: ProtocolError) -> None:
        stats = self.stats
        stats.protocol_errors += 1
        first = peer not in stats.errors_by_peer
        if first and len(stats.errors_by_peer) >= _MAX_LOGGED_PEERS:
            first = False  # remember no more peers; still counted in the total
        else:
            stats.errors_by_peer[peer] = stats.errors_by_peer.get(peer, 0) + 1
        if first:
            log.warning("%s: dropping malformed message from peer %s: %s (further errors from "
                        "this peer are counted, not logged)", self.address, peer.hex(), exc)
        # Tell a well-meaning but mismatched peer why its request failed, when the header says
        # who is waiting; anything else gets no answer.
        try:
            flags, _, req_id = decode_header(frames[1])
        except (ProtocolError, IndexError):
            return
        if req_id and not flags & FLAG_REPLY:
            await self._send(peer, Error("protocol", str(exc)), flags & FLAG_CONTROL | FLAG_REPLY,
                             req_id)

    async def reply(self, env: Envelope, msg: Any) -> bool:
        """Answer request `env`; False if its peer is gone."""
        return await self._send(env.peer, msg, (env.flags & FLAG_CONTROL) | FLAG_REPLY, env.req_id)

    async def push(self, peer: bytes, msg: Any, *, control: bool = False) -> bool:
        """Unsolicited one-way message to a connected peer (seen in an Envelope.peer)."""
        return await self._send(peer, msg, FLAG_CONTROL if control else 0, 0)

    async def _send(self, peer: bytes, msg: Any, flags: int, req_id: int) -> bool:
        frames = encode(msg, flags=flags, req_id=req_id, config=self.config)
        try:
            # Never block the listener on one peer: a peer that stops reading (its pipe is at
            # the high-water mark) or has left loses this message instead of stalling everyone.
            await self._sock.send_multipart([peer, *frames], flags=zmq.NOBLOCK, copy=False)
            return True
        except zmq.Again:
            self.stats.dropped += 1
            log.warning("%s: peer %s is not reading (sndhwm=%d reached); dropped %s",
                        self.address, peer.hex(), self.config.sndhwm, type(msg).__name__)
            return False
        except zmq.ZMQError as exc:
            if exc.errno == zmq.EHOSTUNREACH:
                self.stats.dropped += 1
                log.debug("%s: peer %s is gone; dropped %s", self.address, peer.hex(),
                          type(msg).__name__)
                return False
            raise TransportClosed(f"listener {self.address}: {exc}") from None

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            self._sock.close(linger=0)
            if self._ipc_dir is not None:
                shutil.rmtree(self._ipc_dir, ignore_errors=True)

    async def __aenter__(self) -> "ZmqListener":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()


class ZmqConnection:
    """DEALER-side endpoint with a bulk and a control lane to one listener."""

    def __init__(self, address: str, config: TransportConfig) -> None:
        self.address = address
        self.config = config
        self._req = _Requests(address, config)
        self._socks: list[zmq.asyncio.Socket] = []
        try:
            for _ in range(2):  # [bulk, control]
                self._socks.append(make_socket(zmq.DEALER, config, connect=address))
        except BaseException:
            for s in self._socks:
                s.close(linger=0)
            raise
        self.protocol_errors = 0
        self._heard = False  # a message came from the listener (so a connection was up)
        self._readers = [asyncio.get_running_loop().create_task(
            self._read_loop(s), name=f"conn[{address}].{lane}_read_loop")
            for s, lane in zip(self._socks, ("bulk", "control"))]
        self._closed = False

    async def _read_loop(self, sock: zmq.asyncio.Socket) -> None:
        while True:
            frames = await sock.recv_multipart(copy=False)
            self._heard = True
            try:
                env = decode(frames, config=self.config)
            except ProtocolError as exc:
                self.protocol_errors += 1
                if self.protocol_errors == 1:
                    log.warning("connection to %s: dropping malformed message: %s",
                                self.address, exc)
                continue
            self._req.deliver(env)

    async def request(self, msg: Any, *, timeout_s: float | None = None,
                      control: bool = False) -> Any:
        """Send `msg` and return the reply message; an Error reply raises RemoteError."""
        self._check_open()
        req_id, fut = self._req.new()
        timeout_s = self.config.request_timeout_s if timeout_s is None else timeout_s
        started = asyncio.get_running_loop().time()
        try:
            frames = encode(msg, flags=FLAG_CONTROL if control else 0, req_id=req_id,
                            config=self.config)
            sock = self._socks[control]
            try:
                await sock.send_multipart(frames, copy=False, flags=zmq.NOBLOCK)
            except zmq.Again:
                # No peer to send to (not connected yet, gone, or refused by its CURVE check)
                # or its queue is full: the request's deadline covers this wait too.
                try:
                    await asyncio.wait_for(sock.send_multipart(frames, copy=False), timeout_s)
                except TimeoutError:
                    raise RequestTimeout(
                        f"could not send {type(msg).__name__} to {self.address} within "
                        f"{timeout_s:g} s: no connected peer (is it running? with CURVE, does "
                        "it accept this key?) or its queue stayed full") from None
        except BaseException:  # unencodable or cancelled: nothing will ever answer this id
            self._req.forget(req_id)
            raise
        remaining = max(0.0, timeout_s - (asyncio.get_running_loop().time() - started))
        return await self._req.wait(req_id, fut, msg, remaining, deadline_s=timeout_s)

    async def send(self, msg: Any, *, control: bool = False) -> None:
        """One-way message: no reply is expected."""
        self._check_open()
        frames = encode(msg, flags=FLAG_CONTROL if control else 0, config=self.config)
        await self._socks[control].send_multipart(frames, copy=False)

    async def recv(self) -> Envelope:
        """Next message the listener pushed to this connection (control first)."""
        return await self._req.inbox.get()

    def _check_open(self) -> None:
        if self._closed:
            raise TransportClosed(f"connection to {self.address} is closed")

    def fail_pending(self, exc: Exception) -> None:
        """Fail every request still waiting for a reply (its peer is known to be dead); the
        connection stays open for requests to whatever serves the address next."""
        self._req.fail_pending(exc)

    def on_disconnect(self, callback: Callable[[], None]) -> None:
        """Call `callback()` once, when the listener's end closes a connection whose handshake
        had completed (its process exited, or it closed the socket): evidence of death that
        needs no timeout. A peer that is only slow, or that we never reached, never triggers it
        (that is left to the caller's timeout)."""
        self._check_open()
        sock = self._socks[1]  # control lane: both lanes share the peer's fate
        mon = sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED)
        self._readers.append(asyncio.get_running_loop().create_task(
            self._watch_link(sock, mon, callback), name=f"conn[{self.address}].link_watch"))

    async def _watch_link(self, sock: zmq.asyncio.Socket, mon: zmq.asyncio.Socket,
                          callback: Callable[[], None]) -> None:
        established = False
        try:
            while True:
                event = parse_monitor_message(await mon.recv_multipart())["event"]
                if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                    established = True
                # The monitor is attached after connect(): on a busy machine zmq's I/O thread
                # may finish the handshake first, and its event is then never seen. A message
                # from the listener proves the link was up just the same.
                elif event == zmq.EVENT_DISCONNECTED and (established or self._heard):
                    callback()
                    return
        finally:
            if not sock.closed:
                sock.disable_monitor()
            mon.close(linger=0)

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        for task in self._readers:
            task.cancel()
        await asyncio.gather(*self._readers, return_exceptions=True)
        self._req.fail_all(TransportClosed(f"connection to {self.address} closed"))
        for s in self._socks:
            s.close(linger=0)

    async def __aenter__(self) -> "ZmqConnection":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()


# ----------------------------------------------------------------------------- local://

_LOCAL: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, LocalListener]]" = \
    weakref.WeakKeyDictionary()
_local_names = itertools.count(1)


def _kind(msg: Any) -> int:
    kind = getattr(type(msg), "KIND", None)
    if kind is None:
        raise TypeError(f"{type(msg).__name__} is not a registered message; decorate it with "
                        "runtime.protocol.message(kind)")
    return kind


def _local_table() -> dict[str, "LocalListener"]:
    return _LOCAL.setdefault(asyncio.get_running_loop(), {})


class LocalListener:
    """Same API as ZmqListener, within one event loop and without encoding."""

    def __init__(self, address: str, config: TransportConfig) -> None:
        name = address.partition("://")[2]
        if name == "*":
            name = f"anon-{next(_local_names)}"
        table = _local_table()
        if name in table:
            raise ValueError(f"local://{name} is already bound in this event loop")
        self.address = f"local://{name}"
        self.config = config
        self.stats = ListenerStats()
        self._mailbox = Mailbox()
        self._name = name
        table[name] = self

    def deliver(self, env: Envelope) -> None:
        self._mailbox.put(env, bool(env.flags & FLAG_CONTROL))

    async def recv(self) -> Envelope:
        env = await self._mailbox.get()
        self.stats.received += 1
        return env

    async def reply(self, env: Envelope, msg: Any) -> bool:
        return self._to(env.peer, Envelope(msg, _kind(msg),
                                           (env.flags & FLAG_CONTROL) | FLAG_REPLY, env.req_id))

    async def push(self, peer: "LocalConnection", msg: Any, *, control: bool = False) -> bool:
        return self._to(peer, Envelope(msg, _kind(msg), FLAG_CONTROL if control else 0, 0))

    @staticmethod
    def _to(peer: "LocalConnection", env: Envelope) -> bool:
        if peer.closed:
            return False
        peer._req.deliver(env)
        return True

    async def aclose(self) -> None:
        table = _local_table()
        if table.get(self._name) is self:
            del table[self._name]
        self._mailbox.close()

    async def __aenter__(self) -> "LocalListener":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()


class LocalConnection:
    """Same API as ZmqConnection, within one event loop and without encoding."""

    def __init__(self, address: str, config: TransportConfig) -> None:
        self.address = address
        self.config = config
        self._name = address.partition("://")[2]
        self._req = _Requests(address, config)
        self.closed = False
        asyncio.get_running_loop()  # same contract as ZmqConnection: needs a running loop

    def _listener(self) -> LocalListener:
        if self.closed:
            raise TransportClosed(f"connection to {self.address} is closed")
        listener = _local_table().get(self._name)
        if listener is None:
            raise TransportClosed(f"nothing is bound at {self.address} in this event loop")
        return listener

    async def request(self, msg: Any, *, timeout_s: float | None = None,
                      control: bool = False) -> Any:
        listener = self._listener()
        kind = _kind(msg)  # fails before a request id is registered
        req_id, fut = self._req.new()
        listener.deliver(Envelope(msg, kind, FLAG_CONTROL if control else 0, req_id, self))
        return await self._req.wait(req_id, fut, msg, timeout_s)

    async def send(self, msg: Any, *, control: bool = False) -> None:
        self._listener().deliver(Envelope(msg, _kind(msg), FLAG_CONTROL if control else 0, 0,
                                          self))

    async def recv(self) -> Envelope:
        return await self._req.inbox.get()

    def fail_pending(self, exc: Exception) -> None:
        """Fail every request still waiting for a reply (its peer is known to be dead); the
        connection stays open for requests to whatever serves the address next."""
        self._req.fail_pending(exc)

    def on_disconnect(self, callback: Callable[[], None]) -> None:
        """Nothing to watch: both ends live in this event loop and share its fate."""

    async def aclose(self) -> None:
        if not self.closed:
            self.closed = True
            self._req.fail_all(TransportClosed(f"connection to {self.address} closed"))

    async def __aenter__(self) -> "LocalConnection":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()


Listener = ZmqListener | LocalListener
Connection = ZmqConnection | LocalConnection
