"""The judge: free-form asserts run here, in a sandboxed process of their own.

The program runs in another process (`_bootstrap.py`, role "serve"); every use the tests make
of it is a request relayed by the caller, answered with plain values or a reference, and every
comparison, loop and expected value stays here. What crosses to the program, and what comes
back, is fixed:

- **The tests see the names the program defines, nothing it imported.** The program's source is
  read here (`program_names`): names bound at its top level by `def`, `class` or assignment
  come from the program's process; a name bound only by `import X` is this process's own
  import of X (a test using `math` the program imported gets the judge's `math`); a name bound
  only by `from X import Y`, or never bound in the source, is not there (NameError, as in a
  clean interpreter). Names of builtins stay the builtins. A class whose name is a standard
  library module's (`class math: ...`) is taken as a value, not a class (below).
- **Test values reach program code only where that is the task**: as arguments of the
  program's functions and classes, of what they return when it is called directly (a
  returned function), and of the methods of the program's classes and of the objects the tests
  built from them (`s = Stack(); s.push(3)`). Asking an object the program *returned* to judge
  (`result.startswith(expected)`, `result.is_integer()`: any method of a returned object) is
  unjudgeable (its attributes may be read), as are comparing, hashing, membership and
  arithmetic on any reference (only the object's own `__eq__`... could answer), and passing
  the program a function or object of the tests (a callback).
- **Every reply is checked against its request** (`_Judge.expect`): a call, attribute or item
  is a value, a reference or an error; `len` an int, `bool` a bool, `str` a str; only `next`
  may answer "stop", and only a for loop, list() and the like end on it (an explicit
  next() at the end raises ProgramError). Anything else, or a line that is not one reply, fails
  the verdict whatever the tests catch (`closed`): exit status EXIT_UNJUDGEABLE.
- Exceptions the program raises arrive as the same builtin type when the tests may expect it
  (ValueError, KeyError, ...), else as ProgramError: never as SystemExit, StopIteration,
  GeneratorExit or KeyboardInterrupt.
"""
from __future__ import annotations

import builtins as _builtins
import sys

from flexmarl.rewards import _protocol as wire

__builtins__ = dict(_builtins.__dict__)

_RAISED_AS_IS = ("ArithmeticError", "AssertionError", "AttributeError", "EOFError",
                 "FileNotFoundError", "ImportError", "IndexError", "KeyError", "LookupError",
                 "ModuleNotFoundError", "NameError", "NotImplementedError", "OSError",
                 "OverflowError", "RecursionError", "RuntimeError", "TypeError",
                 "UnboundLocalError", "UnicodeError", "ValueError", "ZeroDivisionError")
_builtins_before = dict(_builtins.__dict__)

# What a reference stands for, decided here (never by the program's word): its role says which
# uses may carry the tests' values to the program's code.
FUNCTION = "function"  # a top-level name of the program other than a class: may be called
CLASS = "class"  # a top-level `class` of the program: called, it builds; its members
BUILT = "built"  # what calling a program's class gave: its members may be called
MEMBER = "member"  # an attribute of a class or of a built object: may be called
RETURNED = "returned"  # anything else the program handed back: may be called directly
ATTRIBUTE = "attribute"  # an attribute of a returned object: read, never called
_CALLED = {CLASS: BUILT}
_ATTRIBUTE_OF = {CLASS: MEMBER, BUILT: MEMBER}
_REPLIES = {  # request -> the replies it may have
    "call": ("ok", "ref", "error"), "getattr": ("ok", "ref", "error"),
    "getitem": ("ok", "ref", "error"), "iter": ("ref", "error"),
    "next": ("ok", "ref", "error", "stop"), "len": ("ok", "error"), "bool": ("ok", "error"),
    "str": ("ok", "error")}
_VALUE_TYPES = {"len": int, "bool": bool, "str": str}


class ProgramError(Exception):
    """An exception the program raised whose type the tests cannot name."""


class Unjudgeable(Exception):
    """A use of the program's values that only the program's own code could answer."""


class ProgramGone(BaseException):
    """The program's process ended (or broke the protocol) while the tests ran."""


