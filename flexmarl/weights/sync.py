"""WeightSync: what every agent's instances serve, and the one call that changes it.

    loop: update = the trainer's published export if weights.exports else None  (slot bound)
          await weights.sync(agent, version, update) ─► SyncReport
            under the agent's lock: the run's transport (or staged, for a given update)
            ─► begin(agent, version, its instances now) ─► send ─► finish (abort on failure)
            ─► versions[agent] = version; served[agent] = where that version is: the file its
               trainer published (flexmarl.weights.published; with the instances that hold
               it now as its copies, WeightUpdateDone.held; for a partial update,
               train_layers: complete=False, with the model directory as its base), or "in the
               trainer" after a direct sync
    pool: async with weights.locked(src, dst): await weights.load_into(conn, dst)  (a move)
          async with weights.locked(agent): if not weights.fresh(agent): load_into  (a new
          instance) ─► the instance serves exactly the agent's served version

The run never holds weights: it keeps each agent's served version as a source (a file's name,
its host, its trainer's address) and the instances read it themselves. The run builds this
(flexmarl.launch.compose) with its transport and hands it to the rollout pool and to the loop
(flexmarl.orchestrator.loop.PipelineRun); the pool, which knows each agent's instances now (its
balancer owns them), gives that list at its construction (serve_from). Before an agent's first
sync its served weights are its model directory's, which an instance reads itself.
"""
from __future__ import annotations

import asyncio
import contextlib
from typing import Any, AsyncIterator, Callable, Iterable

from flexmarl.protocol import WeightUpdate
from flexmarl.weights.base import SyncReport, Transport
from flexmarl.weights.stage import StageTransport, push_weights, update_nbytes
from runtime.transport import Connection


