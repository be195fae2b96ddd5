"""Who was busy when: intervals per (who, kind), for the dashboard's timeline and utilisation.

    enter(who, kind) ... exit(who, kind)   nested or overlapping uses count once: an interval
                                           opens when the first use starts, closes at the last
    busy_s(who, kind)                      total busy seconds so far (the open interval too)
    recent(since)                          [who, kind, start, end | None] of the last intervals

Kinds in use: "rollout" (an agent had a request in flight), "gate" (a call of the agent waited
at its step gate for the agent's previous update), "instance" (a rollout instance had one of
this orchestrator's requests), "train" (the agent's trainer was working on a request of its
batch), "sync" (weights exported and pushed to the instances). Times come from
flexmarl.clock.now(), so the simulator's timelines are simulated time. Bounded: the oldest
intervals are dropped first.
"""
from __future__ import annotations

from collections import Counter, deque
from typing import Hashable

from flexmarl.clock import now

MERGE_GAP_S = 0.005
"""Back-to-back uses closer than this extend the last interval (a batch's micro-batches)."""


class ActivityLog:
    def __init__(self, maxlen: int = 5000) -> None:
        self.intervals: deque[list] = deque(maxlen=maxlen)
        self._open: dict[tuple, list] = {}
        self._last: dict[tuple, list] = {}
        self._depth: Counter[tuple] = Counter()
        self._busy: Counter[tuple] = Counter()

    def enter(self, who: Hashable, kind: str) -> None:
        key = (who, kind)
        self._depth[key] += 1
        if self._depth[key] > 1:
            return
        t = now()
        last = self._last.get(key)
        if last is not None and t - last[3] <= MERGE_GAP_S:
            self._busy[key] -= last[3] - last[2]  # reopened: counted again when it closes
            last[3] = None
            self._open[key] = last
            return
        interval = [who, kind, t, None]
        self.intervals.append(interval)
        self._open[key] = interval

    def exit(self, who: Hashable, kind: str) -> None:
        key = (who, kind)
        if self._depth[key] <= 0:
            raise RuntimeError(f"activity {kind} of {who!r} exited more often than entered")
        self._depth[key] -= 1
        if self._depth[key]:
            return
        interval = self._open.pop(key)
        interval[3] = now()
        self._busy[key] += interval[3] - interval[2]
        self._last[key] = interval

    def busy_s(self, who: Hashable, kind: str) -> float:
        key = (who, kind)
        ongoing = self._open.get(key)
        return self._busy[key] + (now() - ongoing[2] if ongoing is not None else 0.0)

    def recent(self, since: float) -> list[list]:
        """Intervals that end after `since` (or have not ended), oldest first."""
        return [list(iv) for iv in self.intervals if iv[3] is None or iv[3] >= since]
