"""Trainer worker: one agent's GRPOTrainer group (N processes) served as actors over the runtime.

The actors are here; what each rank does in its command thread (process group, trainer,
swaps, pulls, the direct weight send) is flexmarl.training.rank.Rank.

Every rank is a worker process started by `runtime.supervisor.Supervisor` with entry point
`flexmarl.training.worker:trainer_worker` and WorkerSpec.args {"rank", "world_size",
"init_method" (e.g. file:///tmp/x/store, a FileStore the caller owns), "config" (TrainerConfig
fields: the slot's device and process group come from it), optional "model_dir" and "agent"
(its name: needed to park it), "collective_timeout_s", "drain_timeout_s", "num_threads",
"memory_fraction" (of its GPU, when it shares it with an engine), "keep_parked_memory" (a park
keeps freed GPU memory cached: beside an engine that sized itself at start)}.
Without model_dir the group is an empty trainer slot: SwapIn binds it to an agent, SwapOut
parks it. Clients talk to rank 0 only; rank 0 replays each command to the followers with
torch.distributed broadcasts of plain tensors (no pickle), so every rank makes the same
GRPOTrainer calls in the same order:

    client ──TrainMicroBatch──► rank 0: TrainerWorker mailbox_loop (asyncio; heartbeats go on)
                                  │ admit: takes its turn (ordered.Turns), in arrival order
                                  │ its own task: checked, waits for its turn, submitted
                                  ▼ to the command thread (one at a time, FIFO)
            rank 0 command thread                        rank r > 0 follower thread
            broadcast header [cmd, a, b, c] ──────────► header: which call, which shapes
            broadcast ints, floats, advantages ───────► the micro-batch's tensors
            trainer.accumulate(mb) ◄── FSDP collectives ──► trainer.accumulate(mb)
                                  │
    client ◄──TrainStats─────── reply

Swaps (the one swap path; flexmarl.training.parking.park/unpark/pull_pieces):

    SwapOut ─► every rank parks its own shards (parameters, buffers, the KL reference, AdamW
               state, RNG, version) in host memory of its own process, device storages freed;
               reply Parked: the agent, its bytes, the address of each rank (no tensor)
    SwapIn, agent parked here ─► every rank copies its shards back in place (same objects)
    SwapIn, source = another slot's ranks ─► every rank builds the agent's modules empty (meta
               device, sharded, no weight file read) and pulls the rows it needs from the
               source ranks (FetchShards, all ranks and sources at once, rank to rank through
               the runtime transport; resharded when the rank counts differ); the pool then
               sends the old slot DropParked
    SwapIn, tensors ─► restore a whole TrainState (snapshot or checkpoint): built from
               model_dir, rank 0 broadcasts it, each rank keeps its shards (not a swap)

LoRA agents (trainer.lora) swap their adapter state alone (its parameters, AdamW state, RNG,
version): the frozen base stays resident in the slot's ranks (Rank.base), and every SwapIn of
a LoRA agent of the same base and settings sets its adapter on it (here, pulled, restored or
fresh) with no base built or read. A full agent's SwapIn, or one on another base, frees it.

Every rank's actor serves FetchShards for the agents parked on it, concurrently with whatever
its group is doing (the parked copies are never written). A pull runs on the rank's event
loop while its command thread waits, so two slots pulling from each other cannot deadlock.
Rank 0 serves every command as a concurrent handler that keeps its turn, taken synchronously
at dispatch (Actor.admit): the command thread gets them in arrival order, while the mailbox
goes on answering FetchShards, SlotStatus (what the slot holds, runs and has queued) and pings
during a long step or swap. A request refused by its check, a failing command and a cancelled
one all give their turn up at once. Commands in flight count against the actor's
max_concurrent (64): a client pipelining more than that makes the mailbox wait (backpressure
on the micro-batches it holds); TrainSession sends one request at a time per agent.
Followers' actors otherwise refuse training commands, and stop when rank 0 broadcasts STOP.
Blocking torch.distributed calls live in a daemon thread per process, never on the event loop. While idle, rank 0 broadcasts a KEEPALIVE
every collective_timeout_s / KEEPALIVE_FRACTION, so waiting followers never hit the collective
timeout. Shutdown: rank 0's drain broadcasts STOP, all ranks meet at a barrier and destroy the
process group; the followers' actors then stop on their own.
"""
from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import deque
from typing import Any, Callable

