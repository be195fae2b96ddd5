"""Which agent gets which trainer slot next: pure policies over names (no I/O, no clock).

SlotAllocator: TrainerPool (flexmarl.training.pool) asks it on every bind and release; the
simulator (flexmarl.sim) drives the same class. Its choices weigh expected costs in seconds:
the swaps a grant needs (measured) against the wait for a better slot (estimated), which the
pool hands in as an `Estimates` at every `grant`. SlotTimes: what the pool measured (swaps,
how long agents hold slots), the source of those estimates. TeamOrder: the order agents ask in,
learnt (the allocator's evictions and the pool's prefetches follow it).
"""
from __future__ import annotations

import itertools
from collections import OrderedDict
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Grant:
    agent: str
    slot: str
    evict: str | None
    """The idle agent whose state must be swapped out of the slot first, if any."""


@dataclass(frozen=True)
class Estimates:
    """What the pool expects, in seconds, handed to SlotAllocator.grant. Unknown entries
    count as free (0 s) or never (no wait), so with none the policy is structural only:
    the agent's own state first, then empty slots (smallest first), then evictions."""

    bytes: dict[str, int] = field(default_factory=dict)
    """agent -> bytes of its training state."""
    rate: dict[str, float] = field(default_factory=dict)
    """Swap kind -> bytes/s measured: "out" (parked in the slot's host memory), "in" (loaded
    back in the slot it is parked in, or restored), "pull" (moved from the slot it is parked in
    to another, and loaded)."""
    frees_at: dict[str, float] = field(default_factory=dict)
    """Bound slot -> when it is expected to be released (from its agent's past holds)."""

    def seconds(self, num_bytes: float, kind: str) -> float:
        """Expected seconds of one swap of that many bytes (0 when the kind's rate is unknown).
        A pull is at least an in-place load (it ends with one)."""
        rate = self.rate.get(kind) or (self.rate.get("in") if kind == "pull" else None)
        return num_bytes / rate if rate else 0.0


class SlotAllocator:
    """Pure policy over slot and agent names: who gets which slot next. No I/O, no clock
    (times come in as arguments).

    Invariants: a slot is bound to at most one agent at a time; an agent holds at most one slot.
    Waiting agents choose in the order they asked (first come, first served), each the option
    of least expected cost (`_cost`): a free slot now (the swaps it needs: the evicted idle
    agent's state out, its own in, in place where it is parked or pulled from there; a larger
    agent evicted by a smaller one is priced its pull back), or a bound slot when it frees (the
    wait plus the same swaps then). An agent may pass over a free slot for a better one only
    while it has waited less than that free slot's cost (bounded wait: no agent starves, and
    without estimates nobody waits). A released slot keeps the agent's state resident until
    another agent needs the slot; an evicted agent's state is parked in the slot it left.
    Among equal costs: the slot already holding the agent's state, the slot it is parked in,
    an empty slot (the smallest that fits), then the idle agent expected to ask last
    (`expect`), the least recently used among equals.
    """

    def __init__(self, slots: dict[str, int], needs: dict[str, int],
                 pinned: dict[str, str] | None = None) -> None:
        """`slots`: slot -> ranks; `needs`: agent -> ranks it needs; `pinned`: agent -> the
        only slot it may use (static reservation: several agents may be pinned to one slot,
        a time-shared group's or the LoRA agents' of one base, and take turns in it)."""
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
        self.parked: dict[str, str] = {}
        """agent -> the slot whose host memory its state was parked in when it was evicted."""
        self.recheck_at: float | None = None
        """After `grant`: when an agent that passed over a free slot stops waiting for a
        better one (call `grant` again then); None if none did."""
        self._queue: OrderedDict[str, tuple[int, float]] = OrderedDict()
        """agent -> (its place in line, when it asked)."""
        self._order = itertools.count()
        self._expected: dict[str, int] = {}
        """agent -> its place in the predicted order of next requests (0 = soonest)."""

    def expect(self, order: list[str]) -> None:
        """The order in which agents are expected to ask for a slot next, soonest first;
        agents not named are expected after all of them."""
        self._expected = {agent: k for k, agent in enumerate(order)}

    def expected_rank(self, agent: str) -> int:
        return self._expected.get(agent, len(self._expected))

    def request(self, agent: str, now: float = 0.0) -> None:
        """`agent` asks for a slot at time `now` (the start of its bounded wait)."""
        if agent not in self.needs:
            raise ValueError(f"unknown agent {agent!r}")
        if agent in self._queue or agent in self.bound.values():
            raise ValueError(f"agent {agent!r} already waits for or holds a slot")
        self._queue[agent] = (next(self._order), now)

    def release(self, agent: str) -> None:
        slot = next((s for s, a in self.bound.items() if a == agent), None)
        if slot is None:
            raise ValueError(f"agent {agent!r} holds no slot")
        del self.bound[slot]
        self.resident.move_to_end(slot)  # most recently used: evicted last

    def cancel(self, agent: str) -> None:
        """Withdraw a request that has not been granted (nothing happens otherwise)."""
        self._queue.pop(agent, None)

    def lost(self, slot: str) -> None:
        """The slot's processes died: the states loaded or parked there are gone."""
        self.resident[slot] = ""
        self.parked = {a: s for a, s in self.parked.items() if s != slot}

    def waiting(self) -> list[str]:
        return list(self._queue)

    def grant(self, now: float = 0.0, estimates: Estimates | None = None) -> list[Grant]:
        """Bind free slots to waiting agents, oldest request first, each to its option of least
        expected cost at time `now` (see the class docstring); the grants to carry out."""
        est = estimates or Estimates()
        grants = []
        self.recheck_at = None
        for agent, (_, asked) in list(self._queue.items()):
            slot = self._choose(agent, now, asked, est)
            if slot is None:
                continue
            del self._queue[agent]
            previous = self.resident[slot]
            self.bound[slot] = agent
            self.resident[slot] = agent
            self.parked.pop(agent, None)
            evict = previous if previous not in ("", agent) else None
            if evict is not None:
                self.parked[evict] = slot  # the pool parks it in the slot's own processes
            grants.append(Grant(agent, slot, evict))
        return grants

    def fits(self, agent: str, slot: str) -> bool:
        """May `agent` ever take `slot` (its size, and the pins: a static slot of its own or of
        its LoRA base, a time-shared group's)?"""
        return self._fits(agent, slot)

    def _fits(self, agent: str, slot: str) -> bool:
        if self.slots[slot] < self.needs[agent]:
            return False
        if agent in self.pinned:
            return self.pinned[agent] == slot
        # a slot pinned to other agents (one, or a time-shared group) is theirs alone
        return slot not in self.pinned.values()

    def _cost(self, agent: str, slot: str, est: Estimates) -> float:
        """Seconds of swaps for `agent` to train in `slot` once it is free: the state there
        out and back in later (pulled back from elsewhere if it is a larger agent displaced by
        a smaller one: its slot taken, it comes back to another), its own in (in place if
        it is parked there, else pulled)."""
        there = self.resident[slot]
        if there == agent:
            return 0.0
        cost = est.seconds(self._bytes(agent, est),
                           "in" if self.parked.get(agent, slot) == slot else "pull")
        if there:
            size = self._bytes(there, est)
            cost += est.seconds(size, "out") + est.seconds(
                size, "pull" if self.needs[there] > self.needs[agent] else "in")
        return cost

    def _bytes(self, agent: str, est: Estimates) -> float:
        """The agent's state bytes; unmeasured: the mean of the agents of its size measured
        (else of all), so an agent never swapped does not look free to evict."""
        if agent in est.bytes:
            return est.bytes[agent]
        known = [b for a, b in est.bytes.items() if self.needs.get(a) == self.needs[agent]] \
            or list(est.bytes.values())
        return sum(known) / len(known) if known else 0.0

    def _choose(self, agent: str, now: float, asked: float, est: Estimates) -> str | None:
        fitting = [s for s in self.resident if self._fits(agent, s)]
        free = [s for s in fitting if s not in self.bound]
        if not free:
            return None  # a release will call grant again

        def rank(s: str) -> tuple:
            there = self.resident[s]
            return (self._cost(agent, s, est),
                    there != agent, self.parked.get(agent) != s, bool(there),
                    self.slots[s] if not there else 0,
                    # the idle agent needed last leaves; `resident` is ordered by release, so
                    # min keeps the least recently used among equals
                    -self.expected_rank(there) if there else 0)

        best = min(free, key=rank)
        cost = rank(best)[0]
        deadline = asked + cost
        if now >= deadline:  # waited as long as the swap it avoids: take what is free
            return best
        # Bound slots expected to free later, not those overdue (their estimate failed).
        later = [(est.frees_at[s] - now + self._cost(agent, s, est), est.frees_at[s])
                 for s in fitting if s in self.bound and est.frees_at.get(s, now) > now]
        if not later or min(later)[0] >= cost:
            return best
        # A bound slot frees soon enough to be cheaper, wait included: wait for it, no longer
        # than the cost of the slot passed over; look again when it should have freed.
        look = min(deadline, min(later)[1])
        self.recheck_at = look if self.recheck_at is None else min(self.recheck_at, look)
        return None


