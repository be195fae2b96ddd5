"""Supervisor with real worker processes: Ready, heartbeats, deaths, ordered shutdown, no orphans.

Deadlines here say what they check. Detection by exit is checked against a heartbeat timeout it
must beat by far (it needs none); detection by silence against the configured timeout (never
before it, and within a generous bound after it: the observer's own stalls are not counted, so
on a loaded machine it may come later). No bound assumes this machine's speed.
"""
from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from runtime.config import SupervisorConfig
from runtime.errors import WorkerStartError
from runtime.protocol import Ping, Pong, Tensors
from runtime.supervisor import Supervisor, WorkerSpec, pid_alive
from runtime.transport import connect

pytestmark = pytest.mark.slow
FAST = SupervisorConfig(heartbeat_interval_s=0.2, heartbeat_timeout_s=1.5, stop_timeout_s=3.0,
                        ready_timeout_s=120.0)
"""A short heartbeat timeout, for the test of detection by silence."""
STEADY = SupervisorConfig(heartbeat_interval_s=0.2, heartbeat_timeout_s=4.0, stop_timeout_s=3.0,
                          ready_timeout_s=120.0)
"""For the tests where silence must not decide: 20 beats of room, since a loaded CI machine was
seen to leave a worker's heartbeat thread unscheduled for 1.6 s (FAST's 1.5 s timeout then
decides on noise, not on what the test is about)."""
PATIENT = SupervisorConfig(heartbeat_interval_s=0.2, heartbeat_timeout_s=120.0,
                           stop_timeout_s=3.0, ready_timeout_s=120.0)
"""Silence never decides within a test: what is detected is detected by evidence."""
STARTUP_S = 120.0
"""Ready deadline for a worker that must get as far as its entry point (a Python start with
torch imported: seconds here, more on a machine 3x slower with other jobs beside it)."""


