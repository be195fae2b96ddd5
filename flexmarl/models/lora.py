"""LoRA adapters: an agent as a low-rank adapter on a base model that other agents share.

    AgentSpec(model="smollm2-135m", lora=LoraSpec(rank=16, alpha=32))
        trainer:  the base (frozen) + PEFT's LoRA layers ─► only the adapter trains
        sync:     the adapter's tensors only (PEFT's names, `adapter_tensors`) ─► the engine
                  reloads that adapter in place; the base is never sent again
        rollout:  one set of instances per base serves every adapter on it, each request
                  naming its agent's adapter (torch engine: PEFT mixed batches; vLLM:
                  enable_lora + LoRARequest)
        files:    `write_adapter` = PEFT's format (adapter_config.json +
                  adapter_model.safetensors): loadable by `peft` and by vLLM's --lora-modules

Tensor names are those of `peft.get_peft_model_state_dict` (the adapter's name removed), e.g.
`base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight`: what PEFT saves, what
`set_peft_model_state_dict` and vLLM's LoRA loader read. PEFT is the `lora` extra
(`pip install flexmarl[lora]`); nothing here imports it until an adapter is used.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

# The spec is part of the team API (flexmarl.team); the PEFT side of it lives here.
from flexmarl.team import VLLM_LORA_RANKS, LoraSpec  # noqa: F401  (re-exported)

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"


def peft_config(spec: LoraSpec) -> Any:
    """PEFT's LoraConfig for this adapter (inference_mode off: the trainer's copy trains)."""
    peft = import_peft()
    return peft.LoraConfig(r=spec.rank, lora_alpha=spec.alpha, lora_dropout=spec.dropout,
                           target_modules=list(spec.target_modules), bias="none",
                           task_type="CAUSAL_LM", **spec.extra)


def import_peft() -> Any:
    try:
        import peft
    except ImportError as exc:  # the extra is missing: say which
        raise ImportError("LoRA agents (AgentSpec.lora) need PEFT: pip install 'flexmarl[lora]' "
                          "(or pip install peft)") from exc
    return peft


def linear_names(model: torch.nn.Module) -> list[str]:
    """The distinct last names of the model's Linear modules (what target_modules names), the
    ones PEFT already wrapped included (their Linear is `<name>.base_layer`)."""
    names = set()
    for name, m in model.named_modules():
        if not isinstance(m, torch.nn.Linear) or not name or ".lora_" in name:
            continue
        names.add(name.removesuffix(".base_layer").rsplit(".", 1)[-1])
    return sorted(names)


def check_targets(model: torch.nn.Module, spec: LoraSpec, agent: str) -> None:
    """A clear error when the spec targets modules the model lacks (naming those it has)."""
    have = linear_names(model)
    missing = [t for t in spec.target_modules if t not in have]
    if missing:
        raise ValueError(f"agent {agent}: LoraSpec.target_modules {missing} are not Linear "
                         f"modules of its model; it has {have}")


def wrap(model: torch.nn.Module, spec: LoraSpec, adapter: str) -> Any:
    """The model with `adapter` added (PEFT's PeftModel; the base's weights frozen). The
    adapter starts as PEFT initialises it (B = 0: the model's outputs are the base's)."""
    check_targets(model, spec, adapter)
    peft = import_peft()
    return peft.get_peft_model(model, peft_config(spec), adapter_name=adapter)


def adapter_tensors(model: Any, adapter: str) -> dict[str, torch.Tensor]:
    """The adapter's tensors under PEFT's saved names (see the module docstring)."""
    peft = import_peft()
    return peft.get_peft_model_state_dict(model, adapter_name=adapter)


def load_adapter_tensors(model: Any, adapter: str, tensors: dict[str, torch.Tensor]) -> None:
    """Set an existing adapter's tensors in place; every tensor must match one of its own."""
    peft = import_peft()
    result = peft.set_peft_model_state_dict(model, tensors, adapter_name=adapter)
    unexpected = [k for k in getattr(result, "unexpected_keys", []) if "lora_" in k]
    if unexpected:
        raise ValueError(f"adapter {adapter}: tensors the adapter lacks: {unexpected[:5]}")


def adapter_config(spec: LoraSpec, base_model: str) -> dict:
    """adapter_config.json as PEFT writes it (vLLM reads the same file)."""
    config = peft_config(spec)
    config.base_model_name_or_path = base_model
    config.inference_mode = True
    d = config.to_dict()
    return {k: (sorted(v) if isinstance(v, set) else v) for k, v in d.items()}


def write_adapter(path: str | Path, spec: LoraSpec, tensors: dict[str, torch.Tensor],
                  base_model: str) -> Path:
    """An adapter directory in PEFT's format (peft.PeftModel.from_pretrained(base, path) and
    vLLM's LoRARequest(name, id, path) load it)."""
    from safetensors.torch import save_file

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / ADAPTER_CONFIG).write_text(json.dumps(adapter_config(spec, base_model), indent=2))
    save_file({k: v.detach().contiguous().cpu() for k, v in tensors.items()},
              str(path / ADAPTER_WEIGHTS), metadata={"format": "pt"})
    return path


def read_adapter(path: str | Path) -> tuple[LoraSpec, dict[str, torch.Tensor]]:
    """The spec and tensors of an adapter directory `write_adapter` (or PEFT) wrote."""
    from safetensors.torch import load_file

    path = Path(path)
    config = json.loads((path / ADAPTER_CONFIG).read_text())
    spec = LoraSpec(rank=config["r"], alpha=config["lora_alpha"],
                    dropout=config.get("lora_dropout", 0.0),
                    target_modules=tuple(config["target_modules"]))
    return spec, load_file(str(path / ADAPTER_WEIGHTS))


def merged_weights(base_model: str, spec: LoraSpec, tensors: dict[str, torch.Tensor]
                   ) -> dict[str, torch.Tensor]:
    """The base model's weights with the adapter merged in (W + B A * alpha / rank, PEFT's
    merge_and_unload), under the base's own names: a whole model's state dict."""
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(base_model, dtype=torch.float32)
    model = wrap(base, spec, "merge")
    load_adapter_tensors(model, "merge", tensors)
    merged = model.merge_and_unload()
    unique = {n for n, _ in merged.named_parameters()}  # a tied tensor under its first name
    aliases = {n for n, _ in merged.named_parameters(remove_duplicate=False)} - unique
    return {k: v.detach().contiguous() for k, v in merged.state_dict().items() if k not in aliases}

