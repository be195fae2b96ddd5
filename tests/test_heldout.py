"""Held-out accuracy (flexmarl.launch.heldout): what bench/learning.py reports before and after."""
from __future__ import annotations

import pytest

from flexmarl import AgentSpec, SamplingParams, Team
from flexmarl.launch.heldout import heldout_accuracy
from flexmarl.tasks import addition_tasks, exact_match


async def _noop(ctx, task) -> None:
    return None


def team(model_dir: str, **kwargs) -> Team:
    return Team(name="t", agents=[AgentSpec(name="a", model=model_dir,
                                            sampling=SamplingParams(max_tokens=6))],
                workflow=_noop, tasks=addition_tasks(4, seed=0), **kwargs)


async def test_heldout_accuracy_is_a_fraction_and_repeatable(tiny_model_dir):
    """Greedy and sampled accuracy in [0, 1]; the same weights give the same numbers (the
    sampled answers use fixed seeds), and the score function decides what counts."""
    tasks = addition_tasks(12, seed=5)
    scored = team(tiny_model_dir, heldout=tasks, score=lambda a, text, t: exact_match(text, t))
    spec = scored.agents[0]
    first = await heldout_accuracy(scored, spec, tiny_model_dir)
    assert set(first) == {"greedy", "sampled"} and all(0 <= v <= 1 for v in first.values())
    assert await heldout_accuracy(scored, spec, tiny_model_dir) == first
    always = team(tiny_model_dir, heldout=tasks, score=lambda a, text, t: 1.0)
    assert await heldout_accuracy(always, spec, tiny_model_dir, limit=3) == {
        "greedy": 1.0, "sampled": 1.0}


async def test_a_team_without_heldout_tasks_says_so(tiny_model_dir):
    plain = team(tiny_model_dir)
    with pytest.raises(ValueError, match="no held-out tasks"):
        await heldout_accuracy(plain, plain.agents[0], tiny_model_dir)
