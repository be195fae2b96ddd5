"""The same actor pair over local://, inproc://, ipc:// and tcp://: real ZeroMQ, one process."""
from __future__ import annotations

import asyncio

import pytest
import torch
import zmq

from runtime.actor import Actor, ActorState, handler
from runtime.codec import Envelope
from runtime.config import TransportConfig
from runtime.errors import RemoteError, RequestTimeout, TransportClosed
from runtime.protocol import Ack, Heartbeat, Ping, Pong, Shutdown, Tensors
from runtime.transport import bind, connect

ADDRESSES = ["local://pair", "inproc://pair", "ipc://*", "tcp://127.0.0.1:0"]


class Pair(Actor):
    """Echoes tensors, counts one-way heartbeats, can be told to be slow or to fail."""

    def __init__(self, address: str, **kw) -> None:
        super().__init__("pair", address, **kw)
        self.heartbeats: list[int] = []
        self.order: list[str] = []
        self.gate = asyncio.Event()
        self.gate.set()

    @handler(Tensors)
    async def on_tensors(self, msg: Tensors, env: Envelope) -> Tensors:
        if msg.meta.get("fail"):
            raise ValueError("asked to fail")
        if msg.meta.get("wait"):
            await self.gate.wait()
        self.order.append(msg.meta.get("tag", ""))
        return Tensors(tensors={k: v * 2 for k, v in msg.tensors.items()}, meta=msg.meta)

    @handler(Heartbeat)
    async def on_heartbeat(self, msg: Heartbeat, env: Envelope) -> None:
        self.heartbeats.append(msg.seq)
        if msg.seq == -1:  # ask the listener to push something back to this peer
            await self.push(env.peer, Pong(99, b"pushed"))


@pytest.fixture(params=ADDRESSES, ids=lambda a: a.split(":")[0])
async def pair(request):
    actor = Pair(request.param)
    async with actor.serving():
        async with connect(actor.address) as conn:
            yield actor, conn
    assert actor.state is ActorState.STOPPED


async def test_request_reply_and_tensors(pair):
    actor, conn = pair
    assert await conn.request(Ping(7, b"abc")) == Pong(7, b"abc")
    x = torch.randn(512, 512)  # 1 MiB: out of band on ZeroMQ
    reply = await conn.request(Tensors(tensors={"x": x}, meta={"tag": "big"}))
    assert torch.equal(reply.tensors["x"], x * 2) and reply.meta == {"tag": "big"}


async def test_concurrent_requests_get_their_own_replies(pair):
    actor, conn = pair
    replies = await asyncio.gather(*(conn.request(Ping(i, str(i).encode())) for i in range(200)))
    assert [r.seq for r in replies] == list(range(200))
    assert all(r.payload == str(r.seq).encode() for r in replies)


async def test_one_way_send_and_push(pair):
    actor, conn = pair
    for i in range(5):
        await conn.send(Heartbeat("c", 1, i), control=i % 2 == 1)
    await conn.send(Heartbeat("c", 1, -1))
    pushed = await asyncio.wait_for(conn.recv(), 5)
    assert pushed.msg == Pong(99, b"pushed")
    assert sorted(actor.heartbeats[:5]) == [0, 1, 2, 3, 4]


async def test_handler_error_becomes_error_reply_and_actor_goes_on(pair):
    actor, conn = pair
    with pytest.raises(RemoteError, match="asked to fail") as info:
        await conn.request(Tensors(meta={"fail": True}))
    assert info.value.code == "handler"
    with pytest.raises(RemoteError) as info:
        await conn.request(Pong(1))  # a kind this actor does not handle
    assert info.value.code == "unknown_kind"
    assert await conn.request(Ping(1)) == Pong(1)


async def test_failed_send_leaves_no_pending_request(pair):
    actor, conn = pair
    # local:// hands objects over without encoding, so only a non-message fails there.
    bad = object() if actor.address.startswith("local") else Tensors(meta={"bad": {1, 2}})
    with pytest.raises(TypeError, match="cannot encode|not a registered message"):
        await conn.request(bad)
    assert not conn._req.pending
    assert await conn.request(Ping(2)) == Pong(2)


async def test_timeout_names_the_setting(pair):
    actor, conn = pair
    actor.gate.clear()
    with pytest.raises(RequestTimeout, match="transport.request_timeout_s"):
        await conn.request(Tensors(meta={"wait": True}), timeout_s=0.2)
    actor.gate.set()


