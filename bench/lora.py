"""LoRA benchmark: a team as adapters on one shared base against the same team as full copies.

Runs `flexmarl.train` twice on the same workflow, tasks, seed and steps: the team of
`--team` (default agents/smol_trio.py: three SmolLM2-135M-Instruct agents) built by its
`team_of(lora=True)` and `team_of(lora=False)`, both with the product's default trainer slots
(trainer_pool.slots = 0: the three adapters share one slot, their base held once and their
adapters swapped, trainer_pool.share_lora_base; the three full copies get a slot each), or with
`--slots N` trainer slots shared by each team (`--slots 1`: every step swaps, in both runs; the
comparison measured before issue 54). Reported per run, side by side with the ratio adapters /
full:

- peak RSS of the rollout processes and of the trainer processes (each process's own peak,
  VmHWM, sampled from /proc every 0.2 s while the run lives; summed per role);
- sync bytes and seconds per step (every agent's weight push), swap seconds per step (the
  trainer pool's swaps in and out), step time (mean of the steps after the first);
- held-out accuracy before and after, greedy (eval.before, eval.final: `--heldout` tasks).

    .venv/bin/python bench/lora.py [--json] [--team PATH] [--steps 10] [--heldout 50]
                                   [--slots N] [--set section.key=value ...]

On this machine (24 GB) the full team on one slot needs the snapshots off (its three parked
states plus their snapshots in /dev/shm outgrow the memory: the OOM killer took the slot):
`--set run.save_state=false --set trainer_pool.snapshots=false`, as measured in bench/README
(`--slots 1`). With the default slots the full team runs three trainer processes, each with
its model, AdamW state and activations: not measured here yet (bench/README, 2026-12-05 note).

Targets (issue 38): memory of the adapter team <= 0.5x the full team's, sync bytes per step
<= 0.1x, and the adapter team learns (+10 points greedy for at least one agent). With --json
the last line is one JSON object: {"lora": run, "full": run, "ratio": {...}}, a run being
{peak_rss_mb: {rollout, trainer}, sync_mb_per_step, sync_s_per_step, swap_mb_per_step,
swap_s_per_step, step_s, heldout: {agent: {before, after, se_change}}, wall_s}.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import tempfile
import time
from pathlib import Path

# `python bench/lora.py` puts bench/, not the repository root, on sys.path.
if importlib.util.find_spec("flexmarl") is None:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

ROOT = Path(__file__).resolve().parent.parent


def per_step(metrics: list[dict], key: str) -> float:
    """An agent metric summed over the agents, averaged over the steps."""
    totals = [sum(a.get(key) or 0 for a in m["agents"].values()) for m in metrics]
    return sum(totals) / len(totals) if totals else 0.0


def swap_s(metrics: list[dict]) -> float:
    return sum(sum(s.get("seconds", 0.0) for s in m.get("swaps", [])) for m in metrics) / max(
        len(metrics), 1)


async def run_one(team, args: argparse.Namespace, workdir: str) -> dict:
    from flexmarl.config.load import load_config
    from flexmarl.launch.run import train
    from flexmarl.observe.rundir import RunDir

    config = load_config(overrides=[
        f"run.out_dir={workdir}", f"run.name={team.name}", f"run.steps={args.steps}",
        f"eval.final_tasks={args.heldout}",
        *([f"trainer_pool.slots={args.slots}"] if args.slots else []), *args.set])
    started = time.perf_counter()
    from flexmarl.observe.procstat import PeakRss

    with PeakRss() as rss:
        try:
            result = await train(team, config, run_dir=RunDir.create(config),
                                 progress=args.progress)
        except Exception as exc:  # e.g. the machine's memory ran out: say so, keep the peaks
            return {"team": team.name, "agents": [a.name for a in team.agents],
                    "failed": f"{type(exc).__name__}: {exc}"[:300],
                    "peak_rss_mb": rss.by_role(), "wall_s": time.perf_counter() - started}
    metrics = result.metrics
    later = metrics[1:] or metrics
    return {"team": team.name, "agents": [a.name for a in team.agents],
            "peak_rss_mb": rss.by_role(),
            "sync_mb_per_step": per_step(metrics, "sync_bytes") / 2**20,
            "sync_s_per_step": per_step(metrics, "sync_s"),
            "swap_s_per_step": swap_s(metrics),
            "swap_mb_per_step": sum(sum(s.get("num_bytes", 0) for s in m.get("swaps", []))
                                    for m in metrics) / len(metrics) / 2**20,
            "swaps_per_step": sum(len(m.get("swaps", [])) for m in metrics) / len(metrics),
            "step_s": sum(m["step_s"] for m in later) / len(later),
            "heldout": {name: modes.get("greedy") for name, modes in
                        sorted((result.heldout or {}).items())},
            "steps": len(metrics), "wall_s": time.perf_counter() - started,
            "run_dir": str(result.run_dir)}


def ratios(lora: dict, full: dict) -> dict:
    def r(a: float, b: float) -> float | None:
        return a / b if b else None
    return {"rollout_rss": r(lora["peak_rss_mb"]["rollout"], full["peak_rss_mb"]["rollout"]),
            "trainer_rss": r(lora["peak_rss_mb"]["trainer"], full["peak_rss_mb"]["trainer"]),
            "total_rss": r(sum(lora["peak_rss_mb"].values()), sum(full["peak_rss_mb"].values())),
            "sync_bytes": r(lora["sync_mb_per_step"], full["sync_mb_per_step"]),
            "sync_s": r(lora["sync_s_per_step"], full["sync_s_per_step"]),
            "swap_bytes": r(lora["swap_mb_per_step"], full["swap_mb_per_step"]),
            "swap_s": r(lora["swap_s_per_step"], full["swap_s_per_step"]),
            "step_s": r(lora["step_s"], full["step_s"])}


def table(out: dict) -> str:
    from flexmarl.launch.summary import change_cell

    lora, full, ratio = out["lora"], out["full"], out["ratio"]

    def row(name: str, a: float, b: float, q: float | None, fmt: str = "{:.1f}") -> str:
        return (f"{name:<26} {fmt.format(a):>12} {fmt.format(b):>12} "
                f"{'-' if q is None else f'{q:.3f}x':>10}")

    slots = (f"{out['slots']} trainer slot(s)" if out["slots"] else
             "default trainer slots (adapters: one per base; full copies: one each)")
    lines = [f"{len(lora['agents'])} agents ({', '.join(lora['agents'])}), {lora['steps']} steps, "
             f"{slots}; adapters vs full copies",
             f"{'':<26} {'adapters':>12} {'full':>12} {'ratio':>10}",
             row("rollout peak RSS (MB)", lora["peak_rss_mb"]["rollout"],
                 full["peak_rss_mb"]["rollout"], ratio["rollout_rss"]),
             row("trainer peak RSS (MB)", lora["peak_rss_mb"]["trainer"],
                 full["peak_rss_mb"]["trainer"], ratio["trainer_rss"]),
             row("all workers (MB)", sum(lora["peak_rss_mb"].values()),
                 sum(full["peak_rss_mb"].values()), ratio["total_rss"]),
             row("sync MB per step", lora["sync_mb_per_step"], full["sync_mb_per_step"],
                 ratio["sync_bytes"], "{:.2f}"),
             row("sync s per step", lora["sync_s_per_step"], full["sync_s_per_step"],
                 ratio["sync_s"], "{:.3f}"),
             row("swap MB per step", lora["swap_mb_per_step"], full["swap_mb_per_step"],
                 ratio["swap_bytes"], "{:.1f}"),
             row("swap s per step", lora["swap_s_per_step"], full["swap_s_per_step"],
                 ratio["swap_s"], "{:.3f}"),
             row("step s (after the first)", lora["step_s"], full["step_s"], ratio["step_s"]),
             "held-out greedy reward, before -> after (± the change's standard error)",
             f"{'':<26} {'adapters':>26} {'full':>26}"]
    for name in lora["agents"]:
        lines.append(f"{name:<26} {change_cell(lora['heldout'].get(name)):>26} "
                     f"{change_cell(full['heldout'].get(name)):>26}")
    lines.append(f"wall: {lora['wall_s']:.0f} s (adapters), {full['wall_s']:.0f} s (full)")
    return "\n".join(lines)


def load_team_module(path: str):
    spec = importlib.util.spec_from_file_location("flexmarl_bench_lora_team", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    if not hasattr(module, "team_of"):
        raise SystemExit(f"{path} has no team_of(lora: bool) -> Team (agents/smol_trio.py has)")
    return module


async def main(args: argparse.Namespace) -> None:
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    module = load_team_module(args.team)
    workdir = tempfile.mkdtemp(prefix="flexmarl-bench-lora-")
    out = {"slots": args.slots}
    for name, lora in (("lora", True), ("full", False)):
        print(f"running the {'adapter' if lora else 'full-copy'} team ...", flush=True)
        out[name] = await run_one(module.team_of(lora=lora), args, workdir)
    failed = [f"the {name} run failed: {out[name]['failed']}" for name in ("lora", "full")
              if "failed" in out[name]]
    if failed:  # what each run measured before it stopped
        out["ratio"] = {}
        print("\n".join(failed))
        print(json.dumps({k: out[k] for k in ("lora", "full")}, indent=1))
    else:
        out["ratio"] = ratios(out["lora"], out["full"])
        print(table(out))
    if args.json:
        print(json.dumps(out))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--team", default=str(ROOT / "agents" / "smol_trio.py"),
                    help="a team file with team_of(lora: bool) (default agents/smol_trio.py)")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--heldout", type=int, default=50, metavar="N",
                    help="held-out tasks measured greedy before and after (0: all)")
    ap.add_argument("--slots", default="",
                    help="trainer_pool.slots of both runs (default: the product's, slots = 0: "
                         "the adapters share one slot, the full copies get one each)")
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    ap.add_argument("--progress", action="store_true", help="show progress bars")
    return ap.parse_args(argv)


if __name__ == "__main__":
    import uvloop
    uvloop.run(main(parse_args()))
