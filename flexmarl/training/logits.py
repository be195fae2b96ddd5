"""Token log-probabilities from the policy's final hidden states, a chunk of positions at a time:
the trainer never holds full-vocabulary logits of a prompt position, nor of a whole micro-batch.

    final_hidden: model(...) with its LM head swapped out for the forward
        ─► Hidden: states [B, T', H] (what the head would have been given; the prompt already
           cut off by logits_to_keep), the head, an anchor for FSDP2's hooks
    score_tokens: chunks of at most chunk_tokens positions (rows x positions)
        ┌──────────────┐  head ─► softcap ─► float32 logits [b, t, V] ─► logprobs (the rows'
        │ chunk 1 2 .. │  sampling settings), plain logprobs (the KL's), entropy (detached)
        └──────────────┘  each under torch.utils.checkpoint: backward recomputes one chunk's
                          logits at a time
        ─► [B, T] per position (0 before `start` and at it, as token_logprobs)

Peak logits memory is O(chunk_tokens x V) instead of O(rows x T x V): a 262,144-token
vocabulary (Gemma 3) costs 1 MiB of float32 per position and per copy, and scoring makes
several copies (temperature, top-k/top-p, log-softmax, entropy, the KL's untruncated scoring).
The maths is flexmarl.training.grpo's (next_token_logprobs, next_token_entropy), so the numbers
are those of token_logprobs on whole logits (tests/test_chunked_logits.py). The price is the
checkpoint's: backward redoes each chunk's head, truncation and log-softmax (not its entropy,
computed last and without autograd, which the recomputation stops short of).

What a model's forward does to its head's output is reproduced from its config
(final_logit_softcapping, Gemma 2 style); the forward's own result on one position (the probe)
is compared with ours every time, so an architecture doing anything else is refused by name
rather than trained on wrong log-probabilities (a safety net: a step that barely changes the
probe's logits, e.g. a cap far above them, passes unseen).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from flexmarl.training.grpo import next_token_entropy, next_token_logprobs, temperatures

Tensor = torch.Tensor

PROBE_RTOL, PROBE_ATOL = 1e-3, 1e-5
"""How close the forward's own logits of the probe position must be to ours: both come from
the same head output through the same operations, so any real difference is a step we miss."""


@dataclass(frozen=True)
class Head:
    """A model's LM head applied outside its forward, with what the forward does after it."""

    module: nn.Module
    softcap: float | None = None
    """config.final_logit_softcapping: logits = tanh(logits / cap) * cap."""

    def __call__(self, hidden: Tensor) -> Tensor:
        return self.finish(self.module(hidden))

    def finish(self, logits: Tensor) -> Tensor:
        """The head's output as the forward returns it, in its dtype (as the forward does it,
        so bf16 logits round as they did there)."""
        if self.softcap is None:
            return logits
        return torch.tanh(logits / self.softcap) * self.softcap


@dataclass
class Hidden:
    """What one forward left for scoring: the final hidden states of the kept positions, the
    head to apply to them, and `anchor`, 0 times the forward's own (one-position) output: added
    to the log-probabilities it adds exactly 0 but gives that output a gradient, which is what
    FSDP2's pre-backward hooks on a module's output wait for (None without autograd)."""

    states: Tensor
    head: Head
    anchor: Tensor | None
    output: Any
    """The model's output (its past_key_values); its logits are the probe's only."""


@dataclass
class Scores:
    """Per-position results [B, T], 0 before and at `start` (see score_tokens)."""

    logprobs: Tensor
    plain: Tensor | None = None
    entropy: Tensor | None = None


class _Capture(nn.Module):
    """Stands in for the LM head during one forward: keeps the hidden states it is given and
    returns the real head's logits of one position (row 0's last: the probe), so what the
    forward then does to logits costs nothing and can be checked."""

    def __init__(self, head: nn.Module) -> None:
        super().__init__()
        self.head = [head]  # in a list: not a submodule (no second path to its parameters)
        self.hidden: Tensor | None = None
        self.probe: Tensor | None = None

    def forward(self, hidden: Tensor) -> Tensor:
        self.hidden = hidden
        self.probe = self.head[0](hidden[:1, -1:])
        return self.probe


def head_owner(model: nn.Module) -> nn.Module:
    """The Hugging Face model that holds the LM head: the one inside a PeftModel (trainer.lora),
    else `model` itself (FSDP2 keeps the module tree as it was)."""
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model


def final_hidden(model: nn.Module, **inputs: Any) -> Hidden:
    """`model(**inputs)` without its LM head: the final hidden states it would have applied the
    head to (logits_to_keep applies). Run through `model` itself, so FSDP2's root hooks gather
    the root's parameters (the head's among them) and keep them gathered after the forward
    (the root is never resharded after forward: flexmarl.training.sharding); PEFT's layers and
    torch.autocast act as in a plain forward."""
    owner = head_owner(model)
    head = owner.get_output_embeddings()
    if head is None:
        raise ValueError(f"{type(owner).__name__} has no output embeddings "
                         "(get_output_embeddings() is None): the trainer scores tokens with a "
                         "causal LM's head; use a *ForCausalLM model")
    capture = _Capture(head)
    owner.set_output_embeddings(capture)
    try:
        output = model(**inputs)
    finally:
        owner.set_output_embeddings(head)
    if capture.probe is None:
        raise ValueError(f"{type(owner).__name__}'s forward never calls its output embeddings "
                         "module (get_output_embeddings()), so its tokens cannot be scored from "
                         "hidden states by flexmarl.training.logits; use a *ForCausalLM model "
                         "whose forward applies its LM head")
    cap = getattr(owner.config, "final_logit_softcapping", None)
    scorer = Head(head, float(cap) if cap else None)
    _check_probe(owner, scorer.finish(capture.probe), output.logits)
    anchor = 0.0 * output.logits.float().sum() if output.logits.requires_grad else None
    return Hidden(capture.hidden, scorer, anchor, output)


