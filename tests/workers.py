"""Worker entry points for the supervisor tests, started in real child processes."""
from __future__ import annotations

import asyncio
import subprocess
import sys
import time

from runtime.actor import Actor, handler
from runtime.codec import Envelope
from runtime.protocol import Ack, Tensors
from runtime.worker import WorkerContext


class Echo(Actor):
    """Echoes Tensors back; answers Ping through the base class."""

    @handler(Tensors)
    async def on_tensors(self, msg: Tensors, env: Envelope) -> Tensors:
        return msg


def echo(ctx: WorkerContext) -> Actor:
    return Echo(ctx.name, ctx.bind, transport=ctx.transport)


def crash(ctx: WorkerContext) -> Actor:
    raise RuntimeError("this worker fails on purpose before it is ready")


class Blocking(Actor):
    """Holds its event loop for `meta["seconds"]` per Tensors request (as a long native call or
    a model load in a handler would), then answers."""

    @handler(Tensors)
    async def on_tensors(self, msg: Tensors, env: Envelope) -> Tensors:
        time.sleep(msg.meta["seconds"])
        return msg


def blocking(ctx: WorkerContext) -> Actor:
    return Blocking(ctx.name, ctx.bind, transport=ctx.transport)


def never_ready(ctx: WorkerContext) -> Actor:
    time.sleep(3600)  # blocks the entry point: Ready never comes
    raise AssertionError("unreachable")


class WithGrandchild(Echo):
    """Starts a grandchild process, to check that shutdown leaves no orphan behind."""

    def __init__(self, ctx: WorkerContext) -> None:
        super().__init__(ctx.name, ctx.bind, transport=ctx.transport)
        self.child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
        self.meta = {"grandchild_pid": self.child.pid}

    @handler(Tensors)
    async def on_tensors(self, msg: Tensors, env: Envelope) -> Tensors:
        return Tensors(meta=self.meta)


def with_grandchild(ctx: WorkerContext) -> Actor:
    return WithGrandchild(ctx)


class Stubborn(Echo):
    """Never finishes draining, so the supervisor has to escalate to SIGKILL."""

    async def on_drain(self) -> None:
        await asyncio.sleep(3600)


def stubborn(ctx: WorkerContext) -> Actor:
    return Stubborn(ctx.name, ctx.bind, transport=ctx.transport)


def acking(ctx: WorkerContext) -> Actor:
    class Sink(Actor):
        @handler(Tensors)
        async def on_tensors(self, msg: Tensors, env: Envelope) -> Ack:
            return Ack()
    return Sink(ctx.name, ctx.bind, transport=ctx.transport)


def placement(ctx: WorkerContext) -> Actor:
    """Answers Tensors with the cores it may run on and its OpenMP thread budget."""
    import os

    class Placement(Actor):
        @handler(Tensors)
        async def on_tensors(self, msg: Tensors, env: Envelope) -> Tensors:
            return Tensors(meta={"cpus": sorted(os.sched_getaffinity(0)),
                                 "omp": os.environ.get("OMP_NUM_THREADS")})
    return Placement(ctx.name, ctx.bind, transport=ctx.transport)


class BlockedStart(Echo):
    """Stuck while starting and deaf to SIGTERM (as a native library that blocks and masks
    signals would be): only the worker's orphan watchdog can end it once its parent is gone."""

    marker = ""

    async def on_start(self) -> None:
        import pathlib
        import signal
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        pathlib.Path(self.marker).write_text("stuck")  # tells the test it got this far
        time.sleep(3600)


def blocked_start(ctx: WorkerContext) -> Actor:
    actor = BlockedStart(ctx.name, ctx.bind, transport=ctx.transport)
    actor.marker = ctx.args["marker"]
    return actor


def running_workers() -> dict[str, int]:
    """name -> pid of this process's runtime workers, found among its descendants by their
    command line (`python -m runtime.worker BOOT_JSON`, whose JSON names them). For tests and
    benchmarks that kill workers of a run they did not start themselves."""
    import json

    import psutil

    out = {}
    for child in psutil.Process().children(recursive=True):
        try:
            cmd = child.cmdline()
        except psutil.Error:
            continue
        if len(cmd) >= 4 and cmd[1:3] == ["-m", "runtime.worker"]:
            out[json.loads(cmd[3])["name"]] = child.pid
    return out
