"""One rank of a trainer slot (flexmarl.training.worker serves it): its process group, its
GRPOTrainer, and the calls every rank of the group makes in step, in its command thread: swap
in (parked here, pulled from another slot's ranks, restored, fresh) and out, shards served to
other slots, the direct weight send, and the training commands rank 0 replays (`execute`).
LoRA agents swap their adapter state on the slot's resident base (`Rank.base`).

Blocking torch.distributed calls live in the CommandThread (a daemon thread), never on the
event loop; a pull runs on the event loop while the thread waits.
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

from flexmarl.config.training import TrainerConfig
from flexmarl.protocol import (FetchShards, Parked, ShardData, StateSaved, SwapDone,
                               TrainMicroBatch, TrainState, WeightUpdate, WeightUpdateDone)
from flexmarl.training import sharded_state
from flexmarl.training.sharded_state import StateWriter
from flexmarl.training.parking import (HostPool, HostState, ResidentBase, base_key, fill, park,
                                       populate, prepare_pull, pull_pieces, restore_parked,
                                       set_rng, sharded_here, slices, unpark)
from flexmarl.training.trainer import GRPOTrainer
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
    SEND_WEIGHTS = 13  # a = bytes of the JSON spec (flexmarl.weights.direct) that follows
    SAVE_STATE = 14  # a = bytes of the JSON spec {tmp, path, step} that follows


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


class Rank:
    """What every rank of a slot does: the command thread, process group set-up, the trainer."""

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
        self.pool = HostPool()
        """Host buffers of parked agents, reused across swaps (pinned once the device is
        known to be a GPU)."""
        self.release_memory = True
        """Whether a park hands freed GPU memory back to the driver (parking.park)."""
        self.base: ResidentBase | None = None
        """The frozen base of this slot's LoRA agents, kept while they swap (only their
        adapters and AdamW states move); freed by a SwapIn that needs another base or a full
        model. At most one: the slot's device holds one model at a time, as before."""
        self.address = ""
        """This rank's actor address (set once it serves): where other slots pull from."""
        self.transport = None
        self.loop = asyncio.get_running_loop()
        self.device = torch.device("cpu")
        self.placed = ""
        """Device, process-group backend and visible GPUs (SwapDone.device)."""
        self.sender = None
        """Direct weight sync's trainer engine (flexmarl.weights.direct), made at first use."""
        self.writer: StateWriter | None = None
        """This rank's state writes (SaveState), on a gloo group of their own (made at start)."""
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
            self.pool = HostPool(pin=True)
            if args.get("memory_fraction"):  # devices.colocate: the engine has the rest
                torch.cuda.set_per_process_memory_fraction(float(args["memory_fraction"]),
                                                           self.device)
            # Beside an engine that sized itself at start (devices.colocate, not time-shared):
            # parked memory stays in torch's cache (parking.park's `release`).
            self.release_memory = not args.get("keep_parked_memory")
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
        # Background state writes run their collectives beside the command thread's: on a
        # group of their own (gloo: DCP's planning exchanges CPU objects).
        self.writer = StateWriter(self.rank, dist.new_group(backend="gloo", timeout=timeout))
        if args.get("model_dir"):
            spec = {"model_dir": args["model_dir"], "agent": self.agent}
            self.trainer = self._new_trainer(spec, self.config)
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
        host = self.parked.get(agent)
        try:
            if self.base is not None and (config.lora is None or self.base.key != base_key(
                    spec["model_dir"], config, self.world_size)):
                # A full model, or an adapter on another base or settings: the slot's device
                # holds one model, so the resident base goes first (as a full agent's does).
                self.base, base = None, self.base
                base.release(self.release_memory)
            # Every rank parked it (or none did): the same branch on every rank.
            if host is not None and host.trainer is None:
                # A LoRA agent's adapter state, parked here: onto the resident base (rebuilt if
                # it went meanwhile); its host copy is freed once every rank has it back.
                trainer = self._new_trainer(spec, config)
                restore_parked(trainer, host)
                num_bytes, how = host.num_bytes, "here"
            elif host is not None:
                num_bytes = host.num_bytes
                trainer, how = unpark(self.parked.pop(agent), self.pool), "here"
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
        if host is not None and host.trainer is None:
            self.drop(agent)  # restored on every rank: its host copy goes
        self.trainer, self.agent = trainer, agent
        return SwapDone(num_bytes=total, seconds=time.perf_counter() - started, how=how,
                        device=self.placed)

    def _restore(self, spec: dict[str, Any], tensors: dict, meta: dict
                 ) -> tuple[GRPOTrainer, int, str]:
        """A fresh trainer from model_dir and, with a saved state's dir (a snapshot or a
        checkpoint: every rank reads its own rows) or a whole TrainState (rank 0 has it),
        that state restored on every rank."""
        from flexmarl.training.trainer import load_state

        trainer = self._new_trainer(spec, self.config)
        if spec.get("state_dir"):
            return self._read_saved(trainer, spec["state_dir"])
        if self.world_size > 1:  # every rank gets the full state, then keeps its shards
            tensors, meta = self._broadcast_state(tensors, meta)
        if not tensors:
            return trainer, 0, "fresh"
        load_state(trainer, tensors, meta)
        # Each rank counts its share: the sum is the state's bytes, once.
        mine = sum(t.numel() * t.element_size() for t in tensors.values())
        return trainer, mine if self.rank == 0 else 0, "restored"

    def _read_saved(self, trainer: GRPOTrainer, path: str) -> tuple[GRPOTrainer, int, str]:
        """Restore a saved state dir (flexmarl.training.state_files; every rank sees it)."""
        from flexmarl.training.state_files import read_record
        from flexmarl.training.trainer import load_state

        record, tensors = read_record(path)
        if tensors is not None:  # format 1: one file; every rank maps it, keeps its shards
            if not tensors:  # saved before the agent's first update
                return trainer, 0, "fresh"
            load_state(trainer, tensors, record["meta"])
            n = sum(t.numel() * t.element_size() for t in tensors.values())
            return trainer, n if self.rank == 0 else 0, "restored"
        if not record["files"]:  # saved before the agent's first update
            return trainer, 0, "fresh"
        # On the default group, in this (the command) thread: a restore on the writes' group
        # was seen to hang in a replaced slot (DCP's planning all_gather), not understood yet.
        return trainer, sharded_state.read(trainer, path, record["meta"], None), "restored"

    def _broadcast_state(self, tensors: dict, meta: dict) -> tuple[dict, dict]:
        """Rank 0's whole state on every rank (the restore path only, never a swap): a JSON
        index (names, shapes, dtypes, meta) as bytes, then each tensor (no pickle)."""
        index = json.dumps({"meta": meta, "tensors": [
            [k, list(t.shape), str(t.dtype).removeprefix("torch.")] for k, t in tensors.items()]})
        # Through this rank's device: NCCL broadcasts only CUDA tensors (gloo: the CPU, as is).
        size = self.broadcast(torch.tensor([len(index.encode())], dtype=torch.int64,
                                           device=self.device))
        blob = (torch.frombuffer(bytearray(index.encode()), dtype=torch.uint8).to(self.device)
                if self.rank == 0 else torch.empty(int(size.item()), dtype=torch.uint8,
                                                   device=self.device))
        spec = json.loads(bytes(self.broadcast(blob).cpu().numpy()))
        out = {}
        for name, shape, dtype in spec["tensors"]:
            t = (tensors[name].contiguous().to(self.device) if self.rank == 0
                 else torch.empty(shape, dtype=getattr(torch, dtype), device=self.device))
            out[name] = self.broadcast(t).cpu()
        return out, spec["meta"]

    def _new_trainer(self, spec: dict[str, Any], config: TrainerConfig, *,
                     empty: bool = False) -> GRPOTrainer:
        """A fresh trainer of the agent, as GRPOTrainer(model_dir, config) builds it (`empty`:
        see GRPOTrainer). With trainer.lora on this rank's resident base (swap_in has freed one
        of another key): its modules taken, nothing built or read, the adapter and RNG set as
        a fresh trainer's (ResidentBase.start); without one, built from the model dir (the
        base read, never `empty`: a pull brings the adapter only) and kept as the resident."""
        if config.lora is None:
            return GRPOTrainer(spec["model_dir"], config, empty=empty, agent=spec["agent"])
        if self.base is not None:
            trainer = GRPOTrainer(spec["model_dir"], config, agent=spec["agent"],
                                  base=self.base.trainer)
            self.base.start(trainer)
            return trainer
        trainer = GRPOTrainer(spec["model_dir"], config, agent=spec["agent"])
        self.base = ResidentBase.of(trainer, base_key(spec["model_dir"], config,
                                                      self.world_size))
        return trainer

    def _pull(self, spec: dict[str, Any]) -> tuple[GRPOTrainer, int]:
        """The agent's modules built empty (with trainer.lora: a trainer on the resident base),
        then every tensor of this rank's state filled from the source slot's ranks (run on
        the event loop; this thread waits); the bytes pulled."""
        trainer = self._new_trainer(spec, self.config, empty=True)
        num_bytes = asyncio.run_coroutine_threadsafe(
            self._pull_shards(trainer, spec["agent"], list(spec["source"])), self.loop).result()
        return trainer, num_bytes

    async def _pull_shards(self, trainer: GRPOTrainer, agent: str, source: list[str]) -> int:
        conns = [connect(address, self.transport) for address in source]
        try:
            head: ShardData = await conns[0].request(FetchShards(agent), timeout_s=self.timeout_s)
            tensors = prepare_pull(trainer, head.layout, head.meta)
            by_rank = pull_pieces(head.layout, sharded_here(trainer), len(source), self.world_size,
                             self.rank)

            async def one(w: int, batch: list[list]) -> int:
                async with in_flight[w]:
                    got: ShardData = await conns[w].request(FetchShards(agent, batch),
                                                            timeout_s=self.timeout_s)
                return fill(tensors, batch, got.tensors)

            # A few requests in flight per source rank: its serving, the socket and this
            # rank's copies overlap; so does faulting in the new tensors' pages, in bulk.
            in_flight = {w: asyncio.Semaphore(PULL_IN_FLIGHT) for w in by_rank}
            storages = [t.untyped_storage() for t in tensors.values()]
            *pulled, _ = await asyncio.gather(*(one(w, batch) for w, pieces in by_rank.items()
                                                for batch in _batches(pieces, head.layout)),
                                              asyncio.to_thread(populate, storages))
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
        if host is not None and host.mid_batch:
            raise RuntimeError(f"agent {msg.agent} was parked in the middle of a global batch "
                               "(time-shared): its accumulated gradient is only unparked in "
                               "place, not pulled into another slot")
        if host is None:
            raise ValueError(f"agent {msg.agent!r} is not parked on trainer rank {self.rank} "
                             f"({self.address}); parked here: {sorted(self.parked) or 'none'}")
        if not msg.pieces:
            return ShardData(dict(host.rng), host.layout, host.meta)
        return ShardData(slices(host, msg.pieces))

    def drop(self, agent: str) -> None:
        """Drop this rank's host copy of a parked agent (it moved to another slot): its
        buffer back to the pool."""
        host = self.parked.pop(agent, None)
        if host is not None and host.buffer is not None:
            self.pool.give(host.buffer)  # kept for this slot's next park

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
            if tr.config.lora is not None and tr._normaliser is not None:
                raise RuntimeError(f"SwapOut of {self.agent} in the middle of a global batch: "
                                   "a LoRA trainer parks between steps only (LoRA agents are "
                                   "never time-shared)")
            host = park(tr, self.pool, release=self.release_memory)
        except Exception as exc:
            error, host = exc, None
        ranks, total, failed = self._gather(host.num_bytes if host else 0, error is not None)
        if failed:
            if host is not None:
                unpark(host, self.pool)
            raise error or RuntimeError("SwapOut: another rank of this trainer group failed "
                                        "(its log says why); the agent stays in the slot")
        if tr.config.lora is not None:
            # Its adapter state alone is parked (the base stays: self.base); it comes back
            # onto whichever trainer holds the base then, so the object is not kept.
            host.trainer = None
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
        from flexmarl.weights.direct import Sender

        tr = self._bound("SendWeights")
        if tr.config.lora is not None:  # the same on every rank: refused before any collective
            raise RuntimeError(f"SendWeights: {self.agent} trains a LoRA adapter, which syncs "
                               'staged (rollout.weight_transfer = "stage": ExportWeights)')
        if tr.version != spec["version"]:
            raise RuntimeError(f"SendWeights of version {spec['version']} but the trainer of "
                               f"{self.agent} holds version {tr.version}")
        if self.sender is None:
            self.sender = Sender(self.rank, self.loop, self.transport, self.timeout_s)
        tied = bool(getattr(tr.model.config, "tie_word_embeddings", False))
        num_bytes, seconds = self.sender.send(tr.model, spec, tied)
        return WeightUpdateDone(tr.version, num_bytes, seconds)

    def save_state(self, spec: dict[str, Any]) -> StateSaved:
        """Stage the bound agent's state and start writing it (SaveState; a collective), or
        with spec["model_dir"], write its weights as a model directory (rank 0)."""
        if spec.get("model_dir"):
            return sharded_state.write_model(self._bound("SaveState"), self.agent, spec)
        return self.writer.save(self._bound("SaveState"), self.agent, spec)

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
            if self.writer is not None:
                self.writer.wait()  # a write in flight ends before its process group goes
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
            # A LoRA trainer's tensors are its adapter's, named for the agent (the adapter an
            # engine serves for it, Generate.adapter).
            lora = tr.config.lora
            return WeightUpdate(version=tr.version, tensors=tr.export_weights(),
                                complete=not tr.config.train_layers,
                                adapter=self.agent if lora is not None else None, lora=lora)
        raise AssertionError(f"unhandled command {cmd!r}")



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
