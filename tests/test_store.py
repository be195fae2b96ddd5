"""Experience store: exactly-once groups under concurrency, back-pressure, readiness, versions."""
from __future__ import annotations

import asyncio
import random
from collections import Counter

import pytest
import torch

from flexmarl.orchestrator.advantage import grpo_advantages
from flexmarl.orchestrator.store import ExperienceStore, StoreClosed, Turn, UnknownSample


def make_turn(input_id: str, turn: int = 0, traj: str = "0", *, agent: str = "a",
              version: int = 0, reward: float | None = 1.0, prompt: list[int] | None = None
              ) -> Turn:
    return Turn(agent, input_id, turn, traj, version, prompt if prompt is not None else [1, 2],
                [3, 4], [-0.1, -0.2], reward)


async def settle(rounds: int = 5) -> None:
    """Let every ready task run until it blocks again."""
    for _ in range(rounds):
        await asyncio.sleep(0)


# ----------------------------------------------------------------------------- concurrency

async def test_concurrent_producers_and_consumers_take_every_group_exactly_once():
    rng = random.Random(0)
    # Capacity 96 cannot deadlock: at most ~5 inputs are open at once (work is handed out
    # input-major to 4 producers), holding <= 75 rows per agent, so a full table always has
    # >= 21 rows (>= 5 groups) ready, more than a consumer asks for. Yet producers do hit it.
    agents, num_inputs, num_trajs, capacity = ["a", "b"], 20, 4, 96
    # plan[(input, traj, agent)] = number of turns that agent takes in that trajectory.
    plan = {(i, t, ag): rng.randint(1, 3)
            for i in range(num_inputs) for t in range(num_trajs) for ag in agents}
    # Trajectory 3 calls agent b with n=2: two samples "3.0", "3.1" per turn, one shared prompt.
    def samples(t: int, ag: str) -> list[str]:
        return [f"{t}.0", f"{t}.1"] if (t, ag) == (3, "b") else [str(t)]

    expected = Counter()
    for (i, t, ag), n in plan.items():
        for k in range(n):
            expected[(ag, f"in{i}", k)] += len(samples(t, ag))

    store = ExperienceStore(agents, capacity_per_agent=capacity, num_shards=3)
    work = asyncio.Queue()
    for i in range(num_inputs):  # input-major: few inputs open at once, as an orchestrator does
        for t in range(num_trajs):
            work.put_nowait((i, t))
    trajs_left = {i: num_trajs for i in range(num_inputs)}
    peak = {ag: 0 for ag in agents}

    async def producer() -> None:
        while not work.empty():
            i, t = work.get_nowait()
            for k in range(max(plan[(i, t, ag)] for ag in agents)):
                for ag in agents:
                    if k >= plan[(i, t, ag)]:
                        continue
                    prompt = [i, t, k]
                    for traj in samples(t, ag):
                        row = Turn(ag, f"in{i}", k, traj, 0, prompt, [k], [-1.0])
                        assert await store.put(row)
                        peak[ag] = max(peak[ag], store.pending(ag))
                        if rng.random() < 0.5:
                            await asyncio.sleep(0)
                        store.set_reward(ag, row.sample_id, rng.random())
            trajs_left[i] -= 1
            if trajs_left[i] == 0:
                store.complete_input(f"in{i}")

    taken: list = []

    async def consumer(agent: str) -> None:
        try:
            while True:
                taken.extend(await store.take_groups(agent, rng.randint(1, 3)))
                for _ in range(rng.randint(0, 40)):  # slow consumers: producers hit capacity
                    await asyncio.sleep(0)
        except StoreClosed:
            pass

    consumers = [asyncio.create_task(consumer(ag)) for ag in agents for _ in range(3)]
    await asyncio.wait_for(asyncio.gather(*(producer() for _ in range(4))), timeout=5)
    for ag in agents:  # a remainder smaller than what the blocked consumers ask for
        taken.extend(await store.take_groups(ag, 10_000, flush=True))
        assert store.ready_groups(ag) == 0 and store.pending(ag) == 0
    store.close()
    await asyncio.gather(*consumers)

    assert max(peak.values()) == capacity  # back-pressure was hit, and never exceeded
    keys = [(g.agent, g.input_id, g.turn) for g in taken]
    assert len(keys) == len(set(keys)), "a group was returned twice"
    assert set(keys) == set(expected)
    for g in taken:
        assert {(r.agent, r.input_id, r.turn) for r in g.turns} == {(g.agent, g.input_id, g.turn)}
        assert len(g.turns) == expected[(g.agent, g.input_id, g.turn)]
        assert len({r.traj_id for r in g.turns}) == len(g.turns)
    for ag in agents:
        s = store.stats[ag]
        rows = sum(n for (a, _, _), n in expected.items() if a == ag)
        assert (s.stored, s.consumed_turns, s.duplicates) == (rows, rows, 0)
        assert s.consumed_groups == sum(1 for (a, _, _) in expected if a == ag)


