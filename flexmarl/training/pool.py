"""Trainer slots bound to agents on demand, idle agents' training state parked in host memory.

    slot = one trainer worker group (its processes, its devices); empty until a SwapIn
    bind(agent) ─► SlotAllocator (pure): the agent waits its turn (first come, first served)
                 ─► its granted slot: already holding its state (no swap), empty, or holding an
                    idle agent's state ─► SwapOut (that agent parked in the slot's own
                    processes) ─► SwapIn (the agent's parked shards, or a fresh trainer the
                    first time)
                 ─► the slot's connection, until the binding ends (the agent's update is done)
    release with nobody waiting ─► prefetch: the swapped-out agent expected to ask next (the
                 order agents asked in during the last cycle: the workflow repeats) is swapped
                 in now, while rollout runs, instead of when it asks; evictions take the idle
                 agent expected last (SlotAllocator.expect)

A swap moves no tensor through this process: SwapOut leaves each rank's own shards in host
memory of that rank's process (pinned on CUDA) and answers where (Parked: the ranks'
addresses); a SwapIn into the same slot copies them back in place; into another slot, its ranks
pull them rank to rank from those addresses (resharded when the rank counts differ), and the
old slot then frees its copy (DropParked). `states` says where each swapped-out agent's state
is. With `static` placement every agent owns one slot for good (the baseline: no swaps, slots
idle between the agent's updates); with a shared pool of fewer slots than agents, slots go
where the work is.

Dead slots (with `snapshots` on and a `respawn` callback):

    worker_died(process) ─► slot_died: its requests fail now (PeerDied); the agents whose
                 state it held (the one loaded, and those parked there) get their snapshot (their
                 state after their last finished step, taken by `snapshot`) put in `states` to
                 restore, or, if they never finished a step, may start fresh; new processes
                 replace the slot's (new names)
    the agent's loop ─► PeerDied ─► binds again: a SwapIn of the snapshot (SwapIn.tensors, the
                 restore path) into the new slot (or any other), then re-accumulates the batch it
                 had taken: the same update
"""
from __future__ import annotations

import asyncio
import logging
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, AsyncIterator, Awaitable, Callable

from flexmarl.clock import now
from flexmarl.checks import parse_cpus, require
from flexmarl.training.slots import Grant, SlotAllocator
from flexmarl.protocol import (DropParked, ExportState, ExportWeights, Parked, SwapDone, SwapIn,
                               SwapOut, TrainState, WeightUpdate)
from runtime.errors import PeerDied, RemoteError, RequestTimeout
from runtime.transport import Connection

log = logging.getLogger(__name__)
DEATH_NOTICE_GRACE_S = 10.0
"""A rank whose peer died fails its collective at once (gloo: "Connection reset by peer"),
often before the supervisor has reported the death: that error waits this long for the
death notice, so the slot is replaced instead of the run failing."""
REPLACE_ATTEMPTS = 3
"""Processes started for a dead slot before it is given up (a replacement may die starting)."""
Respawn = Callable[[str, list[str]], Awaitable[tuple[list[str], Connection]]]
"""(slot, its old process names) -> the new processes' names and rank 0's connection; kills
what is left of the old ones first."""


