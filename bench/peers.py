"""FlexMARL side by side with its peers' own code, on the same model, tasks, rewards and samples.

One invocation runs every system on every workload, one run at a time on this machine, each in
its own process tree, then evaluates every run's saved weights with one evaluator and measures
each workload's physical limit:

    per workload (bench/peers/workloads.py: sums, joint, duo, mixed)
      per system   flexmarl          `flexmarl run` on a team of that workload (the user's
                                     defaults; eval off: evaluation is measured apart)
                   flexmarl[k=v,..]  extra rows: the same with config overrides
                   trl               TRL GRPOTrainer (sums); two alternated by a loop (joint,
                                     duo, mixed)
                   comlrl            CoMLRL MAGRPOTrainer (sums, joint)
        ─► the run's step end times ─► steady samples/s (after --warmup steps), counted two
           ways: generated (every sample the step's rollout made: prompts x group size per
           agent, the same work for every system, so the verdict's quantity) and trained
           (rows that entered a backward pass: FlexMARL skips groups whose rewards are all
           equal, the peers train them), the step time, time to the first trained step,
           start-up (process start to training start), peak RSS of the process tree, its CPU
           use in the steady window (cores busy)
        ─► bench/peers/evaluate.py on the run's final weights (100 held-out sums, greedy and
           sampled; the same code for every system)
      bench/peers/limit.py: the step no scheduler can beat (engine alone + trainer alone,
      CPU-seconds over the cores), priced per system on the work it does: every group
      trained (the peers) or the groups it trained (FlexMARL: its trained samples per step)

The peers run in `.venv-peers` (bench/peers/requirements.txt, pinned; made on first use, or
checked against the pins), never in the product's environment. A peer that cannot express a
workload says why, in the table. FlexMARL runs in the checkout's `.venv`.

The workloads run on SmolLM2-135M-Instruct, mixed on Gemma 3 270M base (solver) and SmolLM2
(checker): each model FlexMARL's converted directory (flexmarl.launch.model_dirs.resolve_model),
each agent with its own lr and new tokens (workloads.agent_setting).

    .venv/bin/python bench/peers.py [--json] [--workloads sums,joint,duo,mixed] [--steps 8]
        [--warmup 2] [--systems flexmarl,trl,comlrl,"flexmarl[run.save_state=false]"]
        [--heldout 100] [--keep DIR] [--reuse]

--keep DIR keeps every run's directory, and each finished row as DIR/WORKLOAD/SYSTEM/row.json
(the limit and the starting weights' evaluation as DIR/WORKLOAD/limit.json, before.json);
--reuse with it takes the rows, limits and evaluations already there instead of running them
again (a table assembled from runs made at different times: say so when quoting it).

--json: the last line is one JSON object: results per workload and system, the limits, the
ratios FlexMARL / best peer, the versions, the targets and whether they are met.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PEERS = os.path.join(ROOT, "bench", "peers")
sys.path.insert(0, PEERS)
import workloads as w  # noqa: E402
from limit import limit_for  # noqa: E402
from proctree import TreeSampler, run_tree as _run_tree, tree, usage  # noqa: E402,F401

MAIN_PY = os.path.join(ROOT, ".venv", "bin", "python")
PEERS_VENV = os.path.join(ROOT, ".venv-peers")
PEERS_PY = os.path.join(PEERS_VENV, "bin", "python")
REQUIREMENTS = os.path.join(PEERS, "requirements.txt")
TORCH = "torch==2.13.0"  # the CPU wheel this machine has (see the Makefile); pinned first
SPEED_TARGET = 2.0        # FlexMARL's samples/s over the best peer's, per shared workload
LIMIT_TARGET = 1.25       # FlexMARL's step within this factor of the limit


# ----------------------------------------------------------------------------- environments

def pins() -> dict[str, str]:
    out = {}
    for line in open(REQUIREMENTS):
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            out[name.strip().lower()] = version.strip()
    return out


def installed(python: str, names: list[str]) -> dict[str, str | None]:
    code = ("import importlib.metadata as m, json, sys\n"
            "def v(n):\n    try: return m.version(n)\n    except m.PackageNotFoundError: return None\n"
            "print(json.dumps({n: v(n) for n in sys.argv[1:]}))")
    out = subprocess.run([python, "-c", code, *names], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def ensure_peers_env() -> dict[str, str]:
    """.venv-peers with the pinned peers, made or mended when it differs; their versions."""
    wanted = pins()
    have = installed(PEERS_PY, list(wanted) + ["torch"]) if os.path.exists(PEERS_PY) else {}
    if any(have.get(n) != v for n, v in wanted.items()):
        say(f"peers: setting up {os.path.relpath(PEERS_VENV, ROOT)} from "
            f"{os.path.relpath(REQUIREMENTS, ROOT)} (once; a few minutes)")
        if not os.path.exists(PEERS_PY):
            subprocess.run([sys.executable, "-m", "venv", PEERS_VENV], check=True)
        pip = [PEERS_PY, "-m", "pip", "install", "-q", "--disable-pip-version-check"]
        subprocess.run(pip + [TORCH], check=True)  # first: never a CUDA torch from the index
        subprocess.run(pip + ["-r", REQUIREMENTS], check=True)
        have = installed(PEERS_PY, list(wanted) + ["torch"])
        if any(have.get(n) != v for n, v in wanted.items()):
            raise SystemExit(f"peers: {PEERS_VENV} does not hold the pinned versions {wanted} "
                             f"after installing them (it has {have})")
    return {n: v for n, v in have.items() if v}


def model_dirs(families: list[str]) -> dict[str, str]:
    """FlexMARL's converted HF directory of each pretrained model (converted once, cached)."""
    code = ("import json, sys\nfrom flexmarl import AgentSpec\n"
            "from flexmarl.launch.model_dirs import resolve_model\n"
            "print(json.dumps({f: resolve_model(AgentSpec(name='a', model=f)) "
            "for f in sys.argv[1:]}))")
    out = subprocess.run([MAIN_PY, "-c", code, *families], capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"peers: cannot convert {', '.join(families)} (run `make setup`):\n"
                         f"{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def model_args(dirs: dict[str, str]) -> list[str]:
    """The command line of a runner or limit.py: --model (SmolLM2's directory), and
    --model-dir FAMILY=DIR for each other family."""
    args = ["--model", dirs[w.SMOLLM2]]
    for family, d in dirs.items():
        if family != w.SMOLLM2:
            args += ["--model-dir", f"{family}={d}"]
    return args


def starting_dirs(workload: str, dirs: dict[str, str]) -> dict[str, str]:
    """Each agent's starting weights: its family's converted directory."""
    return {a: dirs[w.agent_family(workload, a)] for a in w.AGENTS[workload]}


def say(text: str) -> None:
    print(f"peers: {text}", file=sys.stderr, flush=True)


def run_tree(cmd: list[str], log: str, env: dict | None = None):
    """proctree.run_tree from the checkout's root."""
    return _run_tree(cmd, log, env, cwd=ROOT)


# ----------------------------------------------------------------------------- systems

TEAMS = {"sums": "bench/peers/team_sums.py", "joint": "bench/peers/team_joint.py",
         "duo": "agents/smol_duo.py", "mixed": "agents/mixed_duo.py"}
PEER_RUNNERS = {"trl": "bench/peers/run_trl.py", "comlrl": "bench/peers/run_comlrl.py"}
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "WANDB_MODE": "disabled",
           "HF_HUB_DISABLE_PROGRESS_BARS": "1", "TQDM_DISABLE": "1",
           "PYTHONWARNINGS": "ignore:resource_tracker:UserWarning"}


