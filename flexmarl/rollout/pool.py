"""The team's rollout instances as one pool: routed by the balancer, moved between agents.

    generate(agent, Generate) ─► balancer.route (least outstanding work, sticky per episode)
                              ─► that instance ─► GenerateReply ─► balancer.finish (lengths learnt)
    weights (flexmarl.weights.sync.WeightSync, handed in): the agents' versions and served
             weights; the loop syncs through it, moves and new instances load from it
    report loops: each instance pushes LoadReport ─► balancer.loads.report (queued + running)
    mover (flexmarl.rollout.moving): the rebalancing loop and its moves
    recovery (flexmarl.rollout.recovery): dead instances replaced, instances added mid-run
    shares (flexmarl.placement.timeshare): a time-shared agent's requests and pushes take its
             group's devices; the pool gives the groups how to sleep and wake their engines

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
from pathlib import Path
from typing import Coroutine

from flexmarl.clock import now
from flexmarl.activity import ActivityLog
from flexmarl.config.balance import BalancerConfig
from flexmarl.config.rollout import RolloutConfig
from flexmarl.placement.timeshare import TimeShares
from flexmarl.protocol import Generate, GenerateReply, LoadReport, Sleep, SubscribeLoad, WakeUp
from flexmarl.rollout.balancer import Balancer, percentile
from flexmarl.rollout.moving import Mover
from flexmarl.rollout.recovery import InstanceRecovery
from flexmarl.weights.sync import WeightSync
from runtime.errors import PeerDied, RequestTimeout, TransportClosed
from runtime.lifecycle import Lifecycle
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



class InstancePool:
    """The team's rollout instances; see the module docstring."""

    def __init__(self, instances: dict[str, Connection], placement: dict[str, list[str]],
                 model_dirs: dict[str, str], config: RolloutConfig, balance: BalancerConfig, *,
                 weights: WeightSync, activity: ActivityLog | None = None,
                 signatures: dict[str, str] | None = None, lifecycle: Lifecycle | None = None,
                 shares: TimeShares | None = None,
                 adapters: dict[str, tuple[str, dict]] | None = None) -> None:
        """`config` (section `rollout`) gives the request timeout, `balance` the balancer's
        settings; `weights`: the run's WeightSync (each agent's version and served weights;
        the pool gives it its instances); `activity` records each instance's busy intervals
        (its requests in flight). `signatures` (agent -> model signature) default to what the
        model directories hold (the simulator, whose models have no files, passes them).
        `lifecycle` (runtime.lifecycle; each instance its own owner) starts replacements of
        dead instances and new ones (`recovery.grow`: its respawn is given an agent and the
        dead instances whose GPUs the new one takes), kills one that stopped answering (its
        death then comes to recovery.died) and holds the run's GPU placement (shown in
        status()); none: a death is final. `shares` (TimeShares): time-shared agents'
        devices, taken by each of their requests and weight pushes; their instances never
        move; the pool gives the groups how to sleep and wake their engines. `adapters`
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
        if missing := sorted(set(self.unit) - set(weights.versions)):
            raise ValueError(f"the WeightSync handed in lacks agents {missing}")
        fixed = lora_units | (set() if shares is None else
                              {a for g in shares.groups for a in g.agents})
        self.conns = dict(instances)
        self.lifecycle = lifecycle or Lifecycle(kind="rollout instance")
        if signatures is None:
            signatures = {a: model_signature(d) for a, d in model_dirs.items()}
        signatures = {u: signatures[self.members[u][0]] for u in placement}
        self.balancer = Balancer(placement, balance,
                                 compatible=lambda src, dst: signatures[src] == signatures[dst]
                                 and not {src, dst} & fixed)
        self.request_timeout_s = config.request_timeout_s
        self.weights = weights
        """Each agent's version and served weights: synced by the loop, loaded by moves."""
        weights.serve_from(self.of)
        if shares:
            shares.hold_engines(self._sleep_or_wake)
        self._tasks: list[asyncio.Task] = []
        self._latency: dict[str, list[float]] = {agent: [] for agent in self.unit}
        self._tokens: dict[str, int] = {name: 0 for name in instances}
        self.reports: dict[str, LoadReport] = {}
        """Each instance's last load report (queued, running: from every client)."""
        self.activity = activity
        self.dead = self.lifecycle.dead
        """Instances that died (name -> reason); their replacements have new names (the
        lifecycle's, updated in place, as `replacements`)."""
        self.redispatched = 0
        self.replacements = self.lifecycle.replacements
        self.serving = {agent: asyncio.Event() for agent in placement}
        """Per unit: set while it has an instance (or none will come: recovery.broken)."""
        for event in self.serving.values():
            event.set()
        self._report_tasks: dict[str, asyncio.Task] = {}
        self.mover = Mover(self)
        self.recovery = InstanceRecovery(self)

    def of(self, agent: str) -> list[Connection]:
        return [self.conns[name] for name in self.balancer.loads.instances(self.unit[agent])]

    def devices(self, agent: str) -> contextlib.AbstractAsyncContextManager:
        """The agent's devices for rollout (at once unless it is time-shared)."""
        return self.shares.rollout(agent) if self.shares else contextlib.nullcontext()

    def background(self, coro: Coroutine, name: str) -> None:
        """A task of the pool's (cancelled by close())."""
        self._tasks.append(asyncio.create_task(coro, name=name))

    # ------------------------------------------------------------------ requests

    async def generate(self, agent: str, msg: Generate, *, episode: str | None = None
                       ) -> GenerateReply:
        """One request to an instance of `agent`. If that instance dies (or stops answering)
        before replying, the request goes to another instance of the agent (or waits for the
        dead one's replacement): the reply is the one the request's seed gives, stored once."""
        if agent in self.adapters:
            msg.adapter = agent
        async with self.devices(agent):
            return await self._generate(agent, msg, episode)

    async def _generate(self, member: str, msg: Generate, episode: str | None) -> GenerateReply:
        bal, agent = self.balancer, self.unit[member]  # from here on `agent` is the unit
        cost = bal.loads.estimate(agent, n=msg.params.n, max_tokens=msg.params.max_tokens)
        while True:
            if agent in self.recovery.broken:
                raise self.recovery.broken[agent]
            if not bal.loads.instances(agent):  # all of them died: wait for a replacement
                await self.serving[agent].wait()
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
                self.mover.finished_request(name)
                # Alive but not answering: killed (its death comes to recovery.died), or, with
                # nothing to kill it, handled as dead here.
                if isinstance(exc, RequestTimeout) and \
                        not self.lifecycle.kill(name, "unresponsive"):
                    self.recovery.died(name, "unresponsive")
                self.redispatched += 1
                log.warning("request %s: instance %s of %s failed (%s); sending it to another "
                            "instance", msg.request_id, name, agent, type(exc).__name__)
                continue
            except BaseException:
                bal.finish(msg.request_id)
                self.mover.finished_request(name)
                raise
            finally:
                if self.activity is not None:
                    self.activity.exit(name, "instance")
            tokens = sum(len(s.token_ids) for s in reply.samples)
            bal.finish(msg.request_id, samples=len(reply.samples), tokens=tokens)
            self.mover.finished_request(name)
            self._latency[member].append(now() - started)
            self._tokens[name] = self._tokens.get(name, 0) + tokens
            return reply

    # ------------------------------------------------------------------ time-shared engines

    async def _sleep_or_wake(self, agents: tuple[str, ...], awake: bool) -> list[dict]:
        """Every instance of `agents` put to sleep or woken (a time-shared group's switch,
        flexmarl.placement.timeshare); one record per instance that answered."""
        msg = WakeUp() if awake else Sleep()
        names = [(agent, name) for agent in agents for name in self.instances(agent)]
        replies = await asyncio.gather(*(self.conns[name].request(
            msg, timeout_s=self.request_timeout_s) for _, name in names), return_exceptions=True)
        records = []
        for (agent, name), r in zip(names, replies):
            if isinstance(r, RequestTimeout):  # hung: killed and replaced, as a hung generate
                if not self.lifecycle.kill(name, "unresponsive"):
                    self.recovery.died(name, "unresponsive")
            if isinstance(r, (PeerDied, TransportClosed, RequestTimeout)):
                # A dead instance is the pool's to replace (awake, inside a rollout use).
                log.warning("%s of %s did not %s: %s", name, agent,
                            "wake" if awake else "sleep", r)
                continue
            if isinstance(r, BaseException):
                raise r
            records.append({"instance": name, "agent": agent, "asleep": r.asleep,
                            "rss_before": r.rss_before, "rss_after": r.rss_after,
                            "seconds": r.seconds, "at": now()})
        return records

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
        moves = self.mover.moves
        return {"instances": instances, "agents": agents, "moves": moves[-recent:],
                "lora_groups": {u: self.members[u] for u, _ in self.adapters.values()},
                "moves_total": len(moves),
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

    # ------------------------------------------------------------------ load reports

    async def start(self) -> None:
        """Subscribe to every instance's load reports and start the rebalancing loop."""
        for name, conn in self.conns.items():
            first: LoadReport = await conn.request(SubscribeLoad(), control=True,
                                                   timeout_s=self.request_timeout_s)
            self.listen(name, conn, first)
        if self.balancer.config.strategy == "hierarchical":
            self.background(self.mover.loop(), "pool.rebalance")

    def listen(self, name: str, conn: Connection, first: LoadReport) -> None:
        """Follow `name`'s load reports from its first one (its answer to SubscribeLoad) on."""
        self.reports[name] = first
        self.balancer.loads.report(name, first.queued + first.running)
        self._report_tasks[name] = asyncio.create_task(self._reports(name, conn),
                                                       name=f"pool.reports[{name}]")

    def stop_reports(self, name: str) -> None:
        task = self._report_tasks.pop(name, None)
        if task is not None:
            task.cancel()

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
