"""Dead trainer slots replaced, their agents restored from their snapshots: the TrainerPool's
recovery.

    worker_died(process) ─► slot_died: its requests fail now (PeerDied); the agents whose
                 state it held (loaded or parked there) get their last save put in the pool's
                 `states` (or, before their first, start fresh); new processes replace the
                 slot's (Lifecycle.replace: up to supervisor.replace_attempts)
    the agent's loop ─► PeerDied ─► binds again: a SwapIn of the saved dir into any slot

Part of the TrainerPool, built by it: runtime.lifecycle owns the processes (whose slot each is,
the attempts, the kill of a hung one); this decides what the slot's death means for its agents.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any

from flexmarl.training.slot_connection import SlotConnection
from flexmarl.training.slots import ParkedState
from runtime.errors import PeerDied
from runtime.lifecycle import ReplaceFailed
from runtime.transport import Connection

log = logging.getLogger(__name__)


class SlotRecovery:
    """A dead slot's requests failed, its agents sent back to their snapshots, its processes
    replaced (see the module docstring)."""

    def __init__(self, pool: Any) -> None:
        """`pool`: the TrainerPool this is part of (it builds this; typed loosely: the pool
        module imports this one)."""
        self.pool = pool
        self.replacing: dict[str, asyncio.Task] = {}
        """Slots whose new processes are starting (a grant of one waits for them)."""

    def worker_died(self, name: str, reason: str) -> bool:
        """A process died; False if it is none of the slots' current processes."""
        pool = self.pool
        slot = pool.lifecycle.owner(name)
        if slot is None:
            return False
        self.slot_died(slot, f"{name} {reason}")
        return True

    def slot_died(self, slot: str, reason: str) -> None:
        """A process of `slot` died (or hung): its requests in flight fail now (PeerDied),
        naming it; with recovery on, its agent's state goes back to its snapshot and new
        processes are started for the slot."""
        pool = self.pool
        conn = pool.slots[slot]
        if conn.dead is not None:
            return  # already handled: this is another rank of the same group
        recover = pool.recoverable()
        # With a replacement coming, the slot's processes are no longer its: their deaths, now
        # or when killed, are this one.
        old = pool.lifecycle.died(slot, reason,
                                  forget=recover and slot not in self.replacing)
        log.error("trainer slot %s died: %s%s", slot, reason,
                  "; replacing it and restoring its agent from its last snapshot" if recover
                  else "")
        conn.fail_pending(PeerDied(
            f"trainer slot {slot} died: {reason}; " + (
                "its agent restarts the batch from its last snapshot" if recover else
                "its agent's update cannot complete (trainer_pool.snapshots and a replacement "
                "let a run survive this)")))
        lost = [pool.loaded.pop(slot)] if slot in pool.loaded else []
        pool.allocator.lost(slot)
        lost += [a for a, st in pool.states.items()
                 if isinstance(st, ParkedState) and st.slot == slot]
        for agent in lost:  # their shards died with the slot's processes
            pool.states.pop(agent, None)
            if not recover:
                continue
            if agent in pool.snapshots:
                pool.states[agent] = pool.snapshots[agent]
            else:  # it never finished a step: its fresh trainer is its state
                pool.started.discard(agent)
        if recover and slot not in self.replacing:
            self.replacing[slot] = asyncio.ensure_future(self._replace(slot, old))

    async def _replace(self, slot: str, old: list[str]) -> None:
        """New processes for a dead slot (Lifecycle.replace: up to supervisor.replace_attempts);
        the slot stays dead if none starts."""
        pool = self.pool
        dead = pool.slots[slot]

        async def ready(names: list[str], conn: Connection) -> dict:
            pool.slots[slot] = SlotConnection(conn, slot, pool.request_timeout_s, pool.busy,
                                              pool.lifecycle, self.slot_died)
            return {"slot": slot, "workers": names}
        try:
            await pool.lifecycle.replace(slot, slot, old, ready)
        except ReplaceFailed as exc:
            dead.dead = PeerDied(str(exc))
            return
        finally:
            del self.replacing[slot]
        try:
            await dead.aclose()
        except Exception:  # its peer is gone; closing is best effort
            pass
