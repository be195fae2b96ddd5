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
                         (action_to_string; in another case only where that names one);
                         anything else is rejected
                         and asked again (`retries`), then a uniformly random legal action
                         is played for the seat (the game goes on: its value stays a game's)
      ─► state.returns() ─► each seat's reward on each of its moves (a rejected reply:
         invalid_reward, the game's lowest return by default), as the TextArena adapter
         credits them (flexmarl.envs.textarena)
      held-out task Match(seed, agent, opponent) ─► the deal in every seat (duplicate format),
        scored games.<opponent>.seat<i>.<win|draw|loss>, seat-balanced .<win|draw|loss>,
        .unmoved, .invalid, .return (the seat-balanced mean return: a poker game's chips)
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
import math
import random
import re
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from flexmarl.envs import require
from flexmarl.envs.policy_tables import (MAX_EXACT_STATES, Analysis, PastPool, TablePlayer,
                                         chance, count_infostates, deal, state_text)
from flexmarl.envs.textarena import (RANDOM, START, Game, Lineup, Match, _deal_number,
                                     workflow_for)
from flexmarl.team import AgentSpec, Team

LOWEST = "lowest"
"""openspiel_team's default invalid_reward: the game's lowest return (game.min_utility())."""
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


def action_names(state: Any, player: int) -> dict[int, str]:
    """Each legal action of `player` -> its name (action_to_string)."""
    return {a: state.action_to_string(player, a) for a in state.legal_actions(player)}


def parse(text: str, names: dict[int, str]) -> int | None:
    """The legal action a reply names: what its first "[" opens up to its "]" (names may hold
    brackets themselves: goofspiel's "[P0]Bid: 3"), else the whole reply, compared with the
    actions' names, blanks around them aside: exactly first, then ignoring case where that
    names one action only (chess's "Bxc3" and "bxc3" are two moves: a reply must spell them as
    the game does); None if it names none."""
    start = text.find("[")
    if start < 0:
        whole = text.strip().rstrip(".").strip()
        return _named(names, lambda key, fold: fold(whole) == fold(key))
    inner = text[start + 1:].lstrip()

    def opens(key: str, fold: Callable[[str], str]) -> bool:
        return (fold(inner[:len(key)]) == fold(key)
                and inner[len(key):].lstrip().startswith("]"))
    return _named(names, opens)


def _named(names: dict[int, str], matches: Callable[..., bool]) -> int | None:
    """The action whose name matches exactly (the longest, where several do), else the one
    that matches ignoring case (None where different ones do)."""
    for fold in (str, str.casefold):
        found = {a: n.strip() for a, n in names.items()
                 if n.strip() and matches(n.strip(), fold)}
        if found:
            longest = max(len(n) for n in found.values())
            best = sorted(a for a, n in found.items() if len(n) == longest)
            if len(best) == 1 or fold is str:
                return best[0]
            return None
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


@dataclass(frozen=True)
class OpponentMix:
    """Who the learners meet in training games, drawn per task (every game of a task, its
    GRPO group, meets the same): each seat of a trainable agent is played by that agent with
    weight weights["self"], by one of its past versions with weights["past"] (a policy table
    of a version it served, from a pool of the newest `keep`, one every `every` versions:
    PastPool), by the random player with weights["random"], or by a frozen agent of the team
    with weights[its name]; at least one seat a game stays its learner's."""

    weights: tuple[tuple[str, float], ...]
    every: int = 5
    keep: int = 8

    def draw(self, rng: random.Random) -> str:
        names = [n for n, _ in self.weights]
        return rng.choices(names, [w for _, w in self.weights])[0]


def _lineup(seats: Sequence[str], trainable: set[str], mix: OpponentMix, pool: Any
            ) -> Callable[[Any, Game], list]:
    """lineup(ctx, game) for workflow_for: the seats' players of a training game (OpponentMix)."""
    drawn: dict[str, list] = {}  # per task: its games (one GRPO group) meet the same seats

    def lineup(ctx: Any, task: Game) -> list:
        key = f"{task.task_id}/{ctx.input_id}"
        if key in drawn:
            return list(drawn[key])
        if len(drawn) >= 4096:  # the oldest tasks' draws: long done
            drawn.pop(next(iter(drawn)))
        rng = random.Random(f"opponents/{key}")
        players: list = list(seats)
        learners = [i for i, p in enumerate(seats) if p in trainable]
        keep = rng.choice(learners)  # this seat learns whatever the draws
        for i in learners:
            if i == keep:
                continue
            who = mix.draw(rng)
            if who == "past":
                past = pool.pick(seats[i], rng) if pool is not None else None
                players[i] = past if past is not None else seats[i]
            elif who != "self":
                players[i] = who
        drawn[key] = players
        return list(players)
    return lineup


async def play(ctx: Any, rules: SpielRules, seats: Sequence[str], seed: int, game: str = "",
               asked: list[int] | None = None
               ) -> tuple[dict[int, float], dict[int, list], dict[int, list[bool]]]:
    """One game (textarena.play's contract): (each seat's return, each seat's completions,
    whether each was rejected). `seats[i]`: an agent name, RANDOM or a TablePlayer. Calls are
    labelled "<game>s<seat>.m<move>[.retry<k>]"."""
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
        if isinstance(player, TablePlayer):  # a past version of an agent, as its table
            state.apply_action(player.act(state, rng))
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
                   invalid_reward: float | str | None = LOWEST, per_game_weight: bool = True,
                   exact: bool | None = None, train_opponents: dict[str, float] | None = None,
                   past_every: int = 5, past_keep: int = 8) -> Team:
    """A team that plays OpenSpiel's `game` (with `params`), one entry of `players` per seat,
    as textarena.game_team does (its players, opponents, eval_games and seeds mean the same).
    `invalid_reward`: a rejected reply's reward; LOWEST (the default), the game's lowest
    return (game.min_utility(): -2 in Kuhn Poker), so that no reply the game rejects is worth
    more than a legal move, whatever it loses (at -1, a rejected reply would beat calling a
    bet and losing 2, and a player whose legal moves all lost got no signal to learn them).
    `exact`: measure each agent's policy table and NashConv before and after training
    (policy_tables.Analysis); None: where the game has at most 5,000 information states.
    `train_opponents`: who the learners meet in training games, by weight: "self" (the
    team's own agents, self-play: the default alone), "past" (earlier versions of the seat's
    agent: a pool of its policy tables, one every `past_every` versions, the newest
    `past_keep`; needs the exact tables), "random", or a frozen agent's name (OpponentMix)."""
    loaded = load_game(game, tuple(sorted((params or {}).items())))
    need = loaded.num_players()
    if need < 2:
        raise ValueError(f"{game} is a one-player game: a game team needs at least two seats "
                         "(its matches put the agent against an opponent); train one agent on "
                         "it with a workflow of its own")
    if len(players) != need:
        raise ValueError(f"{game}: {need} players (one per seat), got {len(players)}: "
                         f"{players!r}")
    if retries < 0:
        raise ValueError(f"{game}: retries must be >= 0, got {retries}")
    lineup = Lineup.of(game, players, opponents, eval_games, train_games=train_games,
                       seed=seed, eval_seed=eval_seed)
    if invalid_reward == LOWEST:
        invalid_reward = float(loaded.min_utility())
    elif isinstance(invalid_reward, str):
        raise ValueError(f"{game}: invalid_reward is a number, None or {LOWEST!r}, got "
                         f"{invalid_reward!r}")
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
    if exact or (exact is None and count_infostates(loaded) <= MAX_EXACT_STATES):
        analysis = Analysis(rules, {s.name: s for s in lineup.agents}, lineup.seats)
    choose = None
    if train_opponents:
        mix = _mix(game, train_opponents, lineup, analysis, past_every, past_keep)
        if "past" in dict(mix.weights):
            analysis.pool = PastPool(analysis, sorted(lineup.trainable), mix.every, mix.keep)
        choose = _lineup(lineup.seats, lineup.trainable, mix,
                         analysis.pool if analysis is not None else None)
    return Team(name=name or re.sub(r"[^A-Za-z0-9_-]", "_", game), agents=lineup.agents,
                workflow=workflow_for(rules, lineup.seats, lineup.trainable, play, choose),
                tasks=lineup.tasks, heldout=lineup.heldout,
                heldout_round=functools.partial(_deal_number, eval_seed), analysis=analysis)


def _mix(game: str, weights: dict[str, float], lineup: Lineup, analysis: Any, every: int,
         keep: int) -> OpponentMix:
    """train_opponents checked, or ValueError naming what to change."""
    frozen = {a.name for a in lineup.agents if not a.trainable}
    allowed = {"self", "past", RANDOM, *frozen}
    bad = sorted(set(weights) - allowed)
    if bad or any(not isinstance(w, (int, float)) or not w >= 0 for w in weights.values()) \
            or not 0 < sum(weights.values()) < math.inf:
        raise ValueError(f"{game}: train_opponents weighs who the learners meet: keys among "
                         f"{sorted(allowed)}, finite weights >= 0 adding up to more than 0; "
                         "got "
                         f"{weights!r}")
    if weights.get("past") and analysis is None:
        raise ValueError(f"{game}: 'past' opponents play from policy tables, which this game is "
                         "too big for (exact=False or over 5,000 information states); leave "
                         "'past' out")
    if every < 1 or keep < 1:
        raise ValueError(f"{game}: past_every and past_keep must be >= 1, got {every}, {keep}")
    return OpponentMix(tuple(sorted((k, float(v)) for k, v in weights.items() if v)), every,
                       keep)


__all__ = ["Game", "INSTRUCTION", "LOWEST", "Match", "OpponentMix", "RANDOM", "START", "SYSTEM",
           "SpielRules", "TablePlayer",
           "action_names", "chance", "deal", "load_game", "openspiel_team", "parse", "play",
           "state_text"]
