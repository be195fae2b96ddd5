"""Default team: a solver and a checker of different sizes on 2-digit addition.

Per trajectory, the checker ("tiny") works the sum out once; the solver ("small") answers and
is accepted when it agrees with the checker, otherwise it tries again, up to MAX_ATTEMPTS times.
So the solver is called 1-3 times per checker call, and more when the checker is wrong: the skew
between agents and the long tail of multi-turn workflows.

Rewards: the checker's own goal is to be right (exact match); the solver's turns get the team
reward, the final outcome: 1 if an accepted answer is correct, else 0.
"""
from __future__ import annotations

import re

from flexmarl import AgentSpec, SamplingParams, Team
from flexmarl.tasks import addition_tasks, exact_match

MAX_ATTEMPTS = 3
NUM_TASKS = 4096
_NUMBER = re.compile(r"-?[0-9]+")


def first_number(text: str) -> str | None:
    match = _NUMBER.search(text)
    return match.group() if match else None


async def workflow(ctx, task) -> None:
    [reference] = await ctx.generate("checker", task.prompt)
    ctx.reward(reference, exact_match(reference.text, task))
    expected = first_number(reference.text)
    outcome = 0.0
    for _ in range(MAX_ATTEMPTS):
        [answer] = await ctx.generate("solver", task.prompt)
        if expected is not None and first_number(answer.text) == expected:
            outcome = exact_match(answer.text, task)
            break
    ctx.team_reward(outcome)


team = Team(
    name="math_duo",
    agents=[
        AgentSpec(name="solver", model="small",
                  sampling=SamplingParams(temperature=1.0, max_tokens=8)),
        AgentSpec(name="checker", model="tiny",
                  sampling=SamplingParams(temperature=1.0, max_tokens=8)),
    ],
    workflow=workflow,
    tasks=addition_tasks(NUM_TASKS, seed=0),
)
