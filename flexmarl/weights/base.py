"""The one interface every weight-sync transport has, and what a sync reports.

    WeightSync.sync(agent, version, update)            (flexmarl.weights.sync)
      transfer = transport.begin(agent, version, the agent's instances)
      transfer.send(tensors)   staged: the exported tensors; direct: None (the trainer sends)
      transfer.finish()  ─► SyncReport          (on any failure: transfer.abort(), then raise)

A transport is either staged (`exports` True: the loop exports the trainer's tensors and they
pass through the run, flexmarl.weights.stage) or direct (`exports` False: the agent's trainer
sends them GPU to GPU, flexmarl.weights.direct); the loop only asks for "agent A at version v".
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch

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


class Transfer(Protocol):
    """One sync of one agent to one version, begun by its transport."""

    async def send(self, tensors: dict[str, torch.Tensor] | None) -> None:
        """The named tensors to every instance (None: the transport gets them itself)."""

    async def finish(self) -> SyncReport:
        """Every instance serves the version (or was skipped as dead): the report."""

    async def abort(self) -> None:
        """`send` failed: leave no instance in the middle of an update."""


class Transport(Protocol):
    exports: bool
    """True: `send` needs the trainer's exported tensors (they pass through the run); False:
    the trainer sends them itself and `send` gets None."""

    def begin(self, agent: str, version: int, instances: list[Connection]) -> Transfer:
        """A sync of `agent` to `version` on `instances` (the caller holds the agent's lock)."""

    async def fetch(self, agent: str) -> WeightUpdate:
        """The agent's weights where they live when they never came through the run (direct:
        its trainer), for an instance that joins the agent between syncs."""
