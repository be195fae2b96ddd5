"""Turns: arrival order kept for requests that are served concurrently.

The trainer worker (flexmarl.training.worker) serves its long commands (a step, a swap) as
concurrent handlers, so a FetchShards or a SlotStatus is answered while one runs; but its
command thread must get the commands in the order they arrived, because rank 0 replays each
to the followers in that order. A Turns line keeps it:

    take()        synchronous, at dispatch (before any await): the request's place in line
    await wait()  returns once every turn taken before it has been released
    release()     leaves the line: hands it to the next turn if this one held it; a turn
                  released while still waiting (refused, failed, cancelled) just drops out,
                  so it never holds up the turns behind it

Order therefore depends only on when take() was called, never on how the event loop
schedules the tasks that wait. Every turn must be released (try/finally); wait() releases
its turn itself when it is cancelled.
"""
from __future__ import annotations

import asyncio
from collections import deque


class Turn:
    """One request's place in a Turns line."""

    def __init__(self, line: "Turns", what: str) -> None:
        self.what = what
        """What the turn is for (a command's name): shown by Turns.waiting."""
        self._line = line
        self._go: asyncio.Future | None = None
        self.released = False

    async def wait(self) -> None:
        """Until every turn taken before this one has been released."""
        if self.released:
            raise RuntimeError(f"turn for {self.what} waited on after its release")
        if self._line._head() is self:
            return
        self._go = asyncio.get_running_loop().create_future()
        try:
            await self._go
        except asyncio.CancelledError:
            self.release()  # a cancelled waiter must not block the turns behind it
            raise

    def release(self) -> None:
        """Leave the line (idempotent); the next turn goes if this one was first."""
        if self.released:
            return
        self.released = True
        self._line._leave(self)


class Turns:
    """A FIFO line of turns (see the module docstring)."""

    def __init__(self) -> None:
        self._line: deque[Turn] = deque()

    def take(self, what: str = "") -> Turn:
        turn = Turn(self, what)
        self._line.append(turn)
        return turn

    def __len__(self) -> int:
        """Turns taken and not yet released (the one that holds the line included)."""
        return len(self._line)

    @property
    def waiting(self) -> list[str]:
        """What each turn in line is for, first first."""
        return [t.what for t in self._line]

    def _head(self) -> Turn | None:
        return self._line[0] if self._line else None

    def _leave(self, turn: Turn) -> None:
        first = self._line[0] is turn
        self._line.remove(turn)
        if first and self._line:
            go = self._line[0]._go
            if go is not None and not go.done():
                go.set_result(None)
