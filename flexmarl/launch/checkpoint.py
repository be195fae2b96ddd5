"""What a run directory needs to resume: which steps' states a run writes (SaveSchedule), the
step a resumed run starts at (resume_point), and the metrics records it redoes.

The states themselves, RUN_DIR/state/AGENT/step-NNNNNN, are flexmarl.training.state_files'
StateCheckpoints (re-exported here), written by the trainer ranks.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import orjson

from flexmarl.observe.rundir import METRICS_FILE, read_metrics
from flexmarl.training.state_files import (FORMAT, META_FILE, SHARDED_FORMAT, STATE_DIR,
                                           STATE_FILE, CheckpointError, StateCheckpoints)

__all__ = ["FORMAT", "META_FILE", "SHARDED_FORMAT", "STATE_DIR", "STATE_FILE", "CheckpointError",
           "SaveSchedule", "StateCheckpoints", "drop_records_after", "last_record_step",
           "resume_point"]


@dataclass(frozen=True)
class SaveSchedule:
    """Which steps' states a run writes: every `every`-th step and the last (run.save_every).
    `first_step` > 0: the run resumed from the states of step first_step - 1."""

    every: int
    steps: int
    first_step: int = 0

    def saves(self, step: int) -> bool:
        return (step + 1) % self.every == 0 or step + 1 == self.steps

    def last_saved(self, step: int) -> int:
        """The latest step <= `step` whose states are on disk once its record is out: a step
        this run saved, or the one it resumed from (-1: none yet)."""
        grid = (step + 1) // self.every * self.every - 1
        return step if self.saves(step) else max(grid if grid >= self.first_step else -1,
                                                 self.first_step - 1)


def resume_point(run_dir: str | os.PathLike, agents: list[str]) -> int:
    """The first global step a resumed run must (re)do: 1 + the last step s, at or before the
    last step record in RUN_DIR/metrics.jsonl (a torn last line is skipped), at which every
    agent has a state saved in RUN_DIR/state; 0 if there is no step record. With
    run.save_every > 1, s may come before the last record: the records after it are redone
    (`drop_records_after(run_dir, s)`). Step records but no such s: CheckpointError. States
    after s may exist (saved before a kill cut the step's record): drop_after(s)."""
    last = last_record_step(run_dir)
    if last is None:
        return 0
    root = Path(run_dir) / STATE_DIR  # StateCheckpoints() also finishes interrupted saves
    saved = StateCheckpoints(root).steps if root.is_dir() else lambda agent: []
    common = set.intersection(*(set(saved(a)) for a in agents)) if agents else {last}
    if points := [s for s in common if s <= last]:
        return max(points) + 1
    missing = [a for a in agents if last not in saved(a)]
    raise CheckpointError(
        f"cannot resume {run_dir} at step {last + 1}: no state saved at step {last} for "
        f"agent(s) {', '.join(map(repr, missing))} in {root}, nor at any earlier step for "
        "every agent; the run was made with run.save_state off, or its state dir was removed. "
        "Start a new run instead")


def last_record_step(run_dir: str | os.PathLike) -> int | None:
    """The step of the last step record in RUN_DIR/metrics.jsonl (None: no step record)."""
    try:
        records = read_metrics(Path(run_dir) / METRICS_FILE)
    except FileNotFoundError:
        return None
    steps = [r["step"] for r in records if isinstance(r, dict) and type(r.get("step")) is int]
    return steps[-1] if steps else None  # records go out in step order (PipelineRun)


def drop_records_after(run_dir: str | os.PathLike, step: int) -> int:
    """Cut RUN_DIR/metrics.jsonl after the last record of step <= `step` (the steps a resumed
    run redoes from the last saved states); returns how many records were cut. Truncated in
    place: a MetricsWriter open on the file appends after the cut (its file is O_APPEND)."""
    path = Path(run_dir) / METRICS_FILE
    data = path.read_bytes()
    keep, cut, offset = 0, 0, 0
    for line in data.splitlines(keepends=True):
        offset += len(line)
        try:
            record = orjson.loads(line) if line.strip() else None
        except orjson.JSONDecodeError:
            record = None  # a torn last line goes with what follows the cut
        later = isinstance(record, dict) and type(record.get("step")) is int \
            and record["step"] > step
        if later:
            cut += 1
        elif not cut:
            keep = offset
    if keep < len(data):
        with open(path, "rb+") as f:
            f.truncate(keep)
            f.flush()
            os.fsync(f.fileno())
    return cut


