"""Chaos benchmark: a multi-step run with workers killed at seeded random points, against the
same run without faults.

Both runs train the test team of tests/test_e2e.py (two agents, "tiny" models built locally,
the torch rollout backend: sampling is exactly reproducible from each request's seed) with
the same config and seed, two rollout instances per agent. During the chaos run a killer
SIGKILLs `--kills` workers, one at a time, each at a random moment of a random step (seeded by
`--seed`; in the first half of the run, so that replacements, which take seconds to start,
serve before it ends): a kind drawn from `--kinds`, then one of its live workers (rollout
workers: their requests are re-sent and a replacement starts; trainer workers: the slot gets
new processes and its agent re-accumulates its batch from the snapshot of its last step).
Reported:

    kills               workers killed
    steps_completed     steps finished by the chaos run (of --steps)
    samples_lost        samples the fault-free run generated in those steps and the chaos run
                        did not (per agent, summed)
    samples_duplicated  samples the experience store refused as already stored or trained
    recovery_s_max      longest time from a death to its replacement serving (rollout) or
                        started (trainer)
    replaced            replacements that finished before the run did (a rollout replacement
                        takes seconds; a kill near the end may see the run end first)
    redispatched        requests re-sent to another instance after theirs died
    restarted_steps     agent steps redone from a snapshot because their trainer died
    same_weights        final weights within lr/100 of the fault-free run's (max abs diff)

    .venv/bin/python bench/chaos.py [--json] [--steps 16] [--kills 4] [--seed 0]
                                    [--kinds rollout,trainer]

Targets: nothing lost, nothing duplicated, same weights.
"""
from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import random
import signal
import sys
import tempfile
import time
from pathlib import Path

if importlib.util.find_spec("flexmarl") is None:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the test team and the worker finder
LR = 1e-3


def config_for(run_dir: Path, steps: int):
    from flexmarl.config.load import load_config
    return load_config(overrides=[
        f"run.dir={run_dir}", f"run.steps={steps}", "rollout.backend=torch",
        "rollout.instances_per_agent=2", "pipeline.mode=sync", "pipeline.tasks_per_step=8",
        "pipeline.trajectories_per_task=2", "pipeline.micro_batch_groups=2", f"trainer.lr={LR}",
        "observe.tensorboard=false", "observe.report=false"])


async def run(model_dir: str, run_dir: Path, steps: int, killer=None) -> dict:
    from test_e2e import duo

    from flexmarl.observe.rundir import RunDir, read_metrics
    from flexmarl.launch.run import train

    config = config_for(run_dir, steps)
    url: asyncio.Future = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(train(duo(model_dir), config, run_dir=RunDir.create(config),
                                     progress=False, on_dashboard=url.set_result))
    kills: list[dict] = []
    killing = asyncio.create_task(killer(await url, task, kills)) if killer else None
    error = None
    try:
        result = await task
        checkpoints = result.checkpoints
    except Exception as exc:  # a fault the system does not survive: report it
        error, checkpoints = f"{type(exc).__name__}: {exc}", {}
    if killing is not None:
        killing.cancel()
        await asyncio.gather(killing, return_exceptions=True)
    metrics = read_metrics(run_dir / "metrics.jsonl") if (run_dir / "metrics.jsonl").exists() \
        else []
    return {"metrics": metrics, "checkpoints": checkpoints, "kills": kills, "error": error}


