"""Learning benchmark: train a team and report whether its reward and held-out accuracy rise.

Runs `flexmarl.train` on a team (default: agents/math_duo.py, `--team PATH` another) with the
embedded default config (plus any --set overrides), then reports per agent, and for the team
reward, the mean reward of the first and last `--window` steps, the number of steps and the wall
time (model builds included when they are not cached yet). When the team has held-out tasks
(Team.heldout), the run itself measures each trainable agent on them before training (its
starting weights, eval.before) and after (its final weights, eval.final), greedy and sampled,
through its own rollout instances (flexmarl.orchestrator.heldout): this reports those numbers
(RunResult.heldout), and the time from the run's start to its first step's record.

    .venv/bin/python bench/learning.py [--json] [--team PATH] [--window 3] [--heldout N]
                                       [--set section.key=value ...]
                                       [--cross-play [--deals 200] [--versions 1]]

With --json the last line is one JSON object: {"first_reward": {agent|"team": r}, "last_reward":
{...}, "curve": {agent|"team": [reward per step]}, "noise": {agent|"team": one step's std},
"agents": {name: {"heldout": {"greedy"|"sampled": {"before": a, "after": a, "se_change": s,
"tasks": n}}}}, "models": {name: model}, "steps": n, "wall_s": s, "time_to_first_step_s": s,
"heldout_before_s": s, "heldout_after_s": s, "seed": run.seed, ...}. For a game team
(flexmarl.envs.textarena: its held-out tasks are games against fixed opponents) each agent also
has "games": {opponent: {"before", "after" (seat-balanced win rates: each deal played in every
seat), "seat<i>_after" (each seat's), "games" (after's count of deals), "se" (the
change's standard error), "invalid_before", "invalid_after" (rejected moves per move),
"draw_before", "draw_after", "return_before", "return_after" (seat-balanced mean return),
"mode"}}, from the sampled measurement if made, else the greedy. A team with exact policy
measures (flexmarl.envs.openspiel: Team.analysis) adds "policies": {"uniform_nash_conv",
"agents": {name: {"nash_conv_before", "nash_conv_after", "drop" (the share of the starting
NashConv gone), "legal_mass_before", "legal_mass_after"}}}; with --cross-play (after the run:
flexmarl eval RUN_DIR --cross-play, the report redrawn) "cross_play": {"policies", "payoff",
"win", "ratings", "nash_conv", "deals", "sources"}.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import math
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


def step_noise(curve: list[float]) -> float | None:
    """Step-to-step noise of a reward curve: std of successive differences / sqrt(2), which a
    slow trend hardly inflates (the std of one step's reward about the curve's local mean)."""
    diffs = [b - a for a, b in zip(curve, curve[1:]) if a is not None and b is not None]
    if len(diffs) < 2:
        return None
    mu = sum(diffs) / len(diffs)
    return math.sqrt(sum((d - mu) ** 2 for d in diffs) / (len(diffs) - 1) / 2)


def summarize(metrics: list[dict], window: int) -> dict:
    agents = sorted(metrics[0]["agents"])
    curve = {"team": [m["team_reward"] for m in metrics]}
    curve.update({name: [m["agents"][name]["reward"] for m in metrics] for name in agents})
    out = {"first_reward": {}, "last_reward": {}, "curve": curve,
           "noise": {name: step_noise(c) for name, c in curve.items()}}
    for name, c in curve.items():
        out["first_reward"][name] = mean(c[:window])
        out["last_reward"][name] = mean(c[-window:])
    out["steps"] = len(metrics)
    out["window"] = window
    out["step_s"] = mean([m["step_s"] for m in metrics])
    return out


async def main(args: argparse.Namespace) -> None:
    from flexmarl.config.load import load_config
    from flexmarl.observe.rundir import RunDir
    from flexmarl.launch.run import train
    from flexmarl.launch.build import resolve_backend
    from flexmarl.team import load_team

    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # CPU-irrelevant warnings
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    if args.from_run:
        config, team, run_dir, result, wall_s = from_run(args.from_run)
    else:
        workdir = tempfile.mkdtemp(prefix="flexmarl-learning-")
        heldout = [] if args.heldout is None else [f"eval.final_tasks={args.heldout}"]
        config = load_config(overrides=[f"run.out_dir={workdir}", *heldout, *args.set],
                             team=args.team)
        team = load_team(config.team.path)
        run_dir = RunDir.create(config)
        started = time.perf_counter()
        result = await train(team, config, run_dir=run_dir, progress=args.progress)
        wall_s = time.perf_counter() - started
    summary = summarize(result.metrics, args.window)
    summary["agents"] = {name: {"heldout": modes} | ({"games": g} if (g := games(modes)) else {})
                         for name, modes in sorted((result.heldout or {}).items())}
    measured = result.final_eval or {}
    tasks = [m["tasks"] for a in summary["agents"].values() for m in a["heldout"].values()]
    summary.update(wall_s=wall_s, train_wall_s=result.wall_s,
                   time_to_first_step_s=result.time_to_first_step_s,
                   heldout_before_s=_seconds(measured.get("before")),
                   heldout_after_s=_seconds(measured.get("after")), seed=config.run.seed,
                   backend=resolve_backend(config).rollout.backend, run_dir=str(run_dir.path),
                   team=team.name,
                   models={s.name: s.model for s in team.agents},
                   heldout_tasks=max(tasks, default=0))
    policies = measured.get("policies") or {}
    if policies:  # an OpenSpiel team's exact measures (flexmarl.envs.policy_tables)
        summary["policies"] = policy_changes(policies)
    lines = []
    if args.cross_play:  # the run's policies against each other; the report redrawn with it
        from flexmarl.launch.crossplay import cross_play_run, crossplay_lines
        from flexmarl.observe.report import write_report
        crossed = await cross_play_run(run_dir.path, deals=args.deals, versions=args.versions)
        summary["cross_play"] = {k: crossed[k] for k in ("policies", "payoff", "win", "ratings",
                                                         "nash_conv", "deals", "sources")}
        lines = ["cross-play: each row's seat-balanced expected return against each column; "
                 f"ratings (openskill) from {args.deals} duplicate matches per pair",
                 *crossplay_lines(crossed),
                 f"report: {write_report(run_dir.path)}"]
    print(table(summary, config, args))
    print("\n".join(lines)) if lines else None
    print(f"run dir: {run_dir.path}")
    if args.json:
        print(json.dumps(summary))


def from_run(path: str) -> tuple:
    """A finished run's (config, team, run dir, result, wall seconds) from its directory alone:
    its config.toml, metrics.jsonl and eval.json (the wall time from the records' clock: the
    first step's time less time_to_first_step_s, to the last record's plus the after
    measurement; the report and shutdown are not in it)."""
    import types

    import orjson

    from flexmarl.config.load import load_config
    from flexmarl.observe.rundir import METRICS_FILE, read_metrics
    from flexmarl.team import load_team

    run = os.path.abspath(path)
    config = load_config(os.path.join(run, "config.toml"), team_config=False)  # as it ran
    records = [r for r in read_metrics(os.path.join(run, METRICS_FILE)) if "agents" in r]
    document = orjson.loads(open(os.path.join(run, "eval.json"), "rb").read())
    first = document.get("time_to_first_step_s") or 0.0
    after = (document.get("after") or {}).get("seconds") or 0.0
    wall_s = records[-1]["time"] - records[0]["time"] + first + after
    result = types.SimpleNamespace(metrics=records, heldout=document.get("heldout"),
                                   final_eval=document, wall_s=wall_s,
                                   time_to_first_step_s=document.get("time_to_first_step_s"))
    return config, load_team(config.team.path), types.SimpleNamespace(path=run), result, wall_s


def policy_changes(policies: dict) -> dict:
    """eval.json's "policies" per agent: {"nash_conv_before", "nash_conv_after", "drop" (the
    share of the starting NashConv gone), "legal_mass_before", "legal_mass_after"}, and the
    uniform policy's NashConv (the scale: Nash is 0)."""
    before = (policies.get("before") or {}).get("agents", {})
    after = (policies.get("after") or {}).get("agents", {})
    out: dict = {"uniform_nash_conv": (policies.get("after") or policies.get("before")
                                       or {}).get("uniform_nash_conv"), "agents": {}}
    for name in dict.fromkeys([*before, *after]):
        b, a = before.get(name) or {}, after.get(name) or {}
        nb, na = b.get("nash_conv"), a.get("nash_conv")
        out["agents"][name] = {"nash_conv_before": nb, "nash_conv_after": na,
                               "drop": (nb - na) / nb if nb and na is not None else None,
                               "legal_mass_before": b.get("legal_mass"),
                               "legal_mass_after": a.get("legal_mass")}
    return out