import torch

from flexmarl.config.training import TrainerConfig
from runtime.actor import Actor, handler
from runtime.codec import Envelope
from runtime.worker import WorkerContext
from flexmarl.protocol import (AwaitSaved, DropParked, ExportState, ExportWeights,
                               FetchShards, FetchWeights, Parked, SaveState, SendWeights, ShardData,
                               SlotStatus, SlotStatusReply, StateSaved, SwapDone,
                               SwapIn, SwapOut, TrainBeginBatch, TrainMicroBatch, TrainState,
                               TrainStats, TrainStep, TrainStepDone, WeightUpdate,
                               WeightUpdateDone)
from flexmarl.training.ordered import Turn, Turns
from flexmarl.training.rank import HEADER_LEN, KEEPALIVE_FRACTION, Command, Rank
from flexmarl.weights import published

log = logging.getLogger(__name__)

def _refusing(msg_type: type) -> Callable:
    """A follower's handler for `msg_type`: an error reply that points at rank 0."""

    async def refuse(self: "TrainerFollower", msg: Any, env: Envelope) -> None:
        raise RuntimeError(f"{msg_type.__name__} sent to rank {self.group.rank} of a trainer "
                           "group: only rank 0 takes training commands; send them to rank 0's "
                           "address")

    refuse.__name__ = f"refuse_{msg_type.__name__}"
    return handler(msg_type)(refuse)


ORDERED: dict[type, Command] = {
    TrainBeginBatch: Command.BEGIN_BATCH, TrainMicroBatch: Command.MICRO_BATCH,
    TrainStep: Command.STEP, SwapIn: Command.SWAP_IN, SwapOut: Command.SWAP_OUT,
    DropParked: Command.DROP, ExportState: Command.EXPORT_STATE, ExportWeights: Command.EXPORT,
    SendWeights: Command.SEND_WEIGHTS, SaveState: Command.SAVE_STATE}
"""The requests rank 0 runs in its command thread: each takes its turn at dispatch."""


class _StateSaves:
    """Rank 0's handlers of the state saves (flexmarl.training.sharded_state), a part of
    TrainerWorker: SaveState in line like any command (it stages the shards), AwaitSaved
    outside it (it only waits for a write already started, while the slot goes on)."""

    @handler(SaveState, concurrent=True)
    async def on_save_state(self, msg: SaveState, env: Envelope) -> StateSaved:
        spec = {"tmp": msg.tmp, "path": msg.path, "step": msg.step, "model_dir": msg.model_dir,
                "merged": msg.merged}
        return await self._command(self._turn_of.pop(id(env)), Command.SAVE_STATE,
                                   self._with_spec(Command.SAVE_STATE, spec,
                                                   lambda g: g.save_state(spec)))

    @handler(AwaitSaved, concurrent=True)
    async def on_await_saved(self, msg: AwaitSaved, env: Envelope) -> StateSaved:
        writer = self.group.writer
        pending = writer.pending.get(msg.path) if writer is not None else None
        if pending is None:
            raise ValueError(f"AwaitSaved: no state write into {msg.path!r} was started on "
                             "this slot (send SaveState first)")
        started = time.perf_counter()
        try:
            agent, step, version, num_bytes = await asyncio.wrap_future(pending)
        finally:
            writer.pending.pop(msg.path, None)
        return StateSaved(agent, step, version, msg.path, num_bytes,
                          time.perf_counter() - started)


