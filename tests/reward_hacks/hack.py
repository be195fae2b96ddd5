"""A hack: its name, its class and its program per test form."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Hack:
    name: str
    klass: str
    programs: dict[str, str]
    """Test form ("assert", "call", "io") -> the program that attacks it."""


def forms(*, both: str | None = None, assert_: str | None = None, call: str | None = None,
          io: str | None = None) -> dict[str, str]:
    """The programs by form; `both` is one program for the assert and the call forms (they
    attack the same `add` function, judged in two ways)."""
    programs = {"assert": assert_ or both, "call": call or both, "io": io}
    return {form: program for form, program in programs.items() if program is not None}
