"""Resume: a run whose every process was SIGKILLed goes on with `flexmarl run --resume RUN_DIR`.

The killed run is a real `flexmarl run` process (with its rollout and trainer workers) killed
at a seeded random point after its second step record; the resumed run (the same command with
--resume) must end with every step recorded once, the same team rewards step by step, and the
same final weights as an uninterrupted run, within WEIGHT_ATOL. The states are written in the
background (tests/test_pipeline.py checks the ordering): a run killed while one is being written
resumes the same way; a write that fails stops the run naming its dir; a trainer killed between
its weight push and its snapshot re-trains the step and the run equals an uninterrupted one.
"""
from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch
from safetensors.torch import load_file

from flexmarl.launch.checkpoint import StateCheckpoints
from flexmarl.config.load import load_config
from flexmarl.protocol import TrainState
from flexmarl.observe.rundir import read_metrics

ROOT = Path(__file__).resolve().parent.parent
STEPS = 5
LR = 1e-3
WEIGHT_ATOL = LR / 10
"""Largest difference of one weight from the uninterrupted run's. Groups may reach the trainer in
another order after a restart: gradient sums differ in their last bits (~1e-7 relative), and
AdamW divides by sqrt(v) + 1e-8, so where a gradient is the near-cancelling sum of larger terms
(|g| near 1e-8) that noise moves the update by a visible part of lr (observed 1.65e-5 = lr / 60
in CI; 3.6e-6 and 8.8e-8 in a rerun here). A lost, doubled or stale group moves nearly every
weight by ~lr: the mean difference (WEIGHT_MEAN_ATOL) is what catches it."""
WEIGHT_MEAN_ATOL = LR / 10_000
"""Mean absolute difference over all weights: reordering noise touches a handful of weights
(observed means 1.3e-9 and 9.6e-11)."""


def _setup(tmp_path: Path, model_dir: str, name: str, *extra: str) -> tuple[Path, Path]:
    """A config file and a team file (the duo team of tests/helpers/teams.py on `model_dir`)."""
    team = tmp_path / "team.py"
    # loaded by `python -m flexmarl.launch.cli` run from ROOT, where tests.helpers imports
    team.write_text(f"from tests.helpers.teams import duo\nteam = duo({model_dir!r})\n")
    config = load_config(overrides=[
        f"run.dir={tmp_path / name}", f"run.steps={STEPS}", "rollout.backend=torch",
        "pipeline.mode=micro_batch", "pipeline.tasks_per_step=8",
        "pipeline.trajectories_per_task=2", "pipeline.micro_batch_groups=2", f"trainer.lr={LR}",
        "observe.dashboard=false", "observe.tensorboard=false", "observe.report=false",
        f"team.path={team}", *extra])
    path = tmp_path / f"{name}.toml"
    path.write_text(config.to_toml())
    return path, tmp_path / name


def _flexmarl(*args: str, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "flexmarl.launch.cli", *args], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            **kwargs)


def _finish(proc: subprocess.Popen, timeout: float = 300) -> str:
    out, _ = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, out
    return out


def _final_weights(run_dir: Path) -> dict[str, dict]:
    out = {}
    for agent_dir in sorted((run_dir / "checkpoints").iterdir()):
        last = max(agent_dir.iterdir(), key=lambda p: int(p.name.split("-")[1]))
        out[agent_dir.name] = load_file(str(last / "model.safetensors"))
    return out


def _wait_for_records(proc: subprocess.Popen, metrics: Path, count: int) -> None:
    """Until the running `proc` has written `count` step records (300 s: a loaded machine
    takes seconds per step of this tiny run)."""
    deadline = time.monotonic() + 300
    while not (metrics.exists() and len(read_metrics(metrics)) >= count):
        assert proc.poll() is None, proc.communicate()[0]
        assert time.monotonic() < deadline, f"the run did not record {count} steps in 300 s"
        time.sleep(0.02)


