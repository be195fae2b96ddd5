"""Pipeline benchmark: the same workload in sync, one_step_off and micro_batch, side by side.

Runs `flexmarl.train` once per mode with one config (team, seeds, steps, batch shape; only
`pipeline.mode` differs) on real rollout engines and trainer processes, each with a run
directory in a temp dir written as `flexmarl run` writes it (metrics, every agent's state per
step, final checkpoints; removed afterwards), then reports per mode
the mean step time, trainer and rollout utilisation, and the staleness of trained samples, plus

    speedup_micro_batch_vs_sync = sync step time / micro_batch step time
    ideal_speedup = (rollout + train) / max(rollout, train), from the sync run's phases:
                    rollout = its rollout_s, train = step_s - rollout_s (training and sync)

Target: micro_batch >= 1.25x sync on the default team (agents/smol_duo.py with the default
config, the torch engine on a CPU machine) and never slower than sync. The zero-staleness bound
says how much is reachable at all: every call of the first-called agent waits for that agent's
update of the previous step, so a step is at least sync's rollout plus that agent's tail alone
(its last micro-batch, optimizer step and weight sync, as the sync run measured them without
contention: train_s / micro-batches + sync_s); bound = sync step / (sync rollout + that tail).

Threads are budgeted per role, because rollout and training would otherwise fight for the same
cores and no mode could overlap anything: the config's default `rollout.cpus = trainer_pool.cpus =
"auto"` pins rollout processes to the first half of the cores and trainer processes to the
second (OpenMP pools sized to match, vLLM's OMP binding set to the same cores); `--set
rollout.cpus= --set trainer_pool.cpus=` measures without pinning. The first `--warmup` steps of each
run (engine and allocator warm-up) are left out of the means.

    .venv/bin/python bench/pipeline.py [--json] [--steps 6] [--warmup 1] [--modes ...]
                                        [--set section.key=value ...]

With --json the last line is one JSON object: per mode {step_s, rollout_util, trainer_util,
staleness, ...}, speedup_micro_batch_vs_sync, ideal_speedup, fraction_of_ideal,
zero_staleness_bound, met, config.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import time

# `python bench/pipeline.py` puts bench/, not the repository root, on sys.path.
if importlib.util.find_spec("flexmarl") is None:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

MODES = ("sync", "one_step_off", "micro_batch")
ACTIVITY_MAXLEN = 5000  # flexmarl.activity.ActivityLog's default bound
TARGET_SPEEDUP = 1.25
"""micro_batch over sync on the default team (issue 50)."""
DEFAULT_TEAM = "agents/smol_duo.py"
DEFAULTS: list[str] = ["eval.before=false", "eval.final=false"]
"""The default config (what `make run` trains with) without its held-out evaluations, which
are no step's work; --set adds to it. The numbers measured
before 2026-12-05 in bench/README ran agents/math_duo.py with pipeline.tasks_per_step=16,
micro_batch_groups=8 and rollout.backend=vllm (pass those to repeat them)."""


def mean(values) -> float:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else float("nan")


def summarize(metrics: list[dict], warmup: int, micro_batch_groups: int = 1) -> dict:
    timed = metrics[warmup:] or metrics
    agents = [a for a, v in timed[0]["agents"].items() if v["trainable"]]
    per_agent = [m["agents"][a] for m in timed for a in agents]
    samples = sum(a["trained_samples"] for a in per_agent)
    stale = sum(int(k) * n for a in per_agent for k, n in a["staleness_hist"].items())
    hist: dict[str, int] = {}
    for a in per_agent:
        for k, n in a["staleness_hist"].items():
            hist[k] = hist.get(k, 0) + n
    # The timed window: from the end of the last warm-up step to the end of the run. Busy times
    # of the window's steps over its length, per agent, averaged over agents: the share of wall
    # time an agent's rollout instances (or its trainer, training and syncing) had work. In
    # overlapped modes a step's rollout starts before the previous step ends, so this is only
    # right on average over several steps.
    window = sum(m["step_s"] for m in timed)
    return {
        "step_s": mean([m["step_s"] for m in timed]),
        "rollout_s": mean([m["rollout_s"] for m in timed]),
        "train_phase_s": mean([m["step_s"] - m["rollout_s"] for m in timed]),
        "rollout_util": sum(a["rollout_busy_s"] for a in per_agent) / len(agents) / window,
        "trainer_util": sum(a["train_s"] + a["sync_s"] for a in per_agent) / len(agents) / window,
        "train_s": mean([a["train_s"] for a in per_agent]),
        "sync_s": mean([a["sync_s"] for a in per_agent]),
        "staleness": stale / samples if samples else None,
        "staleness_hist": dict(sorted(hist.items())),
        "team_reward": mean([m["team_reward"] for m in timed]),
        # After a step's last task ended: its last micro-batches, optimizer steps and weight
        # syncs, until the last agent is done (what no overlap can hide at zero staleness).
        "tail_s": mean([max(a["t_done"] for a in m["agents"].values() if a["trainable"])
                        - m["t_rollout_end"] for m in timed]),
        "steps_timed": len(timed),
        # Each agent's tail alone: its last micro-batch (train_s over its micro-batches, the
        # optimizer step included) and its weight sync, as this run measured them.
        "tail_alone_s": {a: mean([m["agents"][a]["train_s"]
                                  / max(1, -(-m["agents"][a]["groups"] // micro_batch_groups))
                                  + m["agents"][a]["sync_s"] for m in timed]) for a in agents},
        "first_agent": agents[0],
    }


def load(mode: str, args: argparse.Namespace, workdir: str = "runs"):
    from flexmarl.config.load import load_config
    team = [f"team.path={args.team}"] if args.team else []
    return load_config(overrides=[f"run.out_dir={workdir}", f"run.steps={args.steps}",
                                  f"pipeline.mode={mode}", *DEFAULTS, *team, *args.set])


def fmt_load(load: tuple[float, float, float]) -> str:
    return " ".join(f"{x:.2f}" for x in load)


def models_used(args: argparse.Namespace) -> dict:
    """Each agent's model and, for a built-in one, its warm start's record (held-out accuracy,
    the numerics it ran with): the workload depends on how good the models are."""
    from flexmarl.launch.model_dirs import resolve_model
    from flexmarl.models import WARM_START_FILE
    from flexmarl.team import load_team

    out = {}
    for spec in load_team(load(args.modes[0], args).team.path).agents:
        path = resolve_model(spec)
        record = os.path.join(path, WARM_START_FILE)
        warm = json.load(open(record)) if os.path.isfile(record) else None
        out[spec.name] = {"model": spec.model, "dir": os.path.basename(path), "warm_start": warm}
    return out


def timed_window(metrics: list[dict], warmup: int) -> tuple[float, float]:
    """Seconds since the loop started: from the end of the last warm-up step (its last agent
    done) to the end of the run's last step."""
    def end(m: dict) -> float:
        return max(a["t_done"] for a in m["agents"].values() if a["trainable"])
    return (end(metrics[warmup - 1]) if warmup else 0.0), end(metrics[-1])


