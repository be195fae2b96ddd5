"""Experience store: agent turns in, complete GRPO groups out, one table per agent.

Pure asyncio on one event loop: no sockets, no threads, no locks. No method awaits between
checking a condition and acting on it, so each step is atomic with respect to the others.

  workflows ──put(turn)──────►  table[agent]                        put() waits while the table
            ──set_reward()───►    shards: {sample_id: Turn}         holds capacity_per_agent rows
                                  open:   input_id -> rows
  orchestrator ──complete_input(input_id)──► rewards checked, GRPO advantages computed
                                  (credit "turn": per (agent, turn); "trajectory": from each
                                  trajectory's mean reward; either way times each row's weight),
                                  ready:  (input_id, turn) -> Group, oldest completed first
               ──complete_group(agent, input_id, turn)──► one group closed early (every
                                  trajectory rewarded that turn or failed: later turns run)
  trainer feed ◄──take_groups(agent, n, version=v)── each group once; its rows are evicted,
                                                      which wakes blocked put()s

A row lives in its shard from put() until its group is taken. Capacity counts those rows. The
store cannot tell which rows a trainer is waiting for, so the caller says it (put's `urgent`):
those are stored whatever the capacity, and capacity only holds back rows sampled ahead (the
next step's, while this one trains). Without that, open inputs filling a table would wait for
ever: nothing could complete.
"""
from __future__ import annotations

import asyncio
import zlib
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable, Iterable

import torch

from flexmarl.config.pipeline import CREDITS
from flexmarl.orchestrator.advantage import grpo_advantages


@dataclass(slots=True)
class Turn:
    """One stored sample: one agent turn of one trajectory."""

    agent: str
    input_id: str
    turn: int | str
    """The call's number among the agent's calls in its trajectory, or the workflow's label
    for it (ctx.generate(turn=...), e.g. a game's move number): rows of one turn form a group."""
    traj_id: str
    """Unique per trajectory of this input ("0", "1", or "2.3" for the 4th of n samples)."""
    policy_version: int
    prompt_ids: list[int]
    """Held by reference, never copied: the n samples of one generate() call share it."""
    response_ids: list[int]
    logprobs: list[float]
    reward: float | None = None
    """None until set (per-field readiness)."""
    advantage: float | None = None
    """Set by complete_input() (already multiplied by `weight`)."""
    weight: float = 1.0
    """The row's share of its trajectory in the loss (ctx.reward's weight): its advantage is
    multiplied by it, after the group's normalisation. A multi-turn workflow gives a player's
    k moves of one game 1/k each so that a long game does not count k times a short one."""
    sampling: tuple[float, int, float] = (1.0, 0, 1.0)
    """(temperature, top_k, top_p) of the distribution it was sampled from, as the trainer
    scores it: a greedy sample is (1.0, 0, 1.0), the raw model distribution."""

    @property
    def sample_id(self) -> str:
        return f"{self.input_id}_{self.turn}_{self.traj_id}"


def _traj_order(turn: Turn) -> tuple:
    # Numeric where the parts are numbers, so "10" sorts after "2" and "2.3" after "2".
    return tuple((0, int(p), "") if p.isdecimal() else (1, 0, p) for p in turn.traj_id.split("."))


def _turn_order(turn: int | str) -> tuple:
    # Numbers first, then labels: one agent's calls may have either (a sorted order for
    # determinism, not a meaning).
    return (0, turn, "") if isinstance(turn, int) else (1, 0, turn)


@dataclass(slots=True)
class Group:
    """All samples of one agent, one input, one turn: the unit GRPO normalises over."""

    agent: str
    input_id: str
    turn: int | str
    turns: list[Turn]
    """Sorted by traj_id (numerically where numeric) for determinism."""

    @property
    def versions(self) -> set[int]:
        return {t.policy_version for t in self.turns}


