"""Trainer slots bound to agents on demand, idle agents' training state parked in host memory.

    slot = one trainer worker group (its processes, its devices); empty until a SwapIn
    bind(agent) ─► SlotAllocator (pure): the agent waits its turn (first come, first served),
                 then takes the slot of least expected cost, or waits a bounded time for a
                 better one (SlotTimes: swaps and holds measured, handed in as Estimates)
                 ─► its granted slot: already holding its state (no swap), empty, or holding an
                    idle agent's state ─► SwapOut (that agent parked in the slot's own
                    processes) ─► SwapIn (the agent's parked shards, or a fresh trainer the
                    first time)
                 ─► the slot's connection, until the binding ends (the agent's update is done)
    release with nobody waiting ─► prefetch: the swapped-out agent expected to ask next (the
                 order agents asked in during the last cycle: the workflow repeats) is swapped
                 in now, while rollout runs, instead of when it asks; evictions take the idle
                 agent expected last (SlotAllocator.expect)

No tensor of a swap or a save passes through this process. SwapOut leaves each rank's shards
in host memory of its own process and answers where (Parked); a SwapIn into the same slot copies
them back in place, into another slot its ranks pull them rank to rank (resharded), and the old
slot then frees its copy (DropParked). `save` has the ranks write the agent's state into a dir
(flexmarl.training.saves): a scratch dir (the snapshot), copied to the run's state dir.
A LoRA agent's state is its adapter's (the base stays in the slot:
flexmarl.training.parking.ResidentBase), so its swaps' bytes, and the allocator's costs, are
the adapter state's. `states` says where each swapped-out agent's state is. `static`: every agent owns one slot (no
swaps), except the LoRA agents of one base, which share one (trainer_pool.share_lora_base: the
base once, their adapters swapped in it); a shared pool of fewer slots than agents sends slots
where the work is.

Dead slots (with `snapshots` on and a lifecycle that respawns): `recovery`
(flexmarl.training.recovery) fails the slot's requests, sends its agents back to their
snapshots and replaces its processes; the agent's loop binds again and re-accumulates the
batch it had taken: the same update.
"""
from __future__ import annotations

import asyncio
import json
import logging
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, AsyncIterator

from flexmarl.clock import now
from flexmarl.config.training import TrainerPoolConfig
from flexmarl.placement.lora_units import static_slots
from flexmarl.placement.timeshare import TimeShares
from flexmarl.training.slot_connection import BusyTime, SlotConnection
from flexmarl.training.slots import Grant, ParkedState, SlotAllocator, SlotTimes, TeamOrder
from flexmarl.protocol import (DropParked, ExportWeights, Parked, StateSaved, SwapDone, SwapIn,
                               SwapOut, TrainState, WeightUpdate)
from flexmarl.training.recovery import SlotRecovery
from flexmarl.training.saves import Saves
from flexmarl.training.state_files import StateCheckpoints
from flexmarl.weights import published
from runtime.errors import PeerDied
from runtime.lifecycle import Lifecycle
from runtime.transport import Connection

