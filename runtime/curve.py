"""CURVE on tcp:// sockets: keys, the plaintext-on-loopback-only rule, and this process's ZAP
handler that checks client keys against each listener's allow-list (runtime.transport's socket
factory calls secure_tcp for every tcp:// socket).
"""
from __future__ import annotations

import ipaddress
import itertools
import logging
import threading
from dataclasses import dataclass, field
from typing import Any

import zmq
import zmq.asyncio
from zmq.utils import z85
from zmq.utils.monitor import parse_monitor_message

from runtime.config import TransportConfig
from runtime.keys import load_keys

log = logging.getLogger("runtime.transport")  # refusals are transport events to the operator
_MAX_LOGGED_PEERS = 4096


def is_loopback(host: str) -> bool:
    """True for localhost, 127.0.0.0/8 and ::1 (brackets allowed); names are never resolved."""
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name, an interface name, `*`
        return False


def secure_tcp(sock: zmq.Socket, config: TransportConfig, endpoint: str, *,
                server: bool) -> None:
    """CURVE on a tcp:// socket if the config has keys; plain tcp:// on loopback only."""
    if not config.curve_secret_key_file:
        host = endpoint.partition("://")[2].rpartition(";")[2].rpartition(":")[0]  # [src;]host:port
        if not (config.plaintext_tcp_beyond_loopback or is_loopback(host)):
            raise ValueError(
                f"refusing unencrypted {endpoint}: it is not a loopback address. Set "
                "transport.curve_secret_key_file (make a key pair with `flexmarl keygen`) to "
                "encrypt and authenticate it, or transport.plaintext_tcp_beyond_loopback = true "
                "on a network you trust entirely")
        return
    public, secret = load_keys(config.curve_secret_key_file)
    sock.setsockopt(zmq.CURVE_PUBLICKEY, public.encode())
    sock.setsockopt(zmq.CURVE_SECRETKEY, secret.encode())
    if server:
        sock.setsockopt(zmq.CURVE_SERVER, 1)
        Gatekeeper.instance().guard(sock, config.curve_allowed or (public,), endpoint)
    else:
        sock.setsockopt(zmq.CURVE_SERVERKEY, (config.curve_server_key or public).encode())


_HANDSHAKE_FAILURES = {zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH: "it does not use CURVE",
                       zmq.PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC: "it expects another server key"}


@dataclass
class _Guarded:
    """One CURVE listener, as the gatekeeper knows it."""

    allowed: frozenset[str]
    endpoint: str
    logged: set[tuple[str, str]] = field(default_factory=set)