def make_killer(rng: random.Random, n: int, kinds: list[str], steps: int):
    async def killer(base: str, task: asyncio.Task, kills: list[dict]) -> None:
        import aiohttp
        from workers import running_workers
        # Kills fall in the first half, so replacements (seconds to start) serve before the end.
        targets = sorted(rng.randrange(0, max(steps // 2, 1)) for _ in range(n))
        async with aiohttp.ClientSession() as http:
            for k in range(n):
                step = targets[min(k, len(targets) - 1)]
                while True:  # wait until the target step's rollout has started
                    async with http.get(base + "api/status") as r:
                        st = await r.json()
                    if st["run"]["rollout_step"] >= step or task.done():
                        break
                    await asyncio.sleep(0.01)
                await asyncio.sleep(rng.uniform(0.0, 0.2))
                live = running_workers()
                kind = rng.choice(kinds)  # the kind first: trainers are fewer than instances
                pool = sorted(w for w in live if w.startswith(f"{kind}-"))
                if not pool or task.done():
                    return
                victim = rng.choice(pool)
                os.kill(live[victim], signal.SIGKILL)
                kills.append({"worker": victim, "step": st["run"]["rollout_step"],
                              "at": time.time()})
                await asyncio.sleep(0.5)  # let the death be noticed before the next one
    return killer


def compare(chaos: dict, clean: dict) -> dict:
    from safetensors.torch import load_file

    done = chaos["metrics"]
    lost = 0
    for m, ref in zip(done, clean["metrics"]):
        for name, a in ref["agents"].items():
            lost += max(0, a["samples"] - m["agents"][name]["samples"])
    dup = max((a.get("duplicates", 0) for m in done for a in m["agents"].values()), default=0)
    faults = [m.get("faults", {}) for m in done]
    replacements = [r for f in faults for r in [*f.get("replacements", []),
                                                *f.get("trainer", {}).get("replacements", [])]]
    diff = None
    if chaos["checkpoints"] and len(done) == len(clean["metrics"]):
        diff = 0.0
        for name, path in chaos["checkpoints"].items():
            a = load_file(str(path / "model.safetensors"))
            b = load_file(str(clean["checkpoints"][name] / "model.safetensors"))
            diff = max(diff, max((a[k] - b[k]).abs().max().item() for k in a))
    return {
        "kills": len(chaos["kills"]), "killed": [k["worker"] for k in chaos["kills"]],
        "steps_completed": len(done), "samples_lost": lost, "samples_duplicated": dup,
        "recovery_s_max": max((r["seconds"] for r in replacements), default=0.0),
        "replaced": len(replacements),
        "redispatched": sum(f.get("redispatched", 0) for f in faults),
        "restarted_steps": sum(f.get("trainer", {}).get("restarted_steps", 0) for f in faults),
        "same_weights": diff is not None and diff <= LR / 100, "max_weight_diff": diff,
        "error": chaos["error"]}


async def main(args: argparse.Namespace) -> dict:
    from flexmarl.models import build_model_dir

    work = Path(tempfile.mkdtemp(prefix="flexmarl-chaos-"))
    model_dir = str(build_model_dir("tiny", work / "model", seed=0))
    clean = await run(model_dir, work / "clean", args.steps)
    if clean["error"]:
        raise SystemExit(f"the fault-free run failed: {clean['error']}")
    killer = make_killer(random.Random(args.seed), args.kills, args.kinds.split(","), args.steps)
    chaos = await run(model_dir, work / "chaos", args.steps, killer)
    out = compare(chaos, clean)
    out["config"] = {"steps": args.steps, "kills": args.kills, "seed": args.seed,
                     "kinds": args.kinds}
    out["met"] = (out["samples_lost"] == 0 and out["samples_duplicated"] == 0
                  and out["same_weights"] and out["steps_completed"] == args.steps)
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--kills", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--kinds", default="rollout,trainer",
                    help="comma-separated: rollout, trainer")
    args = ap.parse_args()
    out = asyncio.run(main(args))
    print(f"{'kills':20s} {out['kills']} ({', '.join(out['killed']) or '-'})")
    for key in ("steps_completed", "samples_lost", "samples_duplicated", "recovery_s_max",
                "replaced", "redispatched", "restarted_steps", "same_weights", "max_weight_diff",
                "error", "met"):
        value = out[key]
        print(f"{key:20s} {value:.3g}" if isinstance(value, float) else f"{key:20s} {value}")
    if args.json:
        print(json.dumps(out))
