"""A real 2-rank trainer slot busy with a long command still serves FetchShards and
SlotStatus (no head-of-line blocking in flexmarl.training.worker), and runs its pipelined
commands in arrival order on both ranks; a failing command gives the line up.

How the slot is kept busy without timing: it swaps in an agent pulled from `Gate` actors in
this process, which hold every FetchShards until the test opens them. The slot's command
thread then runs SWAP_IN (observed through SlotStatus and the gate's first request) for as
long as the test wants, with a micro-batch and a step queued behind it; meanwhile the test
fetches another agent's shards from the same slot. Nothing depends on how long anything takes.
"""
from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import pytest
import pytest_asyncio

from flexmarl.config.training import TrainerConfig
from flexmarl.protocol import (DropParked, ExportState, FetchShards, Parked, ShardData,
                               SlotStatus, SlotStatusReply, SwapIn, SwapOut, TrainBeginBatch,
                               TrainStep)
from runtime.actor import Actor, handler
from runtime.codec import Envelope
from runtime.errors import RemoteError
from runtime.supervisor import Supervisor, WorkerSpec
from runtime.transport import connect
from tests.helpers.trainers import batch, train_step

CFG = dataclasses.asdict(TrainerConfig(lr=1e-3))
TIMEOUT_S = 120.0
"""Generous: a step or a swap of the tiny model takes well under a second, but 2 shared CPU
cores under a full suite can be slow; no assertion depends on this being tight."""
pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]


class Gate(Actor):
    """Stands in for a source rank of a pull: holds each FetchShards until `opened`, then
    forwards it (agent renamed to `agent`) to `target`, a real rank an agent is parked on,
    or with `fail` set answers an error."""

    def __init__(self, address: str, target: str, agent: str) -> None:
        super().__init__(f"gate-{Path(address).name}", address)
        self.target, self.agent = target, agent
        self.opened, self.asked = asyncio.Event(), asyncio.Event()
        self.fail = False

    @handler(FetchShards, concurrent=True)
    async def on_fetch(self, msg: FetchShards, env: Envelope) -> ShardData:
        self.asked.set()
        await self.opened.wait()
        if self.fail:
            raise RuntimeError("the gate's source is gone")
        return await self.conn.request(FetchShards(self.agent, msg.pieces), timeout_s=TIMEOUT_S)

    async def on_start(self) -> None:
        self.conn = self.connect(self.target)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def slot(tmp_path_factory):
    """One real, empty 2-rank trainer slot (2 processes): a connection to rank 0 and the two
    ranks' addresses."""
    work = tmp_path_factory.mktemp("busy")
    specs = [WorkerSpec(name=f"busy{r}", entry="flexmarl.training.worker:trainer_worker",
                        args={"rank": r, "world_size": 2, "init_method": f"file://{work}/store"})
             for r in range(2)]
    sup = Supervisor()
    async with sup.serving():
        handles = await asyncio.gather(*(sup.start_worker(w) for w in specs))
        conn = connect(handles[0].address)
        try:
            yield conn, work
        finally:
            await conn.aclose()
            await sup.stop_workers()


async def status(conn) -> SlotStatusReply:
    return await conn.request(SlotStatus(), timeout_s=TIMEOUT_S)


async def until_running(conn, command: str, gates: list[Gate]) -> SlotStatusReply:
    """Wait for the first gate's first request (every rank of a pull asks its first source
    for the layout first: the pull has started), then for the slot to say it runs `command`:
    both are states the slot holds until the gates open."""
    await asyncio.wait_for(gates[0].asked.wait(), TIMEOUT_S)
    async with asyncio.timeout(TIMEOUT_S):
        while (now := await status(conn)).running != command:
            await asyncio.sleep(0.01)
    return now


async def park_b(conn, model_dir: str) -> Parked:
    """Agent b trained one step, then parked in the slot."""
    await conn.request(SwapIn("b", model_dir, CFG), timeout_s=TIMEOUT_S)
    await train_step(conn, 1)
    parked: Parked = await conn.request(SwapOut(), timeout_s=TIMEOUT_S)
    assert parked.agent == "b" and parked.version == 1 and len(parked.ranks) == 2
    return parked


