"""flexmarl.rewards' pure parts: answer extraction, matching, math_verify, format, code blocks,
and the bounds on concurrent async rewards. (The sandbox is tests/test_sandbox.py.)"""
from __future__ import annotations

import asyncio
import re
import threading
import time

import pytest

from flexmarl.rewards import (
    LoopBound, bounded, exact_match, extract_answer, extract_code, format_reward, math_equal,
    numeric_match, score_all)
from flexmarl.rewards.match import _compile
from flexmarl.tasks import Task

ARABIC_42 = "\u0664\u0662"  # Arabic-Indic digits four, two
FULLWIDTH_42 = "\uff14\uff12"


def task(answer: str) -> Task:
    return Task(prompt="Compute it.", answer=answer, task_id="t-0")


# ----------------------------------------------------------------------------- extract_answer

@pytest.mark.parametrize("text, expected", [
    (r"so \boxed{42}.", "42"),
    (r"first \boxed{1}, then \boxed{2}", "2"),
    (r"\boxed{\frac{1}{\sqrt{2}}}", r"\frac{1}{\sqrt{2}}"),
    (r"\boxed{ x^{2} + 1 }", "x^{2} + 1"),
    (r"\boxed{\{1, 2\}}", r"\{1, 2\}"),  # escaped braces neither open nor close
    (r"\boxed{7} and a cut-off \boxed{\frac{1}{", "7"),  # the last balanced one
    (r"\boxed{\boxed{3}}", "3"),
    (r"\boxed{", None),
    ("no box here 5", None),
    ("", None),
])
def test_extract_boxed(text, expected):
    assert extract_answer(text, "boxed") == expected


@pytest.mark.parametrize("text, expected", [
    ("Answer: 42", "42"),
    ("The answer is 42.\nThanks!", "42"),
    ("ANSWER IS: -7", "-7"),
    ("**Answer:** 3.5", "3.5"),
    ("answer: 1\nfinal answer: 2", "2"),
    ("Answer:\n", None),
    ("answers: 5", None),  # "answers" is not "answer"
    ("no marker", None),
])
def test_extract_answer_line(text, expected):
    assert extract_answer(text, "answer") == expected


@pytest.mark.parametrize("text, expected", [
    ("3 apples and 4 pears", "4"),
    ("it is -12 degrees", "-12"),
    ("x = -0.25", "-0.25"),
    ("pi is about 3.14159.", "3.14159"),
    ("1,000,000 people", "1,000,000"),
    ("1,000.5 kg", "1,000.5"),
    ("pages 3-5", "5"),  # a range, not minus five
    ("10-3=7", "7"),
    ("about 1e-3", "1e-3"),
    (f"the sum is {ARABIC_42}", None),  # Unicode digits are not numbers here
    (f"{FULLWIDTH_42} and 7", "7"),
    ("", None),
])
def test_extract_last_number(text, expected):
    assert extract_answer(text, "last_number") == expected


def test_auto_prefers_boxed_then_answer_line_then_last_number():
    assert extract_answer(r"Answer: 1. Check: \boxed{2} and 3") == "2"
    assert extract_answer("Answer: 1\nchecked with 3") == "1"
    assert extract_answer("we get 3 then 4") == "4"
    assert extract_answer("nothing") is None
    assert extract_answer("") is None


def test_extract_answer_refuses_bad_arguments():
    with pytest.raises(ValueError, match="how must be one of"):
        extract_answer("1", "first")
    with pytest.raises(TypeError, match="decode token ids first"):
        extract_answer(b"1")


def test_huge_text_is_quick():
    junk = "lorem ipsum 12 " * 200_000  # 3 MB
    start = time.monotonic()
    assert extract_answer(junk + r"\boxed{99}") == "99"
    assert extract_answer(junk + "Answer: 5") == "5"
    assert extract_answer(junk) == "12"
    assert extract_answer(r"\boxed{" + "{x" * 500_000, "boxed") is None  # never balances
    assert numeric_match(junk + "Answer: 5", "5") == 1.0
    assert extract_code("```python\n" + junk) .startswith("lorem")
    assert time.monotonic() - start < 5.0


# ----------------------------------------------------------------------------- exact / numeric

