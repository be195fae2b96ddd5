"""TrainerPool's logic over fake slots (RecordingSlot answers like a trainer worker): turns,
prefetches, evictions under way, lost states, hung and dead slots restored from their saved
snapshots, the learnt team order. The pool over real slots: tests/test_trainer_pool.py.
"""
from __future__ import annotations

import asyncio

import pytest

from flexmarl.config.training import TrainerPoolConfig
from flexmarl.protocol import (AwaitSaved, Parked, SaveState, StateSaved, SwapDone, SwapIn,
                               SwapOut)
from runtime.errors import PeerDied, RemoteError
from runtime.lifecycle import Lifecycle

SHARED = TrainerPoolConfig(slots=1, snapshots=False)
"""A shared pool (not one slot per agent), no snapshots."""


def saving(slot, msg, version: int):
    """A fake slot's answer to SaveState and AwaitSaved (the state at `version`), else None."""
    if isinstance(msg, SaveState):
        slot.saving = (slot.agent, msg.step, msg.path)
        return StateSaved(slot.agent, msg.step, version, "", 8)
    if isinstance(msg, AwaitSaved):
        agent, step, path = slot.saving
        assert path == msg.path
        return StateSaved(agent, step, version, path, 8)
    return None


class RecordingSlot:
    """Stands in for a trainer slot's connection: answers SwapIn/SwapOut like the worker. The
    log says for each SwapIn whether the agent came with a state (parked, or restored)."""

    def __init__(self, log: list) -> None:
        self.log = log
        self.agent = ""

    async def request(self, msg, timeout_s=None):
        await asyncio.sleep(0)
        if isinstance(msg, SwapIn):
            assert not self.agent, "SwapIn into a busy slot"
            self.agent = msg.agent
            self.log.append(("in", msg.agent, bool(msg.source or msg.tensors or msg.state_dir)))
            return SwapDone(8, 0.0)
        if isinstance(msg, SwapOut):
            agent, self.agent = self.agent, ""
            self.log.append(("out", agent))
            return Parked(agent, 1, 8, 0.0, [f"ipc://{id(self)}"])
        return None

    async def aclose(self) -> None:
        pass


async def test_pool_takes_turns_and_prefetches_the_swapped_out_agent():
    from flexmarl.training.pool import AgentTrainer, TrainerPool
    log: list = []
    pool = TrainerPool({"s0": RecordingSlot(log)}, {"s0": 1},
                       {"a": AgentTrainer("/a", {}), "b": AgentTrainer("/b", {})}, SHARED)
    release = {"a": asyncio.Event(), "b": asyncio.Event()}

    async def update(agent: str) -> None:
        async with pool.bind(agent):
            await release[agent].wait()

    async def until(n: int) -> None:
        while len(log) < n:
            await asyncio.sleep(0.001)

    ta = asyncio.ensure_future(update("a"))
    await until(1)
    tb = asyncio.ensure_future(update("b"))
    await asyncio.sleep(0.01)
    assert log == [("in", "a", False)]  # one slot: b waits for a
    release["a"].set()
    await ta
    await until(3)  # a's state goes out to the host, b comes in fresh
    assert log == [("in", "a", False), ("out", "a"), ("in", "b", False)]
    release["b"].set()
    await tb  # b released, nobody waits, a is out: a is prefetched back in
    await until(5)
    assert log[3:] == [("out", "b"), ("in", "a", True)]
    while pool._holding:  # the prefetch's binding ends (a slow machine can lag here): else
        await asyncio.sleep(0.001)  # a's update below would share it and close() end it
    release["a"].clear()
    release["a"].set()
    await update("a")  # already in the slot: no swap for it
    await pool.close()
    # After a's update b is prefetched once; that prefetch ending starts no other (no
    # ping-pong while the team is idle).
    assert log[5:] == [("out", "a"), ("in", "b", True)]
    assert pool.allocator.bound == {} and not pool._holding


class SlowSwapOutSlot(RecordingSlot):
    """A slot whose SwapOut of agent a takes a while (as a real one moving GBs does)."""

    async def request(self, msg, timeout_s=None):
        if isinstance(msg, SwapOut) and self.agent == "a":
            await asyncio.sleep(0.05)
        return await super().request(msg, timeout_s)