class TrainerWorker(_StateSaves, Actor):
    """Rank 0: serves the training messages and replays each call to the followers."""

    def __init__(self, ctx: WorkerContext) -> None:
        super().__init__(ctx.name, ctx.bind, transport=ctx.transport)
        self.group = Rank(ctx.args)
        self._last_command = time.monotonic()
        self._stopped_group = False
        self.turns = Turns()
        self._turn_of: dict[int, Turn] = {}
        """id(envelope) -> the turn its request took at dispatch (admit), until its handler
        takes it (the envelope lives as long as its request is served)."""
        self._in_thread: deque[str] = deque()
        """Commands submitted to the command thread and not started, in order."""
        self._running: tuple[str, float] | None = None
        """The command the thread runs and when it started (written by the thread)."""
        self._published: set[str] = set()
        """Runs this rank published weights for (ExportWeights.publish): its files go when it
        stops."""

    def admit(self, env: Envelope) -> None:
        cmd = ORDERED.get(type(env.msg))
        if cmd is not None:
            self._turn_of[id(env)] = self.turns.take(cmd.name)

    async def _command(self, turn: Turn, cmd: Command, job: Callable[[], Any],
                       check: Callable[[], Any] = lambda: None) -> Any:
        """`job` (a broadcast of `cmd` to the followers, then this rank's call) in the command
        thread once every command accepted before it has gone there; `check` refuses a bad
        request first, before it holds anyone up."""
        try:
            check()  # before any broadcast: a bad request must not desync the ranks
            await turn.wait()
            await self.group.ready  # raises why the process group or the model failed to start
            if self._stopped_group:
                if cmd is Command.KEEPALIVE:
                    return None
                raise RuntimeError("the trainer group has been stopped (its worker is shutting "
                                   "down); start a new group")
            self._last_command = time.monotonic()
            if cmd is Command.STOP:
                self._stopped_group = True
            done = self._submit(cmd, job)
        finally:
            turn.release()  # submitted (or refused): the thread's FIFO queue keeps the order
        return await done

    def _submit(self, cmd: Command, job: Callable[[], Any]) -> asyncio.Future:
        def run() -> Any:
            self._in_thread.popleft()
            self._running = (cmd.name, time.monotonic())
            try:
                return job()
            finally:
                self._running = None

        self._in_thread.append(cmd.name)
        return self.group.thread.submit(run)

    def _lead(self, cmd: Command, mb: TrainMicroBatch | None = None, arg: int = 0
              ) -> Callable[[], Any]:
        def lead() -> Any:
            g = self.group
            header = [int(cmd), arg, 0, 0]
            if mb is not None:
                rows, width = mb.input_ids.shape
                header = [int(cmd), rows, width, _flags(mb)]
            if g.world_size > 1:
                g.broadcast(torch.tensor(header, dtype=torch.int64, device=g.device))
                if mb is not None:
                    for t in _pack(mb, g.device):
                        g.broadcast(t)
            return g.execute(cmd, mb, arg)

        return lead

    def _with_spec(self, cmd: Command, spec: Any, call: Callable[[Rank], Any]
                   ) -> Callable[[], Any]:
        """A job that broadcasts `cmd` and its JSON `spec` to the followers, then `call`s
        this rank."""
        blob = json.dumps(spec).encode()

        def lead() -> Any:
            g = self.group
            if g.world_size > 1:
                g.broadcast(torch.tensor([int(cmd), len(blob), 0, 0],
                                         dtype=torch.int64, device=g.device))
                g.broadcast(torch.frombuffer(bytearray(blob), dtype=torch.uint8).to(g.device))
            return call(g)

        return lead

    # Every command is a concurrent handler that keeps its turn (taken at dispatch): the
    # mailbox goes on serving FetchShards, SlotStatus and pings while a step or a swap runs.

    @handler(TrainBeginBatch, concurrent=True)
    async def on_begin_batch(self, msg: TrainBeginBatch, env: Envelope) -> None:
        await self._command(self._turn_of.pop(id(env)), Command.BEGIN_BATCH,
                            self._lead(Command.BEGIN_BATCH, arg=msg.num_tokens),
                            check=lambda: _check_num_tokens(msg))

    @handler(TrainMicroBatch, concurrent=True)
    async def on_micro_batch(self, msg: TrainMicroBatch, env: Envelope) -> TrainStats:
        return await self._command(self._turn_of.pop(id(env)), Command.MICRO_BATCH,
                                   self._lead(Command.MICRO_BATCH, mb=msg),
                                   check=lambda: _check_micro_batch(msg))

    @handler(TrainStep, concurrent=True)
    async def on_step(self, msg: TrainStep, env: Envelope) -> TrainStepDone:
        return await self._command(self._turn_of.pop(id(env)), Command.STEP,
                                   self._lead(Command.STEP, arg=msg.num_tokens),
                                   check=lambda: _check_num_tokens(msg))

    async def on_start(self) -> None:
        self.group.address, self.group.transport = self.address, self.transport
        # Runs nobody holds on this machine (SIGKILLed): their versions hold /dev/shm.
        await asyncio.to_thread(published.remove_orphans)

    # A SwapIn may pull from a slot that pulls from this one at the same time: FetchShards
    # are served on the event loop meanwhile, so two such slots cannot deadlock.
    @handler(SwapIn, concurrent=True)
    async def on_swap_in(self, msg: SwapIn, env: Envelope) -> SwapDone:
        spec = {"agent": msg.agent, "model_dir": msg.model_dir, "config": msg.config,
                "source": list(msg.source), "state_dir": msg.state_dir}
        return await self._command(
            self._turn_of.pop(id(env)), Command.SWAP_IN,
            self._with_spec(Command.SWAP_IN, spec,
                            lambda g: g.swap_in(spec, msg.tensors, msg.meta)),
            check=lambda: TrainerConfig(**msg.config))  # a bad config: refused, no broadcast

    @handler(SendWeights, concurrent=True)
    async def on_send_weights(self, msg: SendWeights, env: Envelope) -> WeightUpdateDone:
        from flexmarl.weights.direct import free_port

        # The group's rendezvous is on this machine, at the host the instances reach us at.
        host = self.address.removeprefix("tcp://").rpartition(":")[0] \
            if self.address.startswith("tcp://") else "127.0.0.1"
        spec = {"version": msg.version, "instances": list(msg.instances),
                "backend": msg.backend, "tensor_parallel_size": msg.tensor_parallel_size,
                "dtype": msg.dtype, "timeout_s": msg.timeout_s, "host": host,
                "port": free_port(host)}
        return await self._command(
            self._turn_of.pop(id(env)), Command.SEND_WEIGHTS,
            self._with_spec(Command.SEND_WEIGHTS, spec, lambda g: g.send_weights(spec)))

    @handler(SwapOut, concurrent=True)
    async def on_swap_out(self, msg: SwapOut, env: Envelope) -> Parked:
        return await self._command(self._turn_of.pop(id(env)), Command.SWAP_OUT,
                                   self._lead(Command.SWAP_OUT))

    @handler(DropParked, concurrent=True)
    async def on_drop_parked(self, msg: DropParked, env: Envelope) -> None:
        await self._command(self._turn_of.pop(id(env)), Command.DROP,
                            self._with_spec(Command.DROP, msg.agent,
                                            lambda g: g.drop(msg.agent)))

    @handler(ExportState, concurrent=True)
    async def on_export_state(self, msg: ExportState, env: Envelope) -> TrainState:
        return await self._command(self._turn_of.pop(id(env)), Command.EXPORT_STATE,
                                   self._lead(Command.EXPORT_STATE))

    @handler(ExportWeights, concurrent=True)
    async def on_export(self, msg: ExportWeights, env: Envelope) -> WeightUpdate:
        update: WeightUpdate = await self._command(self._turn_of.pop(id(env)), Command.EXPORT,
                                                   self._lead(Command.EXPORT))
        if not msg.publish:
            return update
        # Written outside the command thread: the exported tensors are copies (never the live
        # parameters), so the slot goes on with its next command meanwhile.
        source = await asyncio.to_thread(published.publish, update.tensors, msg.publish,
                                         self.group.agent, update.version, self.address)
        self._published.add(msg.publish)
        return WeightUpdate(update.version, {}, complete=update.complete,
                            adapter=update.adapter, lora=update.lora, source=source)

    @handler(FetchWeights, concurrent=True)
    async def on_fetch_weights(self, msg: FetchWeights, env: Envelope) -> WeightUpdate:
        """A version this process published, for an instance on another host (copied under
        the file's lock, sent as tensor frames straight to it): only a file this process
        wrote, checked by identity (flexmarl.weights.ownership), never any other path."""
        try:
            version, tensors = await asyncio.to_thread(published.serve, msg.path)
        except FileNotFoundError as exc:
            raise FileNotFoundError(f"{msg.path} is not weights this trainer published (or "
                                    f"they were pruned: the instance loads a newer version): "
                                    f"{exc}") from None
        return WeightUpdate(version, tensors)

    @handler(FetchShards, concurrent=True)
    async def on_fetch_shards(self, msg: FetchShards, env: Envelope) -> ShardData:
        return self.group.serve_shards(msg)

    @handler(SlotStatus)
    async def on_status(self, msg: SlotStatus, env: Envelope) -> SlotStatusReply:
        running = self._running
        return SlotStatusReply(
            agent=self.group.agent if self.group.trainer is not None else "",
            parked=sorted(list(self.group.parked)), running=running[0] if running else "",
            running_s=time.monotonic() - running[1] if running else 0.0,
            queued=list(self._in_thread) + self.turns.waiting)

    async def keepalive_loop(self) -> None:
        try:
            await self.group.ready
        except Exception:
            return  # nothing to keep alive; each request reports the start failure
        interval_s = self.group.timeout_s / KEEPALIVE_FRACTION
        while True:
            await asyncio.sleep(max(0.0, self._last_command + interval_s - time.monotonic()))
            if self._stopped_group:
                return
            if time.monotonic() - self._last_command >= interval_s:
                # In line like any command (a whole broadcast of its own, so it cannot split
                # another's). A failure here means a broken group: let it end the process,
                # so the supervisor reports the death instead of requests failing one by one.
                await self._command(self.turns.take("KEEPALIVE"), Command.KEEPALIVE,
                                    self._lead(Command.KEEPALIVE))

    async def on_drain(self) -> None:
        for run in self._published:  # this process's files only: other slots' stay served
            published.remove_own(run)
        if self._stopped_group:
            return
        # Taken now, synchronously: STOP goes after every command accepted before draining.
        turn = self.turns.take("STOP")
        try:
            await asyncio.wait_for(self._command(turn, Command.STOP, self._lead(Command.STOP)),
                                   self.group.drain_timeout_s)
        except Exception as exc:  # a dead follower or a failed start: exit regardless
            log.warning("trainer rank 0: clean group stop failed (%s: %s)",
                        type(exc).__name__, exc)
            turn.release()  # if wait_for gave up before _command ever ran


