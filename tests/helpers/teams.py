"""The test team: "duo", a solver and a checker on one model directory (the team of
tests/test_e2e.py, which most whole-run tests train), its workflow and its reward; and
`write_team`, a loadable team file of one tiny agent (the config and CLI tests)."""
from __future__ import annotations

from pathlib import Path

from flexmarl import AgentSpec, SamplingParams, Team
from flexmarl.tasks import addition_tasks


def varied(completion) -> float:
    """A reward that varies even for an untrained model, so GRPO groups carry a signal."""
    ids = completion.token_ids
    return sum(t % 2 for t in ids) / max(len(ids), 1)


async def duo_workflow(ctx, task) -> None:
    [reference] = await ctx.generate("checker", task.prompt)
    ctx.reward(reference, varied(reference))
    answers = await ctx.generate("solver", task.prompt, n=2)
    ctx.team_reward(max(varied(a) for a in answers))


def duo(model_dir: str, train_layers: int | None = None, solver_instances: int | None = None,
        **sampling) -> Team:
    return Team(name="duo", workflow=duo_workflow, tasks=addition_tasks(64, seed=3), agents=[
        AgentSpec(name="solver", model=model_dir, train_layers=train_layers,
                  instances=solver_instances, sampling=SamplingParams(max_tokens=6, **sampling)),
        AgentSpec(name="checker", model=model_dir, sampling=SamplingParams(max_tokens=6))])


TEAM_SOURCE = """
from flexmarl import AgentSpec, Team
from flexmarl.tasks import addition_tasks

async def workflow(ctx, task):
    [answer] = await ctx.generate("solver", task.prompt)
    ctx.reward(answer, 1.0)

team = Team(name="carrier", agents=[AgentSpec(name="solver", model="tiny")], workflow=workflow,
            tasks=addition_tasks(8){team_kwargs})
"""


def write_team(tmp_path: Path, config: str = "", team_kwargs: str = "",
               name: str = "carrier.py") -> str:
    """A loadable team file of one tiny agent; `config` is module-level source (e.g.
    'config = {...}'), `team_kwargs` more Team(...) arguments (', config=...')."""
    path = tmp_path / name
    path.write_text(TEAM_SOURCE.format(team_kwargs=team_kwargs) + config + "\n")
    return str(path)
