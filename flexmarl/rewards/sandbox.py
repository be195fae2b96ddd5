"""Run model-written Python in a separate, limited process: `run_python`, `code_reward`.

    run_python(code, tests=...)
      |  temp dir: prog.py = code                            (fresh per process, removed after)
      |  bwrap ... python -I -S -B bootstrap prog.py         (see confinement.py; else the fallback)
      |       bootstrap: limits -> audit hook -> the program's top level -> "ready"
      |       parent: the tests, only now -> bootstrap: asserts / calls -> "done" + results
      |  stdout/stderr read incrementally, capped; wall clock -> killpg(SIGKILL), reap
      v
    ExecResult(passed, returncode, stdout, stderr, cause, seconds, cases)

`tests` takes three forms (`flexmarl.rewards.cases`): stdin/stdout cases and call cases are
judged here, on output and on strictly encoded values, so the expected answers never enter the
program's process; free-form asserts run in it after its top level, comparisons made strict.
Either way the tests reach the process only after the program's top level has returned, as the
bootstrap's "ready" line (with a nonce the program cannot read) asks for them.

What holds however the program behaves (enforced by the kernel or by this process):
- Isolation: `isolation()` says what is in force. Under bubblewrap, a read-only view of the
  interpreter and the standard library, a private directory, no network, no other process,
  nothing left behind; without it, `unshare --net` where that works, and one warning.
- CPU time: RLIMIT_CPU (soft = hard, so the kernel SIGKILLs it), cause "cpu_limit".
- Memory: RLIMIT_AS, `memory_mb` of address space; MemoryError gives cause "memory".
- Files: RLIMIT_FSIZE (writes past it fail with EFBIG, cause "file_limit"), RLIMIT_NOFILE.
- Wall clock: past `wall_s` the whole process group is SIGKILLed and reaped, cause "timeout".
- Output: past `max_output_bytes` on stdout or stderr, the same kill, cause "output_limit".
- Environment: `python -I -S -B` (the standard library only: no site-packages, so no numpy;
  no PYTHON* variables), an environment of PATH, HOME and TMPDIR (no inherited secrets).
- Completion: with tests, `passed` needs exit status 0 and the bootstrap's "done" line, which
  it writes only after the last test, so `sys.exit(0)` or `os._exit(0)` before does not pass.

What the audit hook (`_bootstrap.py`) enforces inside the process: no fork/exec/spawn, no
sockets, no ctypes, no threads, no signals to other processes, no frames (the way to the
bootstrap's nonce), no raising of the limits, no writes outside the program's directory. PEP
578 is explicit that audit hooks are not a security boundary; under bwrap the kernel's
namespaces are the boundary and the hook keeps the tests and the verdict out of reach.

Concurrency: at most `max_concurrent()` programs run at once per event loop (default: the
usable CPU cores, `len(os.sched_getaffinity(0))`); `set_max_concurrent(n)` changes it. Callers
beyond the bound wait; the wall clock starts when a program starts, not while it waits.
stdin/stdout cases run one process after another within one call, and stop at the first that
fails.
"""
from __future__ import annotations

import asyncio
import math
import os
import secrets
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from flexmarl.rewards import _bootstrap, cases as forms
from flexmarl.rewards.bounds import LoopBound
from flexmarl.rewards.cases import CallCase, IOCase
from flexmarl.rewards.confinement import BOOTSTRAP, BOX, bwrap_argv, isolation, probed, \
    unshare_prefix

CAUSES = {
    "ok": "exited 0 (and, with tests, ran to the end and every case passed)",
    "failed": "exited non-zero: an uncaught exception such as a failing assert, or sys.exit(n)",
    "wrong_answer": "ran to the end, but a call case returned or a stdin/stdout case printed "
                    "something other than expected",
    "incomplete": "exited 0 before its tests finished (sys.exit(0), os._exit(0))",
    "protocol": "wrote into, closed or replaced the sandbox's own pipes",
    "timeout": "still running at wall_s; killed",
    "cpu_limit": "used cpu_s of CPU time; killed by the kernel",
    "memory": "MemoryError: more than memory_mb of address space",
    "file_limit": "wrote a file past max_file_bytes",
    "output_limit": "wrote more than max_output_bytes to stdout or stderr; killed",
    "forbidden": "died of an operation the sandbox refuses (fork, socket, ctypes, frames, ...)",
    "crash": "killed by a signal (segfault, abort)",
    "sandbox_error": "the sandbox's bootstrap could not set the limits up",
}
"""Every `ExecResult.cause`, with its meaning."""

