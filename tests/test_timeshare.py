"""The time-share arbiter (flexmarl.placement.timeshare): pure asyncio, no processes.

One group of devices alternates between its engines (ROLLOUT) and one agent's trainer at a time;
these tests drive it with fake uses and a recording switch and check who runs when."""
from __future__ import annotations

import asyncio

import pytest

from flexmarl.config.sections import parse_placement
from flexmarl.placement.timeshare import (
    ROLLOUT,
    TimeShare,
    TimeShares,
    run_switch,
    time_shared_groups)


def _share(agents=("a",), fail: set | None = None) -> tuple[TimeShare, list]:
    log: list = []

    async def switch(old, new):
        log.append(("switch", old, new))
        await asyncio.sleep(0.01)
        if fail and new in fail:
            fail.discard(new)
            raise RuntimeError("engine would not sleep")

    return TimeShare("g", tuple(agents), switch), log


async def _hold(share, mode, log, name, seconds=0.02):
    async with share.use(mode):
        log.append(("start", name))
        await asyncio.sleep(seconds)
        log.append(("end", name))


def test_a_trainer_request_waits_for_every_rollout_call_then_the_engines_sleep():
    async def main():
        share, log = _share()
        calls = [asyncio.create_task(_hold(share, ROLLOUT, log, f"r{i}")) for i in range(3)]
        await asyncio.sleep(0)
        train = asyncio.create_task(_hold(share, ("train", "a"), log, "t"))
        await asyncio.sleep(0.005)
        late = asyncio.create_task(_hold(share, ROLLOUT, log, "late"))  # rollout goes first
        await asyncio.gather(*calls, train, late)
        return log
    log = asyncio.run(main())
    order = [e for e in log if e[0] != "end"]
    # every rollout call (the late one too) started before the switch to training
    assert order.index(("switch", ROLLOUT, ("train", "a"))) > order.index(("start", "late"))
    assert order[-1] == ("start", "t")
    assert [e for e in log if e[0] == "switch"] == [("switch", ROLLOUT, ("train", "a"))]


def test_a_rollout_call_during_training_waits_for_that_request_then_the_engines_wake():
    async def main():
        share, log = _share()
        t1 = asyncio.create_task(_hold(share, ("train", "a"), log, "t1", 0.05))
        await asyncio.sleep(0.02)  # t1 runs (after the switch)
        r = asyncio.create_task(_hold(share, ROLLOUT, log, "r"))
        await asyncio.sleep(0)
        t2 = asyncio.create_task(_hold(share, ("train", "a"), log, "t2"))  # behind the rollout
        await asyncio.gather(t1, r, t2)
        return share, log
    share, log = asyncio.run(main())
    assert log.index(("end", "t1")) < log.index(("switch", ("train", "a"), ROLLOUT))
    assert log.index(("end", "r")) < log.index(("start", "t2"))
    assert [e[1:] for e in log if e[0] == "switch"] == [
        (ROLLOUT, ("train", "a")), (("train", "a"), ROLLOUT), (ROLLOUT, ("train", "a"))]
    assert len(share.switches) == 3 and share.seconds > 0


def test_trainers_of_a_group_take_turns_first_come_first_served_and_a_switch_admits_all():
    async def main():
        share, log = _share(("a", "b"))
        tasks = [asyncio.create_task(_hold(share, ("train", x), log, f"{x}{i}"))
                 for i, x in enumerate("abab")]
        await asyncio.gather(*tasks)
        return log
    log = asyncio.run(main())
    switches = [e[1:] for e in log if e[0] == "switch"]
    assert switches == [(ROLLOUT, ("train", "a")), (("train", "a"), ("train", "b"))]
    # both of a's requests ran in a's mode, then both of b's
    starts = [e[1] for e in log if e[0] == "start"]
    assert starts[:2] == ["a0", "a2"] and set(starts[2:]) == {"b1", "b3"}


def test_a_failed_switch_fails_its_waiters_and_the_next_use_switches_again():
    async def main():
        share, log = _share(fail={("train", "a")})
        with pytest.raises(RuntimeError, match="would not sleep"):
            await _hold(share, ("train", "a"), log, "t")
        assert share.mode is None
        await _hold(share, ("train", "a"), log, "t")  # from scratch: switches again
        await _hold(share, ROLLOUT, log, "r")
        return log
    log = asyncio.run(main())
    assert [e[1:] for e in log if e[0] == "switch"] == [
        (ROLLOUT, ("train", "a")), (None, ("train", "a")), (("train", "a"), ROLLOUT)]


def test_a_cancelled_waiter_leaves_the_queue_and_unknown_modes_are_refused():
    async def main():
        share, log = _share()
        r = asyncio.create_task(_hold(share, ROLLOUT, log, "r", 0.05))
        await asyncio.sleep(0)
        t = asyncio.create_task(_hold(share, ("train", "a"), log, "t"))
        await asyncio.sleep(0.01)
        t.cancel()
        await r
        await asyncio.sleep(0.02)
        assert not share._waiting and share.mode == ROLLOUT and not log[2:]
        with pytest.raises(ValueError, match="has no mode"):
            await share.acquire(("train", "zz"))
    asyncio.run(main())


def test_time_shares_route_agents_and_leave_the_others_alone():
    async def main():
        share, log = _share(("a",))
        shares = TimeShares([share])
        async with shares.train("other"), shares.rollout("other"):
            pass  # disaggregated: no waiting, no switch
        async with shares.train("a"):
            pass
        return shares, log
    shares, log = asyncio.run(main())
    assert [e[1:] for e in log] == [(ROLLOUT, ("train", "a"))]
    assert shares.status()["g"]["mode"] == "train a" and shares.of("other") is None


def test_the_product_switch_sleeps_wakes_and_parks_in_order():
    calls = []

    async def sleep():
        calls.append("sleep")

    async def wake():
        calls.append("wake")

    async def park(agent):
        calls.append(f"park {agent}")

    async def main():
        for old, new in [(ROLLOUT, ("train", "a")), (("train", "a"), ("train", "b")),
                         (("train", "b"), ROLLOUT), (None, ROLLOUT)]:
            await run_switch(old, new, sleep=sleep, wake=wake, park=park)
    asyncio.run(main())
    assert calls == ["sleep", "park a", "park b", "wake"]


def test_placement_strings():
    assert parse_placement("disaggregated") == "disaggregated"
    assert parse_placement(" time_shared ") == "time_shared"
    assert parse_placement("a=time_shared,b=disaggregated") == [("a",)]
    assert parse_placement("a+b=time_shared, c=time_shared") == [("a", "b"), ("c",)]
    for bad, match in [("shared", "cannot read"), ("a=fast", "cannot read"),
                       ("a=time_shared,a=disaggregated", "twice"),
                       ("a+b=disaggregated", "not time shared"), ("", "empty")]:
        with pytest.raises(ValueError, match=match):
            parse_placement(bad)
    assert time_shared_groups("time_shared", ["a", "b"], ["a", "b", "judge"]) == [("a",), ("b",)]
    with pytest.raises(ValueError, match="the team has"):
        time_shared_groups("x=time_shared", ["a"], ["a"])
    with pytest.raises(ValueError, match="does not train"):
        time_shared_groups("judge=time_shared", ["a"], ["a", "judge"])
