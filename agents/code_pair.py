"""Coder + tester: one agent writes a small Python function, the other writes assertions for it.

Per task (a tiny function: its signature and what it does) the coder writes the function and the
tester writes `assert` lines for it, each without seeing the other's answer. Everything runs in
flexmarl.rewards' sandbox (its own process, CPU/memory/time limits, no network):

    coder   1.0 if its function passes the task's hidden call cases (the values it returns are
            judged outside its process: it cannot see them or fake an equal one), + 0.1 for the
            shape of an answer (a `def` of the asked name): a signal for a model that cannot
            code yet
    tester  1.0 if its assertions pass on a correct function AND fail on a subtly wrong one (valid
            and discriminating), + 0.1 for the shape (at least one `assert` calling the function)
    team    1.0 if the coder's function passes the hidden tests and the tester's valid
            assertions

So the tester is rewarded for catching bugs, and the coder, through the team reward, for code the
tester's assertions accept. The built-in models here are tiny character-level models warm-started
on addition only: they do not write Python, and earn only the shape credit when a sample happens
to start with "def" or "assert" (agents/README.md says what they reach). Point the agents at real
code models (AgentSpec.model = a model directory) to train this for real.
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass

from flexmarl import AgentSpec, SamplingParams, Team
from flexmarl.rewards import code_reward, extract_code, format_reward

SAMPLING = SamplingParams(temperature=1.0, max_tokens=48)
LIMITS = dict(cpu_s=1.0, wall_s=3.0, memory_mb=128)
"""Per sandboxed run: a tiny function needs milliseconds; a loop or a hog is cut short."""


@dataclass(frozen=True)
class CodeTask:
    task_id: str
    name: str
    signature: str
    does: str
    reference: str
    wrong: str
    """Almost right: an off-by-one or a flipped sign a good test must catch."""
    tests: tuple[tuple[str, object], ...]
    """The hidden call cases of the coder's function: (call, expected value)."""

    @property
    def prompt(self) -> str:
        return coder_prompt(self)


def _task(name: str, signature: str, does: str, body: str, wrong: str,
          tests: list[str]) -> CodeTask:
    """`tests` written as asserts `assert call == value` (or `is value`), kept as call cases."""
    cases = tuple((call.strip(), ast.literal_eval(value.strip())) for call, value in
                  (re.match(r"assert (.+?) (?:==|is) (.+)$", line).groups() for line in tests))
    return CodeTask(task_id=f"code-{name}", name=name, signature=signature, does=does,
                    reference=f"def {signature}:\n    return {body}\n",
                    wrong=f"def {signature}:\n    return {wrong}\n", tests=cases)