__all__ = ["AgentTrainer", "SwapRecord", "TrainerPool"]
log = logging.getLogger(__name__)


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
                 prefetch: bool = True, lifecycle: Lifecycle | None = None,
                 saved: StateCheckpoints | None = None, scratch_in: str | None = None,
                 pinned: dict[str, str] | None = None, shares: TimeShares | None = None,
                 publish: str = "") -> None:
        """`slot_ranks`: each slot's ranks (the slots' sizes, from config.slots / slot_ranks or
        one per agent); `config.static`: every agent owns one slot, the LoRA agents of one base
        one together with `config.share_lora_base` (_static_pins); `config.snapshots`: save
        each agent's state after every step (`save`) so a dead slot's agent is restored;
        `lifecycle` (groups: its owners are the slots) knows each process's slot, replaces a
        dead slot's processes and kills a hung one (none: a death is final); `saved`: the
        run's state dir (durable saves), `scratch_in`: where snapshots go (Saves); `pinned`
        (agent -> slot): time-shared agents' own slots; `shares` (TimeShares): their
        devices, taken by each binding; the pool gives the groups how to park a trainer.
        `publish`: the run's name for its published weights (flexmarl.weights.published):
        every export is a file the trainer writes on its host, named in the reply, and removed
        from this host at close; "": exports carry their tensors (tests and tools)."""
        self.publish = publish
        static, pinned = config.static, dict(pinned or {})
        if static:
            pinned |= _static_pins(list(slots), slot_ranks, agents, pinned,
                                   config.share_lora_base)
        self.allocator = SlotAllocator(slot_ranks, {a: s.ranks for a, s in agents.items()},
                                       pinned)
        self.shares = shares
        if shares:
            shares.hold_trainers(self.park)
        self.lifecycle = lifecycle or Lifecycle(groups=True, kind="trainer slot")
        self.agents = dict(agents)
        self.static = static
        self.request_timeout_s = config.request_timeout_s
        self.states: dict[str, ParkedState | StateSaved | TrainState] = {}
        """Swapped-out agents, oldest first -> where their state is: parked in a slot's
        processes (ParkedState), saved in a dir to restore (StateSaved: a resumed run's
        checkpoint, the snapshot of an agent whose slot died), or a whole TrainState (tools)."""
        self.swaps: list[SwapRecord] = []
        self.times = SlotTimes()
        """Swap throughputs, state sizes and hold times measured: the allocator's estimates."""
        self._recheck: asyncio.TimerHandle | None = None
        """The allocator's next look when an agent waits for a better slot than a free one."""
        self.busy = BusyTime(slots)
        """Per slot: time its processes spent on requests (training, export, swaps)."""
        self.recovery = SlotRecovery(self)
        self.slots = {name: SlotConnection(conn, name, self.request_timeout_s, self.busy,
                                           self.lifecycle, self.recovery.slot_died)
                      for name, conn in slots.items()}
        self._granted: dict[str, asyncio.Future] = {}
        self._holding: dict[str, _Hold] = {}
        """agent -> its binding (slot once loaded, nesting depth)."""
        self.prefetch = prefetch
        self._prefetches: set[asyncio.Future] = set()
        self.order = TeamOrder()
        """The order agents ask in (the last cycle's): what is prefetched, who is evicted."""
        self.loaded: dict[str, str] = {}
        """slot -> agent whose trainer the slot's processes hold now."""
        self._leaving: dict[str, asyncio.Future] = {}
        """agent -> done when its state, on its way out of a slot, is parked (in `states`)."""
        self.started: set[str] = set()
        """Agents whose trainer has been built: a fresh SwapIn would lose their training."""
        self.snapshots_on = config.snapshots
        self.saving = Saves(self.bind, self.request_timeout_s, saved, scratch_in)
        self.snapshots = self.saving.snapshots
        """agent -> where its state after its last finished step is (`save`: metadata only)."""
        self.workers = self.lifecycle.owners
        """Live process -> its slot (the lifecycle's, updated in place)."""
        self.replacements = self.lifecycle.replacements
        """Per replaced slot: {slot, workers, seconds from the death to the new processes}."""

    @asynccontextmanager
    async def bind(self, agent: str, *, prefetch: bool = False) -> AsyncIterator[Connection]:
        """The agent's trainer connection, its state in the slot, for the duration.

        Re-entrant per agent (a prefetch and the agent's own update may overlap): the slot is
        released when the last binding of the agent ends. A time-shared agent's outermost
        binding first waits for its devices (`shares.train`: its engines asleep)."""
        if agent not in self._holding and not prefetch and self.shares is not None:
            async with self.shares.train(agent):
                async with self._bind(agent, prefetch) as conn:
                    yield conn
            return
        async with self._bind(agent, prefetch) as conn:
            yield conn

    @asynccontextmanager
    async def _bind(self, agent: str, prefetch: bool) -> AsyncIterator[Connection]:
        hold = self._holding.get(agent)
        if not prefetch and (hold is None or hold.prefetch_only):
            self.order.asked(agent)  # the allocator evicts the agent expected last
            self.allocator.expect(self.expected_order())
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
                    self.times.released(agent, now())
                    self._dispatch()
                    if not hold.prefetch_only:  # a prefetch ending must not start another one
                        self._maybe_prefetch()
                else:  # still waiting for a slot, or the load failed: give the grant back
                    hold.ready.cancel()

    async def _acquire(self, agent: str) -> str:
        """Wait for the allocator to grant the agent a slot, load its state there; the slot."""
        fut = asyncio.get_running_loop().create_future()
        self._granted[agent] = fut
        self.allocator.request(agent, now())
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

    def expected_order(self) -> list[str]:
        """Agents in the order they are expected to ask for a slot next (TeamOrder)."""
        return self.order.expected()

    def _maybe_prefetch(self) -> None:
        """A slot fell idle and nobody waits: bring in the swapped-out agent expected to ask
        next, so its swap happens now (during rollout), not when it needs the slot. Not when
        that would evict an agent expected sooner than it."""
        if not self.prefetch or self.allocator.waiting() or not self.started:
            return
        resident = {a for a in self.allocator.resident.values() if a}
        candidates = [a for a in self.expected_order()  # time-shared ones: parked on purpose
                      if a in self.started and a not in resident and a not in self._holding
                      and (self.shares is None or self.shares.of(a) is None)]
        if not self.order.learnt:  # nothing learnt yet: the agent that trained least recently
            candidates = [a for a in self.states if a in candidates]
        if not candidates:
            return
        agent = candidates[0]
        rank = self.allocator.expected_rank(agent)
        # Only the slots it may take (a static LoRA base's slot: that one alone).
        idle = [self.allocator.resident[s] for s in self.allocator.resident
                if s not in self.allocator.bound and self.allocator.fits(agent, s)]
        if not any(not a or self.allocator.expected_rank(a) > rank for a in idle):
            return
        self._prefetches.add(asyncio.ensure_future(self._prefetch(agent)))

    async def close(self) -> None:
        """No more prefetching; wait for one in flight (before the slots' connections close);
        a temp dir of saved states goes."""
        self.prefetch = False
        if self._recheck is not None:  # nobody is served after close
            self._recheck.cancel()
        if self._prefetches:
            await asyncio.gather(*self._prefetches, return_exceptions=True)
        await self.saving.close()
        if self.publish:  # this host's files; a trainer on another host removes its own
            await asyncio.to_thread(published.remove, self.publish)

    async def _prefetch(self, agent: str) -> None:
        try:
            async with self.bind(agent, prefetch=True):
                pass
        except Exception as exc:  # a prefetch is an optimisation: its failure is not fatal
            log.warning("prefetching %s into a trainer slot failed: %s", agent, exc)
        finally:
            self._prefetches.discard(asyncio.current_task())

    def _dispatch(self) -> None:
        at = now()
        for grant in self.allocator.grant(at, self.times.estimates(self.allocator.bound)):
            self.times.granted(grant.agent, grant.slot, at)
            fut = self._granted.pop(grant.agent)
            if not fut.done():
                fut.set_result(grant)
        # An agent passed over a free slot for a better one: look again when its wait is up.
        if self._recheck is not None:
            self._recheck.cancel()
            self._recheck = None
        if self.allocator.recheck_at is not None:  # 1 ms late: rounding never wakes it early
            self._recheck = asyncio.get_running_loop().call_later(
                max(self.allocator.recheck_at - at, 0.0) + 1e-3, self._dispatch)

    async def _load(self, grant: Grant) -> None:
        if grant.slot in self.recovery.replacing:  # the slot died: wait for its new processes
            await asyncio.shield(self.recovery.replacing[grant.slot])
        conn = self.slots[grant.slot]
        if conn.dead is not None:
            raise conn.dead
        loaded = self.loaded.get(grant.slot)
        if loaded == grant.agent:
            return  # its trainer never left this slot
        if loaded:  # an idle agent's trainer: parked in the slot's own processes
            await self._park(grant.slot, loaded)
        # The agent may have been evicted from another slot a moment ago (by the grant that
        # chose that slot) and its state still be on the way out: wait for it to land.
        if grant.agent in self._leaving:
            await asyncio.shield(self._leaving[grant.agent])
        state = self.states.get(grant.agent)  # kept until the SwapIn succeeded
        if state is None and grant.agent in self.started:
            raise RuntimeError(f"agent {grant.agent}'s training state is in no slot and parked "
                               "nowhere (its SwapOut failed, or its slot died without a "
                               "snapshot): refusing to restart it from its initial weights")
        spec = self.agents[grant.agent]
        started = now()
        if isinstance(state, ParkedState):
            msg = SwapIn(grant.agent, spec.model_dir, spec.config, source=state.ranks)
        elif isinstance(state, StateSaved):  # every rank reads its rows of the saved state
            msg = SwapIn(grant.agent, spec.model_dir, spec.config, state_dir=state.path)
        elif state is not None:  # a whole state, handed in (tools)
            msg = SwapIn(grant.agent, spec.model_dir, spec.config, tensors=state.tensors,
                         meta=state.meta)
        else:
            msg = SwapIn(grant.agent, spec.model_dir, spec.config)
        done: SwapDone = await conn.request(msg, timeout_s=self.request_timeout_s)
        self.loaded[grant.slot] = grant.agent
        self.started.add(grant.agent)
        self.times.bytes[grant.agent] = done.num_bytes  # a fresh one's too: what evicting it costs
        if state is None:
            return
        del self.states[grant.agent]
        source = state.slot if isinstance(state, ParkedState) else ""
        self.swaps.append(_swapped(grant.agent, grant.slot, "in", done.num_bytes, started, source))
        self.times.swapped(grant.agent, "pull" if source not in ("", grant.slot) else "in",
                           done.num_bytes, self.swaps[-1].seconds)
        if source and source != grant.slot:  # pulled from there: free the old copy
            try:
                await self.slots[source].request(DropParked(grant.agent),
                                                 timeout_s=self.request_timeout_s)
            except Exception as exc:  # only host memory of that slot is at stake
                log.warning("trainer slot %s: freeing %s's old copy failed: %s", source,
                            grant.agent, exc)

    async def _park(self, slot: str, agent: str) -> None:
        """SwapOut: `agent`'s trainer leaves `slot` for host memory of the slot's processes."""
        leaving = self._leaving[agent] = asyncio.get_running_loop().create_future()
        started = now()
        try:
            out: Parked = await self.slots[slot].request(SwapOut(),
                                                         timeout_s=self.request_timeout_s)
            self.states[agent] = ParkedState(slot, list(out.ranks), out.version, out.num_bytes)
            del self.loaded[slot]
            self.swaps.append(_swapped(agent, slot, "out", out.num_bytes, started))
            self.times.swapped(agent, "out", out.num_bytes, self.swaps[-1].seconds)
        finally:
            del self._leaving[agent]
            leaving.set_result(None)

    async def park(self, agent: str) -> None:
        """Park the agent's trainer in place (its devices go to its engines: devices.placement
        time_shared); its next binding loads it back. Nothing to do if no slot holds it."""
        where = self.where(agent)
        if where is None or where[0] != "loaded":
            return
        if agent in self._holding:
            raise RuntimeError(f"agent {agent}'s trainer is bound: it cannot be parked now")
        try:
            await self._park(where[1], agent)
        except PeerDied as exc:  # the slot died: recovery restores its agent from its snapshot
            log.warning("parking %s's trainer: %s (its devices go to its engines all the same)",
                        agent, exc)

    async def export(self, agent: str) -> WeightUpdate:
        """The agent's current weights from its trainer (bound for the request): published
        on its host (their source), or the tensors where the pool publishes nothing."""
        async with self.bind(agent) as trainer:
            return await trainer.request(ExportWeights(self.publish))

    async def save(self, agent: str, step: int, *, durable: bool = False, updated: bool = True
                   ) -> "asyncio.Future[StateSaved]":
        """The agent's state of `step` saved by its slot's ranks (flexmarl.training.saves):
        staged now, bound; the future is done once it is the agent's snapshot."""
        return await self.saving.save(agent, step, durable=durable, updated=updated)

    def restore(self, agent: str, state: StateSaved | TrainState) -> None:
        """Start the agent from `state` (a resumed run's saved state) at its first SwapIn."""
        if agent in self.started:
            raise RuntimeError(f"agent {agent}'s trainer has started already: restore first")
        self.states[agent] = state
        if isinstance(state, StateSaved):
            self.snapshots[agent] = state

    def recoverable(self) -> bool:
        """Can an agent whose slot died go on (from its snapshot, on a replaced slot)?"""
        return self.snapshots_on and self.lifecycle.recoverable

    @property
    def deaths(self) -> int:
        """Slot deaths so far (the lifecycle counts them)."""
        return self.lifecycle.deaths

    def restored_version(self, agent: str) -> int:
        """The trainer version the agent resumes from after its slot died."""
        state = self.snapshots.get(agent)
        return state.version if state is not None else 0

    def where(self, agent: str) -> tuple[str, str] | None:
        """("loaded" or "parked", slot) of the agent's state, None if no slot holds it."""
        slot = next((s for s, a in self.loaded.items() if a == agent), None)
        if slot is not None:
            return "loaded", slot
        state = self.states.get(agent)
        return ("parked", state.slot) if isinstance(state, ParkedState) else None

    def status(self, recent: int = 200) -> dict:
        """The slots now and the latest swaps, as plain data (flexmarl.observe.monitor):
        {slots: name -> {ranks, agent (bound now), resident (state held), busy_s},
        bound: agent -> slot, swaps: the last `recent` SwapRecords, swaps_total}."""
        bound = self.allocator.bound
        slots = {name: {"ranks": ranks, "agent": bound.get(name),
                        "resident": self.loaded.get(name),
                        "busy_s": self.busy.seconds.get(name, 0.0)}
                 for name, ranks in self.allocator.slots.items()}
        return {"slots": slots, "bound": {a: s for s, a in bound.items()},
                "swaps": self.swaps[-recent:], "swaps_total": len(self.swaps)}


