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

from flexmarl import _compat
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

__getattr__ = _compat.renamed_getattr(
    __name__, globals(), " (section [train] was renamed [trainer_pool])")
