"""FlexMARL: asynchronous multi-agent LLM reinforcement learning, one policy model per agent.

    from flexmarl import AgentSpec, Team, train, load_config
    result = await train(team, load_config())          # inside your own event loop

The MARL system is built on the generic actor runtime in `runtime`. Heavy parts (models,
engines, trainer) are imported on first use, so `import flexmarl` stays light.
"""
from __future__ import annotations

from typing import Any

from flexmarl.protocol import SamplingParams
from flexmarl.team import AgentSpec, Completion, Team, load_team

__version__ = "0.1.0"
__all__ = ["AgentSpec", "Completion", "SamplingParams", "Team", "load_team", "train",
           "load_config", "Config", "RunResult"]

_LAZY = {"train": "flexmarl.launch.run", "RunResult": "flexmarl.launch.run",
         "load_config": "flexmarl.config.load", "Config": "flexmarl.config.load"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'flexmarl' has no attribute {name!r}")
