"""The workloads every system of `bench/peers.py` trains on: tasks, prompts and rewards.

Standard library only: it is imported by FlexMARL's side (the main `.venv`) and by the peers'
runners (`.venv-peers`, where FlexMARL is not installed). The sums, their train/held-out split,
the prompts and the reward are the default team's (`agents/smol_duo.py`), rebuilt here without
importing FlexMARL; `tests/test_peers.py` checks they are the same.

    sums   one agent ("solver") answers a + b; reward: its last number is the sum
    joint  two agents ("a", "b") each answer the same sum; both get the joint reward
           (right(a) + right(b)) / 2
    duo    the default team: the solver answers, the checker is told the solver's claim and
           answers; each is rewarded for being right
"""
from __future__ import annotations

import random
import re
from dataclasses import dataclass

MAX_OPERAND = 20
HELDOUT_SUMS = 100
SPLIT_SEED = "flexmarl.smol_duo"   # agents/smol_duo.py's split
SYSTEM = "You are good at arithmetic."
_NUMBER = re.compile(r"-?[0-9]+")

WORKLOADS = ("sums", "joint", "duo")
AGENTS = {"sums": ("solver",), "joint": ("a", "b"), "duo": ("solver", "checker")}
"""The agents of each workload, in the order their turns come."""


@dataclass(frozen=True)
class Setting:
    """What every system trains with (the default team's settings)."""

    model: str = ""                 # the converted SmolLM2-135M-Instruct HF directory
    train_layers: int = 6           # the last 6 of 30 blocks and the final norm train
    lr: float = 1e-4                # AdamW(betas=(0.9, 0.999), eps=1e-8, weight_decay=0), constant
    grad_clip: float = 1.0
    group_size: int = 8             # GRPO: samples per prompt
    prompts_per_step: int = 4       # prompts (tasks) per optimizer step, per agent
    temperature: float = 0.7
    max_new_tokens: int = 12
    clip_eps: float = 0.2
    steps: int = 8
    seed: int = 0


@dataclass(frozen=True)
class Sum:
    a: int
    b: int

    @property
    def answer(self) -> str:
        return str(self.a + self.b)

    @property
    def task_id(self) -> str:  # FlexMARL's tasks need one (agents/smol_duo.py's ids)
        return f"sum-{self.a}+{self.b}"


def split() -> tuple[list[Sum], list[Sum]]:
    """(train, held-out): agents/smol_duo.py's 300 training and 100 held-out sums."""
    pairs = [(a, b) for a in range(1, MAX_OPERAND + 1) for b in range(1, MAX_OPERAND + 1)]
    rng = random.Random(SPLIT_SEED)
    rng.shuffle(pairs)
    held, train = pairs[:HELDOUT_SUMS], pairs[HELDOUT_SUMS:]
    return [Sum(a, b) for a, b in train], [Sum(a, b) for a, b in held]


def step_tasks(setting: Setting) -> list[list[Sum]]:
    """The tasks of every step, in order: FlexMARL's data cursor with run.seed = setting.seed
    (flexmarl.orchestrator.orchestrator.task_stream: a fresh seeded order each epoch), so every
    system that lets us choose trains on the same tasks in the same steps."""
    train, _ = split()
    rng = random.Random(setting.seed)
    stream: list[Sum] = []
    n = setting.prompts_per_step
    while len(stream) < n * setting.steps:
        order = list(range(len(train)))
        rng.shuffle(order)
        stream += [train[i] for i in order]
    return [stream[s * n:(s + 1) * n] for s in range(setting.steps)]


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


def joint_reward(text_a: str, text_b: str, task: Sum) -> float:
    return (right(text_a, task) + right(text_b, task)) / 2
