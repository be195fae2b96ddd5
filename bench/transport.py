"""Transport benchmark: the runtime's request/reply path against raw pyzmq, side by side.

For each transport (tcp, ipc) it measures, with one request in flight at a time:

  round trips/s   runtime: `connect(addr).request(Ping(i, 16 bytes))` to an `Actor` subclass
                  (the base class answers Ping with Pong);
                  raw:     zmq.asyncio DEALER sends [header, 16-byte body] to a ROUTER that
                  echoes it back.
  tensor GB/s     runtime: `request(Tensors(tensors={"x": <--mib MiB uint8 tensor>}))` to a
                  `@handler(Tensors)` that looks at the shape and returns Ack();
                  raw:     DEALER send_multipart([header, numpy buffer], copy=False), ROUTER
                  recv_multipart(copy=False) and a small ack back. GB = 1e9 payload bytes.

Every server runs in its own process, started by this script (`--serve runtime|raw`); it prints
its real bound endpoint as one line on stdout and exits when its stdin closes (so it cannot
outlive the benchmark) or on SIGTERM/SIGINT. Runtime and raw runs alternate in short slices, so
machine noise hits both alike.

    .venv/bin/python bench/transport.py [--json] [--seconds 2] [--iters 20] [--mib 64]
                                        [--transports tcp,ipc]

With --json the last line of stdout is one JSON object with the numbers (tcp ones unprefixed,
ipc ones prefixed `ipc_`). A missed target is reported, never an error exit.
"""
from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import shutil
import signal
import statistics
import struct
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any

# `python bench/transport.py` puts bench/, not the repository root, on sys.path, so the
# `runtime` package is only importable when installed; fall back to the checkout it lives in.
if importlib.util.find_spec("runtime") is None:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np
import uvloop
import zmq
import zmq.asyncio

# The runtime (and with it torch, ~1 s to import) is imported only where it is used, so the raw
# pyzmq server process stays light.

TENSOR_TARGET = 0.9  # runtime tensor throughput >= 0.9x raw pyzmq
RTT_TARGET = 0.5     # runtime round trips/s >= 0.5x raw pyzmq
PING_PAYLOAD = b"x" * 16
RAW_HEADER = struct.Struct("<2sBBHQ")  # same size as the runtime's header: tag, -, -, -, seq
TAG_ECHO = b"RE"
TAG_TENSOR = b"RT"
RAW_ACK = b"ack"
SLICE_S = 0.5        # RTT phases alternate runtime/raw in slices of about this length
WARMUP_ROUND_TRIPS = 300
WARMUP_TENSORS = 2
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 5.0
PHASE_SLACK_S = 60.0


# ============================================================================ servers

async def _until_released() -> None:
    """Return when stdin reaches EOF (the parent closed it or died) or on SIGTERM/SIGINT."""
    loop = asyncio.get_running_loop()
    done = loop.create_future()

    def finish() -> None:
        if not done.done():
            done.set_result(None)

    def on_stdin() -> None:
        try:
            data = os.read(0, 4096)
        except OSError:
            data = b""
        if not data:
            finish()

    loop.add_reader(0, on_stdin)
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, finish)
    try:
        await done
    finally:
        loop.remove_reader(0)


def _announce(endpoint: str) -> None:
    sys.stdout.write(endpoint + "\n")
    sys.stdout.flush()


async def serve_runtime(address: str) -> None:
    from runtime.actor import Actor, handler
    from runtime.codec import Envelope
    from runtime.protocol import Ack, Tensors

    class Sink(Actor):
        """Answers Ping (base class) and acknowledges Tensors without reading the data."""

        @handler(Tensors)
        async def on_tensors(self, msg: Tensors, env: Envelope) -> Ack:
            for t in msg.tensors.values():
                t.shape  # noqa: B018 - touch the metadata only
            return Ack()

    actor = Sink("bench-sink", address)
    async with actor.serving():
        _announce(actor.address)
        await _until_released()