def _static_pins(slots: list[str], slot_ranks: dict[str, int], agents: dict[str, AgentTrainer],
                 pinned: dict[str, str], share_lora_base: bool) -> dict[str, str]:
    """The static reservation (trainer_pool.slots = 0): every agent not pinned yet (not
    time-shared) -> its slot, one of its own, except that with `share_lora_base` the LoRA
    agents (AgentTrainer.config["lora"]) of one model dir share one (lora_units.static_slots,
    as flexmarl.placement.layout.slot_layout sized the slots): in order, each the first free
    slot that fits (slot K for the K-th, as the layout made them). A ValueError when the
    slots are too few."""
    needs = {a: spec.ranks for a, spec in agents.items() if a not in pinned}
    bases = ({a: agents[a].model_dir for a in needs if agents[a].config.get("lora")}
             if share_lora_base else {})
    groups = static_slots(needs, bases)
    free = [s for s in slots if s not in pinned.values()]
    if len(free) < len(groups):
        raise ValueError(f"static reservation needs one slot per trainable agent"
                         f"{' (one per base for the LoRA agents)' if bases else ''}: "
                         f"{len(groups)} needed, {len(free)} slots")
    out: dict[str, str] = {}
    for members, ranks in groups:
        slot = next((s for s in free if slot_ranks.get(s, 0) >= ranks), None)
        if slot is None:
            raise ValueError(f"static reservation: no slot of {ranks} ranks left for "
                             f"{', '.join(members)} (slots {slot_ranks})")
        free.remove(slot)
        out |= dict.fromkeys(members, slot)
        if len(members) > 1:
            lora = {json.dumps(agents[a].config["lora"], sort_keys=True) for a in members}
            log.info("LoRA agents %s share trainer slot %s (trainer_pool.share_lora_base): "
                     "one base, their adapters swapped", ", ".join(members), slot)
            if len(lora) > 1:
                log.warning(
                    "LoRA agents %s share trainer slot %s but their adapters differ in shape "
                    "(LoraSpec): the slot's ranks rebuild the base whenever it switches between "
                    "them; give them one LoraSpec, or set trainer_pool.share_lora_base = false "
                    "(a slot each)", ", ".join(members), slot)
    return out


def _swapped(agent: str, slot: str, direction: str, num_bytes: int, started: float,
             source: str = "") -> SwapRecord:
    """The record of a swap that just ended (logged)."""
    record = SwapRecord(agent, slot, direction, num_bytes, now() - started, now(), source)
    how = ("out of" if direction == "out" else
           "into" if source in ("", slot) else f"from slot {source} into")
    log.info("swapped %s %s slot %s: %.1f MB in %.3f s", agent, how, slot, num_bytes / 1e6,
             record.seconds)
    return record