_EXIT_CAUSES = {_bootstrap.EXIT_MEMORY: "memory", _bootstrap.EXIT_FORBIDDEN: "forbidden",
                _bootstrap.EXIT_FILE_LIMIT: "file_limit", _bootstrap.EXIT_SETUP: "sandbox_error",
                _bootstrap.EXIT_PROTOCOL: "protocol"}
_BOOTSTRAP = str(Path(_bootstrap.__file__).resolve())
_CHUNK_BYTES = 64 << 10
_MAX_CONTROL_BYTES = 64 << 20  # call results: 64 MiB of encoded values at most
_MIN_MEMORY_MB = 32  # the interpreter itself maps about 20 MB
_MAX_OPEN_FILES = 64
_REAP_TIMEOUT_S = 5.0  # SIGKILLed processes die at once; this only guards against a stuck reap

_SLOTS = LoopBound(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                   else os.cpu_count() or 1, name="max_concurrent")


@dataclass(frozen=True)
class ExecResult:
    """How one sandboxed run ended."""

    passed: bool
    """Exited 0 having run to the end (with tests: every case passed, past the last assert)."""
    returncode: int | None
    """The exit status; negative for a signal (-9 also when the sandbox killed it)."""
    stdout: str
    """Captured stdout, at most max_output_bytes (decoded, undecodable bytes replaced)."""
    stderr: str
    """Captured stderr, the same way; a failing assert's AssertionError traceback is here."""
    cause: str
    """One of `CAUSES`: "ok", "failed", "wrong_answer", "timeout", "cpu_limit", ..."""
    seconds: float
    """Wall time from start to exit (not counting the wait for a concurrency slot)."""
    cases: tuple[bool, ...] = ()
    """Call or stdin/stdout cases: which passed (stdin/stdout stops at the first failure, the
    rest count as failed). Empty for asserts and plain scripts."""


def set_max_concurrent(n: int) -> None:
    """At most `n` sandboxed programs run at once in each event loop (default: CPU cores)."""
    _SLOTS.set_limit(n)


def max_concurrent() -> int:
    return _SLOTS.limit


async def network_isolated() -> bool:
    """Whether programs get an empty network namespace (bwrap, or `unshare --net`)."""
    return (await _isolation()).network


async def code_reward(code: str, tests: object, **limits: float) -> float:
    """1.0 if `code` passes `tests` in the sandbox, else 0.0.

    `tests`: a list of IOCase, a list of CallCase or (call, expected) pairs, or a str of
    asserts (the weakest form: see `flexmarl.rewards.cases`). `limits` are run_python's
    (cpu_s, wall_s, memory_mb, ...). In a workflow:
    `ctx.reward(c, await code_reward(extract_code(c.text), task.tests))`.
    """
    return 1.0 if (await run_python(code, tests=tests, **limits)).passed else 0.0


async def run_python(code: str, *, tests: object = "", stdin: str = "", cpu_s: float = 2.0,
                     wall_s: float = 5.0, memory_mb: int = 256,
                     max_output_bytes: int = 64 << 10,
                     max_file_bytes: int = 16 << 20) -> ExecResult:
    """Run `code` in a fresh sandboxed interpreter, then its `tests`; see the module docstring.

    `stdin` is the program's input with asserts, call cases or no tests; stdin/stdout cases
    bring their own. `cpu_s` and `wall_s` bound each process (one per stdin/stdout case). A
    program that fails, hangs, crashes or floods gives passed=False and its `cause`; this
    raises only for bad arguments (ValueError) or when no process can be started (OSError).
    """
    _check_args(code, stdin, cpu_s, wall_s, memory_mb, max_output_bytes, max_file_bytes)
    parsed = forms.parse_tests(tests)
    if stdin and isinstance(parsed, tuple) and isinstance(parsed[0], IOCase):
        raise ValueError("stdin is given twice: stdin/stdout cases bring their own input")
    where = await _isolation()
    limits = [math.ceil(cpu_s), memory_mb << 20, max_file_bytes, _MAX_OPEN_FILES]
    run = _Runner(where.bwrap is not None, code, limits, wall_s, max_output_bytes)
    async with _SLOTS.hold():
        if isinstance(parsed, tuple) and isinstance(parsed[0], IOCase):
            return await run.io_cases(parsed)
        return await run.once(stdin, parsed)


def _check_args(code: object, stdin: object, cpu_s: object, wall_s: object, memory_mb: object,
                max_output_bytes: object, max_file_bytes: object) -> None:
    for name, value in (("code", code), ("stdin", stdin)):
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


async def _isolation():
    found = probed()
    return found if found is not None else await asyncio.to_thread(isolation)


@dataclass
class _Outcome:
    returncode: int | None
    stdout: bytes
    stderr: bytes
    control: bytes
    killed_for: str | None
    seconds: float


