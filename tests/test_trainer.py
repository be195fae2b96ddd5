"""GRPOTrainer and the trainer worker: accumulation, FSDP on 2 gloo ranks, swap, runtime path.

The model is a 2-layer Qwen2 (78k parameters) built here, never downloaded.

Tolerances. Summing the same float32 terms in another order (4 micro-batches vs 1 batch, 2 ranks
vs 1) changes gradients in their last bits: observed <= 6e-8 absolute for gradients up to 0.5,
so GRAD_ATOL is 1e-6. Weights are compared after 2 AdamW steps, and Adam divides each gradient
component by its own magnitude (+ eps 1e-8): for the smallest components a last-bit difference
of the gradient becomes a visible relative difference of the update, so weights differ by up to
a few lr * 1e-3 (observed 4e-7 .. 1.1e-6 at lr 1e-3, mostly in k_proj) and WEIGHT_ATOL is lr/100.
A state exported and loaded into a fresh trainer (export_state / load_state: snapshots and
checkpoints) is compared bit for bit, in one process and per FSDP shard; so is a state parked
and brought back (park / unpark, what a slot's SwapOut and SwapIn do) and one pulled slice by
slice into a trainer built empty (pull_pieces, what a SwapIn from another slot does).
"""
from __future__ import annotations

import json
import math
import os
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from safetensors.torch import load_file, save_file

from flexmarl.config.training import TrainerConfig
from flexmarl.training.grpo import token_logprobs

from flexmarl.protocol import (ExportState, ExportWeights, FetchWeights, SwapIn, SwapOut,
                               TrainBeginBatch, TrainMicroBatch, TrainStats, TrainStep, TrainStepDone,
                               WeightUpdate)
from flexmarl.training.trainer import GRPOTrainer, export_state, load_state
from runtime.errors import RemoteError
from runtime.supervisor import Supervisor, WorkerSpec, pid_alive
from runtime.transport import connect
from tests.helpers.numerics import (GRAD_ATOL, LOSS_RTOL, MIXED_REL_TOL, WEIGHT_ATOL, max_diff,
                                    relative_distance)
from tests.helpers.lora import LORA
from tests.helpers.trainers import (CONFIG, FAST, FIELDS, LR, VOCAB,  # noqa: F401  (fixtures)
                                    _weights_and_moments, batches, model_dir, moved_off_start,
                                    rows, step_batch, tokens)


# ----------------------------------------------------------------------------- fixtures

@pytest.fixture(scope="module")
def shared_prompt_batch(model_dir) -> TrainMicroBatch:
    """6 rows of one GRPO group: one 10-token prompt, responses of 2-6 tokens (right-padded),
    old and ref log-probs near the model's own. The trainer computes the prompt once
    (GRPOTrainer._shared_prefix, one rank); 6 rows in 2 micro-batches on 2 ranks give one rank a
    dummy row."""
    from transformers import AutoModelForCausalLM

    from flexmarl.training.prefix import MIN_SHARED_PREFIX

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    g = torch.Generator().manual_seed(7)
    rows, prompt, width = 6, MIN_SHARED_PREFIX + 2, MIN_SHARED_PREFIX + 8
    lens = prompt + torch.randint(2, width - prompt + 1, (rows,), generator=g)
    pos = torch.arange(width)
    attn = (pos < lens[:, None]).long()
    ids = torch.randint(1, VOCAB, (rows, width), generator=g)
    ids[:, :prompt] = ids[0, :prompt]
    ids = ids * attn
    resp = ((pos >= prompt) & (pos < lens[:, None])).long()
    with torch.no_grad():
        cur = token_logprobs(model(input_ids=ids, attention_mask=attn).logits, ids)
    noise = lambda: 0.2 * torch.randn(rows, width, generator=g)  # noqa: E731
    return TrainMicroBatch(ids, attn, resp, cur + noise(), torch.randn(rows, generator=g),
                           ref_logprobs=cur + noise())


