"""The sandbox's first code in a child interpreter: limits, audit hook, then one of three roles.

`flexmarl.rewards.sandbox` runs this file as a script (`python -I -S -B _bootstrap.py ...`);
it must use the standard library only, since isolated mode sees no site-packages, and run on
every Python the project supports (3.11+). Importing it as a module does nothing but define the
exit codes and the value codec, which the parent shares.

    script   the program runs; its output is judged by the parent (stdin/stdout cases)
    serve    the program runs, says "R" + nonce, then answers requests, one JSON line each:
               ["eval", expr]              a call case
               ["names"]                   the program's names: plain values, or references
               ["op", op, ref, args, kw]   call / getattr / getitem / iter / next / len /
                                           bool / str on an object the program handed out
             each answer plain values only (`encode`), or a reference to an object kept here
    judge    free-form asserts run here, in a process of their own: every name the program
             defines is a `Remote`, whose use becomes a request to the program's process
             (relayed by the parent); the answers come back as plain values, decoded here, and
             every comparison, loop and expected value stays here

The rule that makes a reward hack worthless: nothing that decides the verdict is ever in the
program's process. Call cases and stdin/stdout cases are compared in the parent, asserts in the
judge; the program's process holds only its inputs. So whatever a program reads of its own
process (frames, every reachable object, its memory) finds no expected value, and whatever it
writes on its pipes is at most an answer it could have returned. The nonce frames the ready
line (a check that the pipes are the sandbox's), it proves nothing.

The seccomp filter (no new processes or threads, no ptrace, no process_vm_readv) is installed
before this interpreter starts, by bubblewrap or by `_seccomp_exec.py`, so ctypes is never
imported here; this file checks that. The audit hook refuses process creation, signals to other
processes, sockets, ctypes, raising the limits, subinterpreters, links, writes outside the
program's directory, other processes' /proc entries and `sys.monitoring` callbacks. It is a
second wall: under bubblewrap the kernel's namespaces are the boundary (PEP 578 says hooks are
none).
"""
from __future__ import annotations

import builtins as _builtins
import errno
import os
import sys

# The bootstrap's own name lookups go to a copy of the builtins taken before the program ran:
# a program that rebinds builtins.len breaks nothing here (it could only spoil its own answers).
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
"""The requests did not arrive as the parent sent them (the program closed or replaced a pipe)."""
EXIT_UNJUDGEABLE = 86
"""The judge met a use of the program's values it cannot judge outside the program."""
NONCE_BYTES = 33
"""The nonce's length on the requests pipe: 32 hex characters and a newline."""
RESULT_CHARS = 200
"""An error's text, or a source line in a traceback, in at most this many characters."""
MAX_DEPTH = 100
"""Values nest at most this deep."""

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
# Events whose first argument is a path the program changes.
_PATH_EVENTS = frozenset({
    "os.remove", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.truncate", "os.utime",
    "os.setxattr", "os.removexattr", "os.chflags", "os.lchflags", "shutil.rmtree"})
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
_OPS = ("call", "getattr", "getitem", "iter", "next", "len", "bool", "str")


class SandboxRefused(PermissionError):
    """Raised by the audit hook for an operation the sandbox does not allow."""


class _HookRefused(RuntimeError):
    """sys.addaudithook ignores a RuntimeError from an existing hook: the new one is not
    added (PermissionError would not stop it)."""


def _make_hook(workdir: str):
    """The audit hook; its state lives in this closure."""
    root = os.path.join(os.path.realpath(workdir), "")
    abspath, fspath, fsdecode = os.path.abspath, os.fspath, os.fsdecode
    join, realpath, isdir, own_pid = os.path.join, os.path.realpath, os.path.isdir, str(os.getpid())

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
        if event in _REFUSED_EVENTS or event.startswith(_REFUSED_PREFIXES):
            raise SandboxRefused(f"sandbox: {event} is not allowed")
        if event == "import" and args[0].partition(".")[0] in _REFUSED_IMPORTS:
            raise SandboxRefused(f"sandbox: importing {args[0]} is not allowed")
        if event == "open":
            path, mode, flags = args
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