@dataclass(kw_only=True, frozen=True)
class TrainerPoolConfig:
    """Where each agent trains (section `trainer_pool`, flexmarl.training.pool.TrainerPool): slot
    sizes, sharing, snapshots and cores. The optimizer and loss are section `trainer`.
    Until FlexMARL 0.2 the old section name `[train]` is read too, with a warning."""

    ranks_per_agent: int = 1
    """FSDP ranks (processes) of each agent's trainer group."""
    cpus: str = "auto"
    """CPU cores of every trainer process, as in rollout.cpus; "auto": the other half."""
    slots: int | str = 0
    """0: static reservation, one trainer slot (a group of ranks_per_agent processes) per
    trainable agent. N >= 1: a pool of N slots shared by all trainable agents, bound to an agent
    while it trains, idle agents' training state swapped out to host memory. "auto": the
    number the cluster simulator finds fastest for this team (section `plan`; resolved by
    `flexmarl run` at start, flexmarl.sim.team_plan.resolve_auto)."""
    slot_ranks: str = ""
    """A shared pool of slots of different sizes, e.g. "1,2": one slot of 1 rank and one of 2
    (overrides `slots`); an agent needs AgentSpec.train_ranks (default ranks_per_agent)."""
    ready_timeout_s: float = 600.0
    """How long a trainer rank may take to start (its process, torch, the process group)."""
    collective_timeout_s: float = 1800.0
    """How long one torch.distributed collective of a trainer group may wait for a peer
    (torch's own default for gloo); idle followers hear from rank 0 well within it."""
    request_timeout_s: float = 300.0
    """Longest wait for one request to a trainer slot (a micro-batch, a step, a swap, an export);
    past it the slot is taken for hung and replaced (with snapshots) or the run stops."""
    snapshots: bool = True
    """Keep each agent's training state after each step in host memory: a dead trainer slot
    is replaced and its agent's batch re-accumulated from it (off: the run stops)."""
    nice: int | str = "auto"
    """Trainer processes' niceness (0..19); "auto": flexmarl.launch.placement.trainer_nice."""
    serial: bool | str = "auto"
    """Trainer requests one at a time, urgent agents first (flexmarl.orchestrator.lane);
    "auto": flexmarl.launch.placement.serial_trainers."""

    def __post_init__(self) -> None:
        require(self.ranks_per_agent >= 1, "trainer_pool.ranks_per_agent", self.ranks_per_agent,
                 "must be >= 1")
        require(self.slots == "auto" if isinstance(self.slots, str) else self.slots >= 0,
                "trainer_pool.slots", self.slots,
                'must be >= 0 (0: one slot per trainable agent) or "auto"')
        try:
            sizes = [int(x) for x in self.slot_ranks.split(",")] if self.slot_ranks else []
        except ValueError:
            sizes = [0]
        require(all(n >= 1 for n in sizes), "trainer_pool.slot_ranks", self.slot_ranks,
                 'must list the ranks of each shared slot, like "1,2" (or be empty)')
        for name in ("ready_timeout_s", "request_timeout_s", "collective_timeout_s"):
            require(getattr(self, name) > 0, f"trainer_pool.{name}", getattr(self, name),
                    "must be > 0")
        parse_cpus(self.cpus, "trainer_pool.cpus")
        require(self.nice == "auto" if isinstance(self.nice, str) else
                (not isinstance(self.nice, bool) and 0 <= self.nice <= 19),
                "trainer_pool.nice", self.nice, 'must be an int in 0..19 or "auto"')
        require(isinstance(self.serial, bool) or self.serial == "auto", "trainer_pool.serial",
                self.serial, 'must be true, false or "auto"')

    @property
    def static(self) -> bool:
        """One slot per trainable agent for the whole run (no sharing, no swaps)."""
        if self.slots == "auto":
            raise ValueError('trainer_pool.slots = "auto" is resolved before the pool starts '
                             "(flexmarl.sim.team_plan.resolve_auto)")
        return not (self.slots or self.slot_ranks)


@dataclass
class SwapRecord:
    agent: str
    slot: str
    direction: str
    """"out" (state to the host) or "in" (state into the slot)."""
    num_bytes: int
    seconds: float
    at: float
    source: str = ""
    """"in" only: the slot it was parked in (its own name: copied back in place; another:
    pulled from there), or "" (a restored TrainState)."""


@dataclass
class ParkedState:
    """Where a swapped-out agent's state is: parked in `slot`'s processes (Parked.ranks)."""

    slot: str
    ranks: list[str]
    version: int
    num_bytes: int


