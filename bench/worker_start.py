"""How long a worker takes to start: forked from the fork server (supervisor.preload) or a fresh
interpreter, side by side in one run.

Starts FlexMARL's two kinds of worker on the tiny built-in model, `--repeats` times each way:
a trainer rank (flexmarl.training.worker, empty until a SwapIn) and a rollout instance on the
torch engine (its model loaded: Ready means it can generate). Prints the median seconds from
start_worker() to Ready, and the first start of the fork-server way separately (it pays for the
server's own imports once per run). With --json the last line is one JSON object.

    python bench/worker_start.py [--repeats 5] [--json]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time

from flexmarl.config.load import WORKER_PRELOAD
from flexmarl.models import ensure_model
from runtime.config import SupervisorConfig
from runtime.supervisor import Supervisor, WorkerSpec


def _specs(model_dir: str, work: str, k: int) -> dict[str, WorkerSpec]:
    return {
        "trainer": WorkerSpec(name=f"trainer-{k}-0", entry="flexmarl.training.worker:trainer_worker",
                              args={"rank": 0, "world_size": 1,
                                    "init_method": f"file://{work}/t{k}.store"},
                              ready_timeout_s=300),
        "rollout": WorkerSpec(name=f"rollout-{k}", entry="flexmarl.rollout.worker:rollout_worker",
                              args={"backend": "torch", "model_dir": model_dir},
                              ready_timeout_s=300)}


async def _measure(preload: tuple[str, ...], model_dir: str, repeats: int) -> dict:
    out: dict = {"first_s": None, "trainer_s": [], "rollout_s": []}
    with tempfile.TemporaryDirectory(prefix="flexmarl-bench-start-") as work:
        sup = Supervisor(config=SupervisorConfig(preload=preload))
        async with sup.serving():
            for k in range(repeats + 1):
                for kind, spec in _specs(model_dir, work, k).items():
                    started = time.perf_counter()
                    await sup.start_worker(spec)
                    seconds = time.perf_counter() - started
                    if k == 0 and kind == "trainer":
                        out["first_s"] = seconds  # the fork server's own start included
                    elif k > 0:
                        out[f"{kind}_s"].append(seconds)
                await sup.stop_workers()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    model_dir = str(ensure_model("tiny"))
    rows = {}
    for label, preload in (("fresh interpreter", ()), ("fork server", WORKER_PRELOAD)):
        r = asyncio.run(_measure(preload, model_dir, args.repeats))
        rows[label] = {"first_s": round(r["first_s"], 3),
                       "trainer_median_s": round(statistics.median(r["trainer_s"]), 3),
                       "rollout_median_s": round(statistics.median(r["rollout_s"]), 3)}
    print(f"{'start':<20}{'first trainer':>15}{'trainer (median)':>18}{'rollout (median)':>18}")
    for label, r in rows.items():
        print(f"{label:<20}{r['first_s']:>14.2f}s{r['trainer_median_s']:>17.2f}s"
              f"{r['rollout_median_s']:>17.2f}s")
    fresh, forked = rows["fresh interpreter"], rows["fork server"]
    ratios = {k: round(fresh[k] / forked[k], 1) for k in ("trainer_median_s", "rollout_median_s")}
    print(f"fresh / forked: trainer {ratios['trainer_median_s']}x, "
          f"rollout {ratios['rollout_median_s']}x")
    if args.json:
        print(json.dumps({"repeats": args.repeats, "rows": rows, "ratios": ratios}))


if __name__ == "__main__":
    main()
