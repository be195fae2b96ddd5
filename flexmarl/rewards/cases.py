"""A code task's tests in three forms, parent side: what reaches the sandbox, and the verdict.

| form                | tests=                                      | judged                      |
|---------------------|---------------------------------------------|-----------------------------|
| stdin/stdout cases  | [IOCase("1 2\\n", "3\\n"), ...]               | here, on the output         |
| call cases          | [CallCase("add(1, 2)", 3), ...] or          | here, on values the program |
|                     | [("add(1, 2)", 3), ...]                     | encoded strictly            |
| free-form asserts   | "assert add(1, 2) == 3\\n..."                | in a judge process, on the  |
|                     |                                             | same values                 |

In every form the expected values never enter the program's process: a program can only pass
by printing or returning them. stdin/stdout runs the program once per case (a fresh
interpreter each) and compares lines, trailing whitespace and trailing blank lines ignored.
Call cases compare exact types: int, float, str, bool, None, list, tuple and dict. Numbers
compare as Python compares them (bool with int included, 3 == 3.0), exactly, except where the
expected value is a float: then a float or int answer within FLOAT_REL_TOL (relative) passes,
and NaN equals NaN. An int expected value never takes a tolerance: (a + b) * (1 + 5e-10) is
wrong. A list never equals a tuple; a result of any other type fails its case. A reply that is
not ["ok", value] or ["error", ...] (a forged line, a reference) makes the run "unjudgeable".

Free-form asserts (tests a model or a user writes as code) run in a sandboxed judge process of
their own (`_judge.py`). There the program's names are the ones its source defines (`def`,
`class`, assignment; a name it only imported is the judge's own import, or absent): calling one
sends the arguments to the program's process, which runs the call and answers with a plain
value (int, float, str, bool, None, bytes, complex, list, tuple, dict, set, frozenset: exact
types) or, for any other object, a reference. The tests then compare, loop and hold their
expected values in the judge, with Python's own semantics (exact for ints and strings, as ==
is): `for x, y in cases: assert f(x) == y` works as written. On a reference the tests may read
its attributes and items, iterate it, take its len, bool and str, call it, and call the
methods of the program's classes and of objects the tests built from them. What fails closed
(cause "unjudgeable", whatever the tests catch): comparing, hashing, membership tests or
arithmetic on a reference (only the object's own `__eq__`, `__lt__`... could answer, which is
how an always-equal object forges a pass; a `Fraction` or a namedtuple returned is such a
reference: compare its fields), calling a method of a returned object with the tests' values
(`result.startswith(expected)` would ask the program to judge), passing the program a function
or an object of the tests (callbacks), setting attributes on a reference, and any reply that
does not answer its request. Exceptions the program raises reach the tests as the same builtin
type (ValueError, KeyError, ...) or, for its own classes and for SystemExit and StopIteration,
as `ProgramError`. Names of builtins in the tests stay the builtins: a task whose function
shadows one (`sum`, `max`) needs call cases.
"""
from __future__ import annotations

import ast
import builtins
import gc
from dataclasses import dataclass
from typing import Any, Union

from flexmarl.rewards import _protocol as wire

FLOAT_REL_TOL = wire.FLOAT_REL_TOL
"""Call cases whose expected value is a float: the answer agrees within this relative tolerance
(or both are NaN). Nothing else has a tolerance."""
MAX_CASES = 10_000
"""Most cases in one call of run_python."""

_PLAIN = (int, float, str, bool, type(None), list, tuple, dict)


@dataclass(frozen=True)
class IOCase:
    """Run the program with `stdin`; it passes if it prints `stdout` and exits 0."""

    stdin: str
    stdout: str


@dataclass(frozen=True)
class CallCase:
    """Evaluate `call` (an expression, e.g. "add(1, 2)") in the program's namespace after its
    top level ran; it passes if the value equals `expected` (exact types, see the module)."""

    call: str
    expected: Any


Tests = Union[str, "tuple[IOCase, ...]", "tuple[CallCase, ...]"]


def parse_tests(tests: object) -> str | tuple[IOCase, ...] | tuple[CallCase, ...]:
    """The `tests` argument of run_python in one of its forms; ValueError names the fix.

    "" (or only whitespace) is "" (a plain script). Asserts are returned as they are: a syntax
    error in them fails the run with the judge's message, as a model's malformed tests should.
    """
    if isinstance(tests, str):
        return tests if tests.strip() else ""
    if not isinstance(tests, (list, tuple)):
        raise ValueError(f"tests must be a str of asserts, a list of IOCase, or a list of "
                         f"CallCase / (call, expected) pairs, got {type(tests).__name__}")
    if not tests:
        raise ValueError("tests is an empty list: give at least one case (or tests='' to "
                         "run the program as a plain script)")
    if len(tests) > MAX_CASES:
        raise ValueError(f"{len(tests)} cases: at most {MAX_CASES} per run")
    cases = [CallCase(*case) if isinstance(case, tuple) and len(case) == 2
             and isinstance(case[0], str) else case for case in tests]
    kinds = {type(case) for case in cases}
    if kinds == {IOCase}:
        for case in cases:
            if not isinstance(case.stdin, str) or not isinstance(case.stdout, str):
                raise ValueError(f"IOCase stdin and stdout must be str, got {case!r}")
        return tuple(cases)
    if kinds == {CallCase}:
        for case in cases:
            _check_call(case)
        return tuple(cases)
    raise ValueError("tests must all be IOCase, or all CallCase / (call, expected) pairs; "
                     f"got {sorted(kind.__name__ for kind in kinds)}")


