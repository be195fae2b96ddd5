"""Fuzz a live receiver over real ZeroMQ: >= 10,000 malformed messages, then it still serves."""
from __future__ import annotations

import asyncio
import random

import msgpack
import pytest
import torch
import zmq
import zmq.asyncio

from runtime.codec import HEADER, decode, decode_header, encode
from runtime.config import TransportConfig
from runtime.errors import ProtocolError
from runtime.protocol import FLAG_REPLY, MAGIC, VERSION, Error, MsgKind, Ping, Pong, Tensors
from runtime.transport import connect
from tests.helpers.workers import Echo

N_MALFORMED = 10_000
LIMIT = TransportConfig(max_message_bytes=256 * 1024, max_frames=16)


def malformed(rng: random.Random, valid: list[list[bytes]]) -> list[bytes]:
    """One malformed message of a randomly chosen category."""
    kind = rng.randrange(9)
    hdr = HEADER.pack(MAGIC, VERSION, 0, MsgKind.PING, rng.randrange(1, 2**32))
    if kind == 0:  # random bytes, 1-3 frames
        return [rng.randbytes(rng.randrange(0, 64)) for _ in range(rng.randrange(1, 4))]
    if kind == 1:  # a valid message truncated somewhere
        frames = [bytes(f) for f in rng.choice(valid)]
        i = rng.randrange(len(frames))
        if not frames[i]:
            return frames[:i]
        return frames[:i] + [frames[i][:rng.randrange(len(frames[i]))]] + frames[i + 1:]
    if kind == 2:  # unknown kind
        return [HEADER.pack(MAGIC, VERSION, 0, rng.randrange(200, 65535), 1), b"\x90"]
    if kind == 3:  # wrong field types
        return [hdr, msgpack.packb([rng.choice(["1", 1.5, None, [1], {"a": 1}]), b""])]
    if kind == 4:  # over the size limit, in several frames
        return [hdr, msgpack.packb([1, b""])] + [b"\0" * (100 * 1024)] * 3
    if kind == 5:  # too many frames
        return [hdr, msgpack.packb([1, b""])] + [b""] * 20
    if kind == 6:  # bad tensor descriptors
        desc = msgpack.packb([rng.choice(["float32", "nope", 5]),
                              rng.choice([[3], [-1], "x", [2**40]]), rng.choice([2, 99, b"ab"])])
        return [HEADER.pack(MAGIC, VERSION, 0, MsgKind.TENSORS, 1),
                msgpack.packb([{"t": msgpack.ExtType(1, desc)}, {}, {}]), b"\0" * 13]  # 13: no size fits
    if kind == 7:  # a byte flipped in a valid message, made sure to be invalid
        while True:
            frames = [bytearray(f) for f in rng.choice(valid)]
            i = rng.randrange(len(frames))
            if frames[i]:
                frames[i][rng.randrange(len(frames[i]))] ^= 1 << rng.randrange(8)
            try:
                decode(frames, config=LIMIT)
            except ProtocolError:
                return [bytes(f) for f in frames]
    return [hdr[:rng.randrange(len(hdr))], b"\x91\x01"]  # truncated header


@pytest.mark.slow
async def test_live_receiver_survives_10k_malformed_messages(no_leftover_children, caplog):
    actor = Echo("fuzzed", "tcp://127.0.0.1:0", transport=LIMIT)
    valid = [[bytes(memoryview(f)) for f in encode(m, req_id=5)] for m in
             (Ping(1, b"x"), Tensors(tensors={"a": torch.arange(1000)}, meta={"k": [1, "v"]}))]
    rng = random.Random(1234)
    corpus = [malformed(rng, valid) for _ in range(N_MALFORMED)]
    expected_errors = 0
    for frames in corpus:  # which of them carry a request header the receiver can answer
        try:
            flags, _, req_id = decode_header(frames[0])
            expected_errors += bool(req_id and not flags & FLAG_REPLY)
        except (ProtocolError, IndexError):
            pass

    async with actor.serving():
        sock = zmq.asyncio.Context.instance().socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(actor.address)
        replies: list = []

        async def read_replies() -> None:
            while True:
                replies.append(decode(await sock.recv_multipart()).msg)

        reader = asyncio.ensure_future(read_replies())
        try:
            for frames in corpus:
                await sock.send_multipart(frames)
            # The receiver serves one peer's messages in order: this reply means all were seen.
            await sock.send_multipart([bytes(f) for f in encode(Ping(42, b"after"), req_id=9)])
            async with asyncio.timeout(120):
                while not replies or replies[-1] != Pong(42, b"after"):
                    await asyncio.sleep(0.05)
        finally:
            reader.cancel()
            sock.close()

        assert actor.protocol_errors == N_MALFORMED
        errors = [r for r in replies if isinstance(r, Error)]
        assert len(errors) == expected_errors and all(e.code == "protocol" for e in errors)
        # Logged once for this peer, not 10,000 times.
        assert sum("malformed message" in r.getMessage() for r in caplog.records) == 1
        # And a well-behaved client on another connection is still served.
        async with connect(actor.address, LIMIT) as conn:
            assert await conn.request(Ping(1, b"ok")) == Pong(1, b"ok")
            big = torch.randn(128, 128)
            assert torch.equal((await conn.request(Tensors(tensors={"b": big}))).tensors["b"], big)
