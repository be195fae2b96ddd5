"""The team's rollout instances as one pool: routed by the balancer, moved between agents.

    generate(agent, Generate) ─► balancer.route (least outstanding work, sticky per episode)
                              ─► that instance ─► GenerateReply ─► balancer.finish (lengths learnt)
    push(agent, version, weights) ─► every instance of the agent (weight sync), under its lock
    report loops: each instance pushes LoadReport ─► balancer.report (its queued + running)
    rebalance_loop: balancer.plan_move ─► move: drain (no new requests, in-flight ones finish)
                    ─► the hot agent's served weights loaded in place (WeightUpdate(force=True))
                    ─► re-registered under the hot agent; logged with cause and cost

An instance can only change hands between agents whose models share an architecture and a
tokenizer (same config.json and tokenizer files): its engine is reloaded in place, never
restarted. The pool keeps each agent's served weights (the last push, or the model directory's
before the first), so a move loads exactly the version the agent's other instances serve.
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from flexmarl.clock import now
from flexmarl.activity import ActivityLog
from flexmarl.balancer import Balancer, BalancerConfig, Move, percentile
from flexmarl.protocol import Generate, GenerateReply, LoadReport, SubscribeLoad, WeightUpdate
from flexmarl.weight_sync import SyncReport, push_weights, weights_nbytes
from runtime.transport import Connection

log = logging.getLogger(__name__)
_MODEL_KEYS_IGNORED = {"_name_or_path", "transformers_version"}


def model_signature(model_dir: str) -> str:
    """Architecture and tokenizer of a model directory: equal signatures can swap weights."""
    root = Path(model_dir)
    config = json.loads((root / "config.json").read_text())
    parts = [json.dumps({k: v for k, v in config.items() if k not in _MODEL_KEYS_IGNORED},
                        sort_keys=True)]
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        path = root / name
        parts.append(path.read_text() if path.is_file() else "")
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


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


class InstancePool:
    def __init__(self, instances: dict[str, Connection], placement: dict[str, list[str]],
                 model_dirs: dict[str, str], config: BalancerConfig | None = None, *,
                 request_timeout_s: float = 300.0, signatures: dict[str, str] | None = None,
                 weights: dict[str, dict[str, torch.Tensor]] | None = None) -> None:
        """`signatures` (agent -> model signature) and `weights` (agent -> the weights its
        instances start with) default to what the model directories hold (the simulator,
        whose models have no files, passes both)."""
        self.conns = dict(instances)
        self.model_dirs = dict(model_dirs)
        if signatures is None:
            signatures = {a: model_signature(d) for a, d in model_dirs.items()}
        self.balancer = Balancer(placement, config,
                                 compatible=lambda src, dst: signatures[src] == signatures[dst])
        self.request_timeout_s = request_timeout_s
        self.versions = {agent: 0 for agent in placement}
        self._weights: dict[str, dict[str, torch.Tensor]] = dict(weights or {})
        self._locks = {agent: asyncio.Lock() for agent in placement}
        self._tasks: list[asyncio.Task] = []
        self.moves: list[MoveRecord] = []
        self.failed_moves = 0
        self._latency: dict[str, list[float]] = {agent: [] for agent in placement}
        self._tokens: dict[str, int] = {name: 0 for name in instances}
        self.reports: dict[str, LoadReport] = {}
        """Each instance's last load report (queued, running: from every client)."""
        self.activity: ActivityLog | None = None
        """Set by the orchestrator: each instance's busy intervals (its requests in flight)."""
        self._drains: dict[str, asyncio.Event] = {}
        """Instances being moved, set once their last in-flight request has finished."""

    def of(self, agent: str) -> list[Connection]:
        return [self.conns[name] for name in self.balancer.instances(agent)]

    # ------------------------------------------------------------------ requests

    async def generate(self, agent: str, msg: Generate, *, episode: str | None = None
                       ) -> GenerateReply:
        bal = self.balancer
        cost = bal.estimate(agent, n=msg.params.n, max_tokens=msg.params.max_tokens)
        name = bal.route(agent, msg.request_id, cost, episode=episode)
        started = now()
        if self.activity is not None:
            self.activity.enter(name, "instance")
        try:
            reply: GenerateReply = await self.conns[name].request(
                msg, timeout_s=self.request_timeout_s)
        except BaseException:
            bal.finish(msg.request_id)
            self._maybe_drained(name)
            raise
        finally:
            if self.activity is not None:
                self.activity.exit(name, "instance")
        tokens = sum(len(s.token_ids) for s in reply.samples)
        bal.finish(msg.request_id, samples=len(reply.samples), tokens=tokens)
        self._maybe_drained(name)
        self._latency[agent].append(now() - started)
        self._tokens[name] += tokens
        return reply

    def _maybe_drained(self, name: str) -> None:
        drain = self._drains.get(name)
        if drain is not None and not self.balancer.inflight(name):
            drain.set()

    def take_stats(self) -> dict:
        """Since the last call: per agent request latency p50/p99 (s) and count, and tokens
        generated per instance (how evenly the work was spread)."""
        out = {"latency": {}, "instance_tokens": dict(self._tokens)}
        for agent, values in self._latency.items():
            out["latency"][agent] = ({"p50_s": percentile(values, 0.5),
                                      "p99_s": percentile(values, 0.99), "requests": len(values)}
                                     if values else {"requests": 0})
            values.clear()
        self._tokens = dict.fromkeys(self._tokens, 0)
        return out

    # ------------------------------------------------------------------ weights

    async def push(self, agent: str, version: int, tensors: dict[str, torch.Tensor]
                   ) -> SyncReport:
        """Weight sync: every instance of `agent` serves `version` when this returns."""
        async with self._locks[agent]:
            report = await push_weights(self.of(agent), version, tensors,
                                        timeout_s=self.request_timeout_s)
            self.versions[agent] = version
            self._weights[agent] = tensors
            return report

    async def _served_weights(self, agent: str) -> dict[str, torch.Tensor]:
        if agent not in self._weights:  # never synced: the model directory's weights
            from safetensors.torch import load_file
            path = str(Path(self.model_dirs[agent]) / "model.safetensors")
            self._weights[agent] = await asyncio.to_thread(load_file, path)
        return self._weights[agent]

    # ------------------------------------------------------------------ load reports, moves

    async def start(self) -> None:
        """Subscribe to every instance's load reports and start the rebalancing loop."""
        for name, conn in self.conns.items():
            first: LoadReport = await conn.request(SubscribeLoad(), control=True,
                                                   timeout_s=self.request_timeout_s)
            self.reports[name] = first
            self.balancer.report(name, first.queued + first.running)
            self._tasks.append(asyncio.create_task(self._reports(name, conn),
                                                   name=f"pool.reports[{name}]"))
        if self.balancer.config.strategy == "hierarchical":
            self._tasks.append(asyncio.create_task(self._rebalance_loop(), name="pool.rebalance"))

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()

    async def _reports(self, name: str, conn: Connection) -> None:
        while True:
            env = await conn.recv()
            if isinstance(env.msg, LoadReport):
                self.reports[name] = env.msg
                self.balancer.report(name, env.msg.queued + env.msg.running)

    async def _rebalance_loop(self) -> None:
        interval = self.balancer.config.check_interval_s
        while True:
            await asyncio.sleep(interval)
            move = self.balancer.plan_move(now())
            if move is not None:
                await self.move(move)

    async def move(self, move: Move) -> MoveRecord | None:
        """Carry out a planned move; None (and the instance stays) if it failed."""
        bal, conn = self.balancer, self.conns[move.instance]
        started = now()
        bal.begin_move(move)
        try:
            if bal.inflight(move.instance):  # its requests finish normally: none is lost
                self._drains[move.instance] = asyncio.Event()
                try:
                    await self._drains[move.instance].wait()
                finally:
                    del self._drains[move.instance]
            drained = now()
            # Under both agents' locks: no weight sync of either runs while it changes hands.
            async with self._locks[move.src], self._locks[move.dst]:
                version = self.versions[move.dst]
                tensors = await self._served_weights(move.dst)
                await conn.request(WeightUpdate(version, tensors, force=True),
                                   timeout_s=self.request_timeout_s)
                loaded = now()
                bal.finish_move(move, loaded)
        except Exception as exc:
            bal.abort_move(move, now())
            self.failed_moves += 1
            log.warning("moving instance %s from %s to %s failed (%s: %s); it keeps serving %s",
                        move.instance, move.src, move.dst, type(exc).__name__, exc, move.src)
            return None
        record = MoveRecord(move.instance, move.src, move.dst, move.src_load, move.dst_load,
                            drained - started, loaded - drained, weights_nbytes(tensors),
                            version, loaded)
        self.moves.append(record)
        log.info("moved instance %s from %s to %s: load per instance %.0f vs %.0f tokens "
                 "(ratio > %g); drained in %.2f s, loaded %s version %d (%.1f MB) in %.2f s",
                 move.instance, move.src, move.dst, move.src_load, move.dst_load,
                 bal.config.ratio, record.drain_s, move.dst, version, record.num_bytes / 1e6,
                 record.load_s)
        return record

    def take_moves(self, since: int, origin: float = 0.0) -> list[dict]:
        """Moves made after the first `since` ones, as plain records (`at` - origin)."""
        return [{**asdict(m), "at": m.at - origin} for m in self.moves[since:]]
