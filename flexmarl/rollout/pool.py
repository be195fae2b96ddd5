"""The team's rollout instances as one pool: routed by the balancer, moved between agents.

    generate(agent, Generate) ─► balancer.route (least outstanding work, sticky per episode)
                              ─► that instance ─► GenerateReply ─► balancer.finish (lengths learnt)
    weights (flexmarl.weights.sync.WeightSync, built here): the agents' versions and served
             weights; the loop syncs through it, moves and new instances load from it
    report loops: each instance pushes LoadReport ─► balancer.loads.report (queued + running)
    rebalance_loop: balancer.plan_move ─► move: drain (no new requests, in-flight ones finish)
                    ─► the hot agent's served weights loaded in place (weights.load_into)
                    ─► re-registered under the hot agent; logged with cause and cost

An instance can only change hands between agents whose models share an architecture and a
tokenizer (same config.json and tokenizer files): its engine is reloaded in place, never
restarted. The pool's WeightSync keeps each agent's served weights (the last sync, or the model
directory's before the first), so a move loads exactly the version the agent's other instances
serve.

LoRA agents on one base (flexmarl.models.lora) share their instances: the balancer sees one
"unit" (the agents joined by "+", e.g. "solver+checker") whose instances serve each member's
adapter, and a request carries its agent's adapter (Generate.adapter). A unit of adapters never
moves (its instances already serve all its agents); each member's version and sync stay its
own (WeightSync: the adapter's tensors only).
"""
from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from flexmarl.clock import now
from flexmarl.activity import ActivityLog
from flexmarl.checks import parse_cpus, require
from flexmarl.config.balance import BalancerConfig
from flexmarl.config.rollout import BACKENDS, DTYPES, TRANSFERS
from flexmarl.rollout.balancer import Balancer, Move, percentile
from flexmarl.rollout.engine import EngineConfig
from flexmarl.protocol import Generate, GenerateReply, LoadReport, SubscribeLoad
from flexmarl.weights.base import Transport
from flexmarl.weights.sync import WeightSync
from runtime.errors import PeerDied, RequestTimeout, TransportClosed
from runtime.lifecycle import Lifecycle, ReplaceFailed
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
                 model_dirs: dict[str, str], config: RolloutConfig, balance: BalancerConfig, *,
                 activity: ActivityLog | None = None, signatures: dict[str, str] | None = None,
                 served: dict[str, dict[str, torch.Tensor]] | None = None,
                 lifecycle: Lifecycle | None = None,
                 transport: Transport | None = None, shares: Any = None,
                 adapters: dict[str, tuple[str, dict]] | None = None) -> None:
        """`config` (section `rollout`) gives the request timeout, `balance` the balancer's
        settings; `activity` records each instance's busy intervals (its requests in flight).
        `signatures` (agent -> model signature) and `served` (agent -> the weights its
        instances start with) default to what the model directories hold (the simulator,
        whose models have no files, passes both). `lifecycle` (runtime.lifecycle; each instance
        its own owner) starts replacements of dead instances and new ones (`grow`: its respawn
        is given an agent and the dead instances whose GPUs the new one takes), kills one that
        stopped answering (its death then comes to instance_died) and holds the run's GPU
        placement (shown in status()); none: a death is final.
        `transport`: the run's weight sync (default staged; on GPU the trainer sending to the
        instances itself, flexmarl.weights.direct), under the pool's `weights`. `shares`
        (flexmarl.orchestrator.timeshare.TimeShares): time-shared agents' devices, taken by
        each of their requests and weight pushes; their instances never move. `adapters`
        (agent -> (its unit, its LoraSpec.as_dict())): LoRA agents served by their unit's
        instances (`placement` names the unit, not them; see the module docstring)."""
        self.shares = shares
        self.adapters = dict(adapters or {})
        lora_units = {u for u, _ in self.adapters.values()}
        self.unit = ({a: a for a in placement if a not in lora_units}
                     | {a: u for a, (u, _) in self.adapters.items()})
        """Each agent's unit in the balancer: itself, or its LoRA group."""
        self.members = {u: [a for a, au in self.unit.items() if au == u] for u in placement}
        if missing := [u for u, ms in self.members.items() if not ms]:
            raise ValueError(f"placement names units no agent belongs to: {missing}")
        fixed = lora_units | (set() if shares is None else
                              {a for g in shares.groups for a in g.agents})
        self.conns = dict(instances)
        self.lifecycle = lifecycle or Lifecycle(kind="rollout instance")
        self.model_dirs = dict(model_dirs)
        if signatures is None:
            signatures = {a: model_signature(d) for a, d in model_dirs.items()}
        signatures = {u: signatures[self.members[u][0]] for u in placement}
        self.balancer = Balancer(placement, balance,
                                 compatible=lambda src, dst: signatures[src] == signatures[dst]
                                 and not {src, dst} & fixed)
        self.request_timeout_s = config.request_timeout_s
        self.weights = WeightSync(self.unit, self.of, model_dirs,
                                  timeout_s=config.request_timeout_s, transport=transport,
                                  served=served, rollout=self._rollout,
                                  adapters={a: lora for a, (_, lora) in self.adapters.items()})
        """Each agent's version and served weights: synced by the loop, loaded by moves."""
        self._tasks: list[asyncio.Task] = []
        self.moves: list[MoveRecord] = []
        self.failed_moves = 0
        self._latency: dict[str, list[float]] = {agent: [] for agent in self.unit}
        self._tokens: dict[str, int] = {name: 0 for name in instances}
        self.reports: dict[str, LoadReport] = {}
        """Each instance's last load report (queued, running: from every client)."""
        self.activity = activity
        self._drains: dict[str, asyncio.Event] = {}
        """Instances being moved, set once their last in-flight request has finished."""
        self.dead = self.lifecycle.dead
        """Instances that died (name -> reason); their replacements have new names (the
        lifecycle's, updated in place, as `replacements`)."""
        self.redispatched = 0
        self.replacements = self.lifecycle.replacements
        self.added: list[dict] = []
        """Instances started for a node that joined mid-run (`grow`)."""
        self._serving = {agent: asyncio.Event() for agent in placement}
        for event in self._serving.values():
            event.set()
        self._report_tasks: dict[str, asyncio.Task] = {}
        self._broken: dict[str, Exception] = {}
        """Agents left with no instance after every replacement failed."""

    def of(self, agent: str) -> list[Connection]:
        return [self.conns[name] for name in self.balancer.loads.instances(self.unit[agent])]

    def _rollout(self, agent: str) -> contextlib.AbstractAsyncContextManager:
        """The agent's devices for rollout (at once unless it is time-shared)."""
        return self.shares.rollout(agent) if self.shares else contextlib.nullcontext()

    # ------------------------------------------------------------------ requests

    async def generate(self, agent: str, msg: Generate, *, episode: str | None = None
                       ) -> GenerateReply:
        """One request to an instance of `agent`. If that instance dies (or stops answering)
        before replying, the request goes to another instance of the agent (or waits for the
        dead one's replacement): the reply is the one the request's seed gives, stored once."""
        if agent in self.adapters:
            msg.adapter = agent
        async with self._rollout(agent):
            return await self._generate(agent, msg, episode)

    async def _generate(self, member: str, msg: Generate, episode: str | None) -> GenerateReply:
        bal, agent = self.balancer, self.unit[member]  # from here on `agent` is the unit
        cost = bal.loads.estimate(agent, n=msg.params.n, max_tokens=msg.params.max_tokens)
        while True:
            if agent in self._broken:
                raise self._broken[agent]
            if not bal.loads.instances(agent):  # all of them died: wait for a replacement
                await self._serving[agent].wait()
                continue
            name = bal.route(agent, msg.request_id, cost, episode=episode)
            started = now()
            if self.activity is not None:
                self.activity.enter(name, "instance")
            try:
                reply: GenerateReply = await self.conns[name].request(
                    msg, timeout_s=self.request_timeout_s)
            except (PeerDied, RequestTimeout) as exc:
                bal.finish(msg.request_id)
                self._maybe_drained(name)
                # Alive but not answering: killed (its death comes to instance_died), or, with
                # nothing to kill it, handled as dead here.
                if isinstance(exc, RequestTimeout) and \
                        not self.lifecycle.kill(name, "unresponsive"):
                    self.instance_died(name, "unresponsive")
                self.redispatched += 1
                log.warning("request %s: instance %s of %s failed (%s); sending it to another "
                            "instance", msg.request_id, name, agent, type(exc).__name__)
                continue
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
            self._latency[member].append(now() - started)
            self._tokens[name] = self._tokens.get(name, 0) + tokens
            return reply

    # ------------------------------------------------------------------ faults

    def instance_died(self, name: str, reason: str) -> None:
        """`name`'s process is gone: no request goes there any more, those in flight fail at
        once with PeerDied (generate() re-sends them), and a replacement is started."""
        if name in self.dead or name not in self.conns:
            return
        agent = self.balancer.loads.agent_of(name)
        self.lifecycle.died(name, reason)
        self.balancer.remove(name)
        if not self.balancer.loads.instances(agent):
            self._serving[agent].clear()
        conn = self.conns.pop(name)
        conn.fail_pending(PeerDied(f"rollout instance {name} of {agent} died ({reason})"))
        # Closed, so that anything still holding it (a move under way) fails at once too.
        self._tasks.append(asyncio.create_task(conn.aclose(), name=f"pool.close[{name}]"))
        task = self._report_tasks.pop(name, None)
        if task is not None:
            task.cancel()
        log.warning("rollout instance %s of %s died (%s): %d of its instances left%s", name,
                    agent, reason, len(self.balancer.loads.instances(agent)),
                    "; starting a replacement" if self.lifecycle.recoverable else "")
        if self.lifecycle.recoverable:
            self._tasks.append(asyncio.create_task(self._replace(name, agent),
                                                   name=f"pool.replace[{name}]"))

    async def _replace(self, dead: str, agent: str) -> None:
        """Start a new instance for `agent`, load the version the agent serves, route to it
        (Lifecycle.replace: up to supervisor.replace_attempts processes, as a replacement can
        die while it starts, too)."""
        async def ready(names: list[str], conn: Connection) -> dict:
            name = await self._start_replacement(agent, names[0], conn)
            return {"dead": dead, "new": name, "agent": agent,
                    "version": self.versions[self.members[agent][0]]}
        try:
            async with self._rollout(agent):  # a time-shared one starts with its engines awake
                await self.lifecycle.replace(dead, agent, [dead], ready)
        except ReplaceFailed as exc:
            if not self.balancer.loads.instances(agent):  # nothing serves it: fail its requests
                self._broken[agent] = RuntimeError(
                    f"agent {agent} has no rollout instance left: {exc}")
                self._serving[agent].set()

    def grow(self, agent: str) -> None:
        """Start one more instance for `agent` (a node joined) in the background: it loads the
        served version and takes requests as a replacement does; `added` records it."""
        agent = self.unit[agent]

        async def add() -> None:
            started = now()
            try:
                new = await self.lifecycle.start("", agent, [], lambda names, conn: (
                    self._start_replacement(agent, names[0], conn)))
            except Exception as exc:
                log.error("a new rollout instance for %s failed to start: %s: %s", agent,
                          type(exc).__name__, exc)
                return
            self.added.append({"new": new, "agent": agent, "seconds": now() - started})
            log.warning("new instance %s serves %s after %.1f s", new, agent, now() - started)
        self._tasks.append(asyncio.create_task(add(), name=f"pool.grow[{agent}]"))

    async def _start_replacement(self, agent: str, name: str, conn: Connection) -> str:
        """A new instance `name` (a replacement or a new one) takes the requests of unit `agent`
        (an agent, or a LoRA group: every member's served adapter is loaded)."""
        members = self.members[agent]
        try:
            async with self.weights.locked(*members):  # no weight sync of them meanwhile
                for member in members:
                    if not self.weights.fresh(member):
                        await self.weights.load_into(conn, member)
                first: LoadReport = await conn.request(SubscribeLoad(), control=True,
                                                       timeout_s=self.request_timeout_s)
                self.conns[name] = conn
                self.balancer.loads.add(agent, name)
                self.balancer.loads.report(name, first.queued + first.running)
                self.reports[name] = first
                self._report_tasks[name] = asyncio.create_task(self._reports(name, conn),
                                                               name=f"pool.reports[{name}]")
                self._serving[agent].set()
        except BaseException:
            if name not in self.conns:
                await conn.aclose()
            raise
        return name

    def _maybe_drained(self, name: str) -> None:
        drain = self._drains.get(name)
        if drain is not None and not self.balancer.loads.inflight(name):
            drain.set()

    @property
    def versions(self) -> dict[str, int]:
        """The version each agent's instances serve (weights.versions)."""
        return self.weights.versions

    def instances(self, agent: str) -> list[str]:
        """The instances serving `agent` now (the balancer may move them; a LoRA agent's are
        its group's)."""
        return self.balancer.loads.instances(self.unit.get(agent, agent))

    def status(self, recent: int = 200) -> dict:
        """The instances now and the latest moves, as plain data (flexmarl.observe.monitor):
        {instances: name -> {agent, queued, running (its last load report), inflight (ours),
        draining}, agents: name -> {instances, inflight}, moves: the last `recent` MoveRecords,
        moves_total}."""
        loads = self.balancer.loads
        instances = {}
        for name in self.conns:
            report = self.reports.get(name)
            unit = loads.agent_of(name)
            instances[name] = {"agent": unit,
                               **({"adapters": self.members[unit]} if unit not in self.unit
                                  or unit in self.adapters else {}),
                               "queued": report.queued if report else 0,
                               "running": report.running if report else 0,
                               "inflight": loads.inflight(name),
                               "draining": loads.is_draining(name)}
        agents = {a: {"instances": loads.instances(self.unit[a]),
                      "inflight": sum(loads.inflight(i) for i in loads.instances(self.unit[a])),
                      **({"lora_group": self.unit[a]} if a in self.adapters else {})}
                  for a in self.versions}
        return {"instances": instances, "agents": agents, "moves": self.moves[-recent:],
                "lora_groups": {u: self.members[u] for u, _ in self.adapters.values()},
                "moves_total": len(self.moves),
                "devices": (self.lifecycle.devices.rows() if self.lifecycle.devices is not None
                            else []),
                "time_shares": self.shares.status() if self.shares else {}}

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

    # ------------------------------------------------------------------ steps

    def step_started(self) -> None:
        """A step's rollout begins (the orchestrator): the balancer's phase clock."""
        self.balancer.step_started(now())

    # ------------------------------------------------------------------ load reports, moves

    async def start(self) -> None:
        """Subscribe to every instance's load reports and start the rebalancing loop."""
        for name, conn in self.conns.items():
            first: LoadReport = await conn.request(SubscribeLoad(), control=True,
                                                   timeout_s=self.request_timeout_s)
            self.reports[name] = first
            self.balancer.loads.report(name, first.queued + first.running)
            self._report_tasks[name] = asyncio.create_task(self._reports(name, conn),
                                                           name=f"pool.reports[{name}]")
        if self.balancer.config.strategy == "hierarchical":
            self._tasks.append(asyncio.create_task(self._rebalance_loop(), name="pool.rebalance"))

    async def close(self) -> None:
        tasks = [*self._tasks, *self._report_tasks.values()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks.clear()
        self._report_tasks.clear()

    async def _reports(self, name: str, conn: Connection) -> None:
        while True:
            try:
                env = await conn.recv()
            except TransportClosed:
                return  # the instance died and its connection was closed
            if isinstance(env.msg, LoadReport):
                self.reports[name] = env.msg
                self.balancer.loads.report(name, env.msg.queued + env.msg.running)

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
            if bal.loads.inflight(move.instance):  # its requests finish normally: none is lost
                self._drains[move.instance] = asyncio.Event()
                try:
                    await self._drains[move.instance].wait()
                finally:
                    del self._drains[move.instance]
            drained = now()
            # Under both agents' locks: no weight sync of either runs while it changes hands.
            async with self.weights.locked(move.src, move.dst):
                loaded_with = await self.weights.load_into(conn, move.dst)
                loaded = now()
                bal.drained(move, drained, loaded)
                bal.finish_move(move, loaded)
        except Exception as exc:
            self.failed_moves += 1
            if move.instance in self.dead:  # it died while changing hands: nothing to undo
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

    def take_moves(self, since: int, origin: float = 0.0) -> list[dict]:
        """Moves made after the first `since` ones, as plain records (`at` - origin)."""
        return [{**asdict(m), "at": m.at - origin} for m in self.moves[since:]]
