"""Run model-written Python in a separate, limited process: `run_python`, `code_reward`.

    run_python(code, tests=...)
      |  temp dir: prog.py = code + "\\n" + tests                (fresh per run, removed after)
      |  [unshare --net]  python -I -S -B _bootstrap.py prog.py  (new session, env = PATH only)
      |       bootstrap: rlimits -> audit hook -> runpy.run_path(prog.py) -> completion marker
      |  stdout/stderr read incrementally, capped; wall clock -> killpg(SIGKILL), reap
      v
    ExecResult(passed, returncode, stdout, stderr, cause, seconds)

What holds however the program behaves (enforced by the kernel or by this process):
- CPU time: RLIMIT_CPU (soft = hard, so the kernel SIGKILLs it), cause "cpu_limit".
- Memory: RLIMIT_AS, `memory_mb` of address space; MemoryError gives cause "memory".
- Files: RLIMIT_FSIZE (writes past it fail with EFBIG, cause "file_limit"), RLIMIT_NOFILE.
- Wall clock: past `wall_s` the whole process group is SIGKILLed and reaped, cause "timeout".
- Output: past `max_output_bytes` on stdout or stderr, the same kill, cause "output_limit".
- Environment: `python -I -S -B` (the standard library only: no site-packages, so no numpy;
  no PYTHON* variables), an environment of PATH, and HOME and TMPDIR set to the temp dir (no
  inherited secrets), cwd = the temp dir.
- Network, where `unshare --net` works (as root it does; unprivileged users usually cannot):
  the program gets an empty network namespace, not even loopback. `network_isolated()` says
  whether this machine has it.
- Completion: `passed` needs exit status 0 and, with `tests`, the bootstrap's completion marker
  (a per-run nonce it writes only after the program returned normally), so `sys.exit(0)` or
  `os._exit(0)` before the asserts does not pass.

What only the audit hook (`_bootstrap.py`) enforces: no fork/exec/spawn/subprocess, no sockets
(the only network block without `unshare`), no ctypes, no signals to other processes, no
raising of the limits, no writes outside the temp dir. RLIMIT_NPROC = 0 also stops new
processes, and threads too (threading.Thread fails to start), but the kernel does not apply it
to root, so as root the hook is the only fork-bomb guard (and threads work). PEP 578 is explicit that audit hooks are not a security boundary: code
that sets out to defeat them (reaching the completion nonce through interpreter frames, writing
through dir_fd-relative calls, finding an unhooked C entry point) can. The program runs as the
calling user and can read what that user can read. For hostile code, run the workers as an
unprivileged user inside a container (nsjail, gVisor, firejail) as well.

Concurrency: at most `max_concurrent()` programs run at once per event loop (default: the
usable CPU cores, `len(os.sched_getaffinity(0))`); `set_max_concurrent(n)` changes it. Callers
beyond the bound wait; the wall clock starts when a program starts, not while it waits.
"""
from __future__ import annotations

import asyncio
import math
import os
import secrets
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from flexmarl.rewards import _bootstrap
from flexmarl.rewards.bounds import LoopBound

CAUSES = {
    "ok": "exited 0 (and, with tests, ran to the end)",
    "failed": "exited non-zero: an uncaught exception such as a failing assert, or sys.exit(n)",
    "incomplete": "exited 0 before its tests finished (sys.exit(0), os._exit(0))",
    "timeout": "still running at wall_s; killed",
    "cpu_limit": "used cpu_s of CPU time; killed by the kernel",
    "memory": "MemoryError: more than memory_mb of address space",
    "file_limit": "wrote a file past max_file_bytes",
    "output_limit": "wrote more than max_output_bytes to stdout or stderr; killed",
    "forbidden": "died of an operation the sandbox refuses (fork, socket, ctypes, ...)",
    "crash": "killed by a signal (segfault, abort)",
    "sandbox_error": "the sandbox's bootstrap could not set the limits up",
}
"""Every `ExecResult.cause`, with its meaning."""

_EXIT_CAUSES = {_bootstrap.EXIT_MEMORY: "memory", _bootstrap.EXIT_FORBIDDEN: "forbidden",
                _bootstrap.EXIT_FILE_LIMIT: "file_limit", _bootstrap.EXIT_SETUP: "sandbox_error"}
