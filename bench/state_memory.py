"""State-size benchmark: what an agent's training state costs the orchestrator's process.

Trains a team (default agents/smol_duo.py: two SmolLM2-135M-Instruct agents) in this process
with recovery snapshots on and a durable state write every step (run.save_every = 1), then
reports this process's peak RSS (the orchestrator's: trainer ranks are other processes), each
worker process's peak RSS (VmHWM, by worker name: rollout instances and trainer ranks), each
agent's state size on disk, and the state saves' timings from the step records: stage_s (the
ranks copy their shards to host memory; the slot is held) and write_s (the ranks write them to
disk afterwards; the slot is free, the agent's next batch waits for it).

    .venv/bin/python bench/state_memory.py [--json] [--team PATH] [--steps 3] [--train-all]
                                           [--set section.key=value ...]

--train-all: every agent trains all its layers (AgentSpec.train_layers = None), so every sync
is the whole model's weights (what issue 54 measures: no weight passes through this process).

With --json the last line is one JSON object: peak_rss_mb, rss_before_mb (after imports, before
the run), worker_peak_rss_mb ({worker name: MB}), state_mb per agent, steps, wall_s, and, where the step records carry them, stage_s
and write_s per agent (means over the saves), sync_mb per agent (bytes per weight sync).
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import importlib.util
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

# `python bench/state_memory.py` puts bench/, not the repository root, on sys.path.
if importlib.util.find_spec("flexmarl") is None:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def dir_mb(path: Path) -> float:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) / 2**20


async def main(args: argparse.Namespace) -> dict:
    from flexmarl.config.load import load_config
    from flexmarl.launch.run import train
    from flexmarl.observe.rundir import RunDir
    from flexmarl.team import load_team

    out_dir = tempfile.mkdtemp(prefix="flexmarl-state-memory-")
    config = load_config(overrides=[
        f"run.out_dir={out_dir}", f"run.steps={args.steps}",
        "run.save_state=true", "run.save_every=1", "trainer_pool.snapshots=true",
        "eval.every_steps=0", "eval.final=false", *args.set], team=args.team)
    before = peak_rss_mb()
    started = time.perf_counter()
    team = load_team(config.team.path)
    if args.train_all:  # every layer trains: whole-model weights at every sync
        team = dataclasses.replace(team, agents=[
            dataclasses.replace(a, train_layers=None) for a in team.agents])
    from flexmarl.observe.procstat import PeakRss

    with PeakRss() as workers:
        result = await train(team, config, run_dir=RunDir.create(config), progress=False)
    wall = time.perf_counter() - started
    state_root = Path(result.run_dir) / "state"
    out = {"team": args.team, "train_all": args.train_all, "steps": len(result.metrics),
           "wall_s": wall, "sync_mb": _sync_mb(result.metrics),
           "rss_before_mb": before, "peak_rss_mb": peak_rss_mb(),
           "worker_peak_rss_mb": workers.by_worker(),
           "state_mb": {a.name: dir_mb(a) for a in sorted(state_root.iterdir()) if a.is_dir()}
           if state_root.is_dir() else {}}
    for key in ("stage_s", "write_s"):
        per_agent: dict[str, list[float]] = {}
        for m in result.metrics:
            for save in m.get("state_writes") or []:
                per_agent.setdefault(save["agent"], []).append(save[key])
        if per_agent:
            out[key] = {a: sum(v) / len(v) for a, v in per_agent.items()}
    return out


def _sync_mb(metrics: list[dict]) -> dict[str, float]:
    """Each agent's bytes per weight sync (MB, the mean over the steps that synced)."""
    per: dict[str, list[float]] = {}
    for m in metrics:
        for name, a in (m.get("agents") or {}).items():
            if a.get("sync_bytes"):
                per.setdefault(name, []).append(a["sync_bytes"] / 2**20)
    return {a: sum(v) / len(v) for a, v in per.items()}


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--team", default="agents/smol_duo.py")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--train-all", action="store_true",
                        help="every agent trains all its layers (AgentSpec.train_layers = None)")
    parser.add_argument("--set", action="append", default=[], metavar="section.key=value")
    args = parser.parse_args()
    out = asyncio.run(main(args))
    print(f"team {out['team']}: {out['steps']} steps in {out['wall_s']:.0f} s")
    print(f"orchestrator peak RSS  {out['peak_rss_mb']:8.0f} MB  (after imports: "
          f"{out['rss_before_mb']:.0f} MB)")
    for name, mb in out["worker_peak_rss_mb"].items():
        print(f"  worker {name:24s} peak RSS {mb:8.0f} MB")
    for agent, mb in out["state_mb"].items():
        line = (f"  {agent:12s} state on disk {mb:8.0f} MB  sync "
                f"{out['sync_mb'].get(agent, float('nan')):7.1f} MB")
        for key in ("stage_s", "write_s"):
            if key in out:
                line += f"  {key} {out[key].get(agent, float('nan')):6.2f}"
        print(line)
    if args.json:
        print(json.dumps(out))


if __name__ == "__main__":
    cli()
