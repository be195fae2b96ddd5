"""The sandbox's first code in the child: limits, audit hook, the program, then its tests.

`flexmarl.rewards.sandbox` runs this file as a script (`python -I -S -B _bootstrap.py ...`);
it must use the standard library only, since isolated mode sees no site-packages. Importing
it as a module does nothing but define the exit codes the parent reads.

    parent                                   this process
      | tests pipe: nonce               -->   read the nonce, set the limits, install the hook,
      |                                       take the builtins it needs, run the program
      | <-- control pipe: "R" nonce            the program's top level has returned
      | tests pipe: nonce + tests       -->   (never before: the program cannot read them)
      |                                       run the asserts / calls in the program's namespace
      | <-- control pipe: "F" nonce results    exit 0, no program code runs after this

The nonce is what makes the two control lines unforgeable: it lives only in this module's
local variables, and nothing the program runs can reach a frame of this module: the hook
refuses every way to a frame (sys._getframe, tracebacks' and generators' frames, settrace,
setprofile, new audit hooks) with a ValueError (so the standard library's optional uses, in
typing, collections.namedtuple, enum and logging, go on without), and the garbage collector's
object lists; a seccomp filter (installed here through ctypes, before the program) makes the
kernel refuse new threads and processes, ptrace and process_vm_readv, and signal masks, so
with every signal blocked no signal handler (which would get a frame) ever runs. Without
`/proc` (bubblewrap mounts none) the process's memory is not readable either; on the fallback
path the hook refuses `/proc/*/mem`, which PEP 578 says is no security boundary.

The hook also refuses: process creation (fork, exec, spawn, system, subprocess), signals to
other processes, sockets, ctypes, raising resource limits, new subinterpreters, symlinks and
hard links, and writes outside the program's directory.

Call results are encoded here with an encoder built from references taken before the program
ran: exact types only (int, float, str, bool, None, list, tuple, dict), so an object that
claims to equal everything cannot pass; the parent compares. Free-form asserts arrive with
their comparisons rewritten by the parent to `__strict_cmp__` / `__strict_bin__` (see
`flexmarl.rewards.cases`), which run here on the same references.
"""
from __future__ import annotations

import builtins as _builtins
import errno
import os
import sys

# This module's functions look builtins up here, in a private copy taken before the program
# ran: a program that rebinds builtins.all or builtins.isinstance does not reach them.
__builtins__ = dict(_builtins.__dict__)

EXIT_MEMORY = 81
"""The program ran out of its address-space limit (MemoryError)."""
EXIT_FORBIDDEN = 82
"""The program died of an operation the audit hook refused."""
EXIT_FILE_LIMIT = 83
"""The program wrote past its file-size limit (EFBIG)."""
EXIT_SETUP = 84
"""The bootstrap itself could not set the sandbox up (bad arguments, limits refused)."""
EXIT_PROTOCOL = 85
"""The tests did not arrive as the parent sent them (the program closed or replaced a pipe)."""
NONCE_BYTES = 33
"""The nonce's length on the tests pipe: 32 hex characters and a newline."""
RESULT_CHARS = 200
"""An error in a call case, or a source line in a traceback, in at most this many characters."""

_REFUSED_EVENTS = frozenset({
    "os.fork", "os.forkpty", "os.posix_spawn", "os.spawn", "os.system", "os.exec",
    "os.startfile", "os.kill", "os.killpg", "signal.pthread_kill", "subprocess.Popen",
    "pty.spawn", "resource.setrlimit", "resource.prlimit", "os.symlink", "os.link",
    "gc.get_objects", "gc.get_referrers", "gc.get_referents",
    "_xxsubinterpreters.create", "webbrowser.open"})
_FRAME_EVENTS = frozenset({  # the ways to a frame, and so to this module's locals
    "sys._getframe", "sys._current_frames", "sys._current_exceptions", "sys.settrace",
    "sys.setprofile"})
