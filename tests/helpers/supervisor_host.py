"""A process that hosts a Supervisor with two workers and prints their pids (for kill tests)."""
from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile

import uvloop

from runtime.config import SupervisorConfig
from runtime.supervisor import Supervisor, WorkerSpec


async def main() -> None:
    """Prints the workers' pids once started; with argument `blocked`, one more worker whose
    start is stuck and deaf to SIGTERM (tests.helpers.workers.BlockedStart)."""
    sup = Supervisor(config=SupervisorConfig(stop_timeout_s=1.0))
    async with sup.serving():
        handles = [await sup.start_worker(WorkerSpec(name=f"w{i}",
                                                     entry="tests.helpers.workers:echo"))
                   for i in range(2)]
        pids = [h.pid for h in handles]
        if sys.argv[1:] == ["blocked"]:
            marker = os.path.join(tempfile.mkdtemp(), "stuck")
            asyncio.ensure_future(sup.start_worker(WorkerSpec(
                name="blocked", entry="tests.helpers.workers:blocked_start",
                args={"marker": marker}, ready_timeout_s=3600)))
            while not os.path.exists(marker):  # it is stuck in its start, SIGTERM ignored
                await asyncio.sleep(0.05)
            pids.append(sup.workers["blocked"].pid)
        print(json.dumps(pids), flush=True)
        await asyncio.sleep(3600)


if __name__ == "__main__":
    sys.exit(uvloop.run(main()))
