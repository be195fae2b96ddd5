"""A rollout instance's connection faked for WeightSync (tests/test_weights.py,
tests/test_lora_units.py): it loads a WeightUpdate as the worker does; and small weights."""
from __future__ import annotations

import torch

from flexmarl.protocol import WeightTransfer, WeightUpdate, WeightUpdateDone
from flexmarl.weights.base import weights_nbytes


class FakeInstance:
    """A rollout instance's connection: loads a WeightUpdate as the worker does (a stale
    version refused unless forced), answers WeightTransfer phases; `fail` raises instead."""

    def __init__(self, address: str, fail: BaseException | None = None) -> None:
        self.address, self.fail = address, fail
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
            self.version, self.tensors = msg.version, msg.tensors
            return WeightUpdateDone(msg.version, weights_nbytes(msg.tensors), 0.01)
        assert isinstance(msg, WeightTransfer)
        return WeightUpdateDone(self.version, 0, 0.0)


def weights(value: float) -> dict[str, torch.Tensor]:
    return {"a.weight": torch.full((2, 2), value), "b.weight": torch.full((3,), value)}