@pytest.fixture(scope="module")
def partial_prefix_batch(model_dir) -> TrainMicroBatch:
    """6 rows whose prompts share their first MIN_SHARED_PREFIX + 1 tokens (a system message)
    and go on with tokens of their own, 2-4 of them (prompts of 11-13 tokens), then responses
    of 2-5 tokens, laid out by micro_batch (right-padded); old log-probs near the model's own,
    no ref_logprobs (a trainer with kl_coef > 0 scores its reference itself). The prefix the
    trainer shares ends inside the prompts, before the first response token."""
    from transformers import AutoModelForCausalLM

    from flexmarl.orchestrator.batch import micro_batch
    from flexmarl.training.prefix import MIN_SHARED_PREFIX

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    g = torch.Generator().manual_seed(13)
    common = torch.randint(1, VOCAB, (MIN_SHARED_PREFIX + 1,), generator=g).tolist()
    samples = []
    for r in range(6):
        own = torch.randint(1, VOCAB, (int(torch.randint(2, 5, (1,), generator=g)),),
                            generator=g).tolist()
        own[0] = 1 + (7 * r) % (VOCAB - 1)  # every row's first own token differs
        response = torch.randint(1, VOCAB, (int(torch.randint(2, 6, (1,), generator=g)),),
                                 generator=g).tolist()
        samples.append((common + own, response, [0.0] * len(response)))
    mb = micro_batch(samples, torch.randn(6, generator=g).tolist())
    with torch.no_grad():
        cur = token_logprobs(model(input_ids=mb.input_ids,
                                   attention_mask=mb.attention_mask).logits, mb.input_ids)
    mb.old_logprobs = torch.where(mb.response_mask.bool(),
                                  cur + 0.2 * torch.randn(cur.shape, generator=g), 0.0)
    return mb


def train(trainer: GRPOTrainer, batches: list[TrainMicroBatch], num_micro: int = 1
          ) -> list[float]:
    """One step per global batch, each split into `num_micro` micro-batches; the losses."""
    losses = []
    for i, mb in enumerate(batches):
        trainer.begin_batch(tokens(mb))
        size = mb.input_ids.shape[0] // num_micro
        loss = 0.0
        for j in range(0, mb.input_ids.shape[0], size):
            loss += trainer.accumulate(rows(mb, j, j + size)).loss
        losses.append(loss)
        done = trainer.step()
        assert done.version == i + 1 and math.isfinite(done.grad_norm)
    return losses


# ----------------------------------------------------------------------------- one process

def test_config_errors_name_the_field():
    for bad in (dict(lr=0), dict(betas=(0.9, 1.0)), dict(grad_clip=-1), dict(clip_eps=0),
                dict(kl_coef=-0.1), dict(temperature=0), dict(device="tpu"), dict(seed=1.5)):
        name = next(iter(bad))
        with pytest.raises(ValueError, match=f"trainer.{name}"):
            TrainerConfig(**bad)
    assert TrainerConfig(betas=[0.8, 0.9]).betas == (0.8, 0.9)  # from JSON worker args


def test_export_names_match_the_checkpoint(model_dir):
    trainer = GRPOTrainer(model_dir, TrainerConfig(**CONFIG))
    assert (trainer.rank, trainer.world_size, trainer.version) == (0, 1, 0)
    saved = load_file(os.path.join(model_dir, "model.safetensors"))
    exported = trainer.export_weights()
    assert exported.keys() == saved.keys()  # tied lm_head.weight is not duplicated
    assert all(torch.equal(exported[k], saved[k]) for k in saved)


