"""Whole `train()` runs of the pipeline tests (tests/test_pipeline.py; tests/test_time_shared.py
and tests/test_ray.py run the same): a run's config by pipeline mode (3 steps, torch rollout),
the run itself, and a step record's staleness histogram."""
from __future__ import annotations

import asyncio
from pathlib import Path

from flexmarl import Team
from flexmarl.config.load import load_config
from flexmarl.launch.run import train
from flexmarl.observe.rundir import RunDir


def config(tmp_path: Path, mode: str, *extra: str):
    return load_config(overrides=[
        f"run.dir={tmp_path / mode}", "run.steps=3", "rollout.backend=torch",
        f"pipeline.mode={mode}", "pipeline.tasks_per_step=4", "pipeline.trajectories_per_task=2",
        "pipeline.max_concurrent_tasks=2", "pipeline.micro_batch_groups=2", "trainer.lr=1e-3",
        *extra])


async def run(team: Team, cfg):
    run_dir = RunDir.create(cfg)
    return await asyncio.wait_for(train(team, cfg, run_dir=run_dir, progress=False), 300)


def hist(record: dict, agent: str) -> dict[int, int]:
    return {int(k): v for k, v in record["agents"][agent]["staleness_hist"].items()}