# ------------------------------------------------------------------------------- values
def encode(value: object, depth: int = 0) -> str:
    """JSON for exact builtin types (int, float, str, bool, None, list, tuple, dict, set,
    frozenset, bytes, complex); anything else, a subclass included, raises TypeError. Tuples,
    dicts, sets and the rest are tagged objects, so they decode to their own types."""
    kind = type(value)
    if value is None:
        return "null"
    if kind is bool:
        return "true" if value else "false"
    if kind is int:
        return int.__repr__(value)
    if kind is float:
        if value != value:
            return "NaN"
        if value in (float("inf"), float("-inf")):
            return "Infinity" if value > 0 else "-Infinity"
        return float.__repr__(value)
    if kind is str:
        return _quote(value)
    if depth > MAX_DEPTH:
        raise TypeError(f"nested more than {MAX_DEPTH} deep")
    if kind is list:
        return "[" + ",".join(encode(v, depth + 1) for v in list.__iter__(value)) + "]"
    if kind is tuple:
        return '{"t":[' + ",".join(encode(v, depth + 1) for v in tuple.__iter__(value)) + "]}"
    if kind is set or kind is frozenset:
        items = ",".join(encode(v, depth + 1) for v in kind.__iter__(value))
        return '{"' + ("s" if kind is set else "f") + '":[' + items + "]}"
    if kind is dict:
        return '{"d":[' + ",".join("[" + encode(k, depth + 1) + "," + encode(v, depth + 1) + "]"
                                   for k, v in dict.items(value)) + "]}"
    if kind is bytes:
        return '{"b":"' + bytes.hex(value) + '"}'
    if kind is complex:
        return '{"c":[' + encode(value.real) + "," + encode(value.imag) + "]}"
    raise TypeError(f"a {type.__dict__['__name__'].__get__(kind)} is not a plain value")


def _quote(text: str) -> str:
    import _json
    return _json.encode_basestring_ascii(text)


_TAGS = {"t": tuple, "s": set, "f": frozenset}
_CONSTANTS = {"NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf")}


class _Scanning:
    """What `_json.make_scanner` reads its settings from (the C half of json.loads; the json
    package itself imports re and enum, 15 ms of every start)."""

    def __init__(self, hook) -> None:
        self.strict, self.object_hook, self.object_pairs_hook = True, hook, None
        self.parse_float, self.parse_int = float, int
        self.parse_constant, self.memo = _CONSTANTS.__getitem__, {}


def decode(text: bytes | str, refs=None) -> object:
    """The inverse of `encode`; {"r": n} is a reference (only where `refs(n)` is given).
    ValueError for anything else."""
    import _json

    def tagged(obj: dict) -> object:
        if len(obj) == 1:
            (tag, body), = obj.items()
            if tag in _TAGS and type(body) is list:
                return _TAGS[tag](body)
            if tag == "d" and type(body) is list and all(
                    type(p) is list and len(p) == 2 for p in body):
                return {k: v for k, v in body}
            if tag == "b" and type(body) is str:
                return bytes.fromhex(body)
            if tag == "c" and type(body) is list and len(body) == 2:
                return complex(*body)
            if tag == "r" and refs is not None and type(body) is int:
                return refs(body)
        raise ValueError("a value the sandbox's encoder does not write")

    if type(text) is not str:
        text = text.decode("utf-8", "surrogatepass")
    text = text.strip()
    try:
        value, end = _json.make_scanner(_Scanning(tagged))(text, 0)
    except StopIteration:
        raise ValueError("not a JSON value") from None
    except (TypeError, RecursionError, KeyError) as exc:  # an unhashable key, too deep
        raise ValueError(f"not a plain value: {exc!r}") from None
    if end != len(text):
        raise ValueError("more than one JSON value on a line")
    return value


# ------------------------------------------------------------------------------- errors
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


