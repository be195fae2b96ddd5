"""Direct weight sync (GPU): the trainer sends, through vLLM's own weight-transfer engines
(vllm.distributed.weight_transfer), the bytes going GPU to GPU and never through the run.
All three ends live here: the run's (DirectTransport), the trainer's (Sender, FanOut,
cast_source) and the instance's (engine_phase), with the choice of transport
(resolve_transfer).

    run: WeightSync.sync(agent, version, None) ─► DirectTransport.begin(agent, version, instances)
      send(None) ─► the agent's bound trainer slot: SendWeights(version, instance addresses)
    trainer, every rank of the slot (flexmarl.training.rank ─► Sender.send, in step):
      vLLM's trainer engine over the bound model, its parameters through cast_source
        ("nccl": rank 0 broadcasts to every instance's GPUs; "ipc": CUDA IPC handles of each
         rank's GPU, for instances colocated on their trainer's GPUs, flexmarl.weights.codec)
      rank 0's FanOut client ─► WeightTransfer phases to every instance at once (runtime transport)
    instance (RolloutWorker.on_weight_transfer ─► vllm_engine.transfer ─► engine_phase on AsyncLLM):
        init (once per group) ─► start (gate closed, running requests done) ─► update (receive,
        concurrently with the broadcast) ─► finish (serves `version`, gate open)
      finish() ─► SyncReport (the trainer's WeightUpdateDone: bytes, the whole transfer's time)
      abort() (the send failed) ─► WeightTransfer("abort") to every instance: one caught mid-update
        stops, and the pool replaces it with one that loads the served version

The staged path (flexmarl.weights.stage) stays the CPU path and what moved or replacement
instances load (WeightSync.load_into fetches the weights from the trainer: DirectTransport.
fetch). The zero-staleness gate is the rollout worker's, as for a staged update: an instance
takes no request between "start" and "finish", so no sample mixes two versions.

Bounded: a send has a deadline (SendWeights.timeout_s, rollout.request_timeout_s). Past it, or
as soon as one instance fails a phase (it died, timed out or refused), the send is aborted: the
NCCL group is torn down (ncclCommAbort: a broadcast blocked on a dead peer returns; vLLM's own
broadcast has no timeout), phases still waiting return at once, and every instance is told to
abort. An instance also closes its gate for at most the deadline plus ABORT_TIMEOUT_S on its
own (flexmarl.rollout.worker), should the trainer die between "start" and "finish".

vLLM's trainer engine drives the engines through a client with four blocking calls; FanOut is
that client over FlexMARL's transport (a WeightTransfer message per phase to every instance at
once). vLLM gives every engine rank_offset 1 (one engine); here instance i gets 1 + (the
tensor-parallel GPUs of the instances before it). A group is formed once per (model, instance
set) and formed again when either changes (a swap, a move, a respawn). Every rank of the slot
runs Sender.send in step (each parameter is all-gathered in turn, a collective); only rank 0
talks to the instances.
"""
from __future__ import annotations

import asyncio
import logging
import math
import socket
import threading
import time
from typing import Any, AsyncContextManager, Callable, Iterator, Protocol

import torch

from flexmarl.clock import now
from flexmarl.protocol import SendWeights, WeightTransfer, WeightUpdate, WeightUpdateDone
from flexmarl.weights.base import SyncReport
from flexmarl.weights.codec import ipc_payload, plain_handles
from runtime.errors import PeerDied, RemoteError, TransportClosed
from runtime.transport import Connection, connect

log = logging.getLogger(__name__)

# ----------------------------------------------------------------------------- the choice

ABORT_TIMEOUT_S = 10.0
"""How long telling the instances to abort may take, and how much longer than a send's deadline
an instance keeps its gate closed before aborting on its own."""
DEFAULT_PACKED_BUFFER_BYTES = 1 << 30
"""vLLM's default packed buffer (packed_tensor.DEFAULT_PACKED_BUFFER_SIZE_BYTES), 1 GiB."""




# ----------------------------------------------------------------------------- the instance's end

