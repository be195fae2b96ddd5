"""GRPOTrainer with trainer.lora: a LoRA adapter (PEFT) trains on the frozen base, on the 2-layer
Qwen2 of tests/test_trainer.py (its fixtures and helpers: tests/helpers/trainers.py).

What the rest of the run relies on, each checked here: only the adapter moves (the base stays
bit-equal to the model directory) and AdamW holds only it; export_weights gives the adapter's
tensors under PEFT's names, and a fresh PEFT model of the base loaded with them (in memory, or
from the adapter directory write_adapter writes) scores tokens as the trainer does (on-policy
exactness: the rollout engines serve that adapter); the state (export_state / load_state, the
DCP files, the swap path) moves the adapter and its AdamW state, bit for bit; the KL reference
is the base itself (no second copy); 2 FSDP ranks train the adapter as 1 rank does.

Tolerances. The PEFT model and the trainer run the same modules on the same float32 weights in
one process: their token log-probabilities are observed bit-identical. LOGPROB_ATOL is 1e-6, two
float32 ulps of a log-probability near log(1/64) = -4.2 (ulp 4.8e-7): room for another kernel's
summation order and nothing more; the adapter itself moves them by > 1e-3 here (asserted), so
an adapter loaded wrongly (a missing tensor, another scaling) cannot pass. 2 ranks vs 1 and
compiled blocks sum the same float32 terms in another order: tests/test_trainer.py's GRAD_ATOL
(compiled: observed 3.2e-8) and WEIGHT_ATOL (2 ranks, after 2 AdamW steps: observed 3.0e-8).
Activation checkpointing is observed bit-identical (asserted within GRAD_ATOL). Everything else
(states, swaps, DCP files, the base's weights) is compared bit for bit.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from safetensors.torch import load_file, save_file

from flexmarl.config.training import TrainerConfig
from flexmarl.models.lora import adapter_tensors, load_adapter_tensors, write_adapter, wrap
from flexmarl.protocol import TrainMicroBatch
from flexmarl.training import sharded_state
from flexmarl.training.adapter import inner
from flexmarl.training.grpo import token_logprobs
from flexmarl.training.parking import (fill, local_tensors, park, prepare_pull, pull_pieces,
                                       set_rng, sharded_here, slices, unpark)
from flexmarl.training.trainer import GRPOTrainer, export_state, load_state
from tests.helpers.lora import (LORA, SPEC, TARGETS, checkpoint_name, lora_trainer, rows,
                                step_batch)
from tests.helpers.numerics import GRAD_ATOL, LOSS_RTOL, WEIGHT_ATOL, max_diff
from tests.helpers.trainers import (CONFIG, FIELDS, _weights_and_moments,  # noqa: F401
                                    batches, model_dir, tokens)

LOGPROB_ATOL = 1e-6
"""Token log-probabilities, trainer vs a fresh PEFT model loaded with its export (observed 0;
two float32 ulps at -4.2)."""


def no_ref(mb: TrainMicroBatch) -> TrainMicroBatch:
    """The micro-batch without reference log-probabilities (what the orchestrator sends): with
    kl_coef > 0 the trainer scores it under its own reference."""
    return dataclasses.replace(mb, ref_logprobs=None)


def peft_model(model_dir: str, name: str = "default"):
    """A fresh PEFT model of the base, adapter `name` as PEFT initialises it."""
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    return wrap(base, SPEC, name).eval()


def logprobs(model, mb: TrainMicroBatch) -> torch.Tensor:
    with torch.no_grad():
        out = model(input_ids=mb.input_ids, attention_mask=mb.attention_mask, use_cache=False)
    return token_logprobs(out.logits.float(), mb.input_ids)


def adapter_params(trainer: GRPOTrainer) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in trainer.model.named_parameters()
            if p.requires_grad}


# ----------------------------------------------------------------------------- config

def test_lora_config_is_checked_with_the_trainer_config():
    assert TrainerConfig(lora=SPEC.as_dict()).lora == SPEC.as_dict()
    from_json = json.loads(json.dumps({"lora": SPEC.as_dict()}))  # the worker's arguments
    assert TrainerConfig(**from_json).lora == SPEC.as_dict()
    assert TrainerConfig().lora is None
    for bad, match in ((SPEC, "must be a LoraSpec.as_dict"),
                       ({**SPEC.as_dict(), "rank": 0}, "trainer.lora: LoraSpec.rank"),
                       ({**SPEC.as_dict(), "alpha": "x"}, "trainer.lora"),
                       ({**SPEC.as_dict(), "target_modules": "q_proj"}, "list of module names"),
                       ({**SPEC.as_dict(), "target_modules": []}, "non-empty list"),
                       ({"rank": 4}, "must have the keys"),
                       ({**SPEC.as_dict(), "r": 4}, "must have the keys")):
        with pytest.raises(ValueError, match=match):
            TrainerConfig(lora=bad)
    with pytest.raises(ValueError, match=r"trainer.lora excludes trainer.train_layers \(= 1\)"):
        TrainerConfig(lora=SPEC.as_dict(), train_layers=1)


def test_a_target_module_the_model_lacks_is_refused_naming_those_it_has(model_dir):
    spec = dataclasses.replace(SPEC, target_modules=("q_proj", "w_in"))
    config = TrainerConfig(**{**CONFIG, "lora": spec.as_dict()})
    with pytest.raises(ValueError, match=r"agent solver: LoraSpec.target_modules \['w_in'\] are "
                                         r"not Linear modules of its model; it has \[") as err:
        GRPOTrainer(model_dir, config, agent="solver")
    assert all(repr(t) in str(err.value) for t in TARGETS)  # the names it does have
    with pytest.raises(ValueError, match=r"agent \(trainer.lora\): LoraSpec.target_modules"):
        GRPOTrainer(model_dir, config)


# ----------------------------------------------------------------------------- training

def test_only_the_adapter_trains_and_the_optimizer_holds_only_it(model_dir, batches):
    """After two steps (A moves from the second on: its gradient is 0 while B is 0) every
    adapter tensor has moved and every base weight is bit-equal to the model directory's."""
    trainer = lora_trainer(model_dir)
    trained = trainer.trained_names
    assert len(trained) == 2 * len(TARGETS) * 2
    assert all(".lora_A.default." in n or ".lora_B.default." in n for n in trained)
    params = dict(trainer.model.named_parameters())
    in_optimizer = [p for group in trainer.optimizer.param_groups for p in group["params"]]
    assert len(in_optimizer) == len(trained)
    assert {id(p) for p in in_optimizer} == {id(params[n]) for n in trained}
    before = adapter_params(trainer)
    assert all(not before[n].any() for n in trained if ".lora_B." in n)  # PEFT's start: B = 0
    for mb in batches:
        step_batch(trainer, mb)
    assert len(trainer.optimizer.state) == len(trained)
    after = adapter_params(trainer)
    assert after.keys() == before.keys()
    assert all(not torch.equal(before[n], after[n]) for n in trained)
    saved = load_file(os.path.join(model_dir, "model.safetensors"))
    base = {checkpoint_name(n): p.detach() for n, p in params.items() if not p.requires_grad}
    assert base.keys() == saved.keys()  # the whole base, tied lm_head once, nothing else
    assert all(torch.equal(base[k], saved[k]) for k in saved)