class _Runner:
    """One program, run once (a script, asserts or calls) or once per stdin/stdout case."""

    def __init__(self, bwrap: bool, code: str, limits: list[int], wall_s: float,
                 max_output_bytes: int) -> None:
        self.bwrap, self.code, self.limits = bwrap, code, limits
        self.wall_s, self.max_output_bytes = wall_s, max_output_bytes

    async def io_cases(self, cases: tuple[IOCase, ...]) -> ExecResult:
        verdicts: list[bool] = []
        seconds = 0.0
        for case in cases:
            outcome = await self._process(case.stdin.encode("utf-8", "surrogatepass"), None)
            seconds += outcome.seconds
            cause = outcome.killed_for or _cause(outcome.returncode, True)
            if cause == "ok" and not forms.same_output(case.stdout, _text(outcome.stdout)):
                cause = "wrong_answer"
            verdicts.append(cause == "ok")
            if cause != "ok":
                break
        verdicts += [False] * (len(cases) - len(verdicts))
        return _result(outcome, cause, seconds, tuple(verdicts))

    async def once(self, stdin: str, tests: object) -> ExecResult:
        data = stdin.encode("utf-8", "surrogatepass")
        if tests == "":
            outcome = await self._process(data, None)
            return _result(outcome, outcome.killed_for or _cause(outcome.returncode, True),
                          outcome.seconds)
        outcome = await self._process(data, forms.tests_payload(tests))
        calls = tests if isinstance(tests, tuple) else None
        cause, verdicts = outcome.killed_for, ()
        if cause is None:
            cause = _cause(outcome.returncode, True)
        if cause == "ok":
            cause, verdicts = self._verdict(outcome, calls)
        elif calls:
            verdicts = (False,) * len(calls)
        return _result(outcome, cause, outcome.seconds, verdicts)

    def _verdict(self, outcome: _Outcome, calls: tuple[CallCase, ...] | None
                 ) -> tuple[str, tuple[bool, ...]]:
        ready = b"R" + self.nonce + b"\n"
        done = b"F" + self.nonce + b" "
        failed = (False,) * len(calls or ())
        control = outcome.control
        if control in (b"", ready):
            return "incomplete", failed
        if not (control.startswith(ready + done) and control.endswith(b"\n")
                and control.count(b"\n") == 2):
            return "protocol", failed
        if calls is None:
            return "ok", ()
        verdicts = forms.judge_calls(calls, control[len(ready) + len(done):-1])
        if verdicts is None:
            return "protocol", failed
        return ("ok" if all(verdicts) else "wrong_answer"), verdicts

    async def _process(self, stdin: bytes, payload: bytes | None) -> _Outcome:
        # TemporaryDirectory's cleanup also undoes a program's chmod of its own files.
        with tempfile.TemporaryDirectory(prefix="flexmarl-sandbox-",
                                         ignore_cleanup_errors=True) as workdir:
            program = Path(workdir) / "prog.py"
            # surrogatepass: a lone surrogate in model text is the program's SyntaxError,
            # not our UnicodeEncodeError.
            program.write_bytes(self.code.encode("utf-8", "surrogatepass"))
            if self.bwrap:
                argv = [*bwrap_argv(workdir, _BOOTSTRAP), "-I", "-S", "-B", BOOTSTRAP,
                        f"{BOX}/prog.py"]
                env = {"PATH": os.defpath, "HOME": BOX, "TMPDIR": BOX}
            else:
                argv = [*unshare_prefix(), sys.executable, "-I", "-S", "-B", _BOOTSTRAP,
                        str(program)]
                env = {"PATH": os.environ.get("PATH", os.defpath), "HOME": workdir,
                       "TMPDIR": workdir}
            return await self._spawn(argv, env, workdir, stdin, payload)

    async def _spawn(self, argv: list[str], env: dict, workdir: str, stdin: bytes,
                     payload: bytes | None) -> _Outcome:
        self.nonce = secrets.token_hex(16).encode()
        pipes: list[int] = []
        try:
            if payload is None:
                mode, child_fds = "script", (-1, -1)
            else:
                control_r, control_w = os.pipe()
                tests_r, tests_w = os.pipe()
                pipes += [control_r, control_w, tests_r, tests_w]
                mode, child_fds = "tests", (control_w, tests_r)
            start = time.monotonic()
            proc = await asyncio.create_subprocess_exec(
                *argv, mode, *map(str, child_fds), *map(str, self.limits),
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE, cwd=workdir, env=env,
                start_new_session=True, pass_fds=[fd for fd in child_fds if fd >= 0])
            control = bytearray()
            if payload is not None:
                for fd in (control_w, tests_r):  # the child's copies are the only ones left
                    os.close(fd)
                    pipes.remove(fd)
                os.write(tests_w, self.nonce + b"\n")  # 33 bytes: a pipe takes them at once
                talk = self._talk(control_r, tests_w, payload, control)
                pipes.remove(control_r)
                pipes.remove(tests_w)  # _talk owns them now
            else:
                talk = None
            out, err = bytearray(), bytearray()
            try:
                killed_for = await _supervise(proc, stdin, out, err, self.wall_s,
                                              self.max_output_bytes, talk)
            finally:
                await _kill_group(proc)
            returncode = proc.returncode
            if self.bwrap and returncode is not None and 128 < returncode < 128 + signal.NSIG:
                returncode = 128 - returncode  # bwrap reports death by signal N as 128 + N
            return _Outcome(returncode, bytes(out), bytes(err), bytes(control), killed_for,
                            time.monotonic() - start)
        finally:
            for fd in pipes:
                os.close(fd)

    async def _talk(self, control_r: int, tests_w: int, payload: bytes,
                    control: bytearray) -> None:
        """Send the tests once the bootstrap's "ready" line came, then read to the end."""
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=_CHUNK_BYTES)
        transport, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(control_r, "rb", 0))
        writer_transport = None
        tests_open = True  # until a transport owns it or it is closed
        try:
            ready = b"R" + self.nonce + b"\n"
            first = await reader.read(len(ready))
            while len(first) < len(ready) and (more := await reader.read(len(ready) -
                                                                         len(first))):
                first += more
            control += first
            if first == ready:
                tests_open = False
                writer_transport, protocol = await loop.connect_write_pipe(
                    asyncio.streams.FlowControlMixin, os.fdopen(tests_w, "wb", 0))
                writer = asyncio.StreamWriter(writer_transport, protocol, None, loop)
                try:
                    writer.write(self.nonce + b"\n" + payload)
                    await writer.drain()
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the program closed its end; the verdict says "protocol"
                writer_transport.close()  # EOF: the bootstrap reads to it
            while chunk := await reader.read(_CHUNK_BYTES):
                control += chunk[:_MAX_CONTROL_BYTES - len(control)]
        finally:
            transport.close()
            if writer_transport is not None:
                writer_transport.close()
            if tests_open:
                os.close(tests_w)


