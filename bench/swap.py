"""Swap benchmark: training state in and out of trainer slots, and what sharing slots buys.

1. Per model size, the one swap path against plain copies of the same bytes, in the same run.
   Two trainer slots (real trainer worker processes, 1 rank each); the agent trains one step in
   slot a (so AdamW state exists) and is swapped out and in once untimed (a warm slot parks
   into host buffers it already has); then, --swaps rounds each (medians):
   - same slot: SwapOut (offload: the rank's storages into its pooled host buffer) and SwapIn
     back into slot a (onload: copied back in place; on CPU into re-allocated memory, whose
     pages the kernel must fault in and zero: a GPU's device memory has no such cost);
   - cross slot: SwapOut from one slot, SwapIn into the other (its rank pulls the shards rank
     to rank through the runtime transport, into modules built empty), alternating a -> b ->
     a, the old copy dropped each time;
   - baselines in this process, beside each round's swaps: memcpy (Parked.num_bytes copied
     between two warm host buffers, the fastest of 3 and of torch copy_ and libc memmove),
     fresh (the same into newly allocated memory) and zmq (the same bytes through a raw pyzmq
     PUSH/PULL pair over tcp://127.0.0.1, copy=False, two threads with a context each).
   GB/s = state bytes / seconds of that step, timed at this client (so a swap includes its
   request's round trip); offload and onload ratios are to memcpy, the move's to zmq
   (move_ratio in the JSON: to memcpy, what flexmarl/sim/costs.toml's efficiencies use).
   Sizes: the built-in ones (random weights) and smollm2-135m (the pretrained
   SmolLM2-135M-Instruct, a 1.6 GB state with AdamW; needs the `pretrained` extra).
2. The built-in models' team (agents/math_duo.py, two trainable agents) trained with static reservation
   (`trainer_pool.slots = 0`: one slot per agent) and with one shared slot
   (`trainer_pool.slots = 1`), same config and seeds otherwise: trainer utilisation = time the
   slots' processes spent on requests (training, weight export, swaps) / (slots x wall time of
   the timed steps), step time, swaps.

    .venv/bin/python bench/swap.py [--json] [--sizes|--model tiny,small,medium,smollm2-135m]
                                   [--swaps 3] [--steps 6] [--warmup 1] [--set section.key=value]

With --json the last line is one JSON object: offload_gbps, onload_gbps, move_gbps,
memcpy_gbps, zmq_gbps, offload_ratio, onload_ratio, move_zmq_ratio (last size), per size its
numbers, util_static, util_shared, and per placement step_s and swaps. The old path is measured
by running this script against an older tree: PYTHONPATH=<old checkout> python bench/swap.py.
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import importlib.util
import json
import os
import statistics
import sys
import tempfile
import time

# `python bench/swap.py` puts bench/, not the repository root, on sys.path.
if importlib.util.find_spec("flexmarl") is None:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


MEMCPY_PIECE_BYTES = 512 << 20
"""The memcpy baseline copies the state's bytes in pieces of at most this between two warm
buffers: the same rate as one copy (both far exceed the caches), a quarter of the memory."""
ZMQ_FRAME_BYTES = 16 << 20
"""The raw pyzmq baseline's frame: what one FetchShards reply carries at most (PULL_BATCH_BYTES)."""
ZMQ_HWM = 8
"""Frames queued per side of the raw pyzmq pair (bounds its memory)."""


async def timed(coro) -> tuple[object, float]:
    started = time.perf_counter()
    out = await coro
    return out, time.perf_counter() - started


def memcpy_s(num_bytes: int) -> tuple[float, float]:
    """Seconds to copy `num_bytes` between two warm (already touched) host buffers, the fastest
    of 3 and of torch's copy_ (its threads) and libc's memmove (one thread); and seconds to copy
    them into freshly allocated memory (what a copy pays for the kernel zeroing each new page:
    the onload's destination on CPU, whose storages were freed by the offload)."""
    import ctypes

    import torch

    piece = min(num_bytes, MEMCPY_PIECE_BYTES)
    src, dst = torch.ones(piece, dtype=torch.uint8), torch.zeros(piece, dtype=torch.uint8)
    sizes = [min(piece, num_bytes - lo) for lo in range(0, num_bytes, piece)]

    def run(copy) -> float:
        started = time.perf_counter()
        for n in sizes:
            copy(n)
        return time.perf_counter() - started

    warm = min(min(run(lambda n: dst[:n].copy_(src[:n])),
                   run(lambda n: ctypes.memmove(dst.data_ptr(), src.data_ptr(), n)))
               for _ in range(3))
    del dst

    def into_new(n: int) -> None:
        new = torch.empty(n, dtype=torch.uint8)  # held until the copy is done
        ctypes.memmove(new.data_ptr(), src.data_ptr(), n)

    fresh = min(run(into_new) for _ in range(3))
    return warm, fresh


