"""A code task's tests in three forms, parent side: what reaches the sandbox, and the verdict.

| form                          | tests=                                  | judged                   |
|-------------------------------|-----------------------------------------|--------------------------|
| stdin/stdout cases            | [IOCase("1 2\\n", "3\\n"), ...]           | here, on the output      |
| call cases                    | [CallCase("add(1, 2)", 3), ...] or      | here, on values the      |
|                               | [("add(1, 2)", 3), ...]                 | sandbox encoded strictly |
| free-form asserts             | "assert add(1, 2) == 3\\n..."            | in the sandbox           |

In the first two forms the expected values never enter the sandbox: a program can only pass
by printing or returning them. stdin/stdout runs the program once per case (a fresh
interpreter each) and compares lines, trailing whitespace and trailing blank lines ignored.
Call cases compare exact types: int, float, str, bool, None, list, tuple and dict (numbers as
Python compares them, bool with int included; floats within FLOAT_REL_TOL, NaN equal to NaN;
a list never equals a tuple); a result of any other type fails its case.

Free-form asserts are weaker and kept for tests a model or a user writes as code. They reach the
program's process, after its top level, rewritten here with every comparison and arithmetic
operator replaced (`__strict_cmp__`, `__strict_bin__` in `_bootstrap.py`): a program's object
never meets a plain value through its own `__eq__`, `__lt__`, `__contains__` or `__sub__`, and
names of builtins resolve to the builtins as they were before the program ran. Not covered:
method calls on what the program returned (`f(x).startswith("a")`), helpers that compare on
their own (`unittest`'s assertEqual, `math.isclose` after a patched `math`), and a task whose
function shadows a builtin's name (`sum`, `max`): use call cases for those.
"""
from __future__ import annotations

import ast
import json
import math
from dataclasses import dataclass
from typing import Any, Union

FLOAT_REL_TOL = 1e-9
"""Call cases: floats agree within this relative tolerance (or both NaN)."""
MAX_CASES = 10_000
"""Most cases in one call of run_python."""

_PLAIN = (int, float, str, bool, type(None), list, tuple, dict)
_CMP_NAMES = {ast.Eq: "==", ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">",
              ast.GtE: ">=", ast.In: "in", ast.NotIn: "not in", ast.Is: "is",
              ast.IsNot: "is not"}
_BIN_NAMES = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//",
              ast.Mod: "%", ast.Pow: "**"}
_TESTS_FUNCTION = "__flexmarl_tests__"


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


@dataclass(frozen=True)
class Asserts:
    """Free-form asserts: the text, and its rewritten source for the sandbox (a function of the
    two helpers, each statement one line below where it was: the def takes line 1)."""

    text: str
    source: str


Tests = Union[str, Asserts, "tuple[IOCase, ...]", "tuple[CallCase, ...]"]


def parse_tests(tests: object) -> str | Asserts | tuple[IOCase, ...] | tuple[CallCase, ...]:
    """The `tests` argument of run_python in one of its forms; ValueError names the fix.

    "" stays "" (a plain script). Asserts with a syntax error are returned as they are (a str):
    the run then fails with the SyntaxError, as a model's malformed tests should.
    """
    if isinstance(tests, str):
        return harden_asserts(tests) if tests.strip() else ""
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


class _Strict(ast.NodeTransformer):
    """Comparisons and arithmetic to the sandbox's strict helpers, line numbers kept."""

    def visit_Compare(self, node: ast.Compare) -> ast.AST:
        self.generic_visit(node)
        names = ast.Tuple([ast.Constant(_CMP_NAMES[type(op)]) for op in node.ops], ast.Load())
        return ast.copy_location(ast.Call(ast.Name("__strict_cmp__", ast.Load()),
                                          [names, node.left, *node.comparators], []), node)

    def visit_BinOp(self, node: ast.BinOp) -> ast.AST:
        self.generic_visit(node)
        name = _BIN_NAMES.get(type(node.op))
        if name is None:
            return node  # bit operations and @: left as Python runs them
        return ast.copy_location(ast.Call(ast.Name("__strict_bin__", ast.Load()),
                                          [ast.Constant(name), node.left, node.right], []), node)


