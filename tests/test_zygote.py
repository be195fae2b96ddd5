"""The fork server (runtime.zygote, SupervisorConfig.preload): workers forked from one process
that imported their modules once behave as workers started as fresh interpreters do.

- A forked worker gets its own spec: its environment, cores, OpenMP threads and niceness; its
  process title names it (runtime.worker.worker_name, what procstat and the tests read).
- The fork server killed: its workers are reported dead at once (its children die with it), and
  the next start brings up a new server.
- A preload module that does not import: the supervisor says so and starts workers as fresh
  interpreters; the run goes on.
- Forked workers do not share the fork server's random state: torch's, numpy's and `random`'s
  generators are each reseeded from the OS in every child, so two workers that never seed
  draw different numbers.

The fork server preloads what ships (flexmarl.config.load.WORKER_PRELOAD, the supervisor's
default in a FlexMARL run): torch, transformers, numpy and FlexMARL's worker modules.

Every other supervisor test (tests/test_supervisor.py) runs its workers as fresh interpreters
(the runtime's default), and FlexMARL's runs through the fork server (its default preload).
"""
from __future__ import annotations

import asyncio
import logging
import os
import signal

import psutil
import pytest

from flexmarl.config.load import WORKER_PRELOAD
from runtime.config import SupervisorConfig
from runtime.protocol import Ping, Pong, Tensors
from runtime.supervisor import Supervisor, WorkerSpec, pid_alive
from runtime.transport import connect
from runtime.worker import worker_name

pytestmark = pytest.mark.slow
FORKED = SupervisorConfig(heartbeat_interval_s=0.2, heartbeat_timeout_s=120.0, stop_timeout_s=3.0,
                          ready_timeout_s=120.0, preload=WORKER_PRELOAD)
"""Silence never decides here (what is detected is detected by evidence); workers forked from a
server that preloaded what FlexMARL's runs preload."""


async def test_a_forked_worker_gets_its_own_spec_and_is_named_by_its_title(no_leftover_children):
    core = sorted(os.sched_getaffinity(0))[-1]
    sup = Supervisor(config=FORKED)
    async with sup.serving():
        w = await sup.start_worker(WorkerSpec(name="forked", entry="tests.helpers.workers:placement",
                                              cpus=(core,), nice=3,
                                              env={"FLEXMARL_TEST_MARK": "forked-env"}))
        assert psutil.Process(w.pid).ppid() == sup._zygote.proc.pid  # forked, not exec'd
        assert worker_name(psutil.Process(w.pid).cmdline()) == "forked"
        async with connect(w.address) as conn:
            meta = (await conn.request(Tensors())).meta
        # torch was imported by the server: its thread pool sized to the worker's cores anyway.
        assert meta == {"cpus": [core], "omp": "1", "nice": min(19, os.nice(0) + 3),
                        "mark": "forked-env", "torch_threads": 1}
        await sup.stop_workers()


async def test_a_killed_fork_server_takes_its_workers_and_is_started_again(no_leftover_children):
    sup = Supervisor(config=FORKED)
    async with sup.serving():
        w = await sup.start_worker(WorkerSpec(name="child", entry="tests.helpers.workers:echo"))
        server = sup._zygote.proc.pid
        os.kill(server, signal.SIGKILL)
        event = await asyncio.wait_for(sup.events.get(), 30)  # its exit, not its silence
        assert (event.name, event.pid) == ("child", w.pid)
        again = await sup.start_worker(WorkerSpec(name="child", entry="tests.helpers.workers:echo"))
        assert sup._zygote.proc.pid != server
        async with connect(again.address) as conn:
            assert await conn.request(Ping(3)) == Pong(3)
    assert not pid_alive(again.pid) and not pid_alive(server)


async def test_a_preload_that_does_not_import_falls_back_to_fresh_interpreters(
        caplog, no_leftover_children):
    config = SupervisorConfig(ready_timeout_s=120.0, stop_timeout_s=3.0,
                              preload=("no_such_module_for_the_fork_server",))
    sup = Supervisor(config=config)
    with caplog.at_level(logging.WARNING, logger="runtime.supervisor"):
        async with sup.serving():
            w = await sup.start_worker(WorkerSpec(name="fresh", entry="tests.helpers.workers:echo"))
            assert worker_name(psutil.Process(w.pid).cmdline()) == "fresh"
            assert psutil.Process(w.pid).ppid() == os.getpid()  # a fresh interpreter
    warned = [r.getMessage() for r in caplog.records if "fork server" in r.getMessage()]
    assert warned and "no_such_module_for_the_fork_server" in warned[0], warned


async def test_forked_workers_draw_different_random_numbers_without_seeding(no_leftover_children):
    """The fork server imported torch and numpy (their generators seeded once, there); each
    fork gets fresh state for every generator, so forgetting to seed cannot make two workers
    (two rollout instances' sampling, two ranks' dropout) draw the same numbers."""
    sup = Supervisor(config=FORKED)
    async with sup.serving():
        got = []
        for name in ("a", "b"):
            w = await sup.start_worker(WorkerSpec(name=name, entry="tests.helpers.workers:draws"))
            assert psutil.Process(w.pid).ppid() == sup._zygote.proc.pid  # forked, not exec'd
            async with connect(w.address) as conn:
                got.append((await conn.request(Tensors())).meta)
        await sup.stop_workers()
    a, b = got
    assert a["inherited"] == b["inherited"] == ["torch", "numpy.random"]  # the server's state
    for rng in ("torch", "numpy", "random"):
        assert a[rng] != b[rng], f"two forked workers drew the same {rng} numbers: {a[rng]}"


def test_preload_is_checked():
    for bad in ("torch", ("a b",), (1,)):
        with pytest.raises(ValueError, match="supervisor.preload"):
            SupervisorConfig(preload=bad)
