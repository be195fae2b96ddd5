"""The trainer slots' pure parts: the slot allocator's invariants (who gets which slot, whom
a grant evicts, first come first served) and the simulator's trainer slot pricing each step of
the swap path. No process starts here; the pool over real and fake slots is
tests/test_trainer_pool.py.

Tolerance: the simulated slot's waits equal the cost model's to pytest.approx's default
(relative 1e-6): the virtual clock adds no time of its own.
"""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flexmarl.protocol import DropParked, Parked, SwapIn, SwapOut
from flexmarl.training.slots import Estimates, SlotAllocator, SlotTimes
from runtime.transport import connect


def test_allocator_prefers_resident_then_empty_then_lru():
    alloc = SlotAllocator({"s0": 1, "s1": 1}, {"a": 1, "b": 1, "c": 1})
    alloc.request("a")
    alloc.request("b")
    assert [(g.agent, g.slot, g.evict) for g in alloc.grant()] == [("a", "s0", None),
                                                                    ("b", "s1", None)]
    alloc.request("c")
    assert alloc.grant() == []  # both slots busy: c waits
    alloc.release("b")
    [g] = alloc.grant()
    assert (g.agent, g.slot, g.evict) == ("c", "s1", "b")  # b's idle state goes out
    alloc.release("a")
    alloc.request("a")
    [g] = alloc.grant()
    assert (g.agent, g.slot, g.evict) == ("a", "s0", None)  # its state never left s0


def test_allocator_sizes_and_pinning():
    with pytest.raises(ValueError, match="needs a slot of 2 ranks"):
        SlotAllocator({"s0": 1}, {"big": 2})
    alloc = SlotAllocator({"s0": 1, "s1": 2}, {"big": 2, "small": 1})
    alloc.request("small")
    alloc.request("big")
    grants = {g.agent: g.slot for g in alloc.grant()}
    assert grants == {"small": "s0", "big": "s1"}  # the smallest slot that fits
    static = SlotAllocator({"s0": 1, "s1": 1}, {"a": 1, "b": 1}, pinned={"a": "s0", "b": "s1"})
    static.request("b")
    assert [g.slot for g in static.grant()] == ["s1"]
    with pytest.raises(ValueError, match="already waits for or holds"):
        static.request("b")


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 5), min_size=1, max_size=60), st.integers(1, 3))
def test_allocator_never_double_binds_and_never_starves(choices, num_slots):
    """Agents request and release in random order: a slot never holds two agents, an agent
    never holds two slots, and a waiting agent is granted before any agent that asked later."""
    agents = [f"a{i}" for i in range(4)]
    alloc = SlotAllocator({f"s{i}": 1 for i in range(num_slots)}, dict.fromkeys(agents, 1))
    holding: dict[str, str] = {}
    asked: dict[str, int] = {}
    clock = 0
    for choice in choices:
        clock += 1
        agent = agents[choice % len(agents)]
        if agent in holding:
            alloc.release(agent)
            del holding[agent]
        elif agent not in asked:
            alloc.request(agent)
            asked[agent] = clock
        for g in alloc.grant():
            # first come, first served: nobody who asked earlier is still waiting
            assert all(asked[w] > asked[g.agent] for w in alloc.waiting())
            assert g.slot not in holding.values() and g.agent not in holding
            holding[g.agent] = g.slot
            del asked[g.agent]
        assert len(set(holding.values())) == len(holding) <= num_slots
        assert set(alloc.bound.items()) == {(s, a) for a, s in holding.items()}
    # Everyone still waiting is served once the holders are done.
    for agent in list(holding):
        alloc.release(agent)
        del holding[agent]
        for g in alloc.grant():
            holding[g.agent] = g.slot
            del asked[g.agent]
    while holding:
        agent = next(iter(holding))
        alloc.release(agent)
        del holding[agent]
        for g in alloc.grant():
            holding[g.agent] = g.slot
            del asked[g.agent]
    assert not asked and not alloc.waiting()