_REFUSED_PREFIXES = ("socket.", "ctypes.")
_REFUSED_IMPORTS = frozenset({
    "_ctypes", "ctypes", "_posixsubprocess", "_xxsubinterpreters", "_xxinterpchannels",
    "_interpreters", "_interpqueues", "_interpchannels",  # 3.13's names: no hook in them
    "_testcapi", "_testinternalcapi", "_testmultiphase", "_testsinglephase",
    # Patched below before the program runs; a fresh copy would bring the original back.
    "_thread"})
_FRAME_ATTRIBUTES = frozenset({"tb_frame", "gi_frame", "cr_frame", "ag_frame", "f_back"})
# Events whose first argument is a path the program changes.
_PATH_EVENTS = frozenset({
    "os.remove", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.truncate", "os.utime",
    "os.setxattr", "os.removexattr", "os.chflags", "os.lchflags", "shutil.rmtree"})
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC


class SandboxRefused(PermissionError):
    """Raised by the audit hook for an operation the sandbox does not allow."""


class FrameRefused(SandboxRefused, ValueError):
    """A way to a frame, refused. Also a ValueError, which is what the standard library
    expects where a frame is optional (typing, namedtuple, enum, logging)."""


class _HookRefused(RuntimeError):
    """sys.addaudithook ignores a RuntimeError from an existing hook: the new one is not
    added (PermissionError would not stop it)."""


def _make_hook(workdir: str, window: list):
    """The audit hook. Its state lives in this closure, which no program code can reach;
    `window[0]` is true only while the bootstrap itself reads a traceback's frames."""
    root = os.path.join(os.path.realpath(workdir), "")
    refused_events, refused_prefixes = _REFUSED_EVENTS, _REFUSED_PREFIXES
    refused_imports, path_events, write_flags = _REFUSED_IMPORTS, _PATH_EVENTS, _WRITE_FLAGS
    frame_attributes, refused, abspath = _FRAME_ATTRIBUTES, SandboxRefused, os.path.abspath
    frame_events, no_frame = _FRAME_EVENTS, FrameRefused
    fspath, fsdecode, join, realpath = os.fspath, os.fsdecode, os.path.join, os.path.realpath
    isdir, own_pid = os.path.isdir, str(os.getpid())

    def inside(path: object) -> bool:
        if isinstance(path, int):
            return True  # an open descriptor: its opening was checked
        try:
            full = abspath(fsdecode(fspath(path)))
        except TypeError:
            return False
        return join(full, "").startswith(root) or full == os.devnull

    def hook(event: str, args: tuple) -> None:
        if event == "sys.addaudithook":
            raise _HookRefused("sandbox: sys.addaudithook is not allowed")
        if event == "object.__getattr__":
            if args[1] in frame_attributes and not window[0]:
                raise no_frame(f"sandbox: reading {args[1]} is not allowed")
            return
        if event in frame_events:
            raise no_frame(f"sandbox: {event} is not allowed")
        if event in refused_events or event.startswith(refused_prefixes):
            raise refused(f"sandbox: {event} is not allowed")
        if event == "import" and args[0].partition(".")[0] in refused_imports:
            raise refused(f"sandbox: importing {args[0]} is not allowed")
        if event == "open":
            path, mode, flags = args
            if isinstance(path, (str, bytes)) and not inside(path):
                # Without bwrap the filesystem is the user's: at least no process's memory,
                # no other process's /proc entries, and no directory descriptor to open
                # paths relative to (dir_fd) outside the program's directory.
                full = realpath(fsdecode(path))
                parts = full.split("/")
                if (full.startswith("/proc/") and (full.endswith("/mem") or (
                        parts[2].isdigit() and parts[2] != own_pid))) or isdir(full):
                    raise refused(f"sandbox: opening {path!r} is not allowed")
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
    # RLIMIT_NPROC = 0 stops new processes and threads where the user is not root.
    for which, value in ((resource.RLIMIT_CPU, cpu_s), (resource.RLIMIT_AS, memory_bytes),
                         (resource.RLIMIT_FSIZE, file_bytes), (resource.RLIMIT_NOFILE, num_files),
                         (resource.RLIMIT_NPROC, 0), (resource.RLIMIT_CORE, 0)):
        resource.setrlimit(which, (value, value))


