"""The sandbox's first code in a child interpreter: limits, audit hook, then one of three roles.

`flexmarl.rewards.sandbox` starts an isolated interpreter (`python -I -S -B -c LOADER ...`,
`confinement.py`) that reads this module, `_protocol` and `_judge` as code objects from a
descriptor and runs this one as __main__: no file of the sandbox's own code exists where a
program could write it. Standard library only (isolated mode sees no site-packages), on every
Python the project supports (3.11+).

    script   the program runs; its output is judged by the parent (stdin/stdout cases)
    serve    the program runs, says "R" + nonce, then answers requests, one JSON line each:
               ["eval", expr]              a call case
               ["names"]                   the program's names: plain values, or references
               ["op", op, ref, args, kw]   call / getattr / getitem / iter / next / len /
                                           bool / str on an object the program handed out
             each answer plain values only (`_protocol.encode`), or a reference to an object
             kept here
    judge    free-form asserts run here (`_judge.py`), in a process of their own: the
             program's names are `Remote`s whose uses become requests to the program's
             process (relayed by the parent); every comparison, loop and expected value stays
             here ("judge-calls": call cases whose expressions are more than a call of the
             program's function on literals, evaluated the same way)

The rule that makes a reward hack worthless: nothing that decides the verdict is ever in the
program's process. Call cases and stdin/stdout cases are compared in the parent, asserts in the
judge; the program's process holds only its inputs. The program shares its interpreter with the
loop that answers requests (`_Server`), so it can make that loop answer anything: every reply
is checked, where it is judged, against the request it answers, and is at most a value the
program could have returned. The nonce frames the ready line (a check that the pipes are the
sandbox's), it proves nothing.

The seccomp filter (`confinement.seccomp_filter`) is installed before this interpreter starts,
by bubblewrap or by `_seccomp_exec.py`, so ctypes is never imported here; this file checks that.
The audit hook refuses process creation, signals to other processes, sockets, ctypes, raising
the limits, subinterpreters, links, writes outside the program's directory, relative paths
with "..", other processes' /proc entries and `sys.monitoring` callbacks; on the unsafe
fallback also the modules that write files behind the hook's back (sqlite3, readline, dbm,
shared memory). It is a second wall: under bubblewrap the kernel's namespaces are the boundary
(PEP 578 says hooks are none).
"""
from __future__ import annotations

import builtins as _builtins
import os
import sys

from flexmarl.rewards import _judge, _protocol as wire
from flexmarl.rewards._protocol import SandboxRefused, encode, quote

# The bootstrap's own name lookups go to a copy of the builtins taken before the program ran:
# a program that rebinds builtins.len breaks nothing here (it could only spoil its own answers).
__builtins__ = dict(_builtins.__dict__)

_REFUSED_EVENTS = frozenset({
    "os.fork", "os.forkpty", "os.posix_spawn", "os.spawn", "os.system", "os.exec",
    "os.startfile", "os.kill", "os.killpg", "signal.pthread_kill", "subprocess.Popen",
    "pty.spawn", "resource.setrlimit", "resource.prlimit", "os.symlink", "os.link",
    "_xxsubinterpreters.create", "webbrowser.open", "sys.monitoring.register_callback",
    "sys.addaudithook"})
_REFUSED_PREFIXES = ("socket.", "ctypes.")
_REFUSED_IMPORTS = frozenset({
    "_ctypes", "ctypes", "_posixsubprocess", "_xxsubinterpreters", "_xxinterpchannels",
    "_interpreters", "_interpqueues", "_interpchannels",  # 3.13's names: no hook in them
    "_testcapi", "_testinternalcapi", "_testmultiphase", "_testsinglephase",
    # Patched below before the program runs; a fresh copy would bring the original back.
    "_thread"})
# Without bwrap, modules whose C code writes files the hook never sees (sqlite3.connect's
# event aside, readline's history files, dbm's databases, POSIX shared memory).
_FALLBACK_REFUSED_IMPORTS = frozenset({
    "_sqlite3", "sqlite3", "readline", "_dbm", "_gdbm", "dbm", "_posixshmem",
    "_multiprocessing"})