def test_the_simulated_slot_prices_the_swap_path_step_by_step():
    """flexmarl.sim's trainer slot answers the same swap protocol and waits exactly the cost
    model's time for each step: offload, onload in place, and a move to a slot of another size
    (rank to rank over the network, the side with fewer nodes limiting, then onload), the
    agent's version carried along."""
    from flexmarl.clock import now
    from flexmarl.sim.clock import run
    from flexmarl.sim.costs import load_costs
    from flexmarl.sim.engines import DeviceGroup, SimTrainer

    costs = load_costs()
    model = costs.models["32b"]
    state = costs.state_bytes(model)

    async def main() -> list[float]:
        slots = [SimTrainer(f"sim-{n}", costs, {"x": model}, DeviceGroup(f"g{n}", n, costs), n,
                            f"local://sim-slot-{n}") for n in (16, 32)]
        async with slots[0].serving(), slots[1].serving():
            small, big = connect(slots[0].address), connect(slots[1].address)
            seconds = []
            for conn, msg in ((small, SwapIn("x", "", {}, meta={"version": 7})),
                              (small, SwapOut()), (small, "back"), (small, SwapOut()),
                              (big, "moved")):
                if msg in ("back", "moved"):
                    msg = SwapIn("x", "", {}, source=parked.ranks)
                started = now()
                reply = await conn.request(msg, timeout_s=1e6)
                if isinstance(reply, Parked):
                    parked = reply
                    assert reply.version == 7 and len(reply.ranks) == 16
                seconds.append(now() - started)
                assert reply.seconds == pytest.approx(seconds[-1])
            assert reply.how == "pulled" and slots[1].version == 7
            await small.request(DropParked("x"))
            assert not slots[0].parked
            return seconds

    restored, out, back, _, moved = run(main())
    assert out == pytest.approx(costs.offload_s(state, 16)) and back == pytest.approx(out)
    assert restored == pytest.approx(costs.onload_s(state, 16))
    assert moved == pytest.approx(costs.move_s(state, 16, 32) + costs.onload_s(state, 32))
    assert costs.move_s(state, 16, 32) == costs.move_s(state, 32, 16) == pytest.approx(
        state / (16 * costs.links.rdma_per_device * costs.links.swap_move_efficiency))
    assert costs.offload_s(state, 32) == pytest.approx(costs.offload_s(state, 16) / 2)


def test_allocator_evicts_the_idle_agent_expected_last():
    """a and b idle in the two slots, c asks: LRU would evict a (released first), but the team's
    order says a asks next (a, b, c, a, ...): b leaves. Without an expected order: LRU."""
    def two_idle(order):
        alloc = SlotAllocator({"s0": 1, "s1": 1}, {"a": 1, "b": 1, "c": 1})
        for agent in "ab":
            alloc.request(agent)
            alloc.grant()
            alloc.release(agent)
        if order is not None:
            alloc.expect(order)
        alloc.request("c")
        [grant] = alloc.grant()
        return grant.evict

    assert two_idle(["a", "b"]) == "b"
    assert two_idle(None) == "a"
    assert two_idle(["b"]) == "a"  # a not named: expected after every named agent


# Swap rates of the tests below: a state of 100 bytes parks or loads in place in 10 s, is
# pulled from another slot in 30 s (a move and a load), as in the simulator's cost model.
RATES = {"out": 10.0, "in": 10.0, "pull": 100 / 30}


def _estimates(agents, frees_at=None, sizes=None):
    return Estimates({a: (sizes or {}).get(a, 100) for a in agents}, RATES, frees_at or {})


