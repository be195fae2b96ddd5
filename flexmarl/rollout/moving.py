"""Moving rollout instances between agents: the inter-agent level of the balancer, carried out.

    loop (balance.strategy "hierarchical"): every check_interval_s, balancer.choose_move
        ─► move: drain (no new requests, in-flight ones finish) ─► the hot agent's served
           weights loaded in place (WeightSync.load_into) ─► re-registered under the hot
           agent; logged with cause and cost (MoveRecord)

An instance changes hands only between agents whose models share an architecture and a
tokenizer (the pool's compatibility rule): its engine is reloaded in place, never restarted,
with exactly the version the hot agent's other instances serve. Part of the InstancePool,
built by it: it reads the pool's connections and the balancer's loads.
"""
from __future__ import annotations

import asyncio
import logging
from dataclasses import asdict, dataclass
from typing import Any

from flexmarl.clock import now
from flexmarl.rollout.balancer import Move

log = logging.getLogger(__name__)


@dataclass
class MoveRecord:
    instance: str
    src: str
    dst: str
    src_load: float
    dst_load: float
    drain_s: float
    load_s: float
    num_bytes: int
    version: int
    """The hot agent's version the instance was loaded with."""
    at: float
    """perf_counter() when the move finished."""


class Mover:
    """The pool's moves: the rebalancing loop, each move's drain and reload, their records."""

    def __init__(self, pool: Any) -> None:
        """`pool`: the InstancePool this is part of (it builds this; typed loosely: the pool
        module imports this one)."""
        self.pool = pool
        self.moves: list[MoveRecord] = []
        self.failed = 0
        self._drains: dict[str, asyncio.Event] = {}
        """Instances being moved, set once their last in-flight request has finished."""

    def finished_request(self, name: str) -> None:
        """A request of `name` ended: if it is being drained and now idle, its move goes on."""
        drain = self._drains.get(name)
        if drain is not None and not self.pool.balancer.loads.inflight(name):
            drain.set()

    async def loop(self) -> None:
        interval = self.pool.balancer.config.check_interval_s
        while True:
            await asyncio.sleep(interval)
            move = self.pool.balancer.choose_move(now())
            if move is not None:
                await self.move(move)

    async def move(self, move: Move) -> MoveRecord | None:
        """Carry out a chosen move; None (and the instance stays) if it failed."""
        pool = self.pool
        bal, conn = pool.balancer, pool.conns[move.instance]
        started = now()
        bal.begin_move(move)
        try:
            if bal.loads.inflight(move.instance):  # its requests finish normally: none is lost
                self._drains[move.instance] = asyncio.Event()
                try:
                    await self._drains[move.instance].wait()
                finally:
                    del self._drains[move.instance]
            drained = now()
            # Under both agents' locks: no weight sync of either runs while it changes hands.
            async with pool.weights.locked(move.src, move.dst):
                loaded_with = await pool.weights.load_into(conn, move.dst)
                loaded = now()
                bal.drained(move, drained, loaded)
                bal.finish_move(move, loaded)
        except Exception as exc:
            self.failed += 1
            if move.instance in pool.dead:  # it died while changing hands: nothing to undo
                log.warning("instance %s died while moving from %s to %s", move.instance,
                            move.src, move.dst)
                return None
            bal.abort_move(move, now())
            log.warning("moving instance %s from %s to %s failed (%s: %s); it keeps serving %s",
                        move.instance, move.src, move.dst, type(exc).__name__, exc, move.src)
            return None
        record = MoveRecord(move.instance, move.src, move.dst, move.src_load, move.dst_load,
                            drained - started, loaded - drained, loaded_with.num_bytes,
                            loaded_with.version, loaded)
        self.moves.append(record)
        log.info("moved instance %s from %s to %s: load per instance %.0f vs %.0f tokens "
                 "(ratio > %g); drained in %.2f s, loaded %s version %d (%.1f MB) in %.2f s",
                 move.instance, move.src, move.dst, move.src_load, move.dst_load,
                 bal.config.ratio, record.drain_s, move.dst, record.version, record.num_bytes / 1e6,
                 record.load_s)
        return record

    def take(self, since: int, origin: float = 0.0) -> list[dict]:
        """Moves made after the first `since` ones, as plain records (`at` - origin)."""
        return [{**asdict(m), "at": m.at - origin} for m in self.moves[since:]]
