"""Codec: property-based round trips and rejection of malformed input (pure logic, no sockets)."""
from __future__ import annotations


import msgpack
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runtime.codec import HEADER, TORCH_DTYPES, decode, encode
from runtime.config import TransportConfig
from runtime.errors import ProtocolError
from runtime.protocol import (FLAG_CONTROL, MAGIC, REGISTRY, VERSION, Ack, Error, Heartbeat,
                              MsgKind, Ping, Pong, Ready, Shutdown, Tensors)

SMALL = TransportConfig(inline_tensor_bytes=64)


def wire(frames: list) -> list[bytes]:
    """What a peer receives: independent byte strings, no shared memory with the sender."""
    return [bytes(memoryview(f)) for f in frames]


def tensor_bytes(t: torch.Tensor) -> bytes:
    return t.clone(memory_format=torch.contiguous_format).reshape(-1).view(torch.uint8).numpy().tobytes()


# ----------------------------------------------------------------------------- strategies

ints64 = st.integers(-(2**63), 2**63 - 1)
uints64 = st.integers(0, 2**64 - 1)
text = st.text(max_size=40)
plain = st.recursive(
    st.none() | st.booleans() | ints64 | st.floats(allow_nan=False) | text | st.binary(max_size=40),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(text, inner, max_size=4),
    max_leaves=20)


@st.composite
def tensors(draw: st.DrawFn) -> torch.Tensor:
    dtype = draw(st.sampled_from(sorted(TORCH_DTYPES.values(), key=str)))
    shape = draw(st.lists(st.integers(0, 5), min_size=0, max_size=4))
    numel = int(np.prod(shape)) if shape else 1
    raw = draw(st.binary(min_size=numel * dtype.itemsize * 2, max_size=numel * dtype.itemsize * 2))
    # Twice the bytes needed, so a strided (non-contiguous) view can be taken.
    base = torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(dtype) if raw else \
        torch.empty(0, dtype=dtype)
    layout = draw(st.sampled_from(["contiguous", "strided", "transposed"]))
    if layout == "strided" and numel:
        return base[::2].reshape(shape) if not shape else base[::2][:numel].reshape(shape)
    t = base[:numel].reshape(shape)
    if layout == "transposed" and t.dim() >= 2:
        return t.transpose(0, 1)
    return t


NP_DTYPES = ["|b1", "|i1", "|u1", "<i2", ">i2", "<i4", ">i8", "<u8", "<f2", "<f4", ">f8",
             "<c8", "<c16"]


@st.composite
def arrays(draw: st.DrawFn) -> np.ndarray:
    dtype = np.dtype(draw(st.sampled_from(NP_DTYPES)))
    shape = tuple(draw(st.lists(st.integers(0, 5), max_size=3)))
    numel = int(np.prod(shape)) if shape else 1
    raw = draw(st.binary(min_size=numel * dtype.itemsize, max_size=numel * dtype.itemsize))
    a = np.frombuffer(raw, dtype=np.uint8).view(dtype).reshape(shape).copy()
    if draw(st.booleans()) and a.ndim >= 2:
        a = a.T  # non-contiguous
    return a


messages = st.one_of(
    st.builds(Ping, ints64, st.binary(max_size=100)),
    st.builds(Pong, ints64, st.binary(max_size=100)),
    st.builds(Ready, text, ints64, text),
    st.builds(Heartbeat, text, ints64, ints64),
    st.builds(Shutdown, text),
    st.builds(Error, text, text),
    st.just(Ack()),
)


# ----------------------------------------------------------------------------- round trips

@given(messages, uints64, st.sampled_from([0, FLAG_CONTROL]))
def test_message_round_trip(msg, req_id, flags):
    env = decode(wire(encode(msg, flags=flags, req_id=req_id)))
    assert env.msg == msg and env.kind == int(type(msg).KIND)
    assert env.req_id == req_id and env.flags == flags


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.text(max_size=8), tensors(), max_size=4),
       st.dictionaries(st.text(max_size=8), arrays(), max_size=3),
       st.dictionaries(text, plain, max_size=3))
