"""Pipeline policies: when rollout, training and weight sync of each agent happen.

One interface, one training loop (`flexmarl.run.train` calls `run_step` once per global step);
each mode is a small policy object over the orchestrator's three operations:

    sync:  rollout(whole global batch, all agents) ─► train(every agent) ─► sync(every agent)

Later modes (one_step_off, micro_batch, bounded) plug in here without a second loop.
"""
from __future__ import annotations

import asyncio
import time
from typing import Any, Protocol

from flexmarl.orchestrator import Orchestrator, TrainResult


class PipelinePolicy(Protocol):
    name: str

    async def run_step(self, orch: Orchestrator, step: int, tasks: list[Any]) -> dict:
        """Run one global step on `tasks`; return its metrics record."""
        ...


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


class SyncPipeline:
    """The synchronous baseline: generate the whole batch, then train, then sync."""

    name = "sync"

    async def run_step(self, orch: Orchestrator, step: int, tasks: list[Any]) -> dict:
        started = time.perf_counter()
        rollout = await orch.rollout(step, tasks)
        agents = orch.trainable

        async def train(agent: str) -> TrainResult | None:
            return await orch.train(agent, await orch.drain_groups(agent))

        trained = dict(zip(agents, await asyncio.gather(*(train(a) for a in agents))))
        stepped = [a for a in agents if trained[a] is not None]
        synced = dict(zip(stepped, await asyncio.gather(*(orch.sync(a) for a in stepped))))
        record: dict[str, Any] = {
            "step": step, "mode": self.name, "step_s": time.perf_counter() - started,
            "rollout_s": rollout.seconds, "team_reward": _mean(rollout.team_rewards),
            "tasks": len(tasks), "agents": {}}
        for name, rt in orch.agents.items():
            result = trained.get(name)
            record["agents"][name] = {
                "reward": _mean(rollout.rewards.get(name, [])),
                "samples": rollout.samples.get(name, 0),
                "tokens": rollout.tokens.get(name, 0),
                "trained_samples": result.samples if result else 0,
                "groups": result.groups if result else 0,
                "loss": result.loss if result else None,
                "train_s": result.seconds if result else 0.0,
                "sync_s": synced[name][1] if name in synced else 0.0,
                "sync_bytes": synced[name][2] if name in synced else 0,
                "version": rt.version,
                "staleness": result.staleness if result else None,
                "trainable": rt.spec.trainable,
            }
        return record


PIPELINES = {SyncPipeline.name: SyncPipeline}


def make_pipeline(mode: str) -> PipelinePolicy:
    try:
        return PIPELINES[mode]()
    except KeyError:
        raise ValueError(f"pipeline.mode {mode!r} is not one of {sorted(PIPELINES)}") from None
