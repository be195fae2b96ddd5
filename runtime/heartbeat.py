"""Liveness: heartbeats sent from a thread, silence judged without the observer's own stalls.

    worker / node process                          supervisor / registry process
      HeartbeatSender (daemon thread, own socket) ──Heartbeat──► handler ─► Silence.heard(peer)
        every interval_s, whatever the event loop                watch loop ─► Silence.tick(now)
        is doing (a model loading, a long native call)             ─► peers silent > timeout_s

A peer is declared dead on evidence at once (its process exited, its connection closed, its
node says so); silence is only the last resort for a peer that is alive but stuck (SIGSTOPped,
deadlocked, cut off). Two things make silence a false alarm on a loaded machine, and each has
its fix here:
- the sender is busy: heartbeats come from a thread of their own, not from the event loop that
  the process's real work can hold for seconds;
- the observer is busy: while its own event loop is blocked, heartbeats wait unread in its
  socket. `Silence` counts a peer's silence only over time the observer itself was running:
  a tick that comes late adds at most `2 x tick_s`, so a 10 s stall of the observer is not 10 s
  of silence of everyone it watches.
"""
from __future__ import annotations

import logging
import threading
from typing import Any, Callable, Hashable

import zmq

from runtime.codec import encode
from runtime.config import TransportConfig
from runtime.protocol import FLAG_CONTROL
from runtime.transport import make_socket

log = logging.getLogger(__name__)


class Silence:
    """How long each watched peer has been silent, as far as this process can tell (pure: the
    caller passes the time). `heard(peer)` on each sign of life; `tick(now)` from a loop that runs
    every `tick_s` returns the peers silent for more than `timeout_s`."""

    def __init__(self, timeout_s: float, tick_s: float) -> None:
        if not 0 < tick_s < timeout_s:
            raise ValueError(f"the tick ({tick_s} s) must be positive and below the timeout "
                             f"({timeout_s} s)")
        self.timeout_s = timeout_s
        self.tick_s = tick_s
        self._silent: dict[Hashable, float] = {}
        self._last_tick: float | None = None
        self.stalled_s = 0.0
        """Time this observer was stalled (ticks late by more than the allowance), in total."""

    def heard(self, peer: Hashable) -> None:
        self._silent[peer] = 0.0

    def forget(self, peer: Hashable) -> None:
        self._silent.pop(peer, None)

    def silent_for(self, peer: Hashable) -> float:
        return self._silent.get(peer, 0.0)

    def tick(self, now: float) -> list[Hashable]:
        """Advance to `now`; the peers silent past the timeout (still watched: `forget` them)."""
        elapsed = 0.0 if self._last_tick is None else max(0.0, now - self._last_tick)
        self._last_tick = now
        # Beyond two ticks the observer was not running (its loop blocked, the machine
        # overloaded): the peers' heartbeats of that time may be sitting unread in its socket.
        credit = min(elapsed, 2 * self.tick_s)
        self.stalled_s += elapsed - credit
        lost = []
        for peer in self._silent:
            self._silent[peer] += credit
            if self._silent[peer] > self.timeout_s:
                lost.append(peer)
        return lost


class HeartbeatSender:
    """Sends `make(seq)` to `address` every `interval_s` from a daemon thread, over a socket of
    its own (control lane), so a busy event loop does not silence the process. `close()` stops
    it and closes the socket (call it before the process exits normally)."""

    def __init__(self, address: str, transport: TransportConfig, make: Callable[[int], Any],
                 interval_s: float, *, name: str = "heartbeat") -> None:
        self._sock = make_socket(zmq.DEALER, transport, connect=address, sync=True)
        self._make = make
        self._interval_s = interval_s
        self._transport = transport
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        seq = 0
        try:
            while True:
                frames = encode(self._make(seq), flags=FLAG_CONTROL, config=self._transport)
                try:
                    # Never wait on a full queue or an absent peer: the next beat will try again.
                    self._sock.send_multipart(frames, copy=False, flags=zmq.NOBLOCK)
                except zmq.Again:
                    pass
                seq += 1
                if self._stop.wait(self._interval_s):
                    return
        except zmq.ZMQError as exc:  # the context is going away with the process
            log.debug("heartbeat thread stopped: %s", exc)
        finally:
            self._sock.close(linger=0)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5.0)