def games(modes: dict) -> dict:
    """One agent's game results by opponent, from its held-out scores "games.<opponent>.<what>"
    (flexmarl.envs.textarena); {} for a team without games."""
    mode = next((m for m in ("sampled", "greedy") if (modes.get(m) or {}).get("scores")), None)
    if mode is None:
        return {}
    scores = modes[mode]["scores"]
    out: dict = {}
    for name, cell in scores.items():
        parts = name.split(".")
        if parts[0] != "games" or len(parts) not in (3, 4):
            continue
        if len(parts) == 4:  # games.<opponent>.seat<i>.win: each seat's own rate
            _, opponent, seat, what = parts
            if what == "win" and seat.startswith("seat"):
                out.setdefault(opponent, {"mode": mode})[f"{seat}_after"] = cell["after"]
            continue
        _, opponent, what = parts
        row = out.setdefault(opponent, {"mode": mode})
        if what == "win":  # seat-balanced: each deal in every seat
            row.update(before=cell["before"], after=cell["after"], games=cell["n"],
                       se=cell["se_change"])
        elif what in ("invalid", "draw", "unmoved", "return"):
            row.update({f"{what}_before": cell["before"], f"{what}_after": cell["after"]})
    return out


def _seconds(measurement: dict | None) -> float | None:
    """A before/after measurement's duration (None: not made, or skipped)."""
    return (measurement or {}).get("seconds")


