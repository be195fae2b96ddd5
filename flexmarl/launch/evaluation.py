"""`flexmarl eval RUN_DIR [--step N]`: a finished (or stopped) run's weights on its held-out tasks.

    RUN_DIR/config.toml ─► the team (and its task file) ─► held-out tasks (eval section)
    weights per agent: the final checkpoint (RUN_DIR/checkpoints/AGENT/version-N, the newest),
        or with --step N the training state saved after step N (RUN_DIR/state): its files
        checked against their sha256s, then its model tensors alone read (not the optimizer's
        state, twice the model again under AdamW, nor the RNG's: `saved_weights`), written out
        as a model directory; frozen agents: their model as the run resolved it; LoRA agents:
        their base, served with their adapter (the checkpoint's, or the state's)
    ─► one TorchEngine per agent in this process ─► flexmarl.orchestrator.evaluate (the
       workflow, training off; a game team's matches as the run measured them; a gateway
       team's: gateway.eval_app's held-out episodes, flexmarl.gateway.heldout)
       ─► the table, and RUN_DIR/eval-final.json or eval-step-N.json
       (a game team, Team.heldout_round: its matches measured as the run's final measurement
       measures them, eval.final_tasks in each of eval.modes, and compared with the run's
       before measurement: `measure_games`)

The torch engine keeps this independent of any worker process and exact: the same weights give
the same numbers (greedy), whatever machine evaluates them.
"""
from __future__ import annotations

import asyncio
import contextlib
import re
import tempfile
import warnings
from pathlib import Path
from typing import Any, Awaitable, Callable, Sequence

import orjson
import safetensors
import torch

from flexmarl.checks import ConfigError
from flexmarl.config.load import Config, load_config
from flexmarl.config.pipeline import EvalConfig
from flexmarl.launch.checkpoint import STATE_DIR, StateCheckpoints
from flexmarl.launch.model_dirs import resolve_model, write_model_dir
from flexmarl.models.lora import ADAPTER_CONFIG, LoraSpec, read_adapter
from flexmarl.observe.rundir import CHECKPOINTS_DIR, CONFIG_FILE, EVAL_FILE
from flexmarl.orchestrator.agents import AgentRuntime
from flexmarl.orchestrator.evaluate import evaluate, heldout_tasks
from flexmarl.orchestrator.heldout import changes, measure
from flexmarl.protocol import Generate, GenerateReply, WeightUpdate
from flexmarl.rollout.engine import EngineConfig
from flexmarl.rollout.torch_engine import TorchEngine
from flexmarl.gateway.backend import is_gateway_team
from flexmarl.gateway.heldout import check_app_eval, evaluate_app
from flexmarl.team import Team, load_team
from flexmarl.training.state_files import SHARDED_FORMAT, STATE_FILE, CheckpointError

MODEL_PREFIX = "model/"
"""A saved state's model tensors: "model/<param>" (beside "optim/<param>/<key>", "rng/cpu")."""


def check_eval(team: Team, settings: EvalConfig, gateway_enabled: bool) -> None:
    """Evaluation during the run (`settings`: the [eval] section) needs held-out tasks and the
    team's own workflow (not gateway.enabled)."""
    if not settings.every_steps:
        return
    if gateway_enabled:
        raise ConfigError("eval.every_steps: evaluation runs the team's workflow, but with "
                          "gateway.enabled the episodes are the app's; set eval.every_steps = 0")
    if not team.heldout:
        raise ConfigError(f"eval.every_steps = {settings.every_steps} but team {team.name} "
                          "has no held-out tasks: give the team file Team(heldout=...), or set "
                          "team.tasks to a data file and team.heldout to a count or fraction")


def run_config(run_dir: Path, overrides: Sequence[str] = ()) -> Config:
    """The run's own config (RUN_DIR/config.toml), with `--set` overrides (eval.* usually)."""
    path = run_dir / CONFIG_FILE
    if not path.is_file():
        raise ConfigError(f"{str(run_dir)!r} is not a run directory: it has no {CONFIG_FILE}")
    return load_config(str(path), overrides, team_config=False)  # what the run ran with


def final_checkpoint(run_dir: Path, agent: str) -> Path | None:
    """RUN_DIR/checkpoints/AGENT/version-N with the highest N, if any."""
    root = run_dir / CHECKPOINTS_DIR / agent
    versions = [(int(m.group(1)), p) for p in root.glob("version-*")
                if (m := re.fullmatch(r"version-(\d+)", p.name))
                and ((p / "config.json").is_file() or (p / ADAPTER_CONFIG).is_file())]
    return max(versions)[1] if versions else None