# Events whose first argument is a path the program changes.
_PATH_EVENTS = frozenset({
    "os.remove", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.truncate", "os.utime",
    "os.setxattr", "os.removexattr", "os.chflags", "os.lchflags", "shutil.rmtree"})
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
_OPS = ("call", "getattr", "getitem", "iter", "next", "len", "bool", "str")


class _HookRefused(RuntimeError):
    """sys.addaudithook ignores a RuntimeError from an existing hook: the new one is not
    added (PermissionError would not stop it)."""


def _make_hook(workdir: str, fallback: bool):
    """The audit hook; its state lives in this closure."""
    refused_imports = _REFUSED_IMPORTS | (_FALLBACK_REFUSED_IMPORTS if fallback else set())
    root = os.path.join(os.path.realpath(workdir), "")
    abspath, fspath, fsdecode = os.path.abspath, os.fspath, os.fsdecode
    join, realpath, isdir, own_pid = os.path.join, os.path.realpath, os.path.isdir, str(os.getpid())

    def inside(path: object) -> bool:
        if isinstance(path, int):
            return True  # an open descriptor: its opening was checked
        try:
            text = fsdecode(fspath(path))
        except TypeError:
            return False
        return (join(abspath(text), "").startswith(root) and not upward(text)) or \
            text == os.devnull

    def upward(text: str) -> bool:
        # A relative path may be relative to a directory descriptor (dir_fd), which no audit
        # event carries: with "..", it could lead anywhere from there.
        return not text.startswith("/") and ".." in text.split("/")

    def hook(event: str, args: tuple) -> None:
        if event == "sys.addaudithook":
            raise _HookRefused("sandbox: sys.addaudithook is not allowed")
        if event in _REFUSED_EVENTS or event.startswith(_REFUSED_PREFIXES):
            raise SandboxRefused(f"sandbox: {event} is not allowed")
        if event == "import" and args[0].partition(".")[0] in refused_imports:
            raise SandboxRefused(f"sandbox: importing {args[0]} is not allowed")
        if event == "open":
            path, mode, flags = args
            if isinstance(path, (str, bytes)) and upward(fsdecode(path)):
                raise SandboxRefused(f"sandbox: a relative path with '..' ({path!r}) is not "
                                     f"allowed")
            if isinstance(path, (str, bytes)) and not inside(path):
                # Without bwrap the filesystem is the user's: at least no other process's
                # /proc entries (the parent's memory holds the expected values) and no
                # directory descriptor to open paths relative to (dir_fd) outside.
                full = realpath(fsdecode(path))
                parts = full.split("/")
                if (full.startswith("/proc/") and len(parts) > 2 and parts[2].isdigit()
                        and parts[2] != own_pid) or isdir(full):
                    raise SandboxRefused(f"sandbox: opening {path!r} is not allowed")
            writes = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                isinstance(flags, int) and flags & _WRITE_FLAGS)
            if writes and not inside(path):
                raise SandboxRefused(f"sandbox: writing {path!r} outside the program's "
                                     f"directory is not allowed")
        elif event in _PATH_EVENTS or event == "os.rename":
            paths = args[:2] if event == "os.rename" else args[:1]
            if event in ("os.chmod", "os.chown") and isinstance(args[0], int):
                paths = (None,)  # fchmod of a descriptor opened for reading anywhere
            if not all(inside(p) for p in paths):
                raise SandboxRefused(f"sandbox: {event} outside the program's directory is "
                                     f"not allowed")
        elif event == "os.scandir" and fallback and isinstance(args[0], (str, bytes)) \
                and not inside(args[0]):
            # Its directory stream holds a descriptor a program can guess and use as a dir_fd.
            raise SandboxRefused("sandbox: listing a directory outside the program's with "
                                 "scandir is not allowed without bubblewrap")
        elif event == "sqlite3.connect" and fallback:
            raise SandboxRefused("sandbox: sqlite3 is not allowed without bubblewrap")

    return hook


