"""The trainer lane (flexmarl.orchestrator.lane): one request at a time, urgent agents first,
FIFO otherwise, and nothing lost or stuck when a waiter is cancelled or a request fails."""
from __future__ import annotations

import asyncio

import pytest

from flexmarl.orchestrator.agents import StepGate
from flexmarl.orchestrator.lane import TrainerLane


async def test_one_at_a_time_in_arrival_order():
    lane = TrainerLane(lambda agent: False)
    running, order = [], []

    async def request(agent: str, i: int) -> None:
        async with lane.turn(agent):
            running.append(i)
            assert len(running) == 1  # never two at once
            order.append(i)
            await asyncio.sleep(0.01)
            running.remove(i)

    await asyncio.gather(*(request("a" if i % 2 else "b", i) for i in range(6)))
    assert order == list(range(6))
    assert lane.waits == 5


async def test_an_urgent_agent_goes_before_older_requests():
    urgent = set()
    lane = TrainerLane(lambda agent: agent in urgent)
    order = []

    async def request(agent: str) -> None:
        async with lane.turn(agent):
            order.append(agent)
            await asyncio.sleep(0.01)

    first = asyncio.create_task(request("solver"))
    await asyncio.sleep(0)  # the solver holds the lane
    queued = [asyncio.create_task(request(a)) for a in ("solver", "solver", "checker")]
    await asyncio.sleep(0)
    urgent.add("checker")  # its gate now holds calls
    await asyncio.gather(first, *queued)
    assert order == ["solver", "checker", "solver", "solver"]


async def test_a_failing_request_and_a_cancelled_waiter_free_the_lane():
    lane = TrainerLane(lambda agent: False)
    hold = asyncio.Event()

    async def holder() -> None:
        async with lane.turn("a"):
            await hold.wait()
            raise RuntimeError("trainer died")

    async def waiter() -> None:
        async with lane.turn("b"):
            pass

    held = asyncio.create_task(holder())
    await asyncio.sleep(0)
    cancelled = asyncio.create_task(waiter())
    later = asyncio.create_task(waiter())
    await asyncio.sleep(0)
    cancelled.cancel()
    hold.set()
    with pytest.raises(RuntimeError):
        await held
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    await asyncio.wait_for(later, 5)  # generous: it runs at once once the lane is free
    async with lane.turn("c"):  # and the lane is free afterwards
        pass


async def test_a_waiter_cancelled_after_it_was_handed_the_lane_passes_it_on():
    lane = TrainerLane(lambda agent: False)
    done = []

    async def request(agent: str) -> None:
        async with lane.turn(agent):
            done.append(agent)

    async with lane.turn("a"):
        b = asyncio.create_task(request("b"))
        c = asyncio.create_task(request("c"))
        await asyncio.sleep(0)
    b.cancel()  # "a" handed the lane to b as it left; b is cancelled before it runs
    await asyncio.gather(b, c, return_exceptions=True)
    assert done == ["c"]
    async with lane.turn("d"):
        pass


async def test_step_gate_counts_its_waiting_calls():
    gate = StepGate(0)
    await gate.wait(0)
    assert gate.waiting == 0
    waiters = [asyncio.create_task(gate.wait(1)) for _ in range(3)]
    await asyncio.sleep(0)
    assert gate.waiting == 3
    waiters[0].cancel()
    await asyncio.sleep(0)
    assert gate.waiting == 2
    gate.open(1)
    await asyncio.gather(*waiters[1:])
    assert gate.waiting == 0
