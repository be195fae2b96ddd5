"""Trainer worker: one agent's GRPOTrainer group (N processes) served as actors over the runtime.

Every rank is a worker process started by `runtime.supervisor.Supervisor` with entry point
`flexmarl.training.worker:trainer_worker` and WorkerSpec.args {"rank", "world_size",
"init_method" (e.g. file:///tmp/x/store, a FileStore the caller owns), "config" (TrainerConfig
fields: the slot's device and process group come from it), optional "model_dir" and "agent"
(its name: needed to park it), "collective_timeout_s", "drain_timeout_s", "num_threads",
"memory_fraction" (of its GPU, when it shares it with an engine)}.
Without model_dir the group is an empty trainer slot: SwapIn binds it to an agent, SwapOut
parks it. Clients talk to rank 0 only; rank 0 replays each command to the followers with
torch.distributed broadcasts of plain tensors (no pickle), so every rank makes the same
GRPOTrainer calls in the same order:

    client ──TrainMicroBatch──► rank 0: TrainerWorker mailbox_loop (asyncio; heartbeats go on)
                                  │ await command thread (one at a time, in arrival order)
                                  ▼
            rank 0 command thread                        rank r > 0 follower thread
            broadcast header [cmd, a, b, c] ──────────► header: which call, which shapes
            broadcast ints, floats, advantages ───────► the micro-batch's tensors
            trainer.accumulate(mb) ◄── FSDP collectives ──► trainer.accumulate(mb)
                                  │
    client ◄──TrainStats─────── reply

Swaps (the one swap path; flexmarl.training.parking.park/unpark/pull_plan):

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

Every rank's actor serves FetchShards for the agents parked on it, concurrently with whatever
its group is doing (the parked copies are never written). A pull runs on the rank's event
loop while its command thread waits, so two slots pulling from each other cannot deadlock.
Followers' actors otherwise refuse training commands, and stop when rank 0 broadcasts STOP. Blocking torch.distributed calls live in
a daemon thread per process, never on the event loop. While idle, rank 0 broadcasts a KEEPALIVE
every collective_timeout_s / KEEPALIVE_FRACTION, so waiting followers never hit the collective
timeout. Shutdown: rank 0's drain broadcasts STOP, all ranks meet at a barrier and destroy the
process group; the followers' actors then stop on their own.
"""
from __future__ import annotations

import asyncio
import importlib
import json
import logging
import math
import os
import queue
import threading
import time
from datetime import timedelta
from enum import IntEnum
from typing import Any, Callable

import torch
import torch.distributed as dist

from runtime.actor import Actor, handler
from runtime.codec import Envelope
from runtime.worker import WorkerContext
from flexmarl.protocol import (DropParked, ExportState, ExportWeights, FetchShards, Parked,
                               SendWeights, ShardData, SwapDone, SwapIn, SwapOut,
                               TrainBeginBatch, TrainMicroBatch, TrainState, TrainStats,
                               TrainStep, TrainStepDone, WeightUpdate, WeightUpdateDone)
from flexmarl.training.parking import (HostState, fill, park, prepare_pull, pull_plan,
                                       set_rng, sharded_here, slices, unpark)
from flexmarl.training.trainer import GRPOTrainer, TrainerConfig
from runtime.transport import connect

log = logging.getLogger(__name__)

DEFAULT_COLLECTIVE_TIMEOUT_S = 1800.0
"""torch.distributed's own default for gloo: how long one collective may wait for a peer."""
KEEPALIVE_FRACTION = 4
"""Idle followers hear from rank 0 this many times per collective timeout."""
DEFAULT_DRAIN_TIMEOUT_S = 10.0
"""How long shutdown waits for the STOP broadcast and barrier, unless args "drain_timeout_s"
says (a run passes supervisor.stop_timeout_s); past it the process exits anyway."""
HEADER_LEN = 4
ADDRESS_BYTES = 512
"""Room for one rank's address in the all-gather that a SwapOut makes."""
PULL_BATCH_BYTES = 16 << 20
PULL_BATCH_PIECES = 1024
PULL_IN_FLIGHT = 4
"""One FetchShards asks for at most this much (well under transport.max_message_bytes and
max_frames); up to PULL_IN_FLIGHT of them at a time per source rank, all sources at once."""


