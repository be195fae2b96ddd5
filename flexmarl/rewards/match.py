"""Answer extraction and matching: pure, synchronous rewards on a completion's text.

`extract_answer` finds the answer in a completion (the last `\\boxed{...}`, an "Answer:" line, or
the last number); `exact_match`, `numeric_match`, `math_equal` and `format_reward` score it.
`extract_code` pulls a program out of a completion for `flexmarl.rewards.sandbox`.

Numbers are ASCII only (`[0-9]`, as `flexmarl.tasks` reads them): Arabic-Indic or full-width
digits are not numbers here. An `answer` argument may be a str, an int or float, or anything
with an `.answer` attribute (a `flexmarl.tasks.Task`). A completion of None (what
`extract_answer` returns when it finds nothing) scores 0.0.
"""
from __future__ import annotations

import functools
import math
import re
import threading
from typing import Protocol

MATH_TAIL_CHARS = 20_000
"""`math_equal` parses only this many characters from the end of a completion (the answer is
at its end), which bounds the parser's work on a runaway generation."""
HOW = ("auto", "boxed", "answer", "last_number")
"""`extract_answer` modes."""

# ASCII digits only: `\d` would also match Unicode digits. Thousands groups ("1,000") must be
# whole; a minus sign counts only where it cannot be a subtraction or a range ("3-5").
_NUMBER = re.compile(
    r"(?:(?<![0-9A-Za-z)\]}])-)?"
    r"(?:(?:[0-9]{1,3}(?:,[0-9]{3})+(?![0-9])|[0-9]+)(?:\.[0-9]+)?|\.[0-9]+)"
    r"(?:[eE][-+]?[0-9]+)?")
_NUMBER_ALONE = re.compile(r"[-+]?(?:(?:[0-9]{1,3}(?:,[0-9]{3})+|[0-9]+)(?:\.[0-9]*)?|\.[0-9]+)"
                           r"(?:[eE][-+]?[0-9]+)?")
_ANSWER = re.compile(r"\banswer\b\s*(?:is\b\s*:?|:)[ \t*]*([^\n]*)", re.IGNORECASE)
_BOXED = "\\boxed{"
_BRACE_TOKENS = re.compile(r"\\.|[{}]", re.DOTALL)  # an escaped character is one token
_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)
_PYTHON_TAGS = frozenset({"python", "py", "python3"})


class HasAnswer(Protocol):
    answer: str


Answer = str | int | float | HasAnswer


def exact_match(text: str | None, answer: Answer) -> float:
    """1.0 if `text` equals the answer once both are stripped of surrounding whitespace."""
    if _text(text) is None:
        return 0.0
    return 1.0 if text.strip() == _answer_text(answer).strip() else 0.0


def numeric_match(text: str | None, answer: Answer, *, rel_tol: float = 1e-6) -> float:
    """1.0 if the number in the completion equals the numeric answer within `rel_tol`.

    The number is the first one in `extract_answer(text)` (the boxed part, the answer line, or
    the last number). "1,000", "1000.0" and "1e3" all equal 1000. The answer itself must be a
    number; for "1/2" or "\\frac{1}{2}" use `math_equal`.
    """
    if isinstance(rel_tol, bool) or not isinstance(rel_tol, (int, float)) or not rel_tol >= 0:
        raise ValueError(f"rel_tol must be a number >= 0, got {rel_tol!r}")
    gold = _as_number(_answer_text(answer))
    if gold is None:
        raise ValueError(f"numeric_match needs a numeric answer, got {_answer_text(answer)!r}; "
                         f"use exact_match or math_equal for other answers")
    found = extract_answer(_text(text) or "")
    match = _NUMBER.search(found) if found is not None else None
    if match is None:
        return 0.0
    pred = _as_number(match.group())
    return 1.0 if pred is not None and math.isclose(pred, gold, rel_tol=rel_tol) else 0.0


def extract_answer(text: str, how: str = "auto") -> str | None:
    """The answer part of a completion, or None if there is none.

    - "boxed": the contents of the last `\\boxed{...}` whose braces balance (nested braces and
      escaped `\\{` `\\}` allowed).
    - "answer": the rest of the line after the last "answer:" or "answer is" (any case, "**"
      markdown skipped), one trailing full stop dropped; None if that is empty.
    - "last_number": the last ASCII number, as written ("-1,000.5").
    - "auto": boxed, else answer, else last_number.
    """
    _text(text, name="text")
    if how not in HOW:
        raise ValueError(f"how must be one of {HOW}, got {how!r}")
    if how == "auto":
        for mode in HOW[1:]:
            found = extract_answer(text, mode)
            if found is not None:
                return found
        return None
    if how == "boxed":
        return _last_boxed(text)
    if how == "answer":
        last = None
        for last in _ANSWER.finditer(text):
            pass
        if last is None:
            return None
        found = last.group(1).strip().removesuffix(".").rstrip()
        return found or None
    last = None
    for last in _NUMBER.finditer(text):
        pass
    return last.group() if last is not None else None