def test_tensor_round_trip_bit_exact(ts, arrs, meta):
    msg = Tensors(tensors=ts, arrays=arrs, meta=meta)
    out = decode(wire(encode(msg, config=SMALL)), config=SMALL).msg
    assert out.tensors.keys() == ts.keys() and out.arrays.keys() == arrs.keys()
    for k, t in ts.items():
        got = out.tensors[k]
        assert got.dtype == t.dtype and got.shape == t.shape
        assert tensor_bytes(got) == tensor_bytes(t)  # bitwise: NaNs and -0.0 included
    for k, a in arrs.items():
        got = out.arrays[k]
        assert got.dtype == a.dtype and got.shape == a.shape
        assert got.tobytes() == a.tobytes()
    assert out.meta == meta


def test_large_tensor_travels_out_of_band_and_zero_copy():
    t = torch.randn(1024, 256)
    frames = encode(Tensors(tensors={"w": t}))
    assert len(frames) == 3 and memoryview(frames[2]).nbytes == t.numel() * 4
    # The send side hands ZeroMQ the tensor's own memory.
    assert np.shares_memory(frames[2], t.numpy())
    received = [bytearray(memoryview(f)) for f in frames]
    got = decode(received).msg.tensors["w"]
    assert torch.equal(got, t)
    assert got.data_ptr() == np.frombuffer(received[2], dtype=np.uint8).ctypes.data  # a view


def test_special_tensors():
    cases = {
        "zero_dim_bf16": torch.tensor(1.5, dtype=torch.bfloat16),
        "empty": torch.empty(0, 7),
        "bool": torch.tensor([True, False, True]),
        "noncontig": torch.arange(64.0).reshape(8, 8)[:, ::3],
        "grad": torch.ones(3, requires_grad=True),
        "conj": torch.tensor([1 + 2j, 3 - 1j]).conj(),
        "big_bf16": torch.randn(200, 200).to(torch.bfloat16),
    }
    out = decode(wire(encode(Tensors(tensors=cases)))).msg.tensors
    for k, t in cases.items():
        assert torch.equal(out[k], t.detach().resolve_conj()), k
        assert out[k].shape == t.shape and out[k].dtype == t.dtype


def test_small_frames_at_odd_offsets_decode_aligned():
    """libzmq may hand small frames at any offset of its buffer: decoded data is aligned."""
    t, a = torch.randn(100, dtype=torch.float64), np.arange(100, dtype=np.float64)
    frames = wire(encode(Tensors(tensors={"t": t}, arrays={"a": a})))
    for offset in range(1, 8):
        shifted = []
        for f in frames:
            backing = bytearray(len(f) + offset)
            backing[offset:] = f
            shifted.append(memoryview(backing)[offset:])
        out = decode(shifted).msg
        assert out.tensors["t"].data_ptr() % 8 == 0 and torch.equal(out.tensors["t"], t)
        assert out.arrays["a"].ctypes.data % 8 == 0 and np.array_equal(out.arrays["a"], a)


def test_encode_refuses_what_cannot_travel():
    with pytest.raises(TypeError, match="not a registered message"):
        encode(object())
    with pytest.raises(TypeError, match="cannot travel"):
        encode(Tensors(arrays={"o": np.array([object()])}))
    with pytest.raises(TypeError, match="cannot travel"):
        encode(Tensors(tensors={"s": torch.ones(2).to_sparse()}))
    with pytest.raises(TypeError, match="cannot encode"):
        encode(Tensors(meta={"s": {1, 2}}))


def test_registry_refuses_duplicate_kinds():
    from dataclasses import dataclass
    from runtime.protocol import message
    with pytest.raises(ValueError, match="already taken by Ping"):
        @message(MsgKind.PING)
        @dataclass
        class Again:
            x: int
    assert REGISTRY[MsgKind.PING] is Ping


# ----------------------------------------------------------------------------- rejection

def header(kind: int, req_id: int = 1, flags: int = 0) -> bytes:
    return HEADER.pack(MAGIC, VERSION, flags, kind, req_id)


def body(*values) -> bytes:
    return msgpack.packb(list(values), use_bin_type=True)


def ext(code: int, name, shape, ref) -> msgpack.ExtType:
    return msgpack.ExtType(code, msgpack.packb([name, shape, ref]))


