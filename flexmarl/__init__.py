"""FlexMARL: asynchronous multi-agent LLM reinforcement learning, one policy model per agent.

    from flexmarl import AgentSpec, Team, train, load_config
    result = await train(team, load_config())          # inside your own event loop

The MARL system is built on the generic actor runtime in `runtime`. Heavy parts (models,
engines, trainer, transformers) are imported on first use; `import flexmarl` does load torch,
since the protocol's messages carry tensors (flexmarl.protocol), and so every face does.

The public faces are this package, `flexmarl.config`, `flexmarl.gateway` and
`flexmarl.rewards` (their `__all__`, pinned by tests/test_public_api.py), besides the modules
the README and docs/ import from (`flexmarl.tasks`, `flexmarl.models`, `flexmarl.protocol`, ...).
Old module paths, class and section names keep working until 0.2: flexmarl/_compat.py.

Its modules and folders (each folder's `__init__` lists its own), from the ground up:

    _compat.py     every compatibility alias: old module paths, renamed class and section
                   names (removed in 0.2)
    checks.py      what every config section's validation shares: ConfigError, `require`, CPU
                   core lists; RequestError and InvariantError
    clock.py       now(): the scheduling code's one clock (virtual under the simulator)
    activity.py    who was busy when: intervals per (who, kind), for the timeline and utilisation
    console.py     the console of `flexmarl run`: one line per phase, a live line for a long one
    team.py        the team API: AgentSpec, Team, the workflow's context; load_team(path)
    tasks.py       built-in task data and rewards: n-digit addition, deterministic by seed
    protocol/      FlexMARL's message kinds (100 and up) and their typed dataclasses
    config/        the run's configuration, one dataclass per TOML section (the ground floor)
    models/        small policy models built locally: a byte tokenizer, Qwen2 decoders, LoRA
    sampling/      sampling maths shared by the rollout engines and the trainer
    weights/       weight sync: one interface, one module per transport holding both its ends
    envs/          environments others wrote, scored by their own libraries: TextArena games,
                   reasoning-gym tasks (the `envs` extra)
    rewards/       reward functions for workflows: answer matching, sandboxed code runs, bounds
    placement/     where things run: GPU seats, trainer slots, LoRA units, time-shared devices
    rollout/       engines that generate completions, their worker actor, the pool, the balancer
    training/      trainer slots bound to agents on demand, FSDP2 trainers, GRPO maths
    orchestrator/  the team's workflows, the experience store and the one training loop
    observe/       watching a run: live status, the dashboard, metric loggers, the report
    sim/           the cluster simulator: the product's scheduling code on a virtual clock
    gateway/       training an existing OpenAI-client app
    launch/        starting runs: the composition root, the worker processes, the command lines
"""
from __future__ import annotations

import importlib
from typing import Any

from flexmarl import _compat
from flexmarl._compat import MOVED
from flexmarl.checks import ConfigError
from flexmarl.protocol import SamplingParams
from flexmarl.team import AgentSpec, Completion, LoraSpec, Team, load_team

__version__ = "0.1.0"
__all__ = ["AgentSpec", "Completion", "ConfigError", "LoraSpec", "SamplingParams", "Team", "load_team",
           "train", "load_config", "Config", "RunResult"]

_LAZY = {"train": "flexmarl.launch.run", "RunResult": "flexmarl.launch.run",
         "load_config": "flexmarl.config.load", "Config": "flexmarl.config.load"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'flexmarl' has no attribute {name!r}")


# Old module paths still import until FlexMARL 0.2 (flexmarl/_compat.py holds every alias).
_compat.install()
