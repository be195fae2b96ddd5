"""Multi-turn credit: ctx.reward's weight (a move's share of its game) and pipeline.credit
("turn": per agent and call number, as AT-GRPO; "trajectory": each trajectory's mean reward),
in the store and through a workflow on the orchestrator (no worker process)."""
from __future__ import annotations

import pytest

from flexmarl.config.pipeline import PipelineConfig
from flexmarl.orchestrator.store import ExperienceStore, Turn
from tests.helpers.fake_orch import PROMPT, make_orch, take_all


def row(input_id: str, turn: int, traj: str, reward: float, weight: float = 1.0) -> Turn:
    t = Turn("a", input_id, turn, traj, 0, [1], [2], [-0.1], reward)
    t.weight = weight
    return t


async def fill(store: ExperienceStore, rows: list[Turn]) -> None:
    for r in rows:
        await store.put(r)
    store.complete_input("i")


def advantages(groups) -> dict[tuple[int, str], float]:
    return {(t.turn, t.traj_id): t.advantage for g in groups for t in g.turns}


async def test_turn_credit_groups_by_call_number_and_weights_scale_after_normalising():
    # Game 0: two moves (rewards 1, 1); game 1: one move (reward -1), weights 1/k.
    store = ExperienceStore(["a"])
    await fill(store, [row("i", 0, "0", 1.0, 0.5), row("i", 1, "0", 1.0, 0.5),
                       row("i", 0, "1", -1.0, 1.0)])
    got = advantages(await store.take_groups("a", 2))
    # Turn 0: rewards [1, -1] -> [+1, -1] (population std), then times each row's weight;
    # turn 1 is a group of one: no relative signal.
    assert got == {(0, "0"): pytest.approx(0.5), (0, "1"): pytest.approx(-1.0), (1, "0"): 0.0}


async def test_trajectory_credit_compares_whole_trajectories_by_their_mean_reward():
    store = ExperienceStore(["a"], credit="trajectory")
    await fill(store, [row("i", 0, "0", 1.0, 0.5), row("i", 1, "0", 0.0, 0.5),
                       row("i", 0, "1", -1.0, 1.0), row("i", 0, "2", 0.5, 1.0)])
    got = advantages(await store.take_groups("a", 2))
    # Returns: 0.5, -1, 0.5 -> mean 0, std sqrt(0.5): +0.707, -1.414, +0.707 (before weights).
    z = 0.5 / (0.5 ** 0.5)
    near = lambda v: pytest.approx(v, rel=1e-5)  # noqa: E731 (GRPO's eps 1e-6 in the divisor)
    assert got == {(0, "0"): near(z * 0.5), (1, "0"): near(z * 0.5), (0, "1"): near(-2 * z),
                   (0, "2"): near(z)}


async def test_trajectory_credit_never_closes_a_group_early():
    store = ExperienceStore(["a"], credit="trajectory")
    for traj in ("0", "1"):
        await store.put(row("i", 0, traj, float(traj == "0")))
    store.complete_group("a", "i", 0)  # a turn's rewards are final, but the trajectory is not
    assert store.ready_groups("a") == 0
    store.complete_input("i")
    assert store.ready_groups("a") == 1


def test_a_bad_weight_or_credit_is_refused():
    with pytest.raises(ValueError, match="credit must be one of"):
        ExperienceStore(["a"], credit="game")
    from flexmarl.checks import ConfigError
    with pytest.raises(ConfigError, match="pipeline.credit"):
        PipelineConfig(credit="episode")


async def test_a_negative_or_non_finite_weight_fails_the_trajectory_not_the_run():
    """Trajectory 0 gives its turn a negative weight, 1 a NaN one; 2 and 3 give good weights.
    The two bad ones fail (each error names the weight), the step goes on (2 of 4 failed is
    not more than MAX_FAILED_FRACTION) and the task's group trains from 2 and 3 alone."""
    weights = {0: -1.0, 1: float("nan"), 2: 0.5, 3: 1.0}

    async def workflow(ctx, task):
        [a] = await ctx.generate("a", PROMPT)
        ctx.reward(a, float(ctx.trajectory), weight=weights[ctx.trajectory])

    orch = make_orch(workflow, trajectories=4)
    [task] = orch.next_tasks(1)
    stats = await orch.rollout(0, [task])
    assert stats.failed_trajectories == 2 and stats.tasks == 1
    where = "agent 'a', sample s0t0_0_{j} (task " + task.task_id + ", trajectory {j})"
    assert sorted(stats.errors) == [
        f"ValueError: ctx.reward's weight: {where.format(j=1)}: a reward must be a finite "
        f"number, got nan (nan) (task {task.task_id}, trajectory 1)",
        f"ValueError: ctx.reward: {where.format(j=0)}: the weight must be >= 0, got -1.0 "
        f"(task {task.task_id}, trajectory 0)"]
    [group] = await take_all(orch)
    assert [(t.traj_id, t.reward, t.weight) for t in group.turns] == [("2", 2.0, 0.5),
                                                                      ("3", 3.0, 1.0)]
    assert [t.advantage for t in group.turns] == pytest.approx([-0.5, 1.0], rel=1e-5)


@pytest.mark.parametrize("credit", ["turn", "trajectory"])
async def test_a_workflows_weights_reach_the_trained_advantages(credit):
    """A two-move game and a one-move game per task, as a game team rewards them: the same
    outcome on every move, weighted 1/k (flexmarl.envs.textarena.credit)."""
    async def workflow(ctx, task):
        moves = 2 if ctx.trajectory % 2 == 0 else 1
        made = [(await ctx.generate("a", PROMPT))[0] for _ in range(moves)]
        outcome = 1.0 if ctx.trajectory % 2 == 0 else -1.0
        for m in made:
            ctx.reward(m, outcome, weight=1 / moves)

    orch = make_orch(workflow, trajectories=4, credit=credit)
    await orch.rollout(0, orch.next_tasks(1))
    rows = {(t.turn, t.traj_id): t for g in await take_all(orch) for t in g.turns}
    assert {k: t.weight for k, t in rows.items()} == {
        (0, "0"): 0.5, (1, "0"): 0.5, (0, "1"): 1.0, (0, "2"): 0.5, (1, "2"): 0.5,
        (0, "3"): 1.0}
    # Turn 0 and the trajectories alike: long games +1 (x 1/2), short ones -1 (x 1).
    assert rows[(0, "0")].advantage == pytest.approx(0.5)
    assert rows[(0, "1")].advantage == pytest.approx(-1.0)
    second = rows[(1, "0")].advantage
    assert second == (0.0 if credit == "turn" else pytest.approx(0.5))  # turn 1: all equal