class TrainerFollower(Actor):
    """Rank > 0: mirrors rank 0's calls; its own mailbox only refuses training commands."""

    def __init__(self, ctx: WorkerContext) -> None:
        super().__init__(ctx.name, ctx.bind, transport=ctx.transport)
        self.group = Rank(ctx.args)
        self._done = self.group.thread.submit(self._follow)

    def _follow(self) -> None:
        g = self.group
        if not g.started:  # init failed; the ready future carries why
            return
        header = torch.empty(HEADER_LEN, dtype=torch.int64, device=g.device)
        while True:
            cmd_code, a, b, c = g.broadcast(header).tolist()
            cmd = Command(cmd_code)
            mb = _unpack(g, a, b, c) if cmd is Command.MICRO_BATCH else None
            try:
                if cmd in (Command.SWAP_IN, Command.DROP, Command.SEND_WEIGHTS,
                           Command.SAVE_STATE):
                    blob = g.broadcast(torch.empty(a, dtype=torch.uint8, device=g.device))
                    spec = json.loads(bytes(blob.cpu().numpy()))
                    if cmd is Command.SWAP_IN:
                        g.swap_in(spec, {}, {})
                    elif cmd is Command.DROP:
                        g.drop(spec)
                    elif cmd is Command.SAVE_STATE:
                        g.save_state(spec)
                    else:
                        g.send_weights(spec)
                    continue
                g.execute(cmd, mb, a)
            except Exception as exc:  # rank 0 failed alike and told its client, with traceback
                log.warning("trainer rank %d: %s failed: %s: %s", g.rank, cmd.name,
                            type(exc).__name__, exc)
            if cmd is Command.STOP:
                return

    async def on_start(self) -> None:
        self.group.address, self.group.transport = self.address, self.transport

    @handler(FetchShards, concurrent=True)
    async def on_fetch_shards(self, msg: FetchShards, env: Envelope) -> ShardData:
        return self.group.serve_shards(msg)

    async def follow_loop(self) -> None:
        try:
            await self.group.ready
        except Exception:
            log.exception("trainer rank %d failed to start", self.group.rank)
            raise
        await self._done
        self.stop()  # rank 0 ended the group: nothing is left to do here

    async def on_drain(self) -> None:
        try:
            await asyncio.wait_for(asyncio.shield(self._done), self.group.drain_timeout_s)
        except Exception as exc:  # rank 0 is gone or hung: exit without the clean barrier
            log.warning("trainer rank %d: rank 0 did not stop the group (%s)", self.group.rank,
                        type(exc).__name__)

    on_begin_batch = _refusing(TrainBeginBatch)
    on_micro_batch = _refusing(TrainMicroBatch)
    on_step = _refusing(TrainStep)
    on_export = _refusing(ExportWeights)
    on_fetch_weights = _refusing(FetchWeights)
    on_swap_in = _refusing(SwapIn)
    on_swap_out = _refusing(SwapOut)
    on_drop_parked = _refusing(DropParked)
    on_export_state = _refusing(ExportState)
    on_send_weights = _refusing(SendWeights)
    on_save_state = _refusing(SaveState)
    on_await_saved = _refusing(AwaitSaved)