def _set_limits(cpu_s: int, memory_bytes: int, file_bytes: int, num_files: int) -> None:
    import resource

    # Soft equal to hard: at the CPU limit the kernel sends SIGKILL, which no handler catches.
    # RLIMIT_NPROC = 0 stops new processes and threads where the user is not root.
    for which, value in ((resource.RLIMIT_CPU, cpu_s), (resource.RLIMIT_AS, memory_bytes),
                         (resource.RLIMIT_FSIZE, file_bytes), (resource.RLIMIT_NOFILE, num_files),
                         (resource.RLIMIT_NPROC, 0), (resource.RLIMIT_CORE, 0)):
        resource.setrlimit(which, (value, value))


def _no_threads() -> None:
    """Where seccomp is not in force (another architecture), at least the usual way to a
    thread is closed."""
    import _thread

    def refused(*args, **kwargs):
        raise SandboxRefused("sandbox: threads are not allowed")

    for name in ("start_new_thread", "start_new", "start_joinable_thread"):
        if hasattr(_thread, name):
            setattr(_thread, name, refused)
    if hasattr(sys, "monitoring"):  # 3.12+: register_callback is audited, these are not
        def no_monitoring(*args, **kwargs):
            raise SandboxRefused("sandbox: sys.monitoring is not allowed")

        for name in ("register_callback", "use_tool_id", "set_events", "set_local_events"):
            setattr(sys.monitoring, name, no_monitoring)


# ------------------------------------------------------------------------------- serve
class _Server:
    """The program's side: answers requests on its namespace, one line each, in order."""

    def __init__(self, namespace: dict, source: dict) -> None:
        self.namespace, self.sources, self.objects = namespace, source, []

    def reference(self, ref: int) -> object:
        if not 0 <= ref < len(self.objects):
            raise ValueError(f"no object {ref} was handed out")
        return self.objects[ref]

    def scope(self) -> dict:
        """Call cases see the program's names, then the builtins as they were before the
        program ran (a program that rebinds `abs` does not change it for the tests)."""
        scope = {k: v for k, v in self.namespace.items()
                 if k not in _builtins_before or k.startswith("__")}
        scope["__builtins__"] = dict(_builtins_before)
        return scope

    def answer(self, value: object, by_reference: bool) -> str:
        try:
            return '["ok",' + encode(value) + "]"
        except (TypeError, RecursionError):
            if not by_reference:
                raise TypeError(f"returned a {type(value).__name__}: call cases compare int, "
                                f"float, str, bool, None, list, tuple and dict") from None
        self.objects.append(value)
        return f'["ref",{len(self.objects) - 1},{quote(type(value).__name__)}]'

    def handle(self, line: bytes) -> str:
        request = wire.decode(line, refs=self.reference)
        kind = request[0] if type(request) is list and request else None
        if kind == "eval" and len(request) == 2 and type(request[1]) is str:
            code = compile(request[1], "<call>", "eval", dont_inherit=True)
            value = _builtins.eval(code, self.scope())
            return self.answer(value, by_reference=False)
        if kind == "names" and len(request) == 1:
            names = [f"[{quote(name)},{self.answer(value, by_reference=True)}]"
                     for name, value in list(self.namespace.items())
                     if type(name) is str and not name.startswith("__")]
            return '["names",[' + ",".join(names) + "]]"
        if kind == "op" and len(request) == 5 and request[1] in _OPS and \
                type(request[3]) is list and type(request[4]) is dict:
            op, target, args, kwargs = request[1:]
            if op == "call":
                value = target(*args, **kwargs)
            elif op == "getattr" and len(args) == 1 and type(args[0]) is str:
                value = getattr(target, args[0])
            elif op == "getitem" and len(args) == 1:
                value = target[args[0]]
            elif op == "next":
                try:
                    value = next(target)
                except StopIteration:
                    return '["stop"]'
            elif op in ("iter", "len", "bool", "str") and not args:
                value = {"iter": iter, "len": len, "bool": bool, "str": str}[op](target)
            else:
                raise ValueError(f"a malformed {op} request")
            return self.answer(value, by_reference=True)
        raise ValueError("a malformed request")

    def serve(self, ctl_fd: int, requests_fd: int, nonce: bytes) -> None:
        """Answer until the parent closes the requests pipe."""
        os.write(ctl_fd, b"R" + nonce + b"\n")
        os.set_blocking(requests_fd, True)  # the program may have made it non-blocking
        with open(requests_fd, "rb", closefd=False) as requests:
            for line in requests:
                try:
                    reply = self.handle(line)
                except MemoryError:
                    raise
                except BaseException as exc:  # noqa: BLE001 - the program's error, reported
                    if b'"op","call"' in line[:16] or line.startswith(b'["eval"'):
                        # Not for len() and the like: list() asks for a length and expects a
                        # TypeError from most objects.
                        os.write(2, wire.report(exc, self.sources).encode("utf-8", "replace"))
                    try:
                        text = str(exc)[:wire.RESULT_CHARS]
                    except BaseException:  # noqa: BLE001
                        text = "<unprintable>"
                    reply = '["error",' + quote(type(exc).__name__) + "," + quote(text) + "]"
                wire.write_all(ctl_fd, reply.encode() + b"\n")


