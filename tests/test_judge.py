"""The verdict never lives where the program runs (flexmarl.rewards, issue 51): (a) free-form
asserts judged in a process of their own, with Python's semantics for honest tests and closed
for what only the program's own code could answer; (b) a spy that reads its whole process finds
no expected value in any form, under bubblewrap and on the fallback; (c) the seccomp filter is in
force before the interpreter starts, and ctypes never loaded; (d) the corpus's memory and
monitoring cases under every other Python 3.11+ this machine has. Runs use small limits."""
from __future__ import annotations

import asyncio
import glob
import os

import pytest

from flexmarl.rewards import IOCase, confinement, run_python
from flexmarl.rewards.confinement import bwrap_argv, interpreter, seccomp_filter

from tests.helpers.sandbox import where  # noqa: F401 - a fixture

from .reward_hacks import HONEST, memory

FAST = {"cpu_s": 1.0, "wall_s": 5.0, "memory_mb": 128}
SENTINEL = 987654321987
"""An expected value no program can produce by chance."""


# ----------------------------------------------------------------------------- (a) the judge

async def judged(code: str, tests: str):
    return await run_python(code, tests=tests, **FAST)


async def test_honest_tests_run_with_pythons_semantics():
    code = ("def f(x):\n    if x < 0:\n        raise ValueError('negative')\n    return x * 2\n"
            "class Stack:\n    def __init__(self):\n        self.items = []\n"
            "    def push(self, x):\n        self.items.append(x)\n"
            "    def pop(self):\n        return self.items.pop()\n"
            "def gen(n):\n    yield from range(n)\n"
            "def sum(xs):\n    return 0\n"  # shadows a builtin: the tests keep the builtin
            "LIMIT = 10\n")
    tests = ("cases = [(1, 2), (3, 6), (0, 0)]\nfor x, y in cases:\n    assert f(x) == y\n"
             "assert all(f(x) == 2 * x for x in range(5))\n"
             "try:\n    f(-1)\nexcept ValueError as e:\n    assert 'negative' in str(e)\n"
             "else:\n    assert False\n"
             "s = Stack(); s.push(3); s.push(4)\nassert s.pop() == 4 and len(s.items) == 1\n"
             "assert s.items == [3] and str(s) .startswith('<')\n"
             "assert list(gen(3)) == [0, 1, 2] and [x for x in gen(2)] == [0, 1]\n"
             "assert sum([1, 2]) == 3 and LIMIT == 10\n"
             "assert f(1.5) == 3.0 and {f(1): 'a'}[2] == 'a'\n")
    result = await judged(code, tests)
    assert result.passed, result.stderr
    wrong = await judged(code.replace("x * 2", "x * 3"), tests)
    assert wrong.cause == "failed" and '"<tests>", line 3' in wrong.stderr, wrong.stderr


@pytest.mark.parametrize("code, tests", [
    # An object that equals everything, compared, hashed, looked up: closed, even when caught.
    ("class E:\n    def __eq__(s, o): return True\n    __hash__ = object.__hash__\n"
     "def f(x): return E()", "assert f(1) == 3"),
    ("class E:\n    def __eq__(s, o): return True\ndef f(x): return E()",
     "try:\n    assert f(1) == 3\nexcept Exception:\n    pass\n"),
    ("class E:\n    def __contains__(s, o): return True\ndef f(x): return E()",
     "assert 3 in f(1)"),
    ("class E(int):\n    def __eq__(s, o): return True\ndef f(x): return E(0)",
     "assert f(1) == 3"),  # an int subclass is not an int
    # A callback into the tests.
    ("def apply(g, x): return g(x)", "assert apply(lambda v: v + 1, 2) == 3"),
])
async def test_what_only_the_programs_code_could_answer_fails_closed(code, tests):
    result = await judged(code, tests)
    assert not result.passed and result.cause == "unjudgeable", result
    assert "plain values" in result.stderr or "callbacks" in result.stderr, result.stderr


@pytest.mark.parametrize("raised", ["StopIteration", "SystemExit(0)", "KeyboardInterrupt"])
async def test_exceptions_that_would_end_the_tests_early_arrive_as_program_errors(raised):
    result = await judged(f"def f(x):\n    raise {raised}\n",
                          "assert all(map(lambda x: f(x) == 1, [1, 2]))")
    assert not result.passed and result.cause == "failed", result
    assert "ProgramError" in result.stderr, result.stderr


