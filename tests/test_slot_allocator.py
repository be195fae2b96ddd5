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
from flexmarl.training.slots import SlotAllocator
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
        state / (costs.links.move_bandwidth_per_node * costs.links.swap_move_efficiency))
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
