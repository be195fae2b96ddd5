"""A turn's GRPO group closes as soon as its rewards are final (TaskTurns,
ExperienceStore.complete_group), and only then; a turn's own reward is final once given, and a
trajectory that fails keeps the turns it rewarded and loses the others, whatever the other
trajectories' timing (flexmarl.team.Context.reward). On a fake instance pool, no worker process;
the order of the trajectories' steps is driven by asyncio events (`Gates`), never by sleeps."""
from __future__ import annotations

import asyncio
from collections import defaultdict

import pytest

from flexmarl.tasks import addition_tasks
from tests.helpers.fake_orch import PROMPT, FakePool, make_orch, take_all


GATE_TIMEOUT_S = 30.0
"""Generous: every step here is immediate; a gate still shut after it means the code under
test took another path (say which, rather than hang until the suite's timeout)."""


class Gates:
    """Named asyncio events: a workflow opens one where it got to and waits on another until
    the test opens it, so the test sets the order in which the trajectories' steps run."""

    def __init__(self) -> None:
        self._events: dict[str, asyncio.Event] = defaultdict(asyncio.Event)

    def open(self, *names: str) -> None:
        for name in names:
            self._events[name].set()

    async def wait(self, *names: str) -> None:
        for name in names:
            try:
                await asyncio.wait_for(self._events[name].wait(), GATE_TIMEOUT_S)
            except TimeoutError:
                raise TimeoutError(f"gate {name!r} still shut after {GATE_TIMEOUT_S:g} s") \
                    from None


class HeldPool(FakePool):
    """The fake pool, but the reply to each request id in `held` waits for that gate."""

    def __init__(self, gates: Gates, held: set[str]) -> None:
        super().__init__()
        self.gates, self.held = gates, held

    async def generate(self, agent, msg, *, episode=None):
        if msg.request_id in self.held:
            await self.gates.wait(msg.request_id)
        return await super().generate(agent, msg, episode=episode)


def closes(orch) -> list[tuple[str, int]]:
    """The (input_id, turn) of each complete_group call the store gets from now on (early
    closes), in order."""
    seen, real = [], orch.store.complete_group

    def spy(agent, input_id, turn):
        seen.append((input_id, turn))
        real(agent, input_id, turn)

    orch.store.complete_group = spy
    return seen


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


async def test_a_turn_left_to_the_team_reward_waits_for_the_task_a_failed_trajectorys_does_not():
    """No early close where a reward is not final: a turn left to the team reward (task s0t1)
    closes with the task. A trajectory that fails before rewarding its turn (task s0t0,
    trajectory 0: it made the call, then raised) gives that turn up at once: its sample is
    dropped and the group closes from the others as soon as they have rewarded it, while they
    still run (it does not wait for a reward that will never come, nor for the task)."""
    gates = Gates()

    async def workflow(ctx, task):
        j, task_id = ctx.trajectory, ctx.input_id
        [first] = await ctx.generate("a", PROMPT)
        if task_id == "s0t0":
            if j == 0:
                gates.open("failing")
                raise RuntimeError("early boom")
            await gates.wait("failing")  # they reward after trajectory 0 failed
            ctx.reward(first, float(j))
        gates.open(f"{task_id}/{j}")
        await gates.wait("release")
        ctx.team_reward(0.0)

    orch = make_orch(workflow, tasks=addition_tasks(2, seed=3))
    closed = closes(orch)
    rollout = asyncio.create_task(orch.rollout(0, orch.next_tasks(2)))
    await gates.wait(*(f"s0t0/{j}" for j in (1, 2, 3)), *(f"s0t1/{j}" for j in range(4)))
    assert closed == [("s0t0", 0)] and not rollout.done()
    [early] = await orch.store.take_groups("a", 1)
    assert [t.traj_id for t in early.turns] == ["1", "2", "3"]
    assert [t.reward for t in early.turns] == [1.0, 2.0, 3.0]
    gates.open("release")
    stats = await rollout
    assert stats.failed_trajectories == 1 and closed == [("s0t0", 0)]
    [late] = await take_all(orch)
    assert late.input_id == "s0t1" and [t.reward for t in late.turns] == [0.0] * 4


ORDERS = {"before": (0, 1, 2), "between": (1, 0, 2), "after": (1, 2, 0)}
"""When the failing trajectory (0) ends among the task's three trajectories."""


@pytest.mark.parametrize("others", ["reward", "team"])
@pytest.mark.parametrize("order", ORDERS)
async def test_a_failed_trajectory_keeps_what_it_rewarded_whatever_the_others_timing(order,
                                                                                     others):
    """Trajectory 0 rewards its first turn, makes a second (left to the team reward), then
    fails; it ends before, between or after the two others, which give the first turn its
    own reward at their end (others="reward") or leave it to their team reward ("team"). In
    every case the same groups train: its first turn with the reward it gave, its second
    turn not at all (it never got a reward)."""
    gates = Gates()

    async def workflow(ctx, task):
        j = ctx.trajectory
        [first] = await ctx.generate("a", PROMPT)
        if j == 0:
            ctx.reward(first, 1.0)
        await ctx.generate("a", PROMPT)
        gates.open(f"made/{j}")
        await gates.wait(f"end/{j}")
        gates.open(f"ended/{j}")
        if j == 0:
            raise RuntimeError("boom after rewarding")
        if others == "reward":
            ctx.reward(first, j / 4)
        ctx.team_reward(0.5)

    orch = make_orch(workflow, trajectories=3)
    rollout = asyncio.create_task(orch.rollout(0, orch.next_tasks(1)))
    await gates.wait(*(f"made/{j}" for j in range(3)))
    for j in ORDERS[order]:
        gates.open(f"end/{j}")
        await gates.wait(f"ended/{j}")
    stats = await rollout
    assert stats.failed_trajectories == 1
    groups = {g.turn: g for g in await take_all(orch)}
    assert [t.traj_id for t in groups[0].turns] == ["0", "1", "2"]
    assert [t.reward for t in groups[0].turns] == (
        [1.0, 0.25, 0.5] if others == "reward" else [1.0, 0.5, 0.5])
    assert [t.traj_id for t in groups[1].turns] == ["1", "2"]
    assert [t.reward for t in groups[1].turns] == [0.5, 0.5]