async def _supervise(proc: asyncio.subprocess.Process, stdin: bytes, out: bytearray,
                     err: bytearray, wall_s: float, max_output_bytes: int,
                     talk) -> str | None:
    """Feed stdin, drain both pipes (and talk on the control pipes), wait for the exit. The
    cause if it had to be killed."""
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
        await asyncio.gather(drain(proc.stdout, out), drain(proc.stderr, err), feed(),
                             *([talk] if talk is not None else []))
        await proc.wait()

    finished = asyncio.ensure_future(finish())
    overflow = asyncio.ensure_future(flooded.wait())
    try:
        await asyncio.wait((finished, overflow), timeout=wall_s,
                           return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (finished, overflow):
            task.cancel()
        if talk is not None and not finished.done():
            await asyncio.gather(finished, return_exceptions=True)  # close the pipes it owns
    if finished.done() and not finished.cancelled():
        finished.result()  # an unexpected error of our own pipes, not the program's
        return None
    return "output_limit" if flooded.is_set() else "timeout"


async def _kill_group(proc: asyncio.subprocess.Process) -> None:
    """SIGKILL the program's process group (it leads it: start_new_session) and reap it.

    Also after a normal exit, for any process it managed to leave behind; such a straggler
    keeps the group id in use, so the id cannot meanwhile name someone else's group. Under
    bwrap, the program's own PID namespace ends with it (--die-with-parent).
    """
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        await asyncio.wait_for(proc.wait(), _REAP_TIMEOUT_S)
    except asyncio.TimeoutError:
        pass  # SIGKILLed yet not reaped: left to the event loop's child watcher


def _result(outcome: _Outcome, cause: str, seconds: float,
            cases: tuple[bool, ...] = ()) -> ExecResult:
    return ExecResult(passed=cause == "ok", returncode=outcome.returncode,
                      stdout=_text(outcome.stdout), stderr=_text(outcome.stderr), cause=cause,
                      seconds=seconds, cases=cases)


def _text(data: bytes) -> str:
    return data.decode("utf-8", "replace")


def _cause(returncode: int | None, completed: bool) -> str:
    if returncode == 0:
        return "ok" if completed else "incomplete"
    if returncode in (-signal.SIGKILL, -signal.SIGXCPU):
        return "cpu_limit"  # nobody else SIGKILLs it: the sandbox's own kills are named above
    if returncode is not None and returncode < 0:
        return "crash"
    return _EXIT_CAUSES.get(returncode, "failed")