def table(summary: dict, config, args: argparse.Namespace) -> str:
    from flexmarl.launch.summary import change_cell

    rows = ["team"] + sorted(k for k in summary["first_reward"] if k != "team")
    first = summary["time_to_first_step_s"]
    out = [f"team {summary['team']}: {summary['steps']} steps, {summary['wall_s']:.0f} s wall "
           f"({'-' if first is None else f'{first:.0f}'} s to the first step), "
           f"seed {config.run.seed}, {summary['backend']} rollout; mean reward of the first "
           f"and last {args.window} steps (noise: one step's std, from step-to-step changes)",
           f"{'':<10} {'first':>8} {'last':>8} {'change':>8} {'noise':>8}"]
    for name in rows:
        a, b = summary["first_reward"][name], summary["last_reward"][name]
        if a is None or b is None:  # an agent with no turns in training (a frozen opponent)
            continue
        noise = summary["noise"][name]
        out.append(f"{name:<10} {a:>8.3f} {b:>8.3f} {b - a:>+8.3f} "
                   f"{'-' if noise is None else f'{noise:.3f}':>8}")
    if summary["agents"]:
        took = [f"{s:.1f} s" if (s := summary[k]) is not None else "-"
                for k in ("heldout_before_s", "heldout_after_s")]
        out.append(f"held-out reward ({summary['heldout_tasks']} tasks never trained on), "
                   f"before -> after training (± the change's standard error; measured in "
                   f"{took[0]} before and {took[1]} after)")
        out.append(f"{'':<10} {'greedy':>26} {'sampled':>26}")
        for name, a in sorted(summary["agents"].items()):
            cells = [change_cell(a["heldout"].get(m)) for m in ("greedy", "sampled")]
            out.append(f"{name:<10} {cells[0]:>26} {cells[1]:>26}")
    rows = [(name, o, g) for name, a in sorted(summary["agents"].items())
            for o, g in sorted(a.get("games", {}).items())]
    if rows:
        out.append("held-out games (seeds never trained on), before -> after training: win rate "
                   "(± the change's standard error) and rejected moves per move")
        out.append(f"{'':<10} {'opponent':<10} {'mode':<8} {'games':>6} {'win rate':>26} "
                   f"{'invalid moves':>18}")
        for name, o, g in rows:
            win = change_cell({"before": g.get("before"), "after": g.get("after"),
                               "se_change": g.get("se")})
            inv = change_cell({"before": g.get("invalid_before"),
                               "after": g.get("invalid_after")})
            out.append(f"{name:<10} {o:<10} {g['mode']:<8} {g.get('games', 0):>6} {win:>26} "
                       f"{inv:>18}")
    if summary.get("policies"):
        out.append("policies measured exactly: NashConv (what best responses gain against the "
                   "player in every seat; uniform random "
                   f"{summary['policies']['uniform_nash_conv']:.3f}, Nash 0) and the "
                   "probability of a legal reply, before -> after")
        for name, p in summary["policies"]["agents"].items():
            def f(v):
                return "-" if v is None else f"{v:.3f}"
            drop = "" if p["drop"] is None else f" ({-p['drop']:+.0%})"
            out.append(f"{name:<10} NashConv {f(p['nash_conv_before'])} -> "
                       f"{f(p['nash_conv_after'])}{drop}   legal replies "
                       f"{f(p['legal_mass_before'])} -> {f(p['legal_mass_after'])}")
    return "\n".join(out)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--window", type=int, default=3, help="steps averaged at each end")
    ap.add_argument("--team", default=None, help="team file (default: the config's team.path)")
    ap.add_argument("--heldout", type=int, default=None, metavar="N",
                    help="held-out tasks measured before and after (eval.final_tasks; 0: all; "
                         "default: the config's); --set eval.before=false skips before")
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    ap.add_argument("--progress", action="store_true", help="show progress bars")
    ap.add_argument("--cross-play", action="store_true",
                    help="after the run: its policies against each other (flexmarl eval "
                         "--cross-play; an OpenSpiel team), in the JSON and the report")
    ap.add_argument("--deals", type=int, default=200, help="with --cross-play: matches per pair")
    ap.add_argument("--versions", type=int, default=1,
                    help="with --cross-play: saved versions between start and final "
                         "(run.keep_every keeps them)")
    ap.add_argument("--from-run", metavar="RUN_DIR", default=None,
                    help="train nothing: summarise a finished run's directory (its config.toml, "
                         "metrics.jsonl and eval.json), e.g. one whose own summary was lost")
    return ap.parse_args(argv)


if __name__ == "__main__":
    import uvloop
    uvloop.run(main(parse_args()))
