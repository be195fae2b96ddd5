"""A LoRA trainer's policy (trainer.lora): the base model with PEFT's LoRA layers, the adapter's
tensors under PEFT's saved names, and the base alone (the KL reference).

    build_model ─► wrap_policy (PEFT: LoRA layers inside the decoder blocks, the base frozen)
      ─► trainer._speed_up / _place as for a full model (FSDP2 shards the same blocks: PEFT
         replaces the targeted Linear modules inside them, the blocks themselves stay)
    export:    the adapter's parameters (gathered) ─► peft_names ─► PEFT's names, what
               flexmarl.models.lora.adapter_tensors gives for an unsharded model
    reference: the same modules under base_only (the adapter's layers skipped): no second copy

Inside the trainer the adapter is always named ADAPTER, whatever the agent's name: PEFT's saved
names leave it out, so neither the engines nor a saved adapter ever see it.
"""
from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import nn

from flexmarl.models.lora import LoraSpec, check_targets, import_peft, wrap

ADAPTER = "default"
"""The adapter's name in the trainer's PeftModel (PEFT's default)."""


def wrap_policy(model: nn.Module, lora: dict, agent: str) -> nn.Module:
    """`model` with the adapter of `lora` (TrainerConfig.lora) added, as PEFT initialises it
    (B = 0: the policy starts as the base); only the adapter's parameters require grad."""
    spec = LoraSpec.from_dict(lora)
    # Checked here, not only in wrap(): its message names the agent, and wrap() knows only the
    # adapter's name (ADAPTER, the same for every agent).
    check_targets(model, spec, agent or "(trainer.lora)")
    return wrap(model, spec, ADAPTER)


def inner(model: nn.Module) -> nn.Module:
    """The Hugging Face model inside the PeftModel (what gradient checkpointing is set on)."""
    return model.get_base_model()


def peft_names(model: nn.Module, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The adapter's tensors, given by their parameter names in `model` (full, not sharded),
    under PEFT's saved names. PEFT picks and renames them from the state dict it is given, so
    tensors gathered from FSDP shards go through the same code as an unsharded model's own
    (flexmarl.models.lora.adapter_tensors); the tensors themselves are not copied.

    One difference, by design: an adapter on embed_tokens or lm_head makes PEFT add that
    layer's frozen base weight to an unsharded model's adapter_tensors (save_embedding_layers
    "auto"); it is not given here, so it is left out: the engines have the base already, and
    PEFT loads an adapter without it."""
    peft = import_peft()
    return peft.get_peft_model_state_dict(model, state_dict=tensors, adapter_name=ADAPTER)


def saved_names(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A trainer state's adapter tensors (parameter names in the PeftModel, "...lora_A.default.
    weight") under PEFT's saved names ("...lora_A.weight"), without a model: what
    `flexmarl eval --step` loads into an engine."""
    infix = f".{ADAPTER}."
    return {k.replace(infix, ".", 1) if infix in k else k: v for k, v in tensors.items()}


def base_only(model: Any) -> contextlib.AbstractContextManager:
    """The policy's forward as the base model's: PEFT's disable_adapter() (each LoRA layer
    returns its base layer's output alone), under no_grad in the trainer.

    It sets the adapter's requires_grad to False and back to True on exit, on whichever
    parameters the modules hold then (FSDP2 swaps sharded and unsharded ones). That is safe
    under FSDP2: each unshard copies the shard's requires_grad to the unsharded parameter, and
    backward unshards every block again before its gradient accumulates (2 ranks train the
    adapter as 1 does: tests/test_lora_trainer.py)."""
    return model.disable_adapter()
