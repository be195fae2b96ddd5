"""Environments others wrote, scored by their own libraries (the `envs` extra).

    textarena.py      any TextArena game id ─► a team: one agent per player seat (or
                      a mapping: separate models, a shared one, a frozen opponent); the
                      env's own rules, invalid-move handling and rewards
    openspiel.py      any OpenSpiel game ─► a team: one agent per seat, the game's own
                      legal actions (named in the prompt) and returns; training
                      opponents drawn from a mix (self, past versions, random, frozen)
    policy_tables.py  a small OpenSpiel game's exact measures of the agents: each one's
                      policy table from its likelihood of each legal action, NashConv,
                      cross-play with openskill ratings, the pool of past versions
    reasoning_gym.py  any reasoning-gym dataset ─► train and held-out tasks, scored by
                      the dataset's own `score_answer`

The libraries are optional: `make setup` installs them (`pip install -e '.[envs]'`), and a
module here that needs one raises MissingExtra naming that command when it is missing.
"""
from __future__ import annotations

import importlib
from types import ModuleType

EXTRA_HINT = "install the envs extra: `pip install -e '.[envs]'` (`make setup` does)"


class MissingExtra(ImportError):
    """An optional library of the `envs` extra is not installed."""


def require(module: str, package: str) -> ModuleType:
    """Import `module` (from pip package `package`), or MissingExtra naming the extra."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingExtra(f"{package} is not installed ({exc}); {EXTRA_HINT}") from exc


__all__ = ["EXTRA_HINT", "MissingExtra", "require"]
