"""Small policy models built locally: a byte tokenizer and Qwen2 decoders of named sizes.

No weights can be downloaded here, so the project makes its own. A model directory is an
ordinary Hugging Face one (config.json, model.safetensors, generation_config.json, tokenizer
files with a chat template) that both transformers and vLLM load. `warm_start` teaches a fresh
model the chat format and some addition by supervised training, so RL starts above chance;
`ensure_model` builds, warm-starts and caches one directory per configuration.

    ensure_model("small") -> cache hit? -> path
                               | no
                               v
       build_model_dir (random init) -> warm_start (SFT) -> os.rename(tmp, final) -> path
"""
from __future__ import annotations

import glob
import hashlib
import json
import logging
import math
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from tqdm import tqdm

import torch
from transformers import (AutoModelForCausalLM, AutoTokenizer, GenerationConfig,
                          PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM, Qwen2Tokenizer)
from transformers.convert_slow_tokenizer import bytes_to_unicode

from flexmarl.tasks import Task, addition_tasks, exact_match

log = logging.getLogger(__name__)

FORMAT_VERSION = 2
"""Bump when the directory layout, tokenizer or training recipe changes: old caches are then
ignored rather than loaded. 2: warm starts run in a child process with fixed numerics
(WARM_START_THREADS, warm_start_env)."""

EOS_TOKEN = "<|im_end|>"  # ends every assistant turn, so generation stops there
PAD_TOKEN = "<|endoftext|>"
IM_START_TOKEN = "<|im_start|>"
SPECIAL_TOKENS = (PAD_TOKEN, IM_START_TOKEN, EOS_TOKEN)  # ids 256, 257, 258
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
VOCAB_MULTIPLE = 64  # embedding rows padded to this, as real models do, for aligned matmuls
MAX_POSITION_EMBEDDINGS = 512
SUPPORTED_HEAD_DIMS = (32, 64)  # head sizes vLLM's CPU attention backend implements

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
WARM_START_FILE = "warm_start.json"  # ensure_model records warm_start's metrics here
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


@dataclass(frozen=True)
class ModelSize:
    """Shape of one named model size (Qwen2 decoder, tied embeddings, float32)."""

    name: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int

    def __post_init__(self) -> None:
        for field in ("hidden_size", "num_layers", "num_heads", "num_kv_heads",
                      "intermediate_size"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"ModelSize.{field} must be a positive int, got {value!r}")
        if self.hidden_size % self.num_heads:
            raise ValueError(f"ModelSize.hidden_size ({self.hidden_size}) must be divisible by "
                             f"num_heads ({self.num_heads})")
        if self.head_dim not in SUPPORTED_HEAD_DIMS:
            raise ValueError(f"ModelSize {self.name!r}: head_dim = hidden_size / num_heads = "
                             f"{self.head_dim}; choose num_heads so it is one of "
                             f"{SUPPORTED_HEAD_DIMS} (vLLM's CPU attention supports only those)")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"ModelSize.num_heads ({self.num_heads}) must be a multiple of "
                             f"num_kv_heads ({self.num_kv_heads})")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads


SIZES: dict[str, ModelSize] = {s.name: s for s in (
    ModelSize(name="tiny", hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1,
              intermediate_size=256),
    ModelSize(name="small", hidden_size=128, num_layers=3, num_heads=4, num_kv_heads=2,
              intermediate_size=512),
    ModelSize(name="medium", hidden_size=256, num_layers=4, num_heads=4, num_kv_heads=2,
              intermediate_size=1024),
)}


# --- tokenizer -------------------------------------------------------------------------------

def tokenizer_vocab() -> list[str]:
    """Token strings in id order: the 256 bytes (as ByteLevel symbols), then SPECIAL_TOKENS."""
    byte_symbols = bytes_to_unicode()
    return [byte_symbols[b] for b in range(256)] + list(SPECIAL_TOKENS)


