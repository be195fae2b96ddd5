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


def _bench_learning():
    import importlib.util
    from pathlib import Path
    path = Path(__file__).resolve().parent.parent / "bench" / "learning.py"
    spec = importlib.util.spec_from_file_location("bench_learning", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_learning_bench_reports_curves_and_their_noise():
    """bench/learning.py: the reward curve per agent, the window means, one step's noise from
    step-to-step changes (a steady trend adds none) and the held-out change's standard error."""
    bench = _bench_learning()
    assert bench.step_noise([0.1 * i for i in range(10)]) == pytest.approx(0.0, abs=1e-12)
    # differences +-0.2: sample variance 4 * 0.04 / 3, halved
    assert bench.step_noise([0.0, 0.2, 0.0, 0.2, 0.0]) == pytest.approx((0.16 / 3 / 2) ** 0.5)
    assert bench.step_noise([0.5]) is None
    metrics = [{"team_reward": r, "step_s": 1.0, "agents": {"a": {"reward": r / 2}}}
               for r in (0.1, 0.2, 0.3, 0.4)]
    out = bench.summarize(metrics, 2)
    assert out["curve"] == {"team": [0.1, 0.2, 0.3, 0.4], "a": [0.05, 0.1, 0.15, 0.2]}
    assert out["first_reward"]["team"] == pytest.approx(0.15)
    assert out["last_reward"]["a"] == pytest.approx(0.175)
    assert out["noise"]["team"] == pytest.approx(0.0, abs=1e-12) and out["steps"] == 4
    assert bench.heldout_se(0.5, 0.5, 100) == pytest.approx((0.5 / 100) ** 0.5)
