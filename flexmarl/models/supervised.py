"""The warm start: supervised training of a fresh model on chat-formatted addition, so RL starts
above chance, with greedy decoding to score it on held-out tasks; and the child process
(`python -m flexmarl.models`, flexmarl/models/__main__.py) that ensure_model runs it in with
fixed numerics. flexmarl.models re-exports every name.
"""
from __future__ import annotations

import json
import logging
import math
import os
import time
from pathlib import Path
from typing import Callable

import torch
from transformers import PreTrainedTokenizerFast, Qwen2ForCausalLM

from flexmarl.models.build import _chat_prompts, chat_examples, load_model, load_tokenizer
from flexmarl.tasks import Task, addition_tasks, exact_match

log = logging.getLogger(__name__)

DEFAULT_WARM_START_STEPS = 300
"""Steps `ensure_model` trains for by default (batch WARM_START_BATCH_SIZE, peak WARM_START_LR).
Measured on 2 idle cores: "small" reaches 55-94% greedy accuracy on held-out 2-digit addition
(4 seeds) in about 45 s, leaving room for RL; "tiny" only 5-12% (600 steps at lr 3e-3 gave it
97%); "medium" 98% in about 3.5 minutes (before warm_start_env). Addition is learnt in a
sudden drop of the loss around step 250 for "small", so accuracy near it varies with the seed
(and did with the machine): with fixed numerics, seed 0 gives "small"/250 steps 55% (82 s) and
"medium"/300 steps 69% (381 s), the default team's models (2026-12-02)."""
WARM_START_BATCH_SIZE = 128
WARM_START_LR = 2e-3
NUM_EVAL_TASKS = 64
EVAL_SEED = 1_000_003  # held-out addition tasks; their prompts are removed from training data
TRAIN_POOL_SIZE = 16_384  # tasks drawn once per warm start; batches are sampled from them
WARMUP_FRACTION = 0.05
MIN_LR_FRACTION = 0.1  # cosine decay ends here rather than at zero
MAX_GRAD_NORM = 1.0
WARM_START_THREADS = 2
"""Threads of `ensure_model`'s warm starts on any machine: kernels split sums by thread (40
steps of "small" on 1 and on 2 threads ended with different weights)."""


def warm_start_env() -> dict[str, str]:
    """The numeric environment of `ensure_model`'s warm-start child process, so a seed gives
    the same model on every machine: besides the thread count, torch's kernels and MKL's matrix
    multiply dispatch on the CPU's vector ISA (AVX-512 here, AVX2 elsewhere), and near the step
    where a model suddenly learns addition the last bits decide between 7% and 60% accuracy.
    Both are pinned to AVX2 where the CPU has it (MKL_CBWR costs about a third more time on
    AVX-512); elsewhere only the threads are fixed."""
    env = {"OMP_NUM_THREADS": str(WARM_START_THREADS), "MKL_NUM_THREADS": str(WARM_START_THREADS)}
    if _has_avx2():
        env.update(ATEN_CPU_CAPABILITY="avx2", MKL_CBWR="AVX2")
    return env


def _has_avx2() -> bool:
    try:
        with open("/proc/cpuinfo") as f:
            return any(line.startswith("flags") and " avx2" in line for line in f)
    except OSError:
        return False


# --- greedy decoding and evaluation ----------------------------------------------------------

@torch.no_grad()
def greedy_generate(model: Qwen2ForCausalLM, prompts: list[list[int]], *, max_new_tokens: int,
                    eos_token_id: int, pad_token_id: int) -> list[list[int]]:
    """Greedy completions of a batch of prompts, each ending at (and including) eos.

    Prompts are left-padded with explicit position ids, so a padded prompt decodes exactly as it
    would alone. No KV cache: completions here are a few tokens long.
    """
    if not prompts or any(not p for p in prompts):
        raise ValueError("prompts must be a non-empty list of non-empty token id lists")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad_token_id] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    done = torch.zeros(len(prompts), dtype=torch.bool)
    completions: list[list[int]] = [[] for _ in prompts]
    for _ in range(max_new_tokens):
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        logits = model(input_ids=ids, attention_mask=mask, position_ids=positions,
                       use_cache=False).logits[:, -1]
        next_ids = logits.argmax(-1)
        for i in (~done).nonzero().flatten().tolist():
            completions[i].append(int(next_ids[i]))
        done |= next_ids == eos_token_id
        if done.all():
            break
        ids = torch.cat([ids, next_ids[:, None]], dim=1)
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
    return completions


def evaluate(model: Qwen2ForCausalLM, tokenizer: PreTrainedTokenizerFast,
             tasks: list[Task]) -> float:
    """Mean exact-match reward of greedy completions over `tasks`."""
    if not tasks:
        raise ValueError("tasks must be a non-empty list of Task")
    prompts = _chat_prompts(tokenizer, [t.prompt for t in tasks])
    max_new = max(len(t.answer) for t in tasks) + 2  # room for the answer, eos and one stray
    was_training = model.training
    model.eval()
    completions = greedy_generate(model, prompts, max_new_tokens=max_new,
                                  eos_token_id=tokenizer.eos_token_id,
                                  pad_token_id=tokenizer.pad_token_id)
    model.train(was_training)
    texts = tokenizer.batch_decode(completions, skip_special_tokens=True)
    return sum(exact_match(text, t) for text, t in zip(texts, tasks)) / len(tasks)


def eval_tasks() -> list[Task]:
    """The held-out addition tasks every warm start is scored on."""
    return addition_tasks(NUM_EVAL_TASKS, seed=EVAL_SEED)


# --- warm start ------------------------------------------------------------------------------