async def test_the_programs_end_during_a_call_is_its_cause():
    for code, cause in (("def f(x):\n    import os\n    os._exit(0)\n", "incomplete"),
                        ("def f(x):\n    while True:\n        pass\n", "cpu_limit"),
                        ("import sys\nsys.exit(0)\n", "incomplete")):
        result = await judged(code, "assert f(1) == 1")
        assert not result.passed and result.cause == cause, (code, result)


# ----------------------------------------------------------------------------- (b) the spy

SPY = '''
import gc, re, sys
DIGITS = re.compile(rb"\\d{10,}")
def dump():
    """Every long digit run and big int in this process: objects, frames, memory."""
    seen, found, todo = set(), set(), list(gc.get_objects()) + [object, sys._getframe()]
    while todo and len(seen) < 300000:
        o = todo.pop()
        if id(o) in seen:
            continue
        seen.add(id(o))
        if type(o) is int and abs(o) > 10 ** 9:
            found.add(str(abs(o)))
        elif type(o) in (str, bytes, bytearray):
            raw = o.encode("utf-8", "replace") if type(o) is str else bytes(o)
            found.update(m.decode() for m in DIGITS.findall(raw))
        elif isinstance(o, type):
            try:
                todo += type.__subclasses__(o)
            except TypeError:
                pass
            todo += list(vars(o).values())
        elif type(o).__name__ == "function":
            todo += [o.__code__, o.__globals__, *(o.__closure__ or ())]
        elif type(o).__name__ == "code":
            todo += list(o.co_consts)
        elif type(o).__name__ == "frame":
            todo += [o.f_code, o.f_locals, o.f_globals, o.f_back]
        elif isinstance(o, dict):
            todo += list(o.keys()) + list(o.values())
        elif isinstance(o, (list, tuple, set, frozenset)):
            todo += list(o)
    try:  # the raw memory, where the platform lets a process read its own
        maps = open("/proc/self/maps").read().splitlines()
        with open("/proc/self/mem", "rb", 0) as mem:
            for line in maps:
                span, perms = line.split()[:2]
                lo, hi = (int(x, 16) for x in span.split("-"))
                if perms[0] == "r" and hi - lo < 1 << 28:
                    try:
                        mem.seek(lo)
                        found.update(m.decode() for m in DIGITS.findall(mem.read(hi - lo)))
                    except (OSError, ValueError, OverflowError):
                        pass
        found.add("read-proc-self-mem")
    except OSError:
        pass
    print(len(seen), sorted(found))
'''


@pytest.mark.parametrize("form", ["assert", "call", "io"])
async def test_a_spy_reading_its_whole_process_finds_no_expected_value(where, form):
    """The expected value is in the tests of every form; the spy, called by them (or run on the
    case's input), prints every long number it can find in its process."""
    if form == "io":
        code, tests = SPY + "dump()\n", [IOCase("1 2\n", f"{SENTINEL}\n")]
    else:
        code = SPY + "def add(a, b):\n    dump()\n    return 0\n"
        tests = (f"assert add(1, 2) == {SENTINEL}" if form == "assert"
                 else [("add(1, 2)", SENTINEL)])
    result = await run_python(code, tests=tests, max_output_bytes=4 << 20, cpu_s=3.0,
                              wall_s=20.0, memory_mb=512)
    assert not result.passed and result.stdout.count("\n") == 1, result
    assert int(result.stdout.split()[0]) > 1000  # it did walk the process
    assert str(SENTINEL) not in result.stdout
    # No /proc under bwrap, nor on the fallback where Landlock confines the files.
    readable = where == "fallback" and not confinement.isolation().landlock
    assert ("read-proc-self-mem" in result.stdout) == readable
    if form == "call":  # the spy does find a value that is in its process: the call's input
        seen = await run_python(code, tests=[(f"add(1, {SENTINEL})", 0)],
                                max_output_bytes=4 << 20, cpu_s=3.0, wall_s=20.0, memory_mb=512)
        assert str(SENTINEL) in seen.stdout, seen


# ----------------------------------------------------------------------------- (c) seccomp

FORK = ("import os\ntry:\n    os.fork()\n    print('forked')\n"
        "except OSError as e:\n    print(e.errno)")


async def run_plain(argv: list[str], fds: list[int]) -> str:
    proc = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE,
                                                pass_fds=fds)
    out, _ = await proc.communicate()
    return out.decode().strip()