async def serve_raw(address: str) -> None:
    tmpdir = None
    if address == "ipc://*":
        # Like the runtime's listener: a private directory, removed again on exit. Made here
        # rather than by the parent, so it goes even when the parent is killed outright.
        tmpdir = tempfile.mkdtemp(prefix="flexmarl-bench-raw-")
        address = f"ipc://{os.path.join(tmpdir, 'sock')}"
    sock = None
    try:
        sock = zmq.asyncio.Context.instance().socket(zmq.ROUTER)
        sock.linger = 0
        sock.bind(address)
        _announce(sock.getsockopt_string(zmq.LAST_ENDPOINT))

        async def echo_loop() -> None:
            while True:
                # copy=False for every message, as the runtime's listener does: the server cannot
                # know in advance whether the next message is small or 64 MiB.
                frames = await sock.recv_multipart(copy=False)
                header = frames[1].bytes
                if header[:2] == TAG_TENSOR:
                    len(frames[2])  # touch the metadata only
                    await sock.send_multipart([frames[0].bytes, header, RAW_ACK])
                else:
                    await sock.send_multipart([f.bytes for f in frames])

        loop = asyncio.get_running_loop()
        echo, released = loop.create_task(echo_loop()), loop.create_task(_until_released())
        done, _ = await asyncio.wait({echo, released}, return_when=asyncio.FIRST_COMPLETED)
        for task in (echo, released):
            task.cancel()
        await asyncio.gather(echo, released, return_exceptions=True)
        if echo in done:
            echo.result()  # the echo loop failed: raise why, and exit
    finally:
        if sock is not None:
            sock.close(linger=0)
        if tmpdir is not None:
            shutil.rmtree(tmpdir, ignore_errors=True)


# ============================================================================ clients

class RawClient:
    """The raw pyzmq side: one DEALER to the raw ROUTER server."""

    def __init__(self, address: str) -> None:
        self.sock = zmq.asyncio.Context.instance().socket(zmq.DEALER)
        self.sock.linger = 0
        self.sock.connect(address)
        self.seq = 0

    async def round_trip(self) -> None:
        self.seq += 1
        header = RAW_HEADER.pack(TAG_ECHO, 0, 0, 0, self.seq)
        await self.sock.send_multipart([header, PING_PAYLOAD])
        reply = await self.sock.recv_multipart()
        if reply[0] != header:
            raise AssertionError(f"raw echo out of order: {reply!r}")

    async def tensor(self, buf: np.ndarray) -> None:
        self.seq += 1
        header = RAW_HEADER.pack(TAG_TENSOR, 0, 0, 0, self.seq)
        await self.sock.send_multipart([header, buf], copy=False)
        reply = await self.sock.recv_multipart()
        if reply != [header, RAW_ACK]:
            raise AssertionError(f"raw tensor ack out of order: {reply!r}")

    def close(self) -> None:
        self.sock.close(linger=0)


class RuntimeClient:
    """The runtime side: one `runtime.transport.connect` Connection."""

    def __init__(self, address: str) -> None:
        from runtime.protocol import Ack, Ping, Pong, Tensors
        from runtime.transport import connect

        self._Ack, self._Ping, self._Pong, self._Tensors = Ack, Ping, Pong, Tensors
        self.conn = connect(address)
        self.seq = 0

    async def round_trip(self) -> None:
        self.seq += 1
        pong = await self.conn.request(self._Ping(self.seq, PING_PAYLOAD))
        if type(pong) is not self._Pong or pong.seq != self.seq:
            raise AssertionError(f"runtime ping answered with {pong!r}")

    async def tensor(self, t: Any) -> None:
        reply = await self.conn.request(self._Tensors(tensors={"x": t}))
        if type(reply) is not self._Ack:
            raise AssertionError(f"runtime tensor request answered with {reply!r}")

    async def close(self) -> None:
        await self.conn.aclose()


