"""A game seat played by a team of agents: a function the user writes makes each of its moves.

    game_team(env_id, players=[Seat("pair", [proposer, checker], propose_and_check), ...])
      the seat's turn ─► play(ctx, turn): turn.observation, turn.moves, turn.prompt (what a lone
        agent would get), turn.ask(agent, then=[...]) (that prompt, cut to fit the agent's
        context, then `then`); ctx.generate(agent, ...) for any call of its own
        ─► the move: a str, or a Completion whose text is the move ─► env.step
      every call it made ─► labelled "<move>.<agent>[.<turn>][.call<k>]" (s0.m2.proposer,
        s0.m2.checker, s0.m2.proposer.call2: grouped per agent with the same call of the same
        move in the task's other games) ─► credit (flexmarl.envs.textarena.credit)

Credit: each call the function made gets the move's reward, as a lone player's move would (the
seat's game outcome, or invalid_reward if the env rejected the move: the move is the seat's,
whoever proposed or passed it), weighted 1/k for each agent's k calls at the seat in the game;
a call the function rewarded itself (ctx.reward) keeps that reward instead.
"""
from __future__ import annotations

import inspect
import re
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Sequence

from flexmarl.team import AgentSpec

_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,31}")


@dataclass(frozen=True)
class Seat:
    """An entry of game_team's `players`: the seat played by `agents` through `play`,
    `async def play(ctx, turn: Turn) -> str | Completion` (the move), called at each of the
    seat's moves (a rejected move's retry too). `name` names the seat's player in held-out
    matches and task ids (its scores go to each of its trainable agents)."""

    name: str
    agents: Sequence[AgentSpec]
    play: Callable[[Any, "Turn"], Awaitable[Any]]

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.fullmatch(self.name):
            raise ValueError(f"Seat.name {self.name!r} must start with a letter and use "
                             "letters, digits, '_' or '-' (at most 32)")
        agents = tuple(self.agents) if not isinstance(self.agents, AgentSpec) else ()
        if not agents or not all(isinstance(a, AgentSpec) for a in agents):
            raise ValueError(f"seat {self.name}: Seat.agents must be a list of AgentSpec "
                             f"(the agents that play the seat), got {self.agents!r}")
        names = [a.name for a in agents]
        if len(set(names)) != len(names):
            raise ValueError(f"seat {self.name}: its agents' names repeat: {names}")
        if not inspect.iscoroutinefunction(self.play):
            raise TypeError(f"seat {self.name}: Seat.play must be an `async def play(ctx, "
                            "turn)` coroutine function that returns the move")
        object.__setattr__(self, "agents", agents)


@dataclass(frozen=True)
class Crew:
    """A Seat as a game plays it: who answers each of its agents' calls (the agents
    themselves; for the seat's "start" opponent, their frozen starting copies) and which of
    them train (their calls are credited and scored)."""

    seat: Seat
    answers: tuple[tuple[str, str], ...]
    trainable: tuple[str, ...]


@dataclass
class Turn:
    """What a Seat's function gets at each move of its seat."""

    seat: int
    observation: str
    """What the env shows the seat now (TextArena's transcript, rules first)."""
    moves: list[str] | None
    """The legal moves where they can be told (flexmarl.envs.textarena.legal_moves)."""
    prompt: list[dict]
    """The prompt a lone agent would get: [system, observation + instruction]."""
    label: str
    """The move's turn label ("s0.m2", or "s0.m2.retry1" after a rejected move)."""
    ctx: Any = field(repr=False)
    _ask: Callable[..., Awaitable[Any]] = field(repr=False)

    async def ask(self, agent: str, then: Sequence[dict] = (), *, turn: str | None = None,
                  **sampling: Any) -> Any:
        """`agent`'s completion of the seat's prompt followed by the messages `then` (e.g. an
        assistant message with a proposal and a user message asking to check it); the
        observation cut until the prompt fits the agent's context, as a lone player's is."""
        return await self._ask(self.ctx, agent, list(then), turn, sampling)


