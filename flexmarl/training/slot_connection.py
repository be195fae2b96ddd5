"""A trainer slot's connection as the pool hands it out: busy time (BusyTime), deadlines, death.

    request ─► the slot's processes (rank 0) ─► reply; its time added to the slot's busy time
            ─► RequestTimeout: the slot is taken for hung: its processes killed
               (runtime.lifecycle), the slot handled as dead (TrainerPool.slot_died) ─► PeerDied
            ─► a collective failing on a dead peer: waits for the death notice ─► PeerDied
    TrainerPool.slot_died ─► fail_pending: every request in flight, and every later one, fails
            with the slot's PeerDied at once

A replaced slot gets a new SlotConnection: whoever still holds the dead one gets its PeerDied.
"""
from __future__ import annotations

import asyncio
from typing import Any, Callable, Iterable

from flexmarl.clock import now
from runtime.errors import RemoteError, RequestTimeout
from runtime.lifecycle import Lifecycle
from runtime.transport import Connection

DEATH_NOTICE_GRACE_S = 10.0
"""A rank whose peer died fails its collective at once (gloo: "Connection reset by peer"),
often before the supervisor has reported the death: that error waits this long for the
death notice, so the slot is replaced instead of the run failing."""


class BusyTime:
    """Per slot: seconds its processes spent on requests (training, export, swaps)."""

    def __init__(self, slots: Iterable[str]) -> None:
        self.seconds: dict[str, float] = dict.fromkeys(slots, 0.0)
        self._taken: dict[str, float] = dict(self.seconds)

    def take(self) -> dict[str, float]:
        """Per slot: busy seconds since the last call."""
        out = {s: self.seconds[s] - self._taken[s] for s in self.seconds}
        self._taken = dict(self.seconds)
        return out


class SlotConnection:
    """A slot's connection that counts the time its requests take as the slot's busy time;
    a request without its own deadline gets trainer_pool.request_timeout_s."""

    def __init__(self, conn: Connection, slot: str, timeout_s: float, busy: BusyTime,
                 lifecycle: Lifecycle, died: Callable[[str, str], None]) -> None:
        """`timeout_s`: trainer_pool.request_timeout_s; `busy`: the pool's, added to;
        `lifecycle` kills the slot's processes when a request times out; `died(slot, reason)`:
        the pool's death handler."""
        self._conn, self._slot, self._timeout_s = conn, slot, timeout_s
        self._busy, self._lifecycle, self._died = busy, lifecycle, died
        self.dead: Exception | None = None
        """Set when the slot's processes died: every request fails with it at once."""

    async def request(self, msg: Any, **kwargs: Any) -> Any:
        if self.dead is not None:
            raise self.dead
        started = now()
        kwargs.setdefault("timeout_s", self._timeout_s)
        try:
            return await self._conn.request(msg, **kwargs)
        except RequestTimeout as exc:
            if self.dead is not None:
                raise self.dead from exc
            # A slot that does not answer is treated as dead, not waited on again.
            reason = f"{type(msg).__name__} timed out ({exc})"
            self._lifecycle.kill(self._slot, "its trainer slot stopped answering")
            self._died(self._slot, reason)
            raise (self.dead or exc) from exc
        except RemoteError as exc:
            deadline = now() + DEATH_NOTICE_GRACE_S
            while self.dead is None and now() < deadline and _peer_lost(exc):
                await asyncio.sleep(0.05)
            if self.dead is not None:
                raise self.dead from exc
            raise
        finally:
            self._busy.seconds[self._slot] += now() - started

    def fail_pending(self, exc: Exception) -> None:
        self.dead = exc
        self._conn.fail_pending(exc)

    async def aclose(self) -> None:
        await self._conn.aclose()


def _peer_lost(exc: RemoteError) -> bool:
    """Did a collective fail because a peer rank went away (gloo's or NCCL's words)?"""
    text = str(exc)
    return any(words in text for words in ("Connection reset by peer", "Connection closed by peer",
                                            "Broken pipe", "NCCL"))
