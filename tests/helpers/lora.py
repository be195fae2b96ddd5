"""LoRA adapters the tests share: the trainer's (SPEC, on every Linear of the model of
tests/helpers/trainers.py; its trainer config LORA, and stepping it: tests/test_lora_trainer.py,
tests/test_lora_swap.py) and the rollout engine's (ENGINE_SPEC; random adapters as PEFT computes
them: tests/test_lora_engine.py, tests/test_lora_units.py)."""
from __future__ import annotations

import dataclasses

import torch

from flexmarl.config.training import TrainerConfig
from flexmarl.models.lora import LoraSpec, adapter_tensors, wrap
from flexmarl.protocol import TrainMicroBatch
from flexmarl.training.trainer import GRPOTrainer
from tests.helpers.trainers import CONFIG, tokens

# ----------------------------------------------------------------------------- the trainer's

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
SPEC = LoraSpec(rank=4, alpha=8.0, target_modules=TARGETS)
LORA = {**CONFIG, "lora": SPEC.as_dict()}
"""tests/test_trainer.py's trainer (lr 1e-3, kl_coef 0.05) training an adapter on every Linear
of the blocks (2 blocks x 7 targets x A and B: 28 tensors)."""


def lora_trainer(model_dir: str, **overrides) -> GRPOTrainer:
    return GRPOTrainer(model_dir, TrainerConfig(**{**LORA, **overrides}))


def rows(mb: TrainMicroBatch, lo: int, hi: int) -> TrainMicroBatch:
    """Rows lo:hi of every field the micro-batch has (ref_logprobs may be None)."""
    return dataclasses.replace(mb, **{f.name: getattr(mb, f.name)[lo:hi]
                                      for f in dataclasses.fields(mb)
                                      if getattr(mb, f.name) is not None})


def step_batch(trainer: GRPOTrainer, mb: TrainMicroBatch, num_micro: int = 2) -> float:
    """One global batch in `num_micro` micro-batches, stepped; its loss."""
    trainer.begin_batch(tokens(mb))
    size = mb.input_ids.shape[0] // num_micro
    loss = sum(trainer.accumulate(rows(mb, j, j + size)).loss
               for j in range(0, mb.input_ids.shape[0], size))
    assert not trainer.step().skipped
    return loss


def checkpoint_name(name: str) -> str:
    """A base parameter's name in the PeftModel -> its name in the model directory."""
    return name.removeprefix("base_model.model.").replace(".base_layer.", ".")


# ----------------------------------------------------------------------------- the engine's

ENGINE_SPEC = LoraSpec(rank=4, alpha=8, target_modules=("q_proj", "v_proj", "down_proj"))


def random_adapter(model_dir: str, seed: int, spec: LoraSpec = ENGINE_SPEC):
    """A PEFT model of the base with a random (non-zero) adapter, and that adapter's tensors."""
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model = wrap(base, spec, "probe")
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    return model.eval(), adapter_tensors(model, "probe")