def build_tokenizer() -> Qwen2Tokenizer:
    """The byte tokenizer: token id = UTF-8 byte, so every ASCII character is one token.

    It is Qwen2's byte-level BPE with no merges. Not a WordLevel design: transformers 5's
    AutoTokenizer (which vLLM uses too) always loads a "qwen2" model directory as Qwen2Tokenizer,
    which rebuilds the pipeline from the vocabulary with its own byte-level pre-tokenizer and
    decoder. Being exactly that pipeline keeps build-time, transformers and vLLM ids identical,
    and decode(encode(s)) == s for any NFC-normalised text, not only ASCII.
    """
    vocab = {token: i for i, token in enumerate(tokenizer_vocab())}
    return Qwen2Tokenizer(
        vocab=vocab, merges=[], eos_token=EOS_TOKEN, pad_token=PAD_TOKEN,
        unk_token=PAD_TOKEN,  # Qwen2Tokenizer's default; never produced (256 bytes cover all)
        additional_special_tokens=[IM_START_TOKEN], chat_template=CHAT_TEMPLATE,
        clean_up_tokenization_spaces=False,  # the cleanup would turn " ." into "."
        model_max_length=MAX_POSITION_EMBEDDINGS)


def chat_prompt(tokenizer: PreTrainedTokenizerFast, user_text: str) -> list[int]:
    """Token ids of a one-turn chat ending in the assistant generation prompt."""
    return _chat_prompts(tokenizer, [user_text])[0]


def _chat_prompts(tokenizer: PreTrainedTokenizerFast, user_texts: list[str]) -> list[list[int]]:
    texts = [tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                           add_generation_prompt=True) for text in user_texts]
    # One batched call: encoding thousands of prompts one by one costs seconds.
    return tokenizer(texts, add_special_tokens=False)["input_ids"]


def chat_example(tokenizer: PreTrainedTokenizerFast, task: Task) -> tuple[list[int], list[int]]:
    """(input ids, labels) for supervised training: loss on the answer and the closing eos."""
    return chat_examples(tokenizer, [task])[0]


def chat_examples(tokenizer: PreTrainedTokenizerFast,
                  tasks: list[Task]) -> list[tuple[list[int], list[int]]]:
    """`chat_example` for many tasks at once."""
    prompts = _chat_prompts(tokenizer, [t.prompt for t in tasks])
    answers = tokenizer([t.answer for t in tasks], add_special_tokens=False)["input_ids"]
    examples = []
    for prompt, answer in zip(prompts, answers):
        answer = answer + [tokenizer.eos_token_id]
        examples.append((prompt + answer, [-100] * len(prompt) + answer))
    return examples


# --- building and loading --------------------------------------------------------------------

def _size(size: str) -> ModelSize:
    if size not in SIZES:
        raise ValueError(f"unknown model size {size!r}; choose one of {sorted(SIZES)}")
    return SIZES[size]


def _config(spec: ModelSize, tokenizer: PreTrainedTokenizerFast) -> Qwen2Config:
    vocab_size = math.ceil(len(tokenizer) / VOCAB_MULTIPLE) * VOCAB_MULTIPLE
    return Qwen2Config(
        vocab_size=vocab_size, hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size, num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads, num_key_value_heads=spec.num_kv_heads,
        max_position_embeddings=MAX_POSITION_EMBEDDINGS, tie_word_embeddings=True,
        dtype="float32", eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, bos_token_id=None)


def _generation_config(tokenizer: PreTrainedTokenizerFast) -> GenerationConfig:
    # vLLM adds these ids to every request's stop tokens. Only stop ids are set: vLLM would
    # also take sampling defaults (temperature, top_p) from this file.
    return GenerationConfig(
        eos_token_id=[tokenizer.eos_token_id, tokenizer.pad_token_id],
        pad_token_id=tokenizer.pad_token_id)