@dataclass(slots=True)
class AgentStats:
    """Counters of one agent table, since the store was made."""

    stored: int = 0
    duplicates: int = 0
    """put() calls refused because the sample_id was already stored or consumed."""
    consumed_turns: int = 0
    consumed_groups: int = 0
    discarded: int = 0
    """Rows dropped by discard_trajectory() or discard_samples() (their trajectory failed)."""


def trajectory_advantages(rows: list[Turn]) -> list[float]:
    """Credit "trajectory": per row, the GRPO advantage of its trajectory's mean reward among
    the trajectories of the same input (a trajectory: one traj_id; n samples of one call are n
    trajectories)."""
    returns: dict[str, list[float]] = {}
    for r in rows:
        returns.setdefault(r.traj_id, []).append(r.reward)
    ids = list(returns)
    means = torch.tensor([sum(v) / len(v) for v in returns.values()], dtype=torch.float64)
    per = dict(zip(ids, grpo_advantages(means, [0] * len(ids)).tolist()))
    return [per[r.traj_id] for r in rows]


class StoreClosed(Exception):
    """The store was closed while (or before) waiting on it."""


class UnknownSample(ValueError, KeyError):
    """No unconsumed row has this sample_id (catchable as ValueError or KeyError)."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


class _Signal:
    """Wake every current waiter; later waiters wait for the next notify().

    asyncio.Condition would need its lock held to notify, which the synchronous methods
    (complete_input, close) cannot take; a fresh Event per generation needs no lock.
    """

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def notify(self) -> None:
        self._event.set()
        self._event = asyncio.Event()

    async def wait(self) -> None:
        await self._event.wait()


@dataclass(slots=True)
class _Table:
    shards: list[dict[str, Turn]]
    open: dict[str, list[Turn]] = field(default_factory=dict)
    """input_id -> rows of inputs not completed yet."""
    ready: OrderedDict[tuple[str, int], Group] = field(default_factory=OrderedDict)
    """(input_id, turn) -> complete, unconsumed group, oldest completed first."""
    consumed: set[str] = field(default_factory=set)
    """sample_ids already taken: a late retry of one of them must not be trained on twice."""
    num_rows: int = 0
    space_freed: _Signal = field(default_factory=_Signal)
    groups_ready: _Signal = field(default_factory=_Signal)

    def shard(self, sample_id: str) -> dict[str, Turn]:
        # crc32, not hash(): hash() of str is salted per process, and shard placement should be
        # the same in every process (checkpoints, a future multi-process store).
        return self.shards[zlib.crc32(sample_id.encode()) % len(self.shards)]


class ExperienceStore:
    """In-memory, per-agent, sharded, bounded store of agent turns; see the module docstring."""

    def __init__(self, agents: Iterable[str], *, capacity_per_agent: int = 4096,
                 num_shards: int = 4, credit: str = "turn") -> None:
        names = list(agents)
        if credit not in CREDITS:
            raise ValueError(f"credit must be one of {CREDITS}, got {credit!r}")
        self.credit = credit
        if len(set(names)) != len(names):  # none is fine: a team with no trainable agent
            raise ValueError(f"agents must be distinct names, got {names}")
        if capacity_per_agent < 1:
            raise ValueError(f"capacity_per_agent must be >= 1, got {capacity_per_agent}")
        if num_shards < 1:
            raise ValueError(f"num_shards must be >= 1, got {num_shards}")
        self.capacity_per_agent = capacity_per_agent
        self._tables = {a: _Table([{} for _ in range(num_shards)]) for a in names}
        self.stats: dict[str, AgentStats] = {a: AgentStats() for a in names}
        self._completed_inputs: set[str] = set()
        self._closed = False

    @property
    def agents(self) -> list[str]:
        return list(self._tables)

    @property
    def closed(self) -> bool:
        return self._closed

    def _table(self, agent: str) -> _Table:
        try:
            return self._tables[agent]
        except KeyError:
            raise ValueError(f"unknown agent {agent!r}; the store knows "
                             f"{sorted(self._tables)}") from None

    # ------------------------------------------------------------------------- producers

    def duplicates(self, agent: str) -> int:
        """Turns of `agent` refused as already stored or trained (0 for an agent without a
        table: a frozen one)."""
        stats = self.stats.get(agent)
        return stats.duplicates if stats is not None else 0

    async def put(self, turn: Turn, *, urgent: Callable[[], bool] | None = None) -> bool:
        """Store one turn; False (and nothing stored) if its sample_id was stored or consumed.

        Waits while the agent's table holds capacity_per_agent unconsumed rows, unless
        `urgent()` is true: the caller's way to say that the rows the trainer waits for now
        must be stored whatever the capacity (a step's own rows always fit, so a batch larger
        than the capacity slows nothing and cannot deadlock). `urgent` is asked again whenever
        space is freed or `wake()` is called. Raises ValueError for an unknown agent or a new
        sample of an input already completed, and StoreClosed if the store is or becomes
        closed.
        """
        table = self._table(turn.agent)
        if len(turn.response_ids) != len(turn.logprobs):
            raise ValueError(f"sample {turn.sample_id}: {len(turn.response_ids)} response tokens "
                             f"but {len(turn.logprobs)} logprobs")
        sid = turn.sample_id
        shard = table.shard(sid)
        while True:
            if self._closed:
                raise StoreClosed("experience store closed")
            # Re-checked after every wait: a twin put may have stored this id meanwhile.
            if sid in shard or sid in table.consumed:
                self.stats[turn.agent].duplicates += 1
                return False
            if turn.input_id in self._completed_inputs:
                raise ValueError(f"sample {sid} of agent {turn.agent!r} arrived after "
                                 f"complete_input({turn.input_id!r}); its groups are closed")
            if table.num_rows < self.capacity_per_agent or (urgent is not None and urgent()):
                break
            await table.space_freed.wait()
        shard[sid] = turn
        table.open.setdefault(turn.input_id, []).append(turn)
        table.num_rows += 1
        self.stats[turn.agent].stored += 1
        return True

    def wake(self) -> None:
        """Have every put() waiting for space ask its `urgent` again (what is urgent changed)."""
        for table in self._tables.values():
            table.space_freed.notify()

    def set_reward(self, agent: str, sample_id: str, reward: float, *,
                   weight: float = 1.0) -> None:
        """Set the reward (and loss weight, Turn.weight) of a stored row whose input is not
        completed yet."""
        table = self._table(agent)
        row = table.shard(sample_id).get(sample_id)
        if row is None:
            state = "was already consumed" if sample_id in table.consumed else "is not stored"
            raise UnknownSample(f"sample {sample_id!r} of agent {agent!r} {state}")
        if row.input_id in self._completed_inputs or row.advantage is not None:
            # Its advantages are computed: a late reward would silently disagree with them.
            raise ValueError(f"sample {sample_id!r} of agent {agent!r}: its group (input "
                             f"{row.input_id!r}) is already completed; set rewards before "
                             "complete_input() or complete_group()")
        if not (weight >= 0 and weight < float("inf")):
            raise ValueError(f"sample {sample_id!r} of agent {agent!r}: weight must be a finite "
                             f"number >= 0, got {weight!r}")
        row.reward, row.weight = float(reward), float(weight)

    def complete_group(self, agent: str, input_id: str, turn: int | str) -> None:
        """Close one group of an open input early: `agent`'s turn `turn` of every trajectory
        of `input_id`, which the caller knows have all been made and rewarded (their rewards
        are final), while the trajectories' later turns still run. Its advantages are computed
        and it becomes ready, so a trainer can take it before the input completes. Its rows
        then leave the input: complete_input() and discard_trajectory() no longer touch them.
        Raises ValueError if a row of the group has no reward. With credit "trajectory" it does
        nothing: a trajectory's advantage needs all its rows (the group closes with the
        task)."""
        if input_id in self._completed_inputs or self.credit == "trajectory":
            return
        table = self._table(agent)
        rows = table.open.get(input_id, [])
        group = [r for r in rows if r.turn == turn]
        if not group:
            return
        missing = [r.sample_id for r in group if r.reward is None]
        if missing:
            raise ValueError(f"complete_group({agent!r}, {input_id!r}, {turn}): no reward for "
                             f"{missing}")
        rest = [r for r in rows if r.turn != turn]
        if rest:
            table.open[input_id] = rest
        else:
            del table.open[input_id]
        rewards = torch.tensor([r.reward for r in group], dtype=torch.float64)
        for r, adv in zip(group, grpo_advantages(rewards, [turn] * len(group)).tolist()):
            r.advantage = adv * r.weight
        table.ready[(input_id, turn)] = Group(agent, input_id, turn,
                                              sorted(group, key=_traj_order))
        table.groups_ready.notify()

    def complete_input(self, input_id: str, *, default_reward: float | None = None) -> None:
        """All trajectories of `input_id` have finished: close its groups in every table.

        Rows without a reward get `default_reward` if given; otherwise any such row raises
        ValueError naming them, and nothing changes. Then each group's GRPO advantages are
        stored in its rows and the groups become ready, in (agent, turn) order. Calling it again
        for the same input does nothing.
        """
        if input_id in self._completed_inputs:
            return
        rows_by_agent = {a: t.open.get(input_id, []) for a, t in self._tables.items()}
        if default_reward is None:
            missing = [f"{a}:{r.sample_id}" for a, rows in rows_by_agent.items()
                       for r in rows if r.reward is None]
            if missing:
                raise ValueError(f"complete_input({input_id!r}): no reward for {missing}; set them "
                                 f"with set_reward() or pass default_reward")
        self._completed_inputs.add(input_id)
        for agent, rows in rows_by_agent.items():
            if not rows:
                continue
            table = self._tables[agent]
            del table.open[input_id]
            for r in rows:
                if r.reward is None:
                    r.reward = float(default_reward)
            # Double precision, as grpo_advantages computes its statistics internally.
            if self.credit == "trajectory":
                advantages = trajectory_advantages(rows)
            else:
                rewards = torch.tensor([r.reward for r in rows], dtype=torch.float64)
                advantages = grpo_advantages(rewards, [r.turn for r in rows]).tolist()
            by_turn: dict[int, list[Turn]] = {}
            for r, adv in zip(rows, advantages):
                r.advantage = adv * r.weight
                by_turn.setdefault(r.turn, []).append(r)
            for k in sorted(by_turn, key=_turn_order):
                table.ready[(input_id, k)] = Group(agent, input_id, k,
                                                   sorted(by_turn[k], key=_traj_order))
            table.groups_ready.notify()

    def discard_trajectory(self, input_id: str, traj_id: str) -> int:
        """Drop the stored rows of one trajectory of an open input, from every table.

        A trajectory's rows are those whose traj_id is `traj_id` or `traj_id.K` (the n samples
        of one call). For a trajectory that failed with credit "trajectory" (its return needs
        every turn; with credit "turn" only its unrewarded rows go: discard_samples): the
        input's groups are then formed from its other trajectories. Returns how many rows were dropped (their capacity is freed). Raises
        ValueError once the input is completed: its groups and advantages are fixed.
        """
        if input_id in self._completed_inputs:
            raise ValueError(f"discard_trajectory({input_id!r}, {traj_id!r}): the input is "
                             "already completed; discard before complete_input()")
        prefix = traj_id + "."
        dropped = 0
        for agent, table in self._tables.items():
            rows = table.open.get(input_id)
            if not rows:
                continue
            keep = [r for r in rows if r.traj_id != traj_id and not r.traj_id.startswith(prefix)]
            gone = len(rows) - len(keep)
            if not gone:
                continue
            for r in rows:
                if r.traj_id == traj_id or r.traj_id.startswith(prefix):
                    del table.shard(r.sample_id)[r.sample_id]
            if keep:
                table.open[input_id] = keep
            else:
                del table.open[input_id]
            table.num_rows -= gone
            self.stats[agent].discarded += gone
            dropped += gone
            table.space_freed.notify()
        return dropped

    def discard_samples(self, agent: str, sample_ids: Iterable[str]) -> int:
        """Drop some stored rows of `agent` by sample id: those of a failed trajectory that got
        no reward of their own, while its rewarded ones stay (flexmarl.team.Context.reward).
        Ids not stored, or of a closed group or input (their advantages are fixed), are left
        alone. Returns how many rows were dropped (their capacity is freed)."""
        table = self._table(agent)
        gone: dict[str, set[str]] = {}
        for sid in sample_ids:
            row = table.shard(sid).get(sid)
            if row is None or row.advantage is not None or row.input_id in self._completed_inputs:
                continue
            del table.shard(sid)[sid]
            gone.setdefault(row.input_id, set()).add(sid)
        for input_id, sids in gone.items():
            keep = [r for r in table.open[input_id] if r.sample_id not in sids]
            if keep:
                table.open[input_id] = keep
            else:
                del table.open[input_id]
        dropped = sum(len(sids) for sids in gone.values())
        if dropped:
            table.num_rows -= dropped
            self.stats[agent].discarded += dropped
            table.space_freed.notify()
        return dropped

    # ------------------------------------------------------------------------- consumers

    async def take_groups(self, agent: str, num_groups: int, *, version: int | None = None,
                          select: Callable[[Group], bool] | None = None,
                          flush: bool = False) -> list[Group]:
        """Wait for `num_groups` complete groups of `agent` and take them, oldest first.

        With `version`, only groups whose every row has that policy_version qualify (a group
        of mixed versions never does); with `select`, only groups it returns True for (e.g. the
        groups of one global step). With `flush`, do not wait: take up to `num_groups` of
        those ready now, possibly none. Each group is returned to exactly one caller; its rows
        are evicted, freeing capacity. Raises StoreClosed if the store is or becomes closed.
        """
        if num_groups < 1:
            raise ValueError(f"num_groups must be >= 1, got {num_groups}")
        table = self._table(agent)
        while True:
            if self._closed:
                raise StoreClosed("experience store closed")
            keys = self._matching(table, version, select, limit=num_groups)
            if len(keys) == num_groups or flush:
                break
            await table.groups_ready.wait()
        # No await from choosing the keys to here: no other consumer can take them meanwhile.
        groups = [table.ready.pop(k) for k in keys]
        for g in groups:
            for r in g.turns:
                sid = r.sample_id
                del table.shard(sid)[sid]
                table.consumed.add(sid)
            table.num_rows -= len(g.turns)
            self.stats[agent].consumed_turns += len(g.turns)
        self.stats[agent].consumed_groups += len(groups)
        if groups:
            table.space_freed.notify()
        return groups

    @staticmethod
    def _matching(table: _Table, version: int | None,
                  select: Callable[[Group], bool] | None = None, limit: int | None = None
                  ) -> list[tuple[str, int]]:
        keys = []
        for key, g in table.ready.items():
            if (version is None or g.versions == {version}) and (select is None or select(g)):
                keys.append(key)
                if limit is not None and len(keys) == limit:
                    break
        return keys

    # ------------------------------------------------------------------------- inspection

    def pending(self, agent: str) -> int:
        """Unconsumed rows stored for `agent` (open and complete): what capacity counts."""
        return self._table(agent).num_rows

    def ready_groups(self, agent: str, *, version: int | None = None,
                     select: Callable[[Group], bool] | None = None) -> int:
        """Complete, unconsumed groups of `agent` (only those wholly of `version`, and those
        `select` accepts, if given)."""
        return len(self._matching(self._table(agent), version, select))

    def close(self) -> None:
        """Wake every waiting put() and take_groups() with StoreClosed; later calls raise it too.

        Synchronous methods (set_reward, complete_input, inspection) keep working.
        """
        self._closed = True
        for table in self._tables.values():
            table.space_freed.notify()
            table.groups_ready.notify()