class Command(IntEnum):
    """Codes of the int64 header that rank 0 broadcasts before each call."""

    BEGIN_BATCH = 1  # a = num_tokens (0: declared at STEP)
    MICRO_BATCH = 2  # a = rows, b = T, c = flags: 1 ref_logprobs follow, 2 sampling follows
    STEP = 3  # a = num_tokens if BEGIN_BATCH deferred it
    EXPORT = 4
    KEEPALIVE = 7
    STOP = 8
    SWAP_IN = 9  # a = bytes of the JSON spec {agent, model_dir, config} that follows
    SWAP_OUT = 10
    EXPORT_STATE = 11
    DROP = 12  # a = bytes of the agent's name that follows
    SEND_WEIGHTS = 13  # a = bytes of the JSON spec (flexmarl.training.transfer) that follows


class CommandThread:
    """Runs blocking calls one at a time in a daemon thread; `submit` returns an asyncio future.

    A daemon thread, not an executor: a thread stuck in a collective whose peer died must not
    keep the process alive at exit (executors join their threads).
    """

    def __init__(self, name: str) -> None:
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[[], Any]) -> asyncio.Future:
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._jobs.put((fn, loop, fut))
        return fut

    def _run(self) -> None:
        while True:
            fn, loop, fut = self._jobs.get()
            try:
                result, error = fn(), None
            except BaseException as exc:  # handed to the awaiting coroutine
                result, error = None, exc
            try:
                loop.call_soon_threadsafe(_settle, fut, result, error)
            except RuntimeError:  # the loop has closed: nobody is waiting any more
                return


def _settle(fut: asyncio.Future, result: Any, error: BaseException | None) -> None:
    if fut.cancelled():
        return
    if error is not None:
        fut.set_exception(error)
    else:
        fut.set_result(result)