def test_accumulating_micro_batches_equals_one_full_batch(model_dir, batches):
    full = GRPOTrainer(model_dir, TrainerConfig(**CONFIG))
    micro = GRPOTrainer(model_dir, TrainerConfig(**CONFIG))
    before = full.export_weights()
    for mb in batches:
        losses = []
        for trainer, num_micro in ((full, 1), (micro, 4)):
            trainer.begin_batch(tokens(mb))
            size = 8 // num_micro
            losses.append(sum(trainer.accumulate(rows(mb, j, j + size)).loss
                              for j in range(0, 8, size)))
        assert losses[1] == pytest.approx(losses[0], rel=LOSS_RTOL)
        grads = [{n: p.grad for n, p in t.model.named_parameters()} for t in (full, micro)]
        assert max_diff(*grads) <= GRAD_ATOL
        assert full.step().grad_norm == pytest.approx(micro.step().grad_norm, rel=LOSS_RTOL)
    after = full.export_weights()
    assert max_diff(before, after) > LR / 2  # it did learn something
    diff = max_diff(after, micro.export_weights())
    print(f"4 micro-batches vs 1 batch: max abs weight diff {diff:.3g}")
    assert diff <= WEIGHT_ATOL


def _ragged_rows(model_dir: str, n: int = 12, seed: int = 5):
    """n (prompt_ids, response_ids, behaviour logprobs) rows of different prompt and response
    lengths, as the store holds them before micro_batch() pads them; and their advantages."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        p, r = (int(x) for x in torch.randint(2, 7, (2,), generator=g))
        ids = torch.randint(1, VOCAB, (1, p + r), generator=g)
        with torch.no_grad():
            lp = token_logprobs(model(input_ids=ids).logits, ids)[0, p:]
        lp = lp + 0.2 * torch.randn(r, generator=g)
        out.append((ids[0, :p].tolist(), ids[0, p:].tolist(), lp.tolist()))
    return out, torch.randn(n, generator=g).tolist()


def _accumulated(model_dir: str, rows, advantages, splits, normaliser=None) -> GRPOTrainer:
    """A trainer that accumulated `rows` as micro_batch()es of the index lists in `splits`
    (each padded to its own longest row), normalised by the batch's token count."""
    from flexmarl.orchestrator.batch import micro_batch

    trainer = GRPOTrainer(model_dir, TrainerConfig(**{**CONFIG, "kl_coef": 0.0}))
    trainer.begin_batch(normaliser or sum(len(r[1]) for r in rows))
    for idx in splits:
        trainer.accumulate(micro_batch([rows[i] for i in idx], [advantages[i] for i in idx]))
    return trainer


def _grads(trainer: GRPOTrainer) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in trainer.model.named_parameters()}


def test_micro_batches_of_any_composition_and_padding_give_the_same_gradient(model_dir,
                                                                            monkeypatch):
    """What micro_batch mode relies on: the groups ready when the trainer is free form the
    micro-batches, so their composition, order and padding width differ from sync's. Any split
    of the same rows, each re-padded by micro_batch(), accumulates the same gradient (GRAD_ATOL)
    and steps to the same weights (MIXED_REL_TOL). The control: normalising each micro-batch by
    its own tokens (a per-call mean) fails both."""
    from flexmarl.training import trainer as trainer_module

    rows, adv = _ragged_rows(model_dir)
    in_order, regrouped = [range(0, 4), range(4, 8), range(8, 12)], [[7, 2, 11],
                                                                    [0, 5, 9, 3, 10], [1],
                                                                    [4, 6, 8]]
    a, b, whole = (_accumulated(model_dir, rows, adv, s)
                   for s in (in_order, regrouped, [range(12)]))
    start = a.export_weights()
    assert max_diff(_grads(a), _grads(b)) <= GRAD_ATOL
    assert max_diff(_grads(a), _grads(whole)) <= GRAD_ATOL
    assert max(g.abs().max().item() for g in _grads(a).values()) > 1e-3  # not a zero gradient
    a.step(), b.step()
    assert relative_distance(a.export_weights(), b.export_weights(), start) <= MIXED_REL_TOL

    real = trainer_module.grpo_loss

    def per_call_mean(*args, normaliser, **kwargs):  # the wrong normaliser
        return real(*args, normaliser=float(args[3].sum()), **kwargs)

    monkeypatch.setattr(trainer_module, "grpo_loss", per_call_mean)
    wa, wb = (_accumulated(model_dir, rows, adv, s, normaliser=10**6)
              for s in (in_order, regrouped))
    assert max_diff(_grads(wa), _grads(wb)) > 100 * GRAD_ATOL
    wa.step(), wb.step()
    wrong = relative_distance(wa.export_weights(), wb.export_weights(), start)
    print(f"a per-micro-batch normaliser: relative weight distance {wrong:.3g}")
    assert wrong > 100 * MIXED_REL_TOL


