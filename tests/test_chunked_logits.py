"""Scoring from hidden states a chunk at a time (flexmarl.training.logits) gives the numbers of
the whole-logits computation it replaced, and never holds more than a chunk's logits.

The whole-logits path is written out here as the trainer had it: the model's logits of every
position, token_logprobs / token_entropy on them, the KL reference's logits of every position.
Models are built here: a tiny Qwen2 with tied embeddings and a tiny Gemma 3 (untied, with
final_logit_softcapping; its head scaled so the cap bends the logits visibly), vocabulary 1000.

Tolerances. Both paths run the same float32 operations on the same numbers; only the LM head's
matmul is cut into other shapes (positions start.. and chunks instead of all), which changes
its last bits: log-probabilities and entropies are compared within LOGPROB_ATOL, gradients of
the GRPO loss within GRAD_RTOL of each tensor's norm.
"""
from __future__ import annotations

import contextlib

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from flexmarl.config.training import TrainerConfig
from flexmarl.protocol import TrainMicroBatch
from flexmarl.team import LoraSpec
from flexmarl.training.adapter import base_only
from flexmarl.training.grpo import grpo_loss, token_entropy, token_logprobs
from flexmarl.training.logits import Head, Hidden, final_hidden, score_tokens
from flexmarl.training.trainer import GRPOTrainer

VOCAB = 1000
LOGPROB_ATOL = 1e-5
"""Log-probabilities, plain (KL) log-probabilities, entropies: chunked vs whole logits."""
GRAD_RTOL = 1e-5
"""|grad_chunked - grad_whole| / |grad_whole| (L2 norms) per trained tensor."""
CHUNK = 7
"""trainer.logits_chunk_tokens in these tests: a chunk is 1 row x 7 positions, or 7 rows."""
SAMPLING = torch.tensor([[0.7, 0, 1.0], [1.0, 900, 1.0], [1.3, 0, 0.95], [0.9, 800, 0.9]])
"""Each row's temperature, top_k and top_p: truncated rows keep most of a near-uniform
vocabulary, so most random tokens stay scoreable (the others score -inf in both paths)."""
LORA = LoraSpec(rank=4, alpha=8.0, target_modules=("q_proj", "v_proj", "down_proj")).as_dict()


# ----------------------------------------------------------------------------- models, batches

@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory) -> dict[str, str]:
    import transformers

    torch.manual_seed(4321)
    qwen = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, intermediate_size=64, max_position_embeddings=128,
        tie_word_embeddings=True))
    gemma = transformers.Gemma3ForCausalLM(transformers.Gemma3TextConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=128,
        final_logit_softcapping=2.0, tie_word_embeddings=False, sliding_window=6,
        layer_types=["sliding_attention", "full_attention"]))
    with torch.no_grad():  # logits of a few units: the cap of 2 bends them
        gemma.lm_head.weight.mul_(40.0)
    out = {}
    for name, model in (("qwen2-tied", qwen), ("gemma3-softcap", gemma)):
        path = tmp_path_factory.mktemp(name)
        model.save_pretrained(path)
        out[name] = str(path)
    return out


def micro_batch(shared_prompt: bool, rows: int = 4, width: int = 18, prompt: int = 10,
                seed: int = 0) -> TrainMicroBatch:
    """`rows` rows of one prompt (shared) or each its own, responses of 3.. tokens right-padded,
    each row sampled with SAMPLING's settings; no ref_logprobs (the trainer scores its own)."""
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(prompt + 3, width + 1, (rows,), generator=g)
    pos = torch.arange(width)
    attn = (pos < lens[:, None]).long()
    ids = torch.randint(1, VOCAB, (rows, width), generator=g)
    if shared_prompt:
        ids[:, :prompt] = ids[0, :prompt]
    ids = ids * attn
    resp = ((pos >= prompt) & (pos < lens[:, None])).long()
    old = -7.0 + 0.3 * torch.randn(rows, width, generator=g)  # near log(1/1000): ratios ~ 1
    return TrainMicroBatch(ids, attn, resp, old, torch.randn(rows, generator=g),
                           sampling=SAMPLING[torch.arange(rows) % len(SAMPLING)])