def _traceback(exc: BaseException, sources: dict) -> str:
    """The exception with the frames of `sources` only (the program's or the tests', never
    this file's or the standard library's). No `traceback` import: 6 ms of every start."""
    name = type(exc).__name__
    try:
        text = str(exc)
    except BaseException:  # noqa: BLE001 - its own __str__ may raise anything
        text = "<unprintable>"
    lines = ["Traceback (most recent call last):\n"]
    tb, depth = exc.__traceback__, 0
    while tb is not None and depth < 200:
        code, line, depth = tb.tb_frame.f_code, tb.tb_lineno, depth + 1
        tb = tb.tb_next
        if code.co_filename not in sources:
            continue
        lines.append(f'  File "{code.co_filename}", line {line}, in {code.co_name}\n')
        source = sources[code.co_filename].splitlines()
        if line is not None and 0 < line <= len(source):
            lines.append(f"    {source[line - 1].strip()[:RESULT_CHARS]}\n")
    text = text[:4 * RESULT_CHARS]
    lines.append(f"{name}: {text}\n" if text else f"{name}\n")
    return "".join(lines)


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
        return f'["ref",{len(self.objects) - 1},{_quote(type(value).__name__)}]'

    def handle(self, line: bytes) -> str:
        request = decode(line, refs=self.reference)
        kind = request[0] if type(request) is list and request else None
        if kind == "eval" and len(request) == 2 and type(request[1]) is str:
            value = _builtins.eval(compile(request[1], "<call>", "eval", dont_inherit=True), self.scope())
            return self.answer(value, by_reference=False)
        if kind == "names" and len(request) == 1:
            names = [f"[{_quote(name)},{self.answer(value, by_reference=True)}]"
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
                        os.write(2, _traceback(exc, self.sources).encode("utf-8", "replace"))
                    try:
                        text = str(exc)[:RESULT_CHARS]
                    except BaseException:  # noqa: BLE001
                        text = "<unprintable>"
                    reply = '["error",' + _quote(type(exc).__name__) + "," + _quote(text) + "]"
                _write_all(ctl_fd, reply.encode() + b"\n")


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _read_exact(fd: int, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = os.read(fd, size - len(data))
        if not chunk:
            break
        data += chunk
    return data


_builtins_before = dict(_builtins.__dict__)


# ------------------------------------------------------------------------------- judge
# Exceptions from the program that the tests may expect by type. Others come as ProgramError:
# never a SystemExit that ends the tests early, a StopIteration that ends a loop or a map()
# early (all() of an empty map is True), or a KeyboardInterrupt.
_RAISED_AS_IS = ("ArithmeticError", "AssertionError", "AttributeError", "EOFError",
                 "FileNotFoundError", "ImportError", "IndexError", "KeyError", "LookupError",
                 "ModuleNotFoundError", "NameError", "NotImplementedError", "OSError",
                 "OverflowError", "RecursionError", "RuntimeError", "TypeError",
                 "UnboundLocalError", "UnicodeError", "ValueError", "ZeroDivisionError")


class ProgramError(Exception):
    """An exception the program raised whose type the tests cannot name."""


class Unjudgeable(Exception):
    """A use of the program's values that only the program's own code could answer."""


class ProgramGone(BaseException):
    """The program's process ended (or broke the protocol) while the tests ran."""


class _Judge:
    """The tests' side: `Remote` stands for an object that lives in the program's process."""

    def __init__(self, send_fd: int, reply_fd: int) -> None:
        self.send_fd, self.replies = send_fd, open(reply_fd, "rb")
        self.closed: list[str] = []  # why the verdict fails whatever the tests catch

    def ask(self, request: str) -> object:
        _write_all(self.send_fd, request.encode("utf-8", "surrogatepass") + b"\n")
        line = self.replies.readline()
        if not line.endswith(b"\n"):
            raise ProgramGone("the program's process ended during a call")
        try:
            reply = decode(line)
        except ValueError as exc:
            self.closed.append(f"the program answered something that is not plain: {exc}")
            raise ProgramGone("the program broke the protocol") from None
        return self.value(reply)

    def value(self, reply: object) -> object:
        """A reply as the tests see it: a plain value, a Remote, or the exception raised."""
        kind = reply[0] if type(reply) is list and reply else None
        if kind == "names" and len(reply) == 2 and type(reply[1]) is list:
            return {pair[0]: self.value(pair[1]) for pair in reply[1]
                    if type(pair) is list and len(pair) == 2 and type(pair[0]) is str}
        if kind == "ok" and len(reply) == 2:
            return reply[1]
        if kind == "ref" and len(reply) == 3 and type(reply[1]) is int and type(reply[2]) is str:
            return Remote(self, reply[1], reply[2])
        if kind == "stop" and len(reply) == 1:
            raise StopIteration
        if kind == "error" and len(reply) == 3 and all(type(x) is str for x in reply[1:]):
            name, text = reply[1], reply[2]
            if name in _RAISED_AS_IS:
                raise getattr(_builtins, name)(text)
            raise ProgramError(f"{name}: {text}" if text else name)
        if kind == "gone":
            raise ProgramGone("the program's process ended during a call")
        self.closed.append("the program answered out of protocol")
        raise ProgramGone("the program broke the protocol")

    def argument(self, value: object) -> str:
        """An argument for the program: plain values, and the program's own objects."""
        if type(value) is Remote:
            return '{"r":' + str(object.__getattribute__(value, "_id")) + "}"
        kind = type(value)
        if kind in (list, tuple, set, frozenset):
            items = ",".join(self.argument(v) for v in value)
            if kind is list:
                return "[" + items + "]"
            return '{"' + {tuple: "t", set: "s", frozenset: "f"}[kind] + '":[' + items + "]}"
        if kind is dict:
            return '{"d":[' + ",".join(f"[{self.argument(k)},{self.argument(v)}]"
                                       for k, v in value.items()) + "]}"
        try:
            return encode(value)
        except TypeError:
            reason = (f"the tests passed a {kind.__name__} to the program: only plain values "
                      f"and the program's own objects cross to it (no callbacks)")
            self.closed.append(reason)
            raise Unjudgeable(reason) from None

    def op(self, op: str, remote: "Remote", args: tuple = (), kwargs: dict | None = None):
        ref = object.__getattribute__(remote, "_id")
        arguments = "[" + ",".join(self.argument(a) for a in args) + "]"
        keywords = '{"d":[' + ",".join(f"[{_quote(k)},{self.argument(v)}]"
                                       for k, v in (kwargs or {}).items()) + "]}"
        return self.ask(f'["op","{op}",{{"r":{ref}}},{arguments},{keywords}]')


def _closed(what: str):
    def refuse(self, *args):
        judge = object.__getattribute__(self, "_judge")
        kind = object.__getattribute__(self, "_kind")
        reason = (f"the tests {what} a {kind} the program returned: asserts are judged outside "
                  f"the program, on plain values (int, float, str, bool, None, bytes, complex, "
                  f"list, tuple, dict, set); return one of those")
        judge.closed.append(reason)
        raise Unjudgeable(reason)
    return refuse


class Remote:
    """An object in the program's process. Calls, attributes, items, iteration, len, bool and
    str go to it; comparing, hashing, membership or arithmetic on it fail closed (its own
    __eq__ would answer them, so they are what an always-equal object forges)."""

    __slots__ = ("_judge", "_id", "_kind")

    def __init__(self, judge: _Judge, ref: int, kind: str) -> None:
        object.__setattr__(self, "_judge", judge)
        object.__setattr__(self, "_id", ref)
        object.__setattr__(self, "_kind", kind)

    def _op(self, op: str, *args, **kwargs):
        return object.__getattribute__(self, "_judge").op(op, self, args, kwargs)

    def __call__(self, *args, **kwargs):
        return object.__getattribute__(self, "_judge").op("call", self, args, kwargs)

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return Remote._op(self, "getattr", name)

    def __getitem__(self, key):
        return Remote._op(self, "getitem", key)

    def __iter__(self):
        return Remote._op(self, "iter")

    def __next__(self):
        return Remote._op(self, "next")

    def __len__(self):
        return Remote._op(self, "len")

    def __bool__(self):
        return Remote._op(self, "bool")

    def __str__(self):
        return Remote._op(self, "str")

    def __repr__(self):
        return f"<{object.__getattribute__(self, '_kind')} in the program>"

    __setattr__ = __delattr__ = __setitem__ = __delitem__ = _closed("changed")
    __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = _closed("compared")
    __hash__ = _closed("hashed")
    __contains__ = _closed("looked for a value in")
    __index__ = __int__ = __float__ = __abs__ = __neg__ = __pos__ = _closed("converted")


for _name in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "and", "or", "xor",
              "lshift", "rshift", "matmul", "divmod"):
    setattr(Remote, f"__{_name}__", _closed("did arithmetic on"))
    setattr(Remote, f"__r{_name}__", _closed("did arithmetic on"))
del _name


def _judge(tests: str, send_fd: int, reply_fd: int) -> int:
    """Run the tests against the program's names; 0 when they all ran to the end."""
    judge = _Judge(send_fd, reply_fd)
    sources = {"<tests>": tests}
    try:
        code = compile(tests, "<tests>", "exec", dont_inherit=True)
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        line = getattr(exc, "lineno", None)
        print(f"SyntaxError: the tests do not compile: {getattr(exc, 'msg', type(exc).__name__)}"
              + (f" (line {line})" if line else ""), file=sys.stderr)
        return 1
    try:
        names = judge.ask('["names"]')
        if type(names) is not dict:
            raise ProgramGone("the program's names did not arrive")
        # Names of builtins stay the builtins (a program's own `sum` does not replace them).
        scope = {k: v for k, v in names.items() if type(k) is str and k not in _builtins_before}
        scope["__builtins__"] = _builtins
        scope["__name__"] = "__tests__"
        _builtins.exec(code, scope)
    except BaseException as exc:  # noqa: BLE001 - a failed assert, the program's error, ...
        sys.stderr.write(_traceback(exc, sources))
        status = EXIT_UNJUDGEABLE if isinstance(exc, Unjudgeable) else _exit_code(exc)
    else:
        status = 0
    if judge.closed and status != EXIT_UNJUDGEABLE:  # the tests caught it: still no pass
        sys.stderr.write("sandbox: " + judge.closed[0] + "\n")
        return EXIT_UNJUDGEABLE
    return status


# ------------------------------------------------------------------------------- main
def main(argv: list[str]) -> int:
    try:
        role, path, ctl_fd, req_fd, cpu_s, memory_bytes, file_bytes, num_files = argv
        ctl_fd, req_fd = int(ctl_fd), int(req_fd)
        if "_ctypes" in sys.modules or "ctypes" in sys.modules:
            raise OSError("ctypes is loaded before the program: the seccomp filter must be "
                          "installed outside this interpreter")
        nonce = _read_exact(req_fd, NONCE_BYTES).strip() if role == "serve" else b""
        if role == "judge":  # the tests' length in a line, then the tests
            size = int(_read_line(req_fd))
            tests = _read_exact(req_fd, size).decode("utf-8", "surrogatepass")
        else:
            with open(path, "rb") as f:
                source = f.read().decode("utf-8", "surrogatepass")
        _set_limits(int(cpu_s), int(memory_bytes), int(file_bytes), int(num_files))
        _no_threads()
        import _json  # noqa: F401 - loaded before the hook, once
    except (ValueError, OSError) as exc:
        print(f"sandbox bootstrap: cannot set up: {exc!r}", file=sys.stderr)
        return EXIT_SETUP
    sys.addaudithook(_make_hook(os.path.dirname(path)))
    for name in list(sys.modules):  # loaded before the hook: make the program import anew
        if name.partition(".")[0] in _REFUSED_IMPORTS - {"_thread"}:
            del sys.modules[name]
    if role == "judge":
        status = _judge(tests, ctl_fd, req_fd)
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
        os.write(2, _traceback(exc, sources).encode("utf-8", "replace"))
        return _exit_code(exc)
    if role == "serve":
        try:
            sys.stdout.flush()
        except BaseException:  # noqa: BLE001 - the program may have replaced or closed it
            pass
        os._exit(0)  # no atexit handler or finaliser of the program runs after the answers
    return 0


def _read_line(fd: int) -> bytes:
    data = b""
    while not data.endswith(b"\n") and len(data) < 32:
        chunk = os.read(fd, 1)
        if not chunk:
            raise OSError("the tests did not arrive")
        data += chunk
    return data


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