SHARED_PREFIX_CASES = {
    "one prompt": ("shared_prompt_batch", {"kl_coef": 0.0}),
    "one prompt, KL": ("shared_prompt_batch", {}),
    "partial prefix, KL": ("partial_prefix_batch", {}),
    "partial prefix, LoRA, KL": ("partial_prefix_batch", {"lora": LORA["lora"]}),
    "partial prefix, train_layers, KL": ("partial_prefix_batch", {"train_layers": 1}),
}
"""The shared-prefix test's cases: the batch and the trainer config over CONFIG (kl_coef 0.05)."""


def _trained_grads(trainer: GRPOTrainer) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.requires_grad}


@pytest.mark.parametrize("case", list(SHARED_PREFIX_CASES))
def test_a_shared_prompt_computed_once_gives_the_full_forwards_gradient(model_dir, request,
                                                                      monkeypatch, case):
    """A micro-batch whose rows share leading tokens (a GRPO group's prompt, or a system
    message before prompts of their own) runs them once and the rest of every row against
    their KV cache, and scores only the positions from the first response token on: the loss,
    entropy and gradient are the full forward's (GRAD_ATOL, LOSS_RTOL). Cases: one prompt with
    and without the KL term (ref_logprobs given); prompts of different lengths sharing a
    partial prefix, where the trainer's own reference forward shares it too (kl_coef > 0, no
    ref_logprobs), for a full trainer, a LoRA one (the reference: the adapter disabled) and
    one with train_layers (the prefix's gradient reaches the trained block through its KV
    cache only); the trained parameters moved off the reference first. The control runs with
    the shortcut off."""
    from transformers import PreTrainedModel

    from flexmarl.training.prefix import MIN_SHARED_PREFIX

    fixture, overrides = SHARED_PREFIX_CASES[case]
    mb = request.getfixturevalue(fixture)
    config = TrainerConfig(**{**CONFIG, **overrides})
    moved = fixture == "partial_prefix_batch"
    shared = GRPOTrainer(model_dir, config)
    shared = moved_off_start(shared) if moved else shared
    length = shared._shared_prefix(mb)
    assert length >= MIN_SHARED_PREFIX  # the shortcut is taken
    first_response = int(mb.response_mask.float().argmax(1).min())
    if moved:  # the rows' common tokens end inside the prompts
        common = int((mb.input_ids == mb.input_ids[:1]).all(0).long().cumprod(0).sum())
        assert common == MIN_SHARED_PREFIX + 1 < first_response - 1
    calls = []
    hf = shared.model.get_base_model() if config.lora is not None else shared.model
    real_forward = type(hf).forward
    assert issubclass(type(hf), PreTrainedModel)

    def counted(self, *args, **kwargs):
        calls.append(tuple(kwargs.get("input_ids").shape))
        return real_forward(self, *args, **kwargs)

    monkeypatch.setattr(type(hf), "forward", counted)
    shared.begin_batch(tokens(mb))
    a = shared.accumulate(mb)
    assert calls[0] == (1, length)  # the prefix once, one row
    scores_reference = config.kl_coef > 0 and mb.ref_logprobs is None
    # the reference's forward (the frozen copy, or the adapter disabled) shares it too
    assert calls.count((1, length)) == 1 + scores_reference
    monkeypatch.undo()
    full = GRPOTrainer(model_dir, config)
    full = moved_off_start(full) if moved else full
    monkeypatch.setattr(full, "_shared_prefix", lambda mb: 0)
    full.begin_batch(tokens(mb))
    b = full.accumulate(mb)
    assert a.loss == pytest.approx(b.loss, rel=LOSS_RTOL)
    assert a.num_tokens == b.num_tokens == tokens(mb)
    for k in b.metrics:
        assert a.metrics[k] == pytest.approx(b.metrics[k], rel=LOSS_RTOL, abs=1e-6), k
    if scores_reference:
        assert b.metrics["kl"] > 1e-4  # the policy is not its reference: the KL term counts
    assert max_diff(_trained_grads(shared), _trained_grads(full)) <= GRAD_ATOL
    assert max(g.abs().max().item() for g in _trained_grads(full).values()) > 1e-3