def test_an_agent_goes_back_to_the_slot_it_is_parked_in():
    """a is parked in s0 (b evicted it). When s0 is free again (holding b's idle state) and s1
    holds c's: a goes back to s0 (its load in place + b's state out and back: 30 s), not into
    s1 (a pull + c's out and back: 50 s), though s1 was released less recently. When s0 is still
    bound: a waits for it if it frees within the pull's cost, else it is pulled."""
    est = _estimates("abc")
    alloc = SlotAllocator({"s0": 1, "s1": 1, "s2": 1}, {"a": 1, "b": 1, "c": 1})
    alloc.request("a", 0.0)
    alloc.request("c", 0.0)
    assert [x.slot for x in alloc.grant(0.0, est)] == ["s0", "s1"]
    alloc.release("a")
    alloc.release("c")
    alloc.pinned = {"b": "s0"}  # b must take s0 this once
    alloc.request("b", 1.0)
    [g] = alloc.grant(1.0, est)
    assert (g.slot, g.evict) == ("s0", "a") and alloc.parked == {"a": "s0"}
    alloc.pinned = {"c": "s1"}  # s2 off limits: s0 or s1 for a
    alloc.release("b")
    alloc.request("a", 1.5)
    [g] = alloc.grant(1.5, est)
    assert (g.agent, g.slot, g.evict) == ("a", "s0", "b") and alloc.parked == {"b": "s0"}
    alloc.pinned = {}
    # Again: a parked in s0 under b.
    alloc = SlotAllocator({"s0": 1, "s1": 1, "s2": 1}, {"a": 1, "b": 1})
    alloc.request("a", 0.0)
    assert [x.slot for x in alloc.grant(0.0, est)] == ["s0"]
    alloc.release("a")
    alloc.pinned = {"b": "s0"}
    alloc.request("b", 1.0)
    alloc.grant(1.0, est)
    alloc.pinned = {}
    alloc.request("a", 2.0)
    # s0 bound by b, freeing at 5 s: wait 3 s + b out and back 20 s + a in place 10 s = 33 s
    # against a pull into an empty slot now (30 s): a is pulled.
    [g] = alloc.grant(2.0, _estimates("ab", {"s0": 5.0}))
    assert g.slot in ("s1", "s2") and g.evict is None
    # a's state 1000 bytes (load 100 s, pull 300 s), b's 10, s0 freeing in 1 s: waiting
    # (1 s + b's out and back 2 s + a's load 100 s) beats the pull: a waits, then goes back.
    alloc = SlotAllocator({"s0": 1, "s1": 1}, {"a": 1, "b": 1})
    alloc.request("a", 0.0)
    alloc.grant(0.0, est)
    alloc.release("a")
    alloc.pinned = {"b": "s0"}
    alloc.request("b", 1.0)
    alloc.grant(1.0, est)
    alloc.pinned = {}
    est = _estimates("ab", {"s0": 3.0}, sizes={"a": 1000, "b": 10})
    alloc.request("a", 2.0)
    assert alloc.grant(2.0, est) == []  # 1 s + b (2 s) + a in place (100 s) < pull (300 s)
    assert alloc.recheck_at == 3.0  # look again when s0 should have freed
    alloc.release("b")
    [g] = alloc.grant(2.5, est)
    assert (g.agent, g.slot, g.evict) == ("a", "s0", "b")


def test_a_small_agent_waits_rather_than_evict_a_large_one_when_a_fitting_slot_frees_soon():
    """big (a 32B-class agent, 2 ranks) is idle in the large slot; small (14B-class, 1 rank)
    asks while the small slot is bound and frees in 5 s. Evicting big costs its state out now
    and pulled back later (10 + 30 s for 100 bytes) plus small's own load (10 s); the small
    slot costs 5 s of waiting + its holder's state out and back (20 s) + small's load (10 s):
    35 < 50 s, small waits.
    If the small slot frees only later than the eviction's cost, small evicts big."""
    def case(frees_in: float):
        alloc = SlotAllocator({"large": 2, "little": 1}, {"big": 2, "small": 1, "other": 1})
        est = _estimates(["big", "small", "other"])
        for agent, at in (("big", 0.0), ("other", 0.0)):
            alloc.request(agent, at)
        assert {g.agent: g.slot for g in alloc.grant(0.0, est)} == {"big": "large",
                                                                    "other": "little"}
        alloc.release("big")
        alloc.request("small", 10.0)
        return alloc, alloc.grant(10.0, _estimates(["big", "small", "other"],
                                                   {"little": 10.0 + frees_in}))

    alloc, grants = case(5.0)
    assert grants == [] and alloc.waiting() == ["small"]
    alloc.release("other")  # the small slot frees: small takes it, big stays resident
    [g] = alloc.grant(15.0, _estimates(["big", "small", "other"]))
    assert (g.agent, g.slot, g.evict) == ("small", "little", "other")
    assert alloc.resident["large"] == "big"
    _, [g] = case(60.0)  # 60 + 30 s > 50 s: evicting is cheaper than that wait
    assert (g.agent, g.slot, g.evict) == ("small", "large", "big")


