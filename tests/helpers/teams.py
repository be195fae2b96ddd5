"""The test team: "duo", a solver and a checker on one model directory (the team of
tests/test_e2e.py, which most whole-run tests train), its workflow and its reward."""
from __future__ import annotations

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
