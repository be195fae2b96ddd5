"""Run model-written Python in separate, limited processes: `run_python`, `code_reward`.

    run_python(code, tests=...)
      |  bwrap --seccomp FD --size BOX --tmpfs /box --file FD /box/prog.py ...     (confinement)
      |        python -I -S -B -c LOADER FD ROLE ...   (the sandbox's code from a memfd)
      |  (unsafe fallback: python -c _seccomp_exec FD python -I -S -B -c LOADER ... in a dir)
      |    script: the program; its output and exit status judged here (stdin/stdout cases)
      |    serve:  the program's top level -> "R" nonce -> answers requests, one line each:
      |              call cases: ["eval", "add(1, 2)"] -> ["ok", 3], judged here on arrival
      |    judge:  free-form asserts, in a second sandboxed process; each use of the program's
      |            names is a request relayed here to the serving program, line by line
      |  stdout/stderr read incrementally, capped; wall clock -> killpg(SIGKILL), reap
      v
    ExecResult(passed, returncode, stdout, stderr, cause, seconds, cases)

The rule: nothing that decides the verdict is ever in the program's process. Expected values
live in this process (stdin/stdout and call cases) or in the judge's (asserts); the program's
process receives only inputs (its stdin, a call's expression or arguments), after its top level
has returned. Whatever a program reads of its own process (frames, every object, its memory) or
writes on its pipes earns nothing: each reply is checked against the request it answers (a
call case's is ["ok", value] or ["error", ...]; the judge checks its own, `_judge.py`), and
anything else, a reply past `max_reply_bytes`, or a line after the last request was answered
makes the run "unjudgeable". `flexmarl.rewards.cases` says what each form compares.

What holds however the program behaves (enforced by the kernel or by this process):
- Isolation: bubblewrap (`isolation()` says what is in force), or no run at all:
  `SandboxUnavailable` names the fixes, unless the unsafe fallback was chosen
  (`allow_unsafe_sandbox`, FLEXMARL_UNSAFE_SANDBOX=1; docs/security.md says what it gives up).
- Seccomp, installed before the interpreter starts (bwrap's --seccomp, or `_seccomp_exec.py`):
  no new processes or threads, no ptrace or process_vm_*, no signals to other processes, no
  pidfds, no SIGIO ownership, no immutable files, no device nodes or FIFOs, no io_uring, no
  sockets, namespaces or mounts; ctypes is not loaded when the program starts (the bootstrap
  checks; a program that removes the audit hook can load it, and meets the same filter).
- The unsafe fallback's launcher also drops every capability and, where the kernel has
  Landlock, confines files (reads: the system and the interpreter; writes: its directory; no
  /proc), TCP and signals (`confinement.Isolation.landlock`).
- CPU time: RLIMIT_CPU (soft = hard, so the kernel SIGKILLs it), cause "cpu_limit".
- Memory: RLIMIT_AS, `memory_mb` of address space; MemoryError gives cause "memory".
- Disk: under bwrap the program's directory is a tmpfs of `max_box_bytes` (ENOSPC past it),
  gone with its mount namespace; every file at most `max_file_bytes` (RLIMIT_FSIZE, EFBIG):
  cause "file_limit". On the fallback the directory is on the host's disk (each file capped,
  the directory not) and is removed by `chmod -R` / `rm -rf` (no recursion here, no link
  followed).
- Wall clock: past `wall_s` every process group of the run is SIGKILLed and reaped, cause
  "timeout".
- Output: past `max_output_bytes` on stdout or stderr, the same kill, cause "output_limit".
- Replies: at most `max_reply_bytes` a line (the pipe's reader holds no more), decoded without
  building a hashed container (`_protocol.decode(hashed=False)`: linear in the line), judged
  as it arrives and dropped: this process's memory and event-loop time per run are bounded by
  the limits above, whatever the program sends.
- Environment: `python -I -S -B` (the standard library only: no site-packages, so no numpy;
  no PYTHON* variables), an environment of PATH, HOME and TMPDIR (no inherited secrets).
- Completion: with tests, `passed` needs every answer judged right and the program to have
  served to the end; leaving early (`sys.exit(0)`, `os._exit(0)`) is "incomplete".
- The sandbox's code: compiled once per interpreter into this process's memory and read by
  each child from a fresh memfd (`confinement.LOADER`): no program can replace it.
- The interpreter: `set_interpreter(path)` picks the Python (3.11+) that runs programs and
  tests; `bench/reward_hacks.py --python all` runs the reward-hack corpus under each one here.

The audit hook (`_bootstrap.py`) is a second wall in both processes: no fork/exec/spawn, no
sockets, no ctypes, no signals to other processes, no raising of the limits, no sys.monitoring
callbacks, no other process's /proc entries, no writes outside the run's directory, no relative
path with "..". PEP 578 is explicit that audit hooks are not a security boundary; under bwrap
the kernel's namespaces are.

Concurrency: at most `max_concurrent()` runs at once per event loop (default: the usable CPU
cores, `len(os.sched_getaffinity(0))`); `set_max_concurrent(n)` changes it. Callers beyond the
bound wait; the wall clock starts when a run starts, not while it waits. stdin/stdout cases run
one process after another within one call, and stop at the first that fails; asserts run two
processes (the program and the judge) at once.
"""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
import os
import secrets
import signal
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from flexmarl.rewards import _protocol as wire
from flexmarl.rewards import cases as forms
from flexmarl.rewards.bounds import LoopBound
from flexmarl.rewards.cases import CallCase, IOCase
from flexmarl.rewards.confinement import (
    BOX, LOADER, bootstrap_code, bwrap_argv, interpreter, isolation, launcher_source, memfd,
    probed, readable_paths, require, seccomp_filter, unshare_prefix)