class Gatekeeper:
    """This process's ZAP handler (RFC 27) for CURVE listeners, in a daemon thread.

    Each CURVE listener gets a ZAP domain of its own, naming its allow-list. A client whose public
    key is not on it is refused at the handshake, before any message of its reaches the listener,
    and logged at WARNING once per listener, address and key. Handshakes that fail before ZAP is
    asked (a client without CURVE, or expecting another server key) are seen on a socket monitor
    and logged once per listener and cause (libzmq does not say from which address).
    """

    _instance: "Gatekeeper | None" = None
    _instance_lock = threading.Lock()
    _MONITORED = (zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
                  | zmq.EVENT_MONITOR_STOPPED)

    @classmethod
    def instance(cls) -> "Gatekeeper":
        with cls._instance_lock:
            ctx = zmq.asyncio.Context.instance()  # the transport's process-wide context
            if cls._instance is None or cls._instance._ctx is not ctx:  # none yet, or ctx renewed
                cls._instance = cls(ctx)
            return cls._instance

    def __init__(self, ctx: zmq.Context) -> None:
        self._ctx = ctx
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._guarded: dict[str, _Guarded] = {}  # by ZAP domain
        self._new_monitors: list[tuple[zmq.Socket, str]] = []  # picked up by the thread
        self.refused = 0
        """Handshakes refused so far (a retrying client counts each time)."""
        self._zap = ctx.socket(zmq.REP, socket_class=zmq.Socket)
        self._zap.bind("inproc://zeromq.zap.01")
        threading.Thread(target=self._serve, name="zap-handler", daemon=True).start()

    def guard(self, sock: zmq.Socket, allowed: tuple[str, ...], endpoint: str) -> None:
        """Make listener `sock` accept only the client keys `allowed`; call before it binds."""
        n = next(self._ids)
        domain = f"flexmarl-{n}"
        sock.setsockopt(zmq.ZAP_ENFORCE_DOMAIN, 1)  # if no ZAP handler answered: refuse, not admit
        sock.setsockopt_string(zmq.ZAP_DOMAIN, domain)
        sock.monitor(f"inproc://flexmarl-monitor-{n}", self._MONITORED)
        monitor = self._ctx.socket(zmq.PAIR, socket_class=zmq.Socket)
        monitor.connect(f"inproc://flexmarl-monitor-{n}")
        with self._lock:
            self._guarded[domain] = _Guarded(frozenset(allowed), endpoint)
            self._new_monitors.append((monitor, domain))

    def bound(self, sock: zmq.Socket) -> None:
        """Name a guarded listener by its real endpoint (port 0 resolved), for the log."""
        guarded = self._guarded.get(sock.getsockopt_string(zmq.ZAP_DOMAIN))
        if guarded is not None:
            guarded.endpoint = sock.getsockopt_string(zmq.LAST_ENDPOINT)

    def _serve(self) -> None:
        poller = zmq.Poller()
        poller.register(self._zap, zmq.POLLIN)
        domains: dict[zmq.Socket, str] = {}  # monitor socket -> its listener's domain
        try:
            while True:
                with self._lock:
                    new, self._new_monitors = self._new_monitors, []
                for monitor, domain in new:
                    poller.register(monitor, zmq.POLLIN)
                    domains[monitor] = domain
                for sock, _ in poller.poll(200):  # ms; also how soon a new monitor is read
                    if sock is self._zap:
                        request = self._zap.recv_multipart()
                        try:
                            reply = self._answer(request)
                        except Exception:  # never leave a handshake waiting: refuse it
                            log.exception("ZAP handler failed on a request; refusing it")
                            reply = [b"1.0", request[1], b"500", b"internal error", b"", b""]
                        self._zap.send_multipart(reply)
                        continue
                    event = parse_monitor_message(sock.recv_multipart())
                    guarded = self._guarded.get(domains[sock])
                    if event["event"] == zmq.EVENT_MONITOR_STOPPED:  # its listener closed
                        poller.unregister(sock)
                        sock.close(linger=0)
                        with self._lock:
                            self._guarded.pop(domains.pop(sock), None)
                    elif guarded is not None:
                        self.refused += 1
                        why = _HANDSHAKE_FAILURES.get(event["value"], f"error {event['value']:#x}")
                        self._log_once(guarded, ("", why), "%s: refused a client whose CURVE "
                                       "handshake failed: %s (further such failures are "
                                       "counted, not logged)", guarded.endpoint, why)
        except zmq.ContextTerminated:
            pass
        finally:
            for sock, _ in poller.sockets:
                sock.close(linger=0)

    def _answer(self, frames: list[bytes]) -> list[bytes]:
        if len(frames) < 6:
            return [b"1.0", frames[1] if len(frames) > 1 else b"", b"400", b"bad ZAP request",
                    b"", b""]
        _version, request_id, domain, address, _identity, mechanism, *credentials = frames
        guarded = self._guarded.get(domain.decode(errors="replace"))
        if guarded is None:  # not a CURVE listener of this runtime: what libzmq does alone
            ok, user = mechanism == b"NULL", b""
        elif mechanism == b"CURVE" and len(credentials) == 1 and len(credentials[0]) == 32:
            key = z85.encode(credentials[0]).decode()
            ok, user = key in guarded.allowed, key.encode()
            if not ok:
                self.refused += 1
                peer = address.decode(errors="replace")
                self._log_once(guarded, (peer, key), "%s: refused a CURVE client at %s: its "
                               "public key %s is not allowed (transport.curve_allowed; its "
                               "further attempts are counted, not logged)", guarded.endpoint,
                               peer, key)
        else:
            ok, user = False, b""
        return [b"1.0", request_id, b"200" if ok else b"400", b"OK" if ok else b"not allowed",
                user if ok else b"", b""]

    @staticmethod
    def _log_once(guarded: _Guarded, what: tuple[str, str], fmt: str, *args: Any) -> None:
        # A refused client retries every reconnect interval: one line each would flood the log.
        if what not in guarded.logged and len(guarded.logged) < _MAX_LOGGED_PEERS:
            guarded.logged.add(what)
            log.warning(fmt, *args)
