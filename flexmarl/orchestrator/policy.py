"""Pipeline policies: when each agent's rollout, training and weight sync may happen (pure).

Every mode is the same loop (flexmarl.orchestrator.loop) with different settings of four knobs:

    mode          stream  lag  team_barrier  defer_sync  staleness of trained samples
    sync          no      0    yes           no          exactly 0
    micro_batch   yes     0    no            no          exactly 0 (the paper's mode)
    one_step_off  yes     1    no            yes         exactly 1 (0 in the first step)
    bounded       yes     k    no            no          0..k, enforced per sample, with a
                                                          truncated importance weight

`PipelinePolicy.admit` is the one place the staleness rule is decided; TrainSession asks it for
every sample it trains.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from flexmarl.orchestrator.agents import StalenessError


@dataclass(frozen=True)
class PipelinePolicy:
    """When rollout, training and weight sync of each agent happen (see the module docstring)."""

    name: str
    stream: bool
    """Train micro-batches of a step while the step is still being generated."""
    lag: int
    """Steps an agent's rollout may run ahead of its last finished update."""
    team_barrier: bool
    """A step's rollout starts only when every agent has finished the previous step."""
    defer_sync: bool
    """Push an update only when the next step's rollout has ended (one version stale, exactly)."""
    max_staleness: int = 0
    drop_stale: bool = False
    """Beyond max_staleness: drop the sample (bounded) instead of failing (strict modes)."""

    def admit(self, staleness: int, step: int) -> bool:
        """May a sample `staleness` versions old be trained in global step `step`?"""
        if 0 <= staleness <= self.max_staleness:
            return True
        if self.drop_stale and staleness > self.max_staleness:
            return False
        raise StalenessError(f"pipeline {self.name}: a sample {staleness} versions old reached "
                             f"the trainer in step {step}; this mode trains samples at most "
                             f"{self.max_staleness} versions old")


def sync_policy() -> PipelinePolicy:
    return PipelinePolicy("sync", stream=False, lag=0, team_barrier=True, defer_sync=False)


def micro_batch_policy() -> PipelinePolicy:
    return PipelinePolicy("micro_batch", stream=True, lag=0, team_barrier=False, defer_sync=False)


def one_step_off_policy() -> PipelinePolicy:
    # 0 is legitimate too: after a step with no update (no learning signal) nothing is older.
    return PipelinePolicy("one_step_off", stream=True, lag=1, team_barrier=False, defer_sync=True,
                          max_staleness=1)


def bounded_policy(max_staleness: int) -> PipelinePolicy:
    if max_staleness < 1:
        raise ValueError(f"pipeline.max_staleness must be >= 1 for mode 'bounded' (0 is mode "
                         f"'micro_batch'), got {max_staleness}")
    return PipelinePolicy("bounded", stream=True, lag=max_staleness, team_barrier=False,
                          defer_sync=False, max_staleness=max_staleness, drop_stale=True)


PIPELINES: dict[str, Callable[..., PipelinePolicy]] = {
    "sync": sync_policy, "micro_batch": micro_batch_policy,
    "one_step_off": one_step_off_policy, "bounded": bounded_policy}



def make_pipeline(mode: str, *, max_staleness: int = 1) -> PipelinePolicy:
    if mode not in PIPELINES:
        raise ValueError(f"pipeline.mode {mode!r} is not one of {sorted(PIPELINES)}")
    return bounded_policy(max_staleness) if mode == "bounded" else PIPELINES[mode]()
