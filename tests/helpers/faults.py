"""The fault tests' runs (tests/test_faults.py; tests/test_time_shared.py and tests/test_ray.py
run them too): the duo team for STEPS steps (sync pipeline, 2 instances per agent), a fault
injected once the run's dashboard is up, the run without a fault (fault_free_run: conftest.py's
session fixture `fault_free`), and what a run with a fault must keep (_assert_nothing_lost)."""
from __future__ import annotations

import asyncio
import os
import random
import signal
from pathlib import Path

import pytest
from safetensors.torch import load_file

from flexmarl.config.load import load_config
from flexmarl.launch.run import train
from flexmarl.observe.rundir import RunDir
from tests.helpers.numerics import MIXED_REL_TOL, relative_distance
from tests.helpers.teams import duo
from tests.helpers.workers import running_workers

WEIGHT_REL_TOL = MIXED_REL_TOL
"""Final weights against a fault-free run's, as tests/test_trainer.py's relative_distance (the
distance between the two over the distance training moved them): re-sent requests complete in
another order, so the same groups reach the trainer in another order, and float sums differ in
the last bits, which AdamW's normalised step turns into up to lr-scale changes of its tiniest
components. A max-abs bound (lr / 100, used here before) was seen broken by such a component
(1.02e-5) in a run that lost nothing; the distance ratio is the measure test_pipeline and
test_trainer use for the same effect."""
STEPS = 5


def _config(tmp_path: Path, name: str, *extra: str):
    return load_config(overrides=[
        f"run.dir={tmp_path / name}", f"run.steps={STEPS}", "rollout.backend=torch",
        "rollout.instances_per_agent=2", "pipeline.mode=sync", "pipeline.tasks_per_step=8",
        "pipeline.trajectories_per_task=2", "pipeline.micro_batch_groups=2", "trainer.lr=1e-3",
        "observe.tensorboard=false", "observe.report=false", *extra])


async def _run(model_dir: str, config, fault=None, team=None):
    url: asyncio.Future = asyncio.get_running_loop().create_future()
    team = team if team is not None else duo(model_dir)
    run = asyncio.create_task(train(team, config, run_dir=RunDir.create(config),
                                    progress=False, on_dashboard=url.set_result))
    if fault is not None:
        injected = asyncio.create_task(fault(await url, run))
        result = await run
        return result, await injected
    return await run, None


async def _steps_done(base: str) -> int:
    import aiohttp
    async with aiohttp.ClientSession() as http:
        async with http.get(base + "api/status") as r:
            return (await r.json())["run"]["steps_done"]


def _weights(result) -> dict:
    return {name: load_file(str(path / "model.safetensors"))
            for name, path in result.checkpoints.items()}


def fault_free_run(model_dir: str, tmp: Path):
    """The faults' runs without a fault (conftest.py's session fixture `fault_free`, which
    tests/test_ray.py compares with too), on its own event loop."""
    result, _ = asyncio.run(_run(model_dir, _config(tmp, "run")))
    return result


def _random_kill(rng: random.Random, prefix: str, max_delay_s: float):
    """A fault for _run: once step 0 is done, after a random delay, SIGKILL a random worker
    whose name starts with `prefix`; returns its name."""
    async def kill(base: str, run: asyncio.Task) -> str:
        while await _steps_done(base) < 1:
            await asyncio.sleep(0.02)
        await asyncio.sleep(rng.uniform(0.0, max_delay_s))
        victim = rng.choice(sorted(n for n in running_workers() if n.startswith(prefix)))
        os.kill(running_workers()[victim], signal.SIGKILL)
        return victim
    return kill


def _assert_same_weights(result, reference, model_dir: str) -> None:
    """Each agent's final weights within WEIGHT_REL_TOL of the reference run's, relative to how
    far the reference moved from `model_dir`, where both runs' agents started."""
    ours, theirs = _weights(result), _weights(reference)
    start = load_file(str(Path(model_dir) / "model.safetensors"))
    for name in ours:
        distance = relative_distance(theirs[name], ours[name], start)
        assert distance <= WEIGHT_REL_TOL, (name, distance)


def _assert_nothing_lost(result, reference, model_dir: str) -> None:
    assert [m["step"] for m in result.metrics] == list(range(STEPS))
    for m, ref in zip(result.metrics, reference.metrics):
        for name in ("solver", "checker"):
            assert m["agents"][name]["samples"] == ref["agents"][name]["samples"]
            assert m["agents"][name]["trained_samples"] == ref["agents"][name]["trained_samples"]
        # The same samples, seed for seed (the mean sums them in completion order).
        assert m["team_reward"] == pytest.approx(ref["team_reward"], rel=1e-12)
    _assert_same_weights(result, reference, model_dir)
