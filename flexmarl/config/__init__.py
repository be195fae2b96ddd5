"""The run's configuration, the ground floor: one dataclass per TOML section, loaded from files
and --set overrides.

    sections.py   the run as a whole and its upper parts: run, team, observe, cluster, gateway,
                  plan, devices (and parse_placement, devices.placement's reader)
    pipeline.py   pipeline (and PIPELINE_MODES), eval
    rollout.py    rollout (and the engines' names, dtypes and weight transfers)
    balance.py    balance (and STRATEGIES)
    training.py   trainer, trainer_pool
    load.py       Config (all sections), load_config, TOML reading and writing, old names
    default.toml  the default experiment, every key with its default and why

Every module here imports only flexmarl.checks (ConfigError and the validation helpers) and
runtime.config (transport, supervisor): any part of the system takes its section from here
without pulling the others in (tests/test_layout.py pins it). This face is the public path of
every section's class.
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
