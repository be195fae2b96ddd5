"""A process that hosts a Supervisor with two workers and prints their pids (for kill tests)."""
from __future__ import annotations

import asyncio
import json
import sys

import uvloop

from runtime.supervisor import Supervisor, WorkerSpec


async def main() -> None:
    sup = Supervisor()
    async with sup.serving():
        handles = [await sup.start_worker(WorkerSpec(name=f"w{i}", entry="tests.workers:echo"))
                   for i in range(2)]
        print(json.dumps([h.pid for h in handles]), flush=True)
        await asyncio.sleep(3600)


if __name__ == "__main__":
    sys.exit(uvloop.run(main()))