@dataclass
class Tally:
    """Work done (round trips, or GB) and the seconds it took, summed over slices."""

    count: float = 0.0
    seconds: float = 0.0

    def add(self, count: float, seconds: float) -> None:
        self.count += count
        self.seconds += seconds

    @property
    def rate(self) -> float:
        return self.count / self.seconds if self.seconds else float("nan")


async def _round_trips_for(client: RawClient | RuntimeClient, seconds: float) -> tuple[int, float]:
    round_trip = client.round_trip
    clock = time.perf_counter
    n = 0
    t0 = clock()
    deadline = t0 + seconds
    while True:
        await round_trip()
        n += 1
        if clock() >= deadline:
            return n, clock() - t0


async def measure_round_trips(rt: RuntimeClient, raw: RawClient,
                              seconds: float) -> tuple[Tally, Tally]:
    for client in (rt, raw):
        for _ in range(WARMUP_ROUND_TRIPS):
            await client.round_trip()
    slices = max(1, round(seconds / SLICE_S))
    tallies = {"rt": Tally(), "raw": Tally()}
    for i in range(slices):
        order = (("rt", rt), ("raw", raw)) if i % 2 == 0 else (("raw", raw), ("rt", rt))
        for name, client in order:
            tallies[name].add(*await _round_trips_for(client, seconds / slices))
    return tallies["rt"], tallies["raw"]


async def measure_tensors(rt: RuntimeClient, raw: RawClient, iters: int,
                          nbytes: int) -> tuple[Tally, Tally]:
    import torch

    # Both payloads are written once so their pages are real, not the shared zero page.
    tensor = torch.empty(nbytes, dtype=torch.uint8).fill_(1)
    buf = np.ones(nbytes, dtype=np.uint8)
    for _ in range(WARMUP_TENSORS):
        await rt.tensor(tensor)
        await raw.tensor(buf)
    durations: dict[str, list[float]] = {"rt": [], "raw": []}
    clock = time.perf_counter
    for i in range(iters):
        order = (("rt", rt.tensor, tensor), ("raw", raw.tensor, buf))
        for name, send, payload in (order if i % 2 == 0 else order[::-1]):
            t0 = clock()
            await send(payload)
            durations[name].append(clock() - t0)
    # The median request time, not the mean: on a shared 2-core machine a single stall of the
    # other process would otherwise decide the ratio.
    return (Tally(nbytes / 1e9, statistics.median(durations["rt"])),
            Tally(nbytes / 1e9, statistics.median(durations["raw"])))


# ============================================================================ orchestration

class Servers:
    """Server subprocesses of this script; all stopped (or killed) by `stop()`."""

    def __init__(self) -> None:
        self.procs: list[asyncio.subprocess.Process] = []

    async def start(self, kind: str, address: str) -> str:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, os.path.abspath(__file__), "--serve", kind, "--address", address,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
        self.procs.append(proc)
        assert proc.stdout is not None
        try:
            line = await asyncio.wait_for(proc.stdout.readline(), START_TIMEOUT_S)
        except asyncio.TimeoutError:
            raise RuntimeError(f"{kind} server at {address} did not report its endpoint within "
                               f"{START_TIMEOUT_S:g} s") from None
        endpoint = line.decode().strip()
        if not endpoint:
            rc = await proc.wait()
            raise RuntimeError(f"{kind} server at {address} exited (status {rc}) before "
                               "reporting its endpoint; see its stderr above")
        return endpoint

    async def stop(self) -> None:
        for proc in self.procs:
            if proc.stdin is not None and not proc.stdin.is_closing():
                proc.stdin.close()  # the server's signal to exit
        for proc in self.procs:
            try:
                await asyncio.wait_for(proc.wait(), STOP_TIMEOUT_S)
            except asyncio.TimeoutError:
                proc.kill()
                await proc.wait()


