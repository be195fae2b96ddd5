"""The one clock source of the scheduling code: `now()`.

Real runs measure with time.perf_counter(). Under the simulator's virtual-time event loop
(flexmarl.sim.clock.VirtualEventLoop, which sets `virtual_time = True`) `now()` is that loop's
time, so every duration the orchestrator, pipeline, balancer and trainer pool record is
simulated time, and `asyncio.sleep` / timeouts jump instead of waiting.
"""
from __future__ import annotations

import asyncio
import time


def now() -> float:
    """Seconds on the running loop's clock: virtual under the simulator, else perf_counter()."""
    loop = asyncio._get_running_loop()
    if loop is not None and getattr(loop, "virtual_time", False):
        return loop.time()
    return time.perf_counter()