def build_model_dir(size: str, out_dir: str | os.PathLike, *, seed: int = 0) -> Path:
    """Write a randomly initialised model of a named size into `out_dir` (new or empty).

    The same size and seed give byte-identical weights; the global torch RNG is left as it was.
    """
    spec = _size(size)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"seed must be an int, got {seed!r}")
    out = Path(out_dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(f"out_dir {str(out)!r} exists and is not an empty directory; "
                         f"pass a new or empty directory")
    tokenizer = build_tokenizer()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(_config(spec, tokenizer)).to(torch.float32)
    model.generation_config = _generation_config(tokenizer)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def load_model(model_dir: str | os.PathLike, *,
               dtype: torch.dtype = torch.float32) -> Qwen2ForCausalLM:
    """The model in `model_dir`, on CPU, in eval mode."""
    return AutoModelForCausalLM.from_pretrained(_existing_dir(model_dir), dtype=dtype).eval()


def model_weights(model_dir: str) -> dict[str, torch.Tensor]:
    """Every tensor of a model directory: model.safetensors, or all the shards its
    model.safetensors.index.json names (save_pretrained's max_shard_size)."""
    from safetensors.torch import load_file

    root = Path(model_dir)
    if (root / "model.safetensors").is_file():
        return load_file(str(root / "model.safetensors"))
    index = root / "model.safetensors.index.json"
    if not index.is_file():
        raise FileNotFoundError(f"model directory {model_dir} has neither model.safetensors nor "
                                "model.safetensors.index.json")
    shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    out: dict[str, torch.Tensor] = {}
    for shard in shards:
        out.update(load_file(str(root / shard)))
    return out


def load_tokenizer(model_dir: str | os.PathLike) -> PreTrainedTokenizerFast:
    return AutoTokenizer.from_pretrained(_existing_dir(model_dir))


def _existing_dir(model_dir: str | os.PathLike) -> Path:
    path = Path(model_dir)
    if not (path / "config.json").is_file():
        raise ValueError(f"{str(path)!r} is not a model directory (no config.json); "
                         f"create one with build_model_dir or ensure_model")
    return path


def num_parameters(size: str) -> int:
    """Parameters of a named size, counting the tied embedding once."""
    spec = _size(size)
    with torch.device("meta"):
        model = Qwen2ForCausalLM(_config(spec, build_tokenizer()))
    return sum(p.numel() for p in model.parameters())


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
               seed: int, tasks: list[Task] | None = None, log_every_steps: int = 50) -> dict:
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
    # A bar with an ETA on a terminal (tqdm stays quiet when stderr is not one).
    bar = tqdm(range(steps), desc=f"warm-starting {Path(model_dir).name[:40]}", unit="step",
               disable=None, leave=False, dynamic_ncols=True)
    for step in bar:
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
            bar.set_postfix(loss=f"{loss.item():.3f}")
    bar.close()
    train_s = time.perf_counter() - start
    accuracy = evaluate(model, tokenizer, held_out)
    model.save_pretrained(model_dir)
    return {"final_loss": loss.item(), "accuracy": accuracy, "seconds": train_s, "steps": steps}


def notice(text: str) -> None:
    """A line on the terminal even when logging shows only warnings (the CLI's default): a long
    preparation (a model build, a conversion, workers starting) must not look like a hang."""
    print(f"flexmarl: {text}", file=sys.stderr, flush=True)


# --- cache -----------------------------------------------------------------------------------

def cache_root(cache_dir: str | os.PathLike | None) -> Path:
    if cache_dir is not None:
        return Path(cache_dir)
    if os.environ.get("FLEXMARL_CACHE"):
        return Path(os.environ["FLEXMARL_CACHE"])
    return Path.home() / ".cache" / "flexmarl" / "models"


def cache_key(size: str, *, warm_start_steps: int, seed: int) -> str:
    """Hash of everything that determines the weights: a change makes a new cache entry."""
    recipe = {"format": FORMAT_VERSION, "size": asdict(_size(size)), "vocab": tokenizer_vocab(),
              "steps": warm_start_steps, "seed": seed, "batch_size": WARM_START_BATCH_SIZE,
              "lr": WARM_START_LR, "train_pool_size": TRAIN_POOL_SIZE,
              "warmup_fraction": WARMUP_FRACTION, "min_lr_fraction": MIN_LR_FRACTION,
              "max_grad_norm": MAX_GRAD_NORM, "eval": [NUM_EVAL_TASKS, EVAL_SEED]}
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:16]