def harden_asserts(text: str) -> str | Asserts:
    """The tests wrapped in a function of the two helpers, comparisons rewritten, compiled.

    The text as it is where it does not compile (the sandbox reports the error)."""
    try:
        module = ast.parse(text, "<tests>")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return text
    lines = [f"def {_TESTS_FUNCTION}(__strict_cmp__, __strict_bin__):"]
    try:
        for statement in module.body:
            while len(lines) < statement.lineno:  # keep it on its own line number + 1
                lines.append("")
            lines += ["    " + line for line in ast.unparse(_Strict().visit(statement))
                      .splitlines()]
        lines.append("    pass")
        source = "\n".join(lines) + "\n"
        compile(source, "<tests>", "exec", dont_inherit=True)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return text  # valid at module level only (`from m import *`), or nested too deep
    return Asserts(text, source)


def tests_payload(tests: Asserts | str | tuple[CallCase, ...]) -> bytes:
    """What the bootstrap reads once the program's top level has returned."""
    if isinstance(tests, Asserts):
        return b"A" + _utf8(tests.text) + b"\0" + _utf8(tests.source)
    if isinstance(tests, str):  # asserts that did not compile: the sandbox shows the error
        return b"A" + _utf8(tests) + b"\0" + _utf8(
            f"def {_TESTS_FUNCTION}(__strict_cmp__, __strict_bin__):\n"
            f"    raise SyntaxError({_syntax_error(tests)!r})\n")
    return b"C" + _utf8("\0".join(case.call for case in tests))


def _utf8(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")


def _syntax_error(text: str) -> str:
    try:
        ast.parse(text, "<tests>")
    except SyntaxError as exc:
        return f"the tests do not compile: {exc.msg} (line {exc.lineno})"
    except (ValueError, RecursionError, MemoryError) as exc:
        return f"the tests do not compile: {type(exc).__name__}"
    return ("the tests do not compile inside a function (from m import *, a bare return) or "
            "nest too deeply")


def judge_calls(cases: tuple[CallCase, ...], results: bytes) -> tuple[bool, ...] | None:
    """Each case's verdict from the bootstrap's results line; None if it is not well formed."""
    try:
        decoded = json.loads(results, object_hook=_tagged)
    except (ValueError, RecursionError, TypeError):
        return None
    if not isinstance(decoded, list) or len(decoded) != len(cases):
        return None
    verdicts = []
    for case, item in zip(cases, decoded):
        if not (isinstance(item, list) and len(item) == 2 and item[0] in ("ok", "error")):
            return None
        verdicts.append(item[0] == "ok" and same(case.expected, item[1]))
    return tuple(verdicts)


def _tagged(obj: dict) -> Any:
    if set(obj) == {"t"} and isinstance(obj["t"], list):
        return tuple(obj["t"])
    if set(obj) == {"d"} and isinstance(obj["d"], list):
        return {k if not isinstance(k, list) else _unhashable(): v for k, v in obj["d"]}
    raise ValueError("an object the encoder does not write")


def _unhashable() -> Any:
    raise ValueError("a list as a dict key")


def same(expected: Any, got: Any) -> bool:
    """Call-case equality: exact container types, numbers as Python compares them (floats
    within FLOAT_REL_TOL, NaN equal to NaN)."""
    numbers = (int, float, bool)
    if type(expected) in numbers and type(got) in numbers:
        if type(expected) is float or type(got) is float:
            a, b = float(expected), float(got)
            return (math.isnan(a) and math.isnan(b)) or math.isclose(a, b,
                                                                     rel_tol=FLOAT_REL_TOL)
        return expected == got
    if type(expected) is not type(got):
        return False
    if type(expected) in (list, tuple):
        return len(expected) == len(got) and all(same(a, b) for a, b in zip(expected, got))
    if type(expected) is dict:
        return expected.keys() == got.keys() and all(same(v, got[k])
                                                      for k, v in expected.items())
    return expected == got  # str, None


def same_output(expected: str, got: str) -> bool:
    """stdin/stdout cases: the same lines, trailing whitespace and trailing blank lines aside."""
    def lines(text: str) -> list[str]:
        out = [line.rstrip() for line in text.splitlines()]
        while out and not out[-1]:
            out.pop()
        return out
    return lines(expected) == lines(got)
