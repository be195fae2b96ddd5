"""The policy's forward over a micro-batch, computing what its rows share once.

    rows [prompt | response | padding]  ─► shared_prefix: leading tokens every row has
        ─► the prefix once (one row; its KV cache kept with its graph)
        ─► the rest of every row against that cache ─► final hidden states from the position
           before the first response token only (flexmarl.training.logits applies the LM head
           to them a chunk at a time: no logits of a prompt position are ever made)

A GRPO group's rows share their whole prompt (one group per micro-batch, the default
pipeline.micro_batch_groups), so the prompt costs one row instead of one per sample: training a
step of SmolLM2 samples took 3.9 instead of 9.7 CPU-s (bench/README.md, "peers.py"). The
log-probabilities equal the full forward's up to float rounding (tests/test_trainer.py).
"""
from __future__ import annotations

import torch
from torch import nn

from flexmarl.protocol import TrainMicroBatch
from flexmarl.training.logits import Hidden, final_hidden

MIN_SHARED_PREFIX = 8
"""A micro-batch whose rows share at least this many leading tokens computes them once."""


def shared_prefix(mb: TrainMicroBatch, *, checkpointing: bool = False) -> int:
    """Leading tokens every row of `mb` shares (a GRPO group's prompt, or a workflow's system
    message), up to the position before the first response token; 0 when too short to pay or
    where computing it once cannot be used: with activation checkpointing (`checkpointing`) a
    recomputed block would write the prefix's cache again."""
    ids, mask = mb.input_ids, mb.attention_mask
    if ids.shape[0] < 2 or checkpointing or not bool(mb.response_mask.any()):
        return 0
    first_response = int(mb.response_mask.float().argmax(1)[mb.response_mask.any(1)].min())
    same = (ids == ids[:1]).all(0) & (mask > 0).all(0)
    shared = min(int(same.long().cumprod(0).sum()), first_response - 1)
    return shared if shared >= MIN_SHARED_PREFIX else 0


def policy_hidden(model: nn.Module, rows: dict[str, torch.Tensor], shared: int
                  ) -> tuple[Hidden, int]:
    """The model's final hidden states of positions start..T-1 of every row (with its LM head,
    to score them a chunk at a time: flexmarl.training.logits.score_tokens), and `start` (the
    position before the rows' first response token, at least `shared`). With `shared` > 0 the
    first `shared` tokens (the same in every row) run once, and the rest of every row attends
    to their KV cache. The policy's forward and, under no_grad, the KL reference's."""
    ids, mask, response = rows["input_ids"], rows["attention_mask"], rows["response_mask"]
    start = (int(response.float().argmax(1)[response.any(1)].min()) - 1
             if bool(response.any()) else ids.shape[1] - 1)
    start = max(start, shared, 0)
    keep = ids.shape[1] - start
    if not shared:
        hidden = final_hidden(model, input_ids=ids, attention_mask=mask, use_cache=False,
                              logits_to_keep=keep)
        return hidden, start
    head = final_hidden(model, input_ids=ids[:1, :shared], use_cache=True, logits_to_keep=1)
    cache = head.output.past_key_values
    cache.batch_repeat_interleave(ids.shape[0])
    hidden = final_hidden(model, input_ids=ids[:, shared:], attention_mask=mask,
                          past_key_values=cache, use_cache=True, logits_to_keep=keep)
    # The prefix's gradient flows through its KV cache only; FSDP2 gathers a block's
    # parameters for backward when its *output* gets a gradient, which the prefix's last
    # blocks would never get: the prefix forward's anchor (0 times its own output, the head
    # of its last position) gives every block's output one, adding exactly 0.
    if head.anchor is not None:
        hidden.anchor = head.anchor + hidden.anchor
    return hidden, start
