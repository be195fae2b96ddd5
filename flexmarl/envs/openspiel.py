"""OpenSpiel games as teams: one agent per player seat, the game's own rules, legal actions and
returns, and exact game-theoretic measures of the agents' policies (policy_tables).

    openspiel_team("kuhn_poker", players=[AgentSpec(name="p0", ...), AgentSpec(name="p1", ...)])
      train task Game(seed) ─► play(): game.new_initial_state(); every chance outcome drawn
        from the deal's own generator (the seed alone: the same deal whoever sits where)
        until terminal: the seat to move ─► its agent: ctx.generate(agent, [system, the
                          game, the seat, describe(state, seat), the legal actions named
                          ("[Pass] or [Bet]")], turn="s<seat>.m<move>[.retry<k>]")
                        (or "random": a uniformly random legal action)
                      ─► parse(): its first "[" opens a legal action's name
                         (action_to_string, case-insensitive); anything else is rejected
                         and asked again (`retries`), then a uniformly random legal action
                         is played for the seat (the game goes on: its value stays a game's)
      ─► state.returns() ─► each seat's reward on each of its moves (a rejected reply:
         invalid_reward), as the TextArena adapter credits them (flexmarl.envs.textarena)
      held-out task Match(seed, agent, opponent) ─► the deal in every seat (duplicate format),
        scored games.<opponent>.seat<i>.<win|draw|loss>, seat-balanced .<win|draw|loss>,
        .unscored, .invalid, .return (the seat-balanced mean return: a poker game's chips)
      Team.analysis ─► policy_tables.Analysis: each agent's policy table from its own
        likelihood of each legal action, and its NashConv (eval.json "policies")

Legal actions, the random player and the legality of a move are exact for every OpenSpiel game,
multi-player ones included; a simultaneous-move game plays turn-based
(pyspiel.convert_to_turn_based: each player moves without seeing the others' moves of the
round). The prompt is the information-state string (or the observation string where the game
has none); `describe(state, player)` gives a clearer one (agents/kuhn_openspiel.py does).
"""
from __future__ import annotations

import functools
import random
import re
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from flexmarl.envs import require
from flexmarl.envs.textarena import (RANDOM, START, Game, Lineup, Match, _deal_number,
                                     workflow_for)
from flexmarl.team import AgentSpec, Team

SYSTEM = "You are a competitive game player. Read the game state carefully and pick the best move."
INSTRUCTION = "Your move? Answer with {moves}."


@functools.lru_cache(maxsize=32)
def load_game(name: str, params: tuple[tuple[str, Any], ...] = ()) -> Any:
    """The OpenSpiel game (cached per process), turn-based if its moves are simultaneous;
    ValueError naming the fix for an unknown one."""
    pyspiel = require("pyspiel", "open_spiel")
    try:
        game = pyspiel.load_game(name, dict(params))
    except pyspiel.SpielError as exc:
        raise ValueError(f"OpenSpiel has no game {name!r} with parameters {dict(params)} "
                         f"({exc}); names look like 'kuhn_poker' or 'leduc_poker' "
                         "(pyspiel.registered_names())") from exc
    kind = game.get_type()
    if kind.dynamics == pyspiel.GameType.Dynamics.SIMULTANEOUS:
        game = pyspiel.convert_to_turn_based(game)
    return game


def state_text(state: Any, player: int) -> str:
    """What `player` knows: the information-state string, else the observation string."""
    kind = state.get_game().get_type()
    if kind.provides_information_state_string:
        return state.information_state_string(player)
    if kind.provides_observation_string:
        return state.observation_string(player)
    raise ValueError(f"{kind.short_name}: has neither an information-state nor an observation "
                     "string; give openspiel_team a describe(state, player)")


def action_names(state: Any, player: int) -> dict[int, str]:
    """Each legal action of `player` -> its name (action_to_string)."""
    return {a: state.action_to_string(player, a) for a in state.legal_actions(player)}


def parse(text: str, names: dict[int, str]) -> int | None:
    """The legal action a reply names: what its first "[" opens up to its "]" (names may hold
    brackets themselves: goofspiel's "[P0]Bid: 3"), else the whole reply, compared with the
    actions' names ignoring case and surrounding blanks; None if it names none."""
    by_length = sorted(names.items(), key=lambda item: -len(item[1].strip()))
    low = text.lower()
    start = low.find("[")
    if start < 0:
        whole = low.strip().rstrip(".").strip()
        return next((a for a, n in by_length if n.strip().lower() == whole), None)
    inner = low[start + 1:].lstrip()
    for action, name in by_length:
        key = name.strip().lower()
        if key and inner.startswith(key) and inner[len(key):].lstrip().startswith("]"):
            return action
    return None


@dataclass(frozen=True)
class SpielRules:
    """How `play` turns states into prompts and returns into rewards (the contract of
    textarena.GameRules that workflow_for and match read: num_players, starts,
    invalid_reward, per_game_weight)."""

    game: str
    params: tuple[tuple[str, Any], ...] = ()
    num_players: int = 2
    system: str = SYSTEM
    instruction: str = INSTRUCTION
    describe: Callable[[Any, int], str] | None = None
    retries: int = 1
    """Rejected replies asked again before a random legal action is played for the seat."""
    invalid_reward: float | None = -1.0
    per_game_weight: bool = True
    starts: tuple[tuple[str, str], ...] = ()

    @property
    def loaded(self) -> Any:
        return load_game(self.game, self.params)

    def prompt(self, state: Any, player: int) -> tuple[list[dict], dict[int, str]]:
        """The chat messages for `player` to move in `state`, and its legal actions' names."""
        names = action_names(state, player)
        shown = [f"[{n}]" for n in names.values()]
        listed = " or ".join([", ".join(shown[:-1]), shown[-1]]) if len(shown) > 1 else shown[0]
        seen = (self.describe or state_text)(state, player)
        title = self.loaded.get_type().long_name
        text = (f"{title}. You are player {player}.\n{seen}\n\n"
                + self.instruction.replace("{moves}", listed))
        return ([{"role": "system", "content": self.system}, {"role": "user", "content": text}],
                names)