@dataclass
class _Hold:
    ready: asyncio.Future
    """Resolves to the slot once the agent's state is loaded there."""
    depth: int = 0
    prefetch_only: bool = False


@dataclass
class AgentTrainer:
    """What a slot needs to host an agent."""

    model_dir: str
    config: dict[str, Any]
    ranks: int = 1


class TrainerPool:
    """Trainer slots shared by a team's trainable agents; see the module docstring."""

    def __init__(self, slots: dict[str, Connection], slot_ranks: dict[str, int],
                 agents: dict[str, AgentTrainer], config: TrainerPoolConfig, *,
                 prefetch: bool = True, respawn: Respawn | None = None,
                 workers: dict[str, str] | None = None,
                 kill: Callable[[str], None] | None = None) -> None:
        """`slot_ranks`: each slot's ranks (the slots' sizes, from config.slots / slot_ranks or
        one per agent); `config.static`: every agent owns one slot; `config.snapshots`: keep
        each agent's state after its last step (`snapshot`) so a dead slot's agent can be
        restored; `respawn` replaces a dead slot's processes; `workers`: process name -> its
        slot (to map a death to its slot); `kill(process)` ends a hung one."""
        static = config.static
        if static and len(slots) < len(agents):
            raise ValueError(f"static reservation needs one slot per trainable agent: "
                             f"{len(agents)} agents, {len(slots)} slots")
        pinned = dict(zip(agents, slots)) if static else None
        self.allocator = SlotAllocator(slot_ranks, {a: s.ranks for a, s in agents.items()},
                                       pinned)
        self.slots = {name: _TimedConnection(conn, name, self) for name, conn in slots.items()}
        self.agents = dict(agents)
        self.static = static
        self.request_timeout_s = config.request_timeout_s
        self.states: dict[str, ParkedState | TrainState] = {}
        """Swapped-out agents, oldest first -> where their state is: parked in a slot's
        processes (ParkedState), or a whole TrainState to restore (a resumed run's checkpoint,
        the snapshot of an agent whose slot died)."""
        self.swaps: list[SwapRecord] = []
        self.busy_s: dict[str, float] = dict.fromkeys(slots, 0.0)
        """Per slot: time its processes spent on requests (training, export, swaps)."""
        self._busy_taken: dict[str, float] = dict.fromkeys(slots, 0.0)
        self._granted: dict[str, asyncio.Future] = {}
        self._holding: dict[str, _Hold] = {}
        """agent -> its binding (slot once loaded, nesting depth)."""
        self.prefetch = prefetch
        self._prefetches: set[asyncio.Future] = set()
        self._cycle: list[str] = []
        """Agents whose updates asked for a slot in the current cycle, in order."""
        self._learnt: list[str] = []
        """The last complete cycle's order: the prediction of the next."""
        self._loaded: dict[str, str] = {}
        """slot -> agent whose trainer the slot's processes hold now."""
        self._leaving: dict[str, asyncio.Future] = {}
        """agent -> done when its state, on its way out of a slot, is parked (in `states`)."""
        self._started: set[str] = set()
        """Agents whose trainer has been built: a fresh SwapIn would lose their training."""
        self.snapshots_on = config.snapshots
        self.snapshots: dict[str, TrainState] = {}
        """agent -> its whole state after its last finished step (`snapshot`)."""
        self.respawn = respawn
        self.kill = kill
        self.workers = dict(workers or {})
        self._replacing: dict[str, asyncio.Task] = {}
        self.deaths = 0
        self.replacements: list[dict] = []
        """Per replaced slot: {slot, workers, seconds from the death to the new processes}."""
        self._died_at: dict[str, float] = {}

    @asynccontextmanager
    async def bind(self, agent: str, *, prefetch: bool = False) -> AsyncIterator[Connection]:
        """The agent's trainer connection, its state in the slot, for the duration.

        Re-entrant per agent (a prefetch and the agent's own update may overlap): the slot is
        released when the last binding of the agent ends."""
        hold = self._holding.get(agent)
        if not prefetch and (hold is None or hold.prefetch_only):
            self._requested(agent)
        if hold is None:
            hold = self._holding[agent] = _Hold(asyncio.ensure_future(self._acquire(agent)),
                                                prefetch_only=prefetch)
        hold.prefetch_only = hold.prefetch_only and prefetch
        hold.depth += 1
        try:
            slot = await asyncio.shield(hold.ready)
            yield self.slots[slot]
        finally:
            hold.depth -= 1
            if hold.depth == 0:
                del self._holding[agent]
                if hold.ready.done() and not hold.ready.cancelled() and \
                        hold.ready.exception() is None:
                    self.allocator.release(agent)
                    self._dispatch()
                    if not hold.prefetch_only:  # a prefetch ending must not start another one
                        self._maybe_prefetch()
                else:  # still waiting for a slot, or the load failed: give the grant back
                    hold.ready.cancel()

    async def _acquire(self, agent: str) -> str:
        """Wait for the allocator to grant the agent a slot, load its state there; the slot."""
        fut = asyncio.get_running_loop().create_future()
        self._granted[agent] = fut
        self.allocator.request(agent)
        self._dispatch()
        try:
            grant: Grant = await fut
        except asyncio.CancelledError:
            self._granted.pop(agent, None)
            if fut.done() and not fut.cancelled():  # granted meanwhile: hand the slot back
                self.allocator.release(agent)
                self._dispatch()
            else:
                self.allocator.cancel(agent)
            raise
        try:
            await self._load(grant)
        except BaseException:
            self.allocator.release(agent)
            self._dispatch()
            raise
        return grant.slot

    def _requested(self, agent: str) -> None:
        """An agent's update asks for a slot: learn the team's order (one cycle = each agent
        once; the workflow repeats, so the last cycle predicts the next) and tell the
        allocator who is expected next, for its evictions."""
        if agent in self._cycle:  # a new cycle begins: the one before is the prediction
            self._learnt = self._cycle
            self._cycle = []
        self._cycle.append(agent)
        self.allocator.expect(self.expected_order())

    def expected_order(self) -> list[str]:
        """Agents in the order they are expected to ask for a slot next (soonest first): the
        last cycle's order from after the agent that asked last, those that already asked
        in this cycle at the end."""
        order = self._learnt + [a for a in self._cycle if a not in self._learnt]
        if self._cycle and self._cycle[-1] in order:
            k = order.index(self._cycle[-1]) + 1
            order = order[k:] + order[:k]
        return [a for a in order if a not in self._cycle] + \
            [a for a in order if a in self._cycle]

    def _maybe_prefetch(self) -> None:
        """A slot fell idle and nobody waits: bring in the swapped-out agent expected to ask
        next, so its swap happens now (during rollout), not when it needs the slot. Not when
        that would evict an agent expected sooner than it."""
        if not self.prefetch or self.allocator.waiting() or not self._started:
            return
        resident = {a for a in self.allocator.resident.values() if a}
        candidates = [a for a in self.expected_order()
                      if a in self._started and a not in resident and a not in self._holding]
        if not self._learnt:  # nothing learnt yet: the agent that trained least recently
            candidates = [a for a in self.states if a in candidates]
        if not candidates:
            return
        agent = candidates[0]
        rank = self.allocator.expected_rank(agent)
        idle = [self.allocator.resident[s] for s in self.allocator.resident
                if s not in self.allocator.bound]
        if not any(not a or self.allocator.expected_rank(a) > rank for a in idle):
            return
        self._prefetches.add(asyncio.ensure_future(self._prefetch(agent)))

    async def close(self) -> None:
        """No more prefetching; wait for one in flight (before the slots' connections close)."""
        self.prefetch = False
        if self._prefetches:
            await asyncio.gather(*self._prefetches, return_exceptions=True)

    async def _prefetch(self, agent: str) -> None:
        try:
            async with self.bind(agent, prefetch=True):
                pass
        except Exception as exc:  # a prefetch is an optimisation: its failure is not fatal
            log.warning("prefetching %s into a trainer slot failed: %s", agent, exc)
        finally:
            self._prefetches.discard(asyncio.current_task())

    def _dispatch(self) -> None:
        for grant in self.allocator.grant():
            fut = self._granted.pop(grant.agent)
            if not fut.done():
                fut.set_result(grant)

    async def _load(self, grant: Grant) -> None:
        if grant.slot in self._replacing:  # the slot died: wait for its new processes
            await asyncio.shield(self._replacing[grant.slot])
        conn = self.slots[grant.slot]
        if conn.dead is not None:
            raise conn.dead
        loaded = self._loaded.get(grant.slot)
        if loaded == grant.agent:
            return  # its trainer never left this slot
        if loaded:  # an idle agent's trainer: parked in the slot's own processes
            leaving = self._leaving[loaded] = asyncio.get_running_loop().create_future()
            started = now()
            try:
                out: Parked = await conn.request(SwapOut(), timeout_s=self.request_timeout_s)
                self.states[loaded] = ParkedState(grant.slot, list(out.ranks), out.version,
                                                  out.num_bytes)
                del self._loaded[grant.slot]
                self._record(loaded, grant.slot, "out", out.num_bytes, started)
            finally:
                del self._leaving[loaded]
                leaving.set_result(None)
        # The agent may have been evicted from another slot a moment ago (by the grant that
        # chose that slot) and its state still be on the way out: wait for it to land.
        if grant.agent in self._leaving:
            await asyncio.shield(self._leaving[grant.agent])
        state = self.states.get(grant.agent)  # kept until the SwapIn succeeded
        if state is None and grant.agent in self._started:
            raise RuntimeError(f"agent {grant.agent}'s training state is in no slot and parked "
                               "nowhere (its SwapOut failed, or its slot died without a "
                               "snapshot): refusing to restart it from its initial weights")
        spec = self.agents[grant.agent]
        started = now()
        if isinstance(state, ParkedState):
            msg = SwapIn(grant.agent, spec.model_dir, spec.config, source=state.ranks)
        elif state is not None:  # restore a whole state: a checkpoint or a snapshot
            msg = SwapIn(grant.agent, spec.model_dir, spec.config, tensors=state.tensors,
                         meta=state.meta)
        else:
            msg = SwapIn(grant.agent, spec.model_dir, spec.config)
        done: SwapDone = await conn.request(msg, timeout_s=self.request_timeout_s)
        self._loaded[grant.slot] = grant.agent
        self._started.add(grant.agent)
        if state is None:
            return
        del self.states[grant.agent]
        source = state.slot if isinstance(state, ParkedState) else ""
        self._record(grant.agent, grant.slot, "in", done.num_bytes, started, source)
        if source and source != grant.slot:  # pulled from there: free the old copy
            try:
                await self.slots[source].request(DropParked(grant.agent),
                                                 timeout_s=self.request_timeout_s)
            except Exception as exc:  # only host memory of that slot is at stake
                log.warning("trainer slot %s: freeing %s's old copy failed: %s", source,
                            grant.agent, exc)

    def _record(self, agent: str, slot: str, direction: str, num_bytes: int,
                started: float, source: str = "") -> None:
        record = SwapRecord(agent, slot, direction, num_bytes, now() - started, now(), source)
        self.swaps.append(record)
        how = ("out of" if direction == "out" else
               "into" if source in ("", slot) else f"from slot {source} into")
        log.info("swapped %s %s slot %s: %.1f MB in %.3f s", agent, how, slot, num_bytes / 1e6,
                 record.seconds)

    async def export(self, agent: str) -> WeightUpdate:
        """The agent's current weights from its trainer (bound for the request)."""
        async with self.bind(agent) as trainer:
            return await trainer.request(ExportWeights())

    async def snapshot(self, agent: str) -> TrainState | None:
        """Keep the agent's whole state (it must be bound, between batches): what it is
        restored from if its slot dies before its next snapshot. None when snapshots are off."""
        if not self.snapshots_on:
            return None
        async with self.bind(agent) as conn:
            state: TrainState = await conn.request(ExportState(),
                                                   timeout_s=self.request_timeout_s)
        self.snapshots[agent] = state
        return state

    def restore(self, agent: str, state: TrainState) -> None:
        """Start the agent from `state` (a resumed run's checkpoint) at its first SwapIn."""
        if agent in self._started:
            raise RuntimeError(f"agent {agent}'s trainer has started already: restore first")
        self.states[agent] = state
        if self.snapshots_on:
            self.snapshots[agent] = state

    def recoverable(self) -> bool:
        """Can an agent whose slot died go on (from its snapshot, on a replaced slot)?"""
        return self.snapshots_on and self.respawn is not None

    def restored_version(self, agent: str) -> int:
        """The trainer version the agent resumes from after its slot died."""
        state = self.snapshots.get(agent)
        return state.version if state is not None else 0

    def where(self, agent: str) -> tuple[str, str] | None:
        """("loaded" or "parked", slot) of the agent's state, None if no slot holds it."""
        slot = next((s for s, a in self._loaded.items() if a == agent), None)
        if slot is not None:
            return "loaded", slot
        state = self.states.get(agent)
        return ("parked", state.slot) if isinstance(state, ParkedState) else None

    def worker_died(self, name: str, reason: str) -> bool:
        """A process died; False if it is none of the slots' current processes."""
        slot = self.workers.get(name)
        if slot is None:
            return False
        self.slot_died(slot, f"{name} {reason}")
        return True

    def slot_hung(self, slot: str, reason: str) -> None:
        """A request to the slot timed out: kill its processes and handle it as dead."""
        if self.kill is not None:
            for name in [n for n, s in self.workers.items() if s == slot]:
                self.kill(name)
        self.slot_died(slot, reason)

    def slot_died(self, slot: str, reason: str) -> None:
        """A process of `slot` died (or hung): its requests in flight fail now (PeerDied),
        naming it; with recovery on, its agent's state goes back to its snapshot and new
        processes are started for the slot."""
        conn = self.slots[slot]
        if conn.dead is not None:
            return  # already handled: this is another rank of the same group
        self.deaths += 1
        self._died_at[slot] = now()
        recover = self.recoverable()
        log.error("trainer slot %s died: %s%s", slot, reason,
                  "; replacing it and restoring its agent from its last snapshot" if recover
                  else "")
        conn.fail_pending(PeerDied(
            f"trainer slot {slot} died: {reason}; " + (
                "its agent restarts the batch from its last snapshot" if recover else
                "its agent's update cannot complete (trainer_pool.snapshots and a replacement "
                "let a run survive this)")))
        lost = [self._loaded.pop(slot)] if slot in self._loaded else []
        lost += [a for a, st in self.states.items()
                 if isinstance(st, ParkedState) and st.slot == slot]
        for agent in lost:  # their shards died with the slot's processes
            self.states.pop(agent, None)
            if not recover:
                continue
            if agent in self.snapshots:
                self.states[agent] = self.snapshots[agent]
            else:  # it never finished a step: its fresh trainer is its state
                self._started.discard(agent)
        if recover and slot not in self._replacing:
            old = [n for n, s in self.workers.items() if s == slot]
            for name in old:
                del self.workers[name]  # their deaths, now or when killed, are this one
            self._replacing[slot] = asyncio.ensure_future(self._replace(slot, old))

    async def _replace(self, slot: str, old: list[str]) -> None:
        """New processes for a dead slot (up to REPLACE_ATTEMPTS); the slot stays dead if none
        starts."""
        error: BaseException | None = None
        try:
            for attempt in range(1, REPLACE_ATTEMPTS + 1):
                try:
                    names, conn = await self.respawn(slot, old)
                except Exception as exc:
                    error = exc
                    log.warning("trainer slot %s: replacement %d/%d failed: %s", slot, attempt,
                                REPLACE_ATTEMPTS, exc)
                    continue
                dead = self.slots[slot]
                self.slots[slot] = _TimedConnection(conn, slot, self)
                self.workers.update(dict.fromkeys(names, slot))
                self.replacements.append({"slot": slot, "workers": names,
                                          "seconds": now() - self._died_at[slot]})
                log.warning("trainer slot %s replaced by %s", slot, ", ".join(names))
                try:
                    await dead.aclose()
                except Exception:  # its peer is gone; closing is best effort
                    pass
                return
            self.slots[slot].dead = PeerDied(
                f"trainer slot {slot} died and no replacement started ({REPLACE_ATTEMPTS} "
                f"attempts; last error: {error})")
        finally:
            del self._replacing[slot]

    @property
    def loaded(self) -> dict[str, str]:
        """slot -> agent whose training state the slot holds (bound or idle)."""
        return dict(self._loaded)

    def status(self, recent: int = 200) -> dict:
        """The slots now and the latest swaps, as plain data (flexmarl.observe.monitor):
        {slots: name -> {ranks, agent (bound now), resident (state held), busy_s},
        bound: agent -> slot, swaps: the last `recent` SwapRecords, swaps_total}."""
        bound = self.allocator.bound
        slots = {name: {"ranks": ranks, "agent": bound.get(name),
                        "resident": self._loaded.get(name), "busy_s": self.busy_s.get(name, 0.0)}
                 for name, ranks in self.allocator.slots.items()}
        return {"slots": slots, "bound": {a: s for s, a in bound.items()},
                "swaps": self.swaps[-recent:], "swaps_total": len(self.swaps)}

    def take_busy(self) -> dict[str, float]:
        """Per slot: busy seconds since the last call."""
        out = {s: self.busy_s[s] - self._busy_taken[s] for s in self.busy_s}
        self._busy_taken = dict(self.busy_s)
        return out


