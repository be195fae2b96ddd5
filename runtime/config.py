"""Runtime configuration: one keyword-only dataclass per component, validated on creation.

Every field is documented beside it; an invalid value raises ValueError naming the field, so a
`--set section.key=value` typo is caught at start, not an hour into a run.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

from runtime.keys import is_z85_key, load_keys


def _positive(obj: object, section: str, *names: str) -> None:
    for name in names:
        value = getattr(obj, name)
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"{section}.{name} must be a positive number, got {value!r}")


@dataclass(kw_only=True, frozen=True)
class TransportConfig:
    """Sockets, message limits and request deadlines (section `transport`)."""

    request_timeout_s: float = 30.0
    """Default deadline for a request/reply round trip when the caller gives none."""
    max_message_bytes: int = 1 << 31
    """Largest message (all frames together) a receiver accepts; larger ones are a ProtocolError."""
    max_frames: int = 4096
    """Most frames one message may carry (one per out-of-band tensor, plus two)."""
    inline_tensor_bytes: int = 512
    """Tensors up to this size travel inside the msgpack body instead of in a frame of their own."""
    sndhwm: int = 1000
    """ZeroMQ send high-water mark, in messages, per peer."""
    rcvhwm: int = 1000
    """ZeroMQ receive high-water mark, in messages, per peer."""
    linger_ms: int = 0
    """How long a closing socket keeps trying to deliver queued messages."""
    tcp_buffer_bytes: int = 0
    """Kernel send and receive buffer size for TCP sockets; 0 keeps the kernel's autotuning
    (setting a size on Linux turns autotuning off, which can only lower bulk throughput)."""
    curve_secret_key_file: str = ""
    """This endpoint's CURVE key pair: a NAME.key_secret file written by `flexmarl keygen` (or
    its directory, for node.key_secret). Set, every tcp:// socket is encrypted and authenticated
    with CURVE (ipc://, inproc:// and local:// never leave the machine and are unaffected). Only
    the path is configured: the secret never appears in a config dump or a worker's argv."""
    curve_server_key: str = ""
    """Z85 public key (40 characters) that tcp:// listeners must prove to this endpoint's
    connections; empty: this endpoint's own public key (a cluster sharing one key pair)."""
    curve_allowed: tuple[str, ...] = ()
    """Z85 public keys of the clients this endpoint's tcp:// listeners accept; any other client is
    refused at the handshake (it never reaches an actor) and logged. Empty: only this endpoint's
    own public key (a cluster sharing one key pair)."""
    plaintext_tcp_beyond_loopback: bool = False
    """Allow tcp:// without CURVE on addresses other than loopback: only on a network you trust
    entirely. Off, such a socket raises an error naming curve_secret_key_file."""

    def __post_init__(self) -> None:
        _positive(self, "transport", "request_timeout_s", "max_message_bytes", "max_frames",
                  "sndhwm", "rcvhwm")
        if self.max_frames < 2:
            raise ValueError(f"transport.max_frames must be >= 2, got {self.max_frames}")
        for name in ("linger_ms", "inline_tensor_bytes", "tcp_buffer_bytes"):
            if getattr(self, name) < 0:
                raise ValueError(f"transport.{name} must be >= 0, got {getattr(self, name)}")
        self._check_curve()

    def _check_curve(self) -> None:
        # A list (from JSON or TOML) becomes a tuple, so the config stays hashable and frozen.
        object.__setattr__(self, "curve_allowed", tuple(self.curve_allowed))
        for name, keys in (("curve_server_key", [self.curve_server_key] if self.curve_server_key
                            else []), ("curve_allowed", self.curve_allowed)):
            for key in keys:
                if not is_z85_key(key):
                    raise ValueError(f"transport.{name} must hold CURVE public keys (40 Z85 "
                                     f"characters, as in a .key file), got {key!r}")
        if not self.curve_secret_key_file:
            if self.curve_server_key or self.curve_allowed:
                raise ValueError("transport.curve_server_key and transport.curve_allowed need "
                                 "transport.curve_secret_key_file (make a pair with `flexmarl "
                                 "keygen`)")
            return
        try:
            load_keys(self.curve_secret_key_file)
        except (OSError, ValueError) as e:
            raise ValueError(f"transport.curve_secret_key_file: {e}") from None


@dataclass(kw_only=True, frozen=True)
class SupervisorConfig:
    """Worker process lifecycle (section `supervisor`)."""

    ready_timeout_s: float = 60.0
    """How long a started worker may take to send Ready (imports, model loading included)."""
    heartbeat_interval_s: float = 0.5
    """How often a worker sends a heartbeat on the control lane (from a thread of its own)."""
    heartbeat_timeout_s: float = 30.0
    """Silence after which a live worker is declared hung and killed. Only the last resort: an
    exited worker is reported at once, whatever this says. Sized for real work on a loaded
    machine (a 2-core machine running a benchmark beside the run starves processes for seconds;
    3 s killed healthy workers there); time the supervisor itself was stalled is not counted."""
    stop_timeout_s: float = 10.0
    """One deadline for all children to exit after Shutdown and SIGTERM, before SIGKILL."""
    replace_attempts: int = 3
    """Processes started, one after another, to replace one dead worker (a rollout instance, a
    trainer slot's group) before it is given up: a replacement may die while it starts, too
    (runtime.lifecycle)."""
    preload: tuple[str, ...] = ()
    """Modules a fork server imports once (runtime.zygote): each worker is then forked from it,
    ready in a fraction of a second instead of importing them itself (seconds each for torch
    and a model's code). () starts every worker as a fresh interpreter."""

    def __post_init__(self) -> None:
        _positive(self, "supervisor", *(f.name for f in fields(self) if f.name != "preload"))
        if isinstance(self.preload, str) or not all(
                isinstance(m, str) and m.replace(".", "").replace("_", "").isalnum()
                for m in self.preload):
            raise ValueError("supervisor.preload must be a list of module names, got "
                             f"{self.preload!r}")
        if not isinstance(self.replace_attempts, int):
            raise ValueError("supervisor.replace_attempts must be a whole number, got "
                             f"{self.replace_attempts!r}")
        if self.heartbeat_timeout_s <= self.heartbeat_interval_s:
            raise ValueError(
                "supervisor.heartbeat_timeout_s must exceed supervisor.heartbeat_interval_s "
                f"({self.heartbeat_timeout_s} <= {self.heartbeat_interval_s})")