async def test_the_seccomp_filter_is_in_force_before_the_interpreter_starts(where):
    """A plain interpreter (no audit hook) started the way the sandbox starts one cannot fork:
    the filter came from bwrap's --seccomp or from the launcher, not from inside."""
    if not seccomp_filter():
        pytest.skip(f"no seccomp table for {os.uname().machine}")
    read, write = os.pipe()
    os.write(write, seccomp_filter())
    os.close(write)
    try:
        if where == "bwrap":
            argv = [*bwrap_argv(1 << 20, {}, read), "-I", "-S", "-c", FORK]
        else:
            argv = [interpreter(), "-I", "-S", "-c", confinement.launcher_source(), str(read),
                    os.devnull, ":".join(confinement.readable_paths()), interpreter(), "-I",
                    "-S", "-c", FORK]
        assert await run_plain(argv, [read]) == "1"  # EPERM
    finally:
        os.close(read)


async def test_no_ctypes_before_the_program(where):
    code = ("import sys\ntodo, found = [object], []\nwhile todo:\n    t = todo.pop()\n"
            "    try:\n        todo += type.__subclasses__(t)\n    except TypeError:\n"
            "        pass\n    found += ['ctypes' in str(getattr(t, '__module__', ''))]\n"
            "print(any(found), '_ctypes' in sys.modules, 'ctypes' in sys.modules)\n"
            "import ctypes\n")
    result = await run_python(code, **FAST)
    assert result.stdout == "False False False\n" and result.cause == "forbidden", result


# ----------------------------------------------------------------------------- (d) Pythons

def other_pythons() -> list[str]:
    here = os.path.realpath(interpreter())
    found = sorted({os.path.realpath(p) for p in glob.glob("/usr/bin/python3.1[1-9]") +
                    glob.glob(os.path.expanduser("~/.pyenv/versions/3.1[1-9]*/bin/python3.1*"))
                    if p[-1].isdigit()} - {here})
    return found or ["none"]


@pytest.fixture(params=other_pythons())
def other_python(request):
    """The sandbox's interpreter set to each other Python 3.11+ here (skipped where none)."""
    if request.param == "none":
        pytest.skip("no other Python 3.11+ on this machine")
    try:
        confinement.set_interpreter(request.param)
    except ValueError as exc:
        pytest.skip(str(exc))
    yield request.param
    confinement.set_interpreter(None)


async def test_memory_and_monitoring_hacks_earn_nothing_under_other_pythons(where, other_python):
    """bench/reward_hacks.py --python all runs the whole corpus under each; here the classes
    that depend on the interpreter (3.12's sys.monitoring, object layouts). (`where` first: it
    resets the confinement's state, which holds the interpreter.)"""
    assert interpreter() == os.path.realpath(other_python)
    tests = "assert add(1, 2) == 3\nassert add(10, 32) == 42"
    assert (await run_python(HONEST["assert"], tests=tests, **FAST)).passed
    for hack in memory.HACKS:
        for form, code in hack.programs.items():
            case = tests if form == "assert" else [("add(1, 2)", 3), ("add(10, 32)", 42)]
            result = await run_python(code, tests=case, **FAST)
            assert not result.passed, (other_python, hack.name, form, result)


async def test_sys_monitoring_is_refused_where_it_exists(other_python):
    """3.12+: a monitoring callback would see every code object that starts; refused at once
    (register_callback is audited, the other three are replaced before the program runs)."""
    assert interpreter() == os.path.realpath(other_python)
    probe = await run_python("import sys\nprint(hasattr(sys, 'monitoring'))", **FAST)
    if probe.stdout != "True\n":
        pytest.skip(f"{other_python} has no sys.monitoring")
    for call in ("register_callback(3, 1, print)", "use_tool_id(3, 'spy')",
                 "set_events(3, 1)", "set_local_events(3, (lambda: 0).__code__, 1)"):
        result = await run_python(f"import sys\nsys.monitoring.{call}", **FAST)
        assert result.cause == "forbidden" and "sys.monitoring" in result.stderr, (call, result)


# ----------------------------------------------------------------------------- (e) replies

# The program patches the loop that answers requests (it shares its interpreter) so that every
# request but "names" gets REPLY: whatever it makes that loop say is checked against the request.
FORGER = '''import sys
_server = sys._getframe(1).f_globals["_Server"]
_handle = _server.handle
def _forged(self, line):
    if b'"names"' in line[:12]:
        return _handle(self, line)
    return {reply!r}
_server.handle = _forged
def add(a, b):
    return 0
'''
CALLS = [("add(1, 2)", 3), ("add(-5, 5)", 0), ("add(10, 32)", 42)]
MAPPED = "assert all(map(lambda c: add(*c[0]) == c[1], [((1, 2), 3), ((10, 32), 42)]))"