def trainer_for(model_dir: str, lora: bool, **overrides) -> GRPOTrainer:
    config = dict(lr=1e-3, kl_coef=0.05, logits_chunk_tokens=CHUNK, seed=0,
                  lora=LORA if lora else None) | overrides
    trainer = GRPOTrainer(model_dir, TrainerConfig(**config))
    if lora:  # PEFT starts B at 0 (the adapter a no-op): give it some effect
        g = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for name, p in trainer.model.named_parameters():
                if "lora_B" in name:
                    p.copy_(0.2 * torch.randn(p.shape, generator=g))
    return trainer


def whole_logits_path(trainer: GRPOTrainer, mb: TrainMicroBatch, normaliser: float) -> dict:
    """The trainer's computation before chunking: every position's logits, backward included."""
    model, ids, attn = trainer.model, mb.input_ids, mb.attention_mask
    temps, top_k, top_p = mb.sampling[:, 0], mb.sampling[:, 1].round().long(), mb.sampling[:, 2]
    logits = model(input_ids=ids, attention_mask=attn, use_cache=False).logits.float()
    logprobs = token_logprobs(logits, ids, temps, top_k=top_k, top_p=top_p)
    plain = token_logprobs(logits, ids, temps)
    reference, base = trainer.reference, contextlib.nullcontext()
    if trainer.config.lora is not None:
        reference, base = model, base_only(model)
    with torch.no_grad(), base:
        ref = token_logprobs(reference(input_ids=ids, attention_mask=attn,
                                       use_cache=False).logits.float(), ids, temps)
    c = trainer.config
    loss, metrics = grpo_loss(logprobs, mb.old_logprobs, mb.advantages, mb.response_mask,
                              normaliser=normaliser, clip_eps=c.clip_eps, ref_logprobs=ref,
                              kl_coef=c.kl_coef, kl_logprobs=plain)
    loss.backward()
    mask = mb.response_mask.bool()
    return {"logprobs": logprobs.detach(), "plain": plain.detach(), "ref": ref,
            "entropy": token_entropy(logits, temps), "loss": loss.item(),
            "kl": metrics["kl"], "entropy_mean": token_entropy(logits, temps)[mask].mean().item()}


def assert_close_where_scored(ours: torch.Tensor, theirs: torch.Tensor, mask: torch.Tensor):
    """Equal within LOGPROB_ATOL at the response positions; -inf (truncated away) in both."""
    ours, theirs = ours[mask], theirs[mask]
    assert torch.equal(torch.isinf(ours), torch.isinf(theirs))
    finite = torch.isfinite(theirs)
    assert finite.any()
    assert (ours[finite] - theirs[finite]).abs().max().item() <= LOGPROB_ATOL


def grads(trainer: GRPOTrainer) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None}


# ----------------------------------------------------------------------------- the function