def test_exported_adapter_loads_into_peft_and_scores_as_the_trainer(model_dir, batches,
                                                                    tmp_path):
    """export_weights: the adapter's tensors alone, on the CPU, never the live parameters, under
    the names flexmarl.models.lora.adapter_tensors gives. A fresh PEFT model of the base loaded
    with them (in memory under another adapter name, and from PEFT's files on disk) gives the
    trainer's token log-probabilities: a micro-batch whose behaviour log-probabilities come from
    it trains at ratio 1, nothing clipped."""
    import peft

    trainer = lora_trainer(model_dir)
    for mb in batches:
        step_batch(trainer, mb)
    exported = trainer.export_weights()
    fresh = peft_model(model_dir, name="solver")
    assert exported.keys() == adapter_tensors(fresh, "solver").keys()
    assert all(".lora_A.weight" in k or ".lora_B.weight" in k for k in exported)
    assert all(t.device.type == "cpu" for t in exported.values())
    live = {p.untyped_storage().data_ptr() for p in trainer.model.parameters()}
    assert not any(t.untyped_storage().data_ptr() in live for t in exported.values())

    mb = batches[1]
    ours = logprobs(trainer.model, mb)
    base = logprobs(fresh, mb)  # B = 0: the base's
    assert (ours - base).abs().max().item() > 1e-3  # the adapter does change the scores
    load_adapter_tensors(fresh, "solver", exported)
    written = write_adapter(tmp_path / "adapter", SPEC, exported, model_dir)
    from transformers import AutoModelForCausalLM
    loaded = peft.PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32), str(written)).eval()
    mask = mb.response_mask.bool()
    for name, model in (("in memory", fresh), ("from PEFT's files", loaded)):
        theirs = logprobs(model, mb)
        diff = (theirs - ours)[mask].abs().max().item()
        print(f"PEFT model loaded {name}: max abs token log-prob diff {diff:.3g}")
        assert diff <= LOGPROB_ATOL

    on_policy = dataclasses.replace(no_ref(mb), old_logprobs=logprobs(loaded, mb))
    kept = {k: v.clone() for k, v in exported.items()}
    trainer.begin_batch(tokens(mb))
    stats = trainer.accumulate(on_policy)
    assert stats.metrics["ratio_mean"] == pytest.approx(1.0, abs=LOGPROB_ATOL)
    assert stats.metrics["clip_frac"] == 0.0
    trainer.step()
    assert all(torch.equal(kept[k], exported[k]) for k in kept)  # not changed by the step
    assert max_diff(trainer.export_weights(), kept) > 0