@pytest.mark.parametrize("others_first", [False, True], ids=["again_first", "others_first"])
async def test_a_second_reward_fails_whatever_the_others_timing(others_first):
    """Trajectory 0 rewards its turn twice: before the others rewarded that turn (its group
    still open) or after (closed). Either way the second reward raises ValueError, failing
    trajectory 0, whose turn trains with the first reward."""
    gates = Gates()

    async def workflow(ctx, task):
        j = ctx.trajectory
        [first] = await ctx.generate("a", PROMPT)
        if j == 0:
            ctx.reward(first, 1.0)
            gates.open("rewarded/0")
            await gates.wait("again")
            try:
                ctx.reward(first, 2.0)
            finally:
                gates.open("ended/0")
        else:
            await gates.wait(f"reward/{j}")
            ctx.reward(first, 0.0)
            gates.open(f"rewarded/{j}")
        ctx.team_reward(0.0)

    orch = make_orch(workflow, trajectories=3)
    rollout = asyncio.create_task(orch.rollout(0, orch.next_tasks(1)))
    await gates.wait("rewarded/0")
    if others_first:
        gates.open("reward/1", "reward/2")
        await gates.wait("rewarded/1", "rewarded/2")
    gates.open("again")
    await gates.wait("ended/0")
    gates.open("reward/1", "reward/2")
    stats = await rollout
    assert stats.failed_trajectories == 1
    assert any(e.startswith("ValueError: ctx.reward: agent 'a'") and "already given" in e
               for e in stats.errors)
    [group] = await take_all(orch)
    assert [t.traj_id for t in group.turns] == ["0", "1", "2"]
    assert [t.reward for t in group.turns] == [1.0, 0.0, 0.0]


async def test_a_call_a_failed_workflow_left_running_stores_nothing():
    """Trajectory 0 starts a call, does not wait for it and fails; the reply comes after the
    failure and before the others reward their turn. It is not stored (nothing of it can be
    rewarded any more), and the others' group closes without it, early."""
    gates = Gates()
    strays = []

    async def workflow(ctx, task):
        j = ctx.trajectory
        if j == 0:
            strays.append(asyncio.ensure_future(ctx.generate("a", PROMPT)))
            gates.open("failing")
            raise RuntimeError("left a call running")
        [first] = await ctx.generate("a", PROMPT)
        await gates.wait("stray done")
        ctx.reward(first, float(j))
        gates.open(f"rewarded/{j}")
        await gates.wait("release")
        ctx.team_reward(0.0)

    orch = make_orch(workflow, trajectories=3)
    orch.pool = HeldPool(gates, {"s0t0/0/a/0"})
    closed = closes(orch)
    rollout = asyncio.create_task(orch.rollout(0, orch.next_tasks(1)))
    await gates.wait("failing")
    gates.open("s0t0/0/a/0")  # its reply, after the failure
    assert await strays[0] == []
    gates.open("stray done")
    await gates.wait("rewarded/1", "rewarded/2")
    assert closed == [("s0t0", 0)]
    gates.open("release")
    stats = await rollout
    assert stats.failed_trajectories == 1
    [group] = await take_all(orch)
    assert [t.traj_id for t in group.turns] == ["1", "2"]


async def test_labelled_turns_keep_a_retry_apart_from_the_next_move():
    """A game's moves as labelled turns (ctx.generate(turn=...), as flexmarl.envs.textarena
    labels them): trajectories 0 and 1 had their first move rejected and retried, 2 and 3 did
    not. The retries form a group of their own, and every trajectory's next move is grouped
    with the others' next moves. By call count, trajectory 0's retry (its second call) would
    have been compared with trajectory 2's second move."""
    async def workflow(ctx, task):
        j = ctx.trajectory
        [first] = await ctx.generate("a", PROMPT, turn="t0")
        ctx.reward(first, -1.0 if j < 2 else 0.0)
        if j < 2:
            [retry] = await ctx.generate("a", PROMPT, turn="t0.retry1")
            ctx.reward(retry, float(j))
        [move] = await ctx.generate("a", PROMPT, turn="t1")
        ctx.reward(move, float(j))

    orch = make_orch(workflow, tasks=addition_tasks(1, seed=3))
    stats = await orch.rollout(0, orch.next_tasks(1))
    assert stats.failed_trajectories == 0, stats.errors
    groups = {g.turn: [t.traj_id for t in g.turns] for g in await take_all(orch)}
    assert groups == {"t0": ["0", "1", "2", "3"], "t0.retry1": ["0", "1"],
                      "t1": ["0", "1", "2", "3"]}


@pytest.mark.parametrize("label, message", [("t0", "already called the agent with that turn"),
                                            ("a/b", "without '/'"), ("", "without '/'"),
                                            ("1", "not only digits")])
async def test_a_turn_label_used_twice_or_malformed_fails_the_trajectory_naming_why(label,
                                                                                    message):
    async def workflow(ctx, task):
        await ctx.generate("a", PROMPT, turn="t0")
        await ctx.generate("a", PROMPT, turn=label)
        ctx.team_reward(1.0)

    orch = make_orch(workflow, tasks=addition_tasks(1, seed=3), trajectories=2)
    with pytest.raises(Exception, match=message):
        await orch.rollout(0, orch.next_tasks(1))
