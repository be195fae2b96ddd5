"""Who plays a game team's seats and what it plays: the lineup a game library's team is built
from (flexmarl.envs.textarena.game_team, flexmarl.envs.openspiel.openspiel_team).

    players (one entry per seat: an AgentSpec, a name given before, "random", a Seat)
      + opponents ("start", "random", an agent or Seat of the team; "solo" for a one-seat game)
      ─► Lineup.of: checked (ValueError naming the game and the fix)
      ─► agents (the players' and, with "start", a frozen copy of each starting model), each
         seat's player, the trainable agents and the Seats that have one (learners), the
         Seats as games play them (crews), training games Game(seed) and held-out matches
         Match(seed, player, opponent), interleaved deal by deal (deal_number)
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Sequence

from flexmarl.envs.seats import Crew, Seat
from flexmarl.team import AgentSpec

RANDOM = "random"
"""A seat (or opponent) that plays a uniformly random legal move (legal_moves)."""
START = "start"
"""The opponent that is the agent's own model as it was before training (a frozen copy)."""
SOLO = "solo"
"""A one-seat game's held-out "opponent": none, the game played alone (games.solo.*)."""


@dataclass(frozen=True)
class Game:
    """A training task: one game from one seed (the task's trajectories replay that deal)."""

    task_id: str
    seed: int


@dataclass(frozen=True)
class Match:
    """A held-out task: one deal (`seed`) played once with `agent` in each seat, `opponent`
    in every other seat (duplicate format: the seat's advantage cancels out); in a one-seat
    game (opponent SOLO), played once alone."""

    task_id: str
    seed: int
    agent: str
    """A trainable agent, or a Seat's name (its trainable agents are scored)."""
    opponent: str
    """START (the agent's frozen starting model), RANDOM, an agent or Seat of the team, or
    SOLO."""


@dataclass
class Lineup:
    """Who plays a game team's seats and what it plays: its agents (those of `players`, then a
    frozen copy of each starting model where START is an opponent), each seat's player, the
    trainable agents, agent (or Seat) -> its START copy, the training games and the held-out
    matches; `crews`: the players that are Seats (and their START copies), `learners`: the
    trainable agents and the Seats that have one (who is credited)."""

    agents: list[AgentSpec]
    seats: list[str]
    trainable: set[str]
    starts: dict[str, str]
    tasks: list[Game]
    heldout: list[Match]
    crews: dict[str, Crew] = field(default_factory=dict)
    learners: set[str] = field(default_factory=set)

    @classmethod
    def of(cls, game: str, players: Sequence[AgentSpec | Seat | str], opponents: Sequence[str],
           eval_games: int | dict[str, int], *, train_games: int, seed: int,
           eval_seed: int, seat_teams: bool = False) -> "Lineup":
        """Checked, or ValueError naming the game and what to change (game_team's rules).
        `seat_teams`: Seat entries are allowed (game_team's, not openspiel_team's)."""
        counts = ({o: eval_games for o in opponents} if isinstance(eval_games, int)
                  else {o: int(eval_games.get(o, 0)) for o in opponents})
        if set(counts) != set(opponents) or min(counts.values(), default=0) < 0 or (
                not isinstance(eval_games, int) and set(eval_games) - set(opponents)):
            raise ValueError(f"{game}: eval_games must be a count or one count per opponent "
                             f"{list(opponents)}, got {eval_games!r}")
        most = max(counts.values(), default=0)
        if eval_seed < seed + train_games and seed < eval_seed + most:
            raise ValueError(f"{game}: training seeds [{seed}, {seed + train_games}) and "
                             f"held-out seeds [{eval_seed}, {eval_seed + most}) overlap")
        specs: dict[str, AgentSpec] = {}
        seat_of: dict[str, Seat] = {}
        seats: list[str] = []

        def new_name(i: int, name: str, what: str) -> None:
            if name in specs or name in seat_of or name in (RANDOM, SOLO, "self", "past") or \
                    re.fullmatch(rf"{START}(_\d+)?", name):
                raise ValueError(f"{game}: seat {i}: {what} name {name!r} is already used (or "
                                 "reserved: 'random', 'solo', 'start', 'start_N', 'self', "
                                 "'past'); to let one agent play several seats, give its "
                                 "name there")
        for i, p in enumerate(players):
            if isinstance(p, AgentSpec):
                new_name(i, p.name, "agent")
                specs[p.name] = p
                seats.append(p.name)
            elif isinstance(p, Seat):
                if not seat_teams:
                    raise ValueError(f"{game}: seat {i}: a Seat (a seat played by several "
                                     "agents) is for TextArena's game_team; give an AgentSpec")
                new_name(i, p.name, "Seat")
                for spec in p.agents:
                    new_name(i, spec.name, f"Seat {p.name}'s agent")
                    specs[spec.name] = spec
                seat_of[p.name] = p
                seats.append(p.name)
            elif p == RANDOM or p in specs or p in seat_of:
                seats.append(p)
            else:
                raise ValueError(f"{game}: seat {i}: {p!r} is neither an AgentSpec, a Seat, the "
                                 f"name of one given at an earlier seat "
                                 f"({sorted([*specs, *seat_of])}), nor {RANDOM!r}")
        trainable = {n for n, s in specs.items() if s.trainable}
        if not trainable:
            raise ValueError(f"{game}: no seat is played by a trainable agent")
        crews = {n: Crew(s, tuple((a.name, a.name) for a in s.agents),
                         tuple(a.name for a in s.agents if a.trainable))
                 for n, s in seat_of.items()}
        learners = trainable | {n for n, c in crews.items() if c.trainable}
        starts: dict[str, str] = {}
        extra: list[AgentSpec] = []
        if START in opponents:  # one frozen copy per starting model (agents on one share it)
            copies: dict[tuple, str] = {}
            for agent in sorted(trainable):
                spec = specs[agent]
                key = (spec.model, repr(spec.sampling))
                if key not in copies:
                    copies[key] = START if not copies else f"{START}_{len(copies) + 1}"
                    extra.append(AgentSpec(name=copies[key], model=spec.model,
                                           sampling=spec.sampling, trainable=False))
                starts[agent] = copies[key]
            for n, s in seat_of.items():  # the Seat's function, on its agents' copies
                starts[n] = f"{START}.{n}"  # "." is in no agent's name
                crews[starts[n]] = Crew(s, tuple((a.name, starts.get(a.name, a.name))
                                                 for a in s.agents), ())
        for o in opponents:
            if o not in (START, RANDOM, SOLO) and o not in specs and o not in seat_of:
                raise ValueError(f"{game}: opponent {o!r} must be {START!r}, {RANDOM!r} or an "
                                 f"agent of the team ({sorted([*specs, *seat_of])})")
        tasks = [Game(f"{game}-{seed + i}", seed + i) for i in range(train_games)]
        heldout = []
        pairs = [(player, o) for player in sorted({p for p in seats if p in learners})
                 for o in opponents if o != player]
        for k in range(most):
            for player, o in pairs:
                if k < counts[o]:
                    heldout.append(Match(f"{game}-{player}-vs-{o}-{eval_seed + k}",
                                         eval_seed + k, player, o))
        return cls([*specs.values(), *extra], seats, trainable, starts, tasks, heldout, crews,
                   learners)


def deal_number(eval_seed: int, match: Match) -> int:
    """A held-out match's round: its deal's number (eval counts are games per pair)."""
    return match.seed - eval_seed


__all__ = ["Game", "Lineup", "Match", "RANDOM", "SOLO", "START", "deal_number"]
