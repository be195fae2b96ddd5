"""Building and loading the built-in models: the byte tokenizer, the named Qwen2 sizes, model
directories (random initialisation) and their weights, tokenizer and chat-formatted examples.
flexmarl.models re-exports every name; the warm start is flexmarl.models.supervised.
"""
from __future__ import annotations

import json
import math
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import (AutoModelForCausalLM, AutoTokenizer, GenerationConfig,
                          PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM, Qwen2Tokenizer)
from transformers.convert_slow_tokenizer import bytes_to_unicode

from flexmarl.protocol import WeightUpdate
from flexmarl.tasks import Task

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


MODEL_FILES = ("config.json", "generation_config.json", "tokenizer.json",
               "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")
"""The files of a base model directory that a saved one copies beside its weights."""


def write_model_dir(weights: WeightUpdate, model_dir: str, directory: Path, *,
                    name: str = "") -> Path:
    """`weights` as directory/version-N (or directory/`name`) beside the config and tokenizer
    files of its base model `model_dir`, loadable by transformers and vLLM. A partial export
    (only the trained layers, AgentSpec.train_layers) is completed with the base model's
    frozen rest."""
    from safetensors.torch import save_file

    tensors = weights.tensors
    if not weights.complete:
        tensors = {**model_weights(model_dir), **tensors}
    target = Path(directory) / (name or f"version-{weights.version}")
    target.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(target / "model.safetensors"))
    for name in MODEL_FILES:
        src = Path(model_dir) / name
        if src.is_file():
            shutil.copy2(src, target / name)
    return target