def parse_system(spec: str) -> tuple[str, list[str]]:
    """"flexmarl[a.b=1,c.d=x]" -> ("flexmarl", ["a.b=1", "c.d=x"])."""
    if "[" in spec:
        name, rest = spec.split("[", 1)
        return name, [s for s in rest.rstrip("]").split(",") if s]
    return spec, []


def run_flexmarl(workload: str, overrides: list[str], out: str, args) -> dict:
    run = os.path.join(out, "run")
    cmd = [os.path.join(ROOT, ".venv", "bin", "flexmarl"), "run", "--team", TEAMS[workload],
           "--set", f"run.steps={args.steps}", "--set", f"run.seed={args.seed}",
           "--set", "eval.before=false", "--set", "eval.final=false", "--set", f"run.dir={run}"]
    for o in overrides:
        cmd += ["--set", o]
    code, started, sampler = run_tree(cmd, os.path.join(out, "log.txt"), OFFLINE)
    train_start, steps = flexmarl_steps(run)
    result: dict = {"exit_code": code, "started": started, "sampler": sampler,
                    "steps": steps, "agents": {}, "unsupported": None, "notes": []}
    if steps:
        result["train_start"] = train_start
        for agent in w.AGENTS[workload]:
            root = os.path.join(run, "checkpoints", agent)
            if os.path.isdir(root):
                versions = sorted(os.listdir(root), key=lambda v: int(v.rsplit("-", 1)[-1]))
                result["agents"][agent] = os.path.join(root, versions[-1])
    return result


