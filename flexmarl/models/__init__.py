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

This package's face: every name below is importable as `flexmarl.models.NAME`, as it was when
this was one module. build.py makes and loads directories, supervised.py warm-starts them (also
as `python -m flexmarl.models DIR ...`, the child process ensure_model runs: __main__.py), and
this module keeps the cache, which calls both. lora.py: LoRA adapters, an agent as a low-rank
adapter on a base model that other agents share.
"""
from __future__ import annotations

import glob
import hashlib
import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

from flexmarl.console import Bar, phase

# The cache's own calls (build_model_dir, ...) go through these names, so a test that patches
# flexmarl.models.build_model_dir reaches ensure_model.
from flexmarl.models.build import (CHAT_TEMPLATE, EOS_TOKEN, IM_START_TOKEN,
                                   MAX_POSITION_EMBEDDINGS, PAD_TOKEN, SIZES, SPECIAL_TOKENS,
                                   SUPPORTED_HEAD_DIMS, VOCAB_MULTIPLE, ModelSize, _chat_prompts,
                                   _config, _existing_dir, _generation_config, _size,
                                   build_model_dir, build_tokenizer, chat_example, chat_examples,
                                   chat_prompt, load_model, load_tokenizer, model_weights,
                                   num_parameters, tokenizer_vocab)
from flexmarl.models.supervised import (DEFAULT_WARM_START_STEPS, EVAL_SEED, MAX_GRAD_NORM,
                                        MIN_LR_FRACTION, NUM_EVAL_TASKS, TRAIN_POOL_SIZE,
                                        WARM_START_BATCH_SIZE, WARM_START_LR, WARM_START_THREADS,
                                        WARMUP_FRACTION, _answer_loss, _child_main, _has_avx2,
                                        _lr_factor, _training_tensors, eval_tasks, evaluate,
                                        greedy_generate, warm_start, warm_start_env)

log = logging.getLogger(__name__)

FORMAT_VERSION = 2
"""Bump when the directory layout, tokenizer or training recipe changes: old caches are then
ignored rather than loaded. 2: warm starts run in a child process with fixed numerics
(WARM_START_THREADS, warm_start_env)."""
WARM_START_FILE = "warm_start.json"  # ensure_model records warm_start's metrics here


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
    phase(f"building model {size!r} (once: cached in {root})"
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
            metrics = _warm_start_in_child(tmp, steps=warm_start_steps, seed=seed,
                                           label=repr(size))
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
    phase(f"model {size!r} ready in {time.perf_counter() - started:.0f} s "
           f"({_describe_warm_start(final)})")
    return final


def _warm_start_in_child(model_dir: Path, *, steps: int, seed: int, label: str = "") -> dict:
    """`warm_start` in a fresh interpreter with `warm_start_env()` (ISA settings act only
    before torch and MKL start); its metrics, with the numerics it ran with.

    The child reports each step on its stdout (one JSON line: step, steps, loss), drawn here as
    one progress line; its stderr (torch's warnings) goes to the log, and its tail into the
    error if it fails."""
    result = model_dir / (WARM_START_FILE + ".child")
    errors = model_dir / (WARM_START_FILE + ".stderr")
    cmd = [sys.executable, "-m", "flexmarl.models", str(model_dir), "--steps", str(steps),
           "--seed", str(seed), "--metrics", str(result), "--progress"]
    with open(errors, "wb") as err, Bar(f"warm start {label or model_dir.name}", steps,
                                        unit="steps") as bar:
        proc = subprocess.Popen(cmd, env={**os.environ, **warm_start_env()},
                                stdout=subprocess.PIPE, stderr=err, text=True)
        with proc:
            for line in proc.stdout:
                try:
                    report = json.loads(line)
                    bar.update(report["step"], f"loss {report['loss']:.3f}")
                except (ValueError, KeyError, TypeError):  # not a report: keep it for the log
                    log.info("warm start %s: %s", model_dir.name, line.rstrip())
        if proc.returncode != 0 or not result.is_file():
            bar.fail("failed")
    said = errors.read_text(errors="replace").strip()
    errors.unlink()
    if proc.returncode != 0 or not result.is_file():
        tail = "\n  ".join(said.splitlines()[-20:])
        raise RuntimeError(f"the warm start of {model_dir.name} failed in its child process "
                           f"(exit code {proc.returncode}): {' '.join(cmd)}"
                           + (f"; its last stderr lines:\n  {tail}" if tail else ""))
    if said:
        log.info("warm start %s, its stderr:\n%s", model_dir.name, said)
    metrics = json.loads(result.read_text())
    result.unlink()
    return metrics

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
