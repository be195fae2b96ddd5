"""Where a step's time went, from the run's activity log (pure functions over intervals).

The activity log (flexmarl.activity) records per agent when it had a request in flight
("rollout"), when one of its calls waited at its step gate ("gate": the pipeline policy held it
for the agent's previous update), when its trainer worked on its batch ("train") and when its
weights were exported and pushed ("sync"). `RunResult.timeline` holds those intervals in
seconds since the loop started, the origin of the step records' `t_*` fields.

    rollout_phases(timeline, records, agents)
        per step and agent, over the step's rollout window [t_rollout_start, t_rollout_end]:
          generating_s   a request of the agent in flight
          gate_s         no request in flight, a call waiting at the agent's gate
          other_s        neither: the agent's workflows were busy with other agents (or with
                         the workflow's own code, rewards, the store)
          train_s, sync_s  the agent's trainer busy / its weights moving during the window
    chart(timeline, t0, t1, agents)  one text row per agent and kind, for a person to read
"""
from __future__ import annotations

from typing import Iterable, Sequence

Interval = tuple[float, float]


def union(intervals: Iterable[Interval]) -> list[Interval]:
    """Sorted, disjoint intervals covering the same points."""
    out: list[list[float]] = []
    for a, b in sorted(intervals):
        if b <= a:
            continue
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def clip(intervals: Iterable[Interval], t0: float, t1: float) -> list[Interval]:
    return [(max(a, t0), min(b, t1)) for a, b in intervals if min(b, t1) > max(a, t0)]


def subtract(intervals: Iterable[Interval], minus: Iterable[Interval]) -> list[Interval]:
    """Points of `intervals` not in `minus`."""
    cut = union(minus)
    out: list[Interval] = []
    for a, b in union(intervals):
        for c, d in cut:
            if d <= a or c >= b:
                continue
            if c > a:
                out.append((a, c))
            a = max(a, d)
            if a >= b:
                break
        if a < b:
            out.append((a, b))
    return out


def measure(intervals: Iterable[Interval]) -> float:
    return sum(b - a for a, b in union(intervals))


def of(timeline: Sequence[Sequence], who: str, kind: str, end: float) -> list[Interval]:
    """The intervals of (who, kind); one still open ends at `end`."""
    return [(s, end if e is None else e) for w, k, s, e in timeline if w == who and k == kind]


def rollout_phases(timeline: Sequence[Sequence], records: Sequence[dict],
                   agents: Sequence[str]) -> list[dict[str, dict[str, float]]]:
    """Per record (step), per agent: the split of the step's rollout window (module docstring)."""
    end = max([r["t_rollout_end"] for r in records] + [0.0])
    out = []
    for record in records:
        t0, t1 = record["t_rollout_start"], record["t_rollout_end"]
        window = t1 - t0
        step: dict[str, dict[str, float]] = {}
        for agent in agents:
            gen = clip(of(timeline, agent, "rollout", end), t0, t1)
            gate = subtract(clip(of(timeline, agent, "gate", end), t0, t1), gen)
            generating, gated = measure(gen), measure(gate)
            step[agent] = {
                "rollout_s": window, "generating_s": generating, "gate_s": gated,
                "other_s": max(0.0, window - generating - gated),
                "train_s": measure(clip(of(timeline, agent, "train", end), t0, t1)),
                "sync_s": measure(clip(of(timeline, agent, "sync", end), t0, t1)),
            }
        out.append(step)
    return out


def mean_phases(steps: Sequence[dict[str, dict[str, float]]]) -> dict[str, dict[str, float]]:
    """`rollout_phases` averaged over steps, per agent."""
    if not steps:
        return {}
    return {agent: {key: sum(s[agent][key] for s in steps) / len(steps)
                    for key in steps[0][agent]} for agent in steps[0]}


CHART_KINDS = (("rollout", "g"), ("gate", "w"), ("train", "T"), ("sync", "S"))


def chart(timeline: Sequence[Sequence], t0: float, t1: float, agents: Sequence[str],
          *, width: int = 100, marks: Sequence[tuple[float, str]] = ()) -> list[str]:
    """Text rows of [t0, t1], one character per (t1 - t0) / width seconds: per agent, one row
    each for generating (g), gate waits (w), training (T) and syncing (S); a cell is marked
    when the kind was active for at least half of it. `marks` (time, label) go on a ruler."""
    if t1 <= t0:
        return []
    cell = (t1 - t0) / width
    rows = []
    ruler = [" "] * width
    for t, label in marks:
        i = int((t - t0) / cell)
        if 0 <= i < width:
            ruler[i] = label[:1]
    rows.append(f"{'':<18}|{''.join(ruler)}|")
    for agent in agents:
        for kind, mark in CHART_KINDS:
            spans = clip(of(timeline, agent, kind, t1), t0, t1)
            if not spans:
                continue
            line = []
            for i in range(width):
                a = t0 + i * cell
                covered = measure(clip(spans, a, a + cell))
                line.append(mark if covered >= cell / 2 else ".")
            rows.append(f"{agent[:10]:<10} {kind:<7}|{''.join(line)}|")
    span = f"{t1 - t0:.2f} s"
    rows.append(f"{'':<18}0{span:>{width + 1}}")
    return rows