TASKS = [
    _task("add", "add(a, b)", "the sum of a and b", "a + b", "a - b",
          ["assert add(2, 3) == 5", "assert add(-1, 1) == 0"]),
    _task("sub", "sub(a, b)", "a minus b", "a - b", "b - a",
          ["assert sub(5, 3) == 2", "assert sub(0, 4) == -4"]),
    _task("mul", "mul(a, b)", "the product of a and b", "a * b", "a + b",
          ["assert mul(3, 4) == 12", "assert mul(0, 9) == 0"]),
    _task("double", "double(x)", "twice x", "2 * x", "x + 1",
          ["assert double(4) == 8", "assert double(-3) == -6"]),
    _task("square", "square(x)", "x times x", "x * x", "2 * x",
          ["assert square(3) == 9", "assert square(-2) == 4"]),
    _task("negate", "negate(x)", "minus x", "-x", "abs(x)",
          ["assert negate(5) == -5", "assert negate(-2) == 2"]),
    _task("absolute", "absolute(x)", "the absolute value of x", "x if x >= 0 else -x", "x",
          ["assert absolute(-7) == 7", "assert absolute(3) == 3"]),
    _task("maximum", "maximum(a, b)", "the larger of a and b", "a if a > b else b",
          "a if a < b else b", ["assert maximum(2, 9) == 9", "assert maximum(4, 1) == 4"]),
    _task("minimum", "minimum(a, b)", "the smaller of a and b", "a if a < b else b",
          "a if a > b else b", ["assert minimum(2, 9) == 2", "assert minimum(4, 1) == 1"]),
    _task("is_even", "is_even(n)", "True if n is even", "n % 2 == 0", "n % 2 == 1",
          ["assert is_even(4) is True", "assert is_even(7) is False"]),
    _task("first", "first(xs)", "the first item of the list xs", "xs[0]", "xs[-1]",
          ["assert first([4, 5, 6]) == 4", "assert first([9]) == 9"]),
    _task("last", "last(xs)", "the last item of the list xs", "xs[-1]", "xs[0]",
          ["assert last([4, 5, 6]) == 6", "assert last([9]) == 9"]),
    _task("total", "total(xs)", "the sum of the numbers in xs", "sum(xs)", "sum(xs[1:])",
          ["assert total([1, 2, 3]) == 6", "assert total([]) == 0"]),
    _task("count", "count(xs)", "how many items xs has", "len(xs)", "len(xs) - 1",
          ["assert count([1, 2, 3]) == 3", "assert count([]) == 0"]),
    _task("backwards", "backwards(s)", "the string s reversed", "s[::-1]", "s",
          ["assert backwards('abc') == 'cba'", "assert backwards('') == ''"]),
    _task("shout", "shout(s)", "s in upper case", "s.upper()", "s.lower()",
          ["assert shout('hi') == 'HI'", "assert shout('Ok') == 'OK'"]),
    _task("inc", "inc(x)", "x plus one", "x + 1", "x + 2",
          ["assert inc(1) == 2", "assert inc(-1) == 0"]),
    _task("half", "half(x)", "x divided by 2 (a float)", "x / 2", "x // 2",
          ["assert half(3) == 1.5", "assert half(4) == 2"]),
    _task("between", "between(x, lo, hi)", "True if lo <= x <= hi", "lo <= x <= hi",
          "lo < x < hi", ["assert between(1, 1, 3) is True", "assert between(5, 1, 3) is False"]),
    _task("sign", "sign(x)", "1 if x > 0, -1 if x < 0, else 0",
          "(x > 0) - (x < 0)", "1 if x >= 0 else -1",
          ["assert sign(5) == 1", "assert sign(-2) == -1", "assert sign(0) == 0"]),
]
HELDOUT = TASKS[-4:]
"""Functions the team never trains on (eval.every_steps, flexmarl eval)."""
TRAIN = TASKS[:-4]


def coder_prompt(task: CodeTask) -> str:
    return f"Write a Python function {task.signature} that returns {task.does}."


def tester_prompt(task: CodeTask) -> str:
    return (f"Write Python assert lines that test a function {task.signature} that returns "
            f"{task.does}.")


def _asserts(task: CodeTask) -> re.Pattern:
    return re.compile(rf"(?s).*assert\s.*{re.escape(task.name)}\(.*")


async def workflow(ctx, task: CodeTask) -> None:
    [code] = await ctx.generate("coder", coder_prompt(task))
    [tests] = await ctx.generate("tester", tester_prompt(task))
    function, asserts = extract_code(code.text), extract_code(tests.text)
    passes = await code_reward(function, task.tests, **LIMITS)
    ctx.reward(code, passes + 0.1 * format_reward(function.strip(),
                                                  rf"(?s)def\s+{re.escape(task.name)}\(.*"))
    valid = await code_reward(task.reference, asserts, **LIMITS)
    catches = 1.0 - await code_reward(task.wrong, asserts, **LIMITS)
    ctx.reward(tests, valid * catches + 0.1 * format_reward(asserts, _asserts(task)))
    accepted = await code_reward(function, asserts, **LIMITS) if valid else 1.0
    ctx.team_reward(passes * accepted)


team = Team(
    name="code_pair",
    agents=[
        # math_duo.py's built-in models (cached once built: no second warm start).
        AgentSpec(name="coder", model="small", warm_start_steps=250, sampling=SAMPLING,
                  lr=1e-5),
        AgentSpec(name="tester", model="medium", warm_start_steps=300, sampling=SAMPLING,
                  lr=1e-5),
    ],
    workflow=workflow,
    tasks=TRAIN,
    heldout=HELDOUT,
)