def test_exact_match():
    assert exact_match("  42\n", "42") == 1.0
    assert exact_match("42", task(" 42 ")) == 1.0
    assert exact_match("042", "42") == 0.0
    assert exact_match("The answer is 42", "42") == 0.0  # whole text: extract first
    assert exact_match(extract_answer("The answer is 42"), task("42")) == 1.0
    assert exact_match(None, "42") == 0.0
    assert exact_match("", "") == 1.0
    assert exact_match("7", 7) == 1.0
    with pytest.raises(TypeError, match="decode"):
        exact_match(42, "42")
    with pytest.raises(TypeError, match="answer attribute"):
        exact_match("1", None)


@pytest.mark.parametrize("text, answer, expected", [
    ("Answer: 1,000", "1000", 1.0),
    (r"\boxed{1000.0}", "1000", 1.0),
    ("so 1000", "1,000", 1.0),
    ("1e3", "1000", 1.0),
    ("Answer: -3.5", "-3.50", 1.0),
    ("Answer: 3.5", "-3.5", 0.0),
    ("Answer: 0.1", ".1", 1.0),
    ("Answer: 0", "0", 1.0),
    ("Answer: 1000.0001", "1000", 1.0),  # within rel_tol=1e-6
    ("Answer: 1000.01", "1000", 0.0),
    ("The answer is 42 because 6*7", "42", 1.0),  # the first number of the answer part
    (f"Answer: {ARABIC_42}", "42", 0.0),
    (ARABIC_42, "42", 0.0),
    ("", "42", 0.0),
    (None, "42", 0.0),
    ("no numbers", "42", 0.0),
])
def test_numeric_match(text, answer, expected):
    assert numeric_match(text, answer) == expected


def test_numeric_match_takes_tasks_numbers_and_a_tolerance():
    assert numeric_match("Answer: 82", task("82")) == 1.0
    assert numeric_match("Answer: 0.5", 0.5) == 1.0
    assert numeric_match("Answer: 101", 100, rel_tol=0.02) == 1.0
    assert numeric_match("Answer: 101", 100, rel_tol=0.0) == 0.0
    assert numeric_match("Answer: 1" + "0" * 400, "1e400") == 1.0  # both overflow to inf


def test_numeric_match_refuses_bad_answers_and_tolerances():
    with pytest.raises(ValueError, match="use exact_match or math_equal"):
        numeric_match("1", r"\frac{1}{2}")
    with pytest.raises(ValueError, match="use exact_match or math_equal"):
        numeric_match("1", ARABIC_42)
    with pytest.raises(ValueError, match="rel_tol"):
        numeric_match("1", "1", rel_tol=-1)
    with pytest.raises(ValueError, match="rel_tol"):
        numeric_match("1", "1", rel_tol=float("nan"))


# ----------------------------------------------------------------------------- math_equal

@pytest.mark.parametrize("text, answer, expected", [
    (r"so the answer is \boxed{0.5}", r"\frac{1}{2}", 1.0),
    (r"we get $\frac{1}{2}$", "0.5", 1.0),
    (r"\boxed{\frac{2}{4}}", "1/2", 1.0),
    ("0.5", r"\frac{1}{2}", 1.0),  # a short bare answer is read as math too
    (r"\boxed{1+x^2}", "x^2+1", 1.0),
    (r"\boxed{\sqrt{2}}", r"\sqrt{2}", 1.0),
    (r"\boxed{1,000}", "1000", 1.0),
    (r"\boxed{0.6}", r"\frac{1}{2}", 0.0),
    (r"\boxed{x^2-1}", "x^2+1", 0.0),
    (rf"\boxed{{{ARABIC_42}}}", "42", 0.0),
    ("", "1", 0.0),
    (None, "1", 0.0),
    ("no math at all", "1", 0.0),
])
def test_math_equal(text, answer, expected):
    assert math_equal(text, answer) == expected


def test_math_equal_reads_a_task_and_the_tail_of_a_huge_completion():
    assert math_equal("blah " * 1_000_000 + r"\boxed{\frac{1}{2}}", task("0.5")) == 1.0


def test_math_equal_times_out_on_a_hang_prone_expression():
    start = time.monotonic()
    assert math_equal(r"$10^{10^{10^{10^{10}}}}$", "1", timeout_s=1) == 0.0
    assert time.monotonic() - start < 10  # untimed, sympy is still at it after 20 s


def test_math_equal_off_the_main_thread_runs_without_signals():
    results = []
    worker = threading.Thread(target=lambda: results.append(math_equal(r"\boxed{0.5}", "1/2")))
    worker.start()
    worker.join(30)
    assert results == [1.0]


async def test_math_equal_inside_the_event_loop():
    assert math_equal(r"\boxed{\frac{3}{4}}", "0.75") == 1.0