BAD = {
    "no frames": [],
    "header only": [header(MsgKind.PING)],
    "short header": [b"FM\x01", body(1, b"")],
    "bad magic": [b"XX" + header(MsgKind.PING)[2:], body(1, b"")],
    "bad version": [HEADER.pack(MAGIC, 99, 0, MsgKind.PING, 1), body(1, b"")],
    "unknown kind": [header(4242), body()],
    "body not msgpack": [header(MsgKind.PING), b"\xc1\xc1\xc1"],
    "body truncated": [header(MsgKind.PING), body(1, b"abc")[:-2]],
    "body trailing data": [header(MsgKind.PING), body(1, b"") + b"\x00"],
    "body not array": [header(MsgKind.PING), msgpack.packb({"seq": 1})],
    "too few fields": [header(MsgKind.READY), body("w", 1)],
    "too many fields": [header(MsgKind.PING), body(1, b"", 3)],
    "wrong int type": [header(MsgKind.PING), body("1", b"")],
    "bool for int": [header(MsgKind.PING), body(True, b"")],
    "str for bytes": [header(MsgKind.PING), body(1, "x")],
    "map key not str": [header(MsgKind.TENSORS), msgpack.packb([{1: 2}, {}, {}])],
    "dict for tensor": [header(MsgKind.TENSORS), body({"t": [1, 2]}, {}, {})],
    "unknown ext": [header(MsgKind.TENSORS), body({"t": msgpack.ExtType(77, b"")}, {}, {})],
    "bad dtype": [header(MsgKind.TENSORS), body({"t": ext(1, "object", [1], b"\0" * 8)}, {}, {})],
    "numpy object dtype": [header(MsgKind.TENSORS), body({}, {"a": ext(2, "|O", [1], b"\0" * 8)}, {})],
    "negative dim": [header(MsgKind.TENSORS), body({"t": ext(1, "float32", [-1], b"")}, {}, {})],
    "size mismatch": [header(MsgKind.TENSORS), body({"t": ext(1, "float32", [3], b"\0" * 8)}, {}, {})],
    "frame ref out of range": [header(MsgKind.TENSORS), body({"t": ext(1, "uint8", [100], 5)}, {}, {})],
    "frame ref to body": [header(MsgKind.TENSORS), body({"t": ext(1, "uint8", [3], 1)}, {}, {})],
    "huge shape": [header(MsgKind.TENSORS), body({"t": ext(1, "uint8", [2**62, 2**62], 2)}, {}, {}),
                   b"\0"],
    "descriptor garbage": [header(MsgKind.TENSORS), body({"t": msgpack.ExtType(1, b"\xff\xfe")}, {}, {})],
    "deep nesting": [header(MsgKind.TENSORS), b"\x91" * 5000 + b"\xc0"],  # [[[[...]]]]
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_malformed_frames_raise_protocol_error(name):
    with pytest.raises(ProtocolError):
        decode(BAD[name])


def test_limits():
    cfg = TransportConfig(max_message_bytes=1000, max_frames=3)
    frames = wire(encode(Tensors(tensors={"t": torch.zeros(300)}), config=cfg))
    with pytest.raises(ProtocolError, match="transport.max_message_bytes"):
        decode(frames, config=cfg)
    many = [header(MsgKind.ACK), body(), b"", b""]
    with pytest.raises(ProtocolError, match="transport.max_frames"):
        decode(many, config=cfg)


def test_every_truncation_of_a_valid_message_is_rejected_or_valid():
    frames = wire(encode(Tensors(tensors={"a": torch.arange(40), "b": torch.ones(3)},
                                 meta={"k": [1, 2, "x"]}), config=SMALL))
    for i in range(len(frames)):
        for cut in range(len(frames[i])):
            broken = frames[:i] + [frames[i][:cut]] + frames[i + 1:]
            with pytest.raises(ProtocolError):
                decode(broken, config=SMALL)


@settings(max_examples=500)
@given(st.lists(st.binary(max_size=64), max_size=5))
def test_random_frames_only_ever_raise_protocol_error(frames):
    with pytest.raises(ProtocolError):
        decode(frames)


@settings(max_examples=500)
@given(st.data())
def test_mutated_messages_decode_or_raise_protocol_error(data):
    msg = data.draw(messages)
    frames = [bytearray(f) for f in wire(encode(msg, req_id=7))]
    i = data.draw(st.integers(0, len(frames) - 1))
    if frames[i]:
        pos = data.draw(st.integers(0, len(frames[i]) - 1))
        frames[i][pos] = data.draw(st.integers(0, 255))
    try:
        env = decode(frames)
    except ProtocolError:
        return
    assert type(env.msg) in REGISTRY.values()
