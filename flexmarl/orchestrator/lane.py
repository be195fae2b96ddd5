"""One lane for the trainer requests of agents whose slots share CPU cores (pure asyncio).

Two trainer processes on the same cores gain nothing by running at once: they split the cores
(or, with a thread pool per process, oversubscribe them, where OpenMP threads spin waiting for
each other), and each request takes about twice as long. What they lose is order: at the end of
a step every agent runs its last micro-batch, its optimizer step and its export together, while
the next step's rollout waits at the gate of the one agent its workflows call first (the default
team's checker, called at the start of every trajectory). One at a time, the agent whose gate
holds calls goes first, and its update lands in about half the time.

    async with lane.turn(agent):   one trainer request (a micro-batch, a step, an export, a
        ...                        snapshot); waits while another agent's request runs

When the lane frees, the next request is the oldest of those whose agent is `urgent` (calls
waiting at its gate), else the oldest. A request never waits on a request queued behind it,
and nothing is held across requests, so the lane cannot deadlock.
"""
from __future__ import annotations

import asyncio
import contextlib
import itertools
from typing import AsyncIterator, Callable


class TrainerLane:
    def __init__(self, urgent: Callable[[str], bool]) -> None:
        self.urgent = urgent
        self._busy = False
        self._waiting: dict[int, tuple[str, asyncio.Future]] = {}
        self._order = itertools.count()
        self.waits = 0
        """Requests that had to wait for another's."""

    @contextlib.asynccontextmanager
    async def turn(self, agent: str) -> AsyncIterator[None]:
        if self._busy or self._waiting:
            ticket = next(self._order)
            future = asyncio.get_running_loop().create_future()
            self._waiting[ticket] = (agent, future)
            self.waits += 1
            try:
                await future  # set by _next: the lane is ours
            except BaseException:
                if self._waiting.pop(ticket, None) is None and future.done() \
                        and not future.cancelled():
                    self._next()  # handed the lane as we were cancelled: pass it on
                raise
        else:
            self._busy = True
        try:
            yield
        finally:
            self._next()

    def _next(self) -> None:
        """Hand the lane to the next request (most urgent, then oldest), or free it."""
        if not self._waiting:
            self._busy = False
            return
        tickets = sorted(self._waiting)
        ticket = next((t for t in tickets if self.urgent(self._waiting[t][0])), tickets[0])
        _, future = self._waiting.pop(ticket)
        self._busy = True
        future.set_result(None)