def program_names(source: str) -> dict[str, object]:
    """The names the program's source binds at its top level: name -> FUNCTION or CLASS (taken
    from the program's process), or ("module", dotted) for a name bound only by `import`.
    Names bound only by `from ... import` are left out. SyntaxError as compile() raises it."""
    # The C half of ast: the ast module would import enum and more, ~8 ms of every judge.
    import _ast as ast

    def children(node):
        for field in node._fields:
            value = getattr(node, field, None)
            if isinstance(value, ast.AST):
                yield value
            elif isinstance(value, list):
                yield from (item for item in value if isinstance(item, ast.AST))

    bound: dict[str, list] = {}

    def bind(name: str, how: object) -> None:
        bound.setdefault(name, []).append(how)

    def visit(node) -> None:
        for child in children(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                bind(child.name, FUNCTION)
            elif isinstance(child, ast.ClassDef):
                bind(child.name, CLASS)
            elif isinstance(child, ast.Import):
                for alias in child.names:
                    top = alias.name.partition(".")[0]
                    bind(alias.asname or top, ("module", alias.name if alias.asname else top))
            elif isinstance(child, ast.ImportFrom):
                for alias in child.names:
                    bind(alias.asname or alias.name, "imported")
            elif isinstance(child, (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp,
                                    ast.GeneratorExp)):
                continue  # a scope of its own
            else:
                if isinstance(child, ast.Name) and isinstance(child.ctx, ast.Store):
                    bind(child.id, FUNCTION)
                elif isinstance(getattr(child, "name", None), str):  # except E as x, match
                    bind(child.name, FUNCTION)
                elif isinstance(getattr(child, "rest", None), str):  # match {**rest}
                    bind(child.rest, FUNCTION)
                visit(child)

    visit(compile(source, "<program>", "exec", ast.PyCF_ONLY_AST, dont_inherit=True))
    stdlib = getattr(sys, "stdlib_module_names", frozenset())
    names: dict[str, object] = {}
    for name, hows in bound.items():
        if all(type(how) is tuple for how in hows):
            names[name] = hows[-1]
        elif all(how == "imported" for how in hows):
            continue
        elif all(how == CLASS for how in hows) and name not in stdlib:
            names[name] = CLASS
        else:
            names[name] = FUNCTION
    return names


class _Judge:
    """The tests' side of the pipes: requests out, replies checked and turned into values."""

    def __init__(self, send_fd: int, reply_fd: int) -> None:
        self.send_fd, self.replies = send_fd, open(reply_fd, "rb")
        self.closed: list[str] = []  # why the verdict fails whatever the tests catch

    def refuse(self, reason: str, gone: bool = False):
        self.closed.append(reason)
        if gone:
            raise ProgramGone(reason)
        raise Unjudgeable(reason)

    def ask(self, request: str) -> object:
        wire.write_all(self.send_fd, request.encode("utf-8", "surrogatepass") + b"\n")
        line = self.replies.readline()
        if not line.endswith(b"\n"):
            raise ProgramGone("the program's process ended during a call")
        try:
            return wire.decode(line)
        except ValueError as exc:
            self.refuse(f"the program answered something that is not plain: {exc}", gone=True)

    def names(self) -> dict[str, object]:
        reply = self.ask('["names"]')
        if not (type(reply) is list and len(reply) == 2 and reply[0] == "names"
                and type(reply[1]) is list):
            if reply == ["gone"]:
                raise ProgramGone("the program's process ended before its names were read")
            self.refuse("the program answered its names out of protocol", gone=True)
        out = {}
        for pair in reply[1]:
            if not (type(pair) is list and len(pair) == 2 and type(pair[0]) is str
                    and type(pair[1]) is list and pair[1][:1] in (["ok"], ["ref"])):
                self.refuse("the program answered its names out of protocol", gone=True)
            out[pair[0]] = self.expect("getattr", pair[1], FUNCTION)
        return out

    def expect(self, request: str, reply: object, role: str) -> object:
        """The reply to `request` as the tests see it: a plain value, a Remote with `role`, or
        the exception the program raised. Anything `request` cannot be answered with closes
        the verdict."""
        kind = reply[0] if type(reply) is list and reply and type(reply[0]) is str else None
        if kind == "gone" and len(reply) == 1:
            raise ProgramGone("the program's process ended during a call")
        if kind not in _REPLIES[request]:
            self.refuse(f"the program answered a {request} request with {str(kind)[:40]!r}",
                        gone=True)
        if kind == "ok" and len(reply) == 2:
            wanted = _VALUE_TYPES.get(request)
            if wanted is None or (type(reply[1]) is wanted
                                  and not (wanted is int and reply[1] < 0)):
                return reply[1]
        elif kind == "ref" and len(reply) == 3 and type(reply[1]) is int and \
                type(reply[2]) is str:
            return Remote(self, reply[1], reply[2][:80], role)
        elif kind == "stop" and len(reply) == 1:
            return _STOP
        elif kind == "error" and len(reply) == 3 and all(type(x) is str for x in reply[1:]):
            name, text = reply[1][:80], reply[2][:wire.RESULT_CHARS]
            if name in _RAISED_AS_IS:
                raise getattr(_builtins, name)(text)
            raise ProgramError(f"{name}: {text}" if text else name)
        self.refuse(f"the program answered a {request} request out of protocol", gone=True)

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
            return wire.encode(value)
        except TypeError:
            self.refuse(f"the tests passed a {kind.__name__} to the program: only plain values "
                        f"and the program's own objects cross to it (no callbacks)")

    def op(self, op: str, remote: Remote, args: tuple = (), kwargs: dict | None = None,
           role: str = RETURNED):
        ref = object.__getattribute__(remote, "_id")
        arguments = "[" + ",".join(self.argument(a) for a in args) + "]"
        keywords = '{"d":[' + ",".join(f"[{wire.quote(k)},{self.argument(v)}]"
                                       for k, v in (kwargs or {}).items()) + "]}"
        reply = self.ask(f'["op","{op}",{{"r":{ref}}},{arguments},{keywords}]')
        return self.expect(op, reply, role)


_STOP = object()  # the program's iterator is exhausted (a reply to "next" only)


def _closed(what: str):
    def refuse(self, *args):
        kind = object.__getattribute__(self, "_kind")
        object.__getattribute__(self, "_judge").refuse(
            f"the tests {what} a {kind} the program returned: asserts are judged outside the "
            f"program, on plain values (int, float, str, bool, None, bytes, complex, list, "
            f"tuple, dict, set); return one of those")
    return refuse


class Remote:
    """An object in the program's process. Calls, attributes, items, iteration, len, bool and
    str go to it (calls with arguments only where its role allows: the module docstring);
    comparing, hashing, membership or arithmetic on it fail closed (its own __eq__ would
    answer them, so they are what an always-equal object forges)."""

    __slots__ = ("_judge", "_id", "_kind", "_role")

    def __init__(self, judge: _Judge, ref: int, kind: str, role: str) -> None:
        object.__setattr__(self, "_judge", judge)
        object.__setattr__(self, "_id", ref)
        object.__setattr__(self, "_kind", kind)
        object.__setattr__(self, "_role", role)

    def _op(self, op: str, *args, role: str = RETURNED):
        value = object.__getattribute__(self, "_judge").op(op, self, args, None, role)
        if value is _STOP:  # only `next` may answer it: see __iter__ and __next__
            raise ProgramError("StopIteration")
        return value

    def __call__(self, *args, **kwargs):
        judge = object.__getattribute__(self, "_judge")
        role = object.__getattribute__(self, "_role")
        if role == ATTRIBUTE:
            kind = object.__getattribute__(self, "_kind")
            judge.refuse(f"the tests called a method ({kind}) of an object the program returned: "
                         f"only the program's functions and classes and the objects the tests "
                         f"built from them are called (a returned object would judge itself); "
                         f"return a plain value")
        return judge.op("call", self, args, kwargs, _CALLED.get(role, RETURNED))

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        role = object.__getattribute__(self, "_role")
        return Remote._op(self, "getattr", name, role=_ATTRIBUTE_OF.get(role, ATTRIBUTE))

    def __getitem__(self, key):
        return Remote._op(self, "getitem", key)

    def __iter__(self):
        iterator = Remote._op(self, "iter")
        judge = object.__getattribute__(self, "_judge")
        return _items(judge, iterator)

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


def _items(judge: _Judge, iterator: object):
    """Iteration over a program's object: a generator of this process, which ends when the
    program's iterator answers "stop" to a `next` request (and only then)."""
    if type(iterator) is not Remote:
        judge.refuse("the program's iterator is not an object it keeps", gone=True)
    while (item := judge.op("next", iterator)) is not _STOP:
        yield item


for _name in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "and", "or", "xor",
              "lshift", "rshift", "matmul", "divmod"):
    setattr(Remote, f"__{_name}__", _closed("did arithmetic on"))
    setattr(Remote, f"__r{_name}__", _closed("did arithmetic on"))