def _check_num_tokens(msg: TrainBeginBatch | TrainStep) -> None:
    if msg.num_tokens < 0:
        raise ValueError(f"{type(msg).__name__}.num_tokens must be > 0, or 0 (TrainBeginBatch: "
                         f"declared at TrainStep; TrainStep: as declared), got {msg.num_tokens}")


def _check_micro_batch(mb: TrainMicroBatch) -> None:
    if mb.input_ids.dim() != 2 or mb.input_ids.shape[0] < 1:
        raise ValueError(f"TrainMicroBatch.input_ids must be [rows >= 1, T], got "
                         f"{tuple(mb.input_ids.shape)}")
    shape = tuple(mb.input_ids.shape)
    for name in ("attention_mask", "response_mask", "old_logprobs", "ref_logprobs"):
        t = getattr(mb, name)
        if t is not None and tuple(t.shape) != shape:
            raise ValueError(f"TrainMicroBatch.{name} has shape {tuple(t.shape)}, input_ids "
                             f"{shape}")
    if tuple(mb.advantages.shape) != shape[:1]:
        raise ValueError(f"TrainMicroBatch.advantages must be [rows]={shape[:1]}, got "
                         f"{tuple(mb.advantages.shape)}")
    if mb.sampling is not None and tuple(mb.sampling.shape) != (shape[0], 3):
        raise ValueError(f"TrainMicroBatch.sampling must be [rows, 3]=({shape[0]}, 3) "
                         f"(temperature, top_k, top_p), got {tuple(mb.sampling.shape)}")


