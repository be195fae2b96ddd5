"""The run's configuration: one dataclass per TOML section, loaded from files and --set overrides.

    checks.py     ConfigError and the validation helpers every section uses
    sections.py   the sections of the run's own parts (run, team, pipeline, rollout, trainer_pool,
                  observe, cluster, gateway); lower components' sections live beside them
                  (trainer: training/trainer.py, balance: rollout/balancer.py, transport and
                  supervisor: runtime/config.py) and are imported here
    load.py       Config (all sections), load_config, TOML reading and writing, old names
    default.toml  the default experiment, every key with its default and why

This face is the public path of every section's class, wherever it is defined (they are taken
from load.py, which gathers them all for Config).
"""
from __future__ import annotations

import warnings
from typing import Any

from flexmarl.checks import ConfigError
from flexmarl.config.load import (
    SECTIONS, BalancerConfig, ClusterConfig, Config, DevicesConfig, EvalConfig, GatewayConfig,
    ObserveConfig, PipelineConfig, PlanConfig, RolloutConfig, RunConfig, SupervisorConfig,
    TeamRef, TrainerConfig, TrainerPoolConfig, TransportConfig, dump_toml, load_config)

__all__ = [
    "BalancerConfig", "ClusterConfig", "Config", "ConfigError", "DevicesConfig", "EvalConfig",
    "GatewayConfig", "ObserveConfig", "PipelineConfig", "PlanConfig", "RolloutConfig",
    "RunConfig", "SECTIONS", "SupervisorConfig", "TeamRef", "TrainerConfig",
    "TrainerPoolConfig", "TransportConfig", "dump_toml", "load_config"]

_RENAMED = {"TrainPlacement": "TrainerPoolConfig"}
"""Old name -> new, read with a FutureWarning until FlexMARL 0.2 (as the [train] section is)."""


def __getattr__(name: str) -> Any:
    if name in _RENAMED:
        new = _RENAMED[name]
        warnings.warn(f"flexmarl.config.{name} is now flexmarl.config.{new} (section [train] "
                      f"was renamed [trainer_pool]); the old name will be removed in FlexMARL "
                      "0.2", FutureWarning, stacklevel=2)
        return globals()[new]
    raise AttributeError(f"module 'flexmarl.config' has no attribute {name!r}")