def test_state_round_trip_is_bit_exact_and_holds_no_base(model_dir, batches):
    """export_state holds the adapter and its AdamW state (and the RNG), nothing of the frozen
    base; loaded into a fresh LoRA trainer it is bit-equal, and the next step equals that of the
    trainer that never left. A state without this adapter is refused."""
    trainer = lora_trainer(model_dir)
    step_batch(trainer, batches[0])
    tensors, meta = export_state(trainer)
    trained = set(trainer.trained_names)
    assert {k.removeprefix("model/") for k in tensors if k.startswith("model/")} == trained
    assert {k for k in tensors if k.startswith("optim/")} == {
        f"optim/{n}/{key}" for n in trained for key in ("exp_avg", "exp_avg_sq", "step")}
    assert set(tensors) - {f"model/{n}" for n in trained} - {
        k for k in tensors if k.startswith("optim/")} == {"rng/cpu"}
    assert meta["version"] == 1

    fresh = lora_trainer(model_dir)
    assert max_diff(fresh.export_weights(), trainer.export_weights()) > 0
    load_state(fresh, tensors, meta)
    assert fresh.version == 1
    saved, restored = _weights_and_moments(trainer), _weights_and_moments(fresh)
    assert len(saved) == len(restored) and all(map(torch.equal, saved, restored))
    step_batch(trainer, batches[1])
    step_batch(fresh, batches[1])
    a, b = export_state(trainer)[0], export_state(fresh)[0]
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)

    full_state, full_meta = export_state(GRPOTrainer(model_dir, TrainerConfig(**CONFIG)))
    with pytest.raises(ValueError, match="lacks this trainer's trained tensors"):
        load_state(lora_trainer(model_dir), full_state, full_meta)


