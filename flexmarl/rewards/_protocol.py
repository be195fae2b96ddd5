"""What both ends of the sandbox's pipes share: exit codes, the value codec, error reports.

Loaded in three kinds of process: the caller (`flexmarl.rewards.sandbox`, `cases`), a program's
sandboxed interpreter (`_bootstrap.py`) and the judge's (`_judge.py`). It uses the standard
library only and runs on every Python the project supports (3.11+): the sandboxed interpreters
see no site-packages. The loader in `confinement.py` hands these modules to the sandbox from
memory (never from a file a program could write).

Values cross the pipes as one JSON line each (`encode`, `decode`): int, float, str, bool and
None as JSON; tuples, sets, frozensets, dicts, bytes and complex as tagged objects
({"t": [...]}, {"s": ...}, {"f": ...}, {"d": [[k, v], ...]}, {"b": hex}, {"c": [re, im]}), so
each decodes to its own type; {"r": n} is a reference to an object the program keeps.
"""
from __future__ import annotations

import builtins as _builtins
import errno
import os

# Name lookups here go to a copy of the builtins taken before any program ran: in the
# program's process a program that rebinds builtins.len breaks nothing of the codec (it could
# only spoil its own answers).
__builtins__ = dict(_builtins.__dict__)

EXIT_MEMORY = 81
"""The program ran out of its address-space limit (MemoryError)."""
EXIT_FORBIDDEN = 82
"""The program died of an operation the audit hook refused."""
EXIT_FILE_LIMIT = 83
"""The program wrote past its file-size limit (EFBIG) or filled its box (ENOSPC)."""
EXIT_SETUP = 84
"""The bootstrap itself could not set the sandbox up (bad arguments, limits refused)."""
EXIT_PROTOCOL = 85
"""The requests did not arrive as the parent sent them (the program closed or replaced a pipe)."""
EXIT_UNJUDGEABLE = 86
"""The judge met a reply or a use of the program's values it cannot judge outside the
program."""
NONCE_BYTES = 33
"""The nonce's length on the requests pipe: 32 hex characters and a newline."""
RESULT_CHARS = 200
"""An error's text, or a source line in a traceback, in at most this many characters."""
MAX_DEPTH = 100
"""Values nest at most this deep."""
FLOAT_REL_TOL = 1e-9
"""Call cases whose expected value is a float: the answer within this relative tolerance."""


class SandboxRefused(PermissionError):
    """Raised by the audit hook for an operation the sandbox does not allow."""


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
        return quote(value)
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


def quote(text: str) -> str:
    """A str as a JSON string (ASCII only: a line never holds a raw newline)."""
    import _json
    return _json.encode_basestring_ascii(text)


class Pairs(list):
    """A dict as the caller decodes it: its [key, value] pairs, never hashed (`decode` with
    hashed=False): keys a program chose to collide cost the caller nothing."""


class Items(list):
    """A set or frozenset as the caller decodes it: its items, never hashed."""


_TAGS = {"t": tuple, "s": set, "f": frozenset}
_CONSTANTS = {"NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf")}


class _Scanning:
    """What `_json.make_scanner` reads its settings from (the C half of json.loads; the json
    package itself imports re and enum, 15 ms of every start)."""

    def __init__(self, hook) -> None:
        self.strict, self.object_hook, self.object_pairs_hook = True, hook, None
        self.parse_float, self.parse_int = float, int
        self.parse_constant, self.memo = _CONSTANTS.__getitem__, {}