def math_equal(text: str | None, answer: Answer, *, timeout_s: int = 2) -> float:
    """1.0 if math_verify finds the completion's answer equal to the reference, else 0.0.

    Both sides go through `math_verify.parse` (LaTeX or plain expressions; a reference or a
    short completion without `$...$` is also tried inside `$...$`), then
    `math_verify.verify(gold, pred)`: "\\frac{1}{2}" equals "0.5", "1+x^2" equals "x^2+1".
    Only the last `MATH_TAIL_CHARS` characters of the completion are read. Any error inside
    math_verify scores 0.0.

    `timeout_s` (whole seconds) bounds each parse and comparison, using math_verify's own
    timeouts, which rely on SIGALRM and so work only in the main thread: called from another
    thread, math_equal runs without a timeout (math_verify logs a warning once). It blocks its
    caller; keep it off an event loop that must stay responsive, or keep timeout_s small.
    """
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, int) or timeout_s < 1:
        raise ValueError(f"timeout_s must be an int >= 1 (seconds; math_verify uses "
                         f"signal.alarm), got {timeout_s!r}")
    if _text(text) is None:
        return 0.0
    import math_verify  # sympy underneath: slow to import, so only when first needed

    reference = _answer_text(answer)
    limit = timeout_s if threading.current_thread() is threading.main_thread() else None
    try:
        gold = _math_parse(math_verify, reference, limit)
        pred = _math_parse(math_verify, text[-MATH_TAIL_CHARS:], limit)
        if not gold or not pred:
            return 0.0
        return 1.0 if math_verify.verify(gold, pred, timeout_seconds=limit) else 0.0
    except Exception:  # math_verify's own failures (timeouts, sympy errors) mean "no match"
        return 0.0


def format_reward(text: str | None, pattern: str | re.Pattern[str]) -> float:
    """1.0 if the whole completion matches `pattern` (re.fullmatch, not search; a str pattern is
    compiled once with re.DOTALL so `.` spans lines), else 0.0. To accept the pattern anywhere,
    write ".*PATTERN.*". A compiled pattern is used with its own flags."""
    if _text(text) is None:
        return 0.0
    if not isinstance(pattern, (str, re.Pattern)):
        raise TypeError(f"pattern must be a regular expression (str or re.Pattern), got "
                        f"{type(pattern).__name__}")
    compiled = pattern if isinstance(pattern, re.Pattern) else _compile(pattern)
    return 1.0 if compiled.fullmatch(text) is not None else 0.0


def extract_code(text: str) -> str:
    """The program in a completion: the last ```python (or py) fenced block, else the last
    fenced block without a language, else the text itself. An unclosed final fence (a
    completion cut off by max_tokens) counts as running to the end."""
    _text(text, name="text")
    tagged = untagged = None
    for block in _FENCE.finditer(text):
        language = block.group(1).lower()
        if language in _PYTHON_TAGS:
            tagged = block.group(2)
        elif not language:
            untagged = block.group(2)
    found = tagged if tagged is not None else untagged
    return found if found is not None else text


def _text(text: object, *, name: str = "text") -> str | None:
    if text is not None and not isinstance(text, str):
        raise TypeError(f"{name} must be the decoded completion (str), got "
                        f"{type(text).__name__}; decode token ids first")
    return text


def _answer_text(answer: object) -> str:
    if isinstance(answer, str):
        return answer
    if isinstance(answer, (int, float)) and not isinstance(answer, bool):
        return str(answer)
    inner = getattr(answer, "answer", None)
    if isinstance(inner, (str, int, float)) and not isinstance(inner, bool):
        return str(inner)
    raise TypeError(f"answer must be a str, a number, or an object with an .answer attribute "
                    f"(a Task), got {type(answer).__name__}")


def _as_number(text: str) -> float | None:
    text = text.strip()
    if _NUMBER_ALONE.fullmatch(text) is None:
        return None
    value = float(text.replace(",", ""))
    return None if math.isnan(value) else value


def _last_boxed(text: str) -> str | None:
    end = len(text)
    while (start := text.rfind(_BOXED, 0, end)) >= 0:
        inner = _balanced(text, start + len(_BOXED), end)
        if inner is not None:
            return inner.strip()
        # Unbalanced (cut off): try the one before. It can only close before this one starts,
        # since this one's braces never close, so each character is scanned once in all.
        end = start
    return None


def _balanced(text: str, start: int, end: int) -> str | None:
    """The text from `start` up to the brace that closes an already-open one (looked for
    before `end`), or None."""
    depth = 1
    for token in _BRACE_TOKENS.finditer(text, start, end):
        if token.group() == "{":
            depth += 1
        elif token.group() == "}":
            depth -= 1
            if depth == 0:
                return text[start:token.start()]
    return None


def _math_parse(math_verify, text: str, limit: int | None) -> list:
    parsed = math_verify.parse(text, parsing_timeout=limit)
    if not parsed and "$" not in text and len(text) <= 1000:
        parsed = math_verify.parse(f"${text}$", parsing_timeout=limit)
    return parsed


@functools.lru_cache(maxsize=256)
def _compile(pattern: str) -> re.Pattern[str]:
    try:
        return re.compile(pattern, re.DOTALL)
    except re.error as exc:
        raise ValueError(f"pattern {pattern!r} is not a valid regular expression: {exc}") from None