@pytest.mark.parametrize("softcap", [None, 2.0])
@pytest.mark.parametrize("chunk", [1, 2, 5, 13, 100])
def test_score_tokens_equals_token_logprobs_on_whole_logits(softcap, chunk):
    """Rows x positions cut every way (a chunk smaller than the rows, one row, several),
    per-row temperature, top-k and top-p, a start past the prompt: the same numbers and
    gradients as token_logprobs / token_entropy on the whole logits."""
    torch.manual_seed(0)
    rows, width, start, dim = 5, 9, 3, 8
    head = Head(torch.nn.Linear(dim, 50, bias=False), softcap)
    states = (3 * torch.randn(rows, width - start, dim)).requires_grad_()
    ids = torch.randint(0, 50, (rows, width))
    settings = dict(top_k=torch.tensor([0, 5, 3, 0, 40]),
                    top_p=torch.tensor([0.9, 1.0, 0.5, 1.0, 0.8]))
    temps = torch.tensor([0.7, 1.0, 1.3, 2.0, 0.5])
    ours = score_tokens(Hidden(states, head, None, None), ids, temps, **settings, start=start,
                        chunk_tokens=chunk, plain=True, entropy=True)
    logits = head(states)
    whole = token_logprobs(logits, ids[:, start:], temps, **settings)
    plain = token_logprobs(logits, ids[:, start:], temps)
    for got, want in ((ours.logprobs, whole), (ours.plain, plain),
                      (ours.entropy, token_entropy(logits, temps))):
        assert got.shape == (rows, width) and not got[:, :start + 1].any()
        assert_close_where_scored(got[:, start:], want, torch.ones_like(want, dtype=torch.bool))
    assert not ours.entropy.requires_grad

    def loss(lp, kl):  # a -inf (truncated) token adds nothing, as grpo_loss's ratio 0 does
        return torch.where(torch.isfinite(lp), lp, 0).mul(ids[:, start:]).sum() + kl.sum()
    got = torch.autograd.grad(loss(ours.logprobs[:, start:], ours.plain[:, start:]),
                              [states, head.module.weight])
    want = torch.autograd.grad(loss(whole, plain), [states, head.module.weight])
    for a, b in zip(got, want):
        assert ((a - b).norm() / b.norm()).item() <= GRAD_RTOL


# ----------------------------------------------------------------------------- the trainer

@pytest.mark.parametrize("model", ["qwen2-tied", "gemma3-softcap"])
@pytest.mark.parametrize("variant", ["own-prompts", "shared-prompt", "lora-shared-prompt"])
def test_trainer_scores_and_gradient_equal_the_whole_logits_path(model_dirs, model, variant):
    trainer = trainer_for(model_dirs[model], lora=variant.startswith("lora"))
    mb = micro_batch(shared_prompt=variant.endswith("shared-prompt"))
    shared = trainer._shared_prefix(mb)
    assert (shared > 0) == variant.endswith("shared-prompt")
    mask = mb.response_mask.bool()
    num_tokens = int(mask.sum())

    # What the trainer scores, and the reference it scores against (no autograd).
    rows = trainer._my_rows(mb)
    scoring = trainer._scoring(rows)
    with torch.no_grad():
        ours = trainer._scores(trainer.model, rows, shared, scoring, plain=True, entropy=True)
    ref = trainer._reference_logprobs(rows, {"temperature": scoring["temperature"]}, shared)

    trainer.begin_batch(num_tokens)
    stats = trainer.accumulate(mb)
    chunked = grads(trainer)
    trainer.optimizer.zero_grad(set_to_none=True)
    whole = whole_logits_path(trainer, mb, float(num_tokens))
    full = grads(trainer)

    assert_close_where_scored(ours.logprobs, whole["logprobs"], mask)
    assert_close_where_scored(ours.plain, whole["plain"], mask)
    assert_close_where_scored(ours.entropy, whole["entropy"], mask)
    assert_close_where_scored(ref, whole["ref"], mask)
    assert stats.loss == pytest.approx(whole["loss"], rel=1e-5, abs=1e-7)
    assert stats.metrics["kl"] == pytest.approx(whole["kl"], rel=1e-5, abs=1e-7)
    assert stats.metrics["entropy"] == pytest.approx(whole["entropy_mean"], rel=1e-5)
    assert chunked.keys() == full.keys() and chunked
    worst = max(((chunked[n] - full[n]).norm() / full[n].norm()).item() for n in full)
    print(f"{model} {variant}: max relative gradient difference {worst:.2g}")
    assert worst <= GRAD_RTOL