def where_time_went(result, args: argparse.Namespace, sampler) -> dict:
    """The rollout phase split per agent (from the run's activity log), CPU per process and
    core over the timed window (from /proc), and a text chart of one timed step."""
    from flexmarl.observe import procstat, timeline

    timed = result.metrics[args.warmup:] or result.metrics
    agents = [a for a, v in timed[0]["agents"].items() if v["trainable"]]
    phases = timeline.mean_phases(timeline.rollout_phases(result.timeline, timed, agents))
    t0, t1 = timed_window(result.metrics, args.warmup)
    origin = result.loop_started
    usage = sampler.usage(origin + t0, origin + t1)
    # One timed step, from the end of the step before it to its own end, with its rollout's
    # start (<) and end (>) on the ruler.
    k = min(args.warmup + 1, len(result.metrics) - 1)
    a, b = timed_window(result.metrics[:k + 1], k)
    rec = result.metrics[k]
    chart = timeline.chart(result.timeline, a, b, agents,
                           marks=[(rec["t_rollout_start"], "<"), (rec["t_rollout_end"], ">")])
    return {"phases": phases,
            "cpu": {name: u.as_dict() for name, u in sorted(usage.items()) if u.cpu_s >= 0.05},
            "cpu_by_role": {role: {str(c): round(s, 2) for c, s in sorted(cores.items())}
                            for role, cores in procstat.by_role(usage).items()},
            "window_s": t1 - t0, "chart_step": k, "chart": chart,
            "activity_full": len(result.timeline) >= ACTIVITY_MAXLEN}