async def test_an_agent_evicted_a_moment_ago_gets_its_state_not_a_fresh_trainer():
    """Found by the cluster simulator: c's grant evicts a from s1; a asks again while its state
    is still on the way out and is granted s0. Its SwapIn must carry that state (it waited for
    it), not start a fresh trainer that forgets everything a learnt."""
    from flexmarl.training.pool import AgentTrainer, TrainerPool
    log: list = []
    pool = TrainerPool({"s0": SlowSwapOutSlot(log), "s1": SlowSwapOutSlot(log)},
                       {"s0": 1, "s1": 1},
                       {a: AgentTrainer(f"/{a}", {}) for a in "abc"}, SHARED, prefetch=False)
    for agent in "ba":  # b resident in s0, a in s1, both idle
        async with pool.bind(agent):
            pass

    async def update(agent: str) -> None:
        async with pool.bind(agent):
            pass

    # The team's order so far is b, a, c: after c, b is expected first, a next; c evicts the
    # idle agent expected last, a, from s1.
    c = asyncio.ensure_future(update("c"))
    await asyncio.sleep(0.01)  # a's SwapOut is under way
    await update("a")  # granted s0: evicts b; a's state must come in
    await c
    ins = [e for e in log if e[0] == "in"]
    assert ("in", "a", True) in ins and ins.count(("in", "a", False)) == 1, log
    await pool.close()


async def test_a_lost_state_fails_loudly_instead_of_restarting_the_agent():
    from flexmarl.training.pool import AgentTrainer, TrainerPool

    class FailingSwapOut(RecordingSlot):
        async def request(self, msg, timeout_s=None):
            if isinstance(msg, SwapOut):
                raise RemoteError("handler", "SwapOut failed")
            return await super().request(msg, timeout_s)

    pool = TrainerPool({"s0": FailingSwapOut([])}, {"s0": 1},
                       {a: AgentTrainer(f"/{a}", {}) for a in "ab"}, SHARED, prefetch=False)
    async with pool.bind("a"):
        pass
    with pytest.raises(RemoteError):
        async with pool.bind("b"):  # a's state cannot leave: b does not get the slot
            pass


async def test_a_hung_slot_is_killed_replaced_and_its_agent_restored_from_its_snapshot():
    """A request to the slot times out: its processes are killed (not waited on again), the
    request fails with PeerDied, new processes take the slot, and the agent's next binding
    restores its last snapshot there, with the snapshot's version."""
    from flexmarl.protocol import TrainStep
    from flexmarl.training.pool import AgentTrainer, TrainerPool
    from runtime.errors import PeerDied, RequestTimeout

    class Slot(RecordingSlot):
        hangs = False

        async def request(self, msg, timeout_s=None):
            if reply := saving(self, msg, 3):
                return reply
            if isinstance(msg, TrainStep) and self.hangs:
                raise RequestTimeout("TrainStep: no reply within 0.1 s")
            return await super().request(msg, timeout_s)

        def fail_pending(self, exc):
            pass

    log: list = []
    first = Slot(log)
    first.hangs = True
    killed, respawned = [], []

    async def respawn(slot, old):
        respawned.append((slot, old))
        return [f"{slot}-w1"], Slot(log)

    pool = TrainerPool({"s0": first}, {"s0": 1}, {"a": AgentTrainer("/a", {})},
                       TrainerPoolConfig(slots=1, snapshots=True),
                       lifecycle=Lifecycle(respawn, owners={"s0-w0": "s0"}, groups=True,
                                           kill=lambda name, reason: killed.append(name)))
    async with pool.bind("a") as conn:
        await (await pool.save("a", 0))
        with pytest.raises(PeerDied, match="trainer slot s0 died: TrainStep timed out"):
            await conn.request(TrainStep(10))
    assert killed == ["s0-w0"] and pool.recoverable()
    assert pool.restored_version("a") == 3
    async with pool.bind("a"):
        pass
    assert respawned == [("s0", ["s0-w0"])] and pool.workers == {"s0-w1": "s0"}
    assert log == [("in", "a", False), ("in", "a", True)]  # fresh, then the snapshot
    assert [r["slot"] for r in pool.replacements] == ["s0"] and pool.deaths == 1
    assert pool.recovery.worker_died("s0-w0", "exited") is False  # the old process: already handled
    await pool.close()


