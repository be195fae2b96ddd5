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


async def rewards(programs: list[tuple[str, str]]) -> dict[tuple[str, str], float]:
    """(name, form) -> reward, for (name, form) pairs of the corpus."""
    source = {(h.name, form): program for h in HACKS for form, program in h.programs.items()}
    source.update({("honest", form): program for form, program in HONEST.items()})
    scores = await asyncio.gather(*(code_reward(source[key], TESTS[key[1]], **FAST)
                                    for key in programs))
    return dict(zip(programs, scores))


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