async def run_mode(mode: str, args: argparse.Namespace) -> tuple[dict, float]:
    from flexmarl.launch.run import train
    from flexmarl.observe.procstat import ProcessSampler
    from flexmarl.observe.rundir import RunDir
    from flexmarl.team import load_team

    workdir = tempfile.mkdtemp(prefix=f"flexmarl-bench-{mode}-")
    try:
        config = load(mode, args, workdir)
        team = load_team(config.team.path)
        # A run directory as `flexmarl run` writes it (metrics.jsonl, every agent's state per
        # step, final checkpoints): the bench pays for the saves users pay for.
        run_dir = RunDir.create(config)
        started, cpu = time.perf_counter(), time.process_time()
        try:
            with ProcessSampler() as sampler:
                result = await train(team, config, run_dir=run_dir, progress=args.progress)
        finally:
            run_dir.close()
        wall = time.perf_counter() - started
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    summary = summarize(result.metrics, args.warmup, config.pipeline.micro_batch_groups)
    # This process (orchestrator, store, micro-batch building) is not pinned: its share of a
    # core over the run, start-up included, is CPU the pinned roles lose to it.
    summary["driver_cpu_share"] = (time.process_time() - cpu) / wall
    summary.update(where_time_went(result, args, sampler))
    return summary, wall


def print_breakdown(results: dict[str, dict]) -> None:
    print("\nrollout phase per agent, s per step (generating: a request in flight; gate: a call "
          "held for the agent's previous update; other: waiting for other agents), and the "
          "agent's trainer busy / syncing during it")
    print(f"{'mode':<13} {'agent':<10} {'rollout':>7} {'generating':>10} {'gate':>6} "
          f"{'other':>6} {'train':>6} {'sync':>6}")
    for mode, r in results.items():
        for agent, p in r["phases"].items():
            print(f"{mode:<13} {agent:<10} {p['rollout_s']:>7.2f} {p['generating_s']:>10.2f} "
                  f"{p['gate_s']:>6.2f} {p['other_s']:>6.2f} {p['train_s']:>6.2f} "
                  f"{p['sync_s']:>6.2f}")
    print("\nCPU seconds per step by process and core over the timed steps (unpinned: threads "
          "allowed beyond their process's cores)")
    for mode, r in results.items():
        steps = max(1, r["steps_timed"])
        for name, u in r["cpu"].items():
            cores = " ".join(f"core{c} {s / steps:.2f}" for c, s in u["cores"].items())
            unpinned = ", ".join(f"{t} {s / steps:.2f}" for t, s in u["unpinned"].items()
                                 if s / steps >= 0.01)
            print(f"{mode:<13} {name[:34]:<34} {u['cpu_s'] / steps:>6.2f}  [{cores}]"
                  f"  allowed {','.join(map(str, u['allowed'])) or '-'}"
                  + (f"  unpinned: {unpinned}" if unpinned else ""))
        roles = "; ".join(f"{role} " + " ".join(f"core{c} {s / steps:.2f}" for c, s in cores.items())
                          for role, cores in r["cpu_by_role"].items())
        print(f"{mode:<13} by role: {roles}")
    for mode, r in results.items():
        print(f"\n{mode}: step {r['chart_step']} (g generating, w gate wait, T training, "
              "S sync; < > the step's rollout)")
        print("\n".join(r["chart"]))
        if r["activity_full"]:
            print("(the activity log was full: its oldest intervals were dropped)")