def _check_probe(owner: nn.Module, ours: Tensor, theirs: Tensor) -> None:
    """Refuse a model whose forward does to its head's output what Head.finish does not."""
    with torch.no_grad():
        ours, theirs = ours.detach().float(), theirs.detach().float()
        same = ours.shape == theirs.shape and torch.allclose(
            ours, theirs, rtol=PROBE_RTOL, atol=PROBE_ATOL, equal_nan=True)
    if not same:
        raise ValueError(
            f"{type(owner).__name__}'s forward changes its LM head's output in a way "
            "flexmarl.training.logits.Head does not reproduce (it applies "
            "config.final_logit_softcapping only), so its tokens cannot be scored from hidden "
            "states: add that step to Head.finish")


def score_tokens(hidden: Hidden, input_ids: Tensor, temperature: float | Tensor = 1.0, *,
                 top_k: Tensor | None = None, top_p: Tensor | None = None, start: int = 0,
                 chunk_tokens: int, plain: bool = False, entropy: bool = False) -> Scores:
    """Scores of input_ids [B, T] from `hidden`, whose states are positions start..T-1: what
    token_logprobs (and token_entropy) would give on the logits of those positions, padded
    with 0 before `start`. `plain`: also the log-probabilities at the temperature alone,
    untruncated (the KL's); `entropy`: also each position's entropy (detached, a metric).

    Positions go a chunk at a time, at most `chunk_tokens` of them (rows x positions); under
    autograd each chunk runs under non-reentrant torch.utils.checkpoint, so backward, too,
    holds one chunk's logits at a time."""
    states = hidden.states
    rows, width = states.shape[:2]
    ids = input_ids[:, start:]
    if ids.shape != (rows, width) or chunk_tokens < 1:
        raise ValueError(f"score_tokens: input_ids[:, start:] must be {(rows, width)} (the "
                         f"hidden states' rows and positions), got {tuple(ids.shape)}; "
                         f"chunk_tokens ({chunk_tokens}) must be >= 1")
    temps = temperatures(temperature, states.device)
    block = min(rows, chunk_tokens)  # rows per chunk, then positions per chunk
    span = max(1, chunk_tokens // block)
    per_block = []
    for r in range(0, rows, block):
        pick = slice(r, r + block)
        settings = [temps[pick] if temps.dim() else temps,
                    None if top_k is None else top_k[pick], None if top_p is None else top_p[pick]]
        run = functools.partial(_score_chunk, hidden.head, *settings, plain, entropy)
        # Logits at position j predict token j + 1: the last position predicts nothing.
        bounds = [(a, min(a + span, width - 1)) for a in range(0, width - 1, span)]
        per_block.append([_run(run, states[pick, a:b], ids[pick, a + 1:b + 1])
                          for a, b in bounds])
    out = [_join(per_block, k, rows, states) if wanted else None
           for k, wanted in enumerate((True, plain, entropy))]
    if hidden.anchor is not None:
        out[0] = out[0] + hidden.anchor
    # Position `start` has no prediction among these (as position 0 in token_logprobs).
    out = [None if x is None else F.pad(x, (start + 1, 0), value=0.0) for x in out]
    return Scores(*out)


def _run(run: functools.partial, states: Tensor, targets: Tensor) -> tuple:
    if not torch.is_grad_enabled():
        return run(states, targets)
    return checkpoint(run, states, targets, use_reentrant=False)


def _score_chunk(head: Head, temps: Tensor, top_k: Tensor | None, top_p: Tensor | None,
                 plain: bool, entropy: bool, states: Tensor, targets: Tensor
                 ) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """One chunk's logits and what is scored from them. The entropy (no gradient) comes last:
    a checkpoint's recomputation stops once it has what backward needs, so never redoes it."""
    logits = head(states).float()
    # The head ran under the caller's autocast, as in the forward; the scoring is float32.
    with torch.autocast(logits.device.type, enabled=False):
        logprobs = next_token_logprobs(logits, targets, temps, top_k=top_k, top_p=top_p)
        kl = next_token_logprobs(logits, targets, temps) if plain else None
        with torch.no_grad():
            ent = next_token_entropy(logits, temps) if entropy else None
    return logprobs, kl, ent


def _join(per_block: list[list[tuple]], k: int, rows: int, like: Tensor) -> Tensor:
    """Output k of every chunk, back into one [rows, width - 1] tensor."""
    if not per_block[0]:  # one position only: nothing is predicted
        return like.new_zeros(rows, 0, dtype=torch.float32)
    return torch.cat([torch.cat([c[k] for c in chunks], dim=1) for chunks in per_block])