def test_deferred_normaliser_gives_the_same_update(model_dir, batches):
    """begin_batch(None) + step(num_tokens): micro-batches trained before the batch's token count
    is known end with the update of the declared form (one division at the step)."""
    declared = GRPOTrainer(model_dir, TrainerConfig(**CONFIG))
    deferred = GRPOTrainer(model_dir, TrainerConfig(**CONFIG))
    for mb in batches:
        declared.begin_batch(tokens(mb))
        deferred.begin_batch(None)
        a = sum(declared.accumulate(rows(mb, j, j + 2)).loss for j in range(0, 8, 2))
        b = sum(deferred.accumulate(rows(mb, j, j + 2)).loss for j in range(0, 8, 2))
        assert b / tokens(mb) == pytest.approx(a, rel=LOSS_RTOL)  # deferred losses are sums
        grads = [{n: p.grad for n, p in t.model.named_parameters()} for t in (declared, deferred)]
        assert max_diff(grads[0], {n: g / tokens(mb) for n, g in grads[1].items()}) <= GRAD_ATOL
        assert declared.step().grad_norm == pytest.approx(deferred.step(tokens(mb)).grad_norm,
                                                          rel=LOSS_RTOL)
    diff = max_diff(declared.export_weights(), deferred.export_weights())
    print(f"deferred vs declared normaliser: max abs weight diff {diff:.3g}")
    assert diff <= WEIGHT_ATOL


def test_deferred_normaliser_must_match_what_was_trained(model_dir, batches):
    trainer = GRPOTrainer(model_dir, TrainerConfig(**CONFIG))
    trainer.begin_batch(None)
    trainer.accumulate(batches[0])
    with pytest.raises(ValueError, match="response tokens were accumulated"):
        trainer.step(tokens(batches[0]) + 1)
    with pytest.raises(ValueError, match="response tokens were accumulated"):
        trainer.step()
    assert trainer.step(tokens(batches[0])).version == 1
    trainer.begin_batch(tokens(batches[0]))
    trainer.accumulate(batches[0])
    with pytest.raises(ValueError, match="disagrees with begin_batch"):
        trainer.step(5)


def test_batch_bookkeeping_errors(model_dir, batches):
    trainer = GRPOTrainer(model_dir, TrainerConfig(**CONFIG))
    with pytest.raises(RuntimeError, match="begin_batch"):
        trainer.accumulate(batches[0])
    with pytest.raises(RuntimeError, match="accumulate"):
        trainer.step()
    trainer.begin_batch(tokens(batches[0]) - 1)
    with pytest.raises(ValueError, match="begin_batch declared"):
        trainer.accumulate(batches[0])
    no_ref = rows(batches[0], 0, 8)
    no_ref.ref_logprobs = None
    trainer.begin_batch(tokens(no_ref))
    # kl_coef > 0 without reference log-probabilities used to be refused here; the trainer now
    # scores the batch under its own frozen initial weights (see the KL test below).
    assert math.isfinite(trainer.accumulate(no_ref).metrics["kl"])