class SlotTimes:
    """What the pool measured of its slots, pure (times come in as arguments): each swap's
    bytes and seconds by kind, and how long each agent held its slot; `estimates` turns them
    into the allocator's Estimates."""

    def __init__(self) -> None:
        self.bytes: dict[str, int] = {}
        self._moved: dict[str, list[float]] = {}
        """Swap kind -> [bytes, seconds] summed over the swaps of that kind."""
        self._granted: dict[str, tuple[str, float]] = {}
        """agent -> (slot, when it was granted) while bound."""
        self.holds: dict[str, float] = {}
        """agent -> how long it held its slot last time (grant to release)."""

    def swapped(self, agent: str, kind: str, num_bytes: int, seconds: float) -> None:
        """One swap of `agent`'s state ended: `kind` "out", "in" or "pull" (Estimates.rate)."""
        if kind not in ("out", "in", "pull"):
            raise ValueError(f"swap kind {kind!r}: one of out, in, pull")
        self.bytes[agent] = num_bytes
        moved = self._moved.setdefault(kind, [0.0, 0.0])
        moved[0] += num_bytes
        moved[1] += seconds

    def granted(self, agent: str, slot: str, at: float) -> None:
        self._granted[agent] = (slot, at)

    def released(self, agent: str, at: float) -> None:
        """`agent` released its slot at `at` (nothing is learnt from a grant never made)."""
        if agent in self._granted:
            self.holds[agent] = at - self._granted.pop(agent)[1]

    def estimates(self, bound: dict[str, str]) -> Estimates:
        """The estimates for `bound` (slot -> agent now): when each bound slot frees, if its
        agent held one before (granted time + its last hold)."""
        frees_at = {}
        for slot, agent in bound.items():
            granted = self._granted.get(agent)
            if granted is not None and granted[0] == slot and agent in self.holds:
                frees_at[slot] = granted[1] + self.holds[agent]
        rate = {k: b / s for k, (b, s) in self._moved.items() if b and s > 0}
        return Estimates(dict(self.bytes), rate, frees_at)


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

@dataclass
class ParkedState:
    """Where a swapped-out agent's state is: parked in `slot`'s processes (Parked.ranks)."""

    slot: str
    ranks: list[str]
    version: int
    num_bytes: int
