"""The three forms of a code task's tests (flexmarl.rewards.cases and the sandbox's two phases):
(a) pure: how `tests` is read and its errors, call-case equality, output comparison; (b) real
sandboxed runs: stdin/stdout and call cases judged outside the program, the tests out of the
program's sight until its top level has returned, free-form asserts judged in a process of their
own (tests/test_judge.py has the judge's semantics). Runs use small limits (about 1 s each)."""
from __future__ import annotations

import math

import pytest

from flexmarl.rewards import CallCase, IOCase, code_reward, run_python
from flexmarl.rewards.cases import parse_tests, same, same_output

FAST = {"cpu_s": 1.0, "wall_s": 3.0, "memory_mb": 128}
ADD = "def add(a, b):\n    return a + b\n"
SUM_IO = "a, b = map(int, input().split())\nprint(a + b)\n"
SENTINEL = 987654321987
"""An expected value no honest or hacking program can produce by chance."""


# ----------------------------------------------------------------------------- (a) pure

def test_tests_are_read_in_three_forms():
    assert parse_tests("") == ""
    assert parse_tests("assert add(1, 2) == 3") == "assert add(1, 2) == 3"
    assert parse_tests("  \n") == ""
    assert parse_tests([("add(1, 2)", 3)]) == (CallCase("add(1, 2)", 3),)
    assert parse_tests([IOCase("1 2", "3")]) == (IOCase("1 2", "3"),)
    assert parse_tests("assert (") == "assert ("  # a model's broken tests: the run fails


@pytest.mark.parametrize("tests, fix", [
    ([], "at least one case"),
    ([IOCase("1", "1"), ("f()", 1)], "must all be IOCase, or all CallCase"),
    ([("f()", object())], "expected values must be int, float"),
    ([("f()", {1, 2})], "expected values must be int, float"),
    ([("f(", 1)], "is not a Python expression"),
    ([("f()\0", 1)], "NUL"),
    ([IOCase(b"1", "1")], "must be str"),
    (42, "a str of asserts, a list of IOCase"),
])
def test_malformed_tests_are_refused_with_the_fix(tests, fix):
    with pytest.raises(ValueError, match=fix):
        parse_tests(tests)


def test_call_cases_compare_exact_types():
    assert same(3, 3) and same(1.5, 1.5 + 1e-12) and not same(1.5, 1.5001)
    assert same(2, 2.0) and same(True, 1)  # numbers as Python compares them
    assert same(math.nan, math.nan) and not same(math.nan, 1.0)
    assert same([1, (2, "a")], [1, (2, "a")]) and not same([1, 2], (1, 2))
    assert same({"a": [1]}, {"a": [1]}) and not same({"a": 1}, {"a": 1, "b": 2})
    assert not same("3", 3) and not same(None, 0) and same(None, None)


def test_output_compares_lines_without_trailing_whitespace():
    assert same_output("3\n", "3") and same_output("a b\nc", "a b  \nc\n\n")
    assert not same_output("3", "3 4") and not same_output("1\n2", "1 2")


# ----------------------------------------------------------------------------- (b) real runs

async def test_the_three_forms_pass_a_correct_program_and_fail_a_wrong_one():
    wrong = "def add(a, b):\n    return a - b\n"
    asserts = "assert add(1, 2) == 3\nassert add(-5, 5) == 0"
    calls = [("add(1, 2)", 3), CallCase("add(5, 0)", 5)]
    assert await code_reward(ADD, asserts, **FAST) == 1.0
    assert await code_reward(ADD, calls, **FAST) == 1.0
    assert await code_reward(SUM_IO, [IOCase("1 2\n", "3\n"), IOCase("-5 5", "0")], **FAST) == 1.0
    assert await code_reward(wrong, asserts, **FAST) == 0.0
    result = await run_python(wrong, tests=calls, **FAST)
    assert result.cause == "wrong_answer" and result.cases == (False, True)


