"""TextArena games as teams: one agent per player seat, the env's own rules and rewards.

    game_team("KuhnPoker-v0", players=[AgentSpec(name="p0", ...), AgentSpec(name="p1", ...)])
    game_team("FrozenLake-v0", players=[AgentSpec(name="p0", ...)])      # one seat: a puzzle
      train task Game(seed) ─► play(): a fresh env per game (ta.make), reset(num_players, seed);
        until done: the seat to move ─► its agent: ctx.generate(agent, [system, observation],
                                        turn="s<seat>.m<move number>[.retry<k>]")
                                     (or "random": a uniformly random legal move; or a Seat:
                                     its own function's calls to its agents, flexmarl.envs.seats)
                    ─► env.step(the completion's text): TextArena parses it as it always does
                       (ActionFormattingWrapper, the env's regex); an invalid move is the env's
                       business (a retry, then a loss: its error_allowance)
      ─► env.close(): each seat's reward (win 1, loss -1, draw 0) ─► ctx.reward on every move
      held-out task Match(seed, agent, opponent) ─► the deal played once with the agent in
        each seat (duplicate format) against "start" (its frozen starting model), "random"
        or a team agent; ctx.score: games.<opponent>.seat<i>.<win|draw|loss>, the
        seat-balanced games.<opponent>.<win|draw|loss>, .return, .unmoved, .invalid (per move), read
        by the run's before/after measurement (counts: games per pair, Team.heldout_round);
        a one-seat game's Match(seed, player, "solo"): the game played once, games.solo.win
        (solved: the env's reward reached SOLVED_REWARD), .loss, .draw (0), .return, .invalid

Players (one entry per seat): an AgentSpec (its own model), the name of an AgentSpec given at an
earlier seat (one model plays several seats), a frozen AgentSpec (trainable=False: a fixed
opponent), "random", or a Seat (several agents through a function of the user's: seats.py);
checked, with the training games and held-out matches, by flexmarl.envs.lineup.

Credit (see docs/games.md): every move of a seat gets that seat's game outcome, and a move the
env rejected gets `invalid_reward` instead (default: the env's loss, -1). Advantages are
grouped per (agent, move) over the task's games of one seed (pipeline.credit = "turn", agent-
and turn-aware as AT-GRPO), a move named by its seat, its move number and its attempt, so
a retry after a rejected move is never compared with another game's next move;
pipeline.credit = "trajectory" compares whole games instead.
Each of a seat's k moves in a game is weighted 1/k (`per_game_weight`), so a long game counts
as much as a short one; per_game_weight=False counts every move alike. A Seat's calls: each
gets the reward of the move it was made for, weighted 1/k for each agent's k calls (seats.py).

TextArena's envs reseed and draw from the process-global `random` module; each game here runs
on its own saved generator state (IsolatedEnv), so games interleaved on one event loop deal what
they would alone, and nothing else in the process is reseeded.
"""
from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import logging
import random
import re
import zlib
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

from flexmarl.checks import RequestError
from flexmarl.envs import require
from flexmarl.envs.lineup import (RANDOM, SOLO, START, Game, Lineup, Match,
                                  deal_number as _deal_number)
from flexmarl.envs.seats import Crew, Seat, SeatFailed, Turn, crew_move
from flexmarl.team import AgentSpec, Team

log = logging.getLogger(__name__)

SOLVED_REWARD = 1.0
"""A one-seat game may be solved only when its reward reaches this: TextArena's single-player
games give 1 for solving and otherwise their progress, mostly in [0, 1), but not always (2048's
progress reaches 1.0 on a lost board; a forfeit by rejected moves is paid its progress too), so
a reward of 1 alone is not a solve: see solved()."""
SOLVED_CHECKS: dict[str, Callable[[Any], bool]] = {
    "Game2048Env": lambda env: env._max_tile() >= env.target_tile,
}
"""Env class name -> whether its finished game was really solved, where its reward can reach
SOLVED_REWARD without a solve (2048 pays its progress, capped at 1.0, on a lost board)."""


class SoloRewards(dict):
    """A one-seat game's rewards ({0: reward}, the env's) and whether it was solved (solved())."""

    def __init__(self, rewards: dict, solved: bool) -> None:
        super().__init__(rewards)
        self.solved = solved