class _TimedConnection:
    """A slot's connection that counts the time its requests take as the slot's busy time;
    a request without its own deadline gets trainer_pool.request_timeout_s."""

    def __init__(self, conn: Connection, slot: str, pool: TrainerPool) -> None:
        self._conn, self._slot, self._pool = conn, slot, pool
        self.dead: Exception | None = None
        """Set when the slot's processes died: every request fails with it at once."""

    async def request(self, msg: Any, **kwargs: Any) -> Any:
        if self.dead is not None:
            raise self.dead
        started = now()
        kwargs.setdefault("timeout_s", self._pool.request_timeout_s)
        try:
            return await self._conn.request(msg, **kwargs)
        except RequestTimeout as exc:
            if self.dead is not None:
                raise self.dead from exc
            # A slot that does not answer is treated as dead, not waited on again.
            self._pool.slot_hung(self._slot, f"{type(msg).__name__} timed out ({exc})")
            raise (self.dead or exc) from exc
        except RemoteError as exc:
            deadline = now() + DEATH_NOTICE_GRACE_S
            while self.dead is None and now() < deadline and _peer_lost(exc):
                await asyncio.sleep(0.05)
            if self.dead is not None:
                raise self.dead from exc
            raise
        finally:
            self._pool.busy_s[self._slot] += now() - started

    def fail_pending(self, exc: Exception) -> None:
        self.dead = exc
        self._conn.fail_pending(exc)

    async def aclose(self) -> None:
        await self._conn.aclose()


def _peer_lost(exc: RemoteError) -> bool:
    """Did a collective fail because a peer rank went away (gloo's or NCCL's words)?"""
    text = str(exc)
    return any(words in text for words in ("Connection reset by peer", "Connection closed by peer",
                                            "Broken pipe", "NCCL"))