def decode(text: bytes | str, refs=None, *, hashed: bool = True) -> object:
    """The inverse of `encode`; {"r": n} is a reference (only where `refs(n)` is given).
    ValueError for anything else. With hashed=False, dicts come back as `Pairs` and sets as
    `Items`: linear in the line's length whatever the keys (the caller's way: a set of ints
    with one hash, built, would take time quadratic in its size)."""
    import _json

    def tagged(obj: dict) -> object:
        if len(obj) == 1:
            (tag, body), = obj.items()
            if tag == "t" and type(body) is list:
                return tuple(body)
            if tag in _TAGS and type(body) is list:
                return _TAGS[tag](body) if hashed else Items(body)
            if tag == "d" and type(body) is list and all(
                    type(p) is list and len(p) == 2 for p in body):
                return {k: v for k, v in body} if hashed else Pairs(body)
            if tag == "b" and type(body) is str:
                return bytes.fromhex(body)
            if tag == "c" and type(body) is list and len(body) == 2 and all(
                    type(x) in (int, float) for x in body):
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
    except MemoryError:
        raise
    except Exception as exc:  # noqa: BLE001 - an unhashable key, too deep, cut short (the C
        # scanner's error needs json.decoder, which the sandbox does not import: SystemError)
        raise ValueError(f"not a plain value: {type(exc).__name__}") from None
    if end != len(text):
        raise ValueError("more than one JSON value on a line")
    return value


def same(expected: object, got: object) -> bool:
    """Call-case equality: exact container types; numbers as Python compares them, exactly,
    but for an expected float (FLOAT_REL_TOL, NaN equal to NaN); a dict against a dict or the
    `Pairs` of a reply. Anything of another type (a reference) is unequal, never compared."""
    import math
    numbers = (int, float, bool)
    if type(expected) is float:
        if type(got) not in numbers:
            return False
        try:
            a, b = expected, float(got)
        except OverflowError:  # an int past float's range is not near any float
            return False
        return (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=FLOAT_REL_TOL)
    if type(expected) in numbers:
        return type(got) in numbers and expected == got  # int == float is exact in Python
    if type(expected) is dict:
        if type(got) is dict:
            got = Pairs([k, v] for k, v in dict.items(got))
        return type(got) is Pairs and _same_pairs(expected, got)
    if type(expected) is not type(got):
        return False
    if type(expected) in (list, tuple):
        return len(expected) == len(got) and all(same(a, b) for a, b in zip(expected, got))
    return expected == got  # str, None


def _same_pairs(expected: dict, got: Pairs) -> bool:
    """A dict against a reply's [key, value] pairs, never hashing the reply's keys into a
    table: each is looked up in `expected`, each of its keys matched once."""
    if len(got) != len(expected):
        return False
    index = {key: n for n, key in enumerate(expected)}
    values = list(expected.values())
    seen = bytearray(len(expected))
    for pair in got:
        if type(pair) is not list or len(pair) != 2:
            return False
        key, value = pair
        try:
            n = index.get(key)
        except TypeError:  # an unhashable key (a list)
            return False
        if n is None or seen[n] or not same(values[n], value):
            return False
        seen[n] = 1
    return True


# ------------------------------------------------------------------------------- errors
def _chain(exc: BaseException) -> list[BaseException]:
    """The exception and those it was raised from or while handling."""
    seen: list[BaseException] = []
    while exc is not None and not any(exc is e for e in seen):
        seen.append(exc)
        exc = exc.__cause__ or exc.__context__
    return seen


def exit_code(exc: BaseException) -> int:
    """The exit status a process ends with for `exc`: memory, forbidden, file limit, else 1."""
    if isinstance(exc, MemoryError):
        return EXIT_MEMORY
    causes = _chain(exc)
    if any(isinstance(e, SandboxRefused) for e in causes):
        return EXIT_FORBIDDEN  # also when wrapped, as urllib wraps it in URLError
    return EXIT_FILE_LIMIT if any(getattr(e, "errno", None) in (errno.EFBIG, errno.ENOSPC)
                                  for e in causes) else 1


def report(exc: BaseException, sources: dict) -> str:
    """The exception with the frames of `sources` only (the program's or the tests', never
    the sandbox's or the standard library's). No `traceback` import: 6 ms of every start."""
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


# ------------------------------------------------------------------------------- pipes
def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def read_exact(fd: int, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = os.read(fd, size - len(data))
        if not chunk:
            break
        data += chunk
    return data


def read_line(fd: int) -> bytes:
    """A short line (a length) read byte by byte: nothing past it is consumed."""
    data = b""
    while not data.endswith(b"\n") and len(data) < 32:
        chunk = os.read(fd, 1)
        if not chunk:
            raise OSError("the pipe ended before its line")
        data += chunk
    return data