_BOOTSTRAP = str(Path(_bootstrap.__file__).resolve())
_CHUNK_BYTES = 64 << 10
_MIN_MEMORY_MB = 32  # the interpreter itself maps about 20 MB
_MAX_OPEN_FILES = 64
_REAP_TIMEOUT_S = 5.0  # SIGKILLed processes die at once; this only guards against a stuck reap

_SLOTS = LoopBound(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                   else os.cpu_count() or 1, name="max_concurrent")
_unshare: list[str] | None = None  # the network-namespace prefix, probed once


@dataclass(frozen=True)
class ExecResult:
    """How one sandboxed run ended."""

    passed: bool
    """Exited 0 having run to the end (with `tests`: past the last assert)."""
    returncode: int | None
    """The exit status; negative for a signal (-9 also when the sandbox killed it)."""
    stdout: str
    """Captured stdout, at most max_output_bytes (decoded, undecodable bytes replaced)."""
    stderr: str
    """Captured stderr, the same way; a failing assert's AssertionError traceback is here."""
    cause: str
    """One of `CAUSES`: "ok", "failed", "timeout", "cpu_limit", "memory", ..."""
    seconds: float
    """Wall time from start to exit (not counting the wait for a concurrency slot)."""


def set_max_concurrent(n: int) -> None:
    """At most `n` sandboxed programs run at once in each event loop (default: CPU cores)."""
    _SLOTS.set_limit(n)


def max_concurrent() -> int:
    return _SLOTS.limit


async def network_isolated() -> bool:
    """Whether programs get an empty network namespace (`unshare --net` works here)."""
    return bool(await _unshare_prefix())


async def code_reward(code: str, tests: str, **limits: float) -> float:
    """1.0 if `code` followed by `tests` runs to the end in the sandbox, else 0.0.

    `limits` are run_python's (cpu_s, wall_s, memory_mb, ...). In a workflow:
    `ctx.reward(c, await code_reward(extract_code(c.text), task.tests))`.
    """
    return 1.0 if (await run_python(code, tests=tests, **limits)).passed else 0.0


async def run_python(code: str, *, tests: str = "", stdin: str = "", cpu_s: float = 2.0,
                     wall_s: float = 5.0, memory_mb: int = 256,
                     max_output_bytes: int = 64 << 10,
                     max_file_bytes: int = 16 << 20) -> ExecResult:
    """Run `code + "\\n" + tests` in a fresh sandboxed interpreter; see the module docstring.

    A program that fails, hangs, crashes or floods gives passed=False and its `cause`; this
    raises only for bad arguments (ValueError) or when no process can be started (OSError).
    """
    _check_args(code, tests, stdin, cpu_s, wall_s, memory_mb, max_output_bytes, max_file_bytes)
    prefix = await _unshare_prefix()
    async with _SLOTS.hold():
        # TemporaryDirectory's cleanup also undoes a program's chmod of its own files.
        with tempfile.TemporaryDirectory(prefix="flexmarl-sandbox-",
                                         ignore_cleanup_errors=True) as workdir:
            program = Path(workdir) / "prog.py"
            # surrogatepass: a lone surrogate in model text is the program's SyntaxError,
            # not our UnicodeEncodeError.
            program.write_bytes((code + "\n" + tests).encode("utf-8", "surrogatepass"))
            argv = [*prefix, sys.executable, "-I", "-S", "-B", _BOOTSTRAP, str(program)]
            limits = [math.ceil(cpu_s), memory_mb << 20, max_file_bytes, _MAX_OPEN_FILES]
            return await _run(argv, limits, workdir, stdin.encode("utf-8", "surrogatepass"),
                              wall_s, max_output_bytes, needs_marker=bool(tests))


