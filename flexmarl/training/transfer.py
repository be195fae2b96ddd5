"""The trainer's side of direct weight sync (GPU; the instance's side and the choice of path:
flexmarl.rollout.transfer): vLLM's trainer weight-transfer engine over a slot's bound model.

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
import socket
import time
from typing import Any, Callable, Iterator

import torch

from flexmarl.weights.codec import ipc_payload
from runtime.transport import Connection, connect

log = logging.getLogger(__name__)


def rank_offsets(sizes: list[int]) -> list[int]:
    """Each instance's first rank in the group: the trainer is rank 0, then every instance's
    tensor-parallel workers in order."""
    out, at = [], 1
    for n in sizes:
        out.append(at)
        at += n
    return out


class FanOut:
    """vLLM's VLLMWeightSyncClient over FlexMARL's transport: each call goes to every instance
    at once and returns when all have answered (vLLM calls these from its threads; they run on
    this process's event loop). init and update must reach every instance concurrently: each
    blocks in the group's rendezvous / broadcast until all of them and the trainer are in."""

    def __init__(self, loop: asyncio.AbstractEventLoop, conns: list[Connection],
                 sizes: list[int], version: int, timeout_s: float,
                 encode: Callable[[dict], dict] = lambda info: info) -> None:
        self.loop, self.conns, self.sizes = loop, conns, sizes
        self.version, self.timeout_s, self.encode = version, timeout_s, encode
        self.load_s: dict[str, float] = {}

    def _all(self, phase: str, infos: list[dict]) -> None:
        from flexmarl.protocol import WeightTransfer

        async def each() -> list:
            return await asyncio.gather(*(
                conn.request(WeightTransfer(phase, self.version, info), timeout_s=self.timeout_s)
                for conn, info in zip(self.conns, infos)))
        for conn, done in zip(self.conns,
                              asyncio.run_coroutine_threadsafe(each(), self.loop).result()):
            self.load_s[conn.address] = self.load_s.get(conn.address, 0.0) + done.load_s

    def init_weight_transfer_engine(self, init_info: dict) -> None:
        if "rank_offset" not in init_info:  # IPC: no group, nothing to place
            self._all("init", [init_info] * len(self.conns))
            return
        self._all("init", [{**init_info, "rank_offset": o} for o in rank_offsets(self.sizes)])

    def start_weight_update(self) -> None:
        self._all("start", [{}] * len(self.conns))

    def update_weights(self, update_info: Any) -> None:
        info = self.encode(update_info)
        self._all("update", [info] * len(self.conns))

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        self._all("finish", [{}] * len(self.conns))

    def abort(self) -> None:
        """The send failed: instances in the middle of it stop (their weights may be half
        loaded; the pool replaces them with ones that load the served version)."""
        try:
            self._all("abort", [{}] * len(self.conns))
        except Exception as exc:  # an instance already gone: nothing left to stop there
            log.info("aborting a weight transfer: %s: %s", type(exc).__name__, exc)


def cast_source(model: torch.nn.Module, dtype: torch.dtype, skip: set[str]):
    """A vLLM WeightSource over the trainer's parameters (FSDP2 DTensors are all-gathered one
    at a time, a collective every rank runs in the same order), sent in the engine's dtype:
    the fp32 master weights travel at half the bytes in bf16."""
    from vllm.distributed.weight_transfer.base import ParamMeta, WeightSource, materialize_full_tensor

    class Source(WeightSource):
        def metadata(self) -> list:
            return [ParamMeta(n, dtype, tuple(p.shape)) for n, p in model.named_parameters()
                    if n not in skip]

        def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
            for name, p in model.named_parameters():
                if name not in skip:
                    yield name, materialize_full_tensor(p.detach()).to(dtype)

    return Source()


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

    def send(self, model: torch.nn.Module, spec: dict, tied: bool) -> tuple[int, float]:
        """Send `model`'s weights as spec["version"] (every rank calls this, in step); the
        bytes sent and the seconds it took (rank 0's count; 0 elsewhere)."""
        from vllm.distributed.weight_transfer import WeightTransferTrainerFactory

        started = time.perf_counter()
        dtype = getattr(torch, spec["dtype"])
        key = (id(model), tuple(spec["instances"]), spec["backend"], spec["dtype"])
        try:
            if key != self._key:
                self.close()
                conns = self._on_loop(self._connect(spec["instances"])) if self.rank == 0 else []
                sizes = [spec["tensor_parallel_size"]] * len(spec["instances"])
                self._client = FanOut(self.loop, conns, sizes, spec["version"], self.timeout_s,
                                      encode=ipc_payload if spec["backend"] == "ipc" else
                                      (lambda info: info))
                source = cast_source(model, dtype, {"lm_head.weight"} if tied else set())
                self._engine = WeightTransferTrainerFactory.trainer_init(
                    _init_info(spec, self.rank, sum(sizes)), client=self._client, source=source)
                self._key = key
            self._client.version = spec["version"]
            self._engine.send_weights()
        except BaseException:
            if self._client is not None and self._client.conns:
                self._client.abort()
            self.close()  # a group that failed once is not used again: the next send forms one
            raise
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        num_bytes = sum(p.numel() for _, p in model.named_parameters()) * dtype.itemsize
        return (num_bytes if self.rank == 0 else 0), time.perf_counter() - started

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
        self._engine, self._client, self._key = None, None, None


async def _close_all(conns: list[Connection]) -> None:
    await asyncio.gather(*(c.aclose() for c in conns), return_exceptions=True)


def _init_info(spec: dict, rank: int, engine_ranks: int):
    if spec["backend"] == "ipc":
        from vllm.distributed.weight_transfer.ipc_engine import IPCTrainerInitInfo
        return IPCTrainerInitInfo(packed=True, rank=rank)
    from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo
    return NCCLTrainerInitInfo(master_address=spec["host"], master_port=spec["port"],
                               world_size=1 + engine_ranks, rank=rank)
