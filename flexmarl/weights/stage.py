"""Staged weight sync: the tensors pass through the run to every instance (CPU, any engine).

    sending end (this module)                        receiving end (every rollout instance)
    loop: trainer.export_weights() while its slot is bound
    WeightSync.sync ─► StageTransport.begin(agent, version, instances)
      send(tensors) ─► push_weights ─► WeightUpdate(version, tensors) ─┬─► instance 1
                        (zero-copy tensor frames, one request each)   └─► instance k
        RolloutWorker.on_weight_update: gate closed ─► running requests finish ─►
        engine.load_weights (torch: in place; vLLM: a safetensors file in rollout.staging_dir
        streamed into reload_weights) ─► serves `version` ─► gate open ─► WeightUpdateDone
      finish() ─► SyncReport (bytes, seconds, each instance's load time, the dead ones skipped)

The same message travels over local://, inproc://, ipc:// or tcp://; every instance loads in
place (no engine restart). A moved or replacement instance gets the agent's served weights the
same way (WeightSync.load_into: `force`, the instance's own version does not count). The
receiving end is the rollout worker's gate and its engine's load (rollout/worker.py,
rollout/vllm_engine.py): nothing of it is independent of the engine but `weights_nbytes`.
"""
from __future__ import annotations

import asyncio
from typing import Sequence

import torch

from flexmarl.clock import now
from flexmarl.protocol import WeightUpdate
from flexmarl.weights.base import SyncReport, weights_nbytes
from runtime.errors import PeerDied
from runtime.transport import Connection


async def push_weights(instances: Sequence[Connection], version: int,
                       tensors: dict[str, torch.Tensor], *,
                       timeout_s: float,
                       tolerate: tuple[type[BaseException], ...] = (),
                       force: bool = False,
                       adapter: tuple[str, dict] | None = None) -> SyncReport:
    """Send `tensors` as `version` to every instance at once; return when all have loaded
    (each within `timeout_s`: the rollout section's request_timeout_s in a run). `force`: an
    instance changing hands loads them whatever version it serves. `adapter` (its name and
    LoraSpec.as_dict()): the tensors are that LoRA adapter's, and `version` its own.

    An instance whose request fails with one of `tolerate` (e.g. PeerDied: its replacement
    loads the served weights itself) is listed in the report's `skipped`; any other failure
    raises once every instance has answered."""
    if not instances:
        raise ValueError("push_weights needs at least one rollout instance")
    msg = WeightUpdate(version, tensors, force=force,
                       **({"adapter": adapter[0], "lora": adapter[1]} if adapter else {}))
    started = now()
    replies = await asyncio.gather(*(conn.request(msg, timeout_s=timeout_s)
                                     for conn in instances), return_exceptions=True)
    seconds = now() - started
    load_s, skipped = {}, []
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
    return SyncReport(version, weights_nbytes(tensors), seconds, load_s, skipped)


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
        raise RuntimeError(f"{agent}'s weights are staged: the run holds what it served "
                           "(WeightSync.served), there is nothing to fetch")


class StagedTransfer:
    def __init__(self, instances: list[Connection], version: int, timeout_s: float,
                 adapter: tuple[str, dict] | None = None) -> None:
        self.instances, self.version, self.timeout_s = instances, version, timeout_s
        self.adapter = adapter
        self.report: SyncReport | None = None

    async def send(self, tensors: dict[str, torch.Tensor] | None) -> None:
        if tensors is None:
            raise ValueError("a staged sync needs the trainer's exported tensors")
        if not self.instances:  # every instance died (a node lost): the replacements load the
            # served weights, which the sync records, when they join (under the agent's lock)
            self.report = SyncReport(self.version, weights_nbytes(tensors), 0.0)
            return
        self.report = await push_weights(self.instances, self.version, tensors,
                                         timeout_s=self.timeout_s, tolerate=(PeerDied,),
                                         adapter=self.adapter)

    async def finish(self) -> SyncReport:
        return self.report

    async def abort(self) -> None:
        """Nothing to stop: each instance's load was one request, over when `send` raised (an
        instance whose load failed keeps serving its version: its gate is open again)."""