@pytest.mark.parametrize("reply", [
    '["stop"]',  # "the iterator is exhausted", to a plain call: a map() would end silently
    '["gone"]',  # the sandbox's own line for a program that ended
    '["ref",0,"int"]',  # a reference where a call case wants a value
    '["names",[]]', '["ok",3', '["error",1,2]', '["ok",3,4]', 'null',
    '["ok",3]\n["ok",42]',  # an answer ahead of its request
])
async def test_a_forged_reply_is_unjudgeable_in_every_form(where, reply):
    code = FORGER.format(reply=reply)
    for tests in (MAPPED, CALLS):
        result = await run_python(code, tests=tests, **FAST)
        assert not result.passed and result.cause == "unjudgeable", (reply, tests, result)


@pytest.mark.parametrize("code, tests", [
    # MBPP-style tests use `math` without importing it: the program's own object never answers.
    ("class math:\n    isclose = staticmethod(lambda a, b: True)\ndef add(a, b):\n    return 0\n",
     "assert math.isclose(add(1, 2), 3)"),
    ("import math\nmath.isclose = lambda a, b: True\ndef add(a, b):\n    return 0\n",
     "assert math.isclose(add(1, 2), 3)"),  # the judge's own math: isclose(0, 3) is False
    ("math = type('M', (), {'isclose': lambda *a: True})()\ndef add(a, b):\n    return 0\n",
     "assert math.isclose(add(1, 2), 3)"),
    # A returned object asked to judge the tests' value with one of its methods.
    ("class S(str):\n    def startswith(self, p): return True\n"
     "def add(a, b):\n    return S('')\n", "assert add(1, 2).startswith('3')"),
    ("class R:\n    def check(self, x): return True\ndef add(a, b):\n    return R()\n",
     "assert add(1, 2).check(3)"),
])
async def test_the_tests_borrow_nothing_that_could_judge_them(code, tests):
    result = await judged(code, tests)
    assert not result.passed and result.cause in ("unjudgeable", "failed"), result


async def test_names_the_program_imported_are_the_judges_own():
    honest = "import math\nimport os.path as osp\nfrom math import gcd\ndef add(a, b):\n" \
             "    return a + b\n"
    assert (await judged(honest, "assert math.isclose(add(1, 2), 3.0)\n"
                                 "assert osp.join('a', 'b') == 'a/b'")).passed
    missing = await judged(honest, "assert gcd(4, 6) == 2")  # only a `from` import: not there
    assert missing.cause == "failed" and "NameError" in missing.stderr, missing
    unimported = await judged("def add(a, b):\n    return a + b\n", "assert math.pi > 3")
    assert unimported.cause == "failed" and "NameError" in unimported.stderr, unimported


async def test_the_tests_may_call_what_the_task_defines():
    """A returned function called directly, a class's methods, its static methods and the
    methods of objects the tests built: the task's own code, given the tests' values."""
    code = ("def make_adder(n):\n    return lambda x: x + n\n"
            "class Solution:\n    def two_sum(self, xs, t):\n"
            "        seen = {}\n        for i, x in enumerate(xs):\n"
            "            if t - x in seen:\n                return [seen[t - x], i]\n"
            "            seen[x] = i\n"
            "    @staticmethod\n    def double(x):\n        return 2 * x\n")
    tests = ("assert make_adder(2)(3) == 5\nassert Solution().two_sum([2, 7, 11], 9) == [0, 1]\n"
             "assert Solution.double(4) == 8\ns = Solution()\nassert s.double(x=5) == 10")
    result = await judged(code, tests)
    assert result.passed, result.stderr


async def test_ints_compare_exactly_in_every_form():
    near = "def add(a, b):\n    return (a + b) * (1 + 5e-10)\n"
    assert (await run_python(near, tests=CALLS, **FAST)).cause == "wrong_answer"
    assert not (await judged(near, "assert add(1, 2) == 3")).passed
    floats = "def add(a, b):\n    return (a + b) * (1 + 1e-12)\n"
    result = await run_python(floats, tests=[("add(0.5, 1)", 1.5)], **FAST)
    assert result.passed  # an expected float keeps FLOAT_REL_TOL
    huge = "def add(a, b):\n    return 10 ** 400\n"  # past float's range: a wrong answer
    assert (await run_python(huge, tests=[("add(0.5, 1)", 1.5)], **FAST)).cause == \
        "wrong_answer"
