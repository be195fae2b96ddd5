"""GRPO as pure tensor functions: group-relative advantages, token log-probabilities, the loss.

No distributed code and no model here, so every formula is unit-tested on hand-made tensors
(tests/test_algorithms.py) and reused unchanged by the trainer, the simulator and benchmarks.

    rewards, group ids ──► grpo_advantages ──► advantages[N] (one per sequence)
    logits[B,T,V], input_ids ──► token_logprobs ──► logprobs[B,T]
    logprobs, old/ref logprobs, advantages, response_mask ──► grpo_loss ──► (loss, metrics)

Loss normalisation is a *fixed* token count per global batch (`normaliser`), not a per-call
mean: then the losses (and gradients) of micro-batches add up to exactly the full-batch loss,
which is what lets the training engine accumulate gradient micro-batch by micro-batch.
"""
from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F

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


def token_logprobs(logits: Tensor, input_ids: Tensor, temperature: float = 1.0) -> Tensor:
    """out[b, t] = log p(input_ids[b, t] | input_ids[b, :t]) from logits[b, t-1] / temperature.

    Position 0 has no prediction and holds 0. The log-softmax runs in float32 at least, so bf16
    logits do not lose the small differences the importance ratio is made of. `temperature` must
    match the one the behaviour policy sampled with, or the ratio is biased from the start.
    """
    if logits.dim() != 3 or input_ids.shape != logits.shape[:2]:
        raise ValueError(f"logits must be [B, T, V] and input_ids [B, T]; got "
                         f"{tuple(logits.shape)} and {tuple(input_ids.shape)}")
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    work_dtype = torch.promote_types(logits.dtype, torch.float32)
    shifted = logits[:, :-1].to(work_dtype)
    if temperature != 1.0:
        shifted = shifted / temperature
    logp = F.log_softmax(shifted, dim=-1)
    picked = logp.gather(-1, input_ids[:, 1:].unsqueeze(-1).long()).squeeze(-1)
    return F.pad(picked, (1, 0), value=0.0)


def grpo_loss(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, response_mask: Tensor,
              *, normaliser: float, clip_eps: float = 0.2, clip_eps_high: float | None = None,
              ref_logprobs: Tensor | None = None, kl_coef: float = 0.0,
              is_cap: float | None = None) -> tuple[Tensor, dict[str, float]]:
    """PPO-style clipped GRPO objective, summed over response tokens and divided by `normaliser`.

    Per token: max(-A * ratio, -A * clip(ratio, 1 - clip_eps, 1 + clip_eps_high)) with
    ratio = exp(logprobs - old_logprobs) and A = advantages[b]; plus kl_coef * k3, the unbiased
    non-negative KL estimator exp(ref - logp) - (ref - logp) - 1 (Schulman), when kl_coef > 0.
    `clip_eps_high` (default clip_eps) allows DAPO's asymmetric "clip higher".

    `is_cap` switches to the decoupled objective for stale samples (behaviour policy older than
    the one being trained): the PPO ratio is then taken against the *current* policy (detached,
    the proximal policy of a single update) and each token is weighted by the truncated
    importance ratio min(pi_current / pi_behaviour, is_cap), a constant: so the gradient is that
    of -A * w * log pi, corrected for the behaviour policy's age instead of clipped to nothing.

    Tokens outside `response_mask` contribute exactly 0 to the loss and the gradient, even when
    old/ref log-probabilities there are garbage (inf, nan): they are replaced before any exp.
    Metrics are means over this call's masked tokens: clip_frac, ratio_mean, kl, and num_tokens
    (with is_cap also is_weight_mean and is_truncated_frac).
    """
    if normaliser <= 0:
        raise ValueError(f"normaliser must be > 0 (the global batch's response-token count), "
                         f"got {normaliser}")
    if clip_eps <= 0 or (clip_eps_high is not None and clip_eps_high <= 0):
        raise ValueError(f"clip_eps and clip_eps_high must be > 0, got {clip_eps}, {clip_eps_high}")
    if kl_coef > 0 and ref_logprobs is None:
        raise ValueError("kl_coef > 0 needs ref_logprobs (log-probabilities under the reference "
                         "policy); pass them or set kl_coef=0")
    if old_logprobs.shape != logprobs.shape or response_mask.shape != logprobs.shape:
        raise ValueError(f"logprobs, old_logprobs and response_mask must share one shape [B, T]; "
                         f"got {tuple(logprobs.shape)}, {tuple(old_logprobs.shape)}, "
                         f"{tuple(response_mask.shape)}")
    if advantages.shape != logprobs.shape[:1]:
        raise ValueError(f"advantages must be [B]={tuple(logprobs.shape[:1])}, got "
                         f"{tuple(advantages.shape)}")
    if is_cap is not None and is_cap <= 0:
        raise ValueError(f"is_cap must be > 0 (or None for no behaviour correction), got {is_cap}")
    high = clip_eps if clip_eps_high is None else clip_eps_high
    mask = response_mask.bool()
    zero = torch.zeros((), dtype=logprobs.dtype, device=logprobs.device)
    behaviour = torch.where(mask, old_logprobs.to(logprobs.dtype), zero)
    anchor = behaviour if is_cap is None else torch.where(mask, logprobs.detach(), zero)
    log_ratio = torch.where(mask, logprobs - anchor, zero)
    ratio = torch.exp(log_ratio)
    adv = advantages.to(logprobs.dtype).unsqueeze(-1)
    unclipped = -adv * ratio
    clipped = -adv * torch.clamp(ratio, 1.0 - clip_eps, 1.0 + high)
    per_token = torch.maximum(unclipped, clipped)
    is_weight = None
    if is_cap is not None:
        with torch.no_grad():
            is_weight = torch.exp(torch.where(mask, logprobs.detach() - behaviour, zero))
            truncated = (is_weight > is_cap) & mask
            is_weight = is_weight.clamp(max=is_cap)
        per_token = per_token * is_weight
    kl = None
    if ref_logprobs is not None:
        ref_gap = torch.where(mask, ref_logprobs.to(logprobs.dtype) - logprobs, zero)
        kl = torch.exp(ref_gap) - ref_gap - 1.0
        if kl_coef > 0:
            per_token = per_token + kl_coef * kl
    loss = torch.where(mask, per_token, zero).sum() / normaliser

    with torch.no_grad():
        num_tokens = int(mask.sum())
        denom = max(num_tokens, 1)
        metrics = {
            "clip_frac": float(((clipped > unclipped) & mask).sum()) / denom,
            "ratio_mean": float(torch.where(mask, ratio, zero).sum()) / denom,
            "kl": float(torch.where(mask, kl, zero).sum()) / denom if kl is not None else 0.0,
            "num_tokens": float(num_tokens),
        }
        if is_weight is not None:
            metrics["is_weight_mean"] = float(torch.where(mask, is_weight, zero).sum()) / denom
            metrics["is_truncated_frac"] = float(truncated.sum()) / denom
    return loss, metrics
