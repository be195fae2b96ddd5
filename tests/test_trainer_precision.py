"""GRPOTrainer on GPU the way its users expect: trainer.param_dtype / reduce_dtype (mixed
precision), activation_checkpointing and compile, on the 2-layer Qwen2 of tests/test_trainer.py.

Everything here runs on CPU: bfloat16 compute under torch.autocast (one process) and under
FSDP2's MixedPrecisionPolicy on 2 gloo ranks (gloo reduce-scatters bfloat16 gradients too, with
the trainer's sum-only reduction), Hugging Face's gradient checkpointing, and torch.compile of
each decoder block (needs a C++ compiler: a slow test, ~10-20 s of compiling).

Tolerances. float32 parameters and AdamW state are always checked exactly (dtype). Gradients
computed in bfloat16 differ from float32 ones by its rounding (8 bits of mantissa, ~4e-3
relative per operation): observed relative L2 distance 5e-3 in one process and ~1e-2 on 2 ranks,
so BF16_GRAD_REL is 5e-2; and they must differ at all (> 1e-5), or bfloat16 was never used. The
update after one AdamW step is compared loosely (BF16_UPDATE_REL = 0.3, observed ~0.1): Adam's
first step is lr * g / (|g| + eps), about lr * sign(g) for every component, so a component whose
gradient lies within bfloat16 rounding of 0 can step lr the other way; the update's direction
still agrees (cosine observed 0.995, asserted >= 0.95). Activation checkpointing recomputes the
same operations: observed bit-identical in one process, asserted within GRAD_ATOL (1e-6) and
WEIGHT_ATOL. Compiled blocks and 2 FSDP ranks add up the same float32 terms in another order
(gradients within GRAD_ATOL, observed <= 7.5e-8), and Adam divides each update component by its
own gradient's magnitude, so for the tiniest components a last-bit gradient difference becomes
a visible one (observed 2.2e-5 = lr/50 after compiling): their updates are compared as a
relative L2 distance, MIXED_REL_TOL (1e-3) of tests/test_trainer.py.
"""
from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from safetensors.torch import load_file, save_file

from flexmarl.config.training import TrainerConfig
from flexmarl.protocol import TrainMicroBatch
from flexmarl.training.trainer import GRPOTrainer
from tests.helpers.numerics import GRAD_ATOL, MIXED_REL_TOL, WEIGHT_ATOL, max_diff
from tests.helpers.trainers import CONFIG, FIELDS, batches, model_dir, tokens  # noqa: F401

BF16_GRAD_REL = 5e-2
"""Relative L2 distance of bfloat16-computed gradients to float32 ones (observed 5e-3 .. 1e-2)."""
BF16_NOT_FP32 = 1e-5
"""... and at least this much: bfloat16 compute really took place."""
BF16_UPDATE_REL = 0.3
"""Relative L2 distance of the first AdamW update, bfloat16 vs float32 compute (observed ~0.1)."""
BF16_UPDATE_COS = 0.95
"""Cosine similarity of those two updates (observed 0.995)."""
BF16_LOSS_REL = 1e-2


def _no_ref(mb: TrainMicroBatch) -> TrainMicroBatch:
    """The micro-batch without reference log-probabilities: a trainer with kl_coef > 0 scores
    it under its frozen reference model (a second forward, under the same precision)."""
    return TrainMicroBatch(mb.input_ids, mb.attention_mask, mb.response_mask, mb.old_logprobs,
                           mb.advantages)


def _rows(mb: TrainMicroBatch, lo: int, hi: int) -> TrainMicroBatch:
    """Rows lo:hi of every field the micro-batch has (ref_logprobs may be None)."""
    return dataclasses.replace(mb, **{f.name: getattr(mb, f.name)[lo:hi]
                                      for f in dataclasses.fields(mb)
                                      if getattr(mb, f.name) is not None})


