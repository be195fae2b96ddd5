"""Encode messages into frames and decode frames back into typed messages.

msgpack carries the body; tensors and arrays larger than `inline_tensor_bytes` travel as their
own frames and are neither copied on send (ZeroMQ takes the buffer) nor on receive (the decoded
tensor is a view of the received frame). The decoder trusts nothing: every failure, whatever its
cause, surfaces as one `ProtocolError`, and it only ever builds dataclasses from `REGISTRY`.

Decoded tensors share memory with the received frame; decoded numpy arrays are read-only views
of it (copy before writing). Tensors are always delivered on the CPU.
"""
from __future__ import annotations

import math
import re
import struct
import types
import typing
from dataclasses import MISSING, dataclass, fields, is_dataclass
from enum import IntEnum
from functools import lru_cache
from typing import Any, Callable, Sequence, Union

import msgpack
import numpy as np
import torch

from runtime.config import TransportConfig
from runtime.errors import ProtocolError
from runtime.protocol import MAGIC, REGISTRY, VERSION

HEADER = struct.Struct("<2sBBHQ")  # magic, version, flags, kind, request id
EXT_TENSOR = 1
EXT_NDARRAY = 2
MAX_NDIM = 64
_DEFAULT = TransportConfig()

# Every torch dtype with a whole number of bytes per element travels; sub-byte, quantized and
# complex-half types have no stable byte view and are refused at encode time.
_TORCH_DTYPE_NAMES = (
    "bool", "uint8", "int8", "int16", "int32", "int64", "uint16", "uint32", "uint64",
    "float16", "bfloat16", "float32", "float64", "complex64", "complex128",
    "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu",
)
TORCH_DTYPES: dict[str, torch.dtype] = {
    n: getattr(torch, n) for n in _TORCH_DTYPE_NAMES if isinstance(getattr(torch, n, None), torch.dtype)
}
_TORCH_NAMES = {dt: n for n, dt in TORCH_DTYPES.items()}
# numpy dtype strings allowed from the wire: byte order, kind (bool/int/uint/float/complex), size.
_NP_DTYPE_RE = re.compile(r"[<>|=][biufc](1|2|4|8|16)")


@dataclass(slots=True)
class Envelope:
    """A decoded message with its header fields and the peer it came from."""

    msg: Any
    kind: int
    flags: int = 0
    req_id: int = 0
    peer: Any = None


class _Bad(Exception):
    """Internal: a value failed validation; turned into ProtocolError with the field path."""


# ----------------------------------------------------------------------------- encoding

def encode(msg: Any, *, flags: int = 0, req_id: int = 0,
           config: TransportConfig = _DEFAULT) -> list:
    """Frames for `msg`: [header, body, *data frames]. Buffers are not copied."""
    kind = getattr(type(msg), "KIND", None)
    if kind is None or REGISTRY.get(int(kind)) is not type(msg):
        raise TypeError(f"{type(msg).__name__} is not a registered message; decorate it with "
                        "runtime.protocol.message(kind)")
    frames: list = [HEADER.pack(MAGIC, VERSION, flags, int(kind), req_id), b""]
    inline = config.inline_tensor_bytes

    def default(obj: Any) -> Any:
        if isinstance(obj, torch.Tensor):
            return _encode_tensor(obj, frames, inline)
        if isinstance(obj, np.ndarray):
            return _encode_ndarray(obj, frames, inline)
        if is_dataclass(obj) and not isinstance(obj, type):
            return [getattr(obj, f) for f in _schema(type(obj))[0]]
        if isinstance(obj, np.generic):
            return obj.item()
        raise TypeError(f"cannot encode {type(obj).__name__} on the wire; use plain data, "
                        "tensors, numpy arrays or registered dataclasses")

    names = _schema(type(msg))[0]
    frames[1] = msgpack.packb([getattr(msg, n) for n in names], default=default,
                              use_bin_type=True)
    return frames