async def test_a_parked_agent_whose_slot_dies_restarts_from_its_snapshot():
    """a is parked in s0 (b evicted it) when s0 dies: a's shards died with it, so a's next
    binding restores its snapshot (its saved dir, SwapIn.state_dir) in the replaced slot, as
    for b, the agent loaded there. An agent parked in a live slot is not touched."""
    from flexmarl.training.pool import AgentTrainer, TrainerPool

    class Slot(RecordingSlot):
        async def request(self, msg, timeout_s=None):
            if reply := saving(self, msg, 5):
                return reply
            return await super().request(msg, timeout_s)

        def fail_pending(self, exc):
            pass

    log: list = []

    async def respawn(slot, old):
        return [f"{slot}-w1"], Slot(log)

    pool = TrainerPool({"s0": Slot(log)}, {"s0": 1},
                       {a: AgentTrainer(f"/{a}", {}) for a in "ab"},
                       TrainerPoolConfig(slots=1, snapshots=True),
                       lifecycle=Lifecycle(respawn, owners={"s0-w0": "s0"}, groups=True),
                       prefetch=False)
    for agent in "ab":
        async with pool.bind(agent):
            await (await pool.save(agent, 0))
    assert pool.where("a") == ("parked", "s0") and pool.where("b") == ("loaded", "s0")
    assert pool.recovery.worker_died("s0-w0", "exited with -9")
    assert pool.where("a") is None and pool.where("b") is None
    assert all(isinstance(pool.states[a], StateSaved) for a in "ab")  # their snapshots
    async with pool.bind("a"):
        pass
    assert log[-1] == ("in", "a", True) and pool.restored_version("a") == 5
    assert [sw.source for sw in pool.swaps if sw.direction == "in"] == [""]  # a restore
    await pool.close()


async def test_pool_learns_the_order_agents_ask_in_and_prefetches_the_next():
    """After one cycle (a, b, c) on one slot, the pool expects the same order again: when c's
    update ends, a (expected next) is prefetched, not b (swapped out longest ago too)."""
    from flexmarl.training.pool import AgentTrainer, TrainerPool
    log: list = []
    pool = TrainerPool({"s0": RecordingSlot(log)}, {"s0": 1},
                       {x: AgentTrainer(f"/{x}", {}) for x in "abc"}, SHARED, prefetch=False)
    for agent in "abc":
        async with pool.bind(agent):
            pass
    assert pool.expected_order() == ["a", "b", "c"]
    async with pool.bind("a"):
        assert pool.expected_order() == ["b", "c", "a"]
    pool.prefetch = True
    async with pool.bind("b"):
        pass
    while pool._holding or pool._prefetches:
        await asyncio.sleep(0.001)
    assert log[-2:] == [("out", "b"), ("in", "c", True)]  # c comes next after b
    await pool.close()


async def test_a_collective_failing_on_a_dead_peer_waits_for_the_death_notice():
    """Rank 0 of a two-rank slot answers "Connection reset by peer" the moment its peer dies,
    before the supervisor reports the death: the request waits for the notice and fails with
    PeerDied (the slot is replaced), not with the bare error (the run would stop). Any other
    handler error is raised at once."""
    from flexmarl.protocol import TrainStep
    from flexmarl.training.pool import AgentTrainer, TrainerPool

    class ResetSlot(RecordingSlot):
        async def request(self, msg, timeout_s=None):
            if isinstance(msg, TrainStep):
                raise RemoteError("handler", msg.__class__.__name__ + ": RuntimeError: [gloo] "
                                  "Read error: Connection reset by peer" if self.reset else
                                  "ValueError: bad batch")
            return await super().request(msg, timeout_s)

    slot = ResetSlot([])
    pool = TrainerPool({"s0": slot}, {"s0": 2}, {"a": AgentTrainer("/a", {}, 2)}, SHARED,
                       prefetch=False)
    async with pool.bind("a") as conn:
        slot.reset = False
        with pytest.raises(RemoteError, match="bad batch"):
            await conn.request(TrainStep())
        slot.reset = True
        asyncio.get_running_loop().call_later(0.2, pool.recovery.slot_died, "s0", "trainer-0-1 died")
        with pytest.raises(PeerDied, match="trainer-0-1 died"):
            await conn.request(TrainStep())
