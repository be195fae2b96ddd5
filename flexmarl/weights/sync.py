"""WeightSync: what every agent's instances serve, and the one call that changes it.

    loop: update = trainer's export if weights.exports else None   (while the slot is bound)
          await weights.sync(agent, version, update) ─► SyncReport
            under the agent's lock: the run's transport (or staged, for a given update)
            ─► begin(agent, version, its instances now) ─► send ─► finish (abort on failure)
            ─► versions[agent] = version; the served weights: the update's tensors, merged
               into the previous ones for a partial update (train_layers: complete=False), or
               "in the trainer" after a direct sync
    pool: async with weights.locked(src, dst): await weights.load_into(conn, dst)  (a move)
          async with weights.locked(agent): if not weights.fresh(agent): load_into  (a new
          instance) ─► the instance serves exactly the agent's served version

The run builds it (flexmarl.launch.compose) with its transport and hands it to the rollout pool
and to the loop (flexmarl.orchestrator.loop.PipelineRun); the pool, which knows each agent's
instances now (its balancer owns them), gives that list at its construction (serve_from).
Before an agent's first sync its served weights are its model directory's (read once, when an
instance first needs them).
"""
from __future__ import annotations

import asyncio
import contextlib
from typing import AsyncIterator, Callable, Iterable

import torch

from flexmarl.protocol import WeightUpdate
from flexmarl.weights.base import SyncReport, Transport, weights_nbytes
from flexmarl.weights.stage import StageTransport, push_weights
from runtime.transport import Connection


def model_weights(model_dir: str) -> dict[str, torch.Tensor]:
    """A model directory's weights (flexmarl.models.model_weights). Imported on first use:
    flexmarl.models brings transformers (about 3 s), which `flexmarl plan` and `sim` would
    otherwise pay for: the simulator runs the rollout pool's own code, which imports this."""
    from flexmarl.models import model_weights as read
    return read(model_dir)


class WeightSync:
    def __init__(self, agents: Iterable[str],
                 instances: Callable[[str], list[Connection]] | None,
                 model_dirs: dict[str, str], *, timeout_s: float,
                 transport: Transport | None = None,
                 served: dict[str, dict[str, torch.Tensor]] | None = None,
                 rollout: Callable[[str], contextlib.AbstractAsyncContextManager] | None = None,
                 adapters: dict[str, dict] | None = None) -> None:
        """`instances(agent)`: the connections of the agent's instances now (None: the pool
        that holds them gives it at its construction, serve_from); `transport`: the
        run's (default staged; flexmarl.weights.direct.DirectTransport on GPU); `served`
        (agent -> weights): what the instances start with, where not the model directory's
        (the simulator's models have no files); `timeout_s`: rollout.request_timeout_s;
        `rollout(agent)`: the agent's devices for its engines, held over a sync's push (a
        time-shared agent's engines are awake for it; flexmarl.placement.timeshare);
        `adapters` (agent -> LoraSpec.as_dict()): LoRA agents, whose syncs carry their adapter
        only, always staged (an engine reloads an adapter from its tensors), and whose version
        0 is the base itself (nothing to load: PEFT starts B at 0)."""
        self.rollout = rollout or (lambda agent: contextlib.nullcontext())
        self.instances = instances
        self.model_dirs = dict(model_dirs)
        self.timeout_s = timeout_s
        self.adapters = dict(adapters or {})
        self.stage = StageTransport(timeout_s, self.adapters)
        self.transport = transport or self.stage
        self.exports = self.transport.exports
        """Whether `sync` needs the trainer's exported tensors (else the trainer sends)."""
        self.versions = {agent: 0 for agent in agents}
        """The version every instance of each agent serves."""
        self._served: dict[str, dict[str, torch.Tensor]] = dict(served or {})
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
        served weights when they join). `update`: the trainer's
        exported weights (staged, whatever the run's transport: a resumed run's restored
        weights), or None where the transport does not export (the trainer sends)."""
        if update is None and agent in self.adapters:
            raise ValueError(f"{agent} is a LoRA agent: its adapter syncs staged, from its "
                             "exported tensors")
        if update is None and self.exports:
            raise ValueError(f"syncing {agent} to version {version} needs its exported weights "
                             "(the transport is staged)")
        if update is not None and update.version != version:
            raise ValueError(f"{agent}'s exported weights are version {update.version}, the "
                             f"sync is of version {version}")
        transport = self.transport if update is None else self.stage
        async with self.rollout(agent), self._locks[agent]:
            instances = self.instances(agent)
            if instances:
                transfer = transport.begin(agent, version, instances)
                try:
                    await transfer.send(None if update is None else update.tensors)
                    report = await transfer.finish()
                except Exception:
                    await transfer.abort()
                    raise
            else:  # every instance died (a node lost): the replacements load what is recorded
                report = SyncReport(version, 0 if update is None else
                                    weights_nbytes(update.tensors), 0.0)
            self.versions[agent] = version
            if update is None:
                self._served.pop(agent, None)
                self._in_trainer.add(agent)
            else:  # a partial update: the served weights are the previous ones and these
                self._served[agent] = (update.tensors if update.complete else
                                       {**await self.served(agent), **update.tensors})
            return report

    @contextlib.asynccontextmanager
    async def locked(self, *agents: str) -> AsyncIterator[None]:
        """No sync of these agents meanwhile (locks taken in the order given)."""
        async with contextlib.AsyncExitStack() as stack:
            for agent in agents:
                await stack.enter_async_context(self._locks[agent])
            yield

    def fresh(self, agent: str) -> bool:
        """An instance started from the agent's model directory serves what the agent serves
        (never synced, no other starting weights given): it has nothing to load."""
        return agent not in self._served and agent not in self._in_trainer

    async def served(self, agent: str) -> dict[str, torch.Tensor]:
        """The weights of the version the agent's instances serve (hold its lock)."""
        if agent in self._in_trainer:
            # Synced directly: a moved or replacement instance gets them from the trainer,
            # which must still hold the served version (it has not stepped past it).
            update = await self.transport.fetch(agent)
            if update.version != self.versions[agent]:
                raise RuntimeError(f"{agent}'s trainer holds version {update.version}, its "
                                   f"instances serve {self.versions[agent]}: loading an "
                                   "instance waits for the next weight sync")
            return update.tensors
        if agent not in self._served:  # never synced: the model directory's weights
            self._served[agent] = await asyncio.to_thread(model_weights, self.model_dirs[agent])
        return self._served[agent]

    async def load_into(self, conn: Connection, agent: str) -> SyncReport:
        """An instance joining `agent` (moved to it, or new) loads the agent's served version,
        whatever it served before (hold the agent's lock)."""
        adapter = (agent, self.adapters[agent]) if agent in self.adapters else None
        return await push_weights([conn], self.versions[agent], await self.served(agent),
                                  timeout_s=self.timeout_s, force=True, adapter=adapter)
