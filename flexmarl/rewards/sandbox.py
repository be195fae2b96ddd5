"""Run model-written Python in separate, limited processes: `run_python`, `code_reward`.

    run_python(code, tests=...)
      |  temp dir: prog.py = code                          (fresh per process, removed after)
      |  bwrap --seccomp FD ... python -I -S -B bootstrap.pyc ROLE ...      (confinement.py;
      |        else: unshare --net -- python _seccomp_exec.pyc FD python ... bootstrap.pyc)
      |    script: the program; its output and exit status judged here (stdin/stdout cases)
      |    serve:  the program's top level -> "R" nonce -> answers requests, one line each:
      |              call cases: ["eval", "add(1, 2)"] -> ["ok", 3], compared here
      |    judge:  free-form asserts, in a second sandboxed process; each use of the program's
      |            names is a request relayed here to the serving program, line by line
      |  stdout/stderr read incrementally, capped; wall clock -> killpg(SIGKILL), reap
      v
    ExecResult(passed, returncode, stdout, stderr, cause, seconds, cases)

The rule: nothing that decides the verdict is ever in the program's process. Expected values
live in this process (stdin/stdout and call cases) or in the judge's (asserts); the program's
process receives only inputs (its stdin, a call's expression or arguments), after its top level
has returned. Whatever a program reads of its own process (frames, every object, its memory) or
writes on its pipes (at most an answer it could have returned) earns nothing: a reply is a value,
judged elsewhere; the nonce only frames the ready line. `flexmarl.rewards.cases` says what the
judge can and cannot express.

What holds however the program behaves (enforced by the kernel or by this process):
- Isolation: `isolation()` says what is in force. Under bubblewrap, a read-only view of the
  interpreter and the standard library, a private directory, no network, no other process,
  nothing left behind; without it, `unshare --net` where that works, and one warning.
- Seccomp, installed before the interpreter starts (bwrap's --seccomp, or `_seccomp_exec.py`):
  no new processes or threads, no ptrace, no process_vm_readv; ctypes is never loaded in the
  sandboxed interpreter (the bootstrap checks).
- CPU time: RLIMIT_CPU (soft = hard, so the kernel SIGKILLs it), cause "cpu_limit".
- Memory: RLIMIT_AS, `memory_mb` of address space; MemoryError gives cause "memory".
- Files: RLIMIT_FSIZE (writes past it fail with EFBIG, cause "file_limit"), RLIMIT_NOFILE.
- Wall clock: past `wall_s` every process group of the run is SIGKILLed and reaped, cause
  "timeout".
- Output: past `max_output_bytes` on stdout or stderr, the same kill, cause "output_limit".
- Environment: `python -I -S -B` (the standard library only: no site-packages, so no numpy;
  no PYTHON* variables), an environment of PATH, HOME and TMPDIR (no inherited secrets).
- Completion: with tests, `passed` needs every answer judged right and the program to have
  served to the end; leaving early (`sys.exit(0)`, `os._exit(0)`) is "incomplete".
- The interpreter: `set_interpreter(path)` picks the Python (3.11+) that runs programs and
  tests; `bench/reward_hacks.py --python all` runs the reward-hack corpus under each one here.

The audit hook (`_bootstrap.py`) is a second wall in both processes: no fork/exec/spawn, no
sockets, no ctypes, no signals to other processes, no raising of the limits, no sys.monitoring
callbacks, no other process's /proc entries, no writes outside the run's directory. PEP 578 is
explicit that audit hooks are not a security boundary; under bwrap the kernel's namespaces are.

Concurrency: at most `max_concurrent()` runs at once per event loop (default: the usable CPU
cores, `len(os.sched_getaffinity(0))`); `set_max_concurrent(n)` changes it. Callers beyond the
bound wait; the wall clock starts when a run starts, not while it waits. stdin/stdout cases run
one process after another within one call, and stop at the first that fails; asserts run two
processes (the program and the judge) at once.
"""
from __future__ import annotations