async def test_stdin_stdout_cases_run_one_process_each_and_stop_at_the_first_failure():
    code = "import os\nn = int(input())\nprint(n * 2 if n < 5 else -1)\n"
    result = await run_python(code, tests=[IOCase("1", "2"), IOCase("9", "18"),
                                           IOCase("2", "4")], **FAST)
    assert result.cause == "wrong_answer" and result.cases == (True, False, False)
    assert result.stdout == "-1\n"  # the failing case's output
    with pytest.raises(ValueError, match="stdin is given twice"):
        await run_python(code, tests=[IOCase("1", "2")], stdin="1")


async def test_a_call_case_that_raises_or_returns_an_object_fails_alone():
    code = ("class Box:\n    pass\n"
            "def f(x):\n    if x == 0:\n        raise KeyError('no zero')\n"
            "    return Box() if x == 1 else [x, (x, str(x))]\n")
    result = await run_python(code, tests=[("f(0)", 0), ("f(1)", 1), ("f(2)", [2, (2, "2")])],
                              **FAST)
    assert result.cause == "wrong_answer" and result.cases == (False, False, True)


async def test_the_tests_are_out_of_sight_until_the_top_level_has_returned():
    """The program dumps every descriptor, its own file, argv and environment at its top level;
    none of it holds a test or an expected value. Its function, called by the tests, finds none
    in its callers' frames either (there are frames now: they hold nothing of the tests)."""
    spy = ("import os, sys\nseen = [open(__file__).read(), repr(sys.argv), repr(os.environ)]\n"
           "for fd in range(3, 64):\n    try:\n        os.set_blocking(fd, False)\n"
           "        seen.append(repr(os.read(fd, 1 << 16)))\n    except OSError:\n"
           "        pass\nprint('\\n'.join(seen))\n"
           "def add(a, b):\n    f = sys._getframe()\n    while f is not None:\n"
           "        print(repr(f.f_locals)[:100000])\n        f = f.f_back\n    return 0\n")
    for tests in (f"assert add(1, 2) == {SENTINEL}", [("add(1, 2)", SENTINEL)]):
        result = await run_python(spy, tests=tests, **FAST)
        assert not result.passed and str(SENTINEL) not in result.stdout  # what it saw
        assert "'b': 2" in result.stdout  # it did read its frames: its own arguments


async def test_a_syntax_error_in_the_tests_fails_the_run_and_says_so():
    result = await run_python(ADD, tests="assert add(1, 2) == ", **FAST)
    assert result.cause == "failed" and "the tests do not compile" in result.stderr


async def test_judged_asserts_pass_honest_uses():
    code = ("from fractions import Fraction\nfrom typing import List\nimport collections\n"
            "P = collections.namedtuple('P', 'x y')\n"
            "def half(x: int) -> Fraction:\n    return Fraction(x, 2)\n"
            "def pts() -> List[P]:\n    return [P(1, 2)]\n"
            "def words(s):\n    return s.split()\n")
    tests = ("h = half(3)\nassert (h.numerator, h.denominator) == (3, 2)\n"
             "assert words('a b') == ['a', 'b'] and 'a' in words('a b')\n"
             "assert len(pts()) == 1 and pts()[0].x == 1\nassert abs(1.5 - 0.5) < 1.01\n"
             "assert words('') == [] and words('x') != ['y']\nassert half(2) is not None")
    result = await run_python(code, tests=tests, **FAST)
    assert result.passed, result.stderr


async def test_hostile_tests_fail_the_run_not_the_caller():
    """A model's tests (code_pair's tester writes them) that nest too deeply to compile, loop,
    or fork: a failed run, never an exception in the rewarding process."""
    for tests in ("assert " + "(" * 1000 + "1" + ")" * 1000, "x = " + "1 + " * 50_000 + "1",
                  "while True:\n    pass", "import os\nos.fork()"):
        result = await run_python(ADD, tests=tests, **FAST)
        assert not result.passed and result.cause in ("failed", "cpu_limit", "timeout",
                                                     "forbidden"), (tests[:40], result)