def test_kl_reference_is_the_base_without_a_second_copy(model_dir, batches):
    """kl_coef > 0: the reference is the policy's own modules with the adapter disabled, so no
    second model is built. At the first step (B = 0) the policy is the base: KL exactly 0. After
    a step the trainer's KL equals the one it computes from the base model's own
    log-probabilities given as ref_logprobs (a twin of the same state)."""
    trainer = lora_trainer(model_dir, kl_coef=0.5)
    assert trainer.reference is None
    assert not any(k.startswith(("ref/", "refbuffer/")) for k in local_tensors(trainer))
    trainer.begin_batch(tokens(batches[0]))
    first = trainer.accumulate(no_ref(batches[0]))
    trainer.step()
    assert math.isfinite(first.loss) and first.metrics["kl"] == 0.0

    twin = lora_trainer(model_dir, kl_coef=0.5)
    load_state(twin, *export_state(trainer))
    mb = batches[1]
    from transformers import AutoModelForCausalLM
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    trainer.begin_batch(tokens(mb))
    twin.begin_batch(tokens(mb))
    ours = trainer.accumulate(no_ref(mb))
    given = twin.accumulate(dataclasses.replace(mb, ref_logprobs=logprobs(base, mb)))
    print(f"KL to the base after a step: {ours.metrics['kl']:.3g}")
    assert math.isfinite(ours.loss) and ours.metrics["kl"] > 1e-9
    assert ours.metrics["kl"] == pytest.approx(given.metrics["kl"], rel=1e-5)
    assert ours.loss == pytest.approx(given.loss, rel=LOSS_RTOL)
    # The adapter is back on after the reference's forward: it trains.
    assert all(p.requires_grad for n, p in trainer.model.named_parameters()
               if n in set(trainer.trained_names))
    assert all(p.grad is not None for p in trainer.optimizer.param_groups[0]["params"])
    trainer.step()


def test_activation_checkpointing_with_lora_gives_the_same_gradient(model_dir, batches):
    """Hugging Face's non-reentrant checkpointing on the base inside the PeftModel: the adapter
    inside the recomputed blocks gets the same gradient (KL through the disabled adapter too)."""
    mb = no_ref(batches[1])
    plain, ckpt = lora_trainer(model_dir), lora_trainer(model_dir, activation_checkpointing=True)
    assert inner(ckpt.model).is_gradient_checkpointing
    assert not inner(plain.model).is_gradient_checkpointing
    grads = []
    for trainer in (plain, ckpt):
        step_batch(trainer, no_ref(batches[0]))  # B != 0: A gets a gradient too
        trainer.begin_batch(tokens(mb))
        trainer.accumulate(mb)
        grads.append({n: p.grad.clone() for n, p in trainer.model.named_parameters()
                      if p.grad is not None})
    assert grads[0].keys() == set(plain.trained_names)
    assert min(g.abs().max().item() for g in grads[0].values()) > 0
    diff = max_diff(*grads)
    print(f"activation checkpointing with LoRA: max abs gradient diff {diff:.3g}")
    assert diff <= GRAD_ATOL


@pytest.mark.slow
def test_compiled_lora_blocks_give_the_same_gradient(model_dir, batches):
    """compile = True: the decoder blocks, PEFT's LoRA layers inside, compiled in place; the
    adapter's names and gradient are eager's (GRAD_ATOL), the KL reference's forward (adapter
    disabled) included. Slow: Inductor's C++ compilation on CPU."""
    mb = no_ref(batches[0])
    eager, compiled = lora_trainer(model_dir), lora_trainer(model_dir, compile=True)
    assert all(b._compiled_call_impl is not None for b in inner(compiled.model).model.layers)
    assert compiled.trained_names == eager.trained_names
    grads, losses = [], []
    for trainer in (eager, compiled):
        trainer.begin_batch(tokens(mb))
        losses.append(trainer.accumulate(mb).loss)
        grads.append({n: p.grad.clone() for n, p in trainer.model.named_parameters()
                      if p.grad is not None})
    diff = max_diff(*grads)
    print(f"compiled LoRA blocks: max abs gradient diff {diff:.3g}")
    assert losses[1] == pytest.approx(losses[0], rel=1e-5)
    assert grads[0].keys() == set(eager.trained_names) and diff <= GRAD_ATOL


# ----------------------------------------------------------------------------- swaps and files