from flexmarl.rewards.processes import Channel, Child, closing, kill_group, remove, supervise

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
    "file_limit": "wrote a file past max_file_bytes, or filled its box (max_box_bytes)",
    "output_limit": "wrote more than max_output_bytes to stdout or stderr; killed",
    "forbidden": "died of an operation the sandbox refuses (fork, socket, ctypes, ...)",
    "unjudgeable": "an assert used an object the program returned in a way only the program's "
                   "own code could answer (compared, hashed, membership, arithmetic, a method "
                   "of it given the tests' values), or passed the program a function of the "
                   "tests; or a reply did not answer its request (malformed, of the wrong kind, "
                   "past max_reply_bytes, or unasked): return plain values",
    "crash": "killed by a signal (segfault, abort)",
    "sandbox_error": "the sandbox's bootstrap could not set the limits up",
}
"""Every `ExecResult.cause`, with its meaning."""

_EXIT_CAUSES = {wire.EXIT_MEMORY: "memory", wire.EXIT_FORBIDDEN: "forbidden",
                wire.EXIT_FILE_LIMIT: "file_limit", wire.EXIT_SETUP: "sandbox_error",
                wire.EXIT_PROTOCOL: "protocol", wire.EXIT_UNJUDGEABLE: "unjudgeable"}
_MIN_MEMORY_MB = 32  # the interpreter itself maps about 20 MB
_MAX_OPEN_FILES = 64
MAX_REPLY_BYTES = 1 << 20
"""Default `max_reply_bytes`: one reply (a call case's value, an answer to the judge) or one
request of the judge, in bytes of its JSON line."""
_INLINE_REPLY_BYTES = 64 << 10
"""Replies at least this long are decoded in a thread: the decoder's Python half (a call per
tagged object) then takes turns with the event loop (the GIL's switch interval) instead of
holding it for up to ~100 ms."""
MAX_BOX_BYTES = 32 << 20
"""Default `max_box_bytes`: the size of the program's tmpfs under bwrap (all its files)."""

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
                     max_file_bytes: int = 16 << 20, max_box_bytes: int = MAX_BOX_BYTES,
                     max_reply_bytes: int = MAX_REPLY_BYTES) -> ExecResult:
    """Run `code` in a fresh sandboxed interpreter, then its `tests`; see the module docstring.

    `stdin` is the program's input with asserts, call cases or no tests; stdin/stdout cases
    bring their own. `cpu_s` and `wall_s` bound each process (one per stdin/stdout case). A
    program that fails, hangs, crashes or floods gives passed=False and its `cause`; this
    raises only for bad arguments (ValueError), when no process can be started (OSError), or
    when bubblewrap is not in force and the unsafe fallback was not chosen
    (SandboxUnavailable, naming the fixes).
    """
    _check_args(code, stdin, cpu_s, wall_s, memory_mb, max_output_bytes, max_file_bytes,
                max_box_bytes, max_reply_bytes)
    parsed = forms.parse_tests(tests)
    if stdin and isinstance(parsed, tuple) and isinstance(parsed[0], IOCase):
        raise ValueError("stdin is given twice: stdin/stdout cases bring their own input")
    where = require(await _isolation())
    limits = [math.ceil(cpu_s), memory_mb << 20, max_file_bytes, _MAX_OPEN_FILES]
    run = _Runner(where.bwrap is not None, code, limits, wall_s, max_output_bytes,
                  max_box_bytes, max_reply_bytes)
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