def _check_args(code: object, tests: object, stdin: object, cpu_s: object, wall_s: object,
                memory_mb: object, max_output_bytes: object, max_file_bytes: object) -> None:
    for name, value in (("code", code), ("tests", tests), ("stdin", stdin)):
        if not isinstance(value, str):
            raise ValueError(f"{name} must be a str of Python source or input, got "
                             f"{type(value).__name__}")
    for name, value in (("cpu_s", cpu_s), ("wall_s", wall_s)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
                0 < value < math.inf):
            raise ValueError(f"{name} must be a number of seconds > 0, got {value!r}")
    for name, value, low in (("memory_mb", memory_mb, _MIN_MEMORY_MB),
                             ("max_output_bytes", max_output_bytes, 1),
                             ("max_file_bytes", max_file_bytes, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{name} must be an int >= {low}, got {value!r}")


async def _run(argv: list[str], limits: list[int], workdir: str, stdin: bytes, wall_s: float,
               max_output_bytes: int, *, needs_marker: bool) -> ExecResult:
    nonce = secrets.token_hex(16).encode()
    marker_r, marker_w = os.pipe()
    start = time.monotonic()
    try:
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv, str(marker_w), *map(str, limits),
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE, cwd=workdir, env=_child_env(workdir),
                start_new_session=True, pass_fds=(marker_w,))
        finally:
            os.close(marker_w)  # the child's copy is the only writer left
        out, err = bytearray(), bytearray()
        try:
            killed_for = await _supervise(proc, nonce + b"\n" + stdin, out, err, wall_s,
                                          max_output_bytes)
        finally:
            await _kill_group(proc)
        marked = _read_marker(marker_r) == nonce
    finally:
        os.close(marker_r)
    cause = killed_for or _cause(proc.returncode, marked or not needs_marker)
    return ExecResult(passed=cause == "ok", returncode=proc.returncode,
                      stdout=out.decode("utf-8", "replace"), stderr=err.decode("utf-8", "replace"),
                      cause=cause, seconds=time.monotonic() - start)


async def _supervise(proc: asyncio.subprocess.Process, stdin: bytes, out: bytearray,
                     err: bytearray, wall_s: float, max_output_bytes: int) -> str | None:
    """Feed stdin, drain both pipes, wait for the exit. The cause if it had to be killed."""
    flooded = asyncio.Event()

    async def drain(stream: asyncio.StreamReader, buf: bytearray) -> None:
        while chunk := await stream.read(_CHUNK_BYTES):
            room = max_output_bytes - len(buf)
            buf += chunk[:room]
            if len(chunk) > room:
                flooded.set()
                return

    async def feed() -> None:
        try:
            proc.stdin.write(stdin)
            await proc.stdin.drain()
            proc.stdin.close()
        except (BrokenPipeError, ConnectionResetError):
            pass  # the program exited without reading all its input

    async def finish() -> None:
        await asyncio.gather(drain(proc.stdout, out), drain(proc.stderr, err), feed())
        await proc.wait()

    finished = asyncio.ensure_future(finish())
    overflow = asyncio.ensure_future(flooded.wait())
    try:
        await asyncio.wait((finished, overflow), timeout=wall_s,
                           return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (finished, overflow):
            task.cancel()
    if finished.done() and not finished.cancelled():
        finished.result()  # an unexpected error of our own pipes, not the program's
        return None
    return "output_limit" if flooded.is_set() else "timeout"


async def _kill_group(proc: asyncio.subprocess.Process) -> None:
    """SIGKILL the program's process group (it leads it: start_new_session) and reap it.

    Also after a normal exit, for any process it managed to leave behind; such a straggler
    keeps the group id in use, so the id cannot meanwhile name someone else's group.
    """
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        await asyncio.wait_for(proc.wait(), _REAP_TIMEOUT_S)
    except asyncio.TimeoutError:
        pass  # SIGKILLed yet not reaped: left to the event loop's child watcher


def _read_marker(fd: int) -> bytes:
    os.set_blocking(fd, False)
    try:
        return os.read(fd, 256)
    except BlockingIOError:
        return b""  # nothing written: the writer is still open only if a straggler holds it


def _cause(returncode: int | None, completed: bool) -> str:
    if returncode == 0:
        return "ok" if completed else "incomplete"
    if returncode in (-signal.SIGKILL, -signal.SIGXCPU):
        return "cpu_limit"  # nobody else SIGKILLs it: the sandbox's own kills are named above
    if returncode is not None and returncode < 0:
        return "crash"
    return _EXIT_CAUSES.get(returncode, "failed")


def _child_env(workdir: str) -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", os.defpath), "HOME": workdir, "TMPDIR": workdir}


async def _unshare_prefix() -> list[str]:
    """["unshare", "--net", "--"] if that works on this machine, else []. Probed once."""
    global _unshare
    if _unshare is None:
        path = shutil.which("unshare")
        works = False
        if path is not None:
            probe = await asyncio.create_subprocess_exec(
                path, "--net", "--", sys.executable, "-I", "-S", "-c", "",
                stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
            works = await probe.wait() == 0
        _unshare = [path, "--net", "--"] if works else []
    return _unshare
