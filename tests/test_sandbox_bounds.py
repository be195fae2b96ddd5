"""What a program can cost its caller, and what the unsafe fallback still refuses
(flexmarl.rewards, issue 61). Each test under bubblewrap and on the fallback (`where`):
- replies: one past max_reply_bytes is unjudgeable; a set of ints that all hash alike is
  decoded without a hash table (the caller's event loop keeps ticking: STALL_S); nothing of a
  run's replies is kept;
- the disk: a deep directory tree is removed without raising (or never reaches the host: under
  bwrap /box is a tmpfs), and the box holds at most max_box_bytes;
- the fallback's holes of the third pass: paths relative to a directory descriptor, signals to
  other processes, FIFOs, SIGIO ownership, modules that write behind the audit hook;
- the sandbox's own code is never a file: no `flexmarl-bootstrap-*` directory."""
from __future__ import annotations

import asyncio
import glob
import os
import tempfile
import time

import pytest

from flexmarl.rewards import CallCase, run_python
from tests.helpers.sandbox import where  # noqa: F401 - a fixture

from .reward_hacks.redteam import UNHOOK

FAST = {"cpu_s": 2.0, "wall_s": 10.0, "memory_mb": 256}
STALL_S = 2.0
"""The longest the caller's event loop may go without ticking during one run. Decoding a
colliding set took the caller 15-21 s before (quadratic in the set); linear decoding of a
1 MiB line takes milliseconds, so 2 s only fails if it is quadratic again."""


def sandbox_dirs() -> set[str]:
    return set(glob.glob(os.path.join(tempfile.gettempdir(), "flexmarl-sandbox-*")))


async def ticking(run) -> tuple[object, float]:
    """`run`'s result and the longest gap between ticks of a 10 ms timer meanwhile."""
    ticks = [time.monotonic()]

    async def tick() -> None:
        while True:
            await asyncio.sleep(0.01)
            ticks.append(time.monotonic())

    ticker = asyncio.create_task(tick())
    try:
        result = await run
    finally:
        ticker.cancel()
    # Up to now, not to the last tick: work at the very end of `run` blocks the loop too.
    ticks.append(time.monotonic())
    return result, max(b - a for a, b in zip(ticks, ticks[1:]))


# The program writes its reply line itself (it shares its interpreter with the loop that
# answers): 30,000 ints that all hash alike, as a set and as a dict, under 1 MiB.
COLLIDING = """import sys
_server = sys._getframe(1).f_globals["_Server"]
_items = ",".join(str(i * (2 ** 61 - 1)) for i in range(1, 30_001))
_server.handle = lambda self, line: {reply}
def add(a, b):
    return 0
"""


@pytest.mark.parametrize("reply", ["'[\"ok\",{\"s\":[' + _items + ']}]'",
                                   "'[\"ok\",{\"d\":[' + _items.replace(',', ',0],[')"
                                   " .join(('[', ',0]')) + ']}]'"])
async def test_a_colliding_reply_costs_the_caller_little(where, reply):
    code = COLLIDING.format(reply=reply)
    for tests in ([("add(1, 2)", 3)], [("add(1, 2)", {0: 0})]):
        result, stall = await ticking(run_python(code, tests=tests, **FAST))
        assert result.cause == "wrong_answer" and stall < STALL_S, (result, stall)
    result, stall = await ticking(run_python(code, tests="assert add(1, 2) == 3", **FAST))
    assert not result.passed and stall < STALL_S, (result, stall)  # the judge's own time


async def test_a_reply_past_max_reply_bytes_is_unjudgeable(where):
    huge = "def add(a, b):\n    return 'x' * (2 << 20)\ndef size():\n    return len(add(1, 2))\n"
    for tests in ([CallCase("add(1, 2)", 3)] * 3, "assert add(1, 2) == 3"):
        result = await run_python(huge, tests=tests, **FAST)
        assert result.cause == "unjudgeable" and "max_reply_bytes" in result.stderr, result
    fits = await run_python(huge, tests=[("size()", 2 << 20)], **FAST)
    assert fits.passed  # the value, not the program, is what is capped


async def test_a_dict_reply_compares_without_hashing_its_keys(where):
    code = "def table(n):\n    return {i: i * i for i in range(n)}\n"
    result = await run_python(code, tests=[("table(3)", {0: 0, 1: 1, 2: 4}),
                                           ("table(2)", {0: 0, 1: 1})], **FAST)
    assert result.passed, result
    twice = "def table(n):\n    return {0: 0, 1: 1} if n else {}\n"
    assert not (await run_python(twice, tests=[("table(1)", {0: 0, 2: 4})], **FAST)).passed


async def test_a_deep_tree_is_removed_and_the_box_is_capped(where):
    before = sandbox_dirs()
    # 1500 levels: past the recursion limit of a recursive removal (shutil.rmtree on 3.11);
    # much deeper, the program's own getcwd() calls (the hook's) grow costly.
    deep = ("import os\nfor _ in range(1500):\n    os.mkdir('d')\n    os.chdir('d')\n"
            "open('f', 'w').write('x')\nprint('deep')\n")
    result = await run_python(deep, **FAST)
    assert result.stdout == "deep\n", result
    assert sandbox_dirs() - before == set()
    fill = ("import os\ntry:\n    for i in range(16):\n"
            "        with open(f'f{i}', 'wb') as f:\n            f.write(b'x' * (4 << 20))\n"
            "except OSError as e:\n    print('stopped', e.errno)\n    raise\n")
    result = await run_python(fill, max_file_bytes=8 << 20, max_box_bytes=16 << 20, **FAST)
    if where == "bwrap":  # ENOSPC past the box
        assert result.cause == "file_limit" and "stopped 28" in result.stdout, result
    assert sandbox_dirs() - before == set()