class _Rank:
    """What every rank shares: the command thread, process group set-up and the trainer."""

    def __init__(self, args: dict[str, Any]) -> None:
        missing = [k for k in ("rank", "world_size", "init_method") if k not in args]
        if missing:
            raise ValueError(f"trainer worker args lack {missing}; WorkerSpec.args needs "
                             "rank, world_size, init_method (and model_dir and config, or none "
                             "for an empty slot that a SwapIn binds to an agent)")
        self.rank, self.world_size = int(args["rank"]), int(args["world_size"])
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"trainer worker rank {self.rank} is not in [0, world_size="
                             f"{self.world_size})")
        self.config = TrainerConfig(**args.get("config", {}))
        self.timeout_s = float(args.get("collective_timeout_s", DEFAULT_COLLECTIVE_TIMEOUT_S))
        self.drain_timeout_s = float(args.get("drain_timeout_s", DEFAULT_DRAIN_TIMEOUT_S))
        self.trainer: GRPOTrainer | None = None
        self.started = False
        self.agent = str(args.get("agent", ""))
        self.parked: dict[str, HostState] = {}
        """Agents parked in this slot: this rank's shards in host memory (read by the event
        loop's FetchShards handler, written by the command thread)."""
        self.address = ""
        """This rank's actor address (set once it serves): where other slots pull from."""
        self.transport = None
        self.loop = asyncio.get_running_loop()
        self.device = torch.device("cpu")
        self.placed = ""
        """Device, process-group backend and visible GPUs (SwapDone.device)."""
        self.sender = None
        """Direct weight sync's trainer engine (flexmarl.training.transfer), made at first use."""
        self.thread = CommandThread(f"trainer-rank{self.rank}")
        self.ready = self.thread.submit(lambda: self._init(args))

    def _init(self, args: dict[str, Any]) -> None:
        importlib.import_module("transformers.models.auto.modeling_auto")  # seconds: not at SwapIn

        if args.get("num_threads"):
            torch.set_num_threads(int(args["num_threads"]))
        if self.config.device == "cuda":
            if not torch.cuda.is_available():
                raise RuntimeError(
                    "trainer.device is 'cuda' but this trainer process sees no CUDA device "
                    f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '<unset>')}, "
                    f"torch {torch.__version__}); install a CUDA build of torch (make "
                    "TORCH=torch EXTRAS=dev,gpu setup) or set trainer.device = 'cpu'")
            # The placement gives each rank its own GPU (CUDA_VISIBLE_DEVICES: it is device
            # 0 here); without one, ranks of a machine share its GPUs in rank order.
            torch.cuda.set_device(self.rank % torch.cuda.device_count())
            self.device = torch.device("cuda", torch.cuda.current_device())
            if args.get("memory_fraction"):  # devices.colocate: the engine has the rest
                torch.cuda.set_per_process_memory_fraction(float(args["memory_fraction"]),
                                                           self.device)
        backend = "nccl" if self.config.device == "cuda" else "gloo"
        self.placed = (f"{self.device} {backend} visible="
                       f"{os.environ.get('CUDA_VISIBLE_DEVICES', 'all')}")
        timeout = timedelta(seconds=self.timeout_s)
        if args["init_method"].startswith("store://"):
            # Ranks on several nodes: the run hosts a TCPStore (store://HOST:PORT/PREFIX);
            # each group (and each replacement of it) has its own key prefix there.
            where, _, prefix = args["init_method"].removeprefix("store://").partition("/")
            host, _, port = where.rpartition(":")
            store = dist.TCPStore(host, int(port), is_master=False, timeout=timeout)
            dist.init_process_group(backend, store=dist.PrefixStore(prefix, store),
                                    rank=self.rank, world_size=self.world_size, timeout=timeout)
        else:
            dist.init_process_group(backend, init_method=args["init_method"], rank=self.rank,
                                    world_size=self.world_size, timeout=timeout)
        if args.get("model_dir"):
            self.trainer = GRPOTrainer(args["model_dir"], self.config)
        self.started = True

    def swap_in(self, spec: dict[str, Any], tensors: dict, meta: dict) -> SwapDone:
        """Bind this slot to the agent (a collective): its shards parked here back in place,
        pulled from spec["source"], restored from a whole state, or a fresh trainer. A rank
        that fails still meets the others at the end, so all of them fail alike and the
        group stays in step (the slot then stays empty)."""
        config = TrainerConfig(**spec["config"])
        if config.device != self.device.type:
            raise RuntimeError(f"SwapIn of {spec['agent']} with trainer.device = "
                               f"{config.device!r} into a slot started on {self.placed}: a "
                               "slot's device and process group are fixed at its start (its "
                               "worker args' config)")
        if self.trainer is not None:
            raise RuntimeError(f"slot holds agent {self.agent!r}; SwapOut before SwapIn")
        started = time.perf_counter()
        self.config = config
        agent = spec["agent"]
        error: Exception | None = None
        trainer, num_bytes, how = None, 0, ""
        try:
            if agent in self.parked:  # every rank parked it: the same branch on every rank
                num_bytes = self.parked[agent].num_bytes
                trainer, how = unpark(self.parked.pop(agent)), "here"
            elif spec.get("source"):
                (trainer, num_bytes), how = self._pull(spec), "pulled"
            else:
                trainer, num_bytes, how = self._restore(spec, tensors, meta)
        except Exception as exc:  # reported after the others have been told
            error = exc
        total, failed = self._agree(num_bytes, error is not None)
        if error is not None:
            raise error
        if failed:
            raise RuntimeError(f"SwapIn of {agent}: another rank of this trainer group failed "
                               "(its log says why); the slot stays empty")
        self.trainer, self.agent = trainer, agent
        return SwapDone(num_bytes=total, seconds=time.perf_counter() - started, how=how,
                        device=self.placed)

    def _restore(self, spec: dict[str, Any], tensors: dict, meta: dict
                 ) -> tuple[GRPOTrainer, int, str]:
        """A fresh trainer from model_dir and, with a whole TrainState (a snapshot or a
        checkpoint; rank 0 has it), that state restored on every rank."""
        from flexmarl.training.trainer import load_state

        trainer = GRPOTrainer(spec["model_dir"], self.config)
        if self.world_size > 1:  # every rank gets the full state, then keeps its shards
            tensors, meta = self._broadcast_state(tensors, meta)
        if not tensors:
            return trainer, 0, "fresh"
        load_state(trainer, tensors, meta)
        # Each rank counts its share: the sum is the state's bytes, once.
        mine = sum(t.numel() * t.element_size() for t in tensors.values())
        return trainer, mine if self.rank == 0 else 0, "restored"

    def _broadcast_state(self, tensors: dict, meta: dict) -> tuple[dict, dict]:
        """Rank 0's whole state on every rank (the restore path only, never a swap): a JSON
        index (names, shapes, dtypes, meta) as bytes, then each tensor (no pickle)."""
        index = json.dumps({"meta": meta, "tensors": [
            [k, list(t.shape), str(t.dtype).removeprefix("torch.")] for k, t in tensors.items()]})
        size = torch.tensor([len(index.encode())], dtype=torch.int64)
        dist.broadcast(size, src=0)
        blob = (torch.frombuffer(bytearray(index.encode()), dtype=torch.uint8)
                if self.rank == 0 else torch.empty(int(size.item()), dtype=torch.uint8))
        dist.broadcast(blob, src=0)
        spec = json.loads(bytes(blob.numpy()))
        out = {}
        for name, shape, dtype in spec["tensors"]:
            t = (tensors[name].contiguous() if self.rank == 0
                 else torch.empty(shape, dtype=getattr(torch, dtype)))
            dist.broadcast(t, src=0)
            out[name] = t
        return out, spec["meta"]

    def _pull(self, spec: dict[str, Any]) -> tuple[GRPOTrainer, int]:
        """The agent's modules built empty, then every tensor of this rank filled from the
        source slot's ranks (run on the event loop; this thread waits); the bytes pulled."""
        trainer = GRPOTrainer(spec["model_dir"], self.config, empty=True)
        num_bytes = asyncio.run_coroutine_threadsafe(
            self._pull_shards(trainer, spec["agent"], list(spec["source"])), self.loop).result()
        return trainer, num_bytes

    async def _pull_shards(self, trainer: GRPOTrainer, agent: str, source: list[str]) -> int:
        conns = [connect(address, self.transport) for address in source]
        try:
            head: ShardData = await conns[0].request(FetchShards(agent), timeout_s=self.timeout_s)
            tensors = prepare_pull(trainer, head.layout, head.meta)
            plan = pull_plan(head.layout, sharded_here(trainer), len(source), self.world_size,
                             self.rank)

            async def one(w: int, batch: list[list]) -> int:
                async with in_flight[w]:
                    got: ShardData = await conns[w].request(FetchShards(agent, batch),
                                                            timeout_s=self.timeout_s)
                return fill(tensors, batch, got.tensors)

            # A few requests in flight per source rank: its serving, the socket and this
            # rank's copies overlap.
            in_flight = {w: asyncio.Semaphore(PULL_IN_FLIGHT) for w in plan}
            pulled = await asyncio.gather(*(one(w, batch) for w, pieces in plan.items()
                                            for batch in _batches(pieces, head.layout)))
            set_rng(trainer, head.tensors)
        finally:
            for conn in conns:
                await conn.aclose()
        if trainer.device.type == "cuda":
            torch.cuda.synchronize(trainer.device)
        return sum(pulled)

    def serve_shards(self, msg: FetchShards) -> ShardData:
        """This rank's slices of a parked agent (no collective, no copy: host memory views)."""
        host = self.parked.get(msg.agent)
        if host is None:
            raise ValueError(f"agent {msg.agent!r} is not parked on trainer rank {self.rank} "
                             f"({self.address}); parked here: {sorted(self.parked) or 'none'}")
        if not msg.pieces:
            return ShardData(dict(host.rng), host.layout, host.meta)
        return ShardData(slices(host, msg.pieces))

    def drop(self, agent: str) -> None:
        """Free this rank's host copy of a parked agent (it moved to another slot)."""
        if self.parked.pop(agent, None) is not None and self.device.type == "cuda":
            torch.cuda.empty_cache()

    def swap_out(self) -> Parked:
        """Park the agent: this rank's shards to host memory, the slot empty. One collective,
        after the copy: every rank's address, bytes and success; if any rank failed, those that
        parked put their shards back, so the agent stays loaded on every rank."""
        started = time.perf_counter()
        tr = self._bound("SwapOut")
        if not self.agent:  # the same on every rank: refused before any collective
            raise RuntimeError("SwapOut of a trainer group started with a model_dir but no "
                               'agent name: give WorkerSpec.args "agent" to swap it')
        error: Exception | None = None
        try:
            host = park(tr)
        except Exception as exc:
            error, host = exc, None
        ranks, total, failed = self._gather(host.num_bytes if host else 0, error is not None)
        if failed:
            if host is not None:
                unpark(host)
            raise error or RuntimeError("SwapOut: another rank of this trainer group failed "
                                        "(its log says why); the agent stays in the slot")
        agent, self.agent, self.trainer = self.agent, "", None
        self.parked[agent] = host
        return Parked(agent, tr.version, total, time.perf_counter() - started, ranks)

    def _gather(self, n: int, failed: bool) -> tuple[list[str], int, bool]:
        """Every rank's actor address (rank order), the sum of `n` and whether any rank
        `failed`: one all-gather of fixed-size rows [address bytes, n, failed]."""
        mine = self.address.encode()
        if len(mine) > ADDRESS_BYTES:
            raise RuntimeError(f"trainer rank address {self.address!r} is longer than "
                               f"{ADDRESS_BYTES} bytes")
        if self.world_size == 1:
            return [self.address], n, failed
        row = torch.zeros(ADDRESS_BYTES + 16, dtype=torch.uint8)
        row[:len(mine)] = torch.frombuffer(bytearray(mine), dtype=torch.uint8)
        row[ADDRESS_BYTES:].view(torch.int64)[:] = torch.tensor([n, int(failed)])
        rows = [torch.zeros_like(row, device=self.device) for _ in range(self.world_size)]
        dist.all_gather(rows, row.to(self.device))
        rows = [r.cpu() for r in rows]
        counts = [r[ADDRESS_BYTES:].view(torch.int64).tolist() for r in rows]
        return ([bytes(r[:ADDRESS_BYTES].numpy()).rstrip(b"\0").decode() for r in rows],
                sum(c[0] for c in counts), any(c[1] for c in counts))

    def _agree(self, n: int, failed: bool) -> tuple[int, bool]:
        """The sum of `n` over the group's ranks, and whether any rank `failed`."""
        if self.world_size == 1:
            return n, failed
        t = torch.tensor([n, int(failed)], dtype=torch.int64, device=self.device)
        dist.all_reduce(t)
        return int(t[0]), bool(t[1])

    def send_weights(self, spec: dict[str, Any]) -> WeightUpdateDone:
        """The bound agent's weights straight to its rollout instances through vLLM's
        weight-transfer engine (a collective: every rank gathers each parameter in turn)."""
        from flexmarl.training.transfer import Sender

        tr = self._bound("SendWeights")
        if tr.version != spec["version"]:
            raise RuntimeError(f"SendWeights of version {spec['version']} but the trainer of "
                               f"{self.agent} holds version {tr.version}")
        if self.sender is None:
            self.sender = Sender(self.rank, self.loop, self.transport, self.timeout_s)
        tied = bool(getattr(tr.model.config, "tie_word_embeddings", False))
        num_bytes, seconds = self.sender.send(tr.model, spec, tied)
        return WeightUpdateDone(tr.version, num_bytes, seconds)

    def export_state(self) -> TrainState:
        """The agent's whole state (collective); the slot keeps it."""
        from flexmarl.training.trainer import export_state

        started = time.perf_counter()
        tr = self._bound("ExportState")
        tensors, meta = export_state(tr)
        return TrainState(self.agent, tr.version, tensors, meta,
                          seconds=time.perf_counter() - started)

    def _bound(self, call: str) -> GRPOTrainer:
        if self.trainer is None:
            raise RuntimeError(f"{call} sent to an empty trainer slot: SwapIn an agent first")
        return self.trainer

    def broadcast(self, t: torch.Tensor) -> torch.Tensor:
        dist.broadcast(t, src=0)
        return t

    def execute(self, cmd: Command, mb: TrainMicroBatch | None, arg: int) -> Any:
        """The GRPOTrainer call behind `cmd`, identical on every rank."""
        if cmd is Command.KEEPALIVE:
            return None
        if cmd is Command.STOP:
            dist.barrier()
            dist.destroy_process_group()
            return None
        if cmd is Command.SWAP_OUT:
            return self.swap_out()
        if cmd is Command.EXPORT_STATE:
            return self.export_state()
        tr = self._bound(cmd.name.lower())
        if cmd is Command.BEGIN_BATCH:
            return tr.begin_batch(arg)
        if cmd is Command.MICRO_BATCH:
            return tr.accumulate(mb)
        if cmd is Command.STEP:
            return tr.step(arg or None)
        if cmd is Command.EXPORT:
            return WeightUpdate(version=tr.version, tensors=tr.export_weights(),
                                complete=not tr.config.train_layers)
        raise AssertionError(f"unhandled command {cmd!r}")