def _place(data: np.ndarray, nbytes: int, frames: list, inline: int) -> Any:
    """Inline small payloads into the body; give large ones a frame (zero-copy)."""
    if nbytes <= inline:
        return data.tobytes()
    frames.append(data)
    return len(frames) - 1


def _encode_tensor(t: torch.Tensor, frames: list, inline: int) -> msgpack.ExtType:
    name = _TORCH_NAMES.get(t.dtype)
    if name is None:
        raise TypeError(f"tensor dtype {t.dtype} cannot travel on the wire")
    if t.layout != torch.strided:
        raise TypeError(f"tensor layout {t.layout} cannot travel on the wire; densify it first")
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.resolve_conj().resolve_neg().contiguous()
    nbytes = t.numel() * t.element_size()
    flat = t.reshape(-1)
    if flat.numel() and flat.stride(0) != 1:  # a one-element view may keep its odd stride
        flat = flat.clone(memory_format=torch.contiguous_format)
    flat = flat.view(torch.uint8).numpy()
    data = _place(flat, nbytes, frames, inline)
    return msgpack.ExtType(EXT_TENSOR, msgpack.packb([name, list(t.shape), data]))


def _encode_ndarray(a: np.ndarray, frames: list, inline: int) -> msgpack.ExtType:
    name = a.dtype.str
    if not _NP_DTYPE_RE.fullmatch(name):
        raise TypeError(f"numpy dtype {a.dtype} cannot travel on the wire (only bool, int, "
                        "uint, float and complex)")
    if not a.flags.c_contiguous:
        a = np.ascontiguousarray(a)
    flat = a.reshape(-1).view(np.uint8)
    data = _place(flat, a.nbytes, frames, inline)
    return msgpack.ExtType(EXT_NDARRAY, msgpack.packb([name, list(a.shape), data]))


# ----------------------------------------------------------------------------- decoding

def decode_header(frame: Any) -> tuple[int, int, int]:
    """(flags, kind, req_id) of a header frame, or ProtocolError."""
    raw = bytes(frame)
    if len(raw) != HEADER.size:
        raise ProtocolError(f"header is {len(raw)} bytes, expected {HEADER.size}")
    magic, version, flags, kind, req_id = HEADER.unpack(raw)
    if magic != MAGIC:
        raise ProtocolError("bad magic: not a FlexMARL runtime frame")
    if version != VERSION:
        raise ProtocolError(f"peer speaks protocol version {version}, this side {VERSION}: "
                            "run the same FlexMARL version on every node")
    return flags, kind, req_id


def decode(frames: Sequence[Any], *, config: TransportConfig = _DEFAULT,
           peer: Any = None) -> Envelope:
    """Decode received frames (bytes, memoryviews or zmq Frames) into an Envelope."""
    if len(frames) < 2:
        raise ProtocolError(f"message has {len(frames)} frame(s), needs header and body")
    if len(frames) > config.max_frames:
        raise ProtocolError(f"message has {len(frames)} frames, limit is "
                            f"transport.max_frames={config.max_frames}")
    bufs = [memoryview(f) for f in frames]
    total = sum(b.nbytes for b in bufs)
    if total > config.max_message_bytes:
        raise ProtocolError(f"message of {total} bytes exceeds transport.max_message_bytes="
                            f"{config.max_message_bytes}")
    flags, kind, req_id = decode_header(bufs[0])
    cls = REGISTRY.get(kind)
    if cls is None:
        raise ProtocolError(f"unknown message kind {kind}")
    names, checks, required = _schema(cls)

    def ext_hook(code: int, data: bytes) -> Any:
        if code == EXT_TENSOR:
            return _decode_tensor(data, bufs)
        if code == EXT_NDARRAY:
            return _decode_ndarray(data, bufs)
        raise _Bad(f"unknown extension type {code}")

    try:
        # unpackb bounds every string, array and map by the body's own length.
        values = msgpack.unpackb(bufs[1], raw=False, ext_hook=ext_hook)
    except ProtocolError:
        raise
    except Exception as exc:  # msgpack raises many types; all mean "malformed"
        raise ProtocolError(f"{cls.__name__}: malformed body ({type(exc).__name__}: {exc})") from None
    if type(values) is not list or not required <= len(values) <= len(names):
        raise ProtocolError(f"{cls.__name__}: body must be an array of {required}.."
                            f"{len(names)} fields")
    try:
        args = [check(v) for check, v in zip(checks, values)]
        msg = cls(*args)
    except _Bad as exc:
        raise ProtocolError(f"{cls.__name__}: {exc}") from None
    except Exception as exc:  # a message's own __post_init__ validation
        raise ProtocolError(f"{cls.__name__}: rejected ({exc})") from None
    return Envelope(msg, kind, flags, req_id, peer)