def test_kl_to_the_initial_weights_without_ref_logprobs(model_dir, batches):
    """trainer.kl_coef > 0 with micro-batches that bring no reference log-probabilities (what
    the orchestrator sends): the trainer scores them under its frozen initial weights. Before
    any step the policy is the reference (KL 0); after one it has moved (KL > 0). Entropy is
    reported per token."""
    def no_ref(mb: TrainMicroBatch) -> TrainMicroBatch:
        return TrainMicroBatch(mb.input_ids, mb.attention_mask, mb.response_mask,
                               mb.old_logprobs, mb.advantages)

    trainer = GRPOTrainer(model_dir, TrainerConfig(**{**CONFIG, "kl_coef": 0.5}))
    assert trainer.reference is not None
    trainer.begin_batch(tokens(batches[0]))
    first = trainer.accumulate(no_ref(batches[0]))
    trainer.step()
    assert first.metrics["kl"] < 1e-9 and first.metrics["entropy"] > 0
    trainer.begin_batch(tokens(batches[1]))
    second = trainer.accumulate(no_ref(batches[1]))
    assert second.metrics["kl"] > 1e-9
    without = GRPOTrainer(model_dir, TrainerConfig(**{**CONFIG, "kl_coef": 0.0}))
    assert without.reference is None
    without.begin_batch(tokens(batches[0]))
    assert without.accumulate(no_ref(batches[0])).metrics["kl"] == 0.0


def test_train_layers_trains_and_exports_only_the_last_blocks(model_dir, batches):
    """trainer.train_layers = 1: only the last decoder block and the final norm train; the
    optimizer holds state for them only, a step changes nothing else, and the export (what a
    weight sync sends) is just them."""
    trainer = GRPOTrainer(model_dir, TrainerConfig(**{**CONFIG, "train_layers": 1}))
    trained = set(trainer.trained_names)
    assert trained and all(n.startswith(("model.layers.1.", "model.norm.")) for n in trained)
    assert "model.norm.weight" in trained
    assert "model.layers.0.self_attn.q_proj.weight" not in trained
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    train(trainer, batches[:1], num_micro=2)
    after = dict(trainer.model.named_parameters())
    changed = {n for n in before if not torch.equal(before[n], after[n].detach())}
    assert changed and changed <= trained
    assert len(trainer.optimizer.state) == len(trained)
    exported = trainer.export_weights()
    assert set(exported) == trained and all(torch.equal(exported[n], after[n].detach())
                                            for n in exported)
    full = GRPOTrainer(model_dir, TrainerConfig(**CONFIG)).export_weights()
    print(f"train_layers=1 exports {sum(t.numel() for t in exported.values())} of "
          f"{sum(t.numel() for t in full.values())} parameters")
    with pytest.raises(ValueError, match="train_layers = 3 but the model has 2 decoder blocks"):
        GRPOTrainer(model_dir, TrainerConfig(**{**CONFIG, "train_layers": 3}))


# ----------------------------------------------------------------------------- 2 gloo ranks