async def main(args: argparse.Namespace) -> None:
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # CPU-irrelevant warnings
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    from flexmarl.placement.cores import role_cpus
    first = load(args.modes[0], args)
    rollout_cpus, train_cpus = (",".join(map(str, c)) or "all"
                                for c in role_cpus(first.rollout.cpus, first.trainer_pool.cpus,
                                                   first.trainer.device))
    load_start = os.getloadavg()
    results: dict[str, dict] = {}
    for mode in args.modes:
        summary, wall = await run_mode(mode, args)
        summary["wall_s"] = wall
        results[mode] = summary
        print(f"{mode}: {summary['steps_timed']} timed steps, mean {summary['step_s']:.2f} s "
              f"({wall:.0f} s with start-up)", file=sys.stderr, flush=True)

    print(f"\npipeline modes: {args.steps} steps each (first {args.warmup} not timed), rollout on "
          f"cores [{rollout_cpus}], training on cores [{train_cpus}]")
    print(f"{'mode':<13} {'step s':>7} {'rollout s':>9} {'rollout util':>12} "
          f"{'trainer util':>12} {'staleness':>9} {'tail s':>7} {'driver cpu':>10}  "
          f"{'team reward':>11}")
    for mode, r in results.items():
        stale = "-" if r["staleness"] is None else f"{r['staleness']:.2f}"
        print(f"{mode:<13} {r['step_s']:>7.2f} {r['rollout_s']:>9.2f} {r['rollout_util']:>12.2f} "
              f"{r['trainer_util']:>12.2f} {stale:>9} {r['tail_s']:>7.2f} "
              f"{r['driver_cpu_share']:>10.2f}  {r['team_reward']:>11.3f}")
    load_end = os.getloadavg()
    print_breakdown(results)
    print(f"\nload average (1, 5, 15 min) at start {fmt_load(load_start)}, at end "
          f"{fmt_load(load_end)} ({os.cpu_count()} cores)")
    out: dict = {"modes": results, "load_start": load_start, "load_end": load_end,
                 "models": models_used(args),
                 "config": {"steps": args.steps, "warmup": args.warmup, "team": args.team,
                                              "rollout_cpus": rollout_cpus,
                                              "train_cpus": train_cpus,
                                              "set": DEFAULTS + args.set}}
    if "sync" in results:
        s = results["sync"]
        ideal = (s["rollout_s"] + s["train_phase_s"]) / max(s["rollout_s"], s["train_phase_s"])
        out["ideal_speedup"] = ideal
        print(f"\nsync phases: rollout {s['rollout_s']:.2f} s, train + sync "
              f"{s['train_phase_s']:.2f} s -> ideal overlap speedup {ideal:.2f}x")
        for mode in results:
            if mode == "sync":
                continue
            speedup = s["step_s"] / results[mode]["step_s"]
            out[f"speedup_{mode}_vs_sync"] = speedup
            print(f"{mode} vs sync: {speedup:.2f}x ({speedup / ideal:.0%} of ideal)")
        if "micro_batch" in results:
            speedup = out["speedup_micro_batch_vs_sync"]
            out["fraction_of_ideal"] = speedup / ideal
            # At zero staleness every call of the first-called agent waits for that agent's
            # update of the step before: its tail alone (measured by the sync run, without
            # contention) is a wait no overlap can hide, so a step is at least sync's rollout
            # plus that tail.
            first = s["first_agent"]
            tail = s["tail_alone_s"][first]
            bound = (s["rollout_s"] + s["train_phase_s"]) / (s["rollout_s"] + tail)
            out["zero_staleness_bound"] = bound
            print(f"zero-staleness bound: sync rollout {s['rollout_s']:.2f} s + {first}'s tail "
                  f"alone {tail:.2f} s -> {bound:.2f}x ({bound / ideal:.0%} of ideal); "
                  f"micro_batch at {speedup / bound:.0%} of it")
            out["met"] = speedup >= TARGET_SPEEDUP
            print(f"target: micro_batch >= {TARGET_SPEEDUP}x sync: "
                  f"{'met' if out['met'] else 'NOT met'}")
    if args.json:
        print(json.dumps(out))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--steps", type=int, default=6, help="global steps per mode")
    ap.add_argument("--warmup", type=int, default=1, help="first steps left out of the means")
    ap.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES + ("bounded",))
    ap.add_argument("--team", default=DEFAULT_TEAM,
                    help=f"team file (default: {DEFAULT_TEAM}, the default team)")
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                    help="config override applied to every mode")
    ap.add_argument("--progress", action="store_true", help="show progress bars")
    args = ap.parse_args(argv)
    if args.steps <= args.warmup:
        ap.error("--steps must exceed --warmup")
    return args


if __name__ == "__main__":
    import uvloop
    uvloop.run(main(parse_args()))
