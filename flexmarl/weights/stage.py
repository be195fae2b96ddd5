"""Staged weight sync: the trainer publishes each version on its host (flexmarl.weights.
published) and every instance loads it from there; the run sends each instance the file's
name, never the tensors (CPU, any engine, LoRA adapters, time-shared placements).

    trainer's rank 0: ExportWeights(publish) ─► the version's file on its host ─► its source
    WeightSync.sync ─► StageTransport.begin(agent, version, instances)
      send(update) ─► push_weights ─► WeightUpdate(version, {}, source) ─┬─► instance 1
                        (one small request each, all at once)           └─► instance k
        RolloutWorker.on_weight_update: read the file (this host) or fetch it from the trainer
        (another host) ─► gate closed ─► running requests finish ─► engine.load_weights
        (torch: in place; vLLM: a safetensors file streamed into reload_weights) ─► serves
        `version` ─► gate open ─► WeightUpdateDone
      finish() ─► SyncReport (bytes, seconds, each instance's load time, the dead ones skipped)

The same message travels over local://, inproc://, ipc:// or tcp://; every instance loads in
place (no engine restart). A moved or replacement instance loads the agent's served version the
same way (WeightSync.load_into: `force`, the instance's own version does not count). A
WeightUpdate may still carry its tensors inline (push_weights(tensors=...)): tests and tools on
small models; the run's WeightSync never does.
"""
from __future__ import annotations

import asyncio
from typing import Any, Sequence

import torch

from flexmarl.clock import now
from flexmarl.protocol import WeightUpdate
from flexmarl.weights.base import SyncReport, weights_nbytes
from runtime.errors import PeerDied
from runtime.transport import Connection


async def push_weights(instances: Sequence[Connection], version: int,
                       tensors: dict[str, torch.Tensor] | None = None, *,
                       timeout_s: float,
                       source: dict[str, Any] | None = None,
                       complete: bool = True,
                       tolerate: tuple[type[BaseException], ...] = (),
                       force: bool = False,
                       adapter: tuple[str, dict] | None = None) -> SyncReport:
    """Send `version` to every instance at once, as its published `source` (the run's way) or
    its `tensors` inline; return when all have loaded (each within `timeout_s`: the rollout
    section's request_timeout_s in a run). `complete` False: only the tensors that train.
    `force`: an instance changing hands loads it whatever version it serves. `adapter` (its
    name and LoraSpec.as_dict()): the tensors are that LoRA adapter's, and `version` its own.

    An instance whose request fails with one of `tolerate` (e.g. PeerDied: its replacement
    loads the served weights itself) is listed in the report's `skipped`; any other failure
    raises once every instance has answered."""
    if not instances:
        raise ValueError("push_weights needs at least one rollout instance")
    if (tensors is None) == (source is None):
        raise ValueError("push_weights takes the tensors or their published source, one of them")
    msg = WeightUpdate(version, tensors or {}, force=force, complete=complete, source=source,
                       **({"adapter": adapter[0], "lora": adapter[1]} if adapter else {}))
    started = now()
    replies = await asyncio.gather(*(conn.request(msg, timeout_s=timeout_s)
                                     for conn in instances), return_exceptions=True)
    seconds = now() - started
    load_s, skipped, held = {}, [], []
    for conn, done in zip(instances, replies):
        if isinstance(done, tolerate):
            skipped.append(conn.address)
            continue
        if isinstance(done, BaseException):
            raise done
        if done.version != version:
            raise RuntimeError(f"{conn.address} acknowledged version {done.version}, "
                               f"expected {version}")
        load_s[conn.address] = done.load_s
        if getattr(done, "held", None):  # it serves the version from its host now
            held.append({**done.held, "address": conn.address})
    return SyncReport(version, update_nbytes(tensors, source), seconds, load_s, skipped, held)


def update_nbytes(tensors: dict[str, torch.Tensor] | None, source: dict[str, Any] | None) -> int:
    """The bytes of a version: its tensors', or what its trainer published."""
    return weights_nbytes(tensors) if tensors is not None else int(source.get("num_bytes", 0))


class StageTransport:
    """The staged transport (flexmarl.weights.base.Transport): an instance that dies during a
    sync is skipped (its replacement loads the served weights)."""

    exports = True

    def __init__(self, timeout_s: float, adapters: dict[str, dict] | None = None) -> None:
        """`adapters` (agent -> LoraSpec.as_dict()): agents whose tensors are a LoRA adapter."""
        self.timeout_s = timeout_s
        self.adapters = dict(adapters or {})

    def begin(self, agent: str, version: int, instances: list[Connection]) -> "StagedTransfer":
        adapter = (agent, self.adapters[agent]) if agent in self.adapters else None
        return StagedTransfer(instances, version, self.timeout_s, adapter)

    async def fetch(self, agent: str) -> WeightUpdate:
        raise RuntimeError(f"{agent}'s weights are staged: the run knows where its trainer "
                           "published the served version (WeightSync.served), there is "
                           "nothing to fetch")


class StagedTransfer:
    def __init__(self, instances: list[Connection], version: int, timeout_s: float,
                 adapter: tuple[str, dict] | None = None) -> None:
        self.instances, self.version, self.timeout_s = instances, version, timeout_s
        self.adapter = adapter
        self.report: SyncReport | None = None

    async def send(self, update: WeightUpdate | None) -> None:
        if update is None or update.source is None:
            raise ValueError("a staged sync needs the version its trainer published "
                             "(ExportWeights.publish): the run does not carry weights")
        if not self.instances:  # every instance died (a node lost): the replacements load the
            # served version, which the sync records, when they join (under the agent's lock)
            self.report = SyncReport(self.version, update_nbytes(None, update.source), 0.0)
            return
        self.report = await push_weights(self.instances, self.version, source=update.source,
                                         complete=update.complete, timeout_s=self.timeout_s,
                                         tolerate=(PeerDied,), adapter=self.adapter)

    async def finish(self) -> SyncReport:
        return self.report

    async def abort(self) -> None:
        """Nothing to stop: each instance's load was one request, over when `send` raised (an
        instance whose load failed keeps serving its version: its gate is open again)."""