def _refusing(msg_type: type) -> Callable:
    """A follower's handler for `msg_type`: an error reply that points at rank 0."""

    async def refuse(self: "TrainerFollower", msg: Any, env: Envelope) -> None:
        raise RuntimeError(f"{msg_type.__name__} sent to rank {self.group.rank} of a trainer "
                           "group: only rank 0 takes training commands; send them to rank 0's "
                           "address")

    refuse.__name__ = f"refuse_{msg_type.__name__}"
    return handler(msg_type)(refuse)


class TrainerWorker(Actor):
    """Rank 0: serves the training messages and replays each call to the followers."""

    def __init__(self, ctx: WorkerContext) -> None:
        super().__init__(ctx.name, ctx.bind, transport=ctx.transport)
        self.group = _Rank(ctx.args)
        self._last_command = time.monotonic()
        self._stopped_group = False

    async def _command(self, cmd: Command, mb: TrainMicroBatch | None = None, arg: int = 0) -> Any:
        await self.group.ready  # raises why the process group or the model failed to start
        if self._stopped_group:
            if cmd is Command.KEEPALIVE:
                return None
            raise RuntimeError("the trainer group has been stopped (its worker is shutting "
                               "down); start a new group")
        self._last_command = time.monotonic()
        if cmd is Command.STOP:
            self._stopped_group = True
        return await self.group.thread.submit(lambda: self._lead(cmd, mb, arg))

    def _lead(self, cmd: Command, mb: TrainMicroBatch | None, arg: int) -> Any:
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

    @handler(TrainBeginBatch)
    async def on_begin_batch(self, msg: TrainBeginBatch, env: Envelope) -> None:
        if msg.num_tokens < 0:
            raise ValueError(f"TrainBeginBatch.num_tokens must be > 0, or 0 to declare it at "
                             f"TrainStep; got {msg.num_tokens}")
        await self._command(Command.BEGIN_BATCH, arg=msg.num_tokens)

    @handler(TrainMicroBatch)
    async def on_micro_batch(self, msg: TrainMicroBatch, env: Envelope) -> TrainStats:
        _check_micro_batch(msg)  # before any broadcast: a bad batch must not desync the ranks
        return await self._command(Command.MICRO_BATCH, mb=msg)

    @handler(TrainStep)
    async def on_step(self, msg: TrainStep, env: Envelope) -> TrainStepDone:
        if msg.num_tokens < 0:
            raise ValueError(f"TrainStep.num_tokens must be >= 0, got {msg.num_tokens}")
        return await self._command(Command.STEP, arg=msg.num_tokens)

    async def on_start(self) -> None:
        self.group.address, self.group.transport = self.address, self.transport

    # Concurrent: a SwapIn may pull from a slot that pulls from this one at the same time, and
    # this mailbox must go on serving FetchShards meanwhile (the command thread keeps order).
    @handler(SwapIn, concurrent=True)
    async def on_swap_in(self, msg: SwapIn, env: Envelope) -> SwapDone:
        spec = {"agent": msg.agent, "model_dir": msg.model_dir, "config": msg.config,
                "source": list(msg.source)}
        TrainerConfig(**msg.config)  # a bad config is refused here, before any broadcast
        return await self._with_spec(Command.SWAP_IN, spec,
                                     lambda g: g.swap_in(spec, msg.tensors, msg.meta))

    async def _with_spec(self, cmd: Command, spec: Any, call: Callable[[_Rank], Any]) -> Any:
        """Broadcast `cmd` and its JSON `spec` to the followers, then `call` on this rank."""
        blob = json.dumps(spec).encode()
        await self.group.ready
        if self._stopped_group:
            raise RuntimeError("the trainer group has been stopped; start a new group")
        self._last_command = time.monotonic()

        def lead() -> Any:
            g = self.group
            if g.world_size > 1:
                g.broadcast(torch.tensor([int(cmd), len(blob), 0, 0],
                                         dtype=torch.int64, device=g.device))
                g.broadcast(torch.frombuffer(bytearray(blob), dtype=torch.uint8).to(g.device))
            return call(g)

        return await self.group.thread.submit(lead)

    @handler(SendWeights)
    async def on_send_weights(self, msg: SendWeights, env: Envelope) -> WeightUpdateDone:
        from flexmarl.training.transfer import free_port

        # The group's rendezvous is on this machine, at the host the instances reach us at.
        host = self.address.removeprefix("tcp://").rpartition(":")[0] \
            if self.address.startswith("tcp://") else "127.0.0.1"
        spec = {"version": msg.version, "instances": list(msg.instances),
                "backend": msg.backend, "tensor_parallel_size": msg.tensor_parallel_size,
                "dtype": msg.dtype, "host": host, "port": free_port(host)}
        return await self._with_spec(Command.SEND_WEIGHTS, spec, lambda g: g.send_weights(spec))

    @handler(SwapOut)
    async def on_swap_out(self, msg: SwapOut, env: Envelope) -> Parked:
        return await self._command(Command.SWAP_OUT)

    @handler(DropParked, concurrent=True)
    async def on_drop_parked(self, msg: DropParked, env: Envelope) -> None:
        await self._with_spec(Command.DROP, msg.agent, lambda g: g.drop(msg.agent))

    @handler(FetchShards, concurrent=True)
    async def on_fetch_shards(self, msg: FetchShards, env: Envelope) -> ShardData:
        return self.group.serve_shards(msg)

    @handler(ExportState)
    async def on_export_state(self, msg: ExportState, env: Envelope) -> TrainState:
        return await self._command(Command.EXPORT_STATE)

    @handler(ExportWeights)
    async def on_export(self, msg: ExportWeights, env: Envelope) -> WeightUpdate:
        return await self._command(Command.EXPORT)

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
                # A failure here means a broken group: let it end the process, so the
                # supervisor reports the death instead of requests failing one by one.
                await self._command(Command.KEEPALIVE)

    async def on_drain(self) -> None:
        if self._stopped_group:
            return
        try:
            await asyncio.wait_for(self._command(Command.STOP), self.group.drain_timeout_s)
        except Exception as exc:  # a dead follower or a failed start: exit regardless
            log.warning("trainer rank 0: clean group stop failed (%s: %s)",
                        type(exc).__name__, exc)


