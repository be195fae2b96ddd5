"""flexmarl.rewards.sandbox: a program that passes passes; one that fails, hangs, forks, floods,
hogs memory, opens sockets or writes outside its directory ends with passed=False and its
cause, leaving no process and no directory behind. Each run uses small limits (about 1 s)."""
from __future__ import annotations

import asyncio
import glob
import json
import os
import tempfile
import time

import pytest

from flexmarl.rewards import (
    CAUSES, code_reward, extract_code, isolation, max_concurrent, network_isolated, run_python,
    set_max_concurrent)
from flexmarl.rewards.confinement import MARK

FAST = {"cpu_s": 1.0, "wall_s": 3.0, "memory_mb": 128}
SAY_PID = "import os\nprint(os.getpid(), flush=True)\n"


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def sandboxed() -> list[int]:
    """Processes running a sandboxed program: their command line holds the loader's mark
    (bwrap's, and the interpreter's inside it or on the fallback path)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if MARK.encode() in f.read():
                        found.append(int(entry))
            except OSError:
                continue  # ended meanwhile
    return found


def none_left() -> bool:
    """No sandboxed process left (within 5 s: the kernel tears a PID namespace down after its
    first process dies, not at once)."""
    deadline = time.monotonic() + 5.0
    while sandboxed():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def sandbox_dirs() -> set[str]:
    return set(glob.glob(os.path.join(tempfile.gettempdir(), "flexmarl-sandbox-*")))


@pytest.fixture
def clean(no_leftover_children):
    """No sandbox directory and no child process left after the test."""
    before = sandbox_dirs()
    yield
    assert sandbox_dirs() - before == set()


# ----------------------------------------------------------------------------- pass / fail

async def test_a_correct_program_passes(clean):
    code = "def add(a, b):\n    return a + b\nprint('ran')"
    result = await run_python(code, tests="assert add(2, 3) == 5\nassert add(-1, 1) == 0", **FAST)
    assert result.passed and result.cause == "ok" and result.returncode == 0
    assert result.stdout == "ran\n" and result.stderr == ""
    assert 0 < result.seconds < 3


async def test_a_failing_assert_fails_with_its_traceback(clean):
    result = await run_python("def add(a, b):\n    return a - b",
                              tests="assert add(2, 3) == 5, 'add is wrong'", **FAST)
    assert not result.passed and result.cause == "failed" and result.returncode == 1
    assert "AssertionError: add is wrong" in result.stderr
    assert '"<tests>", line 1' in result.stderr  # the tests run apart from the program
    assert "_bootstrap.py" not in result.stderr  # the program's frames only


@pytest.mark.parametrize("leave", ["import sys\nsys.exit(0)", "import os\nos._exit(0)",
                                   "raise SystemExit"])
async def test_leaving_before_the_tests_does_not_pass(clean, leave):
    result = await run_python(leave, tests="assert False", **FAST)
    assert result.returncode == 0 and not result.passed and result.cause == "incomplete"
    without_tests = await run_python(leave, **FAST)  # a plain script may end that way
    assert without_tests.passed and without_tests.cause == "ok"


async def test_stdin_and_stdout(clean):
    result = await run_python("a, b = map(int, input().split())\nprint(a + b)\n"
                              "print(input().upper())", stdin="20 22\nzoë\n", **FAST)
    assert result.passed and result.stdout == "42\nZOË\n"


async def test_code_reward_and_extract_code():
    completion = "Here it is:\n```python\ndef sq(x):\n    return x * x\n```\nDone."
    assert await code_reward(extract_code(completion), "assert sq(3) == 9", **FAST) == 1.0
    assert await code_reward(extract_code(completion), "assert sq(3) == 6", **FAST) == 0.0
    assert await code_reward("def sq(x) return", "assert sq(3) == 9", **FAST) == 0.0  # syntax


async def test_bad_arguments_raise_value_error():
    for kwargs, name in (({"cpu_s": 0}, "cpu_s"), ({"wall_s": -1}, "wall_s"),
                         ({"wall_s": float("inf")}, "wall_s"), ({"memory_mb": 8}, "memory_mb"),
                         ({"max_output_bytes": 0}, "max_output_bytes"),
                         ({"tests": None}, "tests"), ({"stdin": b"x"}, "stdin")):
        with pytest.raises(ValueError, match=name):
            await run_python("pass", **kwargs)
    with pytest.raises(ValueError, match="code"):
        await run_python(b"pass")
    with pytest.raises(ValueError, match="max_concurrent"):
        set_max_concurrent(0)


# ----------------------------------------------------------------------------- limits

@pytest.mark.parametrize("bomb", [
    "while True:\n    os.fork()",
    "import subprocess\nwhile True:\n    subprocess.Popen(['python3', '-c', 'pass'])",
    "import multiprocessing\nmultiprocessing.Process(target=print).start()",
    "os.system('sleep 30 &')",
    "os.execv('/bin/sh', ['sh', '-c', 'sleep 30'])",
    "os.posix_spawn('/bin/sleep', ['sleep', '30'], {})",
])
async def test_a_fork_bomb_starts_no_process(clean, bomb):
    result = await run_python(SAY_PID + bomb, **FAST)
    assert not result.passed and result.cause == "forbidden", result
    assert "is not allowed" in result.stderr
    assert none_left()


async def test_a_cpu_loop_hits_the_cpu_limit(clean):
    result = await run_python(SAY_PID + "while True:\n    pass", cpu_s=1, wall_s=10)
    assert not result.passed and result.cause == "cpu_limit" and result.returncode == -9
    assert result.seconds < 8  # about 1 s of CPU, more wall time on a busy machine
    assert none_left()


async def test_a_sleeping_program_hits_the_wall_clock(clean):
    start = time.monotonic()
    result = await run_python(SAY_PID + "import time\ntime.sleep(60)", cpu_s=5, wall_s=1)
    assert not result.passed and result.cause == "timeout" and result.returncode == -9
    assert 1.0 <= result.seconds < 4 and time.monotonic() - start < 5
    assert none_left()


async def test_a_memory_hog_gets_memory_error(clean):
    result = await run_python("hog = [0] * (256 * 1024 * 1024)  # 2 GB of pointers", **FAST)
    assert not result.passed and result.cause == "memory"
    assert "MemoryError" in result.stderr


async def test_sockets_are_refused(clean):
    connected = asyncio.Event()
    server = await asyncio.start_server(lambda r, w: connected.set(), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        for code in (f"import socket\nsocket.create_connection(('127.0.0.1', {port}))",
                     "import socket\nsocket.socket().bind(('0.0.0.0', 0))",
                     "import urllib.request\nurllib.request.urlopen('http://127.0.0.1:1/')"):
            result = await run_python(code, **FAST)
            assert not result.passed and result.cause == "forbidden", result
            assert "socket" in result.stderr or "urllib" in code
        await asyncio.sleep(0.1)
    assert not connected.is_set()


async def test_the_network_namespace_has_no_interfaces_but_loopback(clean):
    if isolation().mechanism == "bwrap":
        pytest.skip("under bwrap (no /proc): tests/test_isolation.py checks its network")
    if not await network_isolated():
        pytest.skip("unshare --net does not work here: the audit hook is the network block")
    result = await run_python("print(open('/proc/self/net/dev').read())", **FAST)
    interfaces = {line.split(":")[0].strip() for line in result.stdout.splitlines()[2:]
                  if ":" in line}
    assert result.passed and interfaces == {"lo"}


async def test_a_huge_file_hits_the_file_limit(clean):
    code = "with open('big.bin', 'wb') as f:\n    f.write(b'x' * (8 << 20))"
    result = await run_python(code, max_file_bytes=1 << 20, **FAST)
    assert not result.passed and result.cause == "file_limit"
    assert "File too large" in result.stderr


async def test_huge_output_is_cut_and_killed(clean):
    result = await run_python(SAY_PID + "while True:\n    print('y' * 4096)",
                              max_output_bytes=32 << 10, **FAST)
    assert not result.passed and result.cause == "output_limit" and result.returncode == -9
    assert len(result.stdout) == 32 << 10
    assert result.seconds < 2.5
    assert none_left()
    flood_stderr = await run_python("import sys\nwhile True:\n    sys.stderr.write('e' * 999)",
                                    max_output_bytes=10_000, **FAST)
    assert flood_stderr.cause == "output_limit" and len(flood_stderr.stderr) == 10_000


async def test_writes_outside_the_directory_are_refused(clean, tmp_path):
    target = tmp_path / "outside.txt"
    target.write_text("keep")
    for code in (f"open({str(target)!r}, 'w').write('gone')",
                 f"import os\nos.remove({str(target)!r})",
                 f"import os\nos.rename({str(target)!r}, 'mine.txt')",
                 f"import os\nos.chmod({str(target)!r}, 0o777)",
                 f"import os\nos.chdir('/')\nopen({str(target)[1:]!r}, 'a').write('x')",
                 f"import os\nos.symlink({str(target)!r}, 'link')\nopen('link', 'w')"):
        result = await run_python(code, **FAST)
        assert result.cause == "forbidden", (code, result)
    assert target.read_text() == "keep"
    inside = await run_python("import os\nos.mkdir('d')\nopen('d/f', 'w').write('ok')\n"
                              "os.rename('d/f', 'g')\nprint(open('g').read())", **FAST)
    assert inside.passed and inside.stdout == "ok\n"


async def test_other_escapes_are_refused(clean):
    sleeper = await asyncio.create_subprocess_exec("sleep", "30")
    try:
        for code in (f"import os\nos.kill({sleeper.pid}, 9)",
                     "import ctypes\nctypes.CDLL(None).fork()",
                     "import resource\nresource.setrlimit(resource.RLIMIT_CPU, (100, 100))"):
            # gc.get_objects() and frames are allowed: the program's process holds nothing of
            # the tests (tests/test_judge.py dumps it all).
            result = await run_python(code, **FAST)
            assert result.cause == "forbidden", (code, result)
        assert sleeper.returncode is None and not gone(sleeper.pid)
    finally:
        sleeper.kill()
        await sleeper.wait()


async def test_the_environment_is_isolated(clean, monkeypatch):
    monkeypatch.setenv("FLEXMARL_TEST_SECRET", "hunter2")
    code = ("import json, os, sys\nprint(json.dumps({'env': sorted(os.environ), "
            "'cwd': os.getcwd(), 'isolated': sys.flags.isolated, 'no_site': sys.flags.no_site,"
            "'site': any('site-packages' in p for p in sys.path)}))")
    result = await run_python(code, **FAST)
    seen = json.loads(result.stdout)
    # LC_CTYPE: the UTF-8 locale Python coerces to; PWD: bwrap's --chdir sets it
    assert set(seen["env"]) <= {"PATH", "HOME", "TMPDIR", "LC_CTYPE", "PWD"}
    assert seen["isolated"] == 1 and seen["no_site"] == 1 and not seen["site"]
    if isolation().mechanism == "bwrap":
        assert seen["cwd"] == "/box"  # its private directory, the same path in every run
    else:
        assert os.path.basename(seen["cwd"]).startswith("flexmarl-sandbox-")
        assert not os.path.exists(seen["cwd"])  # removed after the run


# ----------------------------------------------------------------------------- concurrency

@pytest.fixture
def two_at_once():
    before = max_concurrent()
    set_max_concurrent(2)
    yield
    set_max_concurrent(before)


HOLD_S = 2.0
"""How long each run holds its slot: runs started together overlap unless their starts differ
by more than this (a sandbox starts in well under a second, even on a loaded machine)."""


async def test_concurrent_runs_respect_the_bound(clean, two_at_once):
    """Five runs under a bound of 2: two at once, never three. Each program prints when it
    started and ended (one clock for all: CLOCK_MONOTONIC is not namespaced), holding its slot
    HOLD_S; at no moment do three spans overlap, and the pairs do overlap. (Programs cannot
    signal the host while they run: their directory is a tmpfs of their own.)"""
    program = (f"import time\nstart = time.monotonic()\ntime.sleep({HOLD_S})\n"
               "print(start, time.monotonic())")
    limits = {**FAST, "cpu_s": 5.0, "wall_s": 30.0}
    results = await asyncio.gather(*(run_python(program, **limits) for _ in range(5)))
    assert all(r.passed for r in results), results
    spans = [tuple(map(float, r.stdout.split())) for r in results]
    running = max(sum(s <= t < e for s, e in spans) for t, _ in spans)
    assert running == 2, spans


async def test_a_cancelled_run_leaves_nothing_behind(clean):
    run = asyncio.create_task(run_python("import time\ntime.sleep(60)", cpu_s=5, wall_s=30))
    await asyncio.sleep(0.5)
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run


def test_every_cause_is_documented():
    assert {"ok", "failed", "incomplete", "timeout", "cpu_limit", "memory", "file_limit",
            "output_limit", "forbidden", "crash", "sandbox_error", "wrong_answer",
            "protocol", "unjudgeable"} == set(CAUSES)


async def test_odd_source_is_the_programs_failure(clean):
    for code in ("x = '\ud800'", "print('a\x00b')", "\ufeffprint(1)"):
        result = await run_python(code, stdin="\udcff", **FAST)
        assert result.cause in ("ok", "failed"), (code, result)
    chmodded = await run_python("import os\nopen('f', 'w').close()\nos.chmod('f', 0)\n"
                                "os.chmod('.', 0o500)", **FAST)
    assert chmodded.passed