def _payload(data: bytes) -> tuple[str, list[int], Any]:
    try:
        name, shape, ref = msgpack.unpackb(data, raw=False)
    except Exception:
        raise _Bad("malformed tensor descriptor") from None
    if type(name) is not str or type(shape) is not list or len(shape) > MAX_NDIM:
        raise _Bad("malformed tensor descriptor")
    if any(type(d) is not int or d < 0 for d in shape):
        raise _Bad(f"bad tensor shape {shape!r}")
    return name, shape, ref


def _buffer(ref: Any, bufs: list[memoryview], nbytes: int) -> Any:
    if type(ref) is bytes:
        buf = ref
    elif type(ref) is int and 2 <= ref < len(bufs):
        buf = bufs[ref]
    else:
        raise _Bad(f"tensor data reference {ref!r} is out of range")
    if len(buf) != nbytes:
        raise _Bad(f"tensor data is {len(buf)} bytes, shape and dtype need {nbytes}")
    return buf


def _decode_tensor(data: bytes, bufs: list[memoryview]) -> torch.Tensor:
    name, shape, ref = _payload(data)
    dtype = TORCH_DTYPES.get(name)
    if dtype is None:
        raise _Bad(f"unknown tensor dtype {name!r}")
    nbytes = math.prod(shape) * dtype.itemsize
    buf = _buffer(ref, bufs, nbytes)
    if nbytes == 0:
        return torch.empty(shape, dtype=dtype)
    if type(buf) is bytes or buf.readonly:
        # Inline data or an immutable input buffer: copy, so no tensor aliases memory that
        # must not change. Frames received from ZeroMQ are writable and never copied.
        buf = bytearray(buf)
    raw = torch.frombuffer(buf, dtype=torch.uint8)
    if raw.data_ptr() % dtype.itemsize:
        # Small frames can arrive at any offset inside libzmq's receive buffer; an aligned
        # copy (these are a few KiB at most) keeps every kernel's alignment assumptions safe.
        raw = raw.clone()
    return raw.view(dtype).reshape(shape)


def _decode_ndarray(data: bytes, bufs: list[memoryview]) -> np.ndarray:
    name, shape, ref = _payload(data)
    if not _NP_DTYPE_RE.fullmatch(name):
        raise _Bad(f"numpy dtype {name!r} is not allowed on the wire")
    dtype = np.dtype(name)
    nbytes = math.prod(shape) * dtype.itemsize
    buf = _buffer(ref, bufs, nbytes)
    raw = np.frombuffer(buf, dtype=np.uint8)
    if raw.ctypes.data % dtype.alignment:  # see _decode_tensor
        raw = raw.copy()
    return raw.view(dtype).reshape(shape)


# ----------------------------------------------------------------------------- schemas

@lru_cache(maxsize=None)
def _schema(cls: type) -> tuple[tuple[str, ...], tuple[Callable[[Any], Any], ...], int]:
    """Field names, a validator per field, and the number of fields without defaults."""
    hints = typing.get_type_hints(cls)
    fs = fields(cls)
    required = sum(1 for f in fs if f.default is MISSING and f.default_factory is MISSING)
    return tuple(f.name for f in fs), tuple(_field_check(f.name, hints[f.name]) for f in fs), required


