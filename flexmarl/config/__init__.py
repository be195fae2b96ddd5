"""The run's configuration: one dataclass per TOML section, loaded from files and --set overrides.

    checks.py     ConfigError and the validation helpers every section uses
    sections.py   the sections of the run's own parts (run, team, pipeline, rollout, trainer_pool,
                  observe, cluster, gateway); lower components' sections live beside them
                  (trainer: training/trainer.py, balance: rollout/balancer.py, transport and
                  supervisor: runtime/config.py) and are imported here
    load.py       Config (all sections), load_config, TOML reading and writing, old names
    default.toml  the default experiment, every key with its default and why
"""
from flexmarl.checks import ConfigError
from flexmarl.config.load import Config, load_config

__all__ = ["Config", "ConfigError", "load_config"]
