"""Which model directory each agent's workers load, and an agent's weights saved as one.

    AgentSpec.model: a built-in size ─► built once and cached (flexmarl.models.ensure_model)
                     a pretrained name ("smollm2-135m", "gemma3-270m") or a .gguf file ─►
                         converted once and cached (launch/gguf.py)
                     a path ─► checked: a Hugging Face model directory (config.json)
    save_model_dir / write_model_dir: an agent's weights + its base model's config and tokenizer
        files, as a directory transformers and vLLM load
"""
from __future__ import annotations

from pathlib import Path

from flexmarl.checks import ConfigError
from flexmarl.launch.gguf import (INSTALL_HINT, PRETRAINED, check_pretrained, gguf_dir,
                                  install_hint, is_gguf)
from flexmarl.models import SIZES, ensure_model
from flexmarl.models.build import write_model_dir
from flexmarl.protocol import SaveState
from flexmarl.team import AgentSpec
from flexmarl.training.pool import TrainerPool

MODEL_SEED = 0  # built-in models are built with one seed so every run shares the cache


def resolve_model(spec: AgentSpec) -> str:
    """The model directory of an agent: a built-in size (built and cached), a pretrained name
    or GGUF file (converted once and cached), or a given model directory."""
    if spec.model in SIZES:
        kwargs = {} if spec.warm_start_steps is None else {"warm_start_steps": spec.warm_start_steps}
        return str(ensure_model(spec.model, seed=MODEL_SEED, **kwargs))
    if is_gguf(spec.model):
        check_model(spec)
        return str(gguf_dir(spec.model))
    return check_model(spec)


def check_context(model_dirs: dict[str, str], max_model_len: int) -> None:
    """rollout.max_model_len within each agent's model's positions (max_position_embeddings of
    its config.json): past them the torch engine indexes beyond the model's position table
    (transformers only warns, in the log) and vLLM refuses to start. ConfigError naming the
    agent and the most that fits; a config without the field is not checked."""
    import json

    for agent, path in model_dirs.items():
        try:
            config = json.loads((Path(path) / "config.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        positions = (config.get("max_position_embeddings")
                     or (config.get("text_config") or {}).get("max_position_embeddings"))
        if isinstance(positions, int) and max_model_len > positions:
            raise ConfigError(f"rollout.max_model_len = {max_model_len} is past the "
                              f"{positions} positions of agent {agent}'s model ({path}: its "
                              f"max_position_embeddings); set rollout.max_model_len to at "
                              f"most {positions}, or give the agent a model with a longer "
                              "context")


def check_model(spec: AgentSpec) -> str:
    """A given model path, checked (ConfigError naming the agent); built-in sizes pass as they
    are (they are built on demand). Cheap: `flexmarl run` checks every agent before it creates
    the run directory."""
    if spec.model in SIZES:
        return spec.model
    if is_gguf(spec.model):
        try:
            if spec.model in PRETRAINED:
                check_pretrained(spec.model)
            elif not Path(spec.model).expanduser().is_file():
                raise ConfigError(f"the GGUF file {str(Path(spec.model).absolute())!r} does not "
                                  "exist")
        except ConfigError as e:
            raise ConfigError(f"agent {spec.name}: {e}") from None
        return spec.model
    path = Path(spec.model).expanduser()
    # A configuration problem (ConfigError, a ValueError): `flexmarl run` says it in one line.
    if not path.is_dir():
        raise ConfigError(f"agent {spec.name}: model {spec.model!r} is neither a built-in size "
                          f"({', '.join(SIZES)}), a pretrained model ({', '.join(PRETRAINED)}), "
                          f"a .gguf file nor a model directory: {str(path.absolute())!r} "
                          "does not exist")
    if not (path / "config.json").is_file():
        raise ConfigError(f"agent {spec.name}: model directory {str(path.absolute())!r} has no "
                          f"config.json (neither a built-in size ({', '.join(SIZES)}) nor a "
                          "Hugging Face model directory)")
    return str(path)


async def save_model_dir(trainers: TrainerPool, agent: str, model_dir: str,
                         directory: Path, *, merged: bool = False) -> Path:
    """Save the agent's current weights as a loadable model directory, directory/version-N
    (write_model_dir; a LoRA agent's: its adapter in PEFT's format, and with `merged` the base
    with it merged in, version-N/merged), written by its trainer's rank 0: no weight comes to
    this process."""
    async with trainers.bind(agent) as conn:
        saved = await conn.request(SaveState("", str(directory), -1, model_dir=model_dir,
                                             merged=merged),
                                   timeout_s=trainers.request_timeout_s)
    return Path(saved.path)




def install_line(agents: list[AgentSpec]) -> str:
    """The console's install check: whether the pretrained models the team needs are here, what
    each agent's model is ("solver smollm2-135m (pretrained), judge small (built-in
    byte-level)"), and the terms of those that come under their own."""
    import importlib.util

    needed = sorted({spec.model for spec in agents if spec.model in PRETRAINED})
    missing = [name for name in needed
               if importlib.util.find_spec(PRETRAINED[name].module) is None]
    if importlib.util.find_spec("gguf") is None:  # every GGUF model needs it to be converted
        missing = needed or (["gguf"] if any(is_gguf(s.model) for s in agents) else [])
    kinds = []
    for spec in agents:
        kind = ("built-in byte-level" if spec.model in SIZES else
                "pretrained" if spec.model in PRETRAINED else
                "GGUF file" if is_gguf(spec.model) else "model directory")
        kinds.append(f"{spec.name} {spec.model} ({kind})")
    terms = "".join(f"; {name} comes under {PRETRAINED[name].terms}" for name in needed
                    if PRETRAINED[name].terms != "Apache-2.0")
    if not missing:
        note = "pretrained models installed" if needed else "no pretrained model needed"
    else:
        how = (install_hint(missing[0]) if len(missing) == 1 and missing[0] in PRETRAINED
               else INSTALL_HINT)
        note = f"{', '.join(missing)} missing (to get {'them' if missing[1:] else 'it'}: {how})"
    return f"install check: {note}; models: {', '.join(kinds)}{terms}"