def deal(seed: int) -> random.Random:
    """The generator of a deal's chance outcomes: its seed alone, so every seating of the
    deal sees the same cards for as long as the chance nodes come in the same order."""
    return random.Random(seed)


def chance(state: Any, rng: random.Random) -> int:
    """A chance outcome drawn with its probability."""
    outcomes = state.chance_outcomes()
    x, total = rng.random(), 0.0
    for action, p in outcomes:
        total += p
        if x < total:
            return action
    return outcomes[-1][0]


async def play(ctx: Any, rules: SpielRules, seats: Sequence[str], seed: int, game: str = "",
               asked: list[int] | None = None
               ) -> tuple[dict[int, float], dict[int, list], dict[int, list[bool]]]:
    """One game (textarena.play's contract): (each seat's return, each seat's completions,
    whether each was rejected). Calls are labelled "<game>s<seat>.m<move>[.retry<k>]"."""
    state = rules.loaded.new_initial_state()
    dealer = deal(seed)
    rng = random.Random(f"{ctx.input_id}/{ctx.trajectory}/{game}")  # the random seats' moves
    asked = asked if asked is not None else [0] * rules.num_players
    asked[:] = [0] * rules.num_players
    moves: dict[int, list] = {i: [] for i in range(rules.num_players)}
    flags: dict[int, list[bool]] = {i: [] for i in range(rules.num_players)}
    made = [0] * rules.num_players
    while not state.is_terminal():
        if state.is_chance_node():
            state.apply_action(chance(state, dealer))
            continue
        seat = state.current_player()
        asked[seat] += 1
        player = seats[seat]
        if player == RANDOM:
            state.apply_action(rng.choice(state.legal_actions(seat)))
            continue
        messages, names = rules.prompt(state, seat)
        action = None
        for attempt in range(rules.retries + 1):
            label = f"{game}s{seat}.m{made[seat]}" + (f".retry{attempt}" if attempt else "")
            [completion] = await ctx.generate(player, messages, turn=label)
            action = parse(completion.text, names)
            moves[seat].append(completion)
            flags[seat].append(action is None)
            if action is not None:
                break
        made[seat] += 1
        state.apply_action(action if action is not None else rng.choice(list(names)))
    return dict(enumerate(state.returns())), moves, flags


def openspiel_team(game: str, players: Sequence[AgentSpec | str], *, name: str | None = None,
                   params: dict | None = None, train_games: int = 4096,
                   eval_games: int | dict[str, int] = 400,
                   opponents: Sequence[str] = (START, RANDOM), seed: int = 0,
                   eval_seed: int = 1_000_000, system: str = SYSTEM,
                   instruction: str = INSTRUCTION,
                   describe: Callable[[Any, int], str] | None = None, retries: int = 1,
                   invalid_reward: float | None = -1.0, per_game_weight: bool = True,
                   exact: bool | None = None) -> Team:
    """A team that plays OpenSpiel's `game` (with `params`), one entry of `players` per seat,
    as textarena.game_team does (its players, opponents, eval_games and seeds mean the same).
    `exact`: measure each agent's policy table and NashConv before and after training
    (policy_tables.Analysis); None: where the game has at most 5,000 information states."""
    loaded = load_game(game, tuple(sorted((params or {}).items())))
    need = loaded.num_players()
    if len(players) != need:
        raise ValueError(f"{game}: {need} players (one per seat), got {len(players)}: "
                         f"{players!r}")
    if retries < 0:
        raise ValueError(f"{game}: retries must be >= 0, got {retries}")
    lineup = Lineup.of(game, players, opponents, eval_games, train_games=train_games,
                       seed=seed, eval_seed=eval_seed)
    rules = SpielRules(game=game, params=tuple(sorted((params or {}).items())),
                       num_players=need, system=system, instruction=instruction,
                       describe=describe, retries=retries, invalid_reward=invalid_reward,
                       per_game_weight=per_game_weight, starts=tuple(sorted(lineup.starts.items())))
    state = loaded.new_initial_state()  # a describe() that fails should fail here, not mid-run
    while state.is_chance_node():
        state.apply_action(state.chance_outcomes()[0][0])
    if not state.is_terminal():
        rules.prompt(state, state.current_player())
    analysis = None
    from flexmarl.envs.policy_tables import MAX_EXACT_STATES, Analysis, count_infostates
    if exact or (exact is None and count_infostates(loaded) <= MAX_EXACT_STATES):
        analysis = Analysis(rules, {s.name: s for s in lineup.agents}, lineup.seats)
    return Team(name=name or re.sub(r"[^A-Za-z0-9_-]", "_", game), agents=lineup.agents,
                workflow=workflow_for(rules, lineup.seats, lineup.trainable, play),
                tasks=lineup.tasks, heldout=lineup.heldout,
                heldout_round=functools.partial(_deal_number, eval_seed), analysis=analysis)


__all__ = ["Game", "INSTRUCTION", "Match", "RANDOM", "START", "SYSTEM", "SpielRules",
           "action_names", "chance", "deal", "load_game", "openspiel_team", "parse", "play",
           "state_text"]