def saved_weights(states: StateCheckpoints, agent: str, step: int
                  ) -> tuple[int, dict[str, torch.Tensor]]:
    """The version and the model tensors (by parameter name, "model/" dropped) of `agent`'s
    state saved after `step`, in either format; only those tensors are read into this process
    (a state's optimizer moments alone are twice the model's size). Every file is checked
    against its sha256 first (StateCheckpoints.verify, which streams it); CheckpointError
    naming the path if the state is missing, damaged or unreadable."""
    record = states.verify(agent, step)
    path = states.path(agent, step)
    try:
        if record["format"] == SHARDED_FORMAT:
            tensors = _read_dcp(path, MODEL_PREFIX) if record["files"] else {}
        else:
            with safetensors.safe_open(str(path / STATE_FILE), framework="pt") as f:
                tensors = {k: f.get_tensor(k) for k in f.keys() if k.startswith(MODEL_PREFIX)}
    except Exception as e:
        raise CheckpointError(f"{path}: cannot read the model's tensors ({type(e).__name__}: "
                              f"{e}): agent {agent!r} step {step} was damaged after its save; "
                              "restore its step dir from a copy, or evaluate another step") from e
    return record["version"], {k.removeprefix(MODEL_PREFIX): v for k, v in tensors.items()}


def _read_dcp(path: Path, prefix: str) -> dict[str, torch.Tensor]:
    """The tensors of a format-2 state dir whose names start with `prefix`, whole, in this
    process (no process group): DCP reads only the entries of the state dict it is given, each
    from its own byte range of the shard files."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    from flexmarl.training.safe_dcp import SafeReader

    reader = SafeReader(str(path))  # .metadata is a pickle: read with an allow-list
    tensors = {name: torch.empty(md.size, dtype=md.properties.dtype)
               for name, md in reader.read_metadata().state_dict_metadata.items()
               if isinstance(md, TensorStorageMetadata) and name.startswith(prefix)}
    if tensors:
        with warnings.catch_warnings():  # "no process group: loading in a single process"
            warnings.simplefilter("ignore", UserWarning)
            dcp.load(tensors, storage_reader=reader, no_dist=True)
    return tensors


def model_dirs(run_dir: Path, team: Team, step: int | None, scratch: Path
               ) -> tuple[dict[str, str], dict[str, tuple[LoraSpec, dict]]]:
    """The weights each agent is evaluated with (see the module docstring): its model
    directory, and for a LoRA agent that has trained its adapter's spec and tensors."""
    out, adapters = {}, {}
    states = StateCheckpoints(run_dir / STATE_DIR) if step is not None else None
    for spec in team.agents:
        base = resolve_model(spec)
        if not spec.trainable:
            out[spec.name] = base
        elif step is None:
            final = final_checkpoint(run_dir, spec.name)
            if final is None:
                raise ConfigError(f"run {run_dir} has no final checkpoint of agent {spec.name} "
                                  f"(in {run_dir / CHECKPOINTS_DIR / spec.name}): the run did not "
                                  "finish; evaluate a saved step with --step N")
            if (final / ADAPTER_CONFIG).is_file():  # served on its base
                out[spec.name], adapters[spec.name] = base, read_adapter(final)
            else:
                out[spec.name] = str(final)
        else:
            saved = states.steps(spec.name)
            if step not in saved:
                raise ConfigError(f"run {run_dir} has no state of agent {spec.name} saved after "
                                  f"step {step}; saved steps: {saved or 'none'} (run.save_every "
                                  "and pruning keep only the latest)")
            version, tensors = saved_weights(states, spec.name, step)
            if not tensors:  # never updated: its starting weights
                out[spec.name] = base
                continue
            if spec.lora is not None:  # the adapter's tensors, on its base
                from flexmarl.training.adapter import saved_names
                out[spec.name], adapters[spec.name] = base, (spec.lora, saved_names(tensors))
                continue
            # A partly trained agent's state holds its trained blocks only: the base's
            # frozen rest completes the model (before, those were left random).
            out[spec.name] = str(write_model_dir(
                WeightUpdate(version, tensors, complete=not spec.train_layers), base,
                scratch / spec.name))
    return out, adapters


async def open_engine(name: str, model_dir: str, adapter: tuple[LoraSpec, dict] | None,
                      config: Config) -> TorchEngine:
    """A started torch engine serving `model_dir` (with `adapter`, named `name`, if given)."""
    engine = TorchEngine(EngineConfig(
        model_dir=model_dir, seed=config.run.seed, max_model_len=config.rollout.max_model_len,
        **({"adapters": (name,), "max_loras": 1, "max_lora_rank": adapter[0].rank}
           if adapter is not None else {})))
    await engine.start()
    if adapter is not None:
        lora, tensors = adapter
        await engine.load_adapter(name, tensors, lora.as_dict())
    return engine