_builtins_before = dict(_builtins.__dict__)


# ------------------------------------------------------------------------------- main
def main(argv: list[str]) -> int:
    """argv: role, the program's path (the judge reads it too), the control and requests
    descriptors, cpu_s, memory and file-size bytes, open files, and "bwrap" or "fallback"."""
    try:
        role, path, ctl_fd, req_fd, cpu_s, memory_bytes, file_bytes, num_files, mode = argv
        ctl_fd, req_fd = int(ctl_fd), int(req_fd)
        if "_ctypes" in sys.modules or "ctypes" in sys.modules:
            raise OSError("ctypes is loaded before the program: the seccomp filter must be "
                          "installed outside this interpreter")
        nonce = wire.read_exact(req_fd, wire.NONCE_BYTES).strip() if role == "serve" else b""
        if role.startswith("judge"):  # the tests' length in a line, then the tests
            size = int(wire.read_line(req_fd))
            tests = wire.read_exact(req_fd, size).decode("utf-8", "surrogatepass")
        with open(path, "rb") as f:
            source = f.read().decode("utf-8", "surrogatepass")
        _set_limits(int(cpu_s), int(memory_bytes), int(file_bytes), int(num_files))
        _no_threads()
        import _json  # noqa: F401 - loaded before the hook, once
    except (ValueError, OSError) as exc:
        print(f"sandbox bootstrap: cannot set up: {exc!r}", file=sys.stderr)
        return wire.EXIT_SETUP
    sys.addaudithook(_make_hook(os.path.dirname(path), fallback=mode != "bwrap"))
    for name in list(sys.modules):  # loaded before the hook: make the program import anew
        if name.partition(".")[0] in _REFUSED_IMPORTS - {"_thread"}:
            del sys.modules[name]
    if role.startswith("judge"):  # "judge": asserts; "judge-calls": call cases
        run = _judge.run if role == "judge" else _judge.run_calls
        status = run(tests, source, ctl_fd, req_fd)
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        os._exit(status)  # nothing of the tests runs after the verdict, and no teardown
    module = type(sys)("__main__")
    namespace = module.__dict__
    namespace.update(__file__=path, __builtins__=sys.modules["builtins"])
    sys.modules["__main__"], sys.argv = module, [path]
    sources = {path: source}
    try:
        _builtins.exec(compile(source, path, "exec", dont_inherit=True), namespace)
        if role == "serve":
            _Server(namespace, sources).serve(ctl_fd, req_fd, nonce)
    except SystemExit:
        raise  # its own exit status
    except BaseException as exc:  # noqa: BLE001 - the program's error, reported to the parent
        os.write(2, wire.report(exc, sources).encode("utf-8", "replace"))
        return wire.exit_code(exc)
    if role == "serve":
        try:
            sys.stdout.flush()
        except BaseException:  # noqa: BLE001 - the program may have replaced or closed it
            pass
        os._exit(0)  # no atexit handler or finaliser of the program runs after the answers
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
