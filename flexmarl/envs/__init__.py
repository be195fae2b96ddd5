"""Environments others wrote, scored by their own libraries (the `envs` extra).

    textarena.py      any TextArena game id ─► a team: one agent per player seat (or
                      a mapping: separate models, a shared one, a frozen opponent); the
                      env's own rules, invalid-move handling and rewards; one-seat games
                      (puzzles) measured by their own success rate
    lineup.py         who plays a game team's seats and what it plays (both libraries'):
                      players and opponents checked, start copies, training games and
                      held-out matches
    seats.py          a seat played by several agents: a function of the user's makes
                      each move (Seat, Turn), its calls labelled and credited per agent
    openspiel.py      any OpenSpiel game ─► a team: one agent per seat, the game's own
                      legal actions (named in the prompt) and returns; training
                      opponents drawn from a mix (self, past versions, random, frozen)
    policy_tables.py  a small OpenSpiel game's exact measures of the agents: each one's
                      policy table from its likelihood of each legal action, NashConv,
                      cross-play with openskill ratings, the pool of past versions
    reasoning_gym.py  any reasoning-gym dataset ─► train and held-out tasks, scored by
                      the dataset's own `score_answer`
    verifiers.py      any verifiers environment (an Env, or a package by name) ─► a team:
                      its own rollouts and rubric, in-process; each role played by an agent

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
