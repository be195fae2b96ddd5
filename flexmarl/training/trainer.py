"""Training engine of one agent: GRPO with FSDP2 on every rank of a torch.distributed group.

One `GRPOTrainer` lives in each rank's process; every rank makes the same calls in the same
order (the trainer worker, `flexmarl.training.worker`, sees to that), because each call below
runs collectives:

    begin_batch(num_tokens)     fix the loss normaliser of the global batch, zero gradients
    accumulate(micro_batch) *   this rank's rows: forward, GRPO loss, backward (gradient adds up)
    step()                      clip, AdamW step, version += 1
    export_weights()            full Hugging Face-named state dict on rank 0 (for weight sync)
    export_state / load_state   the whole training state gathered on rank 0 and back, bit for
                                bit: snapshots and checkpoints (ExportState), never a swap
    park / unpark, pull_pieces    the swap path, in flexmarl.training.parking: each rank's own
                                shards to host memory of its process and back in place, and the
                                slices another group's ranks need (dim 0 resharded as FSDP2
                                does), pulled slot to slot (flexmarl.training.worker)

The model is sharded with `fully_shard` on each decoder block and then the root (`shard_model`);
gradients are reduced as a plain *sum* across ranks, because each rank's loss is already divided
by the global token count (see `shard_model`). World size 1 needs no process group: the model is
then used unsharded. Building, freezing and sharding the modules live in
`flexmarl.training.sharding`, the settings in `flexmarl.config.training`, the formulas in
`flexmarl.training.grpo`.

Precision: parameters, gradients and AdamW state are always float32 (the master weights);
trainer.param_dtype = "bfloat16" only lowers the dtype the forward and backward compute in (FSDP2's
MixedPrecisionPolicy when sharded, torch.autocast when not), and the log-probabilities and the loss
are computed from float32 logits either way: those of the response positions only, a chunk of
trainer.logits_chunk_tokens positions at a time (flexmarl.training.logits), never the whole
micro-batch's. trainer.activation_checkpointing and trainer.compile act on the policy's decoder
blocks in place, so parameter names stay the checkpoint's.

LoRA (trainer.lora, `flexmarl.training.adapter`): the model is PEFT's PeftModel over the base,
sharded the same way (its LoRA layers live inside the decoder blocks); only the adapter trains
and AdamW holds only it. export_weights gives the adapter's tensors under PEFT's names,
export_state and the DCP state the adapter and its AdamW state (the frozen base is rebuilt from
the model directory), and the KL reference is the base: the same modules, adapter disabled.
The swap path moves the adapter state alone too: a slot keeps the base resident and its LoRA
trainers share those modules (`base`, flexmarl.training.parking.ResidentBase), each with its
own AdamW.
"""
from __future__ import annotations

import contextlib
import logging
import math
import time
from typing import TYPE_CHECKING, Any, Iterator

import torch
import torch.distributed as dist
from torch import nn

from flexmarl.config.training import TrainerConfig
from flexmarl.training.adapter import base_only, inner, peft_names, wrap_policy
from flexmarl.training.grpo import grpo_loss
from flexmarl.training.logits import Scores, score_tokens
from flexmarl.training.prefix import policy_hidden, shared_prefix
from flexmarl.protocol import TrainMicroBatch, TrainStats, TrainStepDone
# Re-exported: users, tests and bench scripts import these from here.
from flexmarl.training.sharding import (GRAD_SUM_FACTOR, _local, build_model, decoder_blocks,
                                        freeze_all_but, shard_model)

if TYPE_CHECKING:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

__all__ = ["GRAD_SUM_FACTOR", "GRPOTrainer", "build_model", "decoder_blocks", "export_state", "freeze_all_but",
           "load_state", "model_state", "shard_model", "state_options"]

log = logging.getLogger(__name__)

MODULE_SETTINGS = ("lora", "param_dtype", "reduce_dtype", "reshard_after_forward",
                   "activation_checkpointing", "compile", "device")