import asyncio
import contextlib
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
from flexmarl.rewards.confinement import BOOTSTRAP, BOX, bwrap_argv, compiled, interpreter, \
    isolation, probed, seccomp_filter, unshare_prefix

CAUSES = {
    "ok": "exited 0 (and, with tests, ran to the end and every case passed)",
    "failed": "exited non-zero: an uncaught exception such as a failing assert, or sys.exit(n)",
    "wrong_answer": "ran to the end, but a call case returned or a stdin/stdout case printed "
                    "something other than expected",
    "incomplete": "exited 0 before its tests finished (sys.exit(0), os._exit(0))",
    "protocol": "closed or replaced the sandbox's own pipes",
    "timeout": "still running at wall_s; killed",
    "cpu_limit": "used cpu_s of CPU time; killed by the kernel",
    "memory": "MemoryError: more than memory_mb of address space",
    "file_limit": "wrote a file past max_file_bytes",
    "output_limit": "wrote more than max_output_bytes to stdout or stderr; killed",
    "forbidden": "died of an operation the sandbox refuses (fork, socket, ctypes, ...)",
    "unjudgeable": "an assert used an object the program returned in a way only the program's "
                   "own code could answer (compared, hashed, membership, arithmetic), or passed "
                   "the program a function of the tests: return plain values",
    "crash": "killed by a signal (segfault, abort)",
    "sandbox_error": "the sandbox's bootstrap could not set the limits up",
}
"""Every `ExecResult.cause`, with its meaning."""

_EXIT_CAUSES = {_bootstrap.EXIT_MEMORY: "memory", _bootstrap.EXIT_FORBIDDEN: "forbidden",
                _bootstrap.EXIT_FILE_LIMIT: "file_limit", _bootstrap.EXIT_SETUP: "sandbox_error",
                _bootstrap.EXIT_PROTOCOL: "protocol", _bootstrap.EXIT_UNJUDGEABLE: "unjudgeable"}
_BOOTSTRAP = str(Path(_bootstrap.__file__).resolve())
_SECCOMP_EXEC = str(Path(_bootstrap.__file__).resolve().with_name("_seccomp_exec.py"))
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
        data = stdin.encode("utf-8", "surrogatepass")
        if isinstance(parsed, tuple) and isinstance(parsed[0], IOCase):
            return await run.io_cases(parsed)
        if isinstance(parsed, tuple):
            return await run.calls(data, parsed)
        if parsed:
            return await run.judged(data, parsed)
        outcome = await run.script(data)
        return _result(outcome, outcome.killed_for or _cause(outcome.returncode),
                       outcome.seconds)


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
    killed_for: str | None
    seconds: float


class _Channel:
    """The parent's ends of a child's two control pipes: the child's lines in, requests out."""

    def __init__(self) -> None:
        self.ctl_r, self.ctl_w = os.pipe()
        self.req_r, self.req_w = os.pipe()
        self.child_fds = (self.ctl_w, self.req_r)
        self.reader: asyncio.StreamReader | None = None
        self.transports: list = []
        self.writer: asyncio.StreamWriter | None = None

    async def open(self) -> None:
        """Once the child holds its ends: close ours of them, and take the others to the loop."""
        for fd in self.child_fds:
            os.close(fd)
        self.child_fds = ()
        loop = asyncio.get_running_loop()
        self.reader = asyncio.StreamReader(limit=_MAX_CONTROL_BYTES)
        ctl_r, self.ctl_r = self.ctl_r, -1
        transport, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(self.reader), os.fdopen(ctl_r, "rb", 0))
        self.transports.append(transport)
        req_w, self.req_w = self.req_w, -1
        transport, protocol = await loop.connect_write_pipe(
            asyncio.streams.FlowControlMixin, os.fdopen(req_w, "wb", 0))
        self.transports.append(transport)
        self.writer = asyncio.StreamWriter(transport, protocol, None, loop)

    async def send(self, data: bytes) -> bool:
        """False once the child has closed its end (it ended, or broke the protocol)."""
        try:
            self.writer.write(data)
            await self.writer.drain()
            return True
        except (BrokenPipeError, ConnectionResetError, RuntimeError):
            return False

    async def line(self) -> bytes | None:
        """The child's next line; None at its end, or past the size a line may have."""
        try:
            line = await self.reader.readline()
        except (ValueError, asyncio.LimitOverrunError):
            return None
        return line if line.endswith(b"\n") else None

    def stop_sending(self) -> None:
        """EOF on the requests pipe: a serving program answers the rest and exits."""
        if self.writer is not None:
            self.writer.transport.close()

    def close(self) -> None:
        for transport in self.transports:
            transport.close()
        for fd in (self.ctl_r, self.req_w, *self.child_fds):
            if fd >= 0:
                os.close(fd)


