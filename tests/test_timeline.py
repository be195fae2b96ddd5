"""Where a step's time went: interval arithmetic, the rollout phase split and the per-process
CPU sampler (flexmarl.observe.timeline, flexmarl.observe.procstat)."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from hypothesis import given, settings, strategies as st

from flexmarl.observe import procstat, timeline
from flexmarl.observe.timeline import clip, measure, subtract, union

spans = st.lists(st.tuples(st.integers(0, 50), st.integers(0, 50)).map(
    lambda ab: (float(min(ab)), float(max(ab)))), max_size=12)


def points(intervals, lo=0, hi=50):
    """The half-cells [k, k+1) covered: interval arithmetic checked against sets."""
    return {k for k in range(lo, hi) for a, b in intervals if a <= k < b}


@settings(max_examples=200, deadline=None)
@given(spans, spans)
def test_interval_operations_agree_with_sets(a, b):
    assert points(union(a)) == points(a)
    assert measure(a) == len(points(a))
    assert points(subtract(a, b)) == points(a) - points(b)
    assert points(clip(a, 10, 30)) == {k for k in points(a) if 10 <= k < 30}
    merged = union(a)
    assert all(x[1] < y[0] for x, y in zip(merged, merged[1:]))  # disjoint, sorted, not touching


def test_rollout_phases_split_the_window():
    # Step window [10, 20]. Solver: gate-held 10-13, generating 13-15 and 17-20 (a call still
    # waiting at the gate 13-14 does not count twice), waiting for the checker 15-17.
    # Checker: generating 10-12, training 12-16, sync 16-16.5; an open rollout interval ends
    # at the last window's end.
    log = [["solver", "gate", 10.0, 14.0], ["solver", "rollout", 13.0, 15.0],
           ["solver", "rollout", 17.0, 20.0], ["checker", "rollout", 10.0, 12.0],
           ["checker", "train", 12.0, 16.0], ["checker", "sync", 16.0, 16.5],
           ["checker", "rollout", 19.0, None], ["other", "rollout", 0.0, 30.0]]
    [step] = timeline.rollout_phases(log, [{"t_rollout_start": 10.0, "t_rollout_end": 20.0}],
                                     ["solver", "checker"])
    assert step["solver"] == {"rollout_s": 10.0, "generating_s": 5.0, "gate_s": 3.0,
                              "other_s": 2.0, "train_s": 0.0, "sync_s": 0.0}
    assert step["checker"]["generating_s"] == 3.0
    assert step["checker"]["train_s"] == 4.0 and step["checker"]["sync_s"] == 0.5
    assert step["checker"]["other_s"] == 7.0


def test_mean_phases_and_chart():
    steps = [{"a": {"gate_s": 1.0, "rollout_s": 4.0}}, {"a": {"gate_s": 3.0, "rollout_s": 6.0}}]
    assert timeline.mean_phases(steps) == {"a": {"gate_s": 2.0, "rollout_s": 5.0}}
    rows = timeline.chart([["a", "rollout", 0.0, 5.0], ["a", "train", 5.0, 10.0]], 0.0, 10.0,
                          ["a"], width=10, marks=[(0.0, "<"), (9.5, ">")])
    assert rows[0].endswith("|<        >|")
    assert rows[1].endswith("|ggggg.....|") and rows[2].endswith("|.....TTTTT|")
    assert timeline.chart([], 1.0, 1.0, ["a"]) == []


BUSY = "import time\nt = time.process_time()\nwhile time.process_time() - t < {s}: pass\n"


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs Linux /proc")
def test_sampler_attributes_a_childs_cpu_to_it_and_its_core():
    """A child that burns 0.6 s of CPU pinned to one core shows as that process, on that core,
    with no unpinned threads; the sampler runs in this process like the bench's does."""
    core = sorted(os.sched_getaffinity(0))[-1]
    with procstat.ProcessSampler(interval_s=0.05) as sampler:
        t0 = time.perf_counter()
        child = subprocess.Popen([sys.executable, "-c", BUSY.format(s=0.6)],
                                 preexec_fn=lambda: os.sched_setaffinity(0, {core}))
        # Generous: the busy loop needs 0.6 s of CPU, which a loaded machine may take long
        # to give; the sampler must see the child before it exits, so it sleeps a moment.
        child.wait(timeout=60)
        t1 = time.perf_counter()
    usage = sampler.usage(t0, t1)
    mine = [u for u in usage.values() if child.pid in u.pids]
    assert len(mine) == 1, usage
    [use] = mine
    # The last slice of CPU before the exit may fall after the last sample that saw the child.
    assert 0.3 <= use.cpu_s <= 0.8, use
    assert set(use.cores) == {core} and use.allowed == [core] and not use.unpinned
    assert "driver" in usage or not usage.get("driver")
    roles = procstat.by_role(usage)
    assert sum(roles.get("other", {}).values()) >= use.cpu_s


def test_process_names_come_from_the_worker_boot_argument(tmp_path):
    """A FlexMARL worker (python -m runtime.worker BOOT_JSON) is named by its boot's name."""
    code = "import time; time.sleep(30)"
    proc = subprocess.Popen([sys.executable, "-c", code, "runtime.worker",
                             '{"name": "rollout-3", "x": 1}'])
    try:
        deadline = time.monotonic() + 30
        while "runtime.worker" not in (open(f"/proc/{proc.pid}/cmdline").read()) \
                and time.monotonic() < deadline:
            time.sleep(0.05)
        assert procstat.process_name(proc.pid, None) == "rollout-3"
    finally:
        proc.kill()
        proc.wait()
    assert procstat.process_name(os.getpid(), "trainer-0-0").startswith("trainer-0-0/")
