"""Worker lifecycle: whose each process is, its death, its replacement (up to N attempts).

One Lifecycle per pool of workers (the rollout instances, the trainer slots): the pool keeps its
own logic (routing, swaps, what a death costs its requests) and hands the rest here, as vLLM v1
keeps its process manager apart from its request client.

    events (Supervisor / NodeRegistry: WorkerDied) ─► watch: the lifecycle that knows the process
              ─► its pool's handler (name, reason)
    the pool, on a death ─► died(owner): counted, the owner's processes forgotten (their deaths,
              now or when killed, are this one)
              ─► replace(owner, serves, old, ready): respawn (new processes, on the dead ones'
              GPUs) ─► ready (the pool's part: load the served weights, route to them) ─►
              recorded in `replacements`; up to supervisor.replace_attempts tries, then
              ReplaceFailed naming that setting
    a worker that stops answering ─► kill(owner) ─► its death arrives as any other

An owner is a rollout instance (a process of its own: its replacement is a new instance, with a
new name) or a trainer slot (a group of processes that outlives them: `groups`). Nothing here
knows of reinforcement learning: owners, agents and connections are opaque.
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Awaitable, Callable, Iterable

from runtime.config import SupervisorConfig

log = logging.getLogger(__name__)

Respawn = Callable[[str, list[str]], Awaitable[tuple[list[str], Any]]]
"""(what the new processes serve: an agent's model, a trainer slot; the dead processes they
replace: they get their GPUs, and what is left of them is killed first) -> the new processes'
names and a connection to the first."""
Ready = Callable[[list[str], Any], Awaitable[Any]]
"""The pool's part of one attempt, given the new processes' names and connection: put them to
work; returns what start() returns (for replace(): the fields of the replacement's record, a
dict). Its failure is a failed attempt."""


class ReplaceFailed(RuntimeError):
    """Every attempt to replace a dead worker failed; the message names the setting to raise."""


class Lifecycle:
    """A pool's worker processes: their owners, deaths and replacements (module docstring)."""

    def __init__(self, respawn: Respawn | None = None, *,
                 kill: Callable[[str, str], None] | None = None,
                 owners: dict[str, str] | None = None, groups: bool = False,
                 attempts: int = SupervisorConfig.replace_attempts, devices: Any = None,
                 kind: str = "worker") -> None:
        """`respawn` starts replacements (None: a death is final); `kill(process, reason)` ends
        one that stopped answering; `owners`: each live process -> its owner (itself, or its
        slot with `groups`); `attempts`: supervisor.replace_attempts; `devices`: the run's GPU
        placement (flexmarl.placement.devices.DevicePlacement) the workers are seated on, if any;
        `kind` names an owner in messages ("rollout instance", "trainer slot")."""
        self.respawn = respawn
        self._kill = kill
        self.owners: dict[str, str] = dict(owners or {})
        """Live process -> its owner; updated in place (a pool may hold it)."""
        self.groups = groups
        self.attempts = attempts
        self.devices = devices
        self.kind = kind
        self.deaths = 0
        self.dead: dict[str, str] = {}
        """Owners that died -> the reason (of the last death); updated in place."""
        self.replacements: list[dict] = []
        """Per replacement: the pool's fields and `seconds` from the death to the new
        processes serving; appended in place."""
        self.failed_replacements = 0
        self._died_at: dict[str, float] = {}

    @property
    def recoverable(self) -> bool:
        """Is a dead worker replaced (a respawn callback given)?"""
        return self.respawn is not None

    def owner(self, process: str) -> str | None:
        """The owner of a live process, None for one this lifecycle does not know (any more)."""
        return self.owners.get(process)

    def died(self, owner: str, reason: str, *, forget: bool = True) -> list[str]:
        """Count a death of `owner`; `forget`: its processes are no longer its (returned: what
        a replacement replaces)."""
        self.deaths += 1
        self.dead[owner] = reason
        self._died_at[owner] = time.monotonic()
        if not forget:
            return []
        old = [p for p, o in self.owners.items() if o == owner]
        for process in old:
            del self.owners[process]
        return old

    def kill(self, owner: str, reason: str) -> bool:
        """End the live processes of an owner that stopped answering (their deaths arrive as
        any other); False when there is no kill callback (the caller handles it as dead)."""
        if self._kill is None:
            return False
        for process in [p for p, o in self.owners.items() if o == owner]:
            log.warning("%s %s did not answer in time (%s); killing %s", self.kind, owner,
                        reason, process)
            self._kill(process, reason)
        return True

    async def start(self, owner: str, serves: str, old: Iterable[str], ready: Ready) -> Any:
        """One attempt: new processes serving `serves` (on the GPUs of `old`), handed to
        `ready`, then known here as `owner`'s (with `groups`; else each is its own); what ready
        returns."""
        names, conn = await self.respawn(serves, list(old))
        fields = await ready(names, conn)
        self.owners.update({name: owner if self.groups else name for name in names})
        return fields

    async def replace(self, owner: str, serves: str, old: list[str], ready: Ready) -> dict:
        """Replace the dead `owner` (after died()): up to `attempts` starts; the replacement's
        record. ReplaceFailed once every attempt failed."""
        error: BaseException | None = None
        for attempt in range(1, self.attempts + 1):
            try:
                fields = await self.start(owner, serves, old, ready)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                error = exc
                self.failed_replacements += 1
                log.error("%s %s: replacement %d of %d failed: %s: %s", self.kind, owner,
                          attempt, self.attempts, type(exc).__name__, exc)
                continue
            record = {**fields, "seconds": time.monotonic() - self._died_at[owner]}
            self.replacements.append(record)
            log.warning("%s %s replaced after %.1f s: %s", self.kind, owner, record["seconds"],
                        fields)
            return record
        raise ReplaceFailed(
            f"{self.kind} {owner} died and no replacement started ({self.attempts} attempts; "
            f"raise supervisor.replace_attempts to try more; last error: {error})")


async def watch(events: asyncio.Queue, routes: list[tuple[Lifecycle, Callable[[str, str], Any]]]
                ) -> None:
    """Route each worker death (a WorkerDied from `events`) to the handler of the lifecycle
    whose live process it was (a pool's death handler: name, reason); a death none knows is a
    process already replaced (its owner's death was handled)."""
    while True:
        event = await events.get()
        for lifecycle, died in routes:
            if lifecycle.owner(event.name) is not None:
                died(event.name, f"{event.reason} (returncode {event.returncode})")
                break
        else:
            log.info("worker %s ended (%s): already replaced", event.name, event.reason)