class _Child:
    """One sandboxed interpreter in its own session; stdout and stderr drained, capped."""

    def __init__(self, proc: asyncio.subprocess.Process, stdin: bytes, limit: int,
                 bwrap: bool, merged: bool) -> None:
        self.proc, self.limit, self.bwrap, self.merged = proc, limit, bwrap, merged
        self.out, self.err = bytearray(), bytearray()
        self.flooded = asyncio.Event()
        self.done = asyncio.ensure_future(self._run(stdin))

    async def _drain(self, stream: asyncio.StreamReader | None, buf: bytearray) -> None:
        while stream is not None and (chunk := await stream.read(_CHUNK_BYTES)):
            room = self.limit - len(buf)
            buf += chunk[:room]
            if len(chunk) > room:
                self.flooded.set()
                return

    async def _feed(self, data: bytes) -> None:
        try:
            self.proc.stdin.write(data)
            await self.proc.stdin.drain()
            self.proc.stdin.close()
        except (BrokenPipeError, ConnectionResetError):
            pass  # the program exited without reading all its input

    async def _run(self, stdin: bytes) -> None:
        # merged: stdout and stderr on one pipe (the judge's), kept as stderr
        await asyncio.gather(self._drain(self.proc.stdout, self.err if self.merged else self.out),
                             self._drain(self.proc.stderr, self.err), self._feed(stdin))
        await self.proc.wait()

    @property
    def returncode(self) -> int | None:
        code = self.proc.returncode
        if self.bwrap and code is not None and 128 < code < 128 + signal.NSIG:
            code = 128 - code  # bwrap reports death by signal N as 128 + N
        return code

    def end(self) -> None:
        """SIGKILL its process group now; its pipes then end, and `done` with them."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    async def kill(self) -> None:
        self.done.cancel()
        await asyncio.gather(self.done, return_exceptions=True)
        await _kill_group(self.proc)


class _Runner:
    """One program, run once (a script, call cases or judged asserts) or once per stdin/stdout
    case."""

    def __init__(self, bwrap: bool, code: str, limits: list[int], wall_s: float,
                 max_output_bytes: int) -> None:
        self.bwrap, self.code, self.limits = bwrap, code, limits
        self.wall_s, self.max_output_bytes = wall_s, max_output_bytes
        self.nonce = secrets.token_hex(16).encode()

    async def io_cases(self, cases: tuple[IOCase, ...]) -> ExecResult:
        verdicts: list[bool] = []
        seconds = 0.0
        for case in cases:
            outcome = await self.script(case.stdin.encode("utf-8", "surrogatepass"))
            seconds += outcome.seconds
            cause = outcome.killed_for or _cause(outcome.returncode)
            if cause == "ok" and not forms.same_output(case.stdout, _text(outcome.stdout)):
                cause = "wrong_answer"
            verdicts.append(cause == "ok")
            if cause != "ok":
                break
        verdicts += [False] * (len(cases) - len(verdicts))
        return _result(outcome, cause, seconds, tuple(verdicts))

    async def script(self, stdin: bytes) -> _Outcome:
        """The program alone, judged by its output and exit status."""
        with _workdir(self.code) as workdir:
            start = time.monotonic()
            child = await self._spawn("script", workdir, stdin, ())
            killed_for = await _supervise([child], None, self.wall_s)
            return _Outcome(child.returncode, bytes(child.out), bytes(child.err), killed_for,
                            time.monotonic() - start)

    async def calls(self, stdin: bytes, calls: tuple[CallCase, ...]) -> ExecResult:
        """Call cases: each expression evaluated by the program, its value compared here."""
        replies: list[bytes] = []
        with _workdir(self.code) as workdir, _closing(_Channel()) as channel:
            start = time.monotonic()
            program = await self._spawn("serve", workdir, stdin, channel.child_fds)

            async def talk() -> None:
                if await self._ready(channel):
                    for case in calls:
                        request = b'["eval",' + forms.quote(case.call) + b"]\n"
                        if not await channel.send(request) or (
                                reply := await channel.line()) is None:
                            return
                        replies.append(reply)
                channel.stop_sending()

            killed_for = await _supervise([program], talk(), self.wall_s)
            outcome = _Outcome(program.returncode, bytes(program.out), bytes(program.err),
                               killed_for, time.monotonic() - start)
        verdicts = tuple(forms.judge_reply(case, reply) for case, reply in zip(calls, replies))
        verdicts += (False,) * (len(calls) - len(verdicts))
        cause = killed_for or _cause(outcome.returncode)
        if cause == "ok":
            cause = ("incomplete" if len(replies) < len(calls) else
                     "ok" if all(verdicts) else "wrong_answer")
        return _result(outcome, cause, outcome.seconds, verdicts)

    async def judged(self, stdin: bytes, tests: str) -> ExecResult:
        """Free-form asserts: run by a judge process of their own, the program answering its
        requests (relayed here, line by line) from another."""
        text = tests.encode("utf-8", "surrogatepass")
        gone = False  # the program ended (or broke the protocol) before the judge did
        ready_seen = [False]  # the program's top level returned (else it was killed early)
        with _workdir(self.code) as workdir, _workdir(None) as judge_dir, \
                _closing(_Channel()) as channel, _closing(_Channel()) as to_judge:
            start = time.monotonic()
            program = await self._spawn("serve", workdir, stdin, channel.child_fds)
            judge = await self._spawn("judge", judge_dir, b"", to_judge.child_fds,
                                      program_name="tests")

            async def talk() -> None:
                nonlocal gone
                await to_judge.open()
                ready = asyncio.ensure_future(self._ready(channel))
                ready.add_done_callback(lambda f: ready_seen.__setitem__(
                    0, not f.cancelled() and f.exception() is None and f.result()))
                try:
                    await to_judge.send(b"%d\n" % len(text) + text)
                    while (request := await to_judge.line()) is not None:
                        reply = None
                        if not gone:
                            if await ready and await channel.send(request):
                                reply = await channel.line()
                            gone = reply is None
                        if not await to_judge.send(reply or b'["gone"]\n'):
                            break
                finally:
                    if not ready.done():  # the judge ended before the program was ready
                        ready.cancel()
                        program.end()
                    channel.stop_sending()

            killed_for = await _supervise([program, judge], talk(), self.wall_s)
            seconds = time.monotonic() - start
            answered = ready_seen[0]
        program_cause = _cause(program.returncode)
        judge_cause = _cause(judge.returncode)
        if killed_for:
            cause, child = killed_for, (judge if judge.flooded.is_set() else program)
        elif gone:  # the program's own end decides: its limit, its crash, its early exit
            cause, child = ("incomplete" if program_cause == "ok" else program_cause), program
        elif judge_cause != "ok" or not answered:
            cause, child = judge_cause, judge  # a failed assert; the program may be killed
        else:
            cause, child = program_cause, program
        err = bytes(program.err) + (b"" if not judge.err else bytes(judge.err))
        outcome = _Outcome(child.returncode, bytes(program.out), err, killed_for, seconds)
        return _result(outcome, cause, seconds)

    async def _ready(self, channel: _Channel) -> bool:
        """Send the program its nonce and wait for its "ready" line (its top level returned)."""
        await channel.open()
        return (await channel.send(self.nonce + b"\n")
                and await channel.line() == b"R" + self.nonce + b"\n")

    async def _spawn(self, role: str, workdir: str, stdin: bytes, fds: tuple[int, ...],
                     program_name: str = "prog.py") -> _Child:
        seccomp = seccomp_filter()
        filter_r, filter_w = os.pipe()
        try:
            os.write(filter_w, seccomp)  # a few hundred bytes: the pipe takes them at once
            os.close(filter_w)
            interpreter_ = interpreter()
            bootstrap, launcher_pyc = compiled(_BOOTSTRAP, _SECCOMP_EXEC)
            fd_args = [str(fd) for fd in fds] or ["-1", "-1"]
            if self.bwrap:
                argv = [*bwrap_argv(workdir, bootstrap, filter_r if seccomp else None),
                        "-I", "-S", "-B", BOOTSTRAP, role, f"{BOX}/{program_name}"]
                env = {"PATH": os.defpath, "HOME": BOX, "TMPDIR": BOX}
            else:
                launcher = ([interpreter_, "-I", "-S", "-B", launcher_pyc, str(filter_r)]
                            if seccomp else [])
                argv = [*unshare_prefix(), *launcher, interpreter_, "-I", "-S", "-B",
                        bootstrap, role, str(Path(workdir) / program_name)]
                env = {"PATH": os.environ.get("PATH", os.defpath), "HOME": workdir,
                       "TMPDIR": workdir}
            proc = await asyncio.create_subprocess_exec(
                *argv, *fd_args, *map(str, self.limits),
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT if role == "judge" else asyncio.subprocess.PIPE,
                cwd=workdir, env=env, start_new_session=True, pass_fds=[filter_r, *fds])
        finally:
            os.close(filter_r)
        return _Child(proc, stdin, self.max_output_bytes, self.bwrap, merged=role == "judge")


@contextlib.contextmanager
def _workdir(code: str | None):
    """A fresh directory (with prog.py = `code`); its cleanup also undoes a program's chmod of
    its own files."""
    with tempfile.TemporaryDirectory(prefix="flexmarl-sandbox-",
                                     ignore_cleanup_errors=True) as workdir:
        if code is not None:
            # surrogatepass: a lone surrogate in model text is the program's SyntaxError, not
            # our UnicodeEncodeError.
            (Path(workdir) / "prog.py").write_bytes(code.encode("utf-8", "surrogatepass"))
        yield workdir


@contextlib.contextmanager
def _closing(channel: _Channel):
    try:
        yield channel
    finally:
        channel.close()


async def _supervise(children: list[_Child], talk, wall_s: float) -> str | None:
    """Wait for the children to exit (and the talk on their pipes to end), at most `wall_s`.
    The cause if they had to be killed; every child's process group is killed and reaped."""
    finished = asyncio.ensure_future(asyncio.gather(
        *(child.done for child in children), *([talk] if talk is not None else [])))
    floods = [asyncio.ensure_future(child.flooded.wait()) for child in children]
    try:
        done, _ = await asyncio.wait((finished, *floods), timeout=wall_s,
                                     return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (finished, *floods):
            task.cancel()
        await asyncio.gather(finished, *floods, return_exceptions=True)
        for child in children:
            await child.kill()
    if any(child.flooded.is_set() for child in children):
        return "output_limit"
    if finished in done:
        finished.result()  # an unexpected error of our own pipes, not the program's
        return None
    return "timeout"


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


def _cause(returncode: int | None) -> str:
    if returncode == 0:
        return "ok"
    if returncode in (-signal.SIGKILL, -signal.SIGXCPU):
        return "cpu_limit"  # nobody else SIGKILLs it: the sandbox's own kills are named above
    if returncode is not None and returncode < 0:
        return "crash"
    return _EXIT_CAUSES.get(returncode, "failed")