async def wait_dead(pids: list[int], within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if not any(pid_alive(p) for p in pids):
            return True
        await asyncio.sleep(0.05)
    return False


async def test_workers_serve_over_ipc_and_tcp_and_stop_in_order(no_leftover_children):
    sup = Supervisor(config=STEADY)
    async with sup.serving():
        a = await sup.start_worker(WorkerSpec(name="a", entry="tests.helpers.workers:echo"))
        b = await sup.start_worker(WorkerSpec(name="b", entry="tests.helpers.workers:with_grandchild",
                                              bind="tcp://127.0.0.1:0"))
        assert a.address.startswith("ipc://") and b.address.startswith("tcp://127.0.0.1:")
        async with connect(a.address) as ca, connect(b.address) as cb:
            x = torch.randn(256, 256)
            assert torch.equal((await ca.request(Tensors(tensors={"x": x}))).tensors["x"], x)
            grandchild = (await cb.request(Tensors())).meta["grandchild_pid"]
            assert await cb.request(Ping(5), control=True) == Pong(5)
        pids = [a.pid, b.pid, grandchild]
        assert all(pid_alive(p) for p in pids)
    # Leaving the block stopped every worker and its process group, grandchild included.
    assert not any(pid_alive(p) for p in pids)
    assert sup.events.empty()  # ordered stops are not reported as deaths


async def test_kill_9_is_reported_by_its_exit_without_waiting_for_silence(no_leftover_children):
    sup = Supervisor(config=PATIENT)
    async with sup.serving():
        w = await sup.start_worker(WorkerSpec(name="victim", entry="tests.helpers.workers:echo"))
        other = await sup.start_worker(WorkerSpec(name="bystander", entry="tests.helpers.workers:echo"))
        killed_at = time.monotonic()
        os.kill(w.pid, signal.SIGKILL)
        # Far less than the heartbeat timeout: the exit itself is the evidence.
        event = await asyncio.wait_for(sup.events.get(), PATIENT.heartbeat_timeout_s / 4)
        assert time.monotonic() - killed_at < PATIENT.heartbeat_timeout_s / 4
        assert (event.name, event.pid, event.reason, event.returncode) == \
            ("victim", w.pid, "exited", -signal.SIGKILL)
        async with connect(other.address) as conn:  # the others are unaffected
            assert await conn.request(Ping(1)) == Pong(1)
        # A replacement can take the dead worker's name.
        again = await sup.start_worker(WorkerSpec(name="victim", entry="tests.helpers.workers:echo"))
        assert again.pid != w.pid
    assert not pid_alive(other.pid) and not pid_alive(again.pid)


async def test_hung_worker_is_declared_dead_and_killed(no_leftover_children):
    sup = Supervisor(config=FAST)
    async with sup.serving():
        w = await sup.start_worker(WorkerSpec(name="hung", entry="tests.helpers.workers:echo"))
        os.kill(w.pid, signal.SIGSTOP)  # alive but silent
        stopped_at = time.monotonic()
        # Never before the timeout's worth of silence (less the one interval a heartbeat may
        # have been in flight); the upper bound only guards against never.
        event = await asyncio.wait_for(sup.events.get(), FAST.heartbeat_timeout_s * 3 + 15)
        took = time.monotonic() - stopped_at
        assert event.reason == "heartbeat_timeout" and event.name == "hung"
        assert took >= FAST.heartbeat_timeout_s - FAST.heartbeat_interval_s, took
        assert event.silent_for_s > FAST.heartbeat_timeout_s
        assert await wait_dead([w.pid], 5)
        assert sup.events.empty()  # one event per death, not two


async def test_a_worker_log_gets_the_workers_output_and_the_error_its_last_words(
        no_leftover_children, tmp_path, capfd):
    """With worker_log (a run's log file), a worker's stderr goes there and not to this
    process's stderr; a start failure still names its last stderr lines."""
    log = tmp_path / "run.log"
    sup = Supervisor(config=SupervisorConfig(ready_timeout_s=STARTUP_S, stop_timeout_s=2.0),
                     worker_log=log)
    async with sup.serving():
        with pytest.raises(WorkerStartError) as e:
            await sup.start_worker(WorkerSpec(name="crash", entry="tests.helpers.workers:crash"))
    assert "RuntimeError: this worker fails on purpose before it is ready" in str(e.value)
    assert "this worker fails on purpose" in log.read_text()
    assert "this worker fails on purpose" not in capfd.readouterr().err


async def test_start_failures_are_typed_and_name_the_fix(no_leftover_children):
    sup = Supervisor(config=SupervisorConfig(ready_timeout_s=STARTUP_S, stop_timeout_s=2.0))
    async with sup.serving():
        with pytest.raises(WorkerStartError, match="exited with code 1 before sending Ready") as e:
            await sup.start_worker(WorkerSpec(name="crash", entry="tests.helpers.workers:crash"))
        # Its last stderr lines, the traceback's end, are in the error.
        assert "RuntimeError: this worker fails on purpose before it is ready" in str(e.value)
        # 3 s: never_ready never answers, so the outcome is the same at any machine speed.
        with pytest.raises(WorkerStartError, match="supervisor.ready_timeout_s"):
            await sup.start_worker(WorkerSpec(name="slow", entry="tests.helpers.workers:never_ready",
                                              ready_timeout_s=3.0))
        assert not pid_alive(sup.workers["slow"].pid)
        with pytest.raises(ValueError, match="package.module:function"):
            WorkerSpec(name="x", entry="no_colon")
        with pytest.raises(ValueError, match="WorkerSpec.name"):
            WorkerSpec(name="../evil", entry="a:b")
        assert sup.events.empty()


async def test_a_worker_stopped_while_its_start_blocks_exits_at_once(tmp_path, caplog,
                                                                   no_leftover_children):
    """A stop during a long blocking start (a vLLM replacement still loading at the end of a
    run) ends the worker at once: it has nothing to drain yet. Its loop signal handler could
    not run, so it used to be SIGKILLed after stop_timeout_s with an "ignored SIGTERM"."""
    marker = tmp_path / "starting"
    sup = Supervisor(config=SupervisorConfig(stop_timeout_s=30.0))
    async with sup.serving():
        start = asyncio.create_task(sup.start_worker(WorkerSpec(
            name="loading", entry="tests.helpers.workers:slow_start", args={"marker": str(marker)},
            ready_timeout_s=3600.0)))
        for _ in range(600):  # the worker's start is under way (a loaded machine: seconds)
            if marker.exists():
                break
            await asyncio.sleep(0.1)
        assert marker.exists()
        t0 = time.monotonic()
        await sup.stop_workers()
        # Well under stop_timeout_s (30 s), which is what a worker deaf to SIGTERM costs.
        assert time.monotonic() - t0 < 15.0
        start.cancel()
        await asyncio.gather(start, return_exceptions=True)
    assert not [r for r in caplog.records if "ignored SIGTERM" in r.getMessage()]


async def test_an_exit_noticed_after_the_ready_deadline_is_reported_as_an_exit(
        no_leftover_children, monkeypatch):
    """The worker crashes before it is ready, but this event loop is busy and learns of the exit
    only after the ready deadline has passed (here: the loop is blocked until the worker is
    gone, and its exit reaches the supervisor's watcher 2 s late): the error is its exit, with
    its code and traceback, not a "did not send Ready"."""
    watch = Supervisor._proc_wait

    async def late_watch(self, handle):
        await asyncio.sleep(2.0)
        await watch(self, handle)

    monkeypatch.setattr(Supervisor, "_proc_wait", late_watch)
    sup = Supervisor(config=SupervisorConfig(ready_timeout_s=0.5, stop_timeout_s=2.0))
    async with sup.serving():
        start = asyncio.create_task(sup.start_worker(WorkerSpec(name="crash",
                                                                entry="tests.helpers.workers:crash")))
        while "crash" not in sup.workers:
            await asyncio.sleep(0)
        spawned, pid = time.monotonic(), sup.workers["crash"].pid
        # Block the loop (no await) until the worker has crashed: a zombie nobody reaped yet.
        deadline = spawned + STARTUP_S
        while pid_alive(pid):
            assert time.monotonic() < deadline, "the crash worker never exited"
            time.sleep(0.02)
        time.sleep(max(0.0, spawned + 1.0 - time.monotonic()))  # past the 0.5 s deadline too
        with pytest.raises(WorkerStartError, match="exited with code 1 before sending Ready") as e:
            await start
        assert "fails on purpose" in str(e.value)
        assert sup.events.empty()


async def test_a_worker_busy_in_its_event_loop_is_not_declared_dead(no_leftover_children):
    """A handler that holds the worker's event loop for 2 heartbeat timeouts (a model load, a
    long native call) is work, not death: heartbeats come from a thread."""
    sup = Supervisor(config=STEADY)
    async with sup.serving():
        w = await sup.start_worker(WorkerSpec(name="busy", entry="tests.helpers.workers:blocking"))
        async with connect(w.address) as conn:
            hold_s = 2 * STEADY.heartbeat_timeout_s
            reply = await conn.request(Tensors(meta={"seconds": hold_s}), timeout_s=hold_s + 60)
        assert reply.meta == {"seconds": hold_s}
        assert sup.events.empty() and pid_alive(w.pid)


async def test_a_stalled_supervisor_does_not_take_its_workers_for_dead(no_leftover_children):
    """This process's own event loop blocked for 2 heartbeat timeouts: the workers' heartbeats
    wait unread in its socket meanwhile, so the stall is not their silence."""
    sup = Supervisor(config=STEADY)
    async with sup.serving():
        w = await sup.start_worker(WorkerSpec(name="w", entry="tests.helpers.workers:echo"))
        time.sleep(2 * STEADY.heartbeat_timeout_s)  # blocks the loop: no await
        for _ in range(10):  # let the watch loop tick a few times after the stall
            await asyncio.sleep(STEADY.heartbeat_interval_s)
        assert sup.events.empty() and pid_alive(w.pid)
        assert sup.silence.stalled_s > 1.5 * STEADY.heartbeat_timeout_s
        async with connect(w.address) as conn:
            assert await conn.request(Ping(1), timeout_s=STARTUP_S) == Pong(1)


async def test_stubborn_worker_is_killed_at_the_stop_deadline(no_leftover_children):
    cfg = SupervisorConfig(stop_timeout_s=1.0, heartbeat_interval_s=0.2, heartbeat_timeout_s=5)
    sup = Supervisor(config=cfg)
    async with sup.serving():
        w = await sup.start_worker(WorkerSpec(name="stubborn", entry="tests.helpers.workers:stubborn"))
        started = time.monotonic()
        await sup.stop_workers()
        took = time.monotonic() - started
    assert not pid_alive(w.pid)
    assert w.proc.returncode == -signal.SIGKILL
    assert cfg.stop_timeout_s <= took < cfg.stop_timeout_s + 15  # + time to kill and reap


@pytest.mark.parametrize("mode", ["", "blocked"])
def test_supervisor_killed_9_leaves_no_orphans(mode):
    """Workers die with their supervisor: by SIGTERM (PR_SET_PDEATHSIG), or, when a worker's
    event loop is blocked and cannot run its handler, by its orphan watchdog after 2 x
    stop_timeout_s (1 s in the host)."""
    host = subprocess.Popen([sys.executable, "-m", "tests.helpers.supervisor_host", *filter(None, [mode])],
                            stdout=subprocess.PIPE, text=True)
    try:
        pids = json.loads(host.stdout.readline())
        assert len(pids) == (3 if mode else 2) and all(pid_alive(p) for p in pids)
        host.kill()
        host.wait()
        deadline = time.monotonic() + 60  # the slow path takes 2 x stop_timeout_s = 2 s
        while any(pid_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(pid_alive(p) for p in pids), "workers outlived their supervisor"
    finally:
        host.kill()
        host.wait()


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="needs Linux CPU affinity")
async def test_worker_is_pinned_to_its_cpus(no_leftover_children):
    cores = sorted(os.sched_getaffinity(0))
    sup = Supervisor(config=STEADY)
    async with sup.serving():
        pinned = await sup.start_worker(WorkerSpec(name="pinned", entry="tests.helpers.workers:placement",
                                                   cpus=(cores[-1],)))
        free = await sup.start_worker(WorkerSpec(name="free", entry="tests.helpers.workers:placement"))
        async with connect(pinned.address) as a, connect(free.address) as b:
            assert (await a.request(Tensors())).meta == {"cpus": [cores[-1]], "omp": "1",
                                                         "nice": os.nice(0), "torch_threads": 1}
            assert (await b.request(Tensors())).meta["cpus"] == cores
        await sup.stop_workers()


async def test_worker_runs_at_its_niceness(no_leftover_children):
    """WorkerSpec.nice is added to the worker's niceness (trainer_pool.nice on CPU)."""
    mine = os.nice(0)
    sup = Supervisor(config=STEADY)
    async with sup.serving():
        niced = await sup.start_worker(WorkerSpec(name="niced", entry="tests.helpers.workers:placement",
                                                  nice=5))
        async with connect(niced.address) as conn:
            assert (await conn.request(Tensors())).meta["nice"] == min(19, mine + 5)
        await sup.stop_workers()
    for bad in (-1, 20, 1.5, True):
        with pytest.raises(ValueError, match="WorkerSpec.nice"):
            WorkerSpec(name="x", entry="tests.helpers.workers:placement", nice=bad)
