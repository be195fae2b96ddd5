"""A tour of the runtime in one command (`make run` until the default experiment exists).

Starts two worker processes under a supervisor (one on ipc://, one on tcp://), measures small
round trips and 64 MiB tensor transfers to each, kills one with SIGKILL to show the typed death
event and a restart, then shuts everything down in order and checks that no child is left.
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import time

import torch

from runtime.actor import Actor, handler
from runtime.codec import Envelope
from runtime.config import SupervisorConfig
from runtime.protocol import Ack, Ping, Tensors
from runtime.supervisor import Supervisor, WorkerSpec, pid_alive
from runtime.transport import Connection, connect
from runtime.worker import WorkerContext


class Sink(Actor):
    """Receives tensors and acknowledges them (the demo's worker)."""

    @handler(Tensors)
    async def on_tensors(self, msg: Tensors, env: Envelope) -> Ack:
        return Ack()


def sink(ctx: WorkerContext) -> Actor:
    return Sink(ctx.name, ctx.bind, transport=ctx.transport)


async def round_trips(conn: Connection, n: int) -> float:
    start = time.perf_counter()
    for i in range(n):
        await conn.request(Ping(i, b"x" * 16))
    return n / (time.perf_counter() - start)


async def tensor_gbps(conn: Connection, mib: int, n: int) -> float:
    payload = torch.empty(mib << 20, dtype=torch.uint8)
    await conn.request(Tensors(tensors={"x": payload}))  # warm-up
    start = time.perf_counter()
    for _ in range(n):
        await conn.request(Tensors(tensors={"x": payload}))
    return n * payload.numel() / (time.perf_counter() - start) / 1e9


async def main(args: argparse.Namespace) -> None:
    config = SupervisorConfig(heartbeat_interval_s=0.25, heartbeat_timeout_s=2.0)
    sup = Supervisor(config=config)
    async with sup.serving():
        print(f"supervisor listening at {sup.address}")
        specs = [WorkerSpec(name="ipc-worker", entry="runtime.demo:sink"),
                 WorkerSpec(name="tcp-worker", entry="runtime.demo:sink", bind="tcp://127.0.0.1:0")]
        started = time.perf_counter()
        handles = [await sup.start_worker(s) for s in specs]
        print(f"started {len(handles)} workers in {time.perf_counter() - started:.1f} s: " +
              ", ".join(f"{h.name} pid {h.pid} at {h.address}" for h in handles))
        for h in handles:
            async with connect(h.address) as conn:
                rtt = await round_trips(conn, args.round_trips)
                gbps = await tensor_gbps(conn, args.mib, args.transfers)
            print(f"  {h.name:<11} {rtt:>8,.0f} round trips/s   {gbps:6.2f} GB/s "
                  f"({args.transfers} x {args.mib} MiB tensors)")

        victim = handles[0]
        print(f"killing {victim.name} (pid {victim.pid}) with SIGKILL ...")
        killed = time.monotonic()
        os.kill(victim.pid, signal.SIGKILL)
        event = await asyncio.wait_for(sup.events.get(), config.heartbeat_timeout_s)
        print(f"  supervisor reported {event} after {time.monotonic() - killed:.3f} s")
        again = await sup.start_worker(specs[0])
        async with connect(again.address) as conn:
            await conn.request(Ping(0))
        print(f"  restarted {again.name} as pid {again.pid}, serving again")
        pids = [h.pid for h in sup.workers.values()]
        print("stopping: Shutdown + SIGTERM, join, SIGKILL after "
              f"{config.stop_timeout_s:g} s if needed ...")
    left = [p for p in pids if pid_alive(p)]
    print("all workers stopped, no child process left" if not left else f"LEFT RUNNING: {left}")
    if left:
        raise SystemExit(1)


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--round-trips", type=int, default=2000)
    parser.add_argument("--transfers", type=int, default=8)
    parser.add_argument("--mib", type=int, default=64)
    args = parser.parse_args()
    logging.basicConfig(level=os.environ.get("FLEXMARL_LOG", "WARNING"))
    import uvloop
    uvloop.run(main(args))


if __name__ == "__main__":
    cli()