def _field_check(name: str, tp: Any) -> Callable[[Any], Any]:
    check = _compile(tp)

    def field_check(v: Any) -> Any:
        try:
            return check(v)
        except _Bad as exc:
            raise _Bad(f"field {name!r}: {exc}") from None

    return field_check


def _exact(tp: type) -> Callable[[Any], Any]:
    def check(v: Any) -> Any:
        if type(v) is not tp:
            raise _Bad(f"expected {tp.__name__}, got {type(v).__name__}")
        return v
    return check


def _float(v: Any) -> float:
    if type(v) is float:
        return v
    if type(v) is int:
        return float(v)
    raise _Bad(f"expected float, got {type(v).__name__}")


def _none(v: Any) -> None:
    if v is not None:
        raise _Bad(f"expected None, got {type(v).__name__}")
    return None


def _compile(tp: Any) -> Callable[[Any], Any]:
    """A validator that returns the (converted) value or raises _Bad."""
    if tp is Any:
        return lambda v: v
    if tp in (int, str, bool, bytes):
        return _exact(tp)
    if tp is float:
        return _float
    if tp is type(None) or tp is None:
        return _none
    if tp is torch.Tensor or tp is np.ndarray:
        return _instance(tp)
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (Union, types.UnionType):
        return _union(tuple(_compile(a) for a in args))
    if origin is list:
        return _list(_compile(args[0]) if args else _compile(Any))
    if origin is tuple:
        return _tuple(args)
    if origin is dict:
        return _dict(_compile(args[0]), _compile(args[1]))
    if isinstance(tp, type) and issubclass(tp, IntEnum):
        return _enum(tp)
    if isinstance(tp, type) and is_dataclass(tp):
        return _struct(tp)
    raise TypeError(f"message field type {tp!r} is not supported by the codec")


def _instance(tp: type) -> Callable[[Any], Any]:
    def check(v: Any) -> Any:
        if not isinstance(v, tp):
            raise _Bad(f"expected {tp.__name__}, got {type(v).__name__}")
        return v
    return check


def _union(alts: tuple) -> Callable[[Any], Any]:
    def check(v: Any) -> Any:
        for alt in alts:
            try:
                return alt(v)
            except _Bad:
                pass
        raise _Bad(f"value of type {type(v).__name__} matches no alternative")
    return check


def _list(item: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def check(v: Any) -> Any:
        if type(v) is not list:
            raise _Bad(f"expected list, got {type(v).__name__}")
        return [item(x) for x in v]
    return check


def _tuple(args: tuple) -> Callable[[Any], Any]:
    if len(args) == 2 and args[1] is Ellipsis:
        inner = _list(_compile(args[0]))
        return lambda v: tuple(inner(v))
    items = tuple(_compile(a) for a in args)

    def check(v: Any) -> Any:
        if type(v) is not list or len(v) != len(items):
            raise _Bad(f"expected array of {len(items)}")
        return tuple(c(x) for c, x in zip(items, v))
    return check


def _dict(key: Callable[[Any], Any], value: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def check(v: Any) -> Any:
        if type(v) is not dict:
            raise _Bad(f"expected map, got {type(v).__name__}")
        return {key(k): value(x) for k, x in v.items()}
    return check


def _enum(tp: type[IntEnum]) -> Callable[[Any], Any]:
    def check(v: Any) -> Any:
        if type(v) is not int:
            raise _Bad(f"expected {tp.__name__}, got {type(v).__name__}")
        try:
            return tp(v)
        except ValueError:
            raise _Bad(f"{v} is not a {tp.__name__}") from None
    return check


def _struct(tp: type) -> Callable[[Any], Any]:
    def check(v: Any) -> Any:
        names, checks, required = _schema(tp)
        if type(v) is not list or not required <= len(v) <= len(names):
            raise _Bad(f"expected {tp.__name__} as an array of {len(names)} fields")
        try:
            return tp(*(c(x) for c, x in zip(checks, v)))
        except _Bad:
            raise
        except Exception as exc:
            raise _Bad(f"{tp.__name__} rejected ({exc})") from None
    return check
