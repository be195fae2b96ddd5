"""Swap benchmark: training state in and out of trainer slots, and what sharing slots buys.

1. Per model size: one trainer slot (a real trainer worker process) trains the model one step
   (so AdamW state exists), then its whole training state is swapped out to this process and
   back in through the runtime (SwapOut / SwapIn), beside a plain in-memory copy (clone) of the
   same tensors in the same run. swap GB/s = state bytes / (out + in seconds) / 2 (the bytes
   cross twice); medians over --swaps rounds.
2. The default team (agents/math_duo.py, two trainable agents) trained with static reservation
   (`trainer_pool.slots = 0`: one slot per agent) and with one shared slot (`trainer_pool.slots = 1`), same
   config and seeds otherwise: trainer utilisation = time the slots' processes spent on requests
   (training, weight export, swaps) / (slots x wall time of the timed steps), step time, swaps.

    .venv/bin/python bench/swap.py [--json] [--sizes tiny,small,medium] [--swaps 3]
                                   [--steps 6] [--warmup 1] [--set section.key=value ...]

With --json the last line is one JSON object: swap_gbps and memcpy_gbps (largest size),
per size its numbers, util_static, util_shared, and per placement step_s and swaps.
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


async def swap_throughput(size: str, swaps: int) -> dict:
    from flexmarl.orchestrator.batch import micro_batch
    from flexmarl.models import ensure_model
    from flexmarl.protocol import SwapIn, SwapOut, TrainBeginBatch, TrainStep
    from flexmarl.training.trainer import TrainerConfig
    from runtime.supervisor import Supervisor, WorkerSpec
    from runtime.transport import connect

    model_dir = str(await asyncio.to_thread(ensure_model, size, warm_start_steps=0))
    cfg = dataclasses.asdict(TrainerConfig(lr=1e-4))
    work = tempfile.mkdtemp(prefix="flexmarl-swap-")
    sup = Supervisor()
    async with sup.serving():
        handle = await sup.start_worker(WorkerSpec(
            name="slot", entry="flexmarl.training.worker:trainer_worker",
            args={"rank": 0, "world_size": 1, "init_method": f"file://{work}/store"},
            ready_timeout_s=300))
        async with connect(handle.address) as slot:
            await slot.request(SwapIn(size, model_dir, cfg), timeout_s=300)
            mb = micro_batch([([1, 2, 3], [4, 5, 6, 7], [-1.0] * 4)] * 2, [1.0, -1.0])
            await slot.request(TrainBeginBatch(0))
            await slot.request(mb)
            await slot.request(TrainStep(8))
            outs, ins, copies, num_bytes = [], [], [], 0
            for _ in range(swaps):
                started = time.perf_counter()
                state = await slot.request(SwapOut(), timeout_s=300)
                outs.append(time.perf_counter() - started)
                num_bytes = sum(t.numel() * t.element_size() for t in state.tensors.values())
                started = time.perf_counter()
                copy = {k: v.clone() for k, v in state.tensors.items()}
                copies.append(time.perf_counter() - started)
                del copy
                started = time.perf_counter()
                await slot.request(SwapIn(size, model_dir, cfg, state.tensors, state.meta),
                                   timeout_s=300)
                ins.append(time.perf_counter() - started)
        await sup.stop_workers()
    out_s, in_s, copy_s = (statistics.median(v) for v in (outs, ins, copies))
    return {"size": size, "bytes": num_bytes, "out_s": out_s, "in_s": in_s,
            "swap_gbps": 2 * num_bytes / (out_s + in_s) / 1e9,
            "memcpy_gbps": num_bytes / copy_s / 1e9}


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
    print(f"{'size':<8} {'state MB':>9} {'out s':>7} {'in s':>7} {'swap GB/s':>10} "
          f"{'memcpy GB/s':>12}")
    for r in sizes:
        print(f"{r['size']:<8} {r['bytes'] / 1e6:>9.2f} {r['out_s']:>7.3f} {r['in_s']:>7.3f} "
              f"{r['swap_gbps']:>10.3f} {r['memcpy_gbps']:>12.2f}")
    out = {"sizes": sizes, "swap_gbps": sizes[-1]["swap_gbps"],
           "memcpy_gbps": sizes[-1]["memcpy_gbps"]}
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