def flexmarl_steps(run: str) -> tuple[float | None, list[dict]]:
    """A FlexMARL run's training start (wall time) and its steps, from RUN/metrics.jsonl: per
    step record, its wall time `time` as the step's end, "trained": the samples its trainers
    stepped on (every trainable agent's "trained_samples": rows that entered a backward pass)
    and "generated": what the rollout generated for them (their "samples": also the turns of
    failed trajectories and of groups without GRPO signal, which the trainer skips); never a
    frozen agent's. The start: the first record's time less its latest "t_done" (seconds
    since the loop started)."""
    path = os.path.join(run, "metrics.jsonl")
    records = ([json.loads(line) for line in open(path) if line.strip()]
               if os.path.exists(path) else [])
    records = [r for r in records if "step" in r and "agents" in r]
    if not records:
        return None, []
    t_done = max(a["t_done"] for a in records[0]["agents"].values() if a["trainable"])
    return records[0]["time"] - t_done, [
        {"end": r["time"],
         "trained": sum(a["trained_samples"] for a in r["agents"].values() if a["trainable"]),
         "trained_by_agent": {n: a["trained_samples"] for n, a in r["agents"].items()
                              if a["trainable"]},
         "generated": sum(a["samples"] for a in r["agents"].values() if a["trainable"])}
        for r in records]


def run_peer(system: str, workload: str, out: str, dirs: dict[str, str], args) -> dict:
    cmd = [PEERS_PY, PEER_RUNNERS[system], "--workload", workload, *model_args(dirs),
           "--out", out, "--steps", str(args.steps), "--seed", str(args.seed)]
    code, started, sampler = run_tree(cmd, os.path.join(out, "log.txt"), OFFLINE)
    path = os.path.join(out, "result.json")
    data = json.load(open(path)) if os.path.exists(path) else {}
    # The peers train every sample they generate (zero-advantage groups included).
    steps = [{"end": x["end"], "generated": x["samples"], "trained": x["samples"]}
             for x in data.get("steps", [])]
    return {"exit_code": code, "started": started, "sampler": sampler,
            "train_start": data.get("t_train_start"), "steps": steps,
            "agents": data.get("agents", {}), "unsupported": data.get("unsupported"),
            "notes": data.get("notes", []), "system_name": data.get("system", system),
            "versions": data.get("versions", {})}