def test_a_parked_lora_trainer_comes_back_and_pulls_bit_for_bit(model_dir, batches):
    """The swap path (parking: SwapOut / SwapIn) with a LoRA trainer moves its adapter state
    alone (tests/test_lora_swap.py: the base stays in the slot): park and unpark in place, and
    a trainer on the same base filled by pull_pieces's slices, both bit-equal; both then train
    like a trainer that never left."""
    trainer = lora_trainer(model_dir)
    step_batch(trainer, batches[0])
    twin = lora_trainer(model_dir)
    load_state(twin, *export_state(trainer))
    before = {k: v.clone() for k, v in local_tensors(trainer).items()}
    host = park(trainer)
    assert all(t.untyped_storage().nbytes() == 0 for k, t in local_tensors(trainer).items()
               if k.startswith("optim/"))  # the adapter's parameters: the base's modules'
    back = unpark(host)
    now = local_tensors(back)
    assert now.keys() == before.keys() and all(torch.equal(before[k], now[k]) for k in now)
    host = park(back)
    on_base = GRPOTrainer(model_dir, TrainerConfig(**LORA), base=back)
    tensors = prepare_pull(on_base, host.layout, host.meta)
    [pieces] = pull_pieces(host.layout, sharded_here(on_base), 1, 1, 0).values()
    fill(tensors, pieces, slices(host, pieces))
    set_rng(on_base, host.rng)
    now = local_tensors(on_base)
    assert now.keys() == before.keys() and all(torch.equal(before[k], now[k]) for k in now)
    step_batch(on_base, batches[1])
    step_batch(twin, batches[1])
    a, b = export_state(on_base)[0], export_state(twin)[0]
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a if k != "rng/cpu")


def test_dcp_state_files_hold_the_adapter_alone(model_dir, batches, tmp_path):
    """The sharded state files (sharded_state.write / read: snapshots, checkpoints, --resume)
    of a LoRA trainer: the adapter and its AdamW state only; read into a fresh LoRA trainer,
    bit-equal."""
    import torch.distributed.checkpoint as dcp

    trainer = lora_trainer(model_dir)
    step_batch(trainer, batches[0])
    done, meta, num_bytes = sharded_state.write(trainer, str(tmp_path / "state"), None)
    done.result()
    names = set(dcp.FileSystemReader(str(tmp_path / "state")).read_metadata()
                .state_dict_metadata)
    assert {n.removeprefix("model/") for n in names if n.startswith("model/")} == set(
        trainer.trained_names)
    adapter_bytes = sum(p.numel() * 4 for p in trainer.model.parameters() if p.requires_grad)
    assert num_bytes < 4 * adapter_bytes  # the adapter, two moments, step counters and RNG
    fresh = lora_trainer(model_dir)
    sharded_state.read(fresh, str(tmp_path / "state"), json.loads(json.dumps(meta)), None)
    saved, restored = _weights_and_moments(trainer), _weights_and_moments(fresh)
    assert fresh.version == 1 and all(map(torch.equal, saved, restored))


def test_a_saved_lora_model_is_a_peft_adapter_directory(model_dir, batches, tmp_path):
    """SaveState with a model_dir (the run's final or evaluated weights): for a LoRA trainer an
    adapter directory in PEFT's format over the base, which PEFT loads as the trainer's."""
    trainer = lora_trainer(model_dir)
    step_batch(trainer, batches[0])
    saved = sharded_state.write_model(trainer, "solver",
                                      {"model_dir": model_dir, "path": str(tmp_path)})
    assert saved.path == str(tmp_path / "version-1") and saved.num_bytes > 0
    assert sorted(os.listdir(saved.path)) == ["adapter_config.json", "adapter_model.safetensors"]
    files = load_file(os.path.join(saved.path, "adapter_model.safetensors"))
    exported = trainer.export_weights()
    assert files.keys() == exported.keys() and all(torch.equal(files[k], exported[k])
                                                   for k in files)


# ----------------------------------------------------------------------------- 2 gloo ranks