def engines_generate(engines: dict[str, TorchEngine], adapters: set[str]
                     ) -> Callable[[str, Generate], Awaitable[GenerateReply]]:
    """generate(agent, request) on the agent's own engine in this process (with its adapter,
    for the agents in `adapters`), prompt logprobs passed on: what evaluate() and the policy
    tables (Team.analysis) call."""
    async def generate(agent: str, msg: Generate) -> GenerateReply:
        samples, prompt_lps = await engines[agent].generate(
            msg.prompt_ids, msg.params, agent if agent in adapters else None)
        return GenerateReply(msg.request_id, 0, list(msg.prompt_ids), samples, prompt_lps,
                             f"eval-{agent}")
    return generate


async def measure_games(team: Team, agents: dict[str, AgentRuntime], generate: Any,
                        config: Config, run_dir: Path) -> dict[str, Any]:
    """A game team's held-out matches (Team.heldout_round: a game team's deals) measured as the
    run measured its final weights (flexmarl.orchestrator.heldout.measure: the first
    eval.final_tasks deals per (agent, opponent), in each of eval.modes, the sampled requests
    seeded as the run's), so the same weights score what RUN_DIR/eval.json's "after" says:
    the first mode's result, with "after" (every mode's) and "heldout" (each trainable agent's
    change from the run's own before measurement, eval.json's "before", where it made one)."""
    after = await measure(team, agents, generate, config.eval, seed=config.run.seed,
                          max_concurrent_calls=MAX_CONCURRENT_CALLS)
    before = None
    with contextlib.suppress(OSError, orjson.JSONDecodeError):
        before = orjson.loads((run_dir / EVAL_FILE).read_bytes()).get("before")
    if not isinstance(before, dict) or "skipped" in before:
        before = None  # not measured (eval.before = false), or skipped by a resumed run
    trainable = [a.name for a in team.agents if a.trainable]
    first = "greedy" if "greedy" in after else "sampled"
    return after[first] | {"after": after, "heldout": changes(before, after, trainable)}


MAX_CONCURRENT_CALLS = 64
"""Model calls in flight at once (evaluate()'s default): each agent's engine batches them."""


async def evaluate_run(run_dir: str | Path, *, step: int | None = None,
                       overrides: Sequence[str] = ()) -> dict[str, Any]:
    """Evaluate the run's final checkpoints (or its state after `step`) on its held-out tasks;
    the result, also written to RUN_DIR/eval-final.json or eval-step-N.json."""
    from flexmarl.launch.task_files import team_with_task_file

    run_dir = Path(run_dir)
    config = run_config(run_dir, overrides)
    team = team_with_task_file(load_team(config.team.path), config.team, config.run.seed)
    app_team = is_gateway_team(team)  # its held-out episodes are its app's
    if app_team:
        check_app_eval(team, config)  # before any weights are read
    tasks = heldout_tasks(team, config.eval)
    with tempfile.TemporaryDirectory(prefix="flexmarl-eval-") as scratch:
        dirs, adapters = await asyncio.to_thread(model_dirs, run_dir, team, step, Path(scratch))
        # One engine per agent (a LoRA agent's: its base with its adapter alone in it).
        engines = {name: await open_engine(name, d, adapters.get(name), config)
                   for name, d in dirs.items()}
        try:
            agents = {spec.name: AgentRuntime(spec, dirs[spec.name], engines[spec.name].tokenizer,
                                              max_model_len=config.rollout.max_model_len)
                      for spec in team.agents}

            generate = engines_generate(engines, set(adapters))

            if app_team:  # gateway.eval_app's episodes through a gateway on these weights
                result = await evaluate_app(team, agents, generate, tasks, config)
            elif team.heldout_round is not None:  # a game team: its matches as the run measured
                result = await measure_games(team, agents, generate, config, run_dir)
            else:
                result = await evaluate(team, agents, generate, tasks, config.eval,
                                        seed=config.run.seed)
            if team.analysis is not None:  # an OpenSpiel team: its tables and NashConv too
                result["policies"] = await team.analysis.measure(agents, generate, "eval/")
        finally:
            for engine in engines.values():
                await engine.close()
    result |= {"weights": "final" if step is None else f"after step {step}",
               "model_dirs": {n: (d if not d.startswith(scratch) else "(from the saved state)")
                              + (" + its adapter" if n in adapters else "")
                              for n, d in dirs.items()}}
    name = "eval-final.json" if step is None else f"eval-step-{step}.json"
    (run_dir / name).write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2))
    return result
