"""Group-relative (GRPO) advantages, computed by the experience store as each group completes.

    rewards, group ids ──► grpo_advantages ──► advantages[N] (one per sequence)

Pure torch, no state: the store (flexmarl.orchestrator.store) calls it per completed group and
the trainer only ever sees the result; the loss that uses it is flexmarl.training.grpo's.
"""
from __future__ import annotations

from typing import Sequence

import torch

Tensor = torch.Tensor


def grpo_advantages(rewards: Tensor, group_ids: Sequence | Tensor, *, eps: float = 1e-6,
                    scale: bool = True) -> Tensor:
    """Group-relative advantages: (r - mean of its group) / (std of its group + eps).

    `group_ids[i]` names the group of `rewards[i]` (same task, same agent, same turn); ids may be
    any hashable values and groups need not be contiguous. The std is the *population* std
    (divide by n, as `torch.std(unbiased=False)`): it is defined for every group of size >= 1, and
    a group of identical rewards gets advantage 0 whatever its size. Groups of one sample carry no
    relative signal and get 0. `scale=False` returns r - mean (Dr. GRPO's unscaled variant).
    """
    rewards = torch.as_tensor(rewards)
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D [N], got shape {tuple(rewards.shape)}")
    ids = group_ids.tolist() if isinstance(group_ids, Tensor) else list(group_ids)
    if len(ids) != rewards.numel():
        raise ValueError(f"group_ids has {len(ids)} entries but rewards has {rewards.numel()}")
    if eps < 0:
        raise ValueError(f"eps must be >= 0, got {eps}")
    r = rewards.to(torch.float64)  # group statistics in double: exact zeros for equal rewards
    index: dict = {}
    inverse = torch.tensor([index.setdefault(g, len(index)) for g in ids], dtype=torch.long)
    num_groups = len(index)
    count = torch.zeros(num_groups, dtype=r.dtype).index_add_(0, inverse, torch.ones_like(r))
    mean = torch.zeros(num_groups, dtype=r.dtype).index_add_(0, inverse, r) / count
    centred = r - mean[inverse]
    adv = centred
    if scale:
        var = torch.zeros(num_groups, dtype=r.dtype).index_add_(0, inverse, centred**2) / count
        std = var.sqrt()[inverse]
        # A constant group has centred == 0 exactly (double): keep it 0, not 0/0, when eps is 0.
        adv = torch.where(std > 0, centred / (std + eps), torch.zeros_like(centred))
    adv = torch.where(count[inverse] > 1, adv, torch.zeros_like(adv))
    out_dtype = rewards.dtype if rewards.is_floating_point() else torch.float32
    return adv.to(out_dtype)
