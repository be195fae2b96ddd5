"""CPU time per process and core of a process tree, sampled from /proc (Linux).

A thread samples every thread of the tree (a root process and all its descendants) every
`interval_s`: its CPU seconds (utime + stime) and the core it last ran on. `usage(t0, t1)`
then says, per process, the CPU seconds spent between two perf_counter() times, split by the
core each thread was seen on (each slice of CPU time between two samples goes to the core of
the later sample: an approximation, exact for pinned threads), plus the threads that may run
on cores outside their process's pinned set. Processes are named by their role in a run: a
FlexMARL worker by its worker name (`python -m runtime.worker BOOT` carries it), its children
(vLLM's engine core) as "NAME/comm", the root as "driver".

Used by bench/pipeline.py to tell whether training work runs on the rollout's core.
"""
from __future__ import annotations

import os
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field

from runtime.worker import worker_name

CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _read(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            return f.read().decode(errors="replace")
    except OSError:  # the process or thread ended
        return None


def _stat_fields(text: str) -> list[str]:
    # comm (field 2) may hold spaces and parentheses: split after its last ')'.
    return text[text.rindex(")") + 2:].split()


def thread_stat(pid: int, tid: int) -> tuple[float, int] | None:
    """(CPU seconds, last core) of one thread, or None if it is gone."""
    text = _read(f"/proc/{pid}/task/{tid}/stat")
    if text is None:
        return None
    f = _stat_fields(text)  # f[0] is field 3 (state)
    return (int(f[11]) + int(f[12])) / CLOCK_TICKS, int(f[36])


def children(pid: int) -> list[int]:
    out = []
    for tid in os.listdir(f"/proc/{pid}/task") if os.path.isdir(f"/proc/{pid}/task") else []:
        text = _read(f"/proc/{pid}/task/{tid}/children")
        out.extend(int(c) for c in (text or "").split())
    return out


def process_name(pid: int, parent_name: str | None) -> str:
    """A worker's name from its boot argument; a child of a named process "PARENT/comm"."""
    name = worker_name((_read(f"/proc/{pid}/cmdline") or "").split("\0"))
    if name is not None:
        return name
    comm = (_read(f"/proc/{pid}/comm") or "?").strip()
    return f"{parent_name}/{comm}" if parent_name else comm


@dataclass
class ProcessUsage:
    name: str
    pids: list[int] = field(default_factory=list)
    cpu_s: float = 0.0
    cores: dict[int, float] = field(default_factory=dict)
    """CPU seconds by the core they ran on."""
    allowed: list[int] = field(default_factory=list)
    """The cores the process (its main thread) may run on."""
    unpinned: dict[str, float] = field(default_factory=dict)
    """Threads allowed on cores outside `allowed` (by thread name): their CPU seconds."""

    def as_dict(self) -> dict:
        return {"cpu_s": round(self.cpu_s, 3),
                "cores": {str(c): round(s, 3) for c, s in sorted(self.cores.items())},
                "allowed": self.allowed,
                "unpinned": {k: round(v, 3) for k, v in sorted(self.unpinned.items())}}


class ProcessSampler:
    """Samples the tree under `root` (default: this process) from a daemon thread."""

    def __init__(self, root: int | None = None, interval_s: float = 0.2) -> None:
        self.root = os.getpid() if root is None else root
        self.interval_s = interval_s
        self.samples: list[tuple[float, dict[tuple[int, int], tuple[float, int]]]] = []
        self.names: dict[int, str] = {}
        self.thread_names: dict[tuple[int, int], str] = {}
        self.affinity: dict[tuple[int, int], frozenset[int]] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.cpu_s = 0.0
        """The sampler thread's own CPU seconds (in the root process), once it stopped."""

    def __enter__(self) -> "ProcessSampler":
        self._thread = threading.Thread(target=self._run, name="procstat", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval_s)
        self.sample()
        self.cpu_s = time.thread_time()

    def sample(self) -> None:
        t = time.perf_counter()
        seen: dict[tuple[int, int], tuple[float, int]] = {}
        stack = [(self.root, None)]
        while stack:
            pid, parent = stack.pop()
            if pid not in self.names:
                self.names[pid] = "driver" if pid == self.root else process_name(pid, parent)
            try:
                tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
            except OSError:
                continue
            for tid in tids:
                stat = thread_stat(pid, tid)
                if stat is None:
                    continue
                seen[(pid, tid)] = stat
                if (pid, tid) not in self.thread_names:
                    self.thread_names[(pid, tid)] = (
                        _read(f"/proc/{pid}/task/{tid}/comm") or "?").strip()
                try:  # read every time: a worker pins itself after it started
                    self.affinity[(pid, tid)] = frozenset(os.sched_getaffinity(tid))
                except OSError:
                    pass
            stack.extend((c, self.names[pid] if pid != self.root else None)
                         for c in children(pid))
        self.samples.append((t, seen))

    def usage(self, t0: float, t1: float) -> dict[str, ProcessUsage]:
        """CPU per process name between perf_counter() times t0 and t1."""
        out: dict[str, ProcessUsage] = {}
        last: dict[tuple[int, int], float] = {}
        # The thread's CPU total at the last sample at or before t0 is the baseline; a thread
        # first seen later starts from 0 (it was born in the window).
        for t, seen in self.samples:
            if t > t1:
                break
            for key, (cpu, core) in seen.items():
                before = last.get(key)
                last[key] = cpu
                if t <= t0:
                    continue
                delta = cpu - (before if before is not None else 0.0)
                if delta <= 0:
                    continue
                pid, _ = key
                name = self.names.get(pid, str(pid))
                use = out.get(name) or out.setdefault(name, ProcessUsage(name))
                if pid not in use.pids:
                    use.pids.append(pid)
                    use.allowed = sorted(self.affinity.get((pid, pid), ()))
                use.cpu_s += delta
                use.cores[core] = use.cores.get(core, 0.0) + delta
                mask = self.affinity.get(key)
                if mask is not None and use.allowed and not mask <= set(use.allowed):
                    thread = self.thread_names.get(key, "?")
                    use.unpinned[thread] = use.unpinned.get(thread, 0.0) + delta
        return out


def by_role(usage: dict[str, ProcessUsage]) -> dict[str, dict[int, float]]:
    """CPU seconds per role (driver, rollout, trainer, other) and core."""
    out: dict[str, dict[int, float]] = defaultdict(dict)
    for name, use in usage.items():
        role = name.split("/")[0].split("-")[0]
        role = role if role in ("driver", "rollout", "trainer") else "other"
        for core, s in use.cores.items():
            out[role][core] = out[role].get(core, 0.0) + s
    return dict(out)


class PeakRss:
    """Each FlexMARL worker process's peak resident memory (VmHWM), by worker name, sampled
    while it lives (a process's peak is its own: the last sample before it exits is kept).
    Workers are found machine-wide by their command line or forked title (worker_name), so a
    run in this process or in a child is seen alike. Used by bench/lora.py and
    bench/state_memory.py."""

    def __init__(self, interval_s: float = 0.2) -> None:
        self.peaks: dict[int, tuple[str, int]] = {}
        """pid -> (worker name, peak bytes)."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, args=(interval_s,), daemon=True,
                                        name="peak-rss")

    def __enter__(self) -> "PeakRss":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self, interval_s: float) -> None:
        while not self._stop.wait(interval_s):
            for pid in os.listdir("/proc"):
                if pid.isdigit():
                    self._sample(int(pid))

    def _sample(self, pid: int) -> None:
        name = worker_name((_read(f"/proc/{pid}/cmdline") or "").split("\0"))
        status = _read(f"/proc/{pid}/status") if name else None
        if status is None:  # not a worker, or gone meanwhile
            return
        hwm = next((int(line.split()[1]) * 1024 for line in status.splitlines()
                    if line.startswith("VmHWM:")), 0)
        self.peaks[pid] = (name, max(hwm, self.peaks.get(pid, (name, 0))[1]))

    def by_worker(self) -> dict[str, float]:
        """Worker name -> its peak in MiB (a name served by several processes in turn, a
        replaced worker: the largest)."""
        out: dict[str, float] = {}
        for name, peak in self.peaks.values():
            out[name] = max(out.get(name, 0.0), peak / 2**20)
        return dict(sorted(out.items()))

    def by_role(self) -> dict[str, float]:
        """MiB summed over the trainer ("trainer-...") and the rollout ("rollout-...")
        workers."""
        out = {"rollout": 0.0, "trainer": 0.0}
        for name, peak in self.peaks.values():
            role = name.split("-", 1)[0]
            if role in out:
                out[role] += peak / 2**20
        return out
