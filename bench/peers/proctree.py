"""bench/peers.py's measurement of a run's process tree, from /proc: its processes, their peak
RSS and CPU seconds over time (TreeSampler), and a command run to the end under it (run_tree).
Standard library only."""
from __future__ import annotations

import os
import subprocess
import threading
import time

PAGE = os.sysconf("SC_PAGE_SIZE")
TICK = os.sysconf("SC_CLK_TCK")
RUN_TIMEOUT_S = 3600.0



def tree(root: int) -> list[int]:
    """`root` and its live descendants (from /proc: each process's parent)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += children.get(pid, [])
    return out


def usage(pids: list[int]) -> tuple[int, dict[int, float]]:
    """(resident bytes summed over `pids`, each one's CPU seconds so far)."""
    rss, cpu = 0, {}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/statm") as f:
                rss += int(f.read().split()[1]) * PAGE
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            cpu[pid] = (int(fields[11]) + int(fields[12])) / TICK  # utime, stime
        except (OSError, IndexError, ValueError):
            continue
    return rss, cpu


class TreeSampler(threading.Thread):
    """Peak RSS of a process tree, and its CPU seconds over time (every `interval` s)."""

    def __init__(self, pid: int, interval: float = 0.5) -> None:
        super().__init__(daemon=True)
        self.pid, self.interval = pid, interval
        self.peak_rss = 0
        self.cpu: list[tuple[float, float]] = []  # (time.time(), CPU s of the tree so far)
        self.done = threading.Event()
        self._last: dict[int, float] = {}  # each process's CPU when last seen (kept at exit)

    def run(self) -> None:
        while not self.done.is_set():
            rss, cpu = usage(tree(self.pid))
            if cpu:  # (the tree is gone: nothing to add)
                self.peak_rss = max(self.peak_rss, rss)
                self._last.update(cpu)
                self.cpu.append((time.time(), sum(self._last.values())))
            self.done.wait(self.interval)

    def cpu_between(self, t0: float, t1: float) -> float | None:
        """CPU seconds the tree used between two times (the samples nearest them)."""
        inside = [(t, c) for t, c in self.cpu if t0 <= t <= t1]
        if len(inside) < 2:
            return None
        return (inside[-1][1] - inside[0][1]) * (t1 - t0) / (inside[-1][0] - inside[0][0])


def run_tree(cmd: list[str], log: str, env: dict | None = None, cwd: str | None = None
             ) -> tuple[int, float, TreeSampler]:
    """Run `cmd` (its output to `log`) to the end; (exit code, start time, sampler)."""
    with open(log, "w") as out:
        started = time.time()
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=cwd,
                                env={**os.environ, **(env or {})}, start_new_session=True)
        sampler = TreeSampler(proc.pid)
        sampler.start()
        try:
            code = proc.wait(timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            code = proc.wait()
        finally:
            sampler.done.set()
            sampler.join()
    return code, started, sampler
