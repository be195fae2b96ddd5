"""Learning benchmark: run the default experiment and report whether the team's reward rises.

Runs `flexmarl.train` on the default team (agents/math_duo.py) with the embedded default config
(plus any --set overrides), then reports per agent, and for the team reward, the mean reward of
the first and last `--window` steps, the number of steps and the wall time (model warm starts
included when they are not cached yet; they are reported separately when they happen).

    .venv/bin/python bench/learning.py [--json] [--window 3] [--set section.key=value ...]

With --json the last line is one JSON object: {"first_reward": {agent|"team": r}, "last_reward":
{...}, "steps": n, "wall_s": s, "seed": run.seed, ...}.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import tempfile
import time

# `python bench/learning.py` puts bench/, not the repository root, on sys.path.
if importlib.util.find_spec("flexmarl") is None:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def mean(values: list[float]) -> float | None:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def summarize(metrics: list[dict], window: int) -> dict:
    first, last = metrics[:window], metrics[-window:]
    agents = sorted(metrics[0]["agents"])
    out = {"first_reward": {"team": mean([m["team_reward"] for m in first])},
           "last_reward": {"team": mean([m["team_reward"] for m in last])}}
    for name in agents:
        out["first_reward"][name] = mean([m["agents"][name]["reward"] for m in first])
        out["last_reward"][name] = mean([m["agents"][name]["reward"] for m in last])
    out["steps"] = len(metrics)
    out["window"] = window
    out["step_s"] = mean([m["step_s"] for m in metrics])
    return out


async def main(args: argparse.Namespace) -> None:
    from flexmarl.config.load import load_config
    from flexmarl.observe.rundir import RunDir
    from flexmarl.launch.run import train
    from flexmarl.team import load_team

    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # CPU-irrelevant warnings  # as `flexmarl run` does
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    workdir = tempfile.mkdtemp(prefix="flexmarl-learning-")
    config = load_config(overrides=[f"run.out_dir={workdir}", *args.set])
    team = load_team(config.team.path)
    run_dir = RunDir.create(config)
    started = time.perf_counter()
    result = await train(team, config, run_dir=run_dir, progress=args.progress)
    wall_s = time.perf_counter() - started
    summary = summarize(result.metrics, args.window)
    summary.update(wall_s=wall_s, train_wall_s=result.wall_s, seed=config.run.seed,
                   backend=config.rollout.backend, run_dir=str(run_dir.path))
    rows = ["team"] + sorted(result.metrics[0]["agents"])
    print(f"default experiment: {summary['steps']} steps, {wall_s:.0f} s wall, seed "
          f"{config.run.seed}, {config.rollout.backend} rollout; mean reward of the first and "
          f"last {args.window} steps")
    print(f"{'':<10} {'first':>8} {'last':>8} {'change':>8}")
    for name in rows:
        a, b = summary["first_reward"][name], summary["last_reward"][name]
        print(f"{name:<10} {a:>8.3f} {b:>8.3f} {b - a:>+8.3f}")
    print(f"run dir: {run_dir.path}")
    if args.json:
        print(json.dumps(summary))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--window", type=int, default=3, help="steps averaged at each end")
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    ap.add_argument("--progress", action="store_true", help="show progress bars")
    return ap.parse_args(argv)


if __name__ == "__main__":
    import uvloop
    uvloop.run(main(parse_args()))
