"""Which agent gets which trainer slot next: pure policies over names (no I/O, no clock).

SlotAllocator: TrainerPool (flexmarl.training.pool) asks it on every bind and release; the
simulator (flexmarl.sim) drives the same class. TeamOrder: the order agents ask in, learnt (the
allocator's evictions and the pool's prefetches follow it).
"""
from __future__ import annotations

import itertools
from collections import OrderedDict
from dataclasses import dataclass


@dataclass(frozen=True)
class Grant:
    agent: str
    slot: str
    evict: str | None
    """The idle agent whose state must be swapped out of the slot first, if any."""


class SlotAllocator:
    """Pure policy over slot and agent names: who gets which slot next. No I/O, no clock.

    Invariants: a slot is bound to at most one agent at a time; an agent holds at most one slot;
    waiting agents are served first come, first served among those a free slot fits (so none
    starves while slots are released). A released slot keeps the agent's state resident until
    another agent needs the slot. The idle agent evicted is the one expected to ask last
    (`expect`: the order the pool predicts), the least recently used among equals.
    """

    def __init__(self, slots: dict[str, int], needs: dict[str, int],
                 pinned: dict[str, str] | None = None) -> None:
        """`slots`: slot -> ranks; `needs`: agent -> ranks it needs; `pinned`: agent -> the
        only slot it may use (static reservation)."""
        for agent, need in needs.items():
            if not any(ranks >= need for ranks in slots.values()):
                raise ValueError(f"agent {agent!r} needs a slot of {need} ranks; the largest "
                                 f"has {max(slots.values(), default=0)}")
        self.slots = dict(slots)
        self.needs = dict(needs)
        self.pinned = dict(pinned or {})
        self.bound: dict[str, str] = {}
        """slot -> agent currently using it."""
        self.resident: OrderedDict[str, str] = OrderedDict((s, "") for s in slots)
        """slot -> agent whose state is in it ("" = empty), least recently released first."""
        self._queue: OrderedDict[str, int] = OrderedDict()
        self._order = itertools.count()
        self._expected: dict[str, int] = {}
        """agent -> its place in the predicted order of next requests (0 = soonest)."""

    def expect(self, order: list[str]) -> None:
        """The order in which agents are expected to ask for a slot next, soonest first;
        agents not named are expected after all of them."""
        self._expected = {agent: k for k, agent in enumerate(order)}

    def expected_rank(self, agent: str) -> int:
        return self._expected.get(agent, len(self._expected))

    def request(self, agent: str) -> None:
        if agent not in self.needs:
            raise ValueError(f"unknown agent {agent!r}")
        if agent in self._queue or agent in self.bound.values():
            raise ValueError(f"agent {agent!r} already waits for or holds a slot")
        self._queue[agent] = next(self._order)

    def release(self, agent: str) -> None:
        slot = next((s for s, a in self.bound.items() if a == agent), None)
        if slot is None:
            raise ValueError(f"agent {agent!r} holds no slot")
        del self.bound[slot]
        self.resident.move_to_end(slot)  # most recently used: evicted last

    def cancel(self, agent: str) -> None:
        """Withdraw a request that has not been granted (nothing happens otherwise)."""
        self._queue.pop(agent, None)

    def waiting(self) -> list[str]:
        return list(self._queue)

    def grant(self) -> list[Grant]:
        """Bind free slots to waiting agents, oldest request first; the grants to carry out."""
        grants = []
        for agent in list(self._queue):
            slot = self._choose(agent)
            if slot is None:
                continue
            del self._queue[agent]
            previous = self.resident[slot]
            self.bound[slot] = agent
            self.resident[slot] = agent
            grants.append(Grant(agent, slot, previous if previous not in ("", agent) else None))
        return grants

    def _choose(self, agent: str) -> str | None:
        free = [s for s in self.resident if s not in self.bound
                and self.slots[s] >= self.needs[agent]
                and self.pinned.get(agent, s) == s
                # a slot pinned to another agent is that agent's alone
                and all(p != s for a, p in self.pinned.items() if a != agent)]
        if not free:
            return None
        for slot in free:  # its state is already there: no swap at all
            if self.resident[slot] == agent:
                return slot
        empty = [s for s in free if not self.resident[s]]
        if empty:
            return min(empty, key=lambda s: self.slots[s])  # the smallest slot that fits
        # The idle agent needed last leaves (max keeps the first of equals: the least recently
        # used, as `resident` is ordered by release).
        return max(free, key=lambda s: self.expected_rank(self.resident[s]))


class TeamOrder:
    """The order the team's agents ask for a slot in, learnt: one cycle is each agent once, and
    the workflow repeats, so the last complete cycle predicts the next. Pure, as SlotAllocator
    (which takes `expected()` for its evictions)."""

    def __init__(self) -> None:
        self.cycle: list[str] = []
        """Agents whose updates asked for a slot in the current cycle, in order."""
        self.learnt: list[str] = []
        """The last complete cycle's order: the prediction of the next."""

    def asked(self, agent: str) -> None:
        """An agent's update asks for a slot (a second time: a new cycle begins)."""
        if agent in self.cycle:  # a new cycle begins: the one before is the prediction
            self.learnt = self.cycle
            self.cycle = []
        self.cycle.append(agent)

    def expected(self) -> list[str]:
        """Agents in the order they are expected to ask for a slot next (soonest first): the
        last cycle's order from after the agent that asked last, those that already asked
        in this cycle at the end."""
        order = self.learnt + [a for a in self.cycle if a not in self.learnt]
        if self.cycle and self.cycle[-1] in order:
            k = order.index(self.cycle[-1]) + 1
            order = order[k:] + order[:k]
        return [a for a in order if a not in self.cycle] + \
            [a for a in order if a in self.cycle]
