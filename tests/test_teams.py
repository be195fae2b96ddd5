"""The built-in teams of agents/ beyond the default: their rewards on known answers (a scripted
ctx, the real sandbox) and each one end to end on real processes with the tiny model."""
from __future__ import annotations

import asyncio
import dataclasses
import types
from pathlib import Path

import pytest

from flexmarl.team import load_team

AGENTS = Path(__file__).resolve().parents[1] / "agents"


class ScriptedCtx:
    """A workflow's ctx whose agents answer from `script` (agent -> list of texts, in turn)."""

    def __init__(self, script: dict[str, list[str]]) -> None:
        self.script = {a: list(t) for a, t in script.items()}
        self.rewards: list[tuple[str, float]] = []
        self.team: float | None = None

    async def generate(self, agent, prompt, **_):
        return [types.SimpleNamespace(agent=agent, text=self.script[agent].pop(0),
                                      prompt=prompt)]

    def reward(self, completion, value):
        self.rewards.append((completion.agent, value))

    def team_reward(self, value):
        self.team = value


def test_every_code_task_has_a_right_and_a_wrong_function_its_tests_tell_apart():
    from flexmarl.rewards import run_python

    team = load_team(AGENTS / "code_pair.py")

    async def check():
        for task in [*team.tasks, *team.heldout]:
            right = await run_python(task.reference, tests=task.tests)
            wrong = await run_python(task.wrong, tests=task.tests)
            assert right.passed and not wrong.passed, (task.name, right, wrong)
    asyncio.run(check())
    assert {t.task_id for t in team.tasks}.isdisjoint(t.task_id for t in team.heldout)


def test_code_pair_rewards_a_working_coder_and_a_discriminating_tester():
    module = load_team(AGENTS / "code_pair.py")
    task = module.tasks[0]  # add(a, b)
    good = ScriptedCtx({"coder": [f"```python\n{task.reference}```"],
                        "tester": ["assert add(1, 2) == 3\nassert add(0, 0) == 0"]})
    asyncio.run(module.workflow(good, task))
    assert good.rewards == [("coder", 1.1), ("tester", 1.1)] and good.team == 1.0
    # A tester whose asserts also pass the wrong function catches nothing; a coder that
    # writes no function gets nothing.
    weak = ScriptedCtx({"coder": ["print(1)"], "tester": ["assert add(0, 0) == 0"]})
    asyncio.run(module.workflow(weak, task))
    assert weak.rewards == [("coder", 0.0), ("tester", 0.1)] and weak.team == 0.0
    hostile = ScriptedCtx({"coder": ["import os\nos.fork()\ndef add(a, b):\n    return a + b"],
                           "tester": ["while True: pass"]})
    asyncio.run(module.workflow(hostile, task))  # the sandbox's refusals are rewards of 0
    assert hostile.rewards[0] == ("coder", 0.0) and hostile.team == 0.0


def test_propose_verify_rewards_judging_not_agreeing():
    team = load_team(AGENTS / "propose_verify.py")
    task = team.tasks[0]
    wrong = str(int(task.answer) + 1)
    # Wrong and rejected, then right and accepted: both verdicts right.
    ctx = ScriptedCtx({"proposer": [wrong, task.answer], "verifier": ["no", "yes"]})
    asyncio.run(team.workflow(ctx, task))
    assert ctx.rewards == [("proposer", 0.0), ("verifier", 1.0), ("proposer", 1.0),
                           ("verifier", 1.0)] and ctx.team == 1.0
    # Wrong and accepted: the verifier is wrong, the team fails; digits are verdicts too.
    ctx = ScriptedCtx({"proposer": [wrong], "verifier": ["1"]})
    asyncio.run(team.workflow(ctx, task))
    assert ctx.rewards == [("proposer", 0.0), ("verifier", 0.0)] and ctx.team == 0.0
    assert len(team.tasks) == 350 and len(team.heldout) == 50
    verdict = team.workflow.__globals__["verdict"]
    assert [verdict(t) for t in ("Yes!", "no.", " 1", "0", "10", "maybe")] == \
        ["yes", "no", "yes", "no", None, None]


def test_smol_trio_rewards_each_right_answer_and_takes_the_judges():
    """agents/smol_trio.py: three adapters on one SmolLM2 base; each turn is rewarded for being
    right, and the judge's answer is the team's."""
    team = load_team(AGENTS / "smol_trio.py")
    task = team.tasks[0]
    right, wrong = task.answer, str(int(task.answer) + 1)
    ctx = ScriptedCtx({"solver": [f"{task.a} + {task.b} = {wrong}"], "checker": [right],
                       "judge": [f"The answer is {right}."]})
    asyncio.run(team.workflow(ctx, task))
    assert ctx.rewards == [("solver", 0.0), ("checker", 1.0), ("judge", 1.0)] and ctx.team == 1.0
    assert ctx.script == {"solver": [], "checker": [], "judge": []}  # each asked once
    assert {a.lora.rank for a in team.agents} == {16} and len(team.heldout) == 100


@pytest.mark.slow
@pytest.mark.parametrize("name", ["code_pair", "propose_verify", "gym_duo"])
async def test_each_team_runs_end_to_end_and_is_evaluated(name, tiny_model_dir, tmp_path,
                                                          no_leftover_children):
    """Two steps on real processes with the tiny model in place of the built-in ones (which
    take minutes to warm-start on a fresh machine), evaluated on a few held-out tasks between
    the steps and at the end."""
    from flexmarl.config.load import load_config
    from flexmarl.launch.run import train
    from flexmarl.observe.rundir import RunDir

    team = load_team(AGENTS / f"{name}.py")
    team = dataclasses.replace(team, agents=[dataclasses.replace(  # (the tiny model has 2 blocks)
        a, model=tiny_model_dir, warm_start_steps=None, train_layers=None) for a in team.agents])
    config = load_config(overrides=[
        f"run.dir={tmp_path / 'run'}", "run.steps=2", "rollout.backend=torch",
        f"team.path={AGENTS / f'{name}.py'}", "pipeline.tasks_per_step=2",
        "pipeline.trajectories_per_task=2", "eval.every_steps=1", "eval.tasks=2",
        "eval.final_tasks=2", "observe.report=false"])
    result = await asyncio.wait_for(train(team, config, run_dir=RunDir.create(config),
                                          progress=False), 300)
    assert [r["step"] for r in result.metrics] == [0, 1]
    assert all(r["failed_trajectories"] == 0 for r in result.metrics)
    assert result.metrics[0]["eval"]["tasks"] == 2 and result.final_eval["failed"] == 0
    assert set(result.final_eval["agents"]) == {a.name for a in team.agents}