def _lora_rank(rank: int, world_size: int, model_dir: str, work: str) -> None:
    """One FSDP rank: two steps of the LoRA trainer with its KL to the base (the disabled
    adapter's forward, a collective); its state out and into a fresh trainer, compared per
    shard; the DCP state written by both ranks; parked (its adapter state) and pulled into a
    trainer on the same base (each rank from its own shards), which steps as the fresh one;
    the same two steps with reshard_after_forward off. Rank 0 writes the adapters it
    exports."""
    torch.set_num_threads(1)  # two ranks share the box's two cores
    dist.init_process_group("gloo", init_method=f"file://{work}/store", rank=rank,
                            world_size=world_size)
    try:
        trainer = GRPOTrainer(model_dir, TrainerConfig(**LORA))
        data = load_file(f"{work}/batches.safetensors")
        batches = [TrainMicroBatch(*(data[f"{i}.{f}"] for f in FIELDS[:5])) for i in range(2)]
        losses = [step_batch(trainer, mb) for mb in batches]
        exported = trainer.export_weights()
        saved = _weights_and_moments(trainer)
        tensors, meta = export_state(trainer)
        if rank == 0:
            save_file(exported, f"{work}/adapter.safetensors")
            save_file(tensors, f"{work}/state.safetensors")
            with open(f"{work}/state.json", "w") as f:
                json.dump(meta, f)
        dist.barrier()
        fresh = GRPOTrainer(model_dir, TrainerConfig(**LORA))
        with open(f"{work}/state.json") as f:
            load_state(fresh, load_file(f"{work}/state.safetensors"), json.load(f))
        exact = all(map(torch.equal, saved, _weights_and_moments(fresh)))
        done, dcp_meta, _ = sharded_state.write(trainer, f"{work}/dcp", None)
        done.result()
        if rank == 0:
            with open(f"{work}/dcp.json", "w") as f:
                json.dump(dcp_meta, f)

        # The swap path moves the adapter state alone: parked, unparked in place, parked
        # again and filled (each rank from its own shards) into a trainer on the same base;
        # it then trains as `fresh` (the state loaded into a trainer of its own) does.
        host = park(trainer)
        back = unpark(host)
        pulled = all(map(torch.equal, saved, _weights_and_moments(back)))
        host = park(back)
        on_base = GRPOTrainer(model_dir, TrainerConfig(**LORA), base=back)
        to_fill = prepare_pull(on_base, host.layout, host.meta)
        plan = pull_pieces(host.layout, sharded_here(on_base), world_size, world_size, rank)
        assert list(plan) == [rank]  # the same sharding: each rank's own rows
        fill(to_fill, plan[rank], slices(host, plan[rank]))
        set_rng(on_base, host.rng)
        pulled = pulled and all(map(torch.equal, saved, _weights_and_moments(on_base)))
        step_batch(on_base, batches[0])
        step_batch(fresh, batches[0])
        a, b = on_base.export_weights(), fresh.export_weights()
        pulled = pulled and a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)

        lazy = GRPOTrainer(model_dir, TrainerConfig(**LORA, reshard_after_forward=False))
        for mb in batches:
            step_batch(lazy, mb)
        kept = lazy.export_weights()
        if rank == 0:
            save_file(kept, f"{work}/adapter_kept_gathered.safetensors")
        with open(f"{work}/rank{rank}.json", "w") as f:
            json.dump({"losses": losses, "exact": exact, "num_exported": len(exported),
                       "sharded": trainer.sharded, "num_state": len(tensors),
                       "pulled": pulled}, f)
    finally:
        dist.barrier()  # see tests/test_trainer.py's _rank_main
        dist.destroy_process_group()


@pytest.mark.slow
def test_two_gloo_ranks_train_the_adapter_as_one_rank(model_dir, batches, tmp_path):
    save_file({f"{i}.{f}": getattr(mb, f).contiguous() for i, mb in enumerate(batches)
               for f in FIELDS[:5]}, str(tmp_path / "batches.safetensors"))
    mp.spawn(_lora_rank, args=(2, model_dir, str(tmp_path)), nprocs=2, join=True)
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert [r["sharded"] for r in results] == [True, True]
    assert [r["exact"] for r in results] == [True, True]  # each rank's shards, bit for bit
    assert [r["pulled"] for r in results] == [True, True]  # parked, pulled: bit for bit
    single = lora_trainer(model_dir)
    losses = [step_batch(single, no_ref(mb)) for mb in batches]
    expected = single.export_weights()
    assert [r["num_exported"] for r in results] == [len(expected), 0]  # on rank 0 only
    assert [r["num_state"] for r in results] == [len(export_state(single)[0]), 0]
    assert results[0]["losses"] == results[1]["losses"]  # all-reduced: the same on every rank
    assert results[0]["losses"] == pytest.approx(losses, rel=LOSS_RTOL)
    two = load_file(str(tmp_path / "adapter.safetensors"))
    diff = max_diff(two, expected)
    print(f"LoRA, 2 ranks vs 1: max abs adapter diff {diff:.3g}")
    assert diff <= WEIGHT_ATOL
    assert max_diff(two, peft_names_of_fresh(model_dir)) > 100 * WEIGHT_ATOL  # it did learn
    kept = load_file(str(tmp_path / "adapter_kept_gathered.safetensors"))
    diff = max_diff(kept, expected)
    print(f"LoRA, 2 ranks (reshard_after_forward off) vs 1: max abs adapter diff {diff:.3g}")
    assert diff <= WEIGHT_ATOL
    # The 2 ranks' DCP files read back into one rank (resharded): their adapter.
    one = lora_trainer(model_dir)
    meta = json.loads((tmp_path / "dcp.json").read_text())
    sharded_state.read(one, str(tmp_path / "dcp"), meta, None)
    assert one.version == 2
    back = one.export_weights()
    assert back.keys() == two.keys() and all(torch.equal(back[k], two[k]) for k in two)