async def engine_phase(llm: Any, phase: str, info: dict, state: dict) -> None:
    """One WeightTransfer phase on an AsyncLLM (`state` remembers whether it has a group)."""
    from vllm.distributed.weight_transfer.base import (WeightTransferInitRequest,
                                                       WeightTransferUpdateRequest)
    if phase == "init":
        if state.get("joined"):  # a new group (another trainer, new members): leave the old
            await llm.shutdown_weight_transfer_engine()
        await llm.init_weight_transfer_engine(WeightTransferInitRequest(init_info=info))
        state["joined"] = True
    elif phase == "start":
        await llm.start_weight_update()
    elif phase == "update":
        if "ipc_handles_plain" in info:  # CUDA IPC: the handles back as torch objects
            info = dict(info)
            info["ipc_handles"] = plain_handles(info.pop("ipc_handles_plain"))
        await llm.update_weights(WeightTransferUpdateRequest(update_info=info))
    elif phase == "finish":
        await llm.finish_weight_update()
        await llm.reset_prefix_cache()  # no KV entry computed with the old weights is reused
    else:
        raise ValueError(f"unknown weight-transfer phase {phase!r}")


# ----------------------------------------------------------------------------- the trainer's end

def rank_offsets(sizes: list[int]) -> list[int]:
    """Each instance's first rank in the group: the trainer is rank 0, then every instance's
    tensor-parallel workers in order."""
    out, at = [], 1
    for n in sizes:
        out.append(at)
        at += n
    return out


class TransferAborted(RuntimeError):
    """A direct send was aborted (its deadline passed, or an instance failed a phase)."""


class FanOut:
    """vLLM's VLLMWeightSyncClient over FlexMARL's transport: each call goes to every instance
    at once and returns when all have answered (vLLM calls these from its threads; they run on
    this process's event loop). init and update must reach every instance concurrently: each
    blocks in the group's rendezvous / broadcast until all of them and the trainer are in.

    A phase that fails on any instance calls `on_error` (the Sender aborts the group, so the
    trainer's side of a broadcast does not wait for a dead peer) before raising; after `fail`,
    phases still waiting raise TransferAborted at once and later ones are refused."""

    def __init__(self, loop: asyncio.AbstractEventLoop, conns: list[Connection],
                 sizes: list[int], version: int, timeout_s: float,
                 encode: Callable[[dict], dict] = lambda info: info,
                 on_error: Callable[[BaseException], None] | None = None) -> None:
        self.loop, self.conns, self.sizes = loop, conns, sizes
        self.version, self.timeout_s, self.encode = version, timeout_s, encode
        self.on_error = on_error
        self.load_s: dict[str, float] = {}
        self.failed = ""
        """Why the transfer was aborted ("" while it is not)."""
        self._failed = asyncio.Event()
        self._aborted = False
        self._done_with: set[str] = set()
        """Instances that failed a phase or are gone: no abort is sent to them."""

    def _all(self, phase: str, infos: list[dict]) -> None:
        if self.failed:
            raise TransferAborted(self.failed)
        try:
            replies = asyncio.run_coroutine_threadsafe(self._each(phase, infos),
                                                       self.loop).result()
        except TransferAborted:
            raise
        except Exception as exc:  # an instance died, timed out or refused the phase
            if self.on_error is not None:
                self.on_error(exc)
            raise
        for conn, done in zip(self.conns, replies):
            self.load_s[conn.address] = self.load_s.get(conn.address, 0.0) + done.load_s

    async def _request(self, conn: Connection, phase: str, info: dict) -> Any:
        try:
            return await conn.request(WeightTransfer(phase, self.version, info),
                                      timeout_s=self.timeout_s)
        except (RemoteError, PeerDied, TransportClosed):
            # It answered with an error (and so stopped: RolloutWorker.on_weight_transfer) or
            # is gone: an abort would wait ABORT_TIMEOUT_S for a reply that never comes. A
            # timeout is not this: a hung instance may still take the abort.
            self._done_with.add(conn.address)
            raise

    async def _each(self, phase: str, infos: list[dict]) -> list:
        calls = asyncio.gather(*(self._request(conn, phase, info)
                                 for conn, info in zip(self.conns, infos)))
        failed = asyncio.ensure_future(self._failed.wait())
        await asyncio.wait({calls, failed}, return_when=asyncio.FIRST_COMPLETED)
        failed.cancel()
        if not calls.done():  # fail() meanwhile: do not wait for instances being stopped
            calls.cancel()
            calls.add_done_callback(lambda f: f.cancelled() or f.exception())
            raise TransferAborted(self.failed)
        return calls.result()

    async def _abort(self, conns: list[Connection]) -> None:
        await asyncio.gather(*(conn.request(WeightTransfer("abort", self.version, {}),
                                            timeout_s=ABORT_TIMEOUT_S) for conn in conns))

    def init_weight_transfer_engine(self, init_info: dict) -> None:
        if "rank_offset" not in init_info:  # IPC: no group, nothing to place
            self._all("init", [init_info] * len(self.conns))
            return
        self._all("init", [{**init_info, "rank_offset": o} for o in rank_offsets(self.sizes)])

    def start_weight_update(self) -> None:
        # The instance closes its gate now and reopens it at "finish" or "abort", or on its own
        # past this deadline (the trainer died meanwhile).
        self._all("start", [{"deadline_s": self.timeout_s + ABORT_TIMEOUT_S}] * len(self.conns))

    def update_weights(self, update_info: Any) -> None:
        info = self.encode(update_info)
        self._all("update", [info] * len(self.conns))

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        self._all("finish", [{}] * len(self.conns))

    def fail(self, why: str) -> None:
        """Abort the transfer (from any thread): waiting phases return, later ones are
        refused, the instances are told to abort (all but those that failed a phase, which
        have stopped already and would not answer)."""
        if not self.failed:
            self.failed = why
            self.loop.call_soon_threadsafe(self._failed.set)
        self.abort()

    def abort(self) -> None:
        """The send failed: instances in the middle of it stop (their weights may be half
        loaded; the pool replaces them with ones that load the served version). Once."""
        if self._aborted or not self.conns:
            return
        self._aborted = True
        live = [conn for conn in self.conns if conn.address not in self._done_with]
        try:
            asyncio.run_coroutine_threadsafe(self._abort(live), self.loop).result()
        except Exception as exc:  # an instance already gone: nothing left to stop there
            log.info("aborting a weight transfer: %s: %s", type(exc).__name__, exc)