def summarize(raw: dict, warmup: int, cores: int) -> dict:
    """Steady samples/s after `warmup` steps, and the rest of a run's row."""
    steps, sampler = raw["steps"], raw["sampler"]
    row = {"exit_code": raw["exit_code"], "unsupported": raw["unsupported"],
           "notes": raw["notes"], "steps": len(steps),
           "peak_rss_mb": sampler.peak_rss / 2**20, "agents": raw["agents"]}
    if len(steps) <= warmup:
        row["error"] = (f"only {len(steps)} steps finished (exit code {raw['exit_code']}); "
                        "see its log")
        return row
    t0, t1 = steps[warmup - 1]["end"] if warmup else raw["train_start"], steps[-1]["end"]
    timed = steps[warmup:]
    generated = sum(s["generated"] for s in timed)
    trained = sum(s["trained"] for s in timed)
    cpu = sampler.cpu_between(t0, t1)
    row.update({
        "samples_per_step": generated / len(timed),
        "samples_per_s": generated / (t1 - t0),         # generated: the verdict's quantity
        "trained_per_step": trained / len(timed),
        "trained_per_step_by_agent": (
            {a: sum(s["trained_by_agent"][a] for s in timed) / len(timed)
             for a in timed[0]["trained_by_agent"]} if "trained_by_agent" in timed[0] else None),
        "trained_per_s": trained / (t1 - t0),
        "step_s": (t1 - t0) / len(timed),
        "first_step_s": steps[0]["end"] - raw["started"],
        "startup_s": (raw["train_start"] - raw["started"]) if raw.get("train_start") else None,
        "cores_busy": None if cpu is None else cpu / (t1 - t0),
        "cores": cores,
    })
    return row


def run_row(workload: str, system: str, out: str, dirs: dict[str, str], cores: int,
            args) -> dict:
    """Run one system on one workload and evaluate its weights: its row of the table."""
    name, overrides = parse_system(system)
    say(f"{workload}: {system} ({args.steps} steps) ...")
    raw = (run_flexmarl(workload, overrides, out, args) if name == "flexmarl"
           else run_peer(name, workload, out, dirs, args))
    if raw["unsupported"]:
        return {"unsupported": raw["unsupported"], "notes": raw["notes"]}
    row = summarize(raw, args.warmup, cores)
    if raw.get("system_name") and raw["system_name"] != name:
        row["runs_as"] = raw["system_name"]
    if not row.get("error") and not args.no_eval:
        row["eval"] = evaluate(workload, raw["agents"], out, args.heldout)
    return row