def _one_step(trainer: GRPOTrainer, mb: TrainMicroBatch, num_micro: int = 2):
    """One global batch in `num_micro` micro-batches: (loss, full gradients before the step,
    the update export_weights() sees). Every rank calls it under FSDP (collectives)."""
    start = trainer.export_weights()
    trainer.begin_batch(tokens(mb))
    size = mb.input_ids.shape[0] // num_micro
    loss = sum(trainer.accumulate(_rows(mb, j, j + size)).loss
               for j in range(0, mb.input_ids.shape[0], size))
    grads = {n: (p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad).clone()
             for n, p in trainer.model.named_parameters() if p.grad is not None}
    done = trainer.step()
    assert math.isfinite(done.grad_norm) and not done.skipped
    after = trainer.export_weights()
    return loss, grads, {n: after[n] - start[n] for n in after}


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def _state_dtypes(trainer: GRPOTrainer) -> set[torch.dtype]:
    """dtypes of this rank's parameters and AdamW moments (the master weights and state)."""
    dtypes = {_local(p.detach()).dtype for p in trainer.model.parameters()}
    for state in trainer.optimizer.state.values():
        dtypes |= {_local(state[k]).dtype for k in ("exp_avg", "exp_avg_sq")}
    return dtypes


def _rel(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """||a - b|| / ||b|| over all tensors."""
    assert a.keys() == b.keys()
    num = sum(((a[k] - b[k]).double() ** 2).sum().item() for k in a)
    return math.sqrt(num / sum((b[k].double() ** 2).sum().item() for k in b))


def _cos(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    dot = sum((a[k].double() * b[k].double()).sum().item() for k in a)
    return dot / math.sqrt(sum((a[k].double() ** 2).sum().item() for k in a)
                           * sum((b[k].double() ** 2).sum().item() for k in b))


def _assert_bf16_close(loss, grads, update, ref_loss, ref_grads, ref_update, what: str) -> None:
    grad_rel, update_rel, cos = (_rel(grads, ref_grads), _rel(update, ref_update),
                                 _cos(update, ref_update))
    print(f"{what} vs float32: loss {loss:.6g} / {ref_loss:.6g}, gradient rel {grad_rel:.3g}, "
          f"update rel {update_rel:.3g}, update cos {cos:.4f}")
    assert math.isfinite(loss) and loss == pytest.approx(ref_loss, rel=BF16_LOSS_REL)
    assert BF16_NOT_FP32 < grad_rel <= BF16_GRAD_REL
    assert update_rel <= BF16_UPDATE_REL and cos >= BF16_UPDATE_COS


# ----------------------------------------------------------------------------- config

def test_precision_config_defaults_and_errors():
    c = TrainerConfig()
    assert (c.param_dtype, c.reduce_dtype, c.activation_checkpointing, c.compile) == (
        "float32", "float32", False, False)
    for bad in (dict(param_dtype="fp16"), dict(param_dtype="float64"),
                dict(reduce_dtype="float16"), dict(reduce_dtype="bf16"),
                dict(activation_checkpointing="yes"), dict(compile=1)):
        name = next(iter(bad))
        with pytest.raises(ValueError, match=f"trainer.{name} "):
            TrainerConfig(**bad)
    TrainerConfig(param_dtype="float16", reduce_dtype="bfloat16")  # allowed


def test_default_trainer_is_plain_float32(model_dir):
    """The default path is unchanged: no autocast, no checkpointing, nothing compiled."""
    trainer = GRPOTrainer(model_dir, TrainerConfig(**CONFIG))
    assert trainer._autocast().__class__.__name__ == "nullcontext"
    assert not trainer.model.is_gradient_checkpointing
    blocks = trainer.model.model.layers
    assert all(getattr(b, "_compiled_call_impl", None) is None for b in blocks)
    assert _state_dtypes(trainer) == {torch.float32}


# ----------------------------------------------------------------------------- one process

def test_bfloat16_compute_keeps_float32_weights_and_state(model_dir, batches):
    """param_dtype = "bfloat16" without a process group: the forwards (policy and, kl_coef > 0,
    the reference) run under autocast; the loss comes from float32 logits, parameters and AdamW
    state stay float32, and the step is close to the float32 trainer's from the same start."""
    mb = _no_ref(batches[0])
    fp32 = _one_step(GRPOTrainer(model_dir, TrainerConfig(**CONFIG)), mb)
    trainer = GRPOTrainer(model_dir, TrainerConfig(**CONFIG, param_dtype="bfloat16"))
    assert trainer.reference is not None
    bf16 = _one_step(trainer, mb)
    assert _state_dtypes(trainer) == {torch.float32}
    assert all(g.dtype == torch.float32 for g in bf16[1].values())
    assert all(t.dtype == torch.float32 for t in trainer.export_weights().values())
    _assert_bf16_close(*bf16, *fp32, "1 process, bfloat16 autocast")


def _block_calls(trainer: GRPOTrainer) -> list[int]:
    """Count each decoder block's forward calls (forward pre-hooks also fire on recompute)."""
    calls = [0]
    for block in trainer.model.model.layers:
        block.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    return calls


@pytest.mark.parametrize("param_dtype,train_layers", [("float32", 0), ("bfloat16", 0),
                                                    ("float32", 1)])
def test_activation_checkpointing_recomputes_to_the_same_gradient(model_dir, batches,
                                                                 param_dtype, train_layers):
    """activation_checkpointing recomputes each trained block in backward (twice the block
    calls; a frozen block below every trained one, train_layers, is neither recomputed nor
    backpropagated through) and gives the same gradient and update; parameter names
    (export_weights, named_parameters) stay the checkpoint's."""
    mb = batches[0]
    kw = {**CONFIG, "param_dtype": param_dtype, "train_layers": train_layers}
    plain = GRPOTrainer(model_dir, TrainerConfig(**kw))
    ckpt = GRPOTrainer(model_dir, TrainerConfig(**kw, activation_checkpointing=True))
    assert ckpt.model.is_gradient_checkpointing and not plain.model.is_gradient_checkpointing
    assert ([n for n, _ in ckpt.model.named_parameters()]
            == [n for n, _ in plain.model.named_parameters()])
    assert ckpt.export_weights().keys() == plain.export_weights().keys()
    calls = [_block_calls(t) for t in (plain, ckpt)]
    (loss_a, grads_a, update_a), (loss_b, grads_b, update_b) = (_one_step(t, mb)
                                                                for t in (plain, ckpt))
    num_blocks, num_micro = len(plain.model.model.layers), 2
    recomputed = train_layers or num_blocks
    assert calls[0][0] == num_blocks * num_micro
    assert calls[1][0] == (num_blocks + recomputed) * num_micro  # again in backward
    diff = max_diff(grads_a, grads_b)
    print(f"activation checkpointing ({param_dtype}, train_layers {train_layers}): max abs "
          f"gradient diff {diff:.3g}")
    assert loss_b == pytest.approx(loss_a, rel=1e-6)
    assert diff <= GRAD_ATOL
    assert max_diff(update_a, update_b) <= WEIGHT_ATOL


@pytest.mark.slow
def test_compiled_blocks_give_the_same_gradient(model_dir, batches):
    """compile = True: each decoder block is torch.compile'd in place (names unchanged); the
    gradient matches eager's to GRAD_ATOL and the update to MIXED_REL_TOL (fused kernels round
    differently). Slow: ~10-20 s of Inductor C++ compilation on CPU."""
    mb = batches[0]
    eager = GRPOTrainer(model_dir, TrainerConfig(**CONFIG))
    compiled = GRPOTrainer(model_dir, TrainerConfig(**CONFIG, compile=True))
    assert all(b._compiled_call_impl is not None for b in compiled.model.model.layers)
    assert compiled.export_weights().keys() == eager.export_weights().keys()
    (loss_a, grads_a, update_a), (loss_b, grads_b, update_b) = (_one_step(t, mb)
                                                                for t in (eager, compiled))
    diff, update_rel = max_diff(grads_a, grads_b), _rel(update_b, update_a)
    print(f"compiled blocks: max abs gradient diff {diff:.3g}, update rel {update_rel:.3g}")
    assert loss_b == pytest.approx(loss_a, rel=1e-5)
    assert diff <= GRAD_ATOL
    assert update_rel <= MIXED_REL_TOL


# ----------------------------------------------------------------------------- 2 gloo ranks

RANK_CASES = {"bf16": dict(param_dtype="bfloat16"),
              "bf16_reduce_bf16": dict(param_dtype="bfloat16", reduce_dtype="bfloat16"),
              "fp32_checkpointing": dict(activation_checkpointing=True)}


def _precision_rank(rank: int, world_size: int, model_dir: str, work: str) -> None:
    """One FSDP rank: one step per RANK_CASES config from the same start; rank 0 writes the
    full gradients and updates, every rank the dtypes of its own shards."""
    torch.set_num_threads(1)  # two ranks share the box's two cores
    dist.init_process_group("gloo", init_method=f"file://{work}/store", rank=rank,
                            world_size=world_size)
    try:
        data = load_file(f"{work}/batch.safetensors")
        mb = TrainMicroBatch(*(data[f] for f in FIELDS))
        report = {}
        for name, kw in RANK_CASES.items():
            trainer = GRPOTrainer(model_dir, TrainerConfig(**CONFIG, **kw))
            loss, grads, update = _one_step(trainer, mb)
            report[name] = {"loss": loss, "sharded": trainer.sharded,
                            "dtypes": sorted(str(d) for d in _state_dtypes(trainer))}
            if rank == 0:
                save_file({f"grad/{k}": v.contiguous() for k, v in grads.items()}
                          | {f"update/{k}": v.contiguous() for k, v in update.items()},
                          f"{work}/{name}.safetensors")
        with open(f"{work}/rank{rank}.json", "w") as f:
            json.dump(report, f)
    finally:
        dist.barrier()  # as in tests/test_trainer.py: meet before tearing the group down
        dist.destroy_process_group()


@pytest.mark.slow
def test_two_gloo_ranks_in_bfloat16_match_one_float32_rank(model_dir, batches, tmp_path):
    """FSDP2 with MixedPrecisionPolicy on 2 gloo ranks: bfloat16 compute (with a float32 or a
    bfloat16 gradient reduce-scatter, summed as always) keeps float32 shards and AdamW state and
    steps close to one float32 process; float32 with activation checkpointing under FSDP matches
    it to the float32 tolerances (GRAD_ATOL, MIXED_REL_TOL)."""
    mb = batches[0]
    save_file({f: getattr(mb, f).contiguous() for f in FIELDS},
              str(tmp_path / "batch.safetensors"))
    mp.spawn(_precision_rank, args=(2, model_dir, str(tmp_path)), nprocs=2, join=True)
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    ref_loss, ref_grads, ref_update = _one_step(GRPOTrainer(model_dir, TrainerConfig(**CONFIG)),
                                                mb)
    for name in RANK_CASES:
        assert [r[name]["sharded"] for r in reports] == [True, True]
        assert [r[name]["dtypes"] for r in reports] == [["torch.float32"]] * 2
        assert reports[0][name]["loss"] == reports[1][name]["loss"]  # all-reduced
        saved = load_file(str(tmp_path / f"{name}.safetensors"))
        grads = {k.removeprefix("grad/"): v for k, v in saved.items() if k.startswith("grad/")}
        update = {k.removeprefix("update/"): v for k, v in saved.items()
                  if k.startswith("update/")}
        assert all(g.dtype == torch.float32 for g in grads.values())
        if name.startswith("bf16"):
            _assert_bf16_close(reports[0][name]["loss"], grads, update, ref_loss, ref_grads,
                               ref_update, f"2 ranks, {name}")
        else:
            diff, update_rel = max_diff(grads, ref_grads), _rel(update, ref_update)
            print(f"2 ranks, {name} vs 1 rank: max abs gradient diff {diff:.3g}, update rel "
                  f"{update_rel:.3g}")
            assert reports[0][name]["loss"] == pytest.approx(ref_loss, rel=1e-5)
            assert diff <= GRAD_ATOL
            assert update_rel <= MIXED_REL_TOL