def _flags(mb: TrainMicroBatch) -> int:
    return int(mb.ref_logprobs is not None) | (2 if mb.sampling is not None else 0)


def _pack(mb: TrainMicroBatch, device: torch.device) -> list[torch.Tensor]:
    """The micro-batch as broadcastable tensors: ints [3,B,T], floats [k,B,T], adv [B] and,
    with flag 2, sampling [B,3]."""
    ints = torch.stack([mb.input_ids.long(), mb.attention_mask.long(), mb.response_mask.long()])
    floats = [mb.old_logprobs.float()] + ([mb.ref_logprobs.float()] if mb.ref_logprobs is not None
                                          else [])
    out = [ints.to(device), torch.stack(floats).to(device), mb.advantages.float().to(device)]
    if mb.sampling is not None:
        out.append(mb.sampling.float().contiguous().to(device))
    return out


def _unpack(g: Rank, rows: int, width: int, flags: int) -> TrainMicroBatch:
    has_ref = bool(flags & 1)
    ints = g.broadcast(torch.empty(3, rows, width, dtype=torch.int64, device=g.device))
    floats = g.broadcast(torch.empty(1 + has_ref, rows, width, dtype=torch.float32,
                                     device=g.device))
    adv = g.broadcast(torch.empty(rows, dtype=torch.float32, device=g.device))
    sampling = (g.broadcast(torch.empty(rows, 3, dtype=torch.float32, device=g.device))
                if flags & 2 else None)
    return TrainMicroBatch(input_ids=ints[0], attention_mask=ints[1], response_mask=ints[2],
                           old_logprobs=floats[0], advantages=adv,
                           ref_logprobs=floats[1] if has_ref else None, sampling=sampling)


def trainer_worker(ctx: WorkerContext) -> Actor:
    """Supervisor entry point: rank 0 serves clients, other ranks follow it."""
    rank = int(ctx.args.get("rank", -1))
    return TrainerWorker(ctx) if rank == 0 else TrainerFollower(ctx)