def gates_to(parked: Parked, work: Path, tag: str) -> list[Gate]:
    return [Gate(f"ipc://{work}/{tag}{r}.sock", address, "b")
            for r, address in enumerate(parked.ranks)]


async def test_a_busy_slot_serves_fetch_shards_and_runs_its_queue_in_order(slot,
                                                                            tiny_model_dir):
    conn, work = slot
    parked = await park_b(conn, tiny_model_dir)
    assert (await status(conn)) == SlotStatusReply("", ["b"], "", 0.0, [])
    gates = gates_to(parked, work, "open")
    async with gates[0].serving(), gates[1].serving():
        mb = batch(2)
        # Pipelined on one connection, none awaited: a pull of "a" (a copy of b, through the
        # gates), then a micro-batch and a step for it; they must run in this order.
        swap = asyncio.ensure_future(conn.request(
            SwapIn("a", tiny_model_dir, CFG, source=[g.address for g in gates]),
            timeout_s=TIMEOUT_S))
        begin = asyncio.ensure_future(conn.request(TrainBeginBatch(0), timeout_s=TIMEOUT_S))
        micro = asyncio.ensure_future(conn.request(mb, timeout_s=TIMEOUT_S))
        step = asyncio.ensure_future(conn.request(TrainStep(int(mb.response_mask.sum())),
                                                  timeout_s=TIMEOUT_S))
        busy = await until_running(conn, "SWAP_IN", gates)
        assert busy.queued == ["BEGIN_BATCH", "MICRO_BATCH", "STEP"] and busy.parked == ["b"]
        # Served now, by both ranks, while rank 0's command thread is inside the swap and the
        # step waits behind it.
        for address in parked.ranks:
            async with connect(address) as rank:
                head = await rank.request(FetchShards("b"), timeout_s=TIMEOUT_S)
                assert head.layout and head.tensors  # the layout and the RNG state
        assert not any(f.done() for f in (swap, begin, micro, step))
        for g in gates:
            g.opened.set()
        done = await swap
        assert done.how == "pulled" and done.num_bytes > 0
        stepped = await step
        assert (await micro).num_tokens > 0 and stepped.version == 2  # b's 1, plus this step
    assert (await status(conn)) == SlotStatusReply("a", ["b"], "", 0.0, [])
    await conn.request(SwapOut(), timeout_s=TIMEOUT_S)
    for agent in ("a", "b"):
        await conn.request(DropParked(agent), timeout_s=TIMEOUT_S)


async def test_a_failing_command_gives_the_line_up_and_the_ranks_stay_in_step(slot,
                                                                                tiny_model_dir):
    """The pull fails on both ranks: the swap-in's error, then the step queued behind it
    refused by an empty slot, a bad request refused at once meanwhile, and the slot goes on
    (b comes back in place and trains on both ranks)."""
    conn, work = slot
    parked = await park_b(conn, tiny_model_dir)
    gates = gates_to(parked, work, "shut")
    async with gates[0].serving(), gates[1].serving():
        swap = asyncio.ensure_future(conn.request(
            SwapIn("a", tiny_model_dir, CFG, source=[g.address for g in gates]),
            timeout_s=TIMEOUT_S))
        step = asyncio.ensure_future(conn.request(TrainStep(1), timeout_s=TIMEOUT_S))
        await until_running(conn, "SWAP_IN", gates)
        with pytest.raises(RemoteError, match="num_tokens must be"):  # refused, not queued
            await conn.request(TrainStep(-1), timeout_s=TIMEOUT_S)
        assert (await status(conn)).queued == ["STEP"]
        for g in gates:
            g.fail = True
            g.opened.set()
        with pytest.raises(RemoteError, match="gate's source is gone"):
            await swap
        with pytest.raises(RemoteError, match="empty trainer slot"):
            await step
    assert (await conn.request(SwapIn("b", tiny_model_dir, CFG), timeout_s=TIMEOUT_S)).how \
        == "here"
    await train_step(conn, 3)
    state = await conn.request(ExportState(), timeout_s=TIMEOUT_S)
    assert state.agent == "b" and state.version == 2
    await conn.request(SwapOut(), timeout_s=TIMEOUT_S)
    await conn.request(DropParked("b"), timeout_s=TIMEOUT_S)