FALLBACK_ESCAPES = {
    "dir_fd": "import os\nfd = os.open('.', os.O_RDONLY)\nos.mkdir('a')\nos.chdir('a')\n"
              "os.open('../../../../../../etc/hostname', os.O_RDONLY, dir_fd=fd)\n",
    "fifo": "import os\nos.mkfifo('f')\n",
    "signal": "import os, signal\nsignal.pidfd_send_signal(os.pidfd_open(os.getppid()), 0)\n",
    "setown": "import fcntl, os\nfcntl.fcntl(0, fcntl.F_SETOWN, os.getppid())\n",
    "sqlite": "import sqlite3\nsqlite3.connect('/tmp/x.db')\n",
    "readline": "import readline\nreadline.write_history_file('/tmp/x')\n",
    "prlimit": "import os, resource\nresource.prlimit(os.getppid(), resource.RLIMIT_CPU)\n",
}


@pytest.mark.parametrize("name", sorted(FALLBACK_ESCAPES))
async def test_the_fallbacks_holes_are_closed(where, name):
    """Each raises (refused by the hook, EPERM from the filter, or absent under bwrap): the
    program fails, nothing outside happens."""
    result = await run_python(FALLBACK_ESCAPES[name], **FAST)
    assert result.cause in ("forbidden", "failed"), (name, result)
    assert any(word in result.stderr for word in (
        "not allowed", "PermissionError", "Operation not permitted", "FileNotFoundError",
        "ModuleNotFoundError", "OperationalError")), (name, result.stderr)


async def test_the_sandboxs_code_is_never_a_file(where):
    before = set(glob.glob(os.path.join(tempfile.gettempdir(), "flexmarl-bootstrap-*")))
    assert (await run_python("def add(a, b):\n    return a + b\n",
                             tests="assert add(1, 2) == 3", **FAST)).passed
    assert set(glob.glob(os.path.join(tempfile.gettempdir(), "flexmarl-bootstrap-*"))) \
        <= before


@pytest.mark.parametrize("delay", [0.0, 0.005, 0.02, 0.05])
async def test_a_run_cancelled_while_it_starts_ends_at_once(where, delay, no_leftover_children):
    """Cancelled at any moment of its start, a run ends within seconds (a start cancelled
    midway could hang its caller on 3.11: it is shielded and killed once started), and leaves
    no process behind (the fixture; the kill is reaped within REAP_S)."""
    run = asyncio.create_task(run_python("def add(a, b):\n    return a + b\n",
                                         tests="assert add(1, 2) == 3", **FAST))
    await asyncio.sleep(delay)
    run.cancel()
    done, _ = await asyncio.wait([run], timeout=30)
    assert run in done
    await asyncio.sleep(REAP_S)


REAP_S = 1.0
"""Time for the event loop to reap a process killed after its run was cancelled (it dies at
once; this is the loop's turn to wait for it)."""


async def test_no_directory_outside_the_box_takes_writes(where):
    """A directory stream's descriptor (os.scandir keeps one; the audit hook never saw it as an
    open) used as a dir_fd: no write lands outside the box, under bwrap (read-only mounts but
    /box) or on the fallback (Landlock; the hook refuses such a scandir)."""
    code = ("import os\nprobe = os.open(os.devnull, os.O_RDONLY)\nos.close(probe)\n"
            "listing = os.scandir({where!r})\n"
            "fd = os.open('flexmarl-escaped-{tag}', os.O_CREAT | os.O_WRONLY, dir_fd=probe)\n")
    for target in ("/", "/dev/shm", tempfile.gettempdir()):
        tag = f"{os.getpid()}-{len(target)}"
        result = await run_python(code.format(where=target, tag=tag), **FAST)
        assert not os.path.exists(os.path.join(target, f"flexmarl-escaped-{tag}")), result
        assert not result.passed, (target, result)


# The audit hook lives in the program's interpreter: a program can switch it off (as the red
# team of issue 61 did: UNHOOK, from the corpus) and load ctypes. What must hold then is the
# kernel's.
UNHOOKED = UNHOOK + '''import os
def errno_of(result):
    return ctypes.get_errno() if result == -1 else 0
print("keyctl", errno_of(libc.syscall({keyctl}, 0, -3, 0)))
print("shmget", errno_of(libc.shmget(0, 4096, 0o1600)))
print("socket", errno_of(libc.socket(2, 1, 0)))
print("kill", errno_of(libc.kill(os.getppid(), 0)))
try:
    os.memfd_create("m")
    print("memfd", 0)
except OSError as e:
    print("memfd", e.errno)
'''


async def test_the_kernels_walls_hold_without_the_audit_hook(where):
    """Keyrings (namespaces do not cover them), SysV shared memory, sockets, signals to the
    caller and memfds (memory RLIMIT_AS does not count): each EPERM from the seccomp filter,
    with the hook switched off and ctypes loaded."""
    keyctl = {"x86_64": 250, "aarch64": 219}.get(os.uname().machine)
    if keyctl is None:
        pytest.skip(f"no seccomp table for {os.uname().machine}")
    result = await run_python(UNHOOKED.format(keyctl=keyctl), **FAST)
    assert result.cause == "ok", result
    said = dict(line.split() for line in result.stdout.splitlines())
    assert said == {name: "1" for name in ("keyctl", "shmget", "socket", "kill", "memfd")}, said