def test_softcapping_is_applied_from_the_config(model_dirs):
    """The Gemma model's logits are capped (|logit| < 2), as its own forward caps them."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dirs["gemma3-softcap"])
    ids = micro_batch(False).input_ids[:1]
    hidden = final_hidden(model, input_ids=ids, use_cache=False)
    assert hidden.head.softcap == 2.0 and hidden.states.shape == (1, ids.shape[1], 32)
    raw = hidden.head.module(hidden.states)
    assert raw.abs().max() > 3  # the cap matters
    capped = hidden.head(hidden.states)
    assert capped.abs().max() <= 2
    assert torch.allclose(capped, model(input_ids=ids).logits, atol=1e-6)


def test_a_forward_that_changes_logits_otherwise_is_refused_by_name(model_dirs):
    from transformers import Qwen2ForCausalLM

    class DoubledLogits(Qwen2ForCausalLM):
        def forward(self, *args, **kwargs):
            out = super().forward(*args, **kwargs)
            out.logits = out.logits * 2
            return out

    model = DoubledLogits.from_pretrained(model_dirs["qwen2-tied"])
    with pytest.raises(ValueError, match="DoubledLogits.*Head.finish"):
        final_hidden(model, input_ids=torch.tensor([[1, 2, 3]]), use_cache=False)
    assert model.lm_head is model.get_output_embeddings()  # the head is back in place
    assert type(model.lm_head) is torch.nn.Linear


def test_chunk_size_is_checked_with_the_config():
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="trainer.logits_chunk_tokens"):
            TrainerConfig(logits_chunk_tokens=bad)


# ----------------------------------------------------------------------------- memory

class LargestVocabTensor(TorchDispatchMode):
    """The most elements of any new tensor (views of an operation's inputs, e.g. of the LM
    head's weight [V, H], aside) with a last dimension of `vocab` that an operation makes,
    forward and backward, checkpoint recomputations included: the logits and every copy
    scoring makes of them. A count, not a timing or an allocator reading."""

    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.vocab, self.largest, self.ops = vocab, 0, set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        given = {t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs))
                 if isinstance(t, torch.Tensor)}
        for t in tree_leaves(out):
            if (isinstance(t, torch.Tensor) and t.dim() and t.shape[-1] == self.vocab
                    and t.untyped_storage().data_ptr() not in given):
                self.largest = max(self.largest, t.numel())
                self.ops.add(func.overloadpacket.__name__)
        return out


@pytest.mark.parametrize("model", ["qwen2-tied", "gemma3-softcap"])
def test_no_more_than_a_chunk_of_logits_exists_at_once(model_dirs, model):
    """A micro-batch of 4 rows x 32 positions (a 10-token prompt, shared), with the KL
    reference and top-k/top-p rows: the whole-logits path makes [4, 32, V] tensors, the
    trainer none larger than [CHUNK, V]."""
    trainer = trainer_for(model_dirs[model], lora=False)
    mb = micro_batch(shared_prompt=True, width=32)
    num_tokens = int(mb.response_mask.sum())
    trainer.begin_batch(num_tokens)
    with LargestVocabTensor(VOCAB) as chunked:
        trainer.accumulate(mb)
    trainer.optimizer.zero_grad(set_to_none=True)
    with LargestVocabTensor(VOCAB) as whole:
        whole_logits_path(trainer, mb, float(num_tokens))
    rows, width = mb.input_ids.shape
    print(f"{model}: largest [.., V={VOCAB}] tensor: whole logits {whole.largest} elements "
          f"({whole.largest // VOCAB} positions), chunked {chunked.largest} "
          f"({chunked.largest // VOCAB} positions; chunk {CHUNK})")
    assert whole.largest >= rows * width * VOCAB  # the check sees what it is meant to
    assert 0 < chunked.largest <= CHUNK * VOCAB
    # Backward (and the chunks' recomputation in it) went through the mode too.
    assert {"_log_softmax", "_log_softmax_backward_data"} <= chunked.ops