def solved(env: Any, rewards: dict[int, float], info: dict) -> bool:
    """Whether a finished one-seat game was solved: its reward reached SOLVED_REWARD, it did
    not end on a rejected move (a forfeit: TextArena pays it the progress so far, which may be
    1.0), and, for an env in SOLVED_CHECKS, the board says so."""
    if rewards.get(0, 0.0) < SOLVED_REWARD or (info.get(0) or {}).get("invalid_move"):
        return False
    inner = env
    while hasattr(inner, "env"):  # IsolatedEnv and TextArena's wrappers
        inner = inner.env
    check = SOLVED_CHECKS.get(type(inner).__name__)
    return check(inner) if check is not None else True
SYSTEM = ("You are a competitive game player. Make sure you read the game instructions "
          "carefully, and always follow the required format.")
"""TextArena's own system prompt for LLM players (ta.agents.basic_agents.STANDARD_GAME_PROMPT)."""
INSTRUCTION = "Your move? Answer with {moves}."
"""Appended to every observation ({moves}: the legal moves where legal_moves knows them, "[a],
[b] or [c]", else "your action in square brackets"): a small model otherwise goes on writing
the transcript instead of moving (SmolLM2-135M: about 1 valid first move in 10 sampled without
it, 3 in 10 with it)."""
OUTCOMES = ("win", "draw", "loss")
_MESSAGE = re.compile(r"(?<=[^\n])\n(?=\[(?:GAME|Player(?: \d+)?)\])")
"""Where a new message of the transcript starts ("[Player]": a single-player game's moves)."""
_LISTED = re.compile(r"(?:Available Moves|available actions are):\s*((?:'\[[^\]]*\]'(?:,\s*)?)+)",
                     re.IGNORECASE)


class IsolatedEnv:
    """A TextArena env whose use of the global `random` module runs on its own state."""

    def __init__(self, env: Any) -> None:
        self.env = env
        self._state: Any = None

    @contextlib.contextmanager
    def _own_random(self) -> Iterator[None]:
        outer = random.getstate()
        if self._state is not None:
            random.setstate(self._state)
        try:
            yield
        finally:
            self._state = random.getstate()
            random.setstate(outer)

    def reset(self, num_players: int, seed: int) -> None:
        with self._own_random():
            self.env.reset(num_players=num_players, seed=seed)

    def observe(self) -> tuple[int, str]:
        with self._own_random():
            return self.env.get_observation()

    def step(self, action: str) -> bool:
        with self._own_random():
            done, _ = self.env.step(action=action)
        return done

    def close(self) -> tuple[dict[int, float], dict]:
        with self._own_random():
            rewards, info = self.env.close()
        return {int(k): float(v) for k, v in (rewards or {}).items()}, info or {}

    @property
    def state(self) -> Any:
        return self.env.state


def make_env(env_id: str, **kwargs: Any) -> IsolatedEnv:
    """A fresh env (never reuse one across games: TextArena's wrappers keep their history)."""
    ta = require("textarena", "textarena")
    try:
        return IsolatedEnv(ta.make(env_id, **kwargs))
    except ValueError as exc:
        raise ValueError(f"TextArena has no env {env_id!r} ({exc}); ids look like "
                         "'KuhnPoker-v0' or 'TicTacToe-v0'") from exc


def legal_moves(env: IsolatedEnv, observation: str) -> list[str] | None:
    """The moves the player to act may make now, or None where this cannot be told.

    Kuhn Poker, Tic-Tac-Toe and FrozenLake read them from the env's state (the actions its
    legal-action tree allows; the board's empty cells; the steps that stay on the board, holes
    included: walking into one is a legal, losing move); other games from the last list the
    observation prints ("Available Moves: '[0]', ..." or "available actions are: ...")."""
    state = env.state
    game = getattr(state, "game_state", None) or {}
    env_id = str(getattr(env.env, "env_id", ""))
    if env_id.startswith("KuhnPoker") and "current_legal_action_tree" in game:
        return [f"[{k}]" for k in game["current_legal_action_tree"]]
    if env_id.startswith("TicTacToe") and "board" in game:
        board = game["board"]
        return [f"[{r * 3 + c}]" for r in range(3) for c in range(3) if board[r][c] in ("", " ")]
    if env_id.startswith("FrozenLake") and "player_pos" in game:  # the steps that stay on it
        (row, col), size = game["player_pos"], len(game["grid"])
        return [move for move, (r, c) in (("[up]", (row - 1, col)), ("[down]", (row + 1, col)),
                                          ("[left]", (row, col - 1)), ("[right]", (row, col + 1)))
                if 0 <= r < size and 0 <= c < size]
    listed = _LISTED.findall(observation)
    return re.findall(r"'(\[[^\]]*\])'", listed[-1]) if listed else None