# Syscalls the kernel refuses once the filter is in (errno): new threads and processes
# (clone3 with ENOSYS, so the C library falls back to clone), reading or tracing a process's
# memory, and changing the signal mask. x86_64 and aarch64 numbers (asm/unistd.h).
_SECCOMP_ARCHES = {
    "x86_64": (0xC000003E, {56: 1, 57: 1, 58: 1, 435: 38, 101: 1, 310: 1, 311: 1, 14: 1}),
    "aarch64": (0xC00000B7, {220: 1, 435: 38, 117: 1, 270: 1, 271: 1, 135: 1}),
}


def _seccomp() -> bool:
    """Block every signal, then install the filter; False where this kernel or machine
    cannot (the _thread patch and the hook remain)."""
    import signal

    signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
    machine = os.uname().machine
    if machine not in _SECCOMP_ARCHES:
        return False
    import ctypes
    import struct

    arch, deny = _SECCOMP_ARCHES[machine]
    allow, kill, errno_base = 0x7FFF0000, 0x80000000, 0x00050000
    load, jeq, jge, ret = 0x20, 0x15, 0x35, 0x06
    program = [(load, 0, 0, 4), (jeq, 1, 0, arch), (ret, 0, 0, kill), (load, 0, 0, 0)]
    if machine == "x86_64":  # the x32 ABI's numbers: refused wholesale
        program += [(jge, 0, 1, 0x40000000), (ret, 0, 0, errno_base | errno.EPERM)]
    for number, error in deny.items():
        program += [(jeq, 0, 1, number), (ret, 0, 0, errno_base | error)]
    program.append((ret, 0, 0, allow))
    code = b"".join(struct.pack("HBBI", *step) for step in program)

    class Program(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]

    libc = ctypes.CDLL(None, use_errno=True)
    filters = Program(len(program), code)
    no_new_privs, set_seccomp, mode_filter = 38, 22, 2
    if libc.prctl(no_new_privs, 1, 0, 0, 0) != 0:
        return False
    return libc.prctl(set_seccomp, mode_filter, ctypes.byref(filters), 0, 0) == 0


