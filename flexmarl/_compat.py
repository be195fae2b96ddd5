"""Every compatibility alias of FlexMARL in one place, each gone in REMOVED_IN.

    MOVED             old module path -> where the module lives now (an import finder)
    RENAMED_CLASSES   module -> {old class name: new name} (the module's __getattr__)
    RENAMED_SECTIONS  old config section -> new one (flexmarl.config.load)

Each alias still works, with a FutureWarning that names the new path, until FlexMARL
REMOVED_IN; tests/test_public_api.py fails once __version__ reaches it, so they are removed
then, not forgotten. A leaf: it imports nothing of FlexMARL.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings
from typing import Any, Callable

REMOVED_IN = "0.2"
"""The version in which every alias here is removed."""

MOVED = {
    "flexmarl.run": "flexmarl.launch.run",              # train, RunResult
    "flexmarl.sections": "flexmarl.config.sections",    # ClusterConfig, GatewayConfig
    "flexmarl.rundir": "flexmarl.observe.rundir",       # RunDir, read_metrics
    "flexmarl.openai_api": "flexmarl.gateway.api",      # make_app, ApiError, GatewayServer
    "flexmarl.cli": "flexmarl.launch.cli",              # console script of an older install
    "flexmarl.nodes": "flexmarl.launch.nodes",          # console script of an older install
    # The sections moved to the config's ground floor (issue 52).
    "flexmarl.training.trainer_config": "flexmarl.config.training",   # TrainerConfig
    "flexmarl.training.pool_config": "flexmarl.config.training",      # TrainerPoolConfig
    "flexmarl.rollout.balance.config": "flexmarl.config.balance",     # BalancerConfig
    # Where things run, in one package (issue 52).
    "flexmarl.launch.devices": "flexmarl.placement.devices",
    "flexmarl.launch.layout": "flexmarl.placement.layout",
    "flexmarl.launch.lora_units": "flexmarl.placement.lora_units",
    "flexmarl.orchestrator.timeshare": "flexmarl.placement.timeshare",
    "flexmarl.rollout.balance.planner": "flexmarl.rollout.balance.moves",
}
"""Old module path -> where it lives now. The old path still imports, as the very same module
object, with a FutureWarning. The old `flexmarl.config` and `flexmarl.gateway` modules are
packages now: their public names are on those packages' faces."""

RENAMED_CLASSES = {
    "flexmarl.config": {"TrainPlacement": "TrainerPoolConfig"},
    # "plan" is the simulator's word only (flexmarl.placement's docstring).
    "flexmarl.placement.devices": {"DevicePlan": "DevicePlacement"},
    "flexmarl.placement.layout": {"GpuPlan": "GpuPlacement"},
    "flexmarl.rollout.balance.moves": {"MovePlanner": "MoveChooser"},
}
"""Module -> {old name: new name}: the old name still resolves (renamed_getattr)."""

RENAMED_SECTIONS = {"train": "trainer_pool"}
"""Old config section -> new one: the old name is still read, with a warning per key."""


class MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
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
                      f"path will be removed in FlexMARL {REMOVED_IN}", FutureWarning,
                      stacklevel=2)
        return importlib.import_module(MOVED[spec.name])

    def exec_module(self, module) -> None:
        """Nothing to run: `module` is the new module, already executed."""


def install() -> None:
    """Put the finder last on sys.meta_path (once per interpreter)."""
    if not any(isinstance(f, MovedModules) for f in sys.meta_path):
        sys.meta_path.append(MovedModules())


def renamed_getattr(module: str, namespace: dict, note: str = "") -> Callable[[str], Any]:
    """A module-level __getattr__ for `module` that resolves RENAMED_CLASSES[module]'s old
    names in `namespace` (the module's globals), with a FutureWarning."""
    renamed = RENAMED_CLASSES.get(module, {})

    def __getattr__(name: str) -> Any:
        if name in renamed:
            new = renamed[name]
            warnings.warn(f"{module}.{name} is now {module}.{new}{note}; the old name will be "
                          f"removed in FlexMARL {REMOVED_IN}", FutureWarning, stacklevel=2)
            return namespace[new]
        raise AttributeError(f"module {module!r} has no attribute {name!r}")

    return __getattr__
