"""A virtual-time asyncio event loop: when nothing is runnable, time jumps to the next timer.

    _run_once: ready callbacks ─► none left? ─► selector.select(timeout until the next timer)
               the virtual selector polls real I/O without blocking; with none, it advances the
               clock by `timeout` and returns ─► the timer is due ─► its callback runs

Everything that waits on the loop's timers (asyncio.sleep, wait_for, call_later, request
timeouts) runs on simulated seconds, so a simulated hour takes as long as its callbacks take to
execute, and the same program gives the same schedule every time: the ready queue is FIFO and
timers fire in (time, insertion) order. flexmarl.clock.now() reads this clock.

Only in-process work belongs under it (local:// transport, simulated engines). A callback from
another thread (to_thread, call_soon_threadsafe) still works through the real self-pipe, but
time does not wait for it; if nothing at all is scheduled the loop waits STALL_S of real time for
such a wake-up and then raises SimulationStalled: every task is blocked on something that will
never happen (a deadlock in the simulated system), which a real loop would hang on forever.
"""
from __future__ import annotations

import asyncio
import selectors
from typing import Any, Awaitable, TypeVar

T = TypeVar("T")
STALL_S = 5.0


class SimulationStalled(RuntimeError):
    """No task can make progress and no timer is pending."""


class _VirtualSelector(selectors.BaseSelector):
    def __init__(self, loop: "VirtualEventLoop") -> None:
        self._real = selectors.DefaultSelector()
        self._loop = loop

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._real.register(fileobj, events, data)

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self._real.unregister(fileobj)

    def modify(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._real.modify(fileobj, events, data)

    def get_map(self) -> Any:
        return self._real.get_map()

    def close(self) -> None:
        self._real.close()

    def select(self, timeout: float | None = None) -> list:
        events = self._real.select(0)
        if events or timeout == 0:
            return events
        if timeout is None:  # nothing runnable, no timer: only another thread could help
            events = self._real.select(self._loop.stall_s)
            if not events:
                raise SimulationStalled(
                    f"simulated time {self._loop.time():.3f} s: every task is waiting and no "
                    "timer is pending (a deadlock in the simulated system)")
            return events
        self._loop.advance(timeout)
        return []


class VirtualEventLoop(asyncio.SelectorEventLoop):
    """asyncio's selector loop with a simulated clock that starts at 0."""

    virtual_time = True

    def __init__(self, stall_s: float = STALL_S) -> None:
        self._now = 0.0
        self.stall_s = stall_s
        """Real seconds to wait for another thread when nothing is scheduled, then stall."""
        super().__init__(selector=_VirtualSelector(self))

    def time(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        if seconds > 0:
            self._now += seconds


def run(main: Awaitable[T], *, stall_s: float = STALL_S) -> T:
    """asyncio.run(main) on a fresh virtual-time loop."""
    with asyncio.Runner(loop_factory=lambda: VirtualEventLoop(stall_s)) as runner:
        return runner.run(main)