def _kill_everything(proc: subprocess.Popen) -> int:
    """SIGKILL the run and all its workers at once (as a node losing power would)."""
    victims = [proc.pid] + [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
    for pid in victims:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.communicate(timeout=30)
    return len(victims)


@pytest.fixture(scope="module")
def uninterrupted(tiny_model_dir, tmp_path_factory) -> Path:
    config, run_dir = _setup(tmp_path_factory.mktemp("clean"), tiny_model_dir, "run")
    _finish(_flexmarl("run", str(config)))
    return run_dir


@pytest.mark.slow
@pytest.mark.parametrize("seed", [3])
def test_a_killed_run_resumes_to_the_same_weights(tiny_model_dir, tmp_path, uninterrupted, seed):
    rng = random.Random(seed)
    config, run_dir = _setup(tmp_path, tiny_model_dir, "run")
    proc = _flexmarl("run", str(config))
    metrics = run_dir / "metrics.jsonl"
    _wait_for_records(proc, metrics, 2)
    time.sleep(rng.uniform(0.0, 1.0))  # somewhere in step 2 or 3
    assert _kill_everything(proc) >= 5  # the run, 4 rollout instances, 2 trainers (or more)
    done_before = len(read_metrics(metrics))
    assert done_before < STEPS, "the run finished before it could be killed"

    _assert_resumes_like(run_dir, uninterrupted)


@pytest.mark.slow
def test_a_run_saving_every_other_step_resumes_from_its_last_save(tiny_model_dir, tmp_path,
                                                                  uninterrupted):
    """run.save_every = 2 writes the states of steps 1, 3 and 4 (the last). Killed once step
    2 is recorded, the run resumes from step 1's states: step 2 is redone, its record replaced
    (if the kill came after step 3's record, from step 3's states: nothing is redone)."""
    config, run_dir = _setup(tmp_path, tiny_model_dir, "run", "run.save_every=2")
    proc = _flexmarl("run", str(config))
    metrics = run_dir / "metrics.jsonl"
    _wait_for_records(proc, metrics, 3)
    _kill_everything(proc)
    last = read_metrics(metrics)[-1]["step"]
    assert last < STEPS - 1, "the run finished before it could be killed"
    saved = StateCheckpoints(run_dir / "state")
    assert all(s % 2 == 1 for s in saved.steps("solver")), saved.steps("solver")  # 1, 3 only
    out = _assert_resumes_like(run_dir, uninterrupted)
    if last % 2 == 0:  # step `last` was not saved: the resumed run redid it
        assert f"steps {last}-{last} are redone, their 1 records replaced" in out, out


def _assert_weights_like(ours: dict[str, dict], theirs: dict[str, dict]) -> None:
    """Per agent: every weight within WEIGHT_ATOL, their mean within WEIGHT_MEAN_ATOL."""
    for agent in ours:
        diffs = torch.cat([(ours[agent][k] - theirs[agent][k]).abs().flatten()
                           for k in ours[agent]])
        assert diffs.max().item() <= WEIGHT_ATOL, (agent, diffs.max().item())
        assert diffs.mean().item() <= WEIGHT_MEAN_ATOL, (agent, diffs.mean().item())


def _assert_resumes_like(run_dir: Path, uninterrupted: Path) -> str:
    """`flexmarl run --resume run_dir` ends like the uninterrupted run, every step once."""
    metrics = run_dir / "metrics.jsonl"
    out = _finish(_flexmarl("run", "--resume", str(run_dir)))
    assert "(resuming)" in out

    ours, ref = read_metrics(metrics), read_metrics(uninterrupted / "metrics.jsonl")
    assert [m["step"] for m in ours] == list(range(STEPS))  # every step once
    for m, r in zip(ours, ref):
        assert m["team_reward"] == pytest.approx(r["team_reward"], rel=1e-12), m["step"]
        for agent in ("solver", "checker"):
            assert m["agents"][agent]["samples"] == r["agents"][agent]["samples"]
            assert m["agents"][agent]["version"] == r["agents"][agent]["version"]
    a, b = _final_weights(run_dir), _final_weights(uninterrupted)
    assert a.keys() == b.keys() == {"solver", "checker"}
    _assert_weights_like(a, b)
    # Only the last recorded step's states are kept (older ones are pruned as steps complete).
    state = run_dir / "state"
    assert {p.name for p in (state / "solver").iterdir()} == {f"step-{STEPS - 1:06d}"}
    # Nothing of the killed run is left running.
    assert not [p for p in psutil.process_iter(["cmdline"])
                if str(run_dir) in " ".join(p.info["cmdline"] or [])]
    return out


@pytest.mark.slow
def test_a_run_killed_during_a_state_write_resumes(tiny_model_dir, tmp_path, uninterrupted):
    """The trainer ranks write each step's states in the background (sharded, into a temp
    dir that rank 0 renames once every rank's file is in). As soon as a write of step k >= 2
    is seen under way, the whole run is frozen (SIGSTOP, so the write cannot finish) and, if
    the write is still not in place, SIGKILLed: step k has no record and no state; the
    resumed run takes the last complete state, redoes step k and ends like an uninterrupted
    one. (Frozen after the write landed: the run goes on, and the next write is the one.)"""
    config, run_dir = _setup(tmp_path, tiny_model_dir, "run")
    proc = _flexmarl("run", str(config))
    deadline = time.monotonic() + 300

    def writing() -> list[int]:
        return [int(p.name.split("-")[2]) for p in (run_dir / "state").glob("*/.tmp-step-*")
                if int(p.name.split("-")[2]) >= 2]

    while True:
        assert proc.poll() is None, proc.communicate()[0]
        assert time.monotonic() < deadline, "no state write of step >= 2 caught in 300 s"
        if writing():
            tree = [proc.pid] + [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
            for pid in tree:
                os.kill(pid, signal.SIGSTOP)
            if caught := writing():
                break
            for pid in tree:  # it landed in between: on to the next one
                os.kill(pid, signal.SIGCONT)
        time.sleep(0.005)
    _kill_everything(proc)
    step = min(caught)
    assert not [m for m in read_metrics(run_dir / "metrics.jsonl") if m["step"] >= step]
    _assert_resumes_like(run_dir, uninterrupted)


def test_resume_refuses_a_finished_run_and_a_missing_dir(tmp_path):
    proc = _flexmarl("run", "--resume", str(tmp_path / "nope"))
    out, _ = proc.communicate(timeout=180)  # a CLI start (torch import) on a loaded machine
    assert proc.returncode == 2 and "no config.toml there" in out, out

    run_dir = tmp_path / "done"
    run_dir.mkdir()
    config = load_config(overrides=[f"run.dir={run_dir}", "run.steps=2"])
    (run_dir / "config.toml").write_text(config.to_toml())
    (run_dir / "metrics.jsonl").write_text('{"step": 0}\n{"step": 1}\n')
    proc = _flexmarl("run", "--resume", str(run_dir))
    out, _ = proc.communicate(timeout=180)
    assert proc.returncode == 2 and "no state saved at step 1" in out, out

    states = StateCheckpoints(run_dir / "state")
    for agent in ("solver", "checker"):
        states.save(agent, 1, TrainState(agent, 0, {}, {}))
    proc = _flexmarl("run", "--resume", str(run_dir))
    out, _ = proc.communicate(timeout=180)
    assert proc.returncode == 2 and "finished all 2 steps" in out, out


@pytest.mark.slow
async def test_states_are_pruned_only_once_their_record_is_durable(tiny_model_dir, tmp_path,
                                                                  monkeypatch):
    """A kill between pruning and writing the record that allows it would leave a resume point
    without its states (seen once in CI): the record must be on disk first."""
    import asyncio

    from flexmarl.launch.checkpoint import StateCheckpoints
    from flexmarl.observe.rundir import RunDir
    from flexmarl.launch.run import train
    from tests.helpers.teams import duo

    config = load_config(overrides=[
        f"run.dir={tmp_path / 'run'}", "run.steps=3", "rollout.backend=torch",
        "pipeline.tasks_per_step=3", "pipeline.trajectories_per_task=2", "trainer.lr=1e-3",
        "observe.dashboard=false", "observe.tensorboard=false", "observe.report=false"])
    seen, prune = [], StateCheckpoints.prune

    def checking_prune(self, keep_from, keep_every=0):
        recorded = [m["step"] for m in read_metrics(tmp_path / "run" / "metrics.jsonl")]
        seen.append((keep_from, recorded[-1]))
        return prune(self, keep_from, keep_every)

    monkeypatch.setattr(StateCheckpoints, "prune", checking_prune)
    await asyncio.wait_for(train(duo(tiny_model_dir), config, run_dir=RunDir.create(config),
                                 progress=False), 300)
    assert seen == [(0, 0), (1, 1), (2, 2)]


@pytest.mark.slow
def test_a_run_resumes_when_an_agent_never_updated(tiny_model_dir, tmp_path):
    """The checker's reward is constant, so it stays at version 0 (no learning signal); the run
    still resumes (its trainer's version-0 state is what the instances start with: nothing is
    pushed for it), and both the step lines and the summary say it never learnt."""
    team = tmp_path / "flat_team.py"
    team.write_text(
        "from tests.helpers.teams import duo, varied\nfrom flexmarl import Team\n"
        f"base = duo({tiny_model_dir!r})\n\n"
        "async def workflow(ctx, task):\n"
        "    [reference] = await ctx.generate('checker', task.prompt)\n"
        "    ctx.reward(reference, 1.0)  # constant: the checker never has a learning signal\n"
        "    answers = await ctx.generate('solver', task.prompt, n=2)\n"
        "    ctx.team_reward(max(varied(a) for a in answers))\n\n"
        "team = Team(name='flat', agents=base.agents, workflow=workflow, tasks=base.tasks)\n")
    config, run_dir = _setup(tmp_path, tiny_model_dir, "run", f"team.path={team}", "run.steps=1")
    first = _finish(_flexmarl("run", str(config)))
    assert "no learning signal: checker" in first and "never updated: checker" in first
    out = _finish(_flexmarl("run", "--resume", str(run_dir), "--set", "run.steps=2"))
    assert "(resuming)" in out and "stale weight update" not in out
    metrics = read_metrics(run_dir / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [0, 1]
    assert [m["agents"]["checker"]["version"] for m in metrics] == [0, 0]
    assert metrics[-1]["agents"]["solver"]["version"] >= 1


def _in_process_config(tmp_path: Path, *extra: str):
    from flexmarl.observe.rundir import RunDir
    config = load_config(overrides=[
        f"run.dir={tmp_path / 'run'}", "rollout.backend=torch", "pipeline.tasks_per_step=3",
        "pipeline.trajectories_per_task=2", "trainer.lr=1e-3", "observe.dashboard=false",
        "observe.tensorboard=false", "observe.report=false", *extra])
    return config, RunDir.create(config)


@pytest.mark.slow
async def test_a_failing_state_write_fails_the_run_naming_its_path(tiny_model_dir, tmp_path,
                                                                   monkeypatch):
    """The copies into RUN_DIR/state run in the background, but a full disk at step 1 still
    stops the run, with an error naming the agent, the step and its dir; step 1's record is
    never written."""
    import asyncio
    import errno

    from flexmarl.launch.checkpoint import CheckpointError
    from flexmarl.launch.run import train
    from flexmarl.training import state_files
    from tests.helpers.teams import duo

    real = state_files.copyfile

    def full_at_step_1(src, dst):
        if ".tmp-step-000001-" in str(dst):
            raise OSError(errno.ENOSPC, "No space left on device", str(dst))
        return real(src, dst)

    monkeypatch.setattr(state_files, "copyfile", full_at_step_1)
    config, run_dir = _in_process_config(tmp_path, "run.steps=4")
    with pytest.raises(CheckpointError, match=r"agent '(solver|checker)' step 1 \(.*/run/state/"
                                              r"(solver|checker)/step-000001\): cannot write the "
                                              r"state .*No space left on device"):
        await asyncio.wait_for(train(duo(tiny_model_dir), config, run_dir=run_dir,
                                     progress=False), 300)
    assert [m["step"] for m in read_metrics(tmp_path / "run" / "metrics.jsonl")] == [0]


@pytest.mark.slow
async def test_a_trainer_killed_after_its_push_before_its_snapshot(tiny_model_dir, tmp_path,
                                                                   uninterrupted, monkeypatch):
    """The solver's step-2 weights reach its instances (its gate opens), then its trainer is
    SIGKILLed before the step's snapshot lands: the step is re-trained from step 1's snapshot
    on the same groups, so the trainer goes on from the state its instances serve; the run
    equals an uninterrupted one (samples, versions, rewards, final weights)."""
    import asyncio

    from flexmarl.launch.run import train
    from flexmarl.observe.rundir import RunDir
    from flexmarl.training.pool import TrainerPool
    from flexmarl.weights.sync import WeightSync
    from tests.helpers.teams import duo
    from tests.helpers.workers import running_workers

    real_sync, real_snapshot = WeightSync.sync, TrainerPool.save
    pushed, killed, snapshots = asyncio.Event(), [], []

    async def sync(self, agent, version, update):
        out = await real_sync(self, agent, version, update)
        if agent == "solver" and version == 3:  # step 2's update
            pushed.set()
        return out

    async def snapshot(self, agent, step, **kwargs):
        if agent == "solver":
            snapshots.append(agent)
            if len(snapshots) == 3:  # step 2's (every step updates: versions 1, 2, 3, ...)
                await asyncio.wait_for(pushed.wait(), 120)
                os.kill(running_workers()["trainer-0-0"], signal.SIGKILL)  # the solver's slot
                killed.append(True)
        return await real_snapshot(self, agent, step, **kwargs)

    monkeypatch.setattr(WeightSync, "sync", sync)
    monkeypatch.setattr(TrainerPool, "save", snapshot)
    path, run_dir = _setup(tmp_path, tiny_model_dir, "run")
    config = load_config(str(path))
    result = await asyncio.wait_for(train(duo(tiny_model_dir), config,
                                          run_dir=RunDir.create(config), progress=False), 300)
    assert killed and len(snapshots) == STEPS + 1  # step 2's taken twice
    ref = read_metrics(uninterrupted / "metrics.jsonl")
    assert [m["step"] for m in result.metrics] == list(range(STEPS))
    assert sum(m["faults"]["trainer"]["restarted_steps"] for m in result.metrics) == 1
    for m, r in zip(result.metrics, ref):
        assert m["team_reward"] == pytest.approx(r["team_reward"], rel=1e-12), m["step"]
        for agent in ("solver", "checker"):
            assert m["agents"][agent]["samples"] == r["agents"][agent]["samples"]
            assert m["agents"][agent]["version"] == r["agents"][agent]["version"]
    a, b = _final_weights(run_dir), _final_weights(uninterrupted)
    _assert_weights_like(a, b)