class WeightSync:
    def __init__(self, agents: Iterable[str],
                 instances: Callable[[str], list[Connection]] | None,
                 model_dirs: dict[str, str], *, timeout_s: float,
                 transport: Transport | None = None,
                 rollout: Callable[[str], contextlib.AbstractAsyncContextManager] | None = None,
                 adapters: dict[str, dict] | None = None) -> None:
        """`instances(agent)`: the connections of the agent's instances now (None: the pool
        that holds them gives it at its construction, serve_from); `transport`: the
        run's (default staged; flexmarl.weights.direct.DirectTransport on GPU); `timeout_s`:
        rollout.request_timeout_s; `rollout(agent)`: the agent's devices for its engines,
        held over a sync's push (a time-shared agent's engines are awake for it;
        flexmarl.placement.timeshare); `adapters` (agent -> LoraSpec.as_dict()): LoRA agents,
        whose syncs carry their adapter only, always staged (an engine reloads an adapter
        from its tensors), and whose version 0 is the base itself (nothing to load: PEFT
        starts B at 0)."""
        self.rollout = rollout or (lambda agent: contextlib.nullcontext())
        self.instances = instances
        self.model_dirs = dict(model_dirs)
        self.timeout_s = timeout_s
        self.adapters = dict(adapters or {})
        self.stage = StageTransport(timeout_s, self.adapters)
        self.transport = transport or self.stage
        self.exports = self.transport.exports
        """Whether `sync` needs the trainer's published export (else the trainer sends)."""
        self.versions = {agent: 0 for agent in agents}
        """The version every instance of each agent serves."""
        self._sources: dict[str, dict[str, Any]] = {}
        """agent -> where the version its instances serve is (a published source, complete:
        with its base where the update was partial); none yet: its model directory's."""
        self._in_trainer: set[str] = set()
        """Agents whose served weights live only in their trainer (a direct sync)."""
        self._locks = {agent: asyncio.Lock() for agent in self.versions}

    def serve_from(self, instances: Callable[[str], list[Connection]]) -> None:
        """The rollout pool says where each agent's instances are (at its construction)."""
        if self.instances is not None and self.instances != instances:
            raise RuntimeError("this WeightSync already serves another pool's instances")
        self.instances = instances

    def exported(self, agent: str) -> bool:
        """Whether `sync(agent, ...)` needs the trainer's exported tensors (a LoRA agent's
        always: its adapter syncs staged, whatever the run's transport)."""
        return self.exports or agent in self.adapters

    async def sync(self, agent: str, version: int, update: WeightUpdate | None) -> SyncReport:
        """Every instance of `agent` serves `version` when this returns (an instance that died
        meanwhile is skipped, and so is the push when none is left: the replacements load the
        served version when they join). `update`: the trainer's published export (staged,
        whatever the run's transport: a resumed run's restored weights), or None where the
        transport does not export (the trainer sends)."""
        if update is None and agent in self.adapters:
            raise ValueError(f"{agent} is a LoRA agent: its adapter syncs staged, from its "
                             "published export")
        if update is None and self.exports:
            raise ValueError(f"syncing {agent} to version {version} needs its published export "
                             "(the transport is staged)")
        if update is not None and update.source is None:
            raise ValueError(f"{agent}'s version {version} came with its tensors: the run never "
                             "carries weights; export it published (ExportWeights.publish, "
                             "TrainerPool(publish=...))")
        if update is not None and update.version != version:
            raise ValueError(f"{agent}'s exported weights are version {update.version}, the "
                             f"sync is of version {version}")
        transport = self.transport if update is None else self.stage
        async with self.rollout(agent), self._locks[agent]:
            instances = self.instances(agent)
            if instances:
                transfer = transport.begin(agent, version, instances)
                try:
                    await transfer.send(update)
                    report = await transfer.finish()
                except Exception:
                    await transfer.abort()
                    raise
            else:  # every instance died (a node lost): the replacements load what is recorded
                report = SyncReport(version, 0 if update is None else
                                    update_nbytes(None, update.source), 0.0)
            self.versions[agent] = version
            if update is None:
                self._sources.pop(agent, None)
                self._in_trainer.add(agent)
            else:
                self._sources[agent] = self._whole(agent, update)
                self._in_trainer.discard(agent)
                self._add_copies(agent, report)
            return report

    def _add_copies(self, agent: str, report: SyncReport) -> None:
        """The instances that now hold the agent's served version serve it too (a joiner on
        another host fetches it from them when its trainer is gone): its source's copies,
        the latest first, one per instance address."""
        source = self._sources.get(agent)
        if source is None or not report.held or report.version != self.versions[agent]:
            return
        new = {h["address"]: h for h in report.held}
        source["copies"] = list(new.values()) + [
            h for h in source.get("copies", ()) if h["address"] not in new]

    def _whole(self, agent: str, update: WeightUpdate) -> dict[str, Any]:
        """Where all of `update`'s version is: a partial update (train_layers) on its base, the
        model directory (the layers that never train are the model directory's)."""
        return dict(update.source) | ({} if update.complete else
                                      {"base": self.model_dirs[agent]})

    @contextlib.asynccontextmanager
    async def locked(self, *agents: str) -> AsyncIterator[None]:
        """No sync of these agents meanwhile (locks taken in the order given)."""
        async with contextlib.AsyncExitStack() as stack:
            for agent in agents:
                await stack.enter_async_context(self._locks[agent])
            yield

    def fresh(self, agent: str) -> bool:
        """An instance started from the agent's model directory serves what the agent serves
        (never synced): it has nothing to load."""
        return agent not in self._sources and agent not in self._in_trainer

    async def served(self, agent: str) -> dict[str, Any]:
        """Where the version the agent's instances serve is, whole (hold its lock): the source
        its trainer published, or its model directory ({"base": dir}) before any sync."""
        if agent in self._in_trainer:
            # Synced directly: the trainer publishes the version it holds, which must still be
            # the served one (it has not stepped past it).
            update = await self.transport.fetch(agent)
            if update.version != self.versions[agent]:
                raise RuntimeError(f"{agent}'s trainer holds version {update.version}, its "
                                   f"instances serve {self.versions[agent]}: loading an "
                                   "instance waits for the next weight sync")
            if update.source is None:
                raise RuntimeError(f"{agent}'s trainer sent its weights instead of publishing "
                                   "them: the run never carries weights")
            return self._whole(agent, update)
        return self._sources.get(agent) or {"base": self.model_dirs[agent]}

    async def load_into(self, conn: Connection, agent: str) -> SyncReport:
        """An instance joining `agent` (moved to it, or new) loads the agent's served version,
        whatever it served before (hold the agent's lock)."""
        adapter = (agent, self.adapters[agent]) if agent in self.adapters else None
        report = await push_weights([conn], self.versions[agent],
                                    source=await self.served(agent), timeout_s=self.timeout_s,
                                    force=True, adapter=adapter)
        self._add_copies(agent, report)
        return report