"""The TrainerConfig fields that shape a trainer's modules (PEFT's layers, FSDP's mixed
precision and resharding, checkpointing and compiled blocks, the device): two LoRA trainers
that agree on these (and the model directory and world size) can share one set of modules."""


class GRPOTrainer:
    """GRPO trainer of one policy model on this rank; see the module docstring for the calls."""

    def __init__(self, model_dir: str, config: TrainerConfig | None = None, *,
                 empty: bool = False, agent: str = "", base: GRPOTrainer | None = None) -> None:
        """`empty`: build the modules without reading any weights (their tensors hold garbage
        until a pull from another slot's shards fills every one of them: local_tensors).
        `agent`: whose trainer this is, for error messages (trainer.lora's target modules).
        `base` (trainer.lora): another LoRA trainer of the same model directory and the same
        module-shaping settings (flexmarl.training.parking.base_key) whose modules this one
        takes instead of building its own: the slot's resident base. Nothing is built or read;
        the adapter's parameters are those modules' own and hold whatever they last held (the
        caller sets them); this trainer's own are its config, version and AdamW (empty)."""
        self.config = config or TrainerConfig()
        self.version = 0
        # A process group of one rank shards nothing: FSDP2 there would only add its DTensor
        # dispatch to every op (measured 1.5-2x a micro-batch's CPU on SmolLM2, one thread).
        self.sharded = (dist.is_available() and dist.is_initialized()
                        and dist.get_world_size() > 1)
        self.rank = dist.get_rank() if self.sharded else 0
        self.world_size = dist.get_world_size() if self.sharded else 1
        if self.config.device == "cuda":
            if not torch.cuda.is_available():
                raise RuntimeError("trainer.device is 'cuda' but no CUDA device is visible; "
                                   "set trainer.device='cpu'")
            self.device = torch.device("cuda", torch.cuda.current_device())
        else:
            self.device = torch.device("cpu")
        torch.manual_seed(self.config.seed)
        if base is not None:
            self._share(base)
            return
        model = build_model(model_dir, empty)
        # Tied weights (e.g. lm_head = embed_tokens) appear under several names; the checkpoint
        # (and so the rollout engines) knows only the first, as save_pretrained writes it.
        unique = {n for n, _ in model.named_parameters()}
        aliases = {n for n, _ in model.named_parameters(remove_duplicate=False)} - unique
        self.export_names = [n for n in model.state_dict() if n not in aliases]
        if self.config.lora is not None:
            # Before _speed_up and _place: PEFT's layers go inside the blocks those act on.
            model = wrap_policy(model, self.config.lora, agent)
            self.trained_names = [n for n, p in model.named_parameters() if p.requires_grad]
        else:
            self.trained_names = freeze_all_but(model, self.config.train_layers)
        """Parameter names that train (all of them unless trainer.train_layers; the adapter's
        with trainer.lora, named as in the PeftModel)."""
        model.train()
        self._speed_up(model)
        self._place(model, empty, reshard_after_forward=self.config.reshard_after_forward)
        self.model = model
        self.reference = (self._reference(model_dir, empty)
                          if self.config.kl_coef > 0 and self.config.lora is None else None)
        """The agent's initial weights, frozen: the KL term's reference policy (with
        trainer.lora, None: the reference is the policy's own base, `adapter.base_only`)."""
        self._optimizer()

    def _optimizer(self) -> None:
        """A new AdamW over the model's trained parameters (its state empty), no batch begun."""
        c = self.config
        self.optimizer = torch.optim.AdamW(
            [p for p in self.model.parameters() if p.requires_grad], lr=c.lr, betas=c.betas,
            eps=c.adam_eps, weight_decay=c.weight_decay)
        self._normaliser: float | None = None
        self._deferred = False
        self._tokens_seen = 0
        self._rows_seen = 0

    def _share(self, base: GRPOTrainer) -> None:
        """Take `base`'s modules (see __init__'s `base`); refused unless both train an adapter
        of the same spec at the same precision and sharding, the parts of the config the
        modules were built with (the rest, e.g. lr or kl_coef, is this trainer's own)."""
        ours, theirs = ([getattr(c, k) for k in MODULE_SETTINGS]
                        for c in (self.config, base.config))
        if self.config.lora is None or ours != theirs or base.world_size != self.world_size:
            raise ValueError("GRPOTrainer(base=...): a LoRA trainer takes the modules of another "
                             f"of the same {', '.join(MODULE_SETTINGS)} and world size only")
        self.model, self.reference = base.model, None
        self.export_names, self.trained_names = base.export_names, base.trained_names
        self._optimizer()

    def _reference(self, model_dir: str, empty: bool) -> nn.Module:
        ref = build_model(model_dir, empty)
        ref.eval().requires_grad_(False)
        # The same shards as the policy: its forward is collective too.
        self._place(ref, empty, reshard_after_forward=True)
        return ref

    def _speed_up(self, model: nn.Module) -> None:
        """trainer.activation_checkpointing and trainer.compile on the policy's decoder blocks,
        before sharding; both act in place, so every parameter keeps its checkpoint name (what
        export_weights, export_state and the parking module's layouts go by)."""
        c = self.config
        hf_model = inner(model) if c.lora is not None else model
        if c.activation_checkpointing:
            if not getattr(hf_model, "supports_gradient_checkpointing", False):
                raise ValueError(f"trainer.activation_checkpointing: {type(hf_model).__name__} "
                                 "does not support Hugging Face gradient checkpointing")
            # Non-reentrant: works with inputs that need no gradient, FSDP's hooks and autocast.
            hf_model.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False})
            hf_model.config.use_cache = False
            # Transformers also makes the embeddings' output require grad (for the reentrant
            # form and adapters): with frozen embeddings and blocks (train_layers) that would run
            # backward, and recompute, through every frozen block. The non-reentrant form needs
            # no such hook (a LoRA adapter's parameters inside a block get their gradient all
            # the same).
            if hasattr(hf_model, "disable_input_require_grads"):
                hf_model.disable_input_require_grads()
        if c.compile:
            blocks = decoder_blocks(hf_model)
            if not blocks:
                raise ValueError(f"trainer.compile: {type(hf_model).__name__} names no decoder "
                                 "block class in _no_split_modules")
            for block in blocks:
                block.compile()  # in place (torch.compile(block) would add "_orig_mod.")

    def _place(self, model: nn.Module, empty: bool, *, reshard_after_forward: bool) -> None:
        """Onto this rank's device, sharded. An empty (meta) model is sharded first and then
        given uninitialised memory of its shards only."""
        if empty:
            self._shard(model, reshard_after_forward=reshard_after_forward)
            model.to_empty(device=self.device)
            if not self.sharded:  # to_empty gave each tied name its own new Parameter
                model.tie_weights()
            return
        model.to(self.device)
        with torch.no_grad():
            # Parameters loaded from safetensors may live in a memory-mapped file: give each its
            # own, owned memory, so that updates in place never touch the model's file (and
            # park can free its storage).
            for p in model.parameters():
                if not p.untyped_storage().resizable():
                    p.data = p.data.clone()
        self._shard(model, reshard_after_forward=reshard_after_forward)

    def _shard(self, model: nn.Module, *, reshard_after_forward: bool) -> None:
        """FSDP2 over this process group's ranks (nothing at world size 1)."""
        if self.sharded:
            from torch.distributed.device_mesh import init_device_mesh
            mesh = init_device_mesh(self.device.type, (self.world_size,))
            shard_model(model, mesh, reshard_after_forward=reshard_after_forward,
                        param_dtype=self.config.param_dtype,
                        reduce_dtype=self.config.reduce_dtype)

    def _autocast(self) -> contextlib.AbstractContextManager:
        """Unsharded, param_dtype below float32: the forward passes under torch.autocast (FSDP's
        MixedPrecisionPolicy does it when sharded; float32 needs nothing)."""
        if self.sharded or self.config.param_dtype == "float32":
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type,
                              dtype=getattr(torch, self.config.param_dtype))

    # ------------------------------------------------------------------ training

    def begin_batch(self, num_tokens: int | None = None) -> None:
        """Start a global batch of `num_tokens` response tokens (over all its micro-batches).

        None (or 0) defers the count to step(num_tokens): micro-batches then accumulate the
        un-normalised token sum and step() divides the gradient by the count once. Both give the
        full-batch gradient; the deferred form is what lets micro-batches be trained while the
        rest of the batch is still being generated.
        """
        if num_tokens is not None and (not isinstance(num_tokens, int) or num_tokens < 0):
            raise ValueError(f"begin_batch needs the global batch's response-token count (> 0), "
                             f"or None to declare it at step(); got {num_tokens!r}")
        self._deferred = not num_tokens
        self._normaliser = 1.0 if self._deferred else float(num_tokens)
        self._tokens_seen = 0
        self._rows_seen = 0
        self.optimizer.zero_grad(set_to_none=True)

    def accumulate(self, mb: TrainMicroBatch) -> TrainStats:
        """Forward and backward this rank's share of `mb` (every rank gets the same full `mb`)."""
        if self._normaliser is None:
            raise RuntimeError("accumulate() before begin_batch(): call begin_batch(num_tokens) "
                               "at the start of each global batch")
        c = self.config
        rows = self._my_rows(mb)
        shared = self._shared_prefix(mb)
        scoring = self._scoring(rows)
        ref = rows.get("ref_logprobs")
        # KL to the frozen initial weights, both at the rows' temperatures and untruncated: a
        # truncated reference can give a sampled token probability 0 (an infinite KL).
        plain = {"temperature": scoring["temperature"]} if c.kl_coef > 0 and ref is None else None
        scores = self._scores(self.model, rows, shared, scoring, entropy=True,
                              plain=plain is not None and len(scoring) > 1)
        if plain is not None:
            ref = self._reference_logprobs(rows, plain, shared)
        loss, metrics = grpo_loss(
            scores.logprobs, rows["old_logprobs"], rows["advantages"], rows["response_mask"],
            normaliser=self._normaliser, clip_eps=c.clip_eps, clip_eps_high=c.clip_eps_high,
            ref_logprobs=ref, kl_coef=c.kl_coef, is_cap=c.is_cap or None,
            kl_logprobs=scores.plain)
        loss.backward()
        entropy = scores.entropy[rows["response_mask"].bool()].sum().item()
        # Metrics are means over this rank's tokens: sum them up as totals across ranks.
        n = metrics["num_tokens"]
        totals = torch.tensor([loss.item(), n, metrics["clip_frac"] * n,
                               metrics["ratio_mean"] * n, metrics["kl"] * n,
                               metrics.get("is_weight_mean", 0.0) * n,
                               metrics.get("is_truncated_frac", 0.0) * n, entropy],
                              dtype=torch.float64, device=self.device)
        if self.sharded:
            dist.all_reduce(totals)
        (loss_sum, num_tokens, clipped, ratio_sum, kl_sum, w_sum, trunc,
         entropy_sum) = totals.tolist()
        self._tokens_seen += int(num_tokens)
        self._rows_seen += int(mb.input_ids.shape[0])  # every rank has the whole micro-batch
        if not self._deferred and self._tokens_seen > self._normaliser:
            raise ValueError(f"the global batch has {self._tokens_seen} response tokens so far but "
                             f"begin_batch declared {int(self._normaliser)}: the loss would be "
                             "over-weighted; pass the true total to begin_batch")
        denom = max(num_tokens, 1.0)
        out = {"clip_frac": clipped / denom, "ratio_mean": ratio_sum / denom, "kl": kl_sum / denom,
               "entropy": entropy_sum / denom}
        if c.is_cap:
            out |= {"is_weight_mean": w_sum / denom, "is_truncated_frac": trunc / denom}
        # With a deferred normaliser (begin_batch(None)) the loss is the batch's token *sum*.
        return TrainStats(loss=loss_sum, num_tokens=int(num_tokens), metrics=out)

    def _shared_prefix(self, mb: TrainMicroBatch) -> int:
        """The leading tokens of `mb` computed once (flexmarl.training.prefix.shared_prefix):
        from the whole `mb`, which every rank has, so all ranks run the same number of
        forwards (each a collective under FSDP); a rank's dummy rows copy row 0 (_my_rows)."""
        return shared_prefix(mb, checkpointing=self.config.activation_checkpointing)

    def _scores(self, model: nn.Module, rows: dict[str, torch.Tensor], shared: int,
                scoring: dict, **wanted: bool) -> Scores:
        """The rows scored under `model` from the position before their first response token,
        the LM head applied a chunk of trainer.logits_chunk_tokens positions at a time
        (flexmarl.training.logits); `wanted`: score_tokens' plain and entropy."""
        with self._autocast():
            hidden, start = policy_hidden(model, rows, shared)
            return score_tokens(hidden, rows["input_ids"], **scoring, start=start,
                                chunk_tokens=self.config.logits_chunk_tokens, **wanted)

    def _reference_logprobs(self, rows: dict[str, torch.Tensor], scoring: dict, shared: int
                            ) -> torch.Tensor:
        """The rows' token log-probabilities under the reference policy: the frozen copy of the
        initial weights, or with trainer.lora the base (this model, its adapter disabled),
        scored as the policy is (`_scores`: the same start, shared prefix and chunks). Under
        FSDP a collective like any forward: every rank runs it for every micro-batch."""
        reference, base = self.reference, contextlib.nullcontext()
        if self.config.lora is not None:
            reference, base = self.model, base_only(self.model)
        with torch.no_grad(), base:
            return self._scores(reference, rows, shared, scoring).logprobs

    def _scoring(self, rows: dict[str, torch.Tensor]) -> dict:
        """How to score these rows: each row's own sampling settings, or trainer.temperature."""
        if "sampling" not in rows:
            return {"temperature": self.config.temperature}
        s = rows["sampling"]
        return {"temperature": s[:, 0], "top_k": s[:, 1].round().long(), "top_p": s[:, 2]}

    def _my_rows(self, mb: TrainMicroBatch) -> dict[str, torch.Tensor]:
        """This rank's contiguous block of rows, padded with fully masked dummy rows.

        Every rank must run forward and backward the same number of times (FSDP's all-gathers
        and reduce-scatters are collectives), even when the rows do not divide evenly. Dummy rows
        attend normally (an all-zero attention row would give NaN in softmax) but carry no
        response token, so they add exactly 0 to loss and gradient.
        """
        num_rows = mb.input_ids.shape[0]
        if num_rows == 0 or mb.input_ids.dim() != 2:
            raise ValueError(f"TrainMicroBatch.input_ids must be [rows >= 1, T], got "
                             f"{tuple(mb.input_ids.shape)}")
        per_rank = math.ceil(num_rows / self.world_size)
        lo = min(self.rank * per_rank, num_rows)
        hi = min(lo + per_rank, num_rows)
        pad = per_rank - (hi - lo)
        fields = {"input_ids": (mb.input_ids, torch.long, 0),
                  "attention_mask": (mb.attention_mask, torch.long, 1),
                  "response_mask": (mb.response_mask, torch.bool, 0),
                  "old_logprobs": (mb.old_logprobs, torch.float32, 0),
                  "advantages": (mb.advantages, torch.float32, 0)}
        if mb.ref_logprobs is not None:
            fields["ref_logprobs"] = (mb.ref_logprobs, torch.float32, 0)
        if mb.sampling is not None:  # dummy rows: temperature 1, untruncated
            fields["sampling"] = (mb.sampling, torch.float32, 1)
        rows = {}
        for name, (t, dtype, fill) in fields.items():
            if t.shape[0] != num_rows:
                raise ValueError(f"TrainMicroBatch.{name} has {t.shape[0]} rows, input_ids "
                                 f"{num_rows}")
            part = t[lo:hi].to(self.device, dtype)
            if pad:
                filler = torch.full((pad, *t.shape[1:]), fill, dtype=dtype, device=self.device)
                if name in ("input_ids", "attention_mask"):  # row 0's tokens: its prefix is
                    filler[:] = t[:1].to(self.device, dtype)  # shared (_shared_prefix)
                part = torch.cat([part, filler])
            rows[name] = part
        if pad and "sampling" in rows:
            rows["sampling"][-pad:, 1] = 0  # dummy rows untruncated (top_k 0)
        return rows

    def step(self, num_tokens: int | None = None) -> TrainStepDone:
        """Clip the gradient norm, AdamW step, zero gradients, version += 1.

        `num_tokens` is required when begin_batch() deferred it, and must then equal the
        response tokens actually accumulated: the gradient is divided by it here.
        """
        if self._normaliser is None or self._tokens_seen == 0:
            raise RuntimeError("step() without gradient: call begin_batch() and accumulate() at "
                               "least once since the last step")
        start = time.perf_counter()
        if self._deferred:
            if num_tokens != self._tokens_seen:
                raise ValueError(f"step(num_tokens={num_tokens}) but {self._tokens_seen} response "
                                 "tokens were accumulated since begin_batch(); pass the global "
                                 "batch's true total")
            with torch.no_grad():
                for p in self.model.parameters():
                    if p.grad is not None:
                        p.grad.div_(float(num_tokens))
        elif num_tokens is not None and num_tokens != int(self._normaliser):
            raise ValueError(f"step(num_tokens={num_tokens}) disagrees with begin_batch("
                             f"{int(self._normaliser)})")
        elif self._tokens_seen < self._normaliser:
            log.warning("global batch declared %d response tokens but %d were trained; the "
                        "update is scaled down accordingly", int(self._normaliser),
                        self._tokens_seen)
        max_norm = self.config.grad_clip if self.config.grad_clip > 0 else math.inf
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm)
        if hasattr(norm, "full_tensor"):  # a DTensor under FSDP: the norm of the whole model
            norm = norm.full_tensor()
        grad_norm = float(norm)
        if math.isfinite(grad_norm):
            self.optimizer.step()
        else:
            # One poisoned batch must not destroy the weights; the version still advances so
            # the pipeline's bookkeeping stays one version per global batch.
            log.warning("gradient norm is %s: skipping this optimizer step", grad_norm)
        self.optimizer.zero_grad(set_to_none=True)
        self._normaliser = None
        self.version += 1
        return TrainStepDone(version=self.version, grad_norm=grad_norm,
                             step_s=time.perf_counter() - start,
                             skipped=not math.isfinite(grad_norm), samples=self._rows_seen)

    # ------------------------------------------------------------------ weights

    def export_weights(self) -> dict[str, torch.Tensor]:
        """Full, unsharded CPU weights named as in the HF checkpoint; {} on ranks other than 0.
        With trainer.lora, the adapter's tensors only, under PEFT's saved names (those of
        flexmarl.models.lora.adapter_tensors: what PEFT and the engines load).

        A collective: every rank must call it. The tensors never alias the live parameters, so
        later steps do not change what was exported.
        """
        if self.config.lora is not None:
            adapter = self.adapter_full()
            return peft_names(self.model, adapter) if self.rank == 0 else {}
        if self.sharded:
            from torch.distributed.checkpoint.state_dict import (StateDictOptions,
                                                                 get_model_state_dict)
            full = get_model_state_dict(self.model, options=StateDictOptions(
                full_state_dict=True, cpu_offload=True))
        else:
            full = self.model.state_dict()
        if self.rank != 0:
            return {}
        live = {s.data_ptr() for s in self._live_storages()}
        out = {}
        names = self.export_names
        if self.config.train_layers:  # the frozen rest is what the instances serve already
            trained = set(self.trained_names)
            names = [n for n in names if n in trained]
        for name in names:
            t = full[name].detach()
            if t.device.type != "cpu" or t.untyped_storage().data_ptr() in live:
                t = t.to("cpu", copy=True)
            out[name] = t
        return out

    def adapter_full(self) -> dict[str, torch.Tensor]:
        """trainer.lora: the adapter's parameters, full, as CPU copies, by their names in the
        model; {} on ranks other than 0. A collective under FSDP (each parameter all-gathered
        in turn, on every rank). Gathered here rather than by torch's full state dict, which
        with ignore_frozen_params still keeps a frozen weight's tied alias (lm_head.weight) and
        would gather the whole embedding for it."""
        params = dict(self.model.named_parameters())
        out = {}
        for name in self.trained_names:
            p = params[name].detach()
            if hasattr(p, "full_tensor"):
                p = p.full_tensor()
            if self.rank == 0:
                out[name] = p.to("cpu", copy=True)  # a copy: never the live parameter
        return out

    def _live_storages(self) -> Iterator[torch.UntypedStorage]:
        """Storages of this rank's parameters, gradients and optimizer state, each once."""
        tensors: list[torch.Tensor] = []
        for p in self.model.parameters():
            tensors.append(_local(p.detach()))
            if p.grad is not None:
                tensors.append(_local(p.grad))
        for state in self.optimizer.state.values():
            tensors.extend(_local(v) for v in state.values() if isinstance(v, torch.Tensor))
        seen: set[int] = set()
        for t in tensors:
            storage = t.untyped_storage()
            if storage.nbytes() and storage.data_ptr() not in seen:
                seen.add(storage.data_ptr())
                yield storage


