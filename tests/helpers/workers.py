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
    """Answers Tensors with the cores it may run on, its OpenMP thread budget and niceness (and
    FLEXMARL_TEST_MARK from its environment, when set; and torch's intra-op thread count, when
    torch is loaded: the runtime's codec loads it in every worker)."""
    import os
    import sys

    class Placement(Actor):
        @handler(Tensors)
        async def on_tensors(self, msg: Tensors, env: Envelope) -> Tensors:
            mark = os.environ.get("FLEXMARL_TEST_MARK")
            torch = sys.modules.get("torch")
            return Tensors(meta={"cpus": sorted(os.sched_getaffinity(0)),
                                 "omp": os.environ.get("OMP_NUM_THREADS"),
                                 "nice": os.nice(0), **({"mark": mark} if mark else {}),
                                 **({"torch_threads": torch.get_num_threads()} if torch else {})})
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


class SlowStart(Echo):
    """Its start holds the event loop (as a vLLM engine loading does) for an hour."""

    marker = ""

    async def on_start(self) -> None:
        import pathlib
        pathlib.Path(self.marker).write_text("starting")
        time.sleep(3600)


def slow_start(ctx: WorkerContext) -> Actor:
    actor = SlowStart(ctx.name, ctx.bind, transport=ctx.transport)
    actor.marker = ctx.args["marker"]
    return actor


def running_workers() -> dict[str, int]:
    """name -> pid of this process's runtime workers, found among its descendants by their
    command line (runtime.worker.worker_name: `python -m runtime.worker BOOT_JSON`, or a forked worker's title). For tests and
    benchmarks that kill workers of a run they did not start themselves."""
    import psutil

    from runtime.worker import worker_name

    out = {}
    for child in psutil.Process().children(recursive=True):
        try:
            name = worker_name(child.cmdline())
        except psutil.Error:
            continue
        if name is not None:
            out[name] = child.pid
    return out


class StoredSamples:
    """Records every sample a run's experience store accepts (ExperienceStore.put returned
    True), for tests and benchmarks that compare what two runs generated:
    `with StoredSamples() as rec: ...`; then rec.rows = [(agent, sample_id, version, tokens)]."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, str, int, tuple[int, ...]]] = []

    def __enter__(self) -> "StoredSamples":
        from flexmarl.orchestrator.store import ExperienceStore

        self._cls, self._put = ExperienceStore, ExperienceStore.put
        put, rows = self._put, self.rows

        async def recording_put(store, turn, **kwargs):
            stored = await put(store, turn, **kwargs)
            if stored:
                rows.append((turn.agent, turn.sample_id, turn.policy_version,
                             tuple(turn.response_ids)))
            return stored

        ExperienceStore.put = recording_put
        return self

    def __exit__(self, *exc) -> None:
        self._cls.put = self._put

    def keys(self) -> list[tuple[str, str, int]]:
        """(agent, sample_id, version) of each stored sample, sorted: what must match."""
        return sorted(r[:3] for r in self.rows)

    def tokens(self) -> dict[tuple[str, str], tuple[int, ...]]:
        return {(r[0], r[1]): r[3] for r in self.rows}


async def kill_a_busy_instance(base: str, prefix: str = "rollout-", after_steps: int = 1,
                               agent: str | None = None) -> str:
    """SIGKILL a rollout worker while it has requests in flight (seen on the run's dashboard
    at `base`), once `after_steps` steps are done; returns its name. So that the kill lands on
    work to re-send, not on an idle instance: a busy one is SIGSTOPped first and killed only if
    requests are still in flight to it once the replies it sent before the stop are taken in
    (the torch engine answers in milliseconds: a status read a moment earlier is no proof),
    else let go on."""
    import os
    import signal

    import aiohttp

    async def status() -> dict:
        async with http.get(base + "api/status") as r:
            return await r.json()

    async with aiohttp.ClientSession() as http:
        while True:
            st = await status()
            if st["run"]["steps_done"] >= after_steps:
                busy = sorted(name for name, i in st["instances"].items()
                              if i["inflight"] > 0 and name.startswith(prefix)
                              and (agent is None or i["agent"] == agent))
                live = running_workers()
                busy = [name for name in busy if name in live]
                if busy:
                    pid = live[busy[0]]
                    os.kill(pid, signal.SIGSTOP)
                    await asyncio.sleep(0.05)  # its replies already sent reach the run
                    if (await status())["instances"].get(busy[0], {}).get("inflight", 0) > 0:
                        os.kill(pid, signal.SIGKILL)
                        return busy[0]
                    os.kill(pid, signal.SIGCONT)
            await asyncio.sleep(0.01)


async def flexmarl_cli(*argv: str) -> int:
    """`flexmarl ARGV...` in this process, its exit status (main() runs its own event loop:
    in a thread, so the test's loop goes on)."""
    from flexmarl.launch.cli import main

    try:
        await asyncio.to_thread(main, list(argv))
    except SystemExit as done:
        return done.code
    raise AssertionError("main() returned without SystemExit")


def draws(ctx) -> Actor:
    """A worker entry (tests/test_zygote.py) that answers Tensors with four draws from each
    of torch's, numpy's and `random`'s global generators, never having seeded any of them, and
    which of torch and numpy.random it found imported (by the fork server) when it started."""
    import random
    import sys

    inherited = [m for m in ("torch", "numpy.random") if m in sys.modules]

    class Draws(Actor):
        @handler(Tensors)
        async def on_tensors(self, msg: Tensors, env: Envelope) -> Tensors:
            import numpy
            import torch
            return Tensors(meta={"inherited": inherited, "torch": torch.rand(4).tolist(),
                                 "numpy": numpy.random.random(4).tolist(),
                                 "random": [random.random() for _ in range(4)]})

    return Draws(ctx.name, ctx.bind, transport=ctx.transport)
