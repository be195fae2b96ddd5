"""The sandbox's first code in the child: limits, audit hook, then the program.

`flexmarl.rewards.sandbox` runs this file as a script (`python -I -S -B _bootstrap.py ...`);
it must use the standard library only, since isolated mode sees no site-packages. Importing
it as a module does nothing but define the exit codes the parent reads.

In order: read the completion nonce (the first line of stdin), set the resource limits, install
the audit hook (sys.addaudithook: it cannot be removed from Python code), forget modules that
were loaded before it, run the program with runpy. Only when the program returns normally is
the nonce written to the marker pipe, so a program that leaves early (`sys.exit(0)`,
`os._exit(0)`) before its tests ran does not pass.

The hook refuses: process creation (fork, exec, spawn, system, subprocess), signals to other
processes, sockets, ctypes, raising resource limits, new subinterpreters (they would have no
hook), symlinks and hard links, and writes outside the program's directory. It is a guard
against a program that stumbles into these, not a wall against one that sets out to break it:
PEP 578 says audit hooks are no sandbox; see sandbox.py's docstring for what holds regardless.
"""
from __future__ import annotations

import errno
import os
import sys

EXIT_MEMORY = 81
"""The program ran out of its address-space limit (MemoryError)."""
EXIT_FORBIDDEN = 82
"""The program died of an operation the audit hook refused."""
EXIT_FILE_LIMIT = 83
"""The program wrote past its file-size limit (EFBIG)."""
EXIT_SETUP = 84
"""The bootstrap itself could not set the sandbox up (bad arguments, limits refused)."""
NONCE_BYTES = 33
"""The completion nonce's length on stdin: 32 hex characters and a newline."""

_REFUSED_EVENTS = frozenset({
    "os.fork", "os.forkpty", "os.posix_spawn", "os.spawn", "os.system", "os.exec",
    "os.startfile", "os.kill", "os.killpg", "signal.pthread_kill", "subprocess.Popen",
    "pty.spawn", "resource.setrlimit", "resource.prlimit", "os.symlink", "os.link",
    "gc.get_objects", "gc.get_referrers", "gc.get_referents",
    "_xxsubinterpreters.create", "webbrowser.open"})
_REFUSED_PREFIXES = ("socket.", "ctypes.")
_REFUSED_IMPORTS = frozenset({
    "_ctypes", "ctypes", "_posixsubprocess", "_xxsubinterpreters", "_xxinterpchannels",
    "_testcapi", "_testinternalcapi", "_testmultiphase", "_testsinglephase"})
# Events whose first argument is a path the program changes.
_PATH_EVENTS = frozenset({
    "os.remove", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.truncate", "os.utime",
    "os.setxattr", "os.removexattr", "os.chflags", "os.lchflags", "shutil.rmtree"})
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC


class SandboxRefused(PermissionError):
    """Raised by the audit hook for an operation the sandbox does not allow."""


def _make_hook(workdir: str):
    """The audit hook. It keeps its state in this closure (immutable values only), not in
    module globals a program could reach through a frame and rebind."""
    root = os.path.join(os.path.realpath(workdir), "")
    refused_events, refused_prefixes = _REFUSED_EVENTS, _REFUSED_PREFIXES
    refused_imports, path_events, write_flags = _REFUSED_IMPORTS, _PATH_EVENTS, _WRITE_FLAGS
    refused = SandboxRefused

    def inside(path: object) -> bool:
        if isinstance(path, int):
            return True  # an open descriptor: its opening was checked
        try:
            full = os.path.abspath(os.fsdecode(os.fspath(path)))
        except TypeError:
            return False
        return os.path.join(full, "").startswith(root) or full == os.devnull

    def hook(event: str, args: tuple) -> None:
        if event in refused_events or event.startswith(refused_prefixes):
            raise refused(f"sandbox: {event} is not allowed")
        if event == "import" and args[0].partition(".")[0] in refused_imports:
            raise refused(f"sandbox: importing {args[0]} is not allowed")
        if event == "open":
            path, mode, flags = args
            writes = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                isinstance(flags, int) and flags & write_flags)
            if writes and not inside(path):
                raise refused(f"sandbox: writing {path!r} outside the program's directory "
                              f"is not allowed")
        elif event in path_events or event == "os.rename":
            paths = args[:2] if event == "os.rename" else args[:1]
            if event in ("os.chmod", "os.chown") and isinstance(args[0], int):
                paths = (None,)  # fchmod of a descriptor opened for reading anywhere
            if not all(inside(p) for p in paths):
                raise refused(f"sandbox: {event} outside the program's directory is not "
                              f"allowed")

    return hook


def _set_limits(cpu_s: int, memory_bytes: int, file_bytes: int, num_files: int) -> None:
    import resource

    # Soft equal to hard: at the CPU limit the kernel sends SIGKILL, which no handler catches.
    for which, value in ((resource.RLIMIT_CPU, cpu_s), (resource.RLIMIT_AS, memory_bytes),
                         (resource.RLIMIT_FSIZE, file_bytes), (resource.RLIMIT_NOFILE, num_files),
                         (resource.RLIMIT_NPROC, 0), (resource.RLIMIT_CORE, 0)):
        resource.setrlimit(which, (value, value))


def _read_nonce() -> bytes:
    nonce = b""
    while len(nonce) < NONCE_BYTES:  # exactly this many bytes: the rest is the program's stdin
        chunk = os.read(0, NONCE_BYTES - len(nonce))
        if not chunk:
            break
        nonce += chunk
    return nonce.strip()


def _print_error(exc: BaseException, program: str) -> None:
    """The traceback from the program's own frames on, not the bootstrap's and runpy's."""
    import traceback

    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename != program:
        tb = tb.tb_next
    traceback.print_exception(type(exc), exc, tb or exc.__traceback__)


def _chain(exc: BaseException) -> list[BaseException]:
    """The exception and those it was raised from or while handling."""
    seen: list[BaseException] = []
    while exc is not None and not any(exc is e for e in seen):
        seen.append(exc)
        exc = exc.__cause__ or exc.__context__
    return seen


def main(argv: list[str]) -> int:
    try:
        program, marker_fd, cpu_s, memory_bytes, file_bytes, num_files = argv
        nonce = _read_nonce()
        _set_limits(int(cpu_s), int(memory_bytes), int(file_bytes), int(num_files))
    except (ValueError, OSError) as exc:
        print(f"sandbox bootstrap: cannot set up: {exc!r}", file=sys.stderr)
        return EXIT_SETUP
    import runpy

    sys.addaudithook(_make_hook(os.path.dirname(program)))
    for name in list(sys.modules):  # loaded before the hook: make the program import anew
        if name.partition(".")[0] in _REFUSED_IMPORTS:
            del sys.modules[name]
    sys.argv = [program]
    try:
        runpy.run_path(program, run_name="__main__")
    except SystemExit:
        raise  # its own exit status, but no completion marker
    except MemoryError as exc:
        _print_error(exc, program)
        return EXIT_MEMORY
    except BaseException as exc:
        _print_error(exc, program)
        causes = _chain(exc)
        if any(isinstance(e, SandboxRefused) for e in causes):
            return EXIT_FORBIDDEN  # also when wrapped, as urllib wraps it in URLError
        return EXIT_FILE_LIMIT if any(getattr(e, "errno", None) == errno.EFBIG
                                      for e in causes) else 1
    try:
        sys.stdout.flush()
    finally:
        os.write(int(marker_fd), nonce)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
