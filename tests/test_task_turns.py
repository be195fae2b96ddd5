"""A turn's GRPO group closes as soon as its rewards are final (TaskTurns,
ExperienceStore.complete_group), and only then: on a fake instance pool, no worker process."""
from __future__ import annotations

import asyncio

import pytest

from flexmarl.tasks import addition_tasks
from tests.helpers.fake_orch import PROMPT, make_orch, take_all


async def test_a_turns_group_closes_once_every_trajectory_rewarded_it():
    """The first turn's group is ready (trainable) while the second turn still waits, once all
    4 trajectories gave the first turn its own reward; its reward is then final (a second
    ctx.reward for it fails the trajectory that gives it, naming why). A trajectory that fails
    after that keeps its first turn (its reward was final) and loses its second; the second
    turn, left to the team reward, closes with the task as before."""
    release = asyncio.Event()
    firsts = {}

    async def workflow(ctx, task):
        [first] = await ctx.generate("a", PROMPT)
        ctx.reward(first, float(ctx.trajectory % 2))
        firsts[ctx.trajectory] = (ctx, first)
        await release.wait()
        await ctx.generate("a", PROMPT)  # a second turn, no own reward
        if ctx.trajectory == 3:
            raise RuntimeError("late boom")
        if ctx.trajectory == 2:
            ctx.reward(first, 5.0)  # too late: the group closed
        ctx.team_reward(0.5)

    orch = make_orch(workflow, tasks=addition_tasks(1, seed=3))
    rollout = asyncio.create_task(orch.rollout(0, orch.next_tasks(1)))
    [early] = await asyncio.wait_for(orch.store.take_groups("a", 1), timeout=30)
    assert not rollout.done() and early.turn == 0
    assert [t.reward for t in early.turns] == [0.0, 1.0, 0.0, 1.0]
    assert [t.advantage for t in early.turns] == pytest.approx([-1, 1, -1, 1], abs=1e-5)
    release.set()
    stats = await rollout
    assert stats.failed_trajectories == 2 and stats.tasks == 1
    assert any("ValueError" in e and "already given and is final" in e for e in stats.errors)
    [late] = await take_all(orch)
    assert late.turn == 1 and [t.traj_id for t in late.turns] == ["0", "1"]
    assert [t.reward for t in late.turns] == [0.5, 0.5]


async def test_a_turn_left_to_the_team_reward_or_a_trajectory_failing_first_waits_for_the_task():
    """No early close where a reward is not final: a turn without its own reward, or a task
    one of whose trajectories failed before rewarding (its groups form from the others)."""
    async def workflow(ctx, task):
        [first] = await ctx.generate("a", PROMPT)
        if ctx.input_id == "s0t0" and ctx.trajectory == 0:
            raise RuntimeError("early boom")
        if ctx.input_id == "s0t0":
            ctx.reward(first, 1.0)
        ctx.team_reward(0.0)

    orch = make_orch(workflow, tasks=addition_tasks(2, seed=3))
    order = []
    real = orch.store.complete_group

    def spy(agent, input_id, turn):
        order.append(input_id)
        real(agent, input_id, turn)

    orch.store.complete_group = spy
    await orch.rollout(0, orch.next_tasks(2))
    assert order == []  # neither closed early
    groups = {g.input_id: g for g in await take_all(orch)}
    assert [t.traj_id for t in groups["s0t0"].turns] == ["1", "2", "3"]
    assert [t.reward for t in groups["s0t1"].turns] == [0.0] * 4