RUNTIME_ADDRESS = {"tcp": "tcp://127.0.0.1:0", "ipc": "ipc://*"}  # the runtime resolves both
# Raw pyzmq: "*" port read back through LAST_ENDPOINT; "ipc://*" becomes a mkdtemp() path in
# serve_raw (libzmq's own ipc wildcard would report a relative path).
RAW_ADDRESS = {"tcp": "tcp://127.0.0.1:*", "ipc": "ipc://*"}


async def run_bench(args: argparse.Namespace) -> dict[str, dict[str, float]]:
    servers = Servers()
    results: dict[str, dict[str, float]] = {}
    try:
        starts = []
        for transport in args.transports:
            starts.append(servers.start("runtime", RUNTIME_ADDRESS[transport]))
            starts.append(servers.start("raw", RAW_ADDRESS[transport]))
        endpoints = await asyncio.gather(*starts)
        nbytes = args.mib << 20
        for i, transport in enumerate(args.transports):
            rt_addr, raw_addr = endpoints[2 * i], endpoints[2 * i + 1]
            _progress(f"{transport}: runtime server {rt_addr}, raw server {raw_addr}")
            rt, raw = RuntimeClient(rt_addr), RawClient(raw_addr)
            try:
                # Watchdogs, so a dead server ends the run instead of hanging it: the raw client
                # waits for its replies without a deadline of its own.
                rt_rtt, raw_rtt = await _watchdog(
                    f"{transport} round trips", measure_round_trips(rt, raw, args.seconds),
                    2 * args.seconds + PHASE_SLACK_S)
                rt_ten, raw_ten = await _watchdog(
                    f"{transport} tensors", measure_tensors(rt, raw, args.iters, nbytes),
                    args.iters * args.mib * 2 / 50 + PHASE_SLACK_S)  # floor of 50 MiB/s
            finally:
                await rt.close()
                raw.close()
            results[transport] = {
                "rtt_per_s": rt_rtt.rate, "raw_rtt_per_s": raw_rtt.rate,
                "tensor_gbps": rt_ten.rate, "raw_tensor_gbps": raw_ten.rate,
            }
            _progress(f"{transport}: runtime {rt_rtt.rate:,.0f} rt/s {rt_ten.rate:.2f} GB/s; "
                      f"raw {raw_rtt.rate:,.0f} rt/s {raw_ten.rate:.2f} GB/s")
    finally:
        await servers.stop()
    return results


async def _watchdog(phase: str, coro: Any, timeout_s: float) -> Any:
    try:
        return await asyncio.wait_for(coro, timeout_s)
    except asyncio.TimeoutError:
        raise RuntimeError(f"{phase}: no progress within {timeout_s:.0f} s; a server probably "
                           "died (see its stderr above)") from None


