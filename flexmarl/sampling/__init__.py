"""Sampling maths shared by the rollout engines and the trainer (a leaf both may import).

    truncate(logits, top_k, top_p) ──► logits with vLLM's top-k then top-p masks applied

The plain-PyTorch engine samples from the truncated distribution (flexmarl.rollout.torch_engine)
and the trainer scores each token under the same one (flexmarl.training.grpo.token_logprobs), so
the importance ratio compares like with like.
"""
from __future__ import annotations

import torch

Tensor = torch.Tensor


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
