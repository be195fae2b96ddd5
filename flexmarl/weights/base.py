"""The one interface every weight-sync transport has, and what a sync reports.

    WeightSync.sync(agent, version, update)            (flexmarl.weights.sync)
      transfer = transport.begin(agent, version, the agent's instances)
      transfer.send(update)    staged: the trainer's published export; direct: None (it sends)
      transfer.finish()  ─► SyncReport          (on any failure: transfer.abort(), then raise)

A transport is either staged (`exports` True: the loop has the trainer publish the version on
its host and the instances read it there, flexmarl.weights.stage and .published) or direct
(`exports` False: the agent's trainer sends it GPU to GPU, flexmarl.weights.direct); the loop
only asks for "agent A at version v". Neither passes a tensor through the run.
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
    held: list[dict] = field(default_factory=list)
    """Instances that now serve the version to others ({host, path, address}: a file of it on
    their host; WeightUpdateDone.held), which the run adds to its source's copies."""

    @property
    def gbps(self) -> float:
        return self.num_bytes / self.seconds / 1e9 if self.seconds else float("nan")


def weights_nbytes(tensors: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors.values())


class Transfer(Protocol):
    """One sync of one agent to one version, begun by its transport."""

    async def send(self, update: WeightUpdate | None) -> None:
        """The version to every instance: the trainer's published export (its source), or
        None where the transport gets the weights itself."""

    async def finish(self) -> SyncReport:
        """Every instance serves the version (or was skipped as dead): the report."""

    async def abort(self) -> None:
        """`send` failed: leave no instance in the middle of an update."""


class Transport(Protocol):
    exports: bool
    """True: `send` needs the trainer's published export (the file's name passes through the
    run, never the tensors); False: the trainer sends them itself and `send` gets None."""

    def begin(self, agent: str, version: int, instances: list[Connection]) -> Transfer:
        """A sync of `agent` to `version` on `instances` (the caller holds the agent's lock)."""

    async def fetch(self, agent: str) -> WeightUpdate:
        """The served version published by its trainer where the run has no source of it
        (direct), for an instance that joins the agent between syncs."""