def _rank_main(rank: int, world_size: int, model_dir: str, work: str) -> None:
    """One rank of the FSDP test: a step, the state swapped out and into a fresh trainer (as a
    slot's SwapOut and SwapIn do: rank 0 holds the full state, every rank restores its shards
    from it), a second step on the fresh trainer; rank 0 writes."""
    torch.set_num_threads(1)  # two ranks share the box's two cores
    dist.init_process_group("gloo", init_method=f"file://{work}/store", rank=rank,
                            world_size=world_size)
    try:
        trainer = GRPOTrainer(model_dir, TrainerConfig(**CONFIG))
        data = load_file(f"{work}/batches.safetensors")
        count = len({k.split(".")[0] for k in data})
        batches = [TrainMicroBatch(*(data[f"{i}.{f}"] for f in FIELDS)) for i in range(count)]
        losses = [step_batch(trainer, batches[0])]
        saved = _weights_and_moments(trainer)
        tensors, meta = export_state(trainer)  # a collective; the full state on rank 0
        if rank == 0:
            save_file(tensors, f"{work}/state.safetensors")
            with open(f"{work}/state.json", "w") as f:
                json.dump(meta, f)
        dist.barrier()
        fresh = GRPOTrainer(model_dir, TrainerConfig(**CONFIG))
        with open(f"{work}/state.json") as f:
            load_state(fresh, load_file(f"{work}/state.safetensors"), json.load(f))
        exact = all(map(torch.equal, saved, _weights_and_moments(fresh)))
        losses += [step_batch(fresh, mb) for mb in batches[1:]]
        weights = fresh.export_weights()
        if rank == 0:
            save_file(weights, f"{work}/weights.safetensors")
        with open(f"{work}/rank{rank}.json", "w") as f:
            json.dump({"losses": losses, "exact": exact, "num_exported": len(weights),
                       "sharded": fresh.sharded}, f)
    finally:
        # Meet before tearing down: a rank destroying the group while its peer's gloo thread
        # still talks to it aborts the peer ("terminate called without an active exception").
        dist.barrier()
        dist.destroy_process_group()


@pytest.mark.slow
def test_two_gloo_ranks_match_one_rank(model_dir, batches, shared_prompt_batch, tmp_path):
    """The third batch shares its prompt (computed once by the one rank, not under FSDP: see
    GRPOTrainer._shared_prefix) and gives rank 1 a dummy row."""
    batches = [*batches, shared_prompt_batch]
    save_file({f"{i}.{f}": getattr(mb, f).contiguous() for i, mb in enumerate(batches)
               for f in FIELDS}, str(tmp_path / "batches.safetensors"))
    mp.spawn(_rank_main, args=(2, model_dir, str(tmp_path)), nprocs=2, join=True)
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert [r["sharded"] for r in results] == [True, True]
    assert [r["exact"] for r in results] == [True, True]  # FSDP shards swap bit for bit
    assert [r["num_exported"] for r in results] == [26, 0]  # full dict on rank 0 only
    single = GRPOTrainer(model_dir, TrainerConfig(**CONFIG))
    losses = train(single, batches, num_micro=2)
    assert results[0]["losses"] == results[1]["losses"]  # all-reduced: the same on every rank
    assert results[0]["losses"] == pytest.approx(losses, rel=LOSS_RTOL)
    two = load_file(str(tmp_path / "weights.safetensors"))
    diff = max_diff(two, single.export_weights())
    print(f"2 ranks vs 1: max abs weight diff {diff:.3g}")
    assert diff <= WEIGHT_ATOL


# ----------------------------------------------------------------------------- runtime