def test_a_waiting_agent_takes_what_is_free_once_it_waited_the_swap_it_avoids():
    """The bounded wait: small passed over the large slot (50 s: its load, big's state out and
    pulled back) for the small one, expected to free at 15 s, which it does not: once that is
    overdue it takes the large slot; with an estimate that keeps moving ahead, at 60 s (asked at
    10 s + 50 s) whatever the estimates say."""
    alloc = SlotAllocator({"large": 2, "little": 1}, {"big": 2, "small": 1, "other": 1})
    est = _estimates(["big", "small", "other"])
    alloc.request("big", 0.0)
    alloc.request("other", 0.0)
    alloc.grant(0.0, est)
    alloc.release("big")
    alloc.request("small", 10.0)
    soon = _estimates(["big", "small", "other"], {"little": 15.0})
    assert alloc.grant(10.0, soon) == [] and alloc.recheck_at == 15.0
    # Overdue: the estimate failed, so nothing is waited for any more.
    [g] = alloc.grant(16.0, soon)
    assert (g.agent, g.slot) == ("small", "large")
    # The same with an estimate that keeps moving ahead: the deadline still holds.
    alloc2 = SlotAllocator({"large": 2, "little": 1}, {"big": 2, "small": 1, "other": 1})
    alloc2.request("big", 0.0)
    alloc2.request("other", 0.0)
    alloc2.grant(0.0, est)
    alloc2.release("big")
    alloc2.request("small", 10.0)
    for t in (10.0, 40.0, 59.5):
        assert alloc2.grant(t, _estimates(["big", "small", "other"], {"little": t + 1})) == []
        assert alloc2.recheck_at == pytest.approx(min(60.0, t + 1))
    [g] = alloc2.grant(60.0, _estimates(["big", "small", "other"], {"little": 61.0}))
    assert (g.agent, g.slot) == ("small", "large")


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.floats(0.0, 20.0)), min_size=1, max_size=60),
       st.integers(1, 3), st.lists(st.floats(0.0, 200.0), min_size=6, max_size=6))
def test_with_estimates_no_double_binding_and_no_livelock(events, num_slots, holds):
    """Agents of two sizes ask and release in random order at random times, with estimates
    (measured swaps, hold times that may be wrong): a slot never holds two agents, an agent
    never two slots, and every waiting agent is granted by the time it has waited its best
    free slot's cost (at most 6 x 100 bytes of swaps / the slowest rate = 180 s) while a slot
    that fits it is free."""
    agents = [f"a{i}" for i in range(6)]
    needs = {a: 1 + (i % 2) for i, a in enumerate(agents)}  # odd ones need the large slots
    slots = {f"s{i}": 1 + (i % 2) for i in range(num_slots + 1)}  # s1 (and s3) are large
    alloc = SlotAllocator(slots, needs)
    times = SlotTimes()
    for a in agents:
        times.swapped(a, "out", 100, 10.0)
        times.swapped(a, "in", 100, 10.0)
        times.swapped(a, "pull", 100, 30.0)
    holding: dict[str, str] = {}
    asked: dict[str, float] = {}
    clock = 0.0

    def grant() -> None:
        for g in alloc.grant(clock, times.estimates(alloc.bound)):
            assert g.slot not in holding.values() and g.agent not in holding
            assert slots[g.slot] >= needs[g.agent]
            holding[g.agent] = g.slot
            times.granted(g.agent, g.slot, clock)
            del asked[g.agent]
        assert len(set(holding.values())) == len(holding)
        assert set(alloc.bound.items()) == {(s, a) for a, s in holding.items()}
        for agent, at in asked.items():  # bounded wait: 180 s is more than any option costs
            if any(s not in alloc.bound and slots[s] >= needs[agent] for s in slots):
                assert clock - at < 180.0 + 1e-9, (agent, at, clock)

    for k, (choice, dt) in enumerate(events):
        clock += dt
        agent = agents[choice]
        if agent in holding:
            alloc.release(agent)
            times.released(agent, clock)
            times.holds[agent] = holds[choice]  # estimates that may be wrong either way
            del holding[agent]
        elif agent not in asked:
            alloc.request(agent, clock)
            asked[agent] = clock
        grant()
        if alloc.recheck_at is not None and alloc.recheck_at <= clock + 20.0:
            clock = max(clock, alloc.recheck_at)  # the pool's timer
            grant()
    # Holders finish one by one (the pool's timer fires at recheck_at): everyone is served
    # within a bounded number of releases and rechecks.
    for _ in range(4 * len(agents)):
        if not asked:
            break
        if alloc.recheck_at is not None:
            clock = max(clock, alloc.recheck_at)
        elif holding:
            agent = next(iter(holding))
            alloc.release(agent)
            times.released(agent, clock)
            del holding[agent]
        grant()
    assert not asked and not alloc.waiting()
