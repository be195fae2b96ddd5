"""FlexMARL: asynchronous multi-agent LLM reinforcement learning, one policy model per agent.

    from flexmarl import AgentSpec, Team, train, load_config
    result = await train(team, load_config())          # inside your own event loop

The MARL system is built on the generic actor runtime in `runtime`. Heavy parts (models,
engines, trainer) are imported on first use, so `import flexmarl` stays light.

The public faces are this package, `flexmarl.config`, `flexmarl.gateway` and
`flexmarl.rewards` (their `__all__`, pinned by tests/test_public_api.py), besides the modules
the README and docs/ import from (`flexmarl.tasks`, `flexmarl.models`, `flexmarl.protocol`, ...).
Old module paths, class and section names keep working until 0.2: flexmarl/_compat.py.
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