# ----------------------------------------------------------------------------- state swapping

def frozen_left_out(trainer: GRPOTrainer) -> bool:
    """Whether `trainer`'s states leave its frozen parameters out: with trainer.lora (the base)
    or trainer.train_layers (the blocks before the last N). They never change, and a trainer
    that loads a state is built from the model directory, which holds them; SmolLM2 with its
    last 6 of 30 blocks trained: 255 MB a state instead of 822."""
    return trainer.config.lora is not None or bool(trainer.config.train_layers)


def state_options(trainer: GRPOTrainer, **kwargs) -> StateDictOptions:
    """torch.distributed.checkpoint's options for `trainer`'s state dicts (`kwargs`: the
    caller's own). Where frozen parameters are left out of every state (frozen_left_out; see
    also `model_state`) a load expects the trained ones alone (not strict: the frozen names are
    missing by design; load_state checks the trained ones are all there)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    frozen_out = frozen_left_out(trainer)
    return StateDictOptions(ignore_frozen_params=frozen_out, strict=not frozen_out, **kwargs)


def model_state(trainer: GRPOTrainer, state: dict[str, Any]) -> dict[str, Any]:
    """A model state dict as `trainer`'s state holds it: the trained tensors alone where frozen
    ones are left out (frozen_left_out; torch's ignore_frozen_params keeps the tied aliases of
    frozen weights, e.g. lm_head.weight); everything otherwise."""
    if not frozen_left_out(trainer):
        return state
    trained = set(trainer.trained_names)
    return {k: v for k, v in state.items() if k in trained}


def export_state(trainer: GRPOTrainer) -> tuple[dict[str, torch.Tensor], dict]:
    """The whole training state as flat CPU tensors plus JSON-able metadata (rank 0; {} and
    {} elsewhere). A collective under FSDP: every rank calls it.

    Tensors: "model/<name>" (full parameters; the trained ones alone where frozen ones are left
    out (frozen_left_out): with trainer.lora the adapter's, by their names in the PeftModel), "optim/<name>/<key>" (AdamW's exp_avg, exp_avg_sq, step),
    "rng/cpu" (torch's CPU generator) and, on CUDA, "rng/cuda" (the trainer's device's
    generator: dropout and any sampling on the GPU draw from it). Metadata: version and the
    optimizer's param_groups. `load_state` restores it bit for bit,
    into this trainer or a fresh one of the same model, in this process or another.
    """
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, get_state_dict

    if trainer._normaliser is not None:
        raise RuntimeError("export_state() in the middle of a global batch: step() first (the "
                           "accumulated gradient is not part of the swapped state)")
    options = state_options(trainer, full_state_dict=True, cpu_offload=True)
    if trainer.config.lora is None:
        model_sd, optim_sd = get_state_dict(trainer.model, trainer.optimizer, options=options)
        model_sd = model_state(trainer, model_sd)
    else:
        model_sd = trainer.adapter_full()
        optim_sd = get_optimizer_state_dict(trainer.model, trainer.optimizer, options=options)
    if trainer.rank != 0:
        return {}, {}
    tensors = {f"model/{k}": v.detach().clone() for k, v in model_sd.items()}
    for name, state in optim_sd["state"].items():
        for key, value in state.items():
            tensors[f"optim/{name}/{key}"] = torch.as_tensor(value).detach().clone()
    tensors["rng/cpu"] = torch.get_rng_state()
    if trainer.device.type == "cuda":
        tensors["rng/cuda"] = torch.cuda.get_rng_state(trainer.device)
    meta = {"version": trainer.version, "param_groups": optim_sd["param_groups"]}
    return tensors, meta


def load_state(trainer: GRPOTrainer, tensors: dict[str, torch.Tensor], meta: dict) -> None:
    """Restore what export_state() produced; under FSDP every rank passes the full state (the
    trainer worker broadcasts it) and keeps its own shards. A collective under FSDP."""
    from torch.distributed.checkpoint.state_dict import set_state_dict

    model_sd: dict[str, torch.Tensor] = {}
    optim_state: dict[str, dict[str, torch.Tensor]] = {}
    for key, value in tensors.items():
        kind, _, rest = key.partition("/")
        if kind == "model":
            model_sd[rest] = value
        elif kind == "optim":
            name, _, field = rest.rpartition("/")
            optim_state.setdefault(name, {})[field] = value
    if not model_sd:
        raise ValueError("load_state: no model/... tensors in the state")
    missing = [n for n in trainer.trained_names if n not in model_sd]
    if frozen_left_out(trainer) and missing:
        raise ValueError(f"load_state: the state lacks this trainer's trained tensors "
                         f"{missing[:3]} (a state of another model, adapter, trainer.lora or "
                         "trainer.train_layers?)")
    optim_sd = {"state": optim_state, "param_groups": meta.get("param_groups", [])}
    if not optim_sd["param_groups"]:
        optim_sd = {"state": {}, "param_groups": trainer.optimizer.state_dict()["param_groups"]}
    options = state_options(trainer, full_state_dict=True)
    with torch.no_grad():
        set_state_dict(trainer.model, trainer.optimizer, model_state_dict=model_sd,
                       optim_state_dict=optim_sd, options=options)
    # set_state_dict may keep the given tensors as AdamW's state (on rank 0 they can be views
    # of a received message's buffer): give each its own memory, which park() can free.
    for state in trainer.optimizer.state.values():
        for key, value in state.items():
            if isinstance(value, torch.Tensor) and not _local(value).untyped_storage().resizable():
                state[key] = value.clone()
    if "rng/cpu" in tensors:
        torch.set_rng_state(tensors["rng/cpu"])
    if "rng/cuda" in tensors and trainer.device.type == "cuda":  # a CPU state has none
        torch.cuda.set_rng_state(tensors["rng/cuda"], trainer.device)
    trainer.version = int(meta.get("version", 0))