def _progress(text: str) -> None:
    print(f"[bench] {text}", file=sys.stderr, flush=True)


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def summarize(results: dict[str, dict[str, float]], args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for transport in ("tcp", "ipc"):
        prefix = "" if transport == "tcp" else "ipc_"
        r = results.get(transport, {})
        for key in ("rtt_per_s", "raw_rtt_per_s", "tensor_gbps", "raw_tensor_gbps"):
            out[prefix + key] = r.get(key)
        out[prefix + "rtt_ratio"] = _ratio(r.get("rtt_per_s"), r.get("raw_rtt_per_s"))
        out[prefix + "tensor_ratio"] = _ratio(r.get("tensor_gbps"), r.get("raw_tensor_gbps"))
    out["targets"] = {"rtt_ratio": RTT_TARGET, "tensor_ratio": TENSOR_TARGET}
    out["met"] = {
        f"{t}_{m}": out[("" if t == "tcp" else "ipc_") + f"{m}_ratio"] >= target
        for t in results for m, target in (("rtt", RTT_TARGET), ("tensor", TENSOR_TARGET))
    }
    out["config"] = {"seconds": args.seconds, "iters": args.iters, "mib": args.mib,
                     "transports": args.transports, "cpus": os.cpu_count()}
    return out


def format_table(summary: dict[str, Any], args: argparse.Namespace) -> str:
    rows = [("transport", "metric", "runtime", "raw pyzmq", "ratio")]
    for t in args.transports:
        p = "" if t == "tcp" else "ipc_"
        rows.append((t, "round trips/s", f"{summary[p + 'rtt_per_s']:,.0f}",
                     f"{summary[p + 'raw_rtt_per_s']:,.0f}", f"{summary[p + 'rtt_ratio']:.2f}x"))
        rows.append((t, f"tensor GB/s ({args.mib} MiB)", f"{summary[p + 'tensor_gbps']:.2f}",
                     f"{summary[p + 'raw_tensor_gbps']:.2f}",
                     f"{summary[p + 'tensor_ratio']:.2f}x"))
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    align = ["<", "<", ">", ">", ">"]
    lines = ["  ".join(f"{c:{a}{w}}" for c, a, w in zip(r, align, widths)) for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines.append("")
    lines.append(f"targets: tensor throughput >= {TENSOR_TARGET:.1f}x raw, "
                 f"round trips >= {RTT_TARGET:.1f}x raw")
    for t in args.transports:
        p = "" if t == "tcp" else "ipc_"
        verdict = []
        for label, m, target in (("tensor", "tensor", TENSOR_TARGET),
                                 ("round trips", "rtt", RTT_TARGET)):
            ratio = summary[p + m + "_ratio"]
            verdict.append(f"{label} {ratio:.2f}x {'met' if ratio >= target else 'MISSED'}")
        lines.append(f"  {t}: " + ", ".join(verdict))
    lines.append(f"(one request in flight; {args.seconds:g} s of round trips per side per "
                 f"transport, {args.iters} tensor requests per side; {os.cpu_count()} CPUs)")
    return "\n".join(lines)


# ============================================================================ entry point

def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true",
                    help="end stdout with one line of JSON holding every number")
    ap.add_argument("--seconds", type=float, default=2.0,
                    help="round-trip phase length per side per transport (default 2)")
    ap.add_argument("--iters", type=int, default=40,
                    help="timed tensor requests per side per transport (default 40)")
    ap.add_argument("--mib", type=int, default=64, help="tensor payload in MiB (default 64)")
    ap.add_argument("--transports", default="tcp,ipc",
                    help="comma-separated subset of tcp,ipc (default tcp,ipc)")
    ap.add_argument("--serve", choices=("runtime", "raw"), help=argparse.SUPPRESS)
    ap.add_argument("--address", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.transports = list(dict.fromkeys(t.strip() for t in args.transports.split(",")
                                         if t.strip()))
    bad = [t for t in args.transports if t not in RUNTIME_ADDRESS]
    if bad or not args.transports:
        ap.error(f"--transports must be a subset of tcp,ipc, got {bad or 'nothing'}")
    if args.seconds <= 0 or args.iters < 1 or args.mib < 1:
        ap.error("--seconds must be > 0, --iters and --mib >= 1")
    if args.serve and not args.address:
        ap.error("--serve needs --address")
    return args


def report(results: dict[str, dict[str, float]], args: argparse.Namespace) -> None:
    summary = summarize(results, args)
    print(format_table(summary, args), flush=True)
    if args.json:
        print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    # uvloop is installed here, in the entry point, and nowhere else.
    _args = parse_args()
    if _args.serve == "runtime":
        uvloop.run(serve_runtime(_args.address))
    elif _args.serve == "raw":
        uvloop.run(serve_raw(_args.address))
    else:
        try:
            report(uvloop.run(run_bench(_args)), _args)
        except KeyboardInterrupt:  # the servers were already stopped by run_bench's finally
            sys.exit(130)