def packed_buffer_bytes(sizes: list[int], default: int = DEFAULT_PACKED_BUFFER_BYTES) -> int:
    """The packed IPC buffer for tensors of `sizes` bytes: vLLM's producer allocates exactly
    this much on the trainer's GPU and refuses a tensor larger than it (a 7B model's bf16
    embedding is 1.09 GB, over the 1 GiB default). The default, or the whole model if smaller
    (a small model needs no 1 GiB buffer), and never less than the largest tensor."""
    return max(max(sizes, default=0), min(default, sum(sizes)))


class Watchdog:
    """Calls `expire` from a thread of its own if the block has not ended `timeout_s` after it
    began; `fired` says whether it did."""

    def __init__(self, timeout_s: float, expire: Callable[[], None]) -> None:
        self.fired = False
        self._expire = expire
        self._timer = threading.Timer(timeout_s, self._fire)
        self._timer.daemon = True

    def _fire(self) -> None:
        self.fired = True
        self._expire()

    def __enter__(self) -> "Watchdog":
        self._timer.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._timer.cancel()


def cast_source(model: torch.nn.Module, dtype: torch.dtype, skip: set[str]):
    """A vLLM WeightSource over the trainer's parameters (FSDP2 DTensors are all-gathered one
    at a time, a collective every rank runs in the same order), sent in the engine's dtype:
    the fp32 master weights travel at half the bytes in bf16.

    On CUDA each parameter is read only after the work queued on `source.step_stream` (the
    stream the optimizer step ran on; the Sender sets it) is done: vLLM's packed NCCL producer
    reads, casts and gathers the tensors on side streams of its own, which nothing orders
    after optimizer.step() on the trainer's stream."""
    from vllm.distributed.weight_transfer.base import ParamMeta, WeightSource, materialize_full_tensor

    class Source(WeightSource):
        step_stream = None

        def metadata(self) -> list:
            return [ParamMeta(n, dtype, tuple(p.shape)) for n, p in model.named_parameters()
                    if n not in skip]

        def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
            for name, p in model.named_parameters():
                if name not in skip:
                    after_step(p, self.step_stream)
                    yield name, materialize_full_tensor(p.detach()).to(dtype)

    return Source()


def after_step(p: torch.Tensor, step_stream: Any) -> None:
    """Order the current stream (whichever vLLM reads `p` on) after `step_stream`'s queued
    work (the optimizer step). Nothing on CPU."""
    if step_stream is not None and p.device.type == "cuda":
        current = torch.cuda.current_stream(p.device)
        if current != step_stream:
            current.wait_stream(step_stream)


