"""Weight sync: push one policy version from a trainer to every rollout instance of its agent.

    trainer.export_weights() ─► WeightUpdate(version, tensors) ─┬─► instance 1 ─► WeightUpdateDone
                                  (zero-copy tensor frames)      └─► instance k ─► WeightUpdateDone

The same message travels over local://, inproc://, ipc:// or tcp://; every instance loads in
place (no engine restart) and reports its load time. On GPU machines vLLM's NCCL/IPC transfer
engines are the faster path to add behind this function; the report keeps the same shape.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Sequence

import torch

from flexmarl.clock import now
from flexmarl.protocol import WeightUpdate
from runtime.transport import Connection



@dataclass
class SyncReport:
    version: int
    num_bytes: int
    seconds: float
    """Wall time from the first send to the last instance's acknowledgement."""
    load_s: dict[str, float] = field(default_factory=dict)
    """Per instance (its address): time spent loading inside the engine."""
    skipped: list[str] = field(default_factory=list)
    """Instances that failed with a tolerated error (they died during the push)."""

    @property
    def gbps(self) -> float:
        return self.num_bytes / self.seconds / 1e9 if self.seconds else float("nan")


def weights_nbytes(tensors: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors.values())


async def push_weights(instances: Sequence[Connection], version: int,
                       tensors: dict[str, torch.Tensor], *,
                       timeout_s: float,
                       tolerate: tuple[type[BaseException], ...] = ()) -> SyncReport:
    """Send `tensors` as `version` to every instance at once; return when all have loaded
    (each within `timeout_s`: the rollout section's request_timeout_s in a run).

    An instance whose request fails with one of `tolerate` (e.g. PeerDied: its replacement
    loads the served weights itself) is listed in the report's `skipped`; any other failure
    raises once every instance has answered."""
    if not instances:
        raise ValueError("push_weights needs at least one rollout instance")
    msg = WeightUpdate(version, tensors)
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