# ----------------------------------------------------------------------------- back-pressure

async def test_put_blocks_at_capacity_until_groups_are_taken():
    store = ExperienceStore(["a"], capacity_per_agent=8)
    for inp in ("x", "y"):
        for t in range(4):
            assert await store.put(make_turn(inp, traj=str(t)))
    store.complete_input("x")
    extra = [asyncio.create_task(store.put(make_turn("z", traj=str(t)))) for t in range(5)]
    await settle()
    assert not any(p.done() for p in extra) and store.pending("a") == 8

    [group] = await store.take_groups("a", 1)
    assert group.input_id == "x"
    await settle()
    done = [p for p in extra if p.done()]
    assert len(done) == 4 and all(p.result() is True for p in done)
    assert store.pending("a") == 8  # 4 of y + 4 of z; the 5th z waits

    store.close()
    with pytest.raises(StoreClosed):
        await next(p for p in extra if p not in done)


# ----------------------------------------------------------------------------- idempotence

async def test_duplicate_and_already_consumed_sample_ids_are_refused():
    store = ExperienceStore(["a"])
    assert await store.put(make_turn("x", traj="0"))
    assert not await store.put(make_turn("x", traj="0", reward=5.0))  # a retry: another object
    assert (store.pending("a"), store.stats["a"].stored, store.stats["a"].duplicates) == (1, 1, 1)

    store.complete_input("x")
    [group] = await store.take_groups("a", 1)
    assert group.turns[0].reward == 1.0  # the first write wins
    assert not await store.put(make_turn("x", traj="0"))
    assert (store.pending("a"), store.stats["a"].stored, store.stats["a"].duplicates) == (0, 1, 2)
    with pytest.raises(ValueError, match="after complete_input"):
        await store.put(make_turn("x", traj="1"))  # a new sample of a closed input


async def test_unknown_agent_and_unknown_sample_errors():
    store = ExperienceStore(["a", "b"])
    with pytest.raises(ValueError, match=r"\['a', 'b'\]"):
        await store.put(make_turn("x", agent="c"))
    with pytest.raises(KeyError):
        store.set_reward("a", "x_0_0", 1.0)
    with pytest.raises(UnknownSample, match="x_0_0"):
        store.set_reward("a", "x_0_0", 1.0)


# ----------------------------------------------------------------------------- readiness

async def test_missing_reward_blocks_completion_until_given():
    store = ExperienceStore(["a", "b"])
    await store.put(make_turn("q", traj="0", reward=1.0))
    await store.put(make_turn("q", traj="1", reward=None))
    await store.put(make_turn("q", traj="0", agent="b", reward=None))
    assert store.ready_groups("a") == 0
    assert await store.take_groups("a", 1, flush=True) == []

    with pytest.raises(ValueError, match=r"a:q_0_1.*b:q_0_0"):
        store.complete_input("q")
    assert store.ready_groups("a") == 0 and store.ready_groups("b") == 0  # nothing half-done

    store.set_reward("a", "q_0_1", 0.0)
    store.complete_input("q", default_reward=-1.0)
    assert store.ready_groups("a") == 1 and store.ready_groups("b") == 1
    [ga] = await store.take_groups("a", 1)
    [gb] = await store.take_groups("b", 1)
    assert [r.reward for r in ga.turns] == [1.0, 0.0]  # the set reward is kept
    assert gb.turns[0].reward == -1.0
    store.complete_input("q")  # again: nothing to do


async def test_late_reward_after_completion_is_refused():
    store = ExperienceStore(["a"])
    await store.put(make_turn("q"))
    store.complete_input("q")
    with pytest.raises(ValueError, match="already completed"):
        store.set_reward("a", "q_0_0", 2.0)


# ----------------------------------------------------------------------------- versions, flush

async def test_version_filter_and_flush():
    store = ExperienceStore(["a"])
    for inp, versions in (("old", [1, 1]), ("new", [2, 2]), ("mixed", [1, 2])):
        for t, v in enumerate(versions):
            await store.put(make_turn(inp, traj=str(t), version=v))
        store.complete_input(inp)
    assert [store.ready_groups("a", version=v) for v in (None, 1, 2)] == [3, 1, 1]

    waiter = asyncio.create_task(store.take_groups("a", 2, version=2))
    await settle()
    assert not waiter.done()  # only one group is wholly version 2
    assert [g.input_id for g in await store.take_groups("a", 5, version=1, flush=True)] == ["old"]
    assert await store.take_groups("a", 5, version=3, flush=True) == []

    await store.put(make_turn("new2", version=2))
    store.complete_input("new2")
    groups = await asyncio.wait_for(waiter, timeout=1)
    assert [g.input_id for g in groups] == ["new", "new2"]  # oldest completed first
    assert all(g.versions == {2} for g in groups)
    [mixed] = await store.take_groups("a", 1, flush=True)
    assert mixed.input_id == "mixed" and mixed.versions == {1, 2}