def test_math_equal_refuses_bad_arguments():
    with pytest.raises(ValueError, match="timeout_s"):
        math_equal("1", "1", timeout_s=0.5)
    with pytest.raises(TypeError, match="answer attribute"):
        math_equal("1", object())


# ----------------------------------------------------------------------------- format, code

def test_format_reward_fullmatches_across_lines():
    pattern = r"<think>.*</think>\s*<answer>.*</answer>"
    assert format_reward("<think>a\nb</think>\n<answer>3</answer>", pattern) == 1.0
    assert format_reward("preamble <think>a</think><answer>3</answer>", pattern) == 0.0
    assert format_reward("<think>a</think><answer>3</answer> trailing", pattern) == 0.0
    assert format_reward("x <answer>3</answer> y", r".*<answer>.*</answer>.*") == 1.0
    assert format_reward(None, pattern) == 0.0
    assert format_reward("", "") == 1.0
    assert format_reward("ABC", re.compile("abc", re.IGNORECASE)) == 1.0


def test_format_reward_compiles_each_pattern_once():
    pattern = r"\d+ unique-pattern-for-the-cache-test"
    for _ in range(3):
        format_reward("1 unique-pattern-for-the-cache-test", pattern)
    before = _compile.cache_info()
    format_reward("2 unique-pattern-for-the-cache-test", pattern)
    after = _compile.cache_info()
    assert after.hits == before.hits + 1 and after.misses == before.misses


def test_format_reward_refuses_bad_patterns():
    with pytest.raises(ValueError, match="not a valid regular expression"):
        format_reward("x", "(unclosed")
    with pytest.raises(TypeError, match="pattern must be"):
        format_reward("x", ["x"])


@pytest.mark.parametrize("text, expected", [
    ("```python\ndef f():\n    return 1\n```", "def f():\n    return 1\n"),
    ("try\n```py\na = 1\n```\nbetter\n```python\na = 2\n```\n", "a = 2\n"),
    ("```python\ncode()\n```\nOutput:\n```\n1\n```", "code()\n"),  # python block wins
    ("```\nplain()\n```", "plain()\n"),
    ("```bash\nls\n```", "```bash\nls\n```"),  # another language: not a program
    ("```Python3\nx = 1\n```", "x = 1\n"),
    ("text\n```python\nunfinished(", "unfinished("),
    ("print('no fence')", "print('no fence')"),
    ("", ""),
])
def test_extract_code(text, expected):
    assert extract_code(text) == expected


# ----------------------------------------------------------------------------- bounds

class Peak:
    """Counts calls running at once."""

    def __init__(self) -> None:
        self.now = self.peak = 0

    async def __call__(self, value: int) -> int:
        self.now += 1
        self.peak = max(self.peak, self.now)
        await asyncio.sleep(0.01)
        self.now -= 1
        return value * 10


async def test_bounded_limits_calls_at_once():
    peak = Peak()
    limited = bounded(3)(peak.__call__)
    assert await asyncio.gather(*(limited(i) for i in range(12))) == [i * 10 for i in range(12)]
    assert peak.peak == 3


async def test_score_all_keeps_order_and_bound_and_takes_plain_functions():
    peak = Peak()
    assert await score_all(peak, range(10), limit=2) == [i * 10 for i in range(10)]
    assert peak.peak == 2
    assert await score_all(lambda text: numeric_match(text, "5"), ["5", "6"], limit=4) == [1.0, 0.0]
    assert await score_all(peak, [], limit=1) == []


def test_bounds_refuse_bad_arguments():
    with pytest.raises(ValueError, match=r"bounded\(limit\) must be an int >= 1"):
        bounded(0)
    with pytest.raises(TypeError, match="async function"):
        bounded(2)(lambda: 1.0)
    with pytest.raises(ValueError, match=r"score_all\(limit\)"):
        asyncio.run(score_all(lambda x: x, [1], limit=True))


def test_a_loop_bound_serves_one_event_loop_after_another():
    """A plain asyncio.Semaphore used under contention in one loop fails in the next."""
    gate = LoopBound(1)

    async def contend() -> int:
        peak = Peak()

        async def one(i: int) -> int:
            async with gate.hold():
                return await peak(i)

        await asyncio.gather(*(one(i) for i in range(4)))
        return peak.peak

    assert asyncio.run(contend()) == 1
    assert asyncio.run(contend()) == 1
    gate.set_limit(2)
    assert gate.limit == 2 and asyncio.run(contend()) == 2
