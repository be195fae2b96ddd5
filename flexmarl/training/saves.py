"""The agents' state saves, for TrainerPool: where each agent's recovery snapshot is, and its
copies into the run's state dir (the checkpoints `--resume` takes).

    save(agent, step) ─► bound: SaveState ─► the slot's ranks stage their shards (host memory)
                     ─► unbound: AwaitSaved ─► the ranks' write into the scratch dir is in
                        place: the agent's snapshot (`snapshots`), older ones of it pruned
                     ─► durable (run.save_every): copied into `saved`, RUN_DIR/state, in the
                        background (`copies`; a kernel file copy, no byte through this heap)

The scratch dir is on /dev/shm when every trainer rank runs on this machine (a memory-speed
write that outlives a killed rank process, though not the machine), else beside RUN_DIR/state,
on a file system every node sees. No tensor of a state passes through this process.
"""
from __future__ import annotations

import asyncio
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any, AsyncContextManager, Callable

from flexmarl.clock import now
from flexmarl.protocol import AwaitSaved, SaveState, StateSaved
from flexmarl.training.state_files import StateCheckpoints
from runtime.supervisor import pid_alive

SCRATCH_PREFIX = "flexmarl-snapshots-"


class Saves:
    """The agents' snapshots (scratch) and checkpoints (`saved`), as metadata."""

    def __init__(self, bind: Callable[[str], AsyncContextManager[Any]], timeout_s: float,
                 saved: StateCheckpoints | None = None, scratch_in: str | None = None) -> None:
        """`bind(agent)`: the agent's slot connection (TrainerPool.bind); `saved`: the run's
        state dir (durable saves), none: snapshots only; `scratch_in`: the dir to make the
        scratch dir in (default: beside `saved`, or the system's temp dir)."""
        self.bind, self.timeout_s, self.saved = bind, timeout_s, saved
        parent = scratch_in or (str(saved.root.parent) if saved is not None else None)
        _remove_orphans(parent or tempfile.gettempdir())
        self.scratch = StateCheckpoints(tempfile.mkdtemp(
            prefix=f"{SCRATCH_PREFIX}{os.getpid()}-", dir=parent))
        self.snapshots: dict[str, StateSaved] = {}
        """agent -> where its state after its last finished step is (metadata only)."""
        self.copies: dict[tuple[str, int], asyncio.Future] = {}
        """(agent, step) -> its durable copy into `saved`, once started."""
        self._copying: dict[str, asyncio.Future] = {}
        self.log: list[dict] = []
        """Each save: agent, step, bytes, stage_s (the slot held), write_s (after it)."""

    async def save(self, agent: str, step: int, *, durable: bool = False, updated: bool = True
                   ) -> "asyncio.Future[StateSaved]":
        """The agent's slot writes its state of `step` into the scratch dir: staged now, bound
        (between batches); the future is done once the write is in place (the slot is free
        meanwhile), and then it is the agent's snapshot. `durable`: also copied into `saved`
        (`copies`). Not `updated`: its last save names `step` too (or an empty state)."""
        last = self.snapshots.get(agent)
        started = staged = now()
        if updated:
            tmp, path = self.scratch.begin(agent, step)
            async with self.bind(agent) as conn:
                await conn.request(SaveState(str(tmp), str(path), step), timeout_s=self.timeout_s)
            staged = now()

            async def written() -> StateSaved:
                return await conn.request(AwaitSaved(str(path)), timeout_s=self.timeout_s)
        else:
            async def written() -> StateSaved:
                where = self.scratch.link(agent, step, last and Path(last.path))
                return StateSaved(agent, step, last.version if last else 0, str(where), 0)

        async def landed() -> StateSaved:
            state = await written()
            self.snapshots[agent] = state
            self.log.append({"agent": agent, "step": step, "bytes": state.num_bytes,
                             "stage_s": staged - started, "write_s": now() - staged})
            if (previous := self._copying.pop(agent, None)) is not None:
                await previous  # it reads a scratch dir that the prune below removes
            # Unlinks, here: a thread's real time would jump the simulator's clock.
            self.scratch.keep_from(agent, step)
            if durable and self.saved is not None:
                self.copies[agent, step] = self._copying[agent] = asyncio.ensure_future(
                    asyncio.to_thread(self.saved.copy_in, agent, step, Path(state.path)))
            return state
        return asyncio.ensure_future(landed())

    async def close(self) -> None:
        """Wait for the copies under way, then remove the scratch dir."""
        await asyncio.gather(*self._copying.values(), return_exceptions=True)
        shutil.rmtree(self.scratch.root, ignore_errors=True)


def _remove_orphans(parent: str) -> None:
    """Scratch dirs of runs whose process is gone (SIGKILLed): on /dev/shm they hold memory."""
    for d in Path(parent).glob(f"{SCRATCH_PREFIX}*"):
        m = re.match(rf"{SCRATCH_PREFIX}(\d+)-", d.name)
        if m and not pid_alive(int(m[1])):
            shutil.rmtree(d, ignore_errors=True)