def _read_exact(fd: int, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = os.read(fd, size - len(data))
        if not chunk:
            break
        data += chunk
    return data


def _chain(exc: BaseException) -> list[BaseException]:
    """The exception and those it was raised from or while handling."""
    seen: list[BaseException] = []
    while exc is not None and not any(exc is e for e in seen):
        seen.append(exc)
        exc = exc.__cause__ or exc.__context__
    return seen


def _exit_code(exc: BaseException) -> int:
    if isinstance(exc, MemoryError):
        return EXIT_MEMORY
    causes = _chain(exc)
    if any(isinstance(e, SandboxRefused) for e in causes):
        return EXIT_FORBIDDEN  # also when wrapped, as urllib wraps it in URLError
    return EXIT_FILE_LIMIT if any(getattr(e, "errno", None) == errno.EFBIG
                                  for e in causes) else 1


class _Kit:
    """Everything the bootstrap calls after the program started, taken before it did: the
    program may rebind any module attribute or builtin, not these references."""

    def __init__(self) -> None:
        import _json
        import _operator
        import _thread
        import builtins
        import gc
        import types

        self.type, self.repr, self.len, self.str, self.bool = type, repr, len, str, bool
        self.exec, self.eval, self.compile, self.isinstance = exec, eval, compile, isinstance
        self.read, self.write, self.close, self.exit = os.read, os.write, os.close, os._exit
        self.builtins = dict(builtins.__dict__)
        self.function, self.code_type = types.FunctionType, types.CodeType
        self.traceback_type = types.TracebackType
        self.module = types.ModuleType
        self.tb_of = BaseException.__traceback__.__get__
        self.name_of = type.__dict__["__name__"].__get__
        self.str_quote = _json.encode_basestring_ascii
        self.gc_disable, self.gc_enable, self.gc_enabled = gc.disable, gc.enable, gc.isenabled
        self.ops = {"==": _operator.eq, "!=": _operator.ne, "<": _operator.lt,
                    "<=": _operator.le, ">": _operator.gt, ">=": _operator.ge,
                    "in": _operator.contains, "+": _operator.add, "-": _operator.sub,
                    "*": _operator.mul, "/": _operator.truediv, "//": _operator.floordiv,
                    "%": _operator.mod, "**": _operator.pow}
        self.fstat, self.set_blocking = os.fstat, os.set_blocking
        self.plain_scalars = frozenset({int, float, str, bool, type(None), bytes, complex})
        self.plain_sequences = frozenset({list, tuple, set, frozenset, type({}.keys()),
                                          type({}.values())})
        self.dict_types = frozenset({dict, type({}.items())})
        # Where seccomp is not available, at least the usual way to a thread is closed.
        def no_threads(*args, **kwargs):
            raise SandboxRefused("sandbox: threads are not allowed")

        for name in ("start_new_thread", "start_new", "start_joinable_thread"):
            if hasattr(_thread, name):
                setattr(_thread, name, no_threads)


def _plain(kit: _Kit, value: object, depth: int = 0) -> bool:
    """Made of builtin types only, all the way down: every operation on it is builtin."""
    kind = kit.type(value)
    if kind in kit.plain_scalars:
        return True
    if depth > 100:
        return False
    if kind in kit.plain_sequences:
        return all(_plain(kit, item, depth + 1) for item in value)
    if kind is dict:
        return all(_plain(kit, k, depth + 1) and _plain(kit, v, depth + 1)
                   for k, v in dict.items(value))
    if kind in kit.dict_types:
        return all(_plain(kit, k, depth + 1) and _plain(kit, v, depth + 1) for k, v in value)
    return False


def _strict_helpers(kit: _Kit):
    """`__strict_cmp__` and `__strict_bin__` for rewritten asserts: a program's object meets a
    plain value only through builtin operations, never its own dunder methods."""
    ops, type_ = kit.ops, kit.type

    def compare(ops_names: tuple, *operands: object) -> bool:
        ok = True
        for i, name in enumerate(ops_names):
            left, right = operands[i], operands[i + 1]
            if name in ("is", "is not"):
                same = left is right
                ok = ok and (same if name == "is" else not same)
                continue
            negate = name.startswith("not ")
            name = name[4:] if negate else name
            plain_left, plain_right = _plain(kit, left), _plain(kit, right)
            if plain_left and plain_right:
                result = ops[name](right, left) if name == "in" else ops[name](left, right)
            elif plain_left or plain_right or name == "in" or type_(left) is not type_(right):
                return False  # a program's object against a plain value: never equal
            else:
                result = ops[name](left, right)  # two of the program's own objects
            result = kit.bool(result)
            ok = ok and (not result if negate else result)
        return ok

    def binary(name: str, left: object, right: object) -> object:
        plain_left, plain_right = _plain(kit, left), _plain(kit, right)
        if plain_left != plain_right:
            raise TypeError(f"sandbox: strict asserts do not mix a "
                            f"{kit.name_of(type_(right if plain_left else left))} with a "
                            f"plain value in {name}")
        return ops[name](left, right)

    return compare, binary


def _encode(kit: _Kit, value: object, out: list, depth: int = 0) -> None:
    """JSON for exact builtin types; anything else raises TypeError."""
    kind = kit.type(value)
    if value is None:
        out.append("null")
    elif kind is bool:
        out.append("true" if value else "false")
    elif kind is int:
        out.append(int.__repr__(value))
    elif kind is float:
        if value != value:
            out.append("NaN")
        elif value in (float("inf"), float("-inf")):
            out.append("Infinity" if value > 0 else "-Infinity")
        else:
            out.append(float.__repr__(value))
    elif kind is str:
        out.append(kit.str_quote(value))
    elif depth > 100:
        raise TypeError("nested more than 100 deep")
    elif kind is list or kind is tuple:
        out.append("[" if kind is list else '{"t": [')
        for i, item in enumerate(list.__iter__(value) if kind is list else
                                 tuple.__iter__(value)):
            if i:
                out.append(",")
            _encode(kit, item, out, depth + 1)
        out.append("]" if kind is list else "]}")
    elif kind is dict:
        out.append('{"d": [')
        for i, (key, item) in enumerate(dict.items(value)):
            out.append("[" if not i else ",[")
            _encode(kit, key, out, depth + 1)
            out.append(",")
            _encode(kit, item, out, depth + 1)
            out.append("]")
        out.append("]}")
    else:
        raise TypeError(f"returned a {kit.name_of(kind)}: call cases compare int, float, str, "
                        f"bool, None, list, tuple and dict")


def _format_error(kit: _Kit, exc: BaseException, window: list, sources: dict) -> str:
    """A traceback from the program's and the tests' frames. The frames are read with the
    window open: signals blocked, the collector off and only builtin attribute reads, so no
    program code runs meanwhile. The exception's text is taken before, outside it."""
    name = kit.name_of(kit.type(exc))
    try:
        text = kit.str(exc)
        text = text if kit.type(text) is str else ""
    except BaseException:  # noqa: BLE001 - its own __str__ may raise anything
        text = "<unprintable>"
    tb = kit.tb_of(exc)
    frames = []
    collecting = kit.gc_enabled()
    kit.gc_disable()
    window[0] = True
    try:
        while kit.type(tb) is kit.traceback_type and kit.len(frames) < 200:
            code = tb.tb_frame.f_code
            frames.append((code.co_filename, tb.tb_lineno, code.co_name))
            tb = tb.tb_next
    finally:
        window[0] = False
        if collecting:
            kit.gc_enable()
    lines = ["Traceback (most recent call last):\n"]
    for filename, lineno, function in frames:
        if kit.type(filename) is not str or filename not in sources:
            continue  # the bootstrap's own frames, and the standard library's
        if filename == "<tests>":  # its lines sit one below the text's (the def is line 1)
            lineno, function = lineno - 1, ("<tests>" if function == "__flexmarl_tests__"
                                             else function)
        lines.append(f'  File "{filename}", line {lineno}, in {function}\n')
        source = sources[filename].splitlines()
        if 0 < lineno <= kit.len(source):
            lines.append(f"    {source[lineno - 1].strip()[:RESULT_CHARS]}\n")
    text = text[:4 * RESULT_CHARS]
    lines.append(f"{name}: {text}\n" if text else f"{name}\n")
    return "".join(lines)


def _scope(kit: _Kit, namespace: dict) -> dict:
    """What the tests see: the program's names, then the builtins as they were before the
    program ran (a program that rebinds `abs` or `sorted`, in its module or in builtins, does
    not change them for the tests)."""
    scope = {name: value for name, value in dict.items(namespace)
             if name not in kit.builtins or name.startswith("__")}
    scope["__builtins__"] = kit.builtins
    return scope


def _run_tests(kit: _Kit, namespace: dict, payload: bytes, sources: dict) -> bytes:
    """Run the asserts or the calls; the results line for the parent (raises on a failed
    assert)."""
    kind, body = payload[:1], payload[1:]
    if kind == b"A":  # the tests' text, NUL, the parent's rewritten tests (a function)
        text, _, rewritten = body.partition(b"\0")
        sources["<tests>"] = text.decode("utf-8", "surrogatepass")
        compare, binary = _strict_helpers(kit)
        module = kit.compile(rewritten.decode("utf-8", "surrogatepass"), "<tests>", "exec",
                             dont_inherit=True)
        [code] = [c for c in module.co_consts if kit.type(c) is kit.code_type]
        kit.function(code, _scope(kit, namespace))(compare, binary)
        return b""
    results = []
    for i, call in enumerate(body.decode("utf-8", "surrogatepass").split("\0")):
        try:
            value = kit.eval(kit.compile(call, f"<call {i}>", "eval", dont_inherit=True),
                             _scope(kit, namespace))
            out: list = []
            _encode(kit, value, out)
            results.append('["ok",' + "".join(out) + "]")
        except BaseException as exc:  # noqa: BLE001 - a case fails, the next one runs
            if kit.isinstance(exc, MemoryError):
                raise
            try:
                text = f"{kit.name_of(kit.type(exc))}: {kit.str(exc)}"[:RESULT_CHARS]
            except BaseException:  # noqa: BLE001
                text = kit.name_of(kit.type(exc))
            results.append('["error",' + kit.str_quote(text) + "]")
    return ("[" + ",".join(results) + "]").encode()


def main(argv: list[str]) -> int:
    """Run `_main` on copies of this module's functions bound to private globals and builtins.

    Every class and function defined here can be found by the program (`object.__subclasses__()`,
    then a method's `__globals__`, which no audit event covers), and with it this module's
    globals: rebinding `_run_tests` or `dict` there must change nothing. So the functions that
    run after the program's top level look their names up in a dict no object leads to."""
    import types

    shared = globals()
    private = dict(shared)
    private["__builtins__"] = dict(shared["__builtins__"])
    for name, value in shared.items():
        if type(value) is types.FunctionType and value.__module__ == shared["__name__"]:
            private[name] = types.FunctionType(value.__code__, private, value.__name__,
                                               value.__defaults__, value.__closure__)
    return private["_main"](argv)


def _main(argv: list[str]) -> int:
    try:
        program, mode, ctl_fd, tests_fd, cpu_s, memory_bytes, file_bytes, num_files = argv
        ctl_fd, tests_fd = int(ctl_fd), int(tests_fd)
        nonce = _read_exact(tests_fd, NONCE_BYTES).strip() if mode == "tests" else b""
        with open(program, "rb") as f:
            source = f.read().decode("utf-8", "surrogatepass")
        pipes = (os.fstat(ctl_fd), os.fstat(tests_fd)) if mode == "tests" else None
        _seccomp()  # False where unavailable: the hook and the _thread patch remain
        _set_limits(int(cpu_s), int(memory_bytes), int(file_bytes), int(num_files))
        kit = _Kit()
    except (ValueError, OSError) as exc:
        print(f"sandbox bootstrap: cannot set up: {exc!r}", file=sys.stderr)
        return EXIT_SETUP
    window = [False]
    sys.addaudithook(_make_hook(os.path.dirname(program), window))
    for name in list(sys.modules):  # loaded before the hook: make the program import anew
        if name.partition(".")[0] in _REFUSED_IMPORTS - {"_thread"}:
            del sys.modules[name]
    main_module = kit.module("__main__")
    namespace = main_module.__dict__
    namespace.update(__file__=program, __builtins__=sys.modules["builtins"])
    sys.modules["__main__"], sys.argv = main_module, [program]
    sources = {program: source}
    try:
        kit.exec(kit.compile(source, program, "exec", dont_inherit=True), namespace)
        if mode != "tests":
            return 0  # a script, or one stdin/stdout case: the parent reads its output
        if (kit.fstat(ctl_fd), kit.fstat(tests_fd)) != pipes:
            kit.write(2, b"sandbox: the program replaced the sandbox's pipes\n")
            return EXIT_PROTOCOL
        kit.write(ctl_fd, b"R" + nonce + b"\n")
        payload = b""
        kit.set_blocking(tests_fd, True)  # the program may have made it non-blocking
        while chunk := kit.read(tests_fd, 1 << 16):
            payload += chunk
        if payload[:kit.len(nonce) + 1] != nonce + b"\n":
            kit.write(2, b"sandbox: the tests did not arrive (a pipe was closed or replaced)\n")
            return EXIT_PROTOCOL
        results = _run_tests(kit, namespace, payload[kit.len(nonce) + 1:], sources)
    except SystemExit:
        raise  # its own exit status, but no completion line
    except BaseException as exc:  # noqa: BLE001 - the program's error, reported to the parent
        kit.write(2, _format_error(kit, exc, window, sources).encode("utf-8", "replace"))
        return _exit_code(exc)
    try:
        sys.stdout.flush()
    except BaseException:  # noqa: BLE001 - the program may have replaced or closed it
        pass
    kit.write(ctl_fd, b"F" + nonce + b" " + results + b"\n")
    kit.exit(0)  # no atexit handler or finaliser of the program runs after the verdict


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