class TrainerFollower(Actor):
    """Rank > 0: mirrors rank 0's calls; its own mailbox only refuses training commands."""

    def __init__(self, ctx: WorkerContext) -> None:
        super().__init__(ctx.name, ctx.bind, transport=ctx.transport)
        self.group = _Rank(ctx.args)
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
                if cmd in (Command.SWAP_IN, Command.DROP, Command.SEND_WEIGHTS):
                    blob = g.broadcast(torch.empty(a, dtype=torch.uint8, device=g.device))
                    spec = json.loads(bytes(blob.cpu().numpy()))
                    if cmd is Command.SWAP_IN:
                        g.swap_in(spec, {}, {})
                    elif cmd is Command.DROP:
                        g.drop(spec)
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
    on_swap_in = _refusing(SwapIn)
    on_swap_out = _refusing(SwapOut)
    on_drop_parked = _refusing(DropParked)
    on_export_state = _refusing(ExportState)
    on_send_weights = _refusing(SendWeights)


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


def _batches(pieces: list[list], layout: dict[str, list]) -> list[list[list]]:
    """`pieces` in groups of at most PULL_BATCH_BYTES and PULL_BATCH_PIECES each."""
    out: list[list[list]] = [[]]
    size = 0
    for piece in pieces:
        name, lo, hi, _ = piece
        shape, dtype = layout[name][0], getattr(torch, layout[name][1])
        row = math.prod(shape[1:]) if shape else 1
        n = row * ((hi - lo) if hi >= 0 else (shape[0] if shape else 1))
        n *= torch.empty(0, dtype=dtype).element_size()
        if out[-1] and (size + n > PULL_BATCH_BYTES or len(out[-1]) >= PULL_BATCH_PIECES):
            out.append([])
            size = 0
        out[-1].append(piece)
        size += n
    return [b for b in out if b]


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


def _unpack(g: _Rank, rows: int, width: int, flags: int) -> TrainMicroBatch:
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