def _training_tensors(tokenizer: PreTrainedTokenizerFast,
                      tasks: list[Task]) -> tuple[torch.Tensor, torch.Tensor]:
    # Right padding needs no attention mask: with causal attention no real token sees a pad,
    # and pads carry no loss. Leaving the mask out lets SDPA take its causal fast path.
    examples = chat_examples(tokenizer, tasks)
    width = max(len(ids) for ids, _ in examples)
    ids = torch.tensor([i + [tokenizer.pad_token_id] * (width - len(i)) for i, _ in examples])
    labels = torch.tensor([lab + [-100] * (width - len(lab)) for _, lab in examples])
    return ids, labels


def _answer_loss(model: Qwen2ForCausalLM, ids: torch.Tensor,
                 labels: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy over labelled positions only.

    The same value as the model's own loss, but the vocabulary projection runs on the few
    answer positions instead of every position of every sequence.
    """
    hidden = model.model(input_ids=ids, use_cache=False).last_hidden_state
    targets = labels[:, 1:]
    keep = targets != -100
    logits = model.lm_head(hidden[:, :-1][keep])
    return torch.nn.functional.cross_entropy(logits, targets[keep])


def _lr_factor(step: int, steps: int) -> float:
    """Linear warmup, then cosine decay to MIN_LR_FRACTION of the peak."""
    warmup = max(1, round(steps * WARMUP_FRACTION))
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return MIN_LR_FRACTION + (1 - MIN_LR_FRACTION) * 0.5 * (1 + math.cos(math.pi * progress))


def warm_start(model_dir: str | os.PathLike, *, steps: int, batch_size: int, lr: float,
               seed: int, tasks: list[Task] | None = None, log_every_steps: int = 50,
               progress: Callable[[int, int, float], None] | None = None) -> dict:
    """Supervised training on chat-formatted tasks; saves the weights back into `model_dir`.

    `tasks` defaults to TRAIN_POOL_SIZE 2-digit addition tasks drawn with `seed`, minus the
    held-out evaluation prompts; batches are sampled from them with replacement. AdamW with
    linear warmup and cosine decay, gradients clipped at MAX_GRAD_NORM; deterministic for a given
    seed, thread count and CPU kernel ISA (ensure_model fixes those: warm_start_env). Returns
    {"final_loss" (of the last batch), "accuracy" (greedy exact-match rate on `eval_tasks()`),
    "seconds" (training only), "steps"}.

    Uses torch's current thread count. On a machine shared with other torch processes, one
    thread (`torch.set_num_threads(1)`) can be many times faster than two: OpenMP threads
    spin waiting for each other when the cores are oversubscribed.
    """
    for name, value in (("steps", steps), ("batch_size", batch_size),
                        ("log_every_steps", log_every_steps)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    if not isinstance(lr, (int, float)) or isinstance(lr, bool) or not 0 < lr < 1:
        raise ValueError(f"lr must be a number in (0, 1), e.g. 3e-3; got {lr!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"seed must be an int, got {seed!r}")
    held_out = eval_tasks()
    if tasks is None:
        held_out_prompts = {t.prompt for t in held_out}
        tasks = [t for t in addition_tasks(TRAIN_POOL_SIZE, seed=seed)
                 if t.prompt not in held_out_prompts]
    if not tasks or not all(isinstance(t, Task) for t in tasks):
        raise ValueError("tasks must be a non-empty list of Task (or None for the default)")
    model, tokenizer = load_model(model_dir), load_tokenizer(model_dir)
    ids, labels = _training_tensors(tokenizer, tasks)
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95),
                                  weight_decay=0.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: _lr_factor(s, steps))
    model.train()
    start = time.perf_counter()
    for step in range(steps):
        rows = torch.randint(len(ids), (batch_size,), generator=generator)
        loss = _answer_loss(model, ids[rows], labels[rows])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_GRAD_NORM)
        optimizer.step()
        scheduler.step()
        if (step + 1) % log_every_steps == 0 or step + 1 == steps:
            log.info("warm start %s: step %d/%d loss %.4f (%.0f s)", Path(model_dir).name,
                     step + 1, steps, loss.item(), time.perf_counter() - start)
        if progress is not None:
            progress(step + 1, steps, loss.item())
    train_s = time.perf_counter() - start
    accuracy = evaluate(model, tokenizer, held_out)
    model.save_pretrained(model_dir)
    return {"final_loss": loss.item(), "accuracy": accuracy, "seconds": train_s, "steps": steps}


def _child_main(argv: list[str] | None = None) -> None:
    """`python -m flexmarl.models DIR --steps N --seed S --metrics FILE [--progress]`
    (ensure_model's; --progress: one JSON line per step on stdout, {"step", "steps", "loss"})."""
    import argparse
    ap = argparse.ArgumentParser(description=_child_main.__doc__)
    ap.add_argument("model_dir")
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--metrics", required=True)
    ap.add_argument("--progress", action="store_true")
    args = ap.parse_args(argv)

    def report(step: int, steps: int, loss: float) -> None:
        print(json.dumps({"step": step, "steps": steps, "loss": loss}), flush=True)

    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(WARM_START_THREADS)
    metrics = warm_start(args.model_dir, steps=args.steps, batch_size=WARM_START_BATCH_SIZE,
                         lr=WARM_START_LR, seed=args.seed,
                         progress=report if args.progress else None)
    metrics["numerics"] = {"threads": torch.get_num_threads(),
                           "cpu_capability": torch.backends.cpu.get_cpu_capability(),
                           "mkl_cbwr": os.environ.get("MKL_CBWR", "")}
    Path(args.metrics).write_text(json.dumps(metrics))