def _check_args(code: object, stdin: object, cpu_s: object, wall_s: object, *sizes: object
                ) -> None:
    for name, value in (("code", code), ("stdin", stdin)):
        if not isinstance(value, str):
            raise ValueError(f"{name} must be a str of Python source or input, got "
                             f"{type(value).__name__}")
    for name, value in (("cpu_s", cpu_s), ("wall_s", wall_s)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
                0 < value < math.inf):
            raise ValueError(f"{name} must be a number of seconds > 0, got {value!r}")
    names = ("memory_mb", "max_output_bytes", "max_file_bytes", "max_box_bytes",
             "max_reply_bytes")
    for name, value, low in zip(names, sizes, (_MIN_MEMORY_MB, 1, 1, 1 << 16, 64)):
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


class _Runner:
    """One program, run once (a script, call cases or judged asserts) or once per stdin/stdout
    case."""

    def __init__(self, bwrap: bool, code: str, limits: list[int], wall_s: float,
                 max_output_bytes: int, max_box_bytes: int, max_reply_bytes: int) -> None:
        self.bwrap, self.limits, self.wall_s = bwrap, limits, wall_s
        # surrogatepass: a lone surrogate in model text is the program's SyntaxError, not our
        # UnicodeEncodeError.
        self.code = code.encode("utf-8", "surrogatepass")
        self.max_output_bytes, self.max_box_bytes = max_output_bytes, max_box_bytes
        self.max_reply_bytes = max_reply_bytes
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
        async with self._box() as box:
            start = time.monotonic()
            child = await self._spawn("script", box, stdin, ())
            killed_for = await supervise([child], None, self.wall_s)
            return _Outcome(child.returncode, bytes(child.out), bytes(child.err), killed_for,
                            time.monotonic() - start)

    async def calls(self, stdin: bytes, calls: tuple[CallCase, ...]) -> ExecResult:
        """Call cases: each expression evaluated by the program, its reply judged here as it
        arrives (and dropped); where an expression is more than the program's own answer
        (`cases.simple_call`), all of them by the judge (`judged_calls`)."""
        if not all(forms.simple_call(case.call) for case in calls):
            return await self.judged_calls(stdin, calls)
        verdicts: list[bool] = []
        broke: list[str] = []  # how the program's replies broke the protocol
        async with self._box() as box:
            with closing(Channel(self.max_reply_bytes)) as channel:
                start = time.monotonic()
                program = await self._spawn("serve", box, stdin, channel.child_fds)

                async def talk() -> None:
                    if await self._ready(channel):
                        for case in calls:
                            request = b'["eval",' + forms.quote(case.call) + b"]\n"
                            if not await channel.send(request) or (
                                    reply := await channel.line()) is None:
                                break
                            verdict = (forms.judge_reply(case, reply)
                                       if len(reply) < _INLINE_REPLY_BYTES else
                                       await asyncio.to_thread(forms.judge_reply, case, reply))
                            if verdict is None:
                                broke.append(f"the reply to {case.call[:80]!r} is not one "
                                             f"of a call's (['ok', value] or ['error', ...])")
                                break
                            verdicts.append(verdict)
                    if channel.overflowed:
                        broke.append(f"a reply longer than max_reply_bytes "
                                     f"({self.max_reply_bytes})")
                    channel.stop_sending()
                    if broke:
                        program.end()
                    elif len(verdicts) == len(calls) and await channel.unasked():
                        broke.append("it wrote lines after its last answer")

                killed_for = await supervise([program], talk(), self.wall_s)
                outcome = _Outcome(program.returncode, bytes(program.out), bytes(program.err),
                                   killed_for, time.monotonic() - start)
        judged = tuple(verdicts) + (False,) * (len(calls) - len(verdicts))
        cause = killed_for or _cause(outcome.returncode)
        if broke:
            cause = "unjudgeable"
            outcome.stderr += f"sandbox: {broke[0]}\n".encode()
        elif cause == "ok":
            cause = ("incomplete" if len(verdicts) < len(calls) else
                     "ok" if all(verdicts) else "wrong_answer")
        return _result(outcome, cause, outcome.seconds, judged)

    async def judged_calls(self, stdin: bytes, calls: tuple[CallCase, ...]) -> ExecResult:
        """Call cases evaluated by the judge (`_judge.run_calls`), which says its verdicts in
        one line tagged with a nonce of this run."""
        nonce = secrets.token_hex(8)
        payload = wire.encode([nonce, [[case.call, case.expected] for case in calls]])
        result = await self.judged(stdin, payload, role="judge-calls")
        marker = f"sandbox-verdicts {nonce} "
        lines = result.stderr.splitlines(keepends=True)
        said = [line for line in lines if line.startswith(marker)]
        bits = said[0][len(marker):].strip() if said else ""
        verdicts = tuple(bit == "1" for bit in bits[:len(calls)])
        verdicts += (False,) * (len(calls) - len(verdicts))
        cause = result.cause
        if cause == "ok":
            cause = ("incomplete" if len(bits) < len(calls) else
                     "ok" if all(verdicts) else "wrong_answer")
        stderr = "".join(line for line in lines if not line.startswith(marker))
        return dataclasses.replace(result, passed=cause == "ok", cause=cause, cases=verdicts,
                                   stderr=stderr)

    async def judged(self, stdin: bytes, tests: str, role: str = "judge") -> ExecResult:
        """Free-form asserts: run by a judge process of their own, the program answering its
        requests (relayed here, line by line) from another."""
        text = tests.encode("utf-8", "surrogatepass")
        gone = False  # the program ended (or broke the protocol) before the judge did
        ready_seen = [False]  # the program's top level returned (else it was killed early)
        broke: list[str] = []
        async with self._box() as box, self._box() as judge_box:
            with closing(Channel(self.max_reply_bytes)) as channel, \
                    closing(Channel(self.max_reply_bytes)) as to_judge:
                start = time.monotonic()
                program = await self._spawn("serve", box, stdin, channel.child_fds)
                judge = await self._spawn(role, judge_box, b"", to_judge.child_fds)

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
                                    if reply is not None and reply.startswith(b'["gone"'):
                                        broke.append("it answered with the sandbox's own "
                                                     "'gone' line")
                                        reply = None
                                gone = reply is None
                            if not await to_judge.send(reply or b'["gone"]\n'):
                                break
                        if to_judge.overflowed:
                            broke.append(f"the tests sent a request longer than "
                                         f"max_reply_bytes ({self.max_reply_bytes})")
                        if channel.overflowed:
                            broke.append(f"a reply longer than max_reply_bytes "
                                         f"({self.max_reply_bytes})")
                        if broke:
                            program.end()
                    finally:
                        if not ready.done():  # the judge ended before the program was ready
                            ready.cancel()
                            program.end()
                        channel.stop_sending()
                    if not gone and ready_seen[0] and await channel.unasked():
                        broke.append("it wrote lines no request asked for")

                killed_for = await supervise([program, judge], talk(), self.wall_s)
                seconds = time.monotonic() - start
                answered = ready_seen[0]
        program_cause = _cause(program.returncode)
        judge_cause = _cause(judge.returncode)
        if broke and not killed_for:
            cause, child = "unjudgeable", program
        elif killed_for:
            cause, child = killed_for, (judge if judge.flooded.is_set() else program)
        elif gone:  # the program's own end decides: its limit, its crash, its early exit
            cause, child = ("incomplete" if program_cause == "ok" else program_cause), program
        elif judge_cause != "ok" or not answered:
            cause, child = judge_cause, judge  # a failed assert; the program may be killed
        else:
            cause, child = program_cause, program
        err = bytes(program.err) + (b"" if not judge.err else bytes(judge.err))
        if broke:
            err += f"sandbox: {broke[0]}\n".encode()
        outcome = _Outcome(child.returncode, bytes(program.out), err, killed_for, seconds)
        return _result(outcome, cause, seconds)

    async def _ready(self, channel: Channel) -> bool:
        """Send the program its nonce and wait for its "ready" line (its top level returned)."""
        await channel.open()
        return (await channel.send(self.nonce + b"\n")
                and await channel.line() == b"R" + self.nonce + b"\n")

    @contextlib.asynccontextmanager
    async def _box(self):
        """Where one process runs: under bwrap nothing here (its /box is a tmpfs of its own,
        gone with it: None); on the fallback a fresh directory holding prog.py, removed after
        (`processes.remove`)."""
        if self.bwrap:
            yield None
            return
        workdir = tempfile.mkdtemp(prefix="flexmarl-sandbox-")
        try:
            (Path(workdir) / "prog.py").write_bytes(self.code)
            yield workdir
        finally:
            await remove(workdir)

    async def _spawn(self, role: str, box: str | None, stdin: bytes, fds: tuple[int, ...]
                     ) -> Child:
        seccomp = seccomp_filter()
        opened: list[int] = []
        try:
            boot = memfd("flexmarl-bootstrap", bootstrap_code())
            opened.append(boot)
            seccomp_fd = memfd("flexmarl-seccomp", seccomp)  # b"": no table for this machine
            opened.append(seccomp_fd)
            python = interpreter()
            fd_args = [str(fd) for fd in fds] or ["-1", "-1"]
            if self.bwrap:
                program = memfd("flexmarl-program", self.code)
                opened.append(program)
                argv = [*bwrap_argv(self.max_box_bytes, {"prog.py": program},
                                    seccomp_fd if seccomp else None),
                        "-I", "-S", "-B", "-c", LOADER, str(boot), role, f"{BOX}/prog.py"]
                env = {"PATH": os.defpath, "HOME": BOX, "TMPDIR": BOX}
                cwd = "/"
            else:
                launcher = [python, "-I", "-S", "-B", "-c", launcher_source(), str(seccomp_fd),
                            f"{box}:{os.devnull}", ":".join(readable_paths())]
                argv = [*unshare_prefix(), *launcher, python, "-I", "-S", "-B", "-c", LOADER,
                        str(boot), role, str(Path(box) / "prog.py")]
                env = {"PATH": os.environ.get("PATH", os.defpath), "HOME": box, "TMPDIR": box}
                cwd = box
            mode = "bwrap" if self.bwrap else "fallback"
            spawn = asyncio.ensure_future(asyncio.create_subprocess_exec(
                *argv, *fd_args, *map(str, self.limits), mode,
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=(asyncio.subprocess.STDOUT if role.startswith("judge")
                        else asyncio.subprocess.PIPE),
                cwd=cwd, env=env, start_new_session=True, pass_fds=[*opened, *fds]))
            try:
                proc = await asyncio.shield(spawn)
            except asyncio.CancelledError:
                # Not cancelled midway (that can hang its caller for good on 3.11, CPython
                # gh-103847), and not left running either: it holds this run's descriptors,
                # which must stay open until it has passed them on (closed, their numbers
                # would be reused by another thread's open and closed again under it). The
                # start takes milliseconds; then its process is killed, and the run gives in.
                while not spawn.done():
                    try:
                        await asyncio.shield(spawn)
                    except asyncio.CancelledError:
                        continue
                    except Exception:  # noqa: BLE001 - the start failed: nothing to kill
                        break
                if not spawn.cancelled() and spawn.exception() is None:
                    await kill_group(spawn.result())
                raise
        finally:
            for fd in opened:
                os.close(fd)
        return Child(proc, stdin, self.max_output_bytes, self.bwrap,
                      merged=role.startswith("judge"))


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