def peft_names_of_fresh(model_dir: str) -> dict[str, torch.Tensor]:
    """A fresh trainer's adapter (PEFT's start), as export_weights names it."""
    return lora_trainer(model_dir).export_weights()


# ----------------------------------------------------------------------------- runtime

@pytest.mark.slow
async def test_lora_trainer_worker_group_over_the_runtime(model_dir, batches, tmp_path,
                                                          no_leftover_children):
    """A 2-rank trainer worker group of a LoRA agent: its ExportWeights is the adapter's update
    (WeightUpdate.adapter: the agent, lora: its spec; the tensors under PEFT's names), the same
    after a SwapOut and SwapIn; SaveState with a model_dir writes PEFT's adapter directory;
    SendWeights (direct sync of the whole model) is refused."""
    from flexmarl.protocol import (ExportWeights, SaveState, SendWeights, SwapIn, SwapOut,
                                   TrainBeginBatch, TrainStep, WeightUpdate)
    from runtime.errors import RemoteError
    from runtime.supervisor import Supervisor, WorkerSpec
    from runtime.transport import connect
    from tests.helpers.trainers import FAST

    mb = no_ref(batches[0])
    config = TrainerConfig(**LORA)
    args = {"model_dir": model_dir, "agent": "solver", "world_size": 2,
            "init_method": f"file://{tmp_path}/store", "config": dataclasses.asdict(config),
            "num_threads": 1, "collective_timeout_s": 60}
    sup = Supervisor(config=FAST)
    async with sup.serving():
        handles = [await sup.start_worker(WorkerSpec(
            name=f"trainer{r}", entry="flexmarl.training.worker:trainer_worker",
            args={**args, "rank": r})) for r in range(2)]
        async with connect(handles[0].address) as lead:
            await lead.request(TrainBeginBatch(tokens(mb)))
            for j in (0, 4):
                await lead.request(rows(mb, j, j + 4), timeout_s=60)
            assert (await lead.request(TrainStep())).version == 1
            update = await lead.request(ExportWeights())
            assert isinstance(update, WeightUpdate) and update.version == 1
            assert (update.adapter, update.lora) == ("solver", SPEC.as_dict())
            parked = await lead.request(SwapOut())
            swapped = await lead.request(SwapIn("solver", model_dir, dataclasses.asdict(config),
                                                source=parked.ranks))
            assert swapped.how == "here"
            again = await lead.request(ExportWeights())
            saved = await lead.request(SaveState("", str(tmp_path / "final"), -1,
                                                 model_dir=model_dir), timeout_s=60)
            with pytest.raises(RemoteError, match="trains a LoRA adapter"):
                await lead.request(SendWeights(1, ["tcp://127.0.0.1:1"], "nccl"))
    local = lora_trainer(model_dir)
    step_batch(local, mb)
    expected = local.export_weights()
    assert update.tensors.keys() == expected.keys() == again.tensors.keys()
    assert all(torch.equal(update.tensors[k], again.tensors[k]) for k in expected)
    assert max_diff(update.tensors, expected) <= WEIGHT_ATOL
    files = load_file(os.path.join(saved.path, "adapter_model.safetensors"))
    assert all(torch.equal(files[k], update.tensors[k]) for k in expected)