def _check_call(case: CallCase) -> None:
    if not isinstance(case.call, str):
        raise ValueError(f"CallCase.call must be a str expression such as 'add(1, 2)', got "
                         f"{case.call!r}")
    if "\0" in case.call:
        raise ValueError(f"CallCase.call contains a NUL character: {case.call!r}")
    try:
        ast.parse(case.call, mode="eval")
    except SyntaxError as exc:
        raise ValueError(f"CallCase.call {case.call!r} is not a Python expression: "
                         f"{exc.msg}") from None
    except (RecursionError, MemoryError):
        raise ValueError(f"CallCase.call nests too deeply: {case.call[:80]!r}...") from None
    if not _is_plain(case.expected):
        raise ValueError(f"CallCase({case.call!r}) expects {case.expected!r}: expected values "
                         f"must be int, float, str, bool, None, or lists, tuples and dicts of "
                         f"them")


def _is_plain(value: object, depth: int = 0) -> bool:
    if type(value) not in _PLAIN or depth > 100:
        return False
    if type(value) in (list, tuple):
        return all(_is_plain(item, depth + 1) for item in value)
    if type(value) is dict:
        return all(_is_plain(k, depth + 1) and _is_plain(v, depth + 1) for k, v in value.items())
    return True


def quote(text: str) -> bytes:
    """A str as a JSON string, for a request line (the sandbox's own encoder)."""
    return wire.encode(text).encode()


def judge_reply(case: CallCase, reply: bytes) -> bool | None:
    """A call case's verdict from the program's reply line: True for ["ok", value] with the
    value equal to the expected one (`same`), False for any other value or an ["error", name,
    text]; None for a line that is not a call's reply at all (malformed, a reference, a
    "stop"): the caller makes the run unjudgeable. Decoded by the sandbox's own codec without
    building a hashed container (`_protocol.decode(hashed=False)`): linear in the line."""
    collecting = gc.isenabled()
    gc.disable()  # a reply of 350k empty lists would otherwise set off full collections of the
    try:  # caller's whole heap (150-300 ms a reply), none of which could free anything
        decoded = wire.decode(reply, hashed=False)
    except ValueError:
        return None
    finally:
        if collecting:
            gc.enable()
    if type(decoded) is list and len(decoded) == 2 and decoded[0] == "ok":
        return same(case.expected, decoded[1])
    if type(decoded) is list and len(decoded) == 3 and decoded[0] == "error" and all(
            type(x) is str for x in decoded[1:]):
        return False
    return None


def same(expected: Any, got: Any) -> bool:
    """Call-case equality (`_protocol.same`, which the judge shares): exact container types;
    numbers as Python compares them, exactly, but for an expected float (FLOAT_REL_TOL, NaN
    equal to NaN). `got` as `judge_reply` decodes it (a dict as `Pairs`), or plain."""
    return wire.same(expected, got)


def simple_call(call: str) -> bool:
    """Whether a call case's expression is the program's own answer: a name, or a call of a
    name that is neither a builtin nor a standard-library module, on literal arguments
    (`add(1, 2)`, `f([3, 1], key='x')`). Those run in the program's process. Anything else
    (`math.isclose(f(x), 3)`, `str(f(x)).startswith('3')`, `f(x).real`, `Solution().g(1)`) may
    hold a check the tests meant to make themselves: it runs in a judge process, with the
    judge's names (`_judge.py`)."""
    import sys
    try:
        node = ast.parse(call, mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    outside = set(dir(builtins)) | set(getattr(sys, "stdlib_module_names", ()))
    if isinstance(node, ast.Name):
        return node.id not in outside
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id not in outside):
        return False
    try:
        for arg in [*node.args, *(k.value for k in node.keywords)]:
            if isinstance(arg, ast.Starred):
                return False
            ast.literal_eval(arg)
    except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
        return False
    return all(k.arg is not None for k in node.keywords)


def same_output(expected: str, got: str) -> bool:
    """stdin/stdout cases: the same lines, trailing whitespace and trailing blank lines aside."""
    def lines(text: str) -> list[str]:
        out = [line.rstrip() for line in text.splitlines()]
        while out and not out[-1]:
            out.pop()
        return out
    return lines(expected) == lines(got)
