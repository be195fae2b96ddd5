"""Team API: validation, loading team files by path, model resolution errors, the workflow ctx."""
from __future__ import annotations

import sys

import pytest

from flexmarl import AgentSpec, Team, load_team
from flexmarl.orchestrator.orchestrator import task_stream
from flexmarl.launch.model_dirs import resolve_model
from flexmarl.tasks import addition_tasks


async def noop(ctx, task) -> None:
    return None


def test_default_team_file_loads():
    team = load_team("agents/math_duo.py")
    assert team.name == "math_duo" and [a.name for a in team.agents] == ["solver", "checker"]
    assert team.agent("solver").model != team.agent("checker").model  # different sizes


def test_team_validation_names_the_problem():
    agent = AgentSpec(name="a", model="tiny")
    with pytest.raises(ValueError, match="unique"):
        Team(name="t", agents=[agent, AgentSpec(name="a", model="tiny")], workflow=noop,
             tasks=[1])
    with pytest.raises(TypeError, match="async def workflow"):
        Team(name="t", agents=[agent], workflow=lambda ctx, task: None, tasks=[1])
    with pytest.raises(ValueError, match="every agent is frozen"):
        Team(name="t", agents=[AgentSpec(name="a", model="tiny", trainable=False)],
             workflow=noop, tasks=[1])
    with pytest.raises(ValueError, match="AgentSpec.name"):
        AgentSpec(name="bad name", model="tiny")
    with pytest.raises(KeyError, match="no agent 'b'"):
        Team(name="t", agents=[agent], workflow=noop, tasks=addition_tasks(1)).agent("b")


def test_load_team_errors(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        load_team(tmp_path / "missing.py")
    (tmp_path / "empty.py").write_text("x = 1\n")
    with pytest.raises(ValueError, match="must define `team"):
        load_team(tmp_path / "empty.py")


def test_missing_model_path_is_one_clear_error(tmp_path):
    with pytest.raises(ValueError, match="agent solver: model .* neither a built-in size"):
        resolve_model(AgentSpec(name="solver", model=str(tmp_path / "no-such-model")))


def test_task_stream_is_a_seeded_epoch_cursor():
    tasks = addition_tasks(10, seed=1)
    first = [next(s) for s in [task_stream(tasks, 7)] for _ in range(20)]
    again = [next(s) for s in [task_stream(tasks, 7)] for _ in range(20)]
    assert first == again
    assert sorted(t.task_id for t in first[:10]) == sorted(t.task_id for t in tasks)


async def test_orchestrator_is_an_actor_that_owns_the_cursor():
    from flexmarl.orchestrator.orchestrator import Orchestrator
    from flexmarl.config.pipeline import PipelineConfig
    from flexmarl.orchestrator.store import ExperienceStore
    from runtime.protocol import Ping, Pong
    from runtime.transport import connect

    team = Team(name="t", agents=[AgentSpec(name="a", model="tiny")], workflow=noop,
                tasks=addition_tasks(5, seed=2))
    orch = Orchestrator(team, {}, ExperienceStore([]), None, PipelineConfig(
        trajectories_per_task=2, max_concurrent_tasks=1, max_concurrent_calls=1,
        micro_batch_groups=1), seed=4)
    async with orch.serving(), connect(orch.address) as conn:
        assert await conn.request(Ping(3)) == Pong(3)
        assert orch.next_tasks(7) == [next(s) for s in [task_stream(list(team.tasks), 4)]
                                      for _ in range(7)]


class ScriptedContext:
    """A workflow ctx that answers each agent from a script and records prompts and rewards."""

    def __init__(self, **answers: list[str]) -> None:
        self.answers = {agent: list(texts) for agent, texts in answers.items()}
        self.calls: list[tuple[str, str]] = []
        self.rewards: list[tuple[str, float]] = []
        self.team: float | None = None

    async def generate(self, agent, prompt, n=1, **sampling):
        from flexmarl.team import Completion
        self.calls.append((agent, prompt))
        text = self.answers[agent].pop(0)
        return [Completion(agent, text, [], [], 0, "stop", [], f"{agent}-{len(self.calls)}")]

    def reward(self, completion, value):
        self.rewards.append((completion.agent, value))

    def team_reward(self, value):
        self.team = value


def test_the_real_model_team_file():
    """agents/smol_duo.py: two SmolLM2 copies; held-out sums never trained on; right means the
    last number is the sum."""
    team = load_team("agents/smol_duo.py")
    assert [(a.name, a.model, a.train_layers) for a in team.agents] == [
        ("solver", "smollm2-135m", 6), ("checker", "smollm2-135m", 6)]
    train = {(t.a, t.b) for t in team.tasks}
    held = {(t.a, t.b) for t in team.heldout}
    assert len(train) == 300 and len(held) == 100 and not train & held
    right = sys.modules[team.workflow.__module__].right
    task = team.heldout[1]
    assert right(f"{task.a} + {task.b} = {task.a + task.b}", task) == 1.0
    assert right(f"{task.a + task.b}, since {task.a} + {task.b}", task) == 0.0


async def test_the_real_model_team_workflow():
    """The solver answers, the checker is told its claim and answers: every turn is rewarded
    for being right, and the team reward is the checker's answer (the team's output)."""
    team = load_team("agents/smol_duo.py")
    task = team.tasks[0]
    s = task.a + task.b
    ctx = ScriptedContext(solver=[f"{s + 1}"], checker=[f"{task.a} + {task.b} = {s}"])
    await team.workflow(ctx, task)
    assert [a for a, _ in ctx.calls] == ["solver", "checker"]
    assert f"= {s + 1}" in str(ctx.calls[1][1])  # the checker is told the claim
    assert ctx.rewards == [("solver", 0.0), ("checker", 1.0)] and ctx.team == 1.0
    agreed = ScriptedContext(solver=[f"{s + 2}"], checker=[f"{s + 2}"])
    await team.workflow(agreed, task)  # a wrong claim repeated: the team is wrong
    assert agreed.rewards == [("solver", 0.0), ("checker", 0.0)] and agreed.team == 0.0
    silent = ScriptedContext(solver=["I think"], checker=[f"{s}"])
    await team.workflow(silent, task)  # no number: the checker is asked the plain sum
    assert "student" not in str(silent.calls[1][1]) and silent.team == 1.0