async def test_control_lane_overtakes_bulk_backlog():
    """A control request is served ahead of queued bulk requests (at most one bulk first)."""
    for address in ADDRESSES:
        actor = Pair(address)
        async with actor.serving():
            async with connect(actor.address) as conn:
                actor.gate.clear()  # the first bulk request blocks the actor ...
                bulk = [asyncio.ensure_future(conn.request(
                    Tensors(tensors={"x": torch.ones(100_000)}, meta={"wait": True, "tag": f"b{i}"})))
                    for i in range(20)]
                await asyncio.sleep(0.3)  # ... while the rest queue up behind it
                ctl = asyncio.ensure_future(conn.request(
                    Tensors(meta={"tag": "ctl"}), control=True))
                await asyncio.sleep(0.1)
                actor.gate.set()
                await asyncio.gather(ctl, *bulk)
                assert actor.order.index("ctl") <= 2, (address, actor.order)


class SlowConcurrent(Actor):
    """Serves each Tensors request in its own task and holds it until the gate opens."""

    def __init__(self, address: str) -> None:
        super().__init__("slow", address, drain_timeout_s=10)
        self.gate = asyncio.Event()

    @handler(Tensors, concurrent=True)
    async def on_tensors(self, msg: Tensors, env: Envelope) -> Tensors:
        await self.gate.wait()
        return Tensors(meta={"done": True})


async def test_draining_finishes_inflight_refuses_new_bulk_answers_control():
    actor = SlowConcurrent("inproc://drain")
    run = asyncio.ensure_future(actor.run())
    await actor.started.wait()
    async with connect(actor.address) as conn:
        inflight = asyncio.ensure_future(conn.request(Tensors()))
        await asyncio.sleep(0.1)
        actor.stop()
        await asyncio.sleep(0.1)
        assert actor.state is ActorState.DRAINING
        with pytest.raises(RemoteError) as info:
            await conn.request(Tensors())
        assert info.value.code == "draining"
        assert await conn.request(Ping(3), control=True) == Pong(3)
        actor.gate.set()
        assert (await inflight).meta == {"done": True}  # in-flight work completes
    await asyncio.wait_for(run, 5)
    assert actor.state is ActorState.STOPPED


async def test_shutdown_message_stops_actor():
    actor = Pair("ipc://*")
    task = asyncio.ensure_future(actor.run())
    await actor.started.wait()
    async with connect(actor.address) as conn:
        assert isinstance(await conn.request(Shutdown("test"), control=True), Ack)
    await asyncio.wait_for(task, 5)
    assert actor.state is ActorState.STOPPED


async def test_tcp_port_zero_reads_back_real_port_and_rebind_fails_clearly():
    async with bind("tcp://127.0.0.1:0") as listener:
        host, port = listener.address.rsplit(":", 1)
        assert host == "tcp://127.0.0.1" and int(port) > 0
        with pytest.raises(zmq.ZMQError, match="in use"):
            bind(listener.address)


async def test_local_bind_twice_and_connect_to_nothing():
    async with bind("local://x"):
        with pytest.raises(ValueError, match="already bound"):
            bind("local://x")
    async with connect("local://nobody") as conn:
        with pytest.raises(TransportClosed, match="nothing is bound"):
            await conn.request(Ping(1))


def test_bad_addresses_are_explained():
    for bad in ["127.0.0.1:5555", "udp://x:1", "tcp://", "local:/x"]:
        with pytest.raises(ValueError, match="must look like"):
            bind(bad)


async def test_closed_connection_fails_pending_and_new_requests():
    actor = Pair("inproc://closing")
    async with actor.serving():
        conn = connect(actor.address)
        actor.gate.clear()
        pending = asyncio.ensure_future(conn.request(Tensors(meta={"wait": True})))
        await asyncio.sleep(0.1)
        await conn.aclose()
        with pytest.raises(TransportClosed):
            await pending
        with pytest.raises(TransportClosed):
            await conn.request(Ping(1))
        actor.gate.set()


async def test_config_validation_names_the_field():
    with pytest.raises(ValueError, match="transport.request_timeout_s"):
        TransportConfig(request_timeout_s=0)
    from runtime.config import SupervisorConfig
    with pytest.raises(ValueError, match="supervisor.heartbeat_timeout_s"):
        SupervisorConfig(heartbeat_interval_s=2, heartbeat_timeout_s=1)


async def test_request_to_nobody_times_out():
    """Nobody listens: the request fails at its deadline, whether libzmq queued the message
    for a connection that never comes or refused to take it (the deadline covers a blocked
    send too: it used to start only after the send)."""
    import socket as _socket

    with _socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    conn = connect(f"tcp://127.0.0.1:{port}")
    try:
        started = asyncio.get_running_loop().time()
        with pytest.raises(RequestTimeout, match="within 0.3 s"):
            await conn.request(Ping(1, b"x"), timeout_s=0.3)
        assert asyncio.get_running_loop().time() - started < 2.0
    finally:
        await conn.aclose()
