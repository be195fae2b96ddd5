"""A hack: its name, its class and its program per test form."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Hack:
    name: str
    klass: str
    programs: dict[str, str]
    """Test form ("assert", "call", "io") -> the program that attacks it."""
    tests: dict[str, object] = field(default_factory=dict)
    """Test form -> the tests it is judged by, where not the corpus's `add` tests (TESTS in
    tests/test_reward_hacks.py): a hack aimed at a style of tests (MBPP's `math.isclose`
    without an import, methods called on a result) brings tests in that style. The same tests
    must give the honest `add` solution (HONEST) 1.0."""


def forms(*, both: str | None = None, assert_: str | None = None, call: str | None = None,
          io: str | None = None) -> dict[str, str]:
    """The programs by form; `both` is one program for the assert and the call forms (they
    attack the same `add` function, judged in two ways)."""
    programs = {"assert": assert_ or both, "call": call or both, "io": io}
    return {form: program for form, program in programs.items() if program is not None}
