"""FlexMARL: asynchronous multi-agent LLM reinforcement learning, one policy model per agent.

    from flexmarl import AgentSpec, Team, train, load_config
    result = await train(team, load_config())          # inside your own event loop

The MARL system is built on the generic actor runtime in `runtime`. Heavy parts (models,
engines, trainer) are imported on first use, so `import flexmarl` stays light.

The public faces are this package, `flexmarl.config`, `flexmarl.gateway` and
`flexmarl.rewards` (their `__all__`, pinned by tests/test_public_api.py), besides the modules
the README and docs/ import from (`flexmarl.tasks`, `flexmarl.models`, `flexmarl.protocol`, ...).
Modules that moved in the restructuring into folders keep their old path until 0.2 (MOVED).
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings
from typing import Any

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


# ----------------------------------------------------------------------------- moved modules

MOVED = {
    "flexmarl.run": "flexmarl.launch.run",              # train, RunResult
    "flexmarl.sections": "flexmarl.config.sections",    # ClusterConfig, GatewayConfig
    "flexmarl.rundir": "flexmarl.observe.rundir",       # RunDir, read_metrics
    "flexmarl.openai_api": "flexmarl.gateway.api",      # make_app, ApiError, GatewayServer
    "flexmarl.cli": "flexmarl.launch.cli",              # console script of an older install
    "flexmarl.nodes": "flexmarl.launch.nodes",          # console script of an older install
}
"""Old module path -> where it lives now. The old path still imports, as the very same module
object, with a FutureWarning, until FlexMARL 0.2. The old `flexmarl.config` and
`flexmarl.gateway` modules are packages now: their public names are on those packages' faces."""


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds an old path of MOVED and loads it as the module it moved to.

    A finder rather than a shim file per old path: the top level keeps few modules
    (tests/test_layout.py), and an alias cannot drift from the module it stands for. It is
    last on sys.meta_path, so a real module of that name always wins."""

    def find_spec(self, name: str, path: Any = None, target: Any = None):
        if name not in MOVED:
            return None
        return importlib.util.spec_from_loader(name, self)

    def create_module(self, spec):
        # stacklevel 2 skips importlib's own frames: the warning names the user's import line.
        warnings.warn(f"{spec.name} moved to {MOVED[spec.name]}: import it from there; the old "
                      "path will be removed in FlexMARL 0.2", FutureWarning, stacklevel=2)
        return importlib.import_module(MOVED[spec.name])

    def exec_module(self, module) -> None:
        """Nothing to run: `module` is the new module, already executed."""


if not any(isinstance(f, _MovedModules) for f in sys.meta_path):
    sys.meta_path.append(_MovedModules())