def ensure_model(size: str, *, warm_start_steps: int = DEFAULT_WARM_START_STEPS,
                 cache_dir: str | os.PathLike | None = None, seed: int = 0) -> Path:
    """A cached model directory for this size, seed and warm start, built on first use.

    The cache root is `cache_dir`, else $FLEXMARL_CACHE, else ~/.cache/flexmarl/models. A
    directory is built beside its final place and renamed into it, so a reader never sees a
    half-written one; if two processes race, both build and the later rename yields to the
    earlier. warm_start_steps=0 caches the random initialisation.
    """
    spec = _size(size)
    if isinstance(warm_start_steps, bool) or not isinstance(warm_start_steps, int) \
            or warm_start_steps < 0:
        raise ValueError(f"warm_start_steps must be an int >= 0, got {warm_start_steps!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"seed must be an int, got {seed!r}")
    root = cache_root(cache_dir)
    final = root / (f"{spec.name}-s{seed}-w{warm_start_steps}-"
                    f"{cache_key(size, warm_start_steps=warm_start_steps, seed=seed)}")
    if final.is_dir():
        log.info("model %s: cached at %s (%s)", size, final, _describe_warm_start(final))
        return final
    log.info("model %s: not in the cache; building %s", size, final)
    notice(f"building model {size!r} (once: cached in {root})"
           + (f", then {warm_start_steps} warm-start steps" if warm_start_steps else ""))
    started = time.perf_counter()
    root.mkdir(parents=True, exist_ok=True)
    _remove_stale_builds(root, final.name)
    tmp: Path | None = Path(tempfile.mkdtemp(prefix=_build_prefix(final.name), suffix=".tmp",
                                             dir=root))
    try:
        os.chmod(tmp, 0o755)  # mkdtemp makes 0700; the cache is as readable as any other dir
        build_model_dir(size, tmp, seed=seed)
        metrics: dict = {"steps": 0}
        if warm_start_steps:
            log.info("model %s: warm-starting %d steps in %s", size, warm_start_steps, tmp)
            metrics = _warm_start_in_child(tmp, steps=warm_start_steps, seed=seed)
        (tmp / WARM_START_FILE).write_text(json.dumps(metrics, indent=2) + "\n")
        log.info("model %s: %s", size, _describe_warm_start(tmp))
        try:
            os.rename(tmp, final)
            tmp = None
        except OSError:
            if not final.is_dir():
                raise
            log.info("model %s: another process built %s first; using it", size, final)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    log.info("model %s: ready at %s", size, final)
    notice(f"model {size!r} ready in {time.perf_counter() - started:.0f} s")
    return final


def _warm_start_in_child(model_dir: Path, *, steps: int, seed: int) -> dict:
    """`warm_start` in a fresh interpreter with `warm_start_env()` (ISA settings act only
    before torch and MKL start); its metrics, with the numerics it ran with."""
    result = model_dir / (WARM_START_FILE + ".child")
    cmd = [sys.executable, "-m", "flexmarl.models", str(model_dir), "--steps", str(steps),
           "--seed", str(seed), "--metrics", str(result)]
    proc = subprocess.run(cmd, env={**os.environ, **warm_start_env()})
    if proc.returncode != 0 or not result.is_file():
        raise RuntimeError(f"the warm start of {model_dir.name} failed in its child process "
                           f"(exit code {proc.returncode}; its error is printed above): "
                           f"{' '.join(cmd)}")
    metrics = json.loads(result.read_text())
    result.unlink()
    return metrics


def _child_main(argv: list[str] | None = None) -> None:
    """`python -m flexmarl.models DIR --steps N --seed S --metrics FILE` (ensure_model's)."""
    import argparse
    ap = argparse.ArgumentParser(description=_child_main.__doc__)
    ap.add_argument("model_dir")
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--metrics", required=True)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(WARM_START_THREADS)
    metrics = warm_start(args.model_dir, steps=args.steps, batch_size=WARM_START_BATCH_SIZE,
                         lr=WARM_START_LR, seed=args.seed)
    metrics["numerics"] = {"threads": torch.get_num_threads(),
                           "cpu_capability": torch.backends.cpu.get_cpu_capability(),
                           "mkl_cbwr": os.environ.get("MKL_CBWR", "")}
    Path(args.metrics).write_text(json.dumps(metrics))


def _build_prefix(name: str) -> str:
    # Host and pid in the temp name let a later build tell a dead builder's leftovers (SIGKILL
    # skips the cleanup in `finally`) from a build still running, even on a shared filesystem.
    return f".{name}.{socket.gethostname().replace('.', '_')}.{os.getpid()}."


def _remove_stale_builds(root: Path, name: str) -> None:
    mine = _build_prefix(name).rsplit(".", 2)[0] + "."  # ".{name}.{host}."
    for path in root.glob(f"{glob.escape(mine)}*.tmp"):
        pid = path.name[len(mine):].split(".", 1)[0]
        if pid.isdigit() and not _pid_alive(int(pid)):
            log.info("removing %s, left by a build that died", path)
            shutil.rmtree(path, ignore_errors=True)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, owned by another user
        return True
    return True


def _describe_warm_start(model_dir: Path) -> str:
    try:
        metrics = json.loads((model_dir / WARM_START_FILE).read_text())
    except (OSError, ValueError):
        return "no warm-start record"
    if not metrics.get("steps"):
        return "random initialisation, no warm start"
    return (f"warm start: {metrics['steps']} steps in {metrics['seconds']:.0f} s, final loss "
            f"{metrics['final_loss']:.3f}, held-out greedy accuracy {metrics['accuracy']:.0%}")


if __name__ == "__main__":
    _child_main()