def zmq_loopback_s(num_bytes: int) -> float:
    """Seconds to push `num_bytes` through a raw pyzmq PUSH/PULL pair over tcp://127.0.0.1, in
    frames of ZMQ_FRAME_BYTES from one warm buffer, copy=False on both sides, each side in its
    own thread with its own context (its own I/O thread, as two processes have); the fastest
    of 3. The receiver drops each frame (no copy out of it)."""
    import threading

    import numpy as np
    import zmq

    frame = np.ones(min(num_bytes, ZMQ_FRAME_BYTES), dtype=np.uint8)
    sizes = [min(frame.nbytes, num_bytes - lo) for lo in range(0, num_bytes, frame.nbytes)]
    with zmq.Context() as rx_ctx, zmq.Context() as tx_ctx:
        pull, push = rx_ctx.socket(zmq.PULL), tx_ctx.socket(zmq.PUSH)
        for sock in (pull, push):
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.SNDHWM, ZMQ_HWM)
            sock.setsockopt(zmq.RCVHWM, ZMQ_HWM)
        port = pull.bind_to_random_port("tcp://127.0.0.1")
        push.connect(f"tcp://127.0.0.1:{port}")
        push.send(frame[:1], copy=False)  # the connection is up before the clock starts
        pull.recv(copy=False)
        times = []
        for _ in range(3):
            def receive() -> None:
                for _ in sizes:
                    pull.recv(copy=False)
            rx = threading.Thread(target=receive)
            started = time.perf_counter()
            rx.start()
            for n in sizes:
                push.send(frame[:n], copy=False)
            rx.join()
            times.append(time.perf_counter() - started)
        pull.close()
        push.close()
    return min(times)


def model_dir_of(size: str) -> str:
    """A built-in random-weight size (built once, cached) or a pretrained name (its GGUF file
    converted once, cached)."""
    from flexmarl.launch.gguf import PRETRAINED, gguf_dir
    from flexmarl.models import ensure_model

    if size in PRETRAINED:
        return str(gguf_dir(size))
    return str(ensure_model(size, warm_start_steps=0))


async def swap_throughput(size: str, swaps: int) -> dict:
    from flexmarl.orchestrator.batch import micro_batch
    from flexmarl.protocol import DropParked, SwapIn, SwapOut, TrainBeginBatch, TrainStep
    from flexmarl.config.training import TrainerConfig
    from runtime.supervisor import Supervisor, WorkerSpec
    from runtime.transport import connect

    model_dir = await asyncio.to_thread(model_dir_of, size)
    cfg = dataclasses.asdict(TrainerConfig(lr=1e-4))
    work = tempfile.mkdtemp(prefix="flexmarl-swap-")
    sup = Supervisor()
    async with sup.serving():
        handles = await asyncio.gather(*(sup.start_worker(WorkerSpec(
            name=f"slot-{k}", entry="flexmarl.training.worker:trainer_worker",
            args={"rank": 0, "world_size": 1, "init_method": f"file://{work}/{k}"},
            ready_timeout_s=300)) for k in "ab"))
        async with connect(handles[0].address) as a, connect(handles[1].address) as b:
            await a.request(SwapIn(size, model_dir, cfg), timeout_s=300)
            mb = micro_batch([([1, 2, 3], [4, 5, 6, 7], [-1.0] * 4)] * 2, [1.0, -1.0])
            await a.request(TrainBeginBatch(0))
            await a.request(mb)
            await a.request(TrainStep(8))
            # The first park allocates the slot's host buffers (and faults them in): not timed,
            # as a warm slot parks into buffers it already has.
            parked = await a.request(SwapOut(), timeout_s=300)
            await a.request(SwapIn(size, model_dir, cfg, source=parked.ranks), timeout_s=300)
            num_bytes = parked.num_bytes

            # Each round times the baselines beside its swaps, so a busy machine slows all alike.
            outs, ins, moves, copies, fresh, zmqs = [], [], [], [], [], []
            for _ in range(swaps):
                warm_s, fresh_s = await asyncio.to_thread(memcpy_s, num_bytes)
                copies.append(warm_s)
                fresh.append(fresh_s)
                zmqs.append(await asyncio.to_thread(zmq_loopback_s, num_bytes))
                parked, out_s = await timed(a.request(SwapOut(), timeout_s=300))
                done, in_s = await timed(a.request(SwapIn(size, model_dir, cfg,
                                                          source=parked.ranks), timeout_s=300))
                assert done.how == "here", done  # same slot: offload, onload in place
                outs.append(out_s)
                ins.append(in_s)
                parked = await a.request(SwapOut(), timeout_s=300)  # cross slot: a -> b -> a
                done, ab_s = await timed(b.request(SwapIn(size, model_dir, cfg,
                                                          source=parked.ranks), timeout_s=300))
                await a.request(DropParked(size))
                parked = await b.request(SwapOut(), timeout_s=300)
                done, ba_s = await timed(a.request(SwapIn(size, model_dir, cfg,
                                                          source=parked.ranks), timeout_s=300))
                assert done.how == "pulled", done
                await b.request(DropParked(size))
                moves += [ab_s, ba_s]
        await sup.stop_workers()
    out_s, in_s, move_s, copy_s, fresh_s, zmq_s = (statistics.median(v) for v in (
        outs, ins, moves, copies, fresh, zmqs))
    r = {"size": size, "bytes": num_bytes, "out_s": out_s, "in_s": in_s, "move_s": move_s}
    for k, sec in (("offload", out_s), ("onload", in_s), ("move", move_s), ("memcpy", copy_s),
                   ("fresh_memcpy", fresh_s), ("zmq", zmq_s)):
        r[f"{k}_gbps"] = num_bytes / sec / 1e9
    r["swap_gbps"] = 2 * num_bytes / (out_s + in_s) / 1e9
    for k in ("offload", "onload", "move", "swap"):
        r[f"{k}_ratio"] = r[f"{k}_gbps"] / r["memcpy_gbps"]
    r["onload_fresh_ratio"] = r["onload_gbps"] / r["fresh_memcpy_gbps"]
    r["move_zmq_ratio"] = r["move_gbps"] / r["zmq_gbps"]
    return r