class SeatContext:
    """The ctx a Seat's function gets for one move: ctx.generate on the seat's agents (each
    call labelled, and sent to whoever answers for that agent), ctx.reward recorded; the
    rest is the workflow's ctx (its team reward is the game's, given when the game ends)."""

    def __init__(self, ctx: Any, crew: Crew, label: str) -> None:
        self._ctx, self._crew, self._label = ctx, crew, label
        self._answers = dict(crew.answers)
        self._used: set[tuple[str, str]] = set()
        self._rewarded: set[int] = set()
        self.made: list[Any] = []
        self.call_errors: set[int] = set()
        """ids of the exceptions a call raised (a failed model call: the run's; a call to
        another agent: a misuse), which fail the trajectory rather than forfeit the game."""

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ctx, name)

    def _reserve(self, agent: str, turn: str | None) -> str:
        base = f"{self._label}.{agent}" + (f".{turn}" if turn else "")
        label, k = base, 1
        while (agent, label) in self._used:
            k += 1
            label = f"{base}.call{k}"
        self._used.add((agent, label))
        return label

    async def generate(self, agent: str, prompt: Any, *, n: int = 1, turn: str | None = None,
                       **sampling: Any) -> list:
        if agent not in self._answers:  # a misuse, raised as it is (not a forfeit)
            misuse = ValueError(f"seat {self._crew.seat.name}: its play function called agent "
                                f"{agent!r}, which is not one of the seat's agents "
                                f"{sorted(self._answers)}")
            self.call_errors.add(id(misuse))
            raise misuse
        label = self._reserve(agent, turn)
        try:
            out = await self._ctx.generate(self._answers[agent], prompt, n=n, turn=label,
                                           **sampling)
        except BaseException as exc:  # a refused call (a prompt too long) leaves its label free
            self._used.discard((agent, label))
            self.call_errors.add(id(exc))
            raise
        self.made.extend(out)
        return out

    def reward(self, completion: Any, value: float, *, weight: float = 1.0) -> None:
        self._ctx.reward(completion, value, weight=weight)
        self._rewarded.add(id(completion))

    def unrewarded(self) -> list:
        """The calls of this move the function did not reward itself, in order."""
        return [c for c in self.made if id(c) not in self._rewarded]


async def crew_move(ctx: Any, crew: Crew, seat: int, observation: str,
                    moves: list[str] | None, prompt: list[dict], label: str,
                    ask: Callable[..., Awaitable[Any]]) -> tuple[str, list]:
    """One move of a Seat: (the move's text, the calls to credit: those the function did not
    reward itself). `ask(ctx, agent, then, turn, sampling)`: Turn.ask's call."""
    seat_ctx = SeatContext(ctx, crew, label)
    try:
        out = await crew.seat.play(seat_ctx, Turn(seat, observation, moves, prompt, label,
                                                  seat_ctx, ask))
    except Exception as exc:
        if id(exc) in seat_ctx.call_errors:  # a failed model call or a misuse: not a move
            raise
        raise SeatFailed(crew.seat.name, exc, seat_ctx.unrewarded()) from exc
    text = out if isinstance(out, str) else getattr(out, "text", None)
    if not isinstance(text, str):  # the function's contract: fails the trajectory, loudly
        raise TypeError(f"seat {crew.seat.name}: its play function must return the move, a str "
                        f"or a Completion, got {type(out).__name__}")
    return text, seat_ctx.unrewarded()


class SeatFailed(Exception):
    """A Seat's function raised (a reply it could not parse, its own bug): the seat forfeits
    the game (flexmarl.envs.textarena.play), so that no failure makes a
    game vanish from a measurement. `calls`: the move's calls so far, credited as rejected."""

    def __init__(self, seat: str, error: Exception, calls: list) -> None:
        super().__init__(f"seat {seat}: its play function failed: {type(error).__name__}: "
                         f"{error}")
        self.seat, self.error, self.calls = seat, error, calls


__all__ = ["Crew", "Seat", "SeatContext", "SeatFailed", "Turn", "crew_move"]