def trim(observation: str, max_chars: int) -> str:
    """The observation cut to at most `max_chars`: its first message (the game's rules) kept
    whole (its first 3/4 of `max_chars` if it is longer), then as many of the latest messages as
    fit, a "[...]" line where messages were left out."""
    if len(observation) <= max_chars:
        return observation
    first, *rest = _MESSAGE.split(observation)
    if len(first) > max_chars * 3 // 4:
        first = first[:max_chars * 3 // 4]
    room = max_chars - len(first) - len("\n[...]")
    tail: list[str] = []
    for message in reversed(rest):
        if room - len(message) - 1 < 0:
            break
        tail.append(message)
        room -= len(message) + 1
    return "\n".join([first, "[...]", *reversed(tail)])


@dataclass(frozen=True)
class GameRules:
    """How `play` turns observations into prompts and outcomes into rewards."""

    env_id: str
    num_players: int
    env_kwargs: tuple[tuple[str, Any], ...] = ()
    system: str = SYSTEM
    instruction: str = INSTRUCTION
    max_prompt_chars: int = 4000
    invalid_reward: float | None = -1.0
    """A rejected move's reward (None: the game's outcome like any move)."""
    per_game_weight: bool = True
    starts: tuple[tuple[str, str], ...] = ()
    """agent (or Seat) -> the frozen agent (or Crew) serving its starting model (START)."""
    crews: tuple[tuple[str, Crew], ...] = ()
    """A player played by a Seat -> how (its function, who answers its agents' calls)."""

    def prompt(self, observation: str, moves: list[str] | None = None,
               max_chars: int | None = None) -> list[dict]:
        text = trim(observation.strip("\n"), max_chars or self.max_prompt_chars)
        if self.instruction:
            listed = (" or ".join([", ".join(moves[:-1]), moves[-1]] if len(moves) > 1
                                  else moves) if moves else "your action in square brackets")
            text = f"{text}\n\n{self.instruction.replace('{moves}', listed)}"
        return [{"role": "system", "content": self.system}, {"role": "user", "content": text}]


async def play(ctx: Any, rules: GameRules, seats: Sequence[str], seed: int, game: str = "",
               asked: list[int] | None = None
               ) -> tuple[dict[int, float], dict[int, list], dict[int, list[bool]]]:
    """One game: (each seat's reward, each seat's completions, whether the env rejected each
    of them). `seats[i]` plays seat i: an agent name, RANDOM, or a name of rules.crews (a
    Seat: every call its function made, each flagged as its move was). Each call is labelled with
    its move (ctx.generate(turn=...)): the seat, the player's move number (its moves the env
    accepted so far) and, for a retry after a rejected move, its attempt ("s0.m2",
    "s0.m2.retry1"), so GRPO compares a move with the same move of the task's other games,
    never with a retry or a later move. `game` prefixes the labels (several games of one
    trajectory: a held-out Match); `asked`, if given, gets each seat's count of turns to
    move (random players' too)."""
    env = make_env(rules.env_id, **dict(rules.env_kwargs))
    env.reset(rules.num_players, seed)
    rejected: list[bool] = []
    original = env.state.set_invalid_move

    def invalid(*args: Any, **kwargs: Any) -> Any:  # the env's own verdict, recorded
        rejected.append(True)
        return original(*args, **kwargs)
    env.state.set_invalid_move = invalid
    rng = random.Random(zlib.crc32(f"{ctx.input_id}/{ctx.trajectory}/{game}".encode()))
    tries: dict[tuple[int, int], int] = {}
    made = [0] * rules.num_players  # each seat's moves the env accepted: its move number
    asked = asked if asked is not None else [0] * rules.num_players
    asked[:] = [0] * rules.num_players
    fitted: dict[str, int] = {}  # player -> the prompt size that fits its context
    moves: dict[int, list] = {i: [] for i in range(rules.num_players)}
    flags: dict[int, list[bool]] = {i: [] for i in range(rules.num_players)}
    done = False
    limit = 10_000  # a game that never ends is the env's bug: fail the trajectory, not the run
    crews = dict(rules.crews)
    while not done:
        limit -= 1
        if limit < 0:
            raise RuntimeError(f"{rules.env_id}: no end after 10,000 moves (seed {seed})")
        seat, observation = env.observe()
        player = seats[seat]
        asked[seat] += 1
        options = legal_moves(env, observation)
        if player == RANDOM:
            if not options:
                raise RuntimeError(f"{rules.env_id}: no legal moves known for seat {seat} "
                                   "(a random player needs them: see legal_moves)")
            action, calls = rng.choice(options), []
        else:
            # The seat's own move number, not the env's turn counter: some envs' counter
            # does not advance per move (every move would look like a retry of the first).
            move = made[seat]
            attempt = tries.get((seat, move), 0)
            tries[(seat, move)] = attempt + 1
            label = f"{game}s{seat}.m{move}" + (f".retry{attempt}" if attempt else "")
            if player in crews:
                ask = functools.partial(_ask, rules, observation, options, fitted)
                try:
                    action, calls = await crew_move(ctx, crews[player], seat, observation,
                                                    options, rules.prompt(observation, options),
                                                    label, ask)
                except SeatFailed as failed:  # the function's failure: the seat forfeits
                    _warn_once(str(failed))
                    moves[seat].extend(failed.calls)
                    flags[seat].extend([True] * len(failed.calls))
                    return ({i: -1.0 if i == seat else 1.0 for i in range(rules.num_players)},
                            moves, flags)
            else:
                completion = await _move(ctx, rules, player, observation, options, label,
                                         fitted)
                action, calls = completion.text, [completion]
        rejected.clear()
        try:
            done = env.step(action)
        except Exception:  # noqa: BLE001 - the env's own bug, met by the agent's text
            if player == RANDOM:
                raise
            # The agent's reply broke the env (TextArena's int() of a 5,000-digit "move"):
            # its forfeit, scored as a loss, so that no reply can make a deal vanish from
            # the measurement by failing it.
            moves[seat].extend(calls)
            flags[seat].extend([True] * len(calls))
            return ({i: -1.0 if i == seat else 1.0 for i in range(rules.num_players)},
                    moves, flags)
        if not rejected:
            made[seat] += 1
        moves[seat].extend(calls)
        flags[seat].extend([bool(rejected)] * len(calls))
    rewards, info = env.close()
    if rules.num_players == 1:  # scored as solved or not by the game's end, not its reward
        rewards = SoloRewards(rewards, solved(env, rewards, info or {}))
    return rewards, moves, flags


MIN_PROMPT_CHARS = 250
"""The least a prompt is cut to (the rules' first 3/4 of it, then the latest messages)."""


_WARNED: set[str] = set()


def _warn_once(message: str) -> None:
    """A Seat function's failure, logged once per distinct message (each game repeats it)."""
    if message not in _WARNED:
        _WARNED.add(message)
        log.warning("%s; the seat forfeits the game (a loss; its calls of the move rewarded "
                    "as rejected moves). Later failures alike are not logged again", message)


async def _move(ctx: Any, rules: GameRules, player: str, observation: str,
                options: list[str] | None, label: str | None, fitted: dict[str, int],
                then: Sequence[dict] = (), **sampling: Any) -> Any:
    """The player's completion for this observation (the prompt, then the messages `then`:
    a Seat's Turn.ask; `sampling`: the call's overrides). A prompt that does not fit the agent's
    context (rollout.max_model_len, with its max_tokens) is cut further, halved until it
    fits (not below MIN_PROMPT_CHARS), and that size kept for the player's later moves in
    this game: a game's default max_prompt_chars fits any context instead of failing every
    game."""
    size = fitted.get(player, rules.max_prompt_chars)
    while True:
        try:
            [completion] = await ctx.generate(
                player, [*rules.prompt(observation, options, size), *then], turn=label,
                **sampling)
        except RequestError as exc:
            if exc.param not in ("prompt", "max_tokens"):
                raise
            if size <= MIN_PROMPT_CHARS:  # what to change, beside what the context holds
                raise RequestError(
                    f"{exc}; the game's transcript is cut to {size} characters already (the "
                    f"least the cutting goes to, {MIN_PROMPT_CHARS}; game_team's "
                    f"max_prompt_chars = {rules.max_prompt_chars} is the most), its system "
                    "prompt and the move's instruction on top: lower the agent's max_tokens "
                    f"(SamplingParams), set max_prompt_chars below {size}, or use a model "
                    "with a longer context", param=exc.param) from None
            size = max(MIN_PROMPT_CHARS, size // 2)
            continue
        fitted[player] = size
        return completion


async def _ask(rules: GameRules, observation: str, options: list[str] | None,
               fitted: dict[str, int], seat_ctx: Any, agent: str, then: list,
               turn: str | None, sampling: dict) -> Any:
    """A Seat's Turn.ask: `agent`'s completion of the seat's prompt, then `then` (_move)."""
    return await _move(seat_ctx, rules, agent, observation, options, turn, fitted, then,
                       **sampling)


def outcome(rewards: dict[int, float], seat: int, *, solo: bool = False) -> str:
    """"win", "draw" or "loss" of `seat`: a draw when every seat got the same reward, a win
    when the seat's reward is the highest (shared or not), else a loss. `solo` (a one-seat
    game): a win when play() found it solved (solved(): not its reward alone; a game it could
    not judge, a forfeit by a reply that broke the env, is a loss), else a loss."""
    if solo:
        return "win" if getattr(rewards, "solved", False) else "loss"
    values = list(rewards.values())
    mine = rewards.get(seat, min(values, default=0.0))
    if not values or max(values) == min(values):
        return "draw"
    return "win" if mine == max(values) else "loss"


def credit(ctx: Any, rules: GameRules, trainable: set[str], seats: Sequence[str],
           rewards: dict[int, float], moves: dict[int, list], flags: dict[int, list[bool]]
           ) -> None:
    """Every move of a seat whose player is in `trainable` (an agent, or a Seat's name), by
    each agent in `trainable`: its game outcome (a rejected move: invalid_reward), weighted
    1/k for an agent's k calls at the seat when per_game_weight (a lone player: its k moves)."""
    for seat, made in moves.items():
        if seats[seat] not in trainable or not made:
            continue
        calls = collections.Counter(c.agent for c in made)
        for completion, bad in zip(made, flags[seat]):
            if completion.agent not in trainable:  # a Seat's frozen agent
                continue
            weight = 1.0 / calls[completion.agent] if rules.per_game_weight else 1.0
            value = (rules.invalid_reward if bad and rules.invalid_reward is not None
                     else rewards.get(seat, 0.0))
            ctx.reward(completion, value, weight=weight)


def workflow_for(rules: Any, seats: Sequence[str], trainable: set[str],
                 play: Callable[..., Any] = play,
                 lineup: Callable[[Any, Game], list] | None = None
                 ) -> Callable[[Any, Any], Any]:
    """The team's workflow: a Game plays `seats` (or `lineup(ctx, game)`'s players: training
    opponents drawn per game, flexmarl.envs.openspiel); a Match plays its deal once with its
    agent in each seat against its opponent (the games at once) and scores them. `rules` and
    `play`: this module's GameRules and play, or another game library's with the same
    contract (flexmarl.envs.openspiel)."""
    starts = dict(rules.starts)

    async def workflow(ctx: Any, task: Game | Match) -> None:
        if isinstance(task, Match):
            await match(ctx, rules, task, starts, play)
            return
        players = lineup(ctx, task) if lineup is not None else list(seats)
        rewards, moves, flags = await play(ctx, rules, players, task.seed)
        credit(ctx, rules, trainable, players, rewards, moves, flags)
        learners = [i for i, p in enumerate(players) if p in trainable]
        ctx.team_reward(sum(rewards.get(i, 0.0) for i in learners) / max(len(learners), 1))
    return workflow


async def match(ctx: Any, rules: Any, task: Match, starts: dict[str, str],
                play: Callable[..., Any] = play) -> None:
    """The deal in every seat; scores (ctx.score, for `task.agent`), over every game of the
    deal, as the game scored it: per seat games.<opponent>.seat<i>.<win|draw|loss>, the
    seat-balanced games.<opponent>.<win|draw|loss> (their mean over the deal's seats: each deal
    counts once), games.<opponent>.return (the agent's seat-balanced mean reward: a poker
    game's chips, where a hand won by a fold and one won at a called showdown are both wins,
    not the same gain), and games.<opponent>.invalid per move of the agent.
    games.<opponent>.unmoved, a diagnostic, is the share of the deal's games that ended before
    every seat had moved (an opening forfeit or fold): those games count like any other, a
    forfeit being a loss for whoever forfeited, because leaving them out would let the
    opener choose which of its games are scored (forfeit the ones it would lose). With two
    identical players the seat-balanced win rate is 0.5 in expectation, whatever the seat's
    advantage; with n players the same baseline is 1/n (a shared best reward is a win for
    each). `play`: textarena's, or another library's with its contract
    (flexmarl.envs.openspiel).

    A one-seat game (opponent SOLO) is played once: games.solo.win is the share solved
    (solved(): its reward reached SOLVED_REWARD, not by a forfeit, and the board agrees where
    SOLVED_CHECKS knows it), .loss the rest, .draw 0, .return the env's reward, .invalid
    per move; no seat or unmoved scores. A Seat's scores go to each of its trainable agents
    (.invalid: per call of the agent, 1 if the env rejected the move it was made for)."""
    crew = dict(getattr(rules, "crews", ())).get(task.agent)
    scored = crew.trainable if crew is not None else (task.agent,)
    solo = rules.num_players == 1
    other = starts[task.agent] if task.opponent == START else task.opponent
    lineups = [[task.agent if i == seat else other for i in range(rules.num_players)]
               for seat in range(rules.num_players)]
    asked = [[0] * rules.num_players for _ in lineups]
    running = [asyncio.ensure_future(play(ctx, rules, players, task.seed, f"g{seat}.",
                                          asked[seat]))
               for seat, players in enumerate(lineups)]
    try:
        games = await asyncio.gather(*running)
    except BaseException:  # one game failed: the others stop too, and its own error is raised
        for t in running:
            t.cancel()
        await asyncio.gather(*running, return_exceptions=True)
        raise
    for players, game in zip(lineups, games):  # its moves' rewards, as in training
        credit(ctx, rules, {task.agent, *scored}, players, *game)

    def score(name: str, value: float) -> None:
        for agent in scored:
            ctx.score(agent, f"games.{task.opponent}.{name}", value)
    results = []
    for seat, (rewards, moves, flags) in enumerate(games):
        for completion, bad in zip(moves[seat], flags[seat]):
            if completion.agent in scored:
                ctx.score(completion.agent, f"games.{task.opponent}.invalid", float(bad))
        result = outcome(rewards, seat, solo=solo)
        results.append(result)
        for name in OUTCOMES if not solo else ():
            score(f"seat{seat}.{name}", float(result == name))
    for name in OUTCOMES:
        score(name, sum(r == name for r in results) / len(results))
    score("return", sum(g[0].get(seat, 0.0) for seat, g in enumerate(games)) / len(games))
    if not solo:
        score("unmoved", sum(min(a) == 0 for a in asked) / len(asked))
    ctx.team_reward(sum(g[0].get(seat, 0.0) for seat, g in enumerate(games)) / len(games))


def game_team(env_id: str, players: Sequence[AgentSpec | Seat | str], *, name: str | None = None,
              train_games: int = 4096, eval_games: int | dict[str, int] = 400,
              opponents: Sequence[str] | None = None, seed: int = 0,
              eval_seed: int = 1_000_000, env_kwargs: dict | None = None,
              system: str = SYSTEM, instruction: str = INSTRUCTION,
              max_prompt_chars: int = 4000, invalid_reward: float | None = -1.0,
              per_game_weight: bool = True) -> Team:
    """A team that plays TextArena's `env_id`, one entry of `players` per seat (module doc).

    Training plays `train_games` seeds (seed, seed+1, ...), each task's trajectories the same
    deal. Held-out: for each trainable agent and each of `opponents` (START: a frozen copy of
    the agent's starting model, added to the team as the frozen agent "start" ("start_2", ...
    for further models); RANDOM; or an agent
    name), `eval_games` games (or eval_games[opponent]) from seeds eval_seed, eval_seed+1, ...
    (the same seeds for every agent and opponent), each deal played with the agent in every
    seat, interleaved: game k of every (agent, opponent) that has a game k, then game k+1, so
    that any first part of Team.heldout (eval.final_tasks, eval.before_tasks: games per pair,
    Team.heldout_round) is balanced. `opponents` left out: START, and RANDOM where the game's
    legal moves can be told (legal_moves). `max_prompt_chars`: the most; a prompt the agent's
    context cannot take is cut further (_move).

    A one-seat game (one entry: TextArena's single-player games, FrozenLake-v0,
    TowerOfHanoi-v0, ...) has no opponents: each trainable player plays `eval_games` held-out
    games alone (opponent SOLO; `opponents` left out, or [] for none). A Seat entry plays its
    seat with several agents through its function (flexmarl.envs.seats); its START opponent
    is the same function with the agents' frozen starting copies.
    """
    if not players:
        raise ValueError(f"{env_id}: give one player per seat, got {players!r}")
    if len(players) == 1:
        if opponents and set(opponents) != {SOLO}:
            raise ValueError(f"{env_id}: a one-seat game has no opponents (got {opponents!r}): "
                             f"each player's held-out games are played alone ({SOLO!r}); "
                             "leave opponents out")
        opponents = (SOLO,) if opponents is None else tuple(opponents)
    elif opponents is None:  # the ones this game can have: a random player needs legal moves
        opponents = (START, RANDOM) if _knows_moves(env_id, len(players), env_kwargs) \
            else (START,)
    lineup = Lineup.of(env_id, players, opponents, eval_games, train_games=train_games,
                       seed=seed, eval_seed=eval_seed, seat_teams=True)
    rules = GameRules(env_id=env_id, num_players=len(lineup.seats),
                      env_kwargs=tuple(sorted((env_kwargs or {}).items())), system=system,
                      instruction=instruction, max_prompt_chars=max_prompt_chars,
                      invalid_reward=invalid_reward, per_game_weight=per_game_weight,
                      starts=tuple(sorted(lineup.starts.items())),
                      crews=tuple(sorted(lineup.crews.items())))
    _probe(rules, lineup.seats, RANDOM in opponents or RANDOM in lineup.seats)
    return Team(name=name or re.sub(r"[^A-Za-z0-9_-]", "_", env_id), agents=lineup.agents,
                workflow=workflow_for(rules, lineup.seats, lineup.learners),
                tasks=lineup.tasks, heldout=lineup.heldout,
                heldout_round=functools.partial(_deal_number, eval_seed))


def _knows_moves(env_id: str, num_players: int, env_kwargs: dict | None) -> bool:
    """Whether `legal_moves` can tell the first player's moves in this game (so a random
    player can take part)."""
    env = make_env(env_id, **dict(env_kwargs or {}))
    try:
        env.reset(num_players, 0)
    except AssertionError:
        return False  # _probe says why
    return bool(legal_moves(env, env.observe()[1]))


def _probe(rules: GameRules, seats: Sequence[str], random_player: bool) -> None:
    """Fail at team build, not mid-run: the env makes and resets with this many players, and
    where a random player takes part, its legal moves can be told."""
    env = make_env(rules.env_id, **dict(rules.env_kwargs))
    try:
        env.reset(rules.num_players, 0)
    except AssertionError as exc:
        raise ValueError(f"{rules.env_id} does not play with {rules.num_players} players "
                         f"({exc}); give one player per seat") from exc
    _, observation = env.observe()
    if random_player and not legal_moves(env, observation):
        raise ValueError(f"{rules.env_id}: a random player needs the legal moves, and this env "
                         "neither is known to flexmarl.envs.textarena.legal_moves nor lists "
                         "them in its observation; leave 'random' out of players and opponents")


__all__ = ["Game", "GameRules", "IsolatedEnv", "Lineup", "Match", "OUTCOMES", "RANDOM", "SOLO",
           "SOLVED_REWARD", "START", "Seat", "Turn", "credit", "game_team", "legal_moves",
           "make_env", "match", "outcome", "play", "trim", "workflow_for"]
