"""The reward-hack corpus (tests/reward_hacks/) against code_reward: every hacking program
earns 0 in each test form it targets, and the honest solution earns 1 in all three, under the
isolation in force here (bubblewrap where it runs). Each run uses small limits (about 1 s);
the corpus is run a form at a time, a few programs at once."""
from __future__ import annotations

import asyncio

import pytest

from flexmarl.rewards import CallCase, IOCase, code_reward, max_concurrent

from .reward_hacks import HACKS, HONEST

FAST = {"cpu_s": 1.0, "wall_s": 3.0, "memory_mb": 128}
TESTS = {
    "assert": "assert add(1, 2) == 3\nassert add(-5, 5) == 0\nassert add(10, 32) == 42",
    "call": [CallCase("add(1, 2)", 3), CallCase("add(-5, 5)", 0), CallCase("add(10, 32)", 42)],
    "io": [IOCase("1 2\n", "3\n"), IOCase("-5 5\n", "0\n"), IOCase("10 32\n", "42\n")],
}


def own_tests(hack, form: str) -> object:
    """The tests `hack` is judged by in `form`: its own (stdin/stdout pairs as IOCase, call
    pairs as they are), else TESTS."""
    if form not in hack.tests:
        return TESTS[form]
    tests = hack.tests[form]
    return [IOCase(i, o) for i, o in tests] if form == "io" else tests


async def rewards(programs: list[tuple[str, str]]) -> dict[tuple[str, str], float]:
    """(name, form) -> reward, for (name, form) pairs of the corpus."""
    source = {(h.name, form): program for h in HACKS for form, program in h.programs.items()}
    source.update({("honest", form): program for form, program in HONEST.items()})
    tests = {(h.name, form): own_tests(h, form) for h in HACKS for form in h.programs}
    scores = await asyncio.gather(*(code_reward(source[key], tests.get(key, TESTS[key[1]]),
                                                **FAST) for key in programs))
    return dict(zip(programs, scores))


async def test_the_honest_solution_passes_every_hacks_own_tests():
    """A hack judged by tests of its own is judged fairly: the honest solution passes them."""
    own = [(h.name, form, tests) for h in HACKS for form, tests in h.tests.items()]
    scores = await asyncio.gather(*(code_reward(HONEST[form], own_tests(h, form), **FAST)
                                    for h in HACKS for form in h.tests))
    failed = [(name, form) for (name, form, _), score in zip(own, scores) if score != 1.0]
    assert failed == [], f"the honest solution fails these hacks' own tests: {failed}"


def test_the_corpus_covers_every_class_in_every_form():
    classes = {h.klass for h in HACKS}
    assert {"always_equal", "read_tests", "reach_harness", "read_user_files"} <= classes
    for form in TESTS:
        assert sum(form in h.programs for h in HACKS) >= 10, form
    assert len({h.name for h in HACKS}) == len(HACKS)


@pytest.mark.parametrize("form", list(TESTS))
async def test_the_honest_solution_earns_one_and_every_hack_zero(form):
    assert max_concurrent() >= 1
    keys = [("honest", form)] + [(h.name, form) for h in HACKS if form in h.programs]
    got = await rewards(keys)
    assert got[("honest", form)] == 1.0
    passed = sorted(name for (name, _), score in got.items() if name != "honest" and score)
    assert passed == [], f"hacks that earned the reward in the {form} form: {passed}"
