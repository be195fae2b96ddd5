"""Every message kind on the wire and its typed dataclass, in one place.

A message on the wire is a list of frames:

    frame 0   header   magic b"FM", protocol version, flags (lane, reply), kind, request id
    frame 1   body     msgpack array of the dataclass fields, in declaration order
    frame 2.. data     raw bytes of each out-of-band tensor or array (zero-copy), referenced
                       from the body by index; small ones travel inline in the body instead

Kinds 1-99 belong to the runtime (this module). Packages built on the runtime register their
own kinds from 100 up with the same `message` decorator in a protocol module of their own, so
the runtime stays free of RL concepts while every kind still has exactly one owner.
Nothing here is ever pickled: the decoder builds only the dataclasses registered below.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, Callable, ClassVar, TypeVar

import numpy as np
import torch

MAGIC = b"FM"
VERSION = 1

# Header flags.
FLAG_CONTROL = 0x01  # travels on the control lane, served ahead of bulk data
FLAG_REPLY = 0x02    # answers the request with the same request id

REGISTRY: dict[int, type] = {}
"""Wire kind -> message dataclass. Filled by `message`; the decoder only builds these."""

T = TypeVar("T")


def message(kind: int) -> Callable[[type[T]], type[T]]:
    """Register a dataclass as the body of message `kind` (an IntEnum member)."""

    def register(cls: type[T]) -> type[T]:
        if not hasattr(cls, "__dataclass_fields__"):
            raise TypeError(f"{cls.__name__} must be a dataclass to be a message")
        if int(kind) in REGISTRY:
            raise ValueError(f"message kind {int(kind)} is already taken by "
                             f"{REGISTRY[int(kind)].__name__}")
        cls.KIND = kind
        REGISTRY[int(kind)] = cls
        return cls

    return register


class MsgKind(IntEnum):
    """Runtime message kinds. Values are wire constants: never renumber, only append."""

    ERROR = 1
    ACK = 2
    PING = 3
    PONG = 4
    READY = 5
    HEARTBEAT = 6
    SHUTDOWN = 7
    TENSORS = 8
    NODE_HELLO = 9
    START_WORKER = 10
    WORKER_STARTED = 11
    KILL_WORKER = 12
    WORKER_EXITED = 13


@message(MsgKind.ERROR)
@dataclass(slots=True)
class Error:
    """Error reply: the request was received but could not be served."""

    KIND: ClassVar[int]
    code: str
    """Short machine-readable cause, e.g. `protocol`, `handler`, `unknown_kind`, `draining`."""
    message: str


@message(MsgKind.ACK)
@dataclass(slots=True)
class Ack:
    """Empty success reply."""

    KIND: ClassVar[int]


@message(MsgKind.PING)
@dataclass(slots=True)
class Ping:
    """Liveness probe and the small request of the transport benchmark."""

    KIND: ClassVar[int]
    seq: int
    payload: bytes = b""


@message(MsgKind.PONG)
@dataclass(slots=True)
class Pong:
    """Answer to Ping, echoing its sequence number and payload."""

    KIND: ClassVar[int]
    seq: int
    payload: bytes = b""


@message(MsgKind.READY)
@dataclass(slots=True)
class Ready:
    """A worker announces itself to its supervisor once it serves `address`."""

    KIND: ClassVar[int]
    name: str
    pid: int
    address: str


@message(MsgKind.HEARTBEAT)
@dataclass(slots=True)
class Heartbeat:
    """Periodic sign of life from a worker, on the control lane."""

    KIND: ClassVar[int]
    name: str
    pid: int
    seq: int


@message(MsgKind.SHUTDOWN)
@dataclass(slots=True)
class Shutdown:
    """Ask an actor to drain and stop."""

    KIND: ClassVar[int]
    reason: str = ""


@message(MsgKind.TENSORS)
@dataclass(slots=True)
class Tensors:
    """Named tensors and arrays with a little metadata: bulk data for tests, demo and bench."""

    KIND: ClassVar[int]
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)


# ----------------------------------------------------------------------------- nodes
# A node (runtime.node) hosts workers for a registry (runtime.registry) on another machine.

@message(MsgKind.NODE_HELLO)
@dataclass(slots=True)
class NodeHello:
    """A node joins: who it is, what it offers, and the address it serves StartWorker at."""

    KIND: ClassVar[int]
    name: str
    host: str
    roles: list[str]
    address: str
    pid: int
    cpus: int = 0
    memory_bytes: int = 0
    devices: int = 0


@message(MsgKind.START_WORKER)
@dataclass(slots=True)
class StartWorker:
    """Start a worker on the node: WorkerSpec fields (name, entry, args, env, ready_timeout_s).
    The node checks the entry against its allow-list and binds the worker on its own address."""

    KIND: ClassVar[int]
    name: str
    entry: str
    args: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    ready_timeout_s: float = 0.0


@message(MsgKind.WORKER_STARTED)
@dataclass(slots=True)
class WorkerStarted:
    KIND: ClassVar[int]
    name: str
    pid: int
    address: str


@message(MsgKind.KILL_WORKER)
@dataclass(slots=True)
class KillWorker:
    KIND: ClassVar[int]
    name: str
    reason: str = "killed"


@message(MsgKind.WORKER_EXITED)
@dataclass(slots=True)
class WorkerExited:
    """A node's worker died (its supervisor's WorkerDied, forwarded to the registry)."""

    KIND: ClassVar[int]
    name: str
    pid: int
    reason: str
    returncode: int | None
    silent_for_s: float
    stderr_tail: list[str] = field(default_factory=list)
    """Its last stderr lines (a crash's traceback)."""