@pytest.mark.slow
async def test_trainer_worker_group_over_the_runtime(model_dir, batches, tmp_path,
                                                     monkeypatch, no_leftover_children):
    """The group over the runtime, and the weights it publishes: a file on its host (rank 0
    writes it, the reply names it), read by an instance on this host, fetched from rank 0 by
    one on another host (FetchWeights), never any other file, and gone when the group stops."""
    from flexmarl.rollout.engine import EngineConfig
    from flexmarl.rollout.torch_engine import TorchEngine
    from flexmarl.rollout.worker import RolloutWorker
    from flexmarl.weights import published

    monkeypatch.setenv("FLEXMARL_WEIGHTS_DIR", str(tmp_path / "published"))
    run = published.run_name()
    mb = batches[0]
    args = {"model_dir": model_dir, "agent": "solver", "world_size": 2,
            "init_method": f"file://{tmp_path}/store",
            "config": CONFIG, "num_threads": 1, "collective_timeout_s": 60}
    sup = Supervisor(config=FAST)
    async with sup.serving():
        handles = [await sup.start_worker(WorkerSpec(
            name=f"trainer{r}", entry="flexmarl.training.worker:trainer_worker",
            args={**args, "rank": r})) for r in range(2)]
        async with connect(handles[0].address) as lead, connect(handles[1].address) as follower:
            with pytest.raises(RemoteError, match="rank 0"):
                await follower.request(TrainStep())
            await lead.request(TrainBeginBatch(tokens(mb)))
            stats = [await lead.request(rows(mb, j, j + 3), timeout_s=60) for j in (0, 3, 6)]
            assert all(isinstance(s, TrainStats) for s in stats)
            done = await lead.request(TrainStep())
            assert isinstance(done, TrainStepDone) and done.version == 1
            state = await lead.request(ExportState())  # both ranks' shards, whole, on rank 0
            parked = await lead.request(SwapOut())  # each rank's own shards, in its process
            assert parked.version == state.version == 1 and len(set(parked.ranks)) == 2
            with pytest.raises(RemoteError, match="SwapIn an agent first"):
                await lead.request(TrainBeginBatch(1))
            swapped = await lead.request(SwapIn("solver", model_dir, CONFIG,
                                                source=parked.ranks))
            assert swapped.how == "here" and swapped.num_bytes == parked.num_bytes > 0
            again = await lead.request(ExportState())
            assert all(torch.equal(state.tensors[k], again.tensors[k]) for k in state.tensors)
            update = await lead.request(ExportWeights())
            assert isinstance(update, WeightUpdate) and update.version == 1
            out = await lead.request(ExportWeights(run))
            assert out.tensors == {} and out.version == 1 and out.source["host"] == \
                published.host_id()
            on_file = published.load(out.source["path"])
            assert all(torch.equal(on_file[k], update.tensors[k]) for k in update.tensors)
            assert out.source["num_bytes"] == sum(t.nbytes for t in update.tensors.values())
            with pytest.raises(RemoteError, match="rank 0"):
                await follower.request(FetchWeights(out.source["path"]))
            for hostile in ("/etc/passwd", str(tmp_path / "store"),
                            out.source["path"] + "/../../../x.safetensors"):
                with pytest.raises(RemoteError, match="is not weights this trainer"):
                    await lead.request(FetchWeights(hostile))
            # An instance on another host (as this host id says) fetches from rank 0.
            monkeypatch.setattr(published, "host_id", lambda: "another-host")
            worker = RolloutWorker("r0", "inproc://published-elsewhere",
                                   TorchEngine(EngineConfig(model_dir=model_dir)))
            async with worker.serving(), connect(worker.address) as conn:
                done = await conn.request(WeightUpdate(1, {}, source=out.source), timeout_s=60)
                assert done.version == worker.version == 1
                assert done.num_bytes == out.source["num_bytes"]
                live = worker.engine.model.state_dict()
                assert all(torch.equal(live[k].float(), on_file[k].float()) for k in on_file
                           if k in live)
        pids = [h.pid for h in handles]
        assert all(pid_alive(p) for p in pids)
    deadline = time.monotonic() + FAST.stop_timeout_s
    while any(pid_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(pid_alive(p) for p in pids)
    assert sup.events.empty()  # both ranks stopped on request, neither died
    # Its own files removed at stop; the copy the instance on "another host" kept (this
    # process holds it) stays until the run removes its files.
    assert not os.path.exists(out.source["path"])
    assert [p.name for p in (tmp_path / "published" / run).glob("*/*.safetensors")] == \
        ["copy-1.safetensors"]
    published.remove(run)
    assert not (tmp_path / "published" / run).exists()

    local = GRPOTrainer(model_dir, TrainerConfig(**CONFIG))
    local.begin_batch(tokens(mb))
    local_stats = [local.accumulate(rows(mb, j, j + 3)) for j in (0, 3, 6)]
    local.step()
    assert [s.num_tokens for s in stats] == [s.num_tokens for s in local_stats]
    assert [s.loss for s in stats] == pytest.approx([s.loss for s in local_stats], rel=LOSS_RTOL)
    assert max_diff(update.tensors, local.export_weights()) <= WEIGHT_ATOL