def evaluate(workload: str, agents: dict[str, str], out: str, heldout: int) -> dict | None:
    if set(agents) != set(w.AGENTS[workload]):
        return None
    path = os.path.join(out, "eval.json")
    cmd = [MAIN_PY, os.path.join(PEERS, "evaluate.py"), "--workload", workload,
           "--heldout", str(heldout), "--out", path]
    for name, d in agents.items():
        cmd += ["--agent", f"{name}={d}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **OFFLINE})
    if proc.returncode:
        say(f"evaluation failed ({workload}):\n{proc.stderr[-2000:]}")
        return None
    return json.load(open(path))


def limit(workload: str, dirs: dict[str, str], args) -> dict:
    proc = subprocess.run([MAIN_PY, os.path.join(PEERS, "limit.py"), "--workload", workload,
                           *model_args(dirs), "--steps", str(args.limit_steps), "--json"],
                          capture_output=True, text=True, env={**os.environ, **OFFLINE})
    if proc.returncode:
        raise SystemExit(f"peers: limit.py failed ({workload}):\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ----------------------------------------------------------------------------- report

def fmt(x, spec: str = ".2f") -> str:
    return "-" if x is None else format(x, spec)


def acc(ev: dict | None, mode: str) -> str:
    if not ev:
        return "-"
    return " ".join(f"{k} {v['mean']:.2f}±{v['se']:.2f}" for k, v in ev[mode].items())


def own_limit(row: dict, lim: dict | None, system: str) -> float | None:
    """The limit of `row`'s system priced on the work it does (limit.limit_for): FlexMARL's
    rows on the samples they trained, the peers' on every group (they train them all)."""
    if not lim:
        return None
    if not system.startswith("flexmarl"):
        return limit_for(lim)
    return limit_for(lim, row.get("trained_per_step"), row.get("trained_per_step_by_agent"))


def print_table(results: dict, limits: dict, before: dict) -> None:
    print(f"\n{'workload':<7} {'system':<34} {'gen/step':>8} {'trn/step':>8} {'samples/s':>9} "
          f"{'trained/s':>9} {'step s':>7} {'limit s':>7} {'x limit':>7} {'1st step s':>10} "
          f"{'start s':>7} {'cores busy':>10} {'RSS GB':>7}  "
          "held-out accuracy after (greedy | sampled)")
    blank = f"{'':>8} {'':>8} {'':>9} {'':>9} {'':>7} {'':>7} {'':>7} {'':>10} {'':>7} {'':>10} {'':>7}"
    for workload, rows in results.items():
        lim = limits.get(workload)
        if lim:
            print(f"{workload:<7} {'limit (every group trained)':<34} "
                  f"{lim['samples']:>8.0f} {lim['samples']:>8.0f} "
                  f"{lim['limit_samples_per_s']:>9.2f} {lim['limit_samples_per_s']:>9.2f} "
                  f"{lim['limit_step_s']:>7.2f} {lim['limit_step_s']:>7.2f} {1.0:>7.2f}")
        if workload in before:
            print(f"{workload:<7} {'(starting weights)':<34} {blank}  "
                  f"{acc(before[workload], 'greedy')} | {acc(before[workload], 'sampled')}")
        for system, r in rows.items():
            if r.get("unsupported"):
                print(f"{workload:<7} {system:<34} cannot express it: {r['unsupported']}")
                continue
            if r.get("error"):
                print(f"{workload:<7} {system:<34} FAILED: {r['error']}")
                continue
            own = own_limit(r, lim, system)
            x = r["step_s"] / own if own else None
            trained = r.get("trained_per_step", r["samples_per_step"])
            print(f"{workload:<7} {system:<34} {r['samples_per_step']:>8.0f} {trained:>8.1f} "
                  f"{r['samples_per_s']:>9.2f} {r.get('trained_per_s', r['samples_per_s']):>9.2f} "
                  f"{r['step_s']:>7.2f} {fmt(own):>7} {fmt(x):>7} "
                  f"{r['first_step_s']:>10.1f} {fmt(r['startup_s'], '.1f'):>7} "
                  f"{fmt(r['cores_busy']):>10} {r['peak_rss_mb'] / 1024:>7.2f}  "
                  f"{acc(r.get('eval'), 'greedy')} | {acc(r.get('eval'), 'sampled')}")


def verdicts(results: dict, limits: dict) -> dict:
    """FlexMARL (default row) against the best peer per workload, on generated samples/s (the
    same prompts x group size per step for every system: the step rate of the same work), and
    against the limit priced on the work it does (own_limit)."""
    out = {}
    for workload, rows in results.items():
        ours = rows.get("flexmarl", {})
        peers = {s: r for s, r in rows.items() if not s.startswith("flexmarl")
                 and r.get("samples_per_s")}
        v: dict = {}
        if ours.get("samples_per_s") and peers:
            best = max(peers, key=lambda s: peers[s]["samples_per_s"])
            v["best_peer"] = best
            v["speedup_vs_best_peer"] = ours["samples_per_s"] / peers[best]["samples_per_s"]
            if ours.get("trained_per_s") and peers[best].get("trained_per_s"):
                v["trained_ratio_vs_best_peer"] = (ours["trained_per_s"]
                                                   / peers[best]["trained_per_s"])
            # Accuracy after equal samples: FlexMARL's greedy mean per agent within one
            # standard error of the peer's, or better.
            eo, ep = ours.get("eval"), peers[best].get("eval")
            if eo and ep:
                v["accuracy_ok"] = all(
                    eo["greedy"][k]["mean"] >= ep["greedy"][k]["mean"]
                    - max(eo["greedy"][k]["se"], ep["greedy"][k]["se"])
                    for k in eo["greedy"] if k in ep["greedy"])
            v["speed_met"] = v["speedup_vs_best_peer"] >= SPEED_TARGET and v.get("accuracy_ok", False)
        if ours.get("step_s") and limits.get(workload):
            own = own_limit(ours, limits[workload], "flexmarl")
            v["limit_own_s"] = own
            v["x_limit"] = ours["step_s"] / own
            v["x_limit_every_group"] = ours["step_s"] / limits[workload]["limit_step_s"]
            v["limit_met"] = v["x_limit"] <= LIMIT_TARGET
        out[workload] = v
    return out


def cached(path: str, reuse: bool, make):
    """`make()`, saved as JSON at `path`; with `reuse`, what `path` already holds."""
    if reuse and os.path.exists(path):
        return json.load(open(path))
    value = make()
    if not (isinstance(value, dict) and value.get("error")):  # a failed run is run again
        with open(path, "w") as f:
            json.dump(value, f, default=str)
    return value


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--workloads", default=",".join(w.WORKLOADS))
    ap.add_argument("--systems", default="flexmarl,trl,comlrl",
                    help="comma-separated; flexmarl[section.key=value,...] adds a FlexMARL row "
                         "with those overrides (quote it in the shell)")
    ap.add_argument("--steps", type=int, default=8, help="trained steps per run")
    ap.add_argument("--warmup", type=int, default=2, help="first steps left out of samples/s")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--heldout", type=int, default=w.HELDOUT_SUMS)
    ap.add_argument("--limit-steps", type=int, default=3)
    ap.add_argument("--no-eval", action="store_true", help="skip the held-out evaluation")
    ap.add_argument("--keep", default="", help="keep every run's directory under this path")
    ap.add_argument("--reuse", action="store_true",
                    help="with --keep: take rows already finished there instead of rerunning")
    args = ap.parse_args()
    if args.steps <= args.warmup:
        ap.error("--steps must exceed --warmup")
    if args.reuse and not args.keep:
        ap.error("--reuse needs --keep DIR (where the finished rows are)")
    # "flexmarl[a=1,b=2]" holds commas: split the list on commas outside brackets.
    systems, depth, cur = [], 0, ""
    for ch in args.systems + ",":
        depth += ch == "["
        depth -= ch == "]"
        if ch == "," and depth == 0:
            systems.append(cur.strip()) if cur.strip() else None
            cur = ""
        else:
            cur += ch
    workloads = [x for x in args.workloads.split(",") if x]
    for x in workloads:
        if x not in w.WORKLOADS:
            ap.error(f"unknown workload {x!r}; choose from {', '.join(w.WORKLOADS)}")
    for s in systems:
        if parse_system(s)[0] not in ("flexmarl", *PEER_RUNNERS):
            ap.error(f"unknown system {s!r}; choose from flexmarl, {', '.join(PEER_RUNNERS)}")
    if not os.path.exists(MAIN_PY):
        raise SystemExit("peers: .venv is missing: run `make setup` first")

    versions = installed(MAIN_PY, ["torch", "transformers", "flexmarl"])
    if any(parse_system(s)[0] in PEER_RUNNERS for s in systems):
        versions |= {f"peers:{k}": v for k, v in ensure_peers_env().items()}
    dirs = model_dirs(list(dict.fromkeys([w.SMOLLM2] + [f for x in workloads
                                                         for f in w.families(x)])))
    cores = len(os.sched_getaffinity(0))
    work = args.keep or tempfile.mkdtemp(prefix="flexmarl-peers-")
    os.makedirs(work, exist_ok=True)
    load_start = os.getloadavg()
    results: dict = {}
    limits: dict = {}
    before: dict = {}
    try:
        for workload in workloads:
            results[workload] = {}
            for system in systems:
                out = os.path.join(work, workload, system.replace("/", "_"))
                os.makedirs(out, exist_ok=True)
                row = cached(os.path.join(out, "row.json"), args.reuse,
                             lambda: run_row(workload, system, out, dirs, cores, args))
                results[workload][system] = row
                say(f"{workload}: {system}: " + (
                    "cannot express it" if row.get("unsupported") else row.get("error") or
                    f"{row['samples_per_s']:.2f} samples/s, step {row['step_s']:.1f} s"))
            root = os.path.join(work, workload)
            if not args.no_eval:
                before[workload] = cached(os.path.join(root, "before.json"), args.reuse,
                                          lambda: evaluate(workload,
                                                           starting_dirs(workload, dirs),
                                                           root, args.heldout))
            say(f"{workload}: the limit (engine and trainer alone) ...")
            limits[workload] = cached(os.path.join(root, "limit.json"), args.reuse,
                                      lambda: limit(workload, dirs, args))
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    load_end = os.getloadavg()
    print(f"\nbench/peers.py: {args.steps} steps per run (first {args.warmup} not timed), "
          f"{cores} cores, all agents; samples/s: generated (prompts x group size per step, "
          "the same for every system: the verdict's quantity); trained/s: rows that entered a "
          "backward pass (FlexMARL skips groups whose rewards are all equal, the peers train "
          "them); limit s: the limit priced on the groups the system trained")
    print_table(results, limits, before)
    v = verdicts(results, limits)
    print(f"\ntargets: FlexMARL >= {SPEED_TARGET:.0f}x the best peer's generated samples/s at "
          "equal held-out accuracy (greedy, within one SE); FlexMARL's step <= "
          f"{LIMIT_TARGET}x the limit priced on the groups it trained")
    for workload, x in v.items():
        parts = []
        if "speedup_vs_best_peer" in x:
            parts.append(f"{x['speedup_vs_best_peer']:.2f}x {x['best_peer']} "
                         f"({'met' if x['speed_met'] else 'NOT met'}; trained samples/s "
                         f"{fmt(x.get('trained_ratio_vs_best_peer'))}x)")
        if "x_limit" in x:
            parts.append(f"{x['x_limit']:.2f}x the limit on its work "
                         f"({'met' if x['limit_met'] else 'NOT met'}; "
                         f"{x['x_limit_every_group']:.2f}x the every-group limit)")
        print(f"  {workload}: " + ("; ".join(parts) or "no peer row to compare"))
    notes: dict[tuple[str, str], list[str]] = {}  # each note once, with where it applies
    for workload, rows in results.items():
        for system, r in rows.items():
            for note in r.get("notes") or []:
                notes.setdefault((system, note), []).append(workload)
    for (system, note), where in notes.items():
        print(f"  note ({system}: {', '.join(where)}): {note}")
    print(f"versions: " + ", ".join(f"{k} {v}" for k, v in sorted(versions.items())))
    print(f"load average (1, 5, 15 min) at start {' '.join(f'{x:.2f}' for x in load_start)}, "
          f"at end {' '.join(f'{x:.2f}' for x in load_end)}")
    if args.json:
        print(json.dumps({"results": results, "limits": limits, "before": before,
                          "verdicts": v, "versions": versions, "load_start": load_start,
                          "load_end": load_end,
                          "config": {"steps": args.steps, "warmup": args.warmup,
                                     "seed": args.seed, "systems": systems,
                                     "workloads": workloads, "heldout": args.heldout}},
                         default=str))


if __name__ == "__main__":
    main()
