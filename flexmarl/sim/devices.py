"""Simulated devices: what engines and trainer slots run on (flexmarl.sim.engines).

    DeviceGroup   active device-seconds (utilisation), and for colocated and time-shared
                  layouts one resident mode at a time (rollout: engines awake; training: an
                  agent's state loaded), each change paid in host transfers both ways (the
                  outgoing mode's bytes out, the incoming mode's in); a time-shared group's
                  modes decided by the product's own arbiter (flexmarl.placement.timeshare)
"""
from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from flexmarl.placement.timeshare import ROLLOUT, TimeShare
from flexmarl.sim.costs import Costs


@dataclass
class DeviceGroup:
    """Devices shared by engines. `colocated`: rollout instances and trainer slots share them
    and only one mode (("rollout", key) or ("train", agent)) is resident at a time; a mode
    change waits for the current mode's users to finish and costs the outgoing mode's
    `resident_bytes` to host memory plus the incoming one's onto the devices
    (Costs.switch_s). Modes are served in the order they were first asked for; a switch
    admits every pending request of its mode; while another mode waits, new requests of the
    current one queue behind it (no starvation)."""

    name: str
    devices: int
    costs: Costs
    colocated: bool = False
    resident_bytes: Any = None
    """mode -> bytes the mode holds on the group's devices (colocated only)."""
    share: TimeShare | None = None
    """A time-shared group's arbiter: the product's own (flexmarl.placement.timeshare),
    whose switch waits the cost model's transfer time; it then decides who goes when (rollout
    first) instead of the first-asked order below (mas_rl's cluster, MARTI's driver)."""
    active_device_s: float = 0.0
    switches: int = 0
    switch_s: float = 0.0
    _mode: tuple | None = None
    _users: int = 0
    _waiting: deque = field(default_factory=deque)
    _switching: bool = False

    def busy(self, devices: float, seconds: float) -> None:
        self.active_device_s += devices * seconds

    def time_shared(self, agents: tuple[str, ...]) -> "DeviceGroup":
        """Arbitrate this group with the product's TimeShare over `agents`' modes."""
        self.colocated = True
        self.share = TimeShare(self.name, agents, switch=self._switch, mode=None)
        return self

    async def _switch(self, old: object, new: object) -> None:
        seconds = self.costs.switch_s(self.resident_bytes(_full(old)) if old else 0.0,
                                      self.resident_bytes(_full(new)), self.devices)
        self.switches += 1
        self.switch_s += seconds
        await asyncio.sleep(seconds)

    async def acquire(self, mode: tuple) -> None:
        if self.share is not None:
            await self.share.acquire(ROLLOUT if mode[0] == "rollout" else mode)
            return
        if not self.colocated:
            return
        if self._mode == mode and not self._waiting and not self._switching:
            self._users += 1
            return
        fut = asyncio.get_running_loop().create_future()
        self._waiting.append((mode, fut))
        self._next()
        await fut

    def release(self, mode: tuple) -> None:
        if self.share is not None:
            self.share.release(ROLLOUT if mode[0] == "rollout" else mode)
            return
        if not self.colocated:
            return
        self._users -= 1
        self._next()

    def _next(self) -> None:
        if self._users or self._switching or not self._waiting:
            return
        mode = self._waiting[0][0]
        if mode == self._mode:
            self._grant(mode)
            return
        self._switching = True
        seconds = self.costs.switch_s(self.resident_bytes(self._mode) if self._mode else 0.0,
                                      self.resident_bytes(mode), self.devices)
        self.switches += 1
        self.switch_s += seconds

        def switched() -> None:
            self._switching = False
            self._mode = mode
            self._grant(mode)

        asyncio.get_running_loop().call_later(seconds, switched)

    def _grant(self, mode: tuple) -> None:
        # Every waiter of this mode joins, wherever it is in the queue: one switch serves all
        # the calls of the agent that are pending (the batching a colocated system would do).
        keep = deque()
        for waiter, fut in self._waiting:
            if waiter == mode:
                self._users += 1
                fut.set_result(None)
            else:
                keep.append((waiter, fut))
        self._waiting = keep
        if not self._users:
            self._next()


def _full(mode: object) -> tuple:
    """A TimeShare mode as a DeviceGroup one: ROLLOUT is ("rollout", "")."""
    return ("rollout", "") if mode == ROLLOUT else mode  # type: ignore[return-value]