def free_port(host: str) -> int:
    """A free port on this machine for the group's rendezvous store, which vLLM's trainer
    engine binds itself (its address must be in the init info the instances get first)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class Sender:
    """One trainer rank's side of direct weight sync: vLLM's trainer engine over the bound
    model, kept while the model and the instance set stay the same."""

    def __init__(self, rank: int, loop: asyncio.AbstractEventLoop, transport: Any,
                 timeout_s: float) -> None:
        self.rank, self.loop, self.transport, self.timeout_s = rank, loop, transport, timeout_s
        self._key: tuple | None = None
        self._engine = None
        self._client: FanOut | None = None
        self._source = None

    def send(self, model: torch.nn.Module, spec: dict, tied: bool) -> tuple[int, float]:
        """Send `model`'s weights as spec["version"] (every rank calls this, in step); the
        bytes sent and the seconds it took (rank 0's count; 0 elsewhere). Past
        spec["timeout_s"] (rollout.request_timeout_s), or as soon as an instance fails, the
        transfer is aborted (see the module docstring) and this raises."""
        from vllm.distributed.weight_transfer import WeightTransferTrainerFactory

        started = time.perf_counter()
        dtype = getattr(torch, spec["dtype"])
        timeout_s = float(spec.get("timeout_s") or self.timeout_s)
        key = (id(model), tuple(spec["instances"]), spec["backend"], spec["dtype"])
        late = (f"the weight send of version {spec['version']} to {len(spec['instances'])} "
                f"instance(s) took longer than {timeout_s:g} s (rollout.request_timeout_s)")
        watchdog = Watchdog(timeout_s, lambda: self._abort(late))
        try:
            with watchdog:
                if key != self._key:
                    self.close()
                    conns = (self._on_loop(self._connect(spec["instances"])) if self.rank == 0
                             else [])
                    sizes = [spec["tensor_parallel_size"]] * len(spec["instances"])
                    self._client = FanOut(self.loop, conns, sizes, spec["version"], timeout_s,
                                          encode=ipc_payload if spec["backend"] == "ipc" else
                                          (lambda info: info),
                                          on_error=lambda exc: self._abort(
                                              f"an instance failed: {type(exc).__name__}: {exc}"))
                    self._source = cast_source(model, dtype,
                                               {"lm_head.weight"} if tied else set())
                    buffer = packed_buffer_bytes([math.prod(m.shape) * m.dtype.itemsize
                                                  for m in self._source.metadata()])
                    self._engine = WeightTransferTrainerFactory.trainer_init(
                        _init_info(spec, self.rank, sum(sizes), buffer), client=self._client,
                        source=self._source)
                    self._key = key
                self._client.version, self._client.timeout_s = spec["version"], timeout_s
                if torch.cuda.is_available():  # the optimizer step's stream (see cast_source)
                    self._source.step_stream = torch.cuda.current_stream()
                self._engine.send_weights()
            if watchdog.fired:  # an aborted group's broadcasts return without sending
                raise TransferAborted(late)
        except BaseException as exc:
            if self._client is not None and self._client.conns:
                self._client.abort()
            self.close()  # a group that failed once is not used again: the next send forms one
            if watchdog.fired:
                raise TimeoutError(late + ": aborted, the instances told to stop (they are "
                                   "replaced and load the served version)") from exc
            raise
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        num_bytes = sum(p.numel() for _, p in model.named_parameters()) * dtype.itemsize
        return (num_bytes if self.rank == 0 else 0), time.perf_counter() - started

    def _abort(self, why: str) -> None:
        """Abort the send in progress (from the watchdog's or a FanOut caller's thread): the
        NCCL group torn down (ncclCommAbort: a broadcast blocked on a dead peer returns, and
        later ones do nothing), waiting phases released, the instances told to abort."""
        log.error("direct weight sync: %s: aborting the transfer", why)
        group = getattr(self._engine, "model_update_group", None)
        if group is not None:
            try:
                group.destroy()
            except Exception as exc:  # already torn down
                log.info("aborting the NCCL group: %s: %s", type(exc).__name__, exc)
        if self._client is not None:
            self._client.fail(why)

    async def _connect(self, addresses: list[str]) -> list[Connection]:
        return [connect(a, self.transport) for a in addresses]  # on the loop, as it must be

    def _on_loop(self, coro: Any) -> Any:
        """Run `coro` on the rank's event loop from this (command) thread and wait for it."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def close(self) -> None:
        if self._engine is not None:
            try:
                self._engine.shutdown()
            except Exception as exc:  # a dead group: the next one is new anyway
                log.info("closing a weight-transfer group: %s: %s", type(exc).__name__, exc)
        if self._client is not None and self._client.conns:
            self._on_loop(_close_all(self._client.conns))
        self._engine, self._client, self._key, self._source = None, None, None, None


async def _close_all(conns: list[Connection]) -> None:
    await asyncio.gather(*(c.aclose() for c in conns), return_exceptions=True)


def _init_info(spec: dict, rank: int, engine_ranks: int,
               buffer_bytes: int = DEFAULT_PACKED_BUFFER_BYTES):
    if spec["backend"] == "ipc":
        from vllm.distributed.weight_transfer.ipc_engine import IPCTrainerInitInfo
        return IPCTrainerInitInfo(packed=True, rank=rank, packed_buffer_size_bytes=buffer_bytes)
    from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo
    return NCCLTrainerInitInfo(master_address=spec["host"], master_port=spec["port"],
                               world_size=1 + engine_ranks, rank=rank)


# ----------------------------------------------------------------------------- the run's end

class Trainers(Protocol):
    """What the run's end needs of the trainer pool (flexmarl.training.pool.TrainerPool)."""

    publish: str
    """The run's name for published weights ("": the pool publishes nothing)."""

    def bind(self, agent: str) -> AsyncContextManager[Connection]: ...

    async def export(self, agent: str) -> WeightUpdate: ...


class DirectTransport:
    """The direct transport (flexmarl.weights.base.Transport): the agent's bound trainer slot
    sends `version` to the instances itself; `fetch` exports its weights, for an instance that
    joins the agent between syncs. `backend` "nccl" or "ipc"; `dtype` rollout.dtype (the
    engine's: "auto" is bfloat16 on GPU)."""

    exports = False

    def __init__(self, trainers: Trainers, backend: str, *, tensor_parallel_size: int,
                 dtype: str, timeout_s: float) -> None:
        self.trainers, self.backend = trainers, backend
        self.tp, self.timeout_s = tensor_parallel_size, timeout_s
        self.dtype = "bfloat16" if dtype == "auto" else dtype

    def begin(self, agent: str, version: int, instances: list[Connection]) -> "DirectTransfer":
        return DirectTransfer(self, agent, version, instances)

    async def trainer_send(self, agent: str, version: int, addresses: list[str]
                           ) -> WeightUpdateDone:
        """The agent's trainer sends `version` to the instances at `addresses`."""
        async with self.trainers.bind(agent) as trainer:
            # The trainer's own deadline (the same setting) fires first and answers with why.
            return await trainer.request(SendWeights(version, addresses, self.backend, self.tp,
                                                     self.dtype, self.timeout_s),
                                         timeout_s=self.timeout_s + 2 * ABORT_TIMEOUT_S)

    async def fetch(self, agent: str) -> WeightUpdate:
        """The trainer publishes its weights on its host (TrainerPool.export): the instance
        reads them there, the run gets their source. A pool that publishes nothing is refused
        before any tensor moves (its export would carry the whole model to the run)."""
        if not getattr(self.trainers, "publish", ""):
            raise RuntimeError(f"{agent}'s trainer pool publishes no weights (TrainerPool("
                               "publish=...)): an instance joining between direct syncs loads "
                               "the published version, and the run never carries weights")
        return await self.trainers.export(agent)


class DirectTransfer:
    def __init__(self, transport: DirectTransport, agent: str, version: int,
                 instances: list[Connection]) -> None:
        self.transport, self.agent, self.version = transport, agent, version
        self.instances = instances
        self.started = now()
        self.done: WeightUpdateDone | None = None

    async def send(self, update: WeightUpdate | None) -> None:
        if update is not None:
            raise ValueError("a direct sync takes no export: the trainer sends its own weights")
        self.done = await self.transport.trainer_send(self.agent, self.version,
                                                      [c.address for c in self.instances])

    async def finish(self) -> SyncReport:
        return SyncReport(self.version, self.done.num_bytes, now() - self.started,
                          {c.address: self.done.load_s for c in self.instances})

    async def abort(self) -> None:
        """The trainer's Sender aborts the instances it reached itself; this covers a trainer
        that failed before (or hung): an instance whose gate is still closed stops."""
        await asyncio.gather(*(c.request(WeightTransfer("abort", self.version),
                                         timeout_s=self.transport.timeout_s)
                               for c in self.instances), return_exceptions=True)
