"""A rollout instance's connection faked for WeightSync (tests/test_weights.py,
tests/test_lora_units.py): it loads a WeightUpdate as the worker does (a published source
read from its file); small weights, published as a trainer does."""
from __future__ import annotations

import torch

from flexmarl.protocol import WeightTransfer, WeightUpdate, WeightUpdateDone
from flexmarl.weights import published
from flexmarl.weights.base import weights_nbytes

RUN = published.run_name()
"""The tests' run name for their published weights (under FLEXMARL_WEIGHTS_DIR, set by the
tests that publish)."""


class FakeInstance:
    """A rollout instance's connection: loads a WeightUpdate as the worker does (a stale
    version refused unless forced), answers WeightTransfer phases; `fail` raises instead."""

    def __init__(self, address: str, fail: BaseException | None = None,
                 held: dict | None = None) -> None:
        """`held`: the file of a loaded version it reports to serve (WeightUpdateDone.held)."""
        self.address, self.fail, self.held = address, fail, held
        self.version = 0
        self.tensors: dict[str, torch.Tensor] = {}
        self.got: list = []

    async def request(self, msg, *, timeout_s=None, control=False):
        self.got.append(msg)
        if self.fail is not None:
            raise self.fail
        if isinstance(msg, WeightUpdate):
            if msg.version <= self.version and not msg.force:
                raise ValueError(f"stale weight update {msg.version}")
            tensors = msg.tensors
            if msg.source is not None:
                tensors = await published.read(msg.source, self.fetch)
            # Loaded in place, as the engines do: a partial update keeps the other tensors.
            self.version, self.tensors = msg.version, {**self.tensors, **tensors}
            return WeightUpdateDone(msg.version, weights_nbytes(tensors), 0.01, self.held)
        assert isinstance(msg, WeightTransfer)
        return WeightUpdateDone(self.version, 0, 0.0)


    async def fetch(self, source):
        raise AssertionError(f"{self.address} fetched {source}: the tests publish on this host")


def publish(version: int, tensors: dict[str, torch.Tensor], *, agent: str = "x",
            complete: bool = True, adapter: str | None = None, lora: dict | None = None
            ) -> WeightUpdate:
    """`tensors` as a trainer's rank 0 exports them published (TrainerWorker.on_export)."""
    source = published.publish(tensors, RUN, agent, version, "inproc://no-trainer")
    return WeightUpdate(version, {}, complete=complete, adapter=adapter, lora=lora,
                        source=source)


def weights(value: float) -> dict[str, torch.Tensor]:
    return {"a.weight": torch.full((2, 2), value), "b.weight": torch.full((3,), value)}
