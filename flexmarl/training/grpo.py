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


def truncate(logits: Tensor, top_k: Tensor | None = None, top_p: Tensor | None = None) -> Tensor:
    """Rows of logits [N, V] with vLLM's top-k then top-p masks applied (-inf outside), as its
    sampler does (vllm.v1.sample.ops.topk_topp_sampler.apply_top_k_top_p_pytorch): top-k keeps
    every logit >= the k-th largest (ties kept); top-p then keeps, of the renormalised rest, the
    largest whose ascending cumulative probability exceeds 1 - p (at least one). Per row:
    top_k[n] = 0 and top_p[n] = 1 switch each off. The masks are decided on detached values, so
    gradients flow to the kept logits only."""
    want_k = top_k is not None and bool((top_k > 0).any())
    want_p = top_p is not None and bool((top_p < 1).any())
    if not (want_k or want_p):
        return logits
    sorted_, order = logits.detach().sort(dim=-1)
    vocab = logits.shape[-1]
    if want_k:
        k = top_k.to(torch.long).clamp(0, vocab)
        threshold = sorted_.gather(-1, (vocab - k.clamp(min=1)).unsqueeze(-1))
        threshold = torch.where((k > 0).unsqueeze(-1), threshold,
                                torch.full_like(threshold, float("-inf")))
        sorted_ = sorted_.masked_fill(sorted_ < threshold, float("-inf"))
    mask = torch.isinf(sorted_) & (sorted_ < 0)
    if want_p:
        cum = sorted_.softmax(dim=-1).cumsum(dim=-1)
        drop = cum <= (1 - top_p.to(cum.dtype)).unsqueeze(-1)
        drop[..., -1] = False
        mask = mask | drop
    return logits.masked_fill(torch.zeros_like(mask).scatter(-1, order, mask), float("-inf"))


def token_logprobs(logits: Tensor, input_ids: Tensor, temperature: float | Tensor = 1.0, *,
                   top_k: Tensor | None = None, top_p: Tensor | None = None) -> Tensor:
    """out[b, t] = log p(input_ids[b, t] | input_ids[b, :t]) under the distribution row b was
    sampled from: logits[b, t-1] / temperature[b], then row b's top-k and top-p truncation
    (`truncate`, vLLM's rules; top_k[b] = 0 and top_p[b] = 1 are off).

    Position 0 has no prediction and holds 0. The log-softmax runs in float32 at least, so bf16
    logits do not lose the small differences the importance ratio is made of. The sampling
    settings must be the ones each row was sampled with, or the ratio is biased from the start
    (a top_p of 0.5 scored without truncation gave a ratio of 0.5). `temperature` is one number
    or one per row; it must be > 0 (greedy rows are scored at 1, untruncated).
    """
    if logits.dim() != 3 or input_ids.shape != logits.shape[:2]:
        raise ValueError(f"logits must be [B, T, V] and input_ids [B, T]; got "
                         f"{tuple(logits.shape)} and {tuple(input_ids.shape)}")
    temps = torch.as_tensor(temperature, dtype=torch.float32, device=logits.device)
    if bool((temps <= 0).any()):
        raise ValueError(f"temperature must be > 0, got {temperature}")
    work_dtype = torch.promote_types(logits.dtype, torch.float32)
    shifted = logits[:, :-1].to(work_dtype)
    if temps.dim() == 0:
        if float(temps) != 1.0:
            shifted = shifted / temps
    else:
        shifted = shifted / temps.to(work_dtype).view(-1, 1, 1)
    if top_k is not None or top_p is not None:
        b, t, v = shifted.shape

        def per_position(x: Tensor | None) -> Tensor | None:
            return None if x is None else x.to(logits.device).repeat_interleave(t)
        shifted = truncate(shifted.reshape(b * t, v), per_position(top_k),
                           per_position(top_p)).view(b, t, v)
    logp = F.log_softmax(shifted, dim=-1)
    picked = logp.gather(-1, input_ids[:, 1:].unsqueeze(-1).long()).squeeze(-1)
    return F.pad(picked, (1, 0), value=0.0)


def token_entropy(logits: Tensor, temperature: float | Tensor = 1.0) -> Tensor:
    """out[b, t]: entropy (nats) of the untruncated distribution predicting position t, at the
    row's temperature; position 0 holds 0 (as in token_logprobs)."""
    temps = torch.as_tensor(temperature, dtype=torch.float32, device=logits.device)
    shifted = logits[:, :-1].detach().float()
    shifted = shifted / (temps.view(-1, 1, 1) if temps.dim() else temps)
    logp = F.log_softmax(shifted, dim=-1)
    return F.pad(-(logp.exp() * logp).sum(-1), (1, 0), value=0.0)


def grpo_loss(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, response_mask: Tensor,
              *, normaliser: float, clip_eps: float = 0.2, clip_eps_high: float | None = None,
              ref_logprobs: Tensor | None = None, kl_coef: float = 0.0,
              is_cap: float | None = None, kl_logprobs: Tensor | None = None
              ) -> tuple[Tensor, dict[str, float]]:
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
        # The KL term may score the policy differently from the ratio (kl_logprobs: without
        # top-k/top-p truncation, which can put a sampled token outside the reference's set).
        policy = logprobs if kl_logprobs is None else kl_logprobs
        ref_gap = torch.where(mask, ref_logprobs.to(logprobs.dtype) - policy, zero)
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
