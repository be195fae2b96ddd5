"""Swap benchmark: training state in and out of trainer slots, and what sharing slots buys.

1. Per model size, the one swap path against a plain memcpy of the same bytes, in the same run.
   Two trainer slots (real trainer worker processes, 1 rank each); the agent trains one step in
   slot a (so AdamW state exists), then, --swaps rounds each (medians):
   - same slot: SwapOut (offload: the rank's shards to host memory of its process) and SwapIn
     back into slot a (onload: copied back in place);
   - cross slot: SwapOut from one slot, SwapIn into the other (its rank pulls the shards rank
     to rank through the runtime transport, into modules built empty), alternating a -> b ->
     a, the old copy dropped each time;
   - memcpy: clone() of the state's tensors (ExportState's, the same bytes) in this process,
     the fastest of 3 back to back, beside each round's swaps.
   GB/s = state bytes / seconds of that step, timed at this client (so a swap includes its
   request's round trip); ratio = GB/s / memcpy GB/s (what flexmarl/sim/costs.toml's swap
   efficiencies are calibrated from).
2. The default team (agents/math_duo.py, two trainable agents) trained with static reservation
   (`trainer_pool.slots = 0`: one slot per agent) and with one shared slot
   (`trainer_pool.slots = 1`), same config and seeds otherwise: trainer utilisation = time the
   slots' processes spent on requests (training, weight export, swaps) / (slots x wall time of
   the timed steps), step time, swaps.

    .venv/bin/python bench/swap.py [--json] [--sizes tiny,small,medium] [--swaps 3]
                                   [--steps 6] [--warmup 1] [--set section.key=value ...]

With --json the last line is one JSON object: offload_gbps, onload_gbps, move_gbps and
memcpy_gbps (largest size), per size its numbers, util_static, util_shared, and per placement
step_s and swaps.
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


async def timed(coro) -> tuple[object, float]:
    started = time.perf_counter()
    out = await coro
    return out, time.perf_counter() - started


async def swap_throughput(size: str, swaps: int) -> dict:
    from flexmarl.orchestrator.batch import micro_batch
    from flexmarl.models import ensure_model
    from flexmarl.protocol import (DropParked, ExportState, SwapIn, SwapOut, TrainBeginBatch,
                                   TrainStep)
    from flexmarl.training.trainer import TrainerConfig
    from runtime.supervisor import Supervisor, WorkerSpec
    from runtime.transport import connect

    model_dir = str(await asyncio.to_thread(ensure_model, size, warm_start_steps=0))
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
            state = await a.request(ExportState(), timeout_s=300)

            def memcpy() -> float:
                """The fastest of 3 clones: the first ones of a size pay this VM's page faults
                of fresh memory, which would flatter the ratio."""
                times = []
                for _ in range(3):
                    started = time.perf_counter()
                    copy = {k: v.clone() for k, v in state.tensors.items()}
                    times.append(time.perf_counter() - started)
                    del copy
                return min(times)

            # Each round times a memcpy beside its swaps, so a busy machine slows both alike.
            outs, ins, moves, copies, num_bytes = [], [], [], [], 0
            for _ in range(swaps):
                copies.append(memcpy())
                parked, out_s = await timed(a.request(SwapOut(), timeout_s=300))
                done, in_s = await timed(a.request(SwapIn(size, model_dir, cfg,
                                                          source=parked.ranks), timeout_s=300))
                assert done.how == "here", done  # same slot: offload, onload in place
                outs.append(out_s)
                ins.append(in_s)
                num_bytes = parked.num_bytes
                copies.append(memcpy())
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
    out_s, in_s, move_s, copy_s = (statistics.median(v) for v in (outs, ins, moves, copies))
    memcpy = num_bytes / copy_s / 1e9
    r = {"size": size, "bytes": num_bytes, "out_s": out_s, "in_s": in_s, "move_s": move_s,
         "offload_gbps": num_bytes / out_s / 1e9, "onload_gbps": num_bytes / in_s / 1e9,
         "move_gbps": num_bytes / move_s / 1e9, "memcpy_gbps": memcpy,
         "swap_gbps": 2 * num_bytes / (out_s + in_s) / 1e9}
    for k in ("offload", "onload", "move", "swap"):
        r[f"{k}_ratio"] = r[f"{k}_gbps"] / memcpy
    return r


async def run_placement(slots: int, args: argparse.Namespace) -> dict:
    from flexmarl.config.load import load_config
    from flexmarl.launch.run import train
    from flexmarl.team import load_team

    config = load_config(overrides=[
        f"run.out_dir={tempfile.mkdtemp(prefix='flexmarl-swap-')}", f"run.steps={args.steps}",
        f"trainer_pool.slots={slots}", *args.set])
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
    print("GB/s (x memcpy): offload and onload = same slot, move = cross slot, rank to rank")
    print(f"{'size':<8} {'state MB':>9} {'offload':>15} {'onload':>15} {'move':>15} "
          f"{'memcpy':>7}")
    for r in sizes:
        cells = [f"{r[k + '_gbps']:.3f} ({r[k + '_ratio']:.3f})"
                 for k in ("offload", "onload", "move")]
        print(f"{r['size']:<8} {r['bytes'] / 1e6:>9.2f} " + " ".join(f"{c:>15}" for c in cells)
              + f" {r['memcpy_gbps']:>7.2f}")
    last = sizes[-1]
    out = {"sizes": sizes, **{k: last[k] for k in (
        "offload_gbps", "onload_gbps", "move_gbps", "memcpy_gbps", "swap_gbps")}}
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
    ap.add_argument("--sizes", default="tiny,small,medium")
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