# ----------------------------------------------------------------------------- advantages

async def test_advantages_match_grpo_per_group():
    store = ExperienceStore(["a", "b"])
    prompt = [9, 9, 9]
    rewards = {0: [1.0, 0.0, 3.0, 5.0], 1: [2.0, 4.0]}
    for k, rs in rewards.items():
        for t, r in enumerate(rs):
            await store.put(make_turn("q", k, str(t), reward=r, prompt=prompt))
    await store.put(make_turn("q", agent="b", reward=7.0))
    store.complete_input("q")

    groups = await store.take_groups("a", 2)
    assert [g.turn for g in groups] == [0, 1]
    for g in groups:
        got = torch.tensor([r.advantage for r in g.turns], dtype=torch.float64)
        want = grpo_advantages(torch.tensor(rewards[g.turn], dtype=torch.float64),
                               [0] * len(g.turns))
        assert torch.allclose(got, want)
        assert all(r.prompt_ids is prompt for r in g.turns)  # by reference, never copied
    [gb] = await store.take_groups("b", 1)
    assert gb.turns[0].advantage == 0.0  # a group of one carries no relative signal


async def test_group_rows_sorted_by_traj_id_numerically():
    store = ExperienceStore(["a"], num_shards=1)
    for traj in ["10", "2.1", "2", "0", "2.0"]:
        await store.put(make_turn("q", traj=traj))
    store.complete_input("q")
    [g] = await store.take_groups("a", 1)
    assert [r.traj_id for r in g.turns] == ["0", "2", "2.0", "2.1", "10"]


# ----------------------------------------------------------------------------- close

async def test_close_wakes_blocked_take_and_put():
    store = ExperienceStore(["a"], capacity_per_agent=1)
    await store.put(make_turn("x", traj="0"))
    blocked_put = asyncio.create_task(store.put(make_turn("x", traj="1")))
    blocked_take = asyncio.create_task(store.take_groups("a", 1))
    await settle()
    assert not blocked_put.done() and not blocked_take.done()

    store.close()
    for task in (blocked_put, blocked_take):
        with pytest.raises(StoreClosed):
            await asyncio.wait_for(task, timeout=1)
    with pytest.raises(StoreClosed):
        await store.put(make_turn("y"))
    with pytest.raises(StoreClosed):
        await store.take_groups("a", 1, flush=True)


async def test_urgent_rows_are_stored_past_the_capacity_and_others_wait():
    """put(urgent=...) stores the rows a trainer waits for whatever the capacity; other rows
    wait for space, and wake() makes them ask again when what is urgent changes."""
    store = ExperienceStore(["a"], capacity_per_agent=1)
    await store.put(make_turn("x", 0, "0"))
    await asyncio.wait_for(store.put(make_turn("x", 0, "1"), urgent=lambda: True), 1)
    assert store.pending("a") == 2
    now_urgent = False
    waiting = asyncio.ensure_future(store.put(make_turn("y", 0, "0"),
                                              urgent=lambda: now_urgent))
    await asyncio.sleep(0.05)
    assert not waiting.done()  # full, and not urgent
    now_urgent = True
    store.wake()
    assert await asyncio.wait_for(waiting, 1) is True and store.pending("a") == 3


async def test_complete_group_closes_one_turn_of_an_open_input():
    """A group closed early (complete_group): ready with its advantages, its rewards fixed,
    untouched by discard_trajectory and complete_input, which close the input's other turns."""
    store = ExperienceStore(["a"])
    for traj in range(3):
        for turn in range(2):
            await store.put(make_turn("in0", turn, str(traj), reward=None))
    for traj, r in enumerate((0.0, 1.0, 2.0)):
        store.set_reward("a", f"in0_0_{traj}", r)
    with pytest.raises(ValueError, match="no reward for"):
        store.complete_group("a", "in0", 1)
    store.complete_group("a", "in0", 0)
    with pytest.raises(ValueError, match="already completed"):
        store.set_reward("a", "in0_0_1", 9.0)
    assert store.discard_trajectory("in0", "2") == 1  # only its open turn-1 row
    [g] = await store.take_groups("a", 1, flush=True)
    assert (g.turn, [t.traj_id for t in g.turns]) == (0, ["0", "1", "2"])
    assert [t.advantage for t in g.turns] == pytest.approx([-1.2247, 0.0, 1.2247], abs=1e-3)
    store.complete_input("in0", default_reward=0.0)
    [rest] = await store.take_groups("a", 1, flush=True)
    assert (rest.turn, [t.traj_id for t in rest.turns]) == (1, ["0", "1"])
    store.complete_group("a", "in0", 1)  # a closed input: nothing happens