del _name


def _scope(judge: _Judge, source: str) -> dict:
    """The tests' globals: the program's names (`program_names`) and the builtins."""
    try:
        defined = program_names(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        defined = {}  # the program cannot have run either: its names will not arrive
    names = judge.names()
    scope: dict = {}
    for name, how in defined.items():
        if name in _builtins_before or name.startswith("__"):
            continue  # a program's own `sum` does not replace the tests' builtin
        if type(how) is tuple:  # `import X`: this process's own X
            try:
                import importlib
                scope[name] = importlib.import_module(how[1])
            except BaseException:  # noqa: BLE001 - not importable here, or refused
                pass
        elif name in names:
            value = names[name]
            if type(value) is Remote:
                object.__setattr__(value, "_role", how)
            scope[name] = value
    scope["__builtins__"] = _builtins
    scope["__name__"] = "__tests__"
    return scope


def run(tests: str, source: str, send_fd: int, reply_fd: int) -> int:
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
        _builtins.exec(code, _scope(judge, source))
    except BaseException as exc:  # noqa: BLE001 - a failed assert, the program's error, ...
        sys.stderr.write(wire.report(exc, sources))
        status = wire.EXIT_UNJUDGEABLE if isinstance(exc, Unjudgeable) else wire.exit_code(exc)
    else:
        status = 0
    if judge.closed:  # the tests may have caught it: still no pass
        sys.stderr.write("sandbox: " + judge.closed[0] + "\n")
        return wire.EXIT_UNJUDGEABLE
    return status


def run_calls(payload: str, source: str, send_fd: int, reply_fd: int) -> int:
    """Call cases whose expressions are more than the program's own answer (`cases.simple_call`
    is False): each evaluated here with the judge's names, its value compared here (`same`).
    `payload`: the JSON of [nonce, [[expression, expected], ...]]. The verdicts go to stdout in
    one line, "sandbox-verdicts NONCE " and a 1 or 0 per case; 0 when every case ran."""
    judge = _Judge(send_fd, reply_fd)
    nonce, cases = wire.decode(payload)
    verdicts = []
    status = 0
    try:
        scope = _scope(judge, source)
        for number, (expression, expected) in enumerate(cases):
            sources = {f"<call {number}>": expression}
            try:
                code = compile(expression, f"<call {number}>", "eval", dont_inherit=True)
                verdicts.append(wire.same(expected, _builtins.eval(code, scope)))
            except (ProgramGone, Unjudgeable, MemoryError):
                raise
            except BaseException as exc:  # noqa: BLE001 - the program's error: a failed case
                sys.stderr.write(wire.report(exc, sources))
                verdicts.append(False)
    except BaseException as exc:  # noqa: BLE001 - the program ended, or a use closed the verdict
        sys.stderr.write(wire.report(exc, {}))
        status = wire.EXIT_UNJUDGEABLE if isinstance(exc, Unjudgeable) else wire.exit_code(exc)
    sys.stdout.write(f"sandbox-verdicts {nonce} " + "".join("10"[not v] for v in verdicts)
                     + "\n")
    if judge.closed:
        sys.stderr.write("sandbox: " + judge.closed[0] + "\n")
        return wire.EXIT_UNJUDGEABLE
    return status
