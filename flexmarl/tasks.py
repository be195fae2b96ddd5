"""Built-in task data and rewards: n-digit addition, deterministic by seed.

A `Task` is what the orchestrator hands a team: the user-turn text (no chat formatting; the
model layer applies the chat template), the reference answer, and an id that groups samples of
the same task. Prompts and answers use printable ASCII only, which the character tokenizer in
`flexmarl.models` covers.
"""
from __future__ import annotations

import random
import re
from dataclasses import dataclass

MAX_DIGITS = 9
"""Largest operand width `addition_tasks` accepts; wider sums would outgrow the short prompts
the built-in models are trained on."""

# ASCII digits only: `\d` would also match Unicode digits such as Arabic-Indic ones.
_FIRST_NUMBER = re.compile(r"-?[0-9]+")


@dataclass(frozen=True)
class Task:
    """One prompt with its reference answer."""

    prompt: str
    """User-turn text, e.g. "Compute 37+45." (no chat template applied)."""
    answer: str
    """Reference answer as the model should write it, e.g. "82"."""
    task_id: str
    """Unique within one `addition_tasks` call and across seeds, e.g. "add2-s0-17"."""


def addition_tasks(n: int, *, seed: int = 0, digits: int = 2) -> list[Task]:
    """`n` addition problems "Compute a+b." with answer "a+b", both operands `digits` wide.

    Operands are drawn independently (with replacement) from a private RNG seeded by `seed`, so
    the same arguments give the same list in any process and the global `random` state is
    untouched. For digits=1 the operands are 0-9; otherwise they have no leading zero.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"n must be an int >= 0 (the number of tasks), got {n!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"seed must be an int, got {seed!r}")
    if isinstance(digits, bool) or not isinstance(digits, int) or not 1 <= digits <= MAX_DIGITS:
        raise ValueError(f"digits must be an int in 1..{MAX_DIGITS}, got {digits!r}")
    low = 0 if digits == 1 else 10 ** (digits - 1)
    high = 10**digits - 1
    rng = random.Random(f"flexmarl.addition:{digits}:{seed}")
    tasks = []
    for i in range(n):
        a, b = rng.randint(low, high), rng.randint(low, high)
        tasks.append(Task(prompt=f"Compute {a}+{b}.", answer=str(a + b),
                          task_id=f"add{digits}-s{seed}-{i}"))
    return tasks


def exact_match(completion_text: str, task: Task) -> float:
    """1.0 if the first integer in the completion is exactly `task.answer`, else 0.0.

    Only the first number counts, so echoing the question ("37+45=82") earns nothing; "082" is
    not "82". Any string is accepted (empty, binary junk, huge); a non-string is a caller bug.
    """
    if not isinstance(completion_text, str):
        raise TypeError(f"completion_text must be the decoded completion (str), "
                        f"got {type(completion_text).__name__}; decode token ids first")
    match = _FIRST_NUMBER.search(completion_text)
    return 1.0 if match is not None and match.group() == task.answer else 0.0
