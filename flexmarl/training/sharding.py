"""The policy's modules before training: built from a model directory (its weights, or empty
on the meta device), frozen but for the last decoder blocks (trainer.train_layers), and sharded
with FSDP2 block by block. GRPOTrainer (flexmarl.training.trainer) calls these once per model.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

GRAD_SUM_FACTOR = 1.0
"""FSDP gradient divide factor: 1 turns the default mean over ranks into a sum."""


def decoder_blocks(model: nn.Module) -> list[nn.Module]:
    """The model's decoder blocks (the classes its `_no_split_modules` names), in order."""
    block_names = set(getattr(model, "_no_split_modules", None) or ())
    return [m for m in model.modules() if type(m).__name__ in block_names]


def shard_model(model: nn.Module, mesh: "dist.DeviceMesh", *, reshard_after_forward: bool,
                param_dtype: str = "float32", reduce_dtype: str = "float32") -> None:
    """FSDP2: `fully_shard` each decoder block, then the root (embeddings, final norm, head).

    Every rank's loss is already divided by the *global* token count, so the full gradient is the
    sum of the ranks' gradients. FSDP's default reduction averages (divides by world size); a
    divide factor of 1 with sum-only collectives makes it a plain sum with no extra scaling pass
    (gloo has no AVG or PREMUL_SUM reduction, so the sum-only form is also what runs on CPU; gloo
    sums bfloat16 too).

    `param_dtype` / `reduce_dtype` (trainer.param_dtype / reduce_dtype) other than float32 give
    every fully_shard a MixedPrecisionPolicy: blocks compute in param_dtype, the sharded
    parameters and their gradients stay float32, and the root's outputs (the logits) are cast
    back to float32. All float32 (the default) passes no policy at all.
    """
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

    blocks = decoder_blocks(model)
    if not blocks:
        raise ValueError(f"{type(model).__name__} names no decoder block class in "
                         "_no_split_modules; FSDP needs the blocks to shard one by one")
    block_mp, root_mp = {}, {}
    if (param_dtype, reduce_dtype) != ("float32", "float32"):
        policy = dict(param_dtype=getattr(torch, param_dtype),
                      reduce_dtype=getattr(torch, reduce_dtype))
        block_mp = {"mp_policy": MixedPrecisionPolicy(**policy)}
        root_mp = {"mp_policy": MixedPrecisionPolicy(**policy, output_dtype=torch.float32)}
    for block in blocks:
        fully_shard(block, mesh=mesh, reshard_after_forward=reshard_after_forward, **block_mp)
    # The root's parameters are needed again at once by backward: keep them gathered.
    fully_shard(model, mesh=mesh, reshard_after_forward=False, **root_mp)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(GRAD_SUM_FACTOR)
            module.set_force_sum_reduction_for_comms(True)


def freeze_all_but(model: nn.Module, train_layers: int) -> list[str]:
    """Freeze every parameter but those of the last `train_layers` decoder blocks and the final
    norm (train_layers = 0: freeze nothing); the names of those that train."""
    if train_layers == 0:
        return [n for n, _ in model.named_parameters()]
    block_names = set(getattr(model, "_no_split_modules", None) or ())
    blocks = [(n, m) for n, m in model.named_modules() if type(m).__name__ in block_names]
    if train_layers > len(blocks):
        raise ValueError(f"trainer.train_layers = {train_layers} but the model has "
                         f"{len(blocks)} decoder blocks")
    keep = [n + "." for n, _ in blocks[-train_layers:]]
    # The final norm: the one norm outside every block (model.norm in Llama and Qwen2).
    inside = tuple(n + "." for n, _ in blocks)
    norms = [n + "." for n, m in model.named_modules()
             if "norm" in type(m).__name__.lower() and not n.startswith(inside) and n]
    trained = []
    for name, p in model.named_parameters():
        p.requires_grad_(name.startswith(tuple(keep + norms)))
        if p.requires_grad:
            trained.append(name)
    return trained


def build_model(model_dir: str, empty: bool) -> nn.Module:
    """The model of `model_dir` in float32: its weights, or (empty) on the meta device, from
    its config alone (no weight file read)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    if not empty:
        return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir),
                                                 dtype=torch.float32)
    model.tie_weights()  # as from_pretrained does (lm_head = embed_tokens where the config ties)
    return model


def _local(t: torch.Tensor) -> torch.Tensor:
    """The tensor this rank holds: the local shard of a DTensor, the tensor itself otherwise."""
    return t.to_local() if hasattr(t, "to_local") else t

