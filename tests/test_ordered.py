"""Turns (flexmarl.training.ordered): arrival order kept by concurrent handlers, pure, and
through an actor's mailbox (Actor.admit) over inproc. The real trainer slot that serves a
FetchShards while it is busy: tests/test_slot_busy.py."""
from __future__ import annotations

import asyncio
import random

import pytest
from hypothesis import given, settings, strategies as st

from flexmarl.training.ordered import Turns
from runtime.actor import Actor, handler
from runtime.codec import Envelope
from runtime.errors import RemoteError
from runtime.protocol import Ping, Pong
from runtime.transport import connect

TIMEOUT_S = 30.0
"""Generous: everything here is in-process and takes milliseconds."""


async def yields(n: int) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 5),
                          st.sampled_from(["ok", "fails", "refused"])), min_size=1, max_size=12),
       st.randoms(use_true_random=False))
def test_turns_run_in_the_order_taken_whatever_the_interleaving(plan, rng):
    """Turns taken in order (as Actor.admit takes them), their tasks started in a random
    order; each yields a random number of times before it waits and while it holds its turn;
    some fail while holding, some are refused before waiting. The holders go one at a time,
    in the order the turns were taken."""

    async def main() -> list[int]:
        turns, held, order = Turns(), [], []
        taken = [turns.take(str(i)) for i in range(len(plan))]

        async def request(i: int) -> None:
            before, during, outcome = plan[i]
            await yields(before)
            try:
                if outcome == "refused":
                    raise ValueError("refused by its check")
                await taken[i].wait()
                held.append(i)
                assert len(held) == 1, f"{held} hold at once"
                order.append(i)
                await yields(during)
                held.remove(i)
                if outcome == "fails":
                    raise RuntimeError("failed while holding")
            finally:
                taken[i].release()

        starts = list(range(len(plan)))
        rng.shuffle(starts)
        await asyncio.wait_for(asyncio.gather(*(request(i) for i in starts),
                                              return_exceptions=True), TIMEOUT_S)
        assert len(turns) == 0
        return order

    assert asyncio.run(main()) == [i for i, p in enumerate(plan) if p[2] != "refused"]


async def test_turns_taken_before_scheduling_keep_take_order_not_start_order():
    """Turns taken synchronously (as Actor.admit does), their waiters started in reverse."""
    turns, order = Turns(), []
    taken = [turns.take(str(i)) for i in range(6)]

    async def run(i: int) -> None:
        await yields(random.Random(i).randint(0, 4))
        await taken[i].wait()
        order.append(i)
        await yields(2)
        taken[i].release()

    await asyncio.wait_for(asyncio.gather(*(run(i) for i in reversed(range(6)))), TIMEOUT_S)
    assert order == list(range(6)) and len(turns) == 0


async def test_a_refused_request_drops_out_without_holding_up_the_line():
    """A turn released before it waited (its request failed its check) leaves the line at
    once; the turn behind it waits only for the one that holds the line."""
    turns = Turns()
    first, refused, third = turns.take("a"), turns.take("bad"), turns.take("c")
    await first.wait()
    refused.release()
    assert turns.waiting == ["a", "c"]
    behind = asyncio.ensure_future(third.wait())
    await yields(3)
    assert not behind.done()
    first.release()
    await asyncio.wait_for(behind, TIMEOUT_S)
    with pytest.raises(RuntimeError, match="after its release"):
        await refused.wait()


async def test_a_failing_holder_releases_the_line():
    turns = Turns()
    failing, nxt = turns.take("a"), turns.take("b")

    async def fail() -> None:
        try:
            await failing.wait()
            raise RuntimeError("the command failed")
        finally:
            failing.release()

    with pytest.raises(RuntimeError, match="command failed"):
        await fail()
    await asyncio.wait_for(nxt.wait(), TIMEOUT_S)
    assert turns.waiting == ["b"]


async def test_cancelled_waiters_and_holders_release_their_turns():
    """A waiter cancelled in the middle of the line drops out; a holder cancelled (its
    finally releases) hands the line on; one cancelled just after being woken hands it on."""
    turns = Turns()
    head, middle, woken, last = (turns.take(w) for w in ("head", "middle", "woken", "last"))
    await head.wait()
    waiting_middle = asyncio.ensure_future(middle.wait())
    waiting_woken = asyncio.ensure_future(woken.wait())
    waiting_last = asyncio.ensure_future(last.wait())
    await yields(2)
    waiting_middle.cancel()
    await asyncio.gather(waiting_middle, return_exceptions=True)
    assert turns.waiting == ["head", "woken", "last"]
    head.release()  # wakes "woken" ...
    waiting_woken.cancel()  # ... which is cancelled before it runs again
    await asyncio.gather(waiting_woken, return_exceptions=True)
    assert waiting_woken.cancelled()
    await asyncio.wait_for(waiting_last, TIMEOUT_S)
    assert turns.waiting == ["last"]


class OrderedActor(Actor):
    """Concurrent handlers that take their turn at dispatch (as the trainer worker does) and
    then yield a random number of times before waiting for it; Pong's seq is the order of
    service."""

    def __init__(self, address: str) -> None:
        super().__init__("ordered", address)
        self.turns = Turns()
        self.turn_of: dict[int, object] = {}
        self.served: list[int] = []
        self.rng = random.Random(0)

    def admit(self, env: Envelope) -> None:
        if isinstance(env.msg, Ping) and env.msg.payload == b"ordered":
            self.turn_of[id(env)] = self.turns.take(str(env.msg.seq))

    @handler(Ping, concurrent=True)
    async def on_ping(self, msg: Ping, env: Envelope) -> Pong:
        turn = self.turn_of.pop(id(env), None)
        if turn is None:
            return Pong(msg.seq, b"")  # a status-like request: answered at once
        try:
            if msg.seq < 0:
                raise ValueError("refused by its check")
            await yields(self.rng.randint(0, 6))
            await turn.wait()
            self.served.append(msg.seq)
            await yields(self.rng.randint(0, 3))
        finally:
            turn.release()
        return Pong(msg.seq, b"")


async def test_an_actor_serves_concurrent_handlers_in_arrival_order():
    """Pipelined requests (and refused ones among them) on one connection: served in the
    order they arrived, while an unordered request is answered in between."""
    actor = OrderedActor("inproc://ordered-turns")
    async with actor.serving(), connect(actor.address) as conn:
        seqs = [1, 2, -3, 4, 5, 6, -7, 8, 9, 10]
        pending = [asyncio.ensure_future(conn.request(Ping(s, b"ordered"), timeout_s=TIMEOUT_S))
                   for s in seqs]
        quick = await conn.request(Ping(99, b"status"), timeout_s=TIMEOUT_S)
        assert quick.seq == 99
        replies = await asyncio.gather(*pending, return_exceptions=True)
    assert actor.served == [s for s in seqs if s > 0]
    assert [isinstance(r, RemoteError) for r in replies] == [s < 0 for s in seqs]
    assert len(actor.turns) == 0 and actor.turn_of == {}