async def run_placement(slots: int, args: argparse.Namespace) -> dict:
    from flexmarl.config.load import load_config
    from flexmarl.launch.run import train
    from flexmarl.team import load_team

    config = load_config(overrides=[
        f"run.out_dir={tempfile.mkdtemp(prefix='flexmarl-swap-')}", f"run.steps={args.steps}",
        f"trainer_pool.slots={slots}", "team.path=agents/math_duo.py",  # as measured
        "rollout.backend=vllm", "pipeline.tasks_per_step=16", *args.set])
    result = await train(load_team(config.team.path), config, progress=False)
    timed = result.metrics[args.warmup:]
    wall = sum(m["step_s"] for m in timed)
    busy = sum(sum(m["trainer_slots_busy_s"].values()) for m in timed)
    num_slots = len(timed[0]["trainer_slots_busy_s"])
    swaps = [sw for m in timed for sw in m["swaps"]]
    return {"slots": num_slots, "step_s": wall / len(timed), "util": busy / (num_slots * wall),
            "swaps": len(swaps), "swap_s": sum(sw["seconds"] for sw in swaps) / len(timed),
            "swap_bytes": sum(sw["num_bytes"] for sw in swaps) / max(len(swaps), 1),
            "team_reward": sum(m["team_reward"] for m in timed) / len(timed)}


async def main(args: argparse.Namespace) -> None:
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    sizes = [await swap_throughput(s, args.swaps) for s in args.sizes.split(",")]
    print("GB/s (x baseline): offload and onload = same slot (x memcpy), move = cross slot, "
          "rank to rank (x raw pyzmq loopback)")
    print(f"{'size':<13} {'state MB':>9} {'offload':>15} {'onload':>15} {'move':>15} "
          f"{'memcpy':>7} {'fresh':>7} {'zmq':>7}")
    for r in sizes:
        cells = [f"{r[k + '_gbps']:.3f} ({r[k + '_ratio']:.3f})" for k in ("offload", "onload")]
        cells.append(f"{r['move_gbps']:.3f} ({r['move_zmq_ratio']:.3f})")
        print(f"{r['size']:<13} {r['bytes'] / 1e6:>9.2f} " + " ".join(f"{c:>15}" for c in cells)
              + "".join(f" {r[k + '_gbps']:>7.2f}" for k in ("memcpy", "fresh_memcpy", "zmq")))
    last = sizes[-1]
    out = {"sizes": sizes, **{k: last[k] for k in (
        "offload_gbps", "onload_gbps", "move_gbps", "memcpy_gbps", "zmq_gbps", "swap_gbps",
        "offload_ratio", "onload_ratio", "move_zmq_ratio")}}
    if args.steps:
        placements = {"static": await run_placement(0, args),
                      "shared": await run_placement(1, args)}
        print(f"\ndefault team, {args.steps} steps (first {args.warmup} not timed)")
        print(f"{'placement':<10} {'slots':>5} {'step s':>7} {'trainer util':>12} {'swaps':>6} "
              f"{'swap s/step':>11} {'team reward':>11}")
        for name, r in placements.items():
            print(f"{name:<10} {r['slots']:>5} {r['step_s']:>7.2f} {r['util']:>12.2f} "
                  f"{r['swaps']:>6} {r['swap_s']:>11.3f} {r['team_reward']:>11.3f}")
        out.update(placements=placements, util_static=placements["static"]["util"],
                   util_shared=placements["shared"]["util"])
    out["config"] = {"sizes": args.sizes, "swaps": args.swaps, "steps": args.steps,
                     "warmup": args.warmup, "set": args.set}
    if args.json:
        print(json.dumps(out))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--sizes", "--model", dest="sizes", default="tiny,small,medium",
                    help="comma-separated built-in sizes (random weights) or smollm2-135m (the "
                         "pretrained SmolLM2-135M-Instruct: a 1.6 GB state with AdamW)")
    ap.add_argument("--swaps", type=int, default=3, help="swap rounds per size (median)")
    ap.add_argument("--steps", type=int, default=6, help="steps per placement (0: skip)")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    args = ap.parse_args(argv)
    if args.steps and args.steps <= args.warmup:
        ap.error("--steps must exceed --warmup")
    return args


if __name__ == "__main__":
    import uvloop
    uvloop.run(main(parse_args()))
