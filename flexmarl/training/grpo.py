"""GRPO's trainer side as pure tensor functions: token log-probabilities and the loss.

No distributed code and no model here, so every formula is unit-tested on hand-made tensors
(tests/test_algorithms.py) and reused unchanged by the trainer, the simulator and benchmarks.
The advantages are computed where the groups complete (flexmarl.orchestrator.advantage) and
top-k/top-p truncation is shared with the rollout engines (flexmarl.sampling).

    logits[B,T,V], input_ids ──► token_logprobs ──► logprobs[B,T]
        (its core, next_token_logprobs, on aligned logits and targets: what the trainer runs
         a chunk of positions at a time, flexmarl.training.logits; token_entropy likewise)
    logprobs, old/ref logprobs, advantages, response_mask ──► grpo_loss ──► (loss, metrics)

Loss normalisation is a *fixed* token count per global batch (`normaliser`), not a per-call
mean: then the losses (and gradients) of micro-batches add up to exactly the full-batch loss,
which is what lets the training engine accumulate gradient micro-batch by micro-batch. Which
tokens count is the orchestrator's rule (flexmarl.orchestrator.batch.trains; grpo_loss says
the objective it gives).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from flexmarl.sampling import truncate  # also importable from here, where it used to live

Tensor = torch.Tensor


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
    temps = temperatures(temperature, logits.device)
    picked = next_token_logprobs(logits[:, :-1], input_ids[:, 1:], temps, top_k=top_k,
                                 top_p=top_p)
    return F.pad(picked, (1, 0), value=0.0)


def temperatures(temperature: float | Tensor, device: torch.device) -> Tensor:
    """`temperature` (one number or one per row) as a float32 tensor, checked > 0."""
    temps = torch.as_tensor(temperature, dtype=torch.float32, device=device)
    if bool((temps <= 0).any()):
        raise ValueError(f"temperature must be > 0, got {temperature}")
    return temps


def next_token_logprobs(logits: Tensor, targets: Tensor, temps: Tensor, *,
                        top_k: Tensor | None = None, top_p: Tensor | None = None) -> Tensor:
    """out[b, t] = log-probability of targets[b, t] under logits[b, t] (already aligned: the
    logits that predict it), scored as token_logprobs says; `temps` from `temperatures`. The
    core of token_logprobs, also run on a chunk of positions at a time
    (flexmarl.training.logits)."""
    work_dtype = torch.promote_types(logits.dtype, torch.float32)
    shifted = logits.to(work_dtype)
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
    return logp.gather(-1, targets.unsqueeze(-1).long()).squeeze(-1)


def token_entropy(logits: Tensor, temperature: float | Tensor = 1.0) -> Tensor:
    """out[b, t]: entropy (nats) of the untruncated distribution predicting position t, at the
    row's temperature; position 0 holds 0 (as in token_logprobs)."""
    temps = torch.as_tensor(temperature, dtype=torch.float32, device=logits.device)
    return F.pad(next_token_entropy(logits[:, :-1], temps), (1, 0), value=0.0)


def next_token_entropy(logits: Tensor, temps: Tensor) -> Tensor:
    """out[b, t]: entropy of the untruncated distribution of logits[b, t] / temps[b], detached
    (a metric); the core of token_entropy, also run a chunk at a time."""
    shifted = logits.detach().float()
    shifted = shifted / (temps.view(-1, 1, 1) if temps.dim() else temps)
    logp = F.log_softmax(shifted, dim=-1)
    return -(logp.exp() * logp).sum(-1)


def grpo_loss(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, response_mask: Tensor,
              *, normaliser: float, clip_eps: float = 0.2, clip_eps_high: float | None = None,
              ref_logprobs: Tensor | None = None, kl_coef: float = 0.0,
              is_cap: float | None = None, kl_logprobs: Tensor | None = None
              ) -> tuple[Tensor, dict[str, float]]:
    """PPO-style clipped GRPO objective, summed over response tokens and divided by `normaliser`.

    One global batch (one optimizer step) of an agent minimises

        J = sum over the response tokens t of its admitted groups of loss_t / N

    (loss_t the per-token loss below), where N (`normaliser`, the same in every micro-batch of
    the batch) is the response-token count of the groups that train
    (flexmarl.orchestrator.batch.trains). With kl_coef > 0 every admitted group trains, one
    whose advantages are all zero too (its tokens carry the KL term's gradient): J is the token
    mean over the whole batch. With kl_coef = 0 a group whose advantages are all zero has
    loss_t = 0 exactly and is not computed, and its tokens are not in N: J is the token mean
    over the groups with a learning signal. Full and LoRA trainers alike
    (tests/test_batch_objective.py).

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
