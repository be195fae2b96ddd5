"""Cluster simulation: the paper's comparison table, from the product's own scheduling code.

Every system (flexmarl.sim.cluster.SYSTEMS: mas_rl, marti, marti-lean, sync_static,
one_step_off, flexmarl and its variants) runs the same preset workload (flexmarl.sim.presets)
with the same seed on simulated hardware (cost model flexmarl/sim/costs.toml) on a virtual
clock: the real orchestrator, experience store, pipeline policies, balancer and trainer pool,
over local://. Deterministic: two runs print the same numbers. Step time and tokens/s are over
the steady state (the first and last of the simulated steps are not measured).

    .venv/bin/python bench/simulate.py --preset merchant [--json] [--steps 6] [--seed 0]
        [--plan-seeds 100] [--nodes 48] [--systems mas_rl,marti,...]
        [--costs gpu|cpu-calibrated|PATH[,...]] [--pricing new|old|old,new] [--kl-coef 0]
        [--allow-unverified] [--set section.key=value ...]
    .venv/bin/python bench/simulate.py --preset all     # every preset, one table each
    .venv/bin/python bench/simulate.py --preset all --costs gpu,cpu-calibrated
        # both cost files side by side: a summary table per pricing, then one of both
    .venv/bin/python bench/simulate.py --preset merchant --pricing old,new
        # the weight syncs and reference forwards as priced before issue 54 and now: both
        # summaries, then the cells whose verdict (flexmarl against marti, marti-lean and its
        # ablations) changes, old and new prices side by side

FlexMARL's placement is planned on --plan-seeds (default 100) and the table reports --seed: the
planner never sees the reported workload (an overlap is refused), and marti-lean's devices are
split by the demand measured on the plan seeds, the planner's information. Only placements the
product runs are chosen (flexmarl.sim.plan.refusal): not time-shared groups of different sizes
(no config says them), and time-shared GPU placements only with --allow-unverified (vLLM's
sleep / wake_up on GPU has never run in the product); the table says what it would have picked.
--kl-coef: trainer.kl_coef for every system (> 0: every trainer's reference forward priced).
    .venv/bin/python bench/simulate.py --preset lora6 --vs-full [--systems flexmarl]
        # a team of LoRA adapter agents against the same team as full copies (the preset's
        # `<name>_full` twin, or the preset without its adapters): step, sync and swap bytes,
        # trainer state and rollout memory side by side
    .venv/bin/python bench/simulate.py --preset merchant --nodes 8 --plan [--write FILE]
        # FlexMARL's placement planned (flexmarl.sim.plan): the placements tried, best
        # first; --write puts the chosen one in a config file ([devices], [trainer_pool], ...)

Columns: step time (s), generated tokens/s, accelerator utilisation (active device-seconds:
decoding, prefilling, training / all devices x time), ratios of step time against mas_rl, marti
and sync_static (their step / this step: > 1 is faster), the gaps to the two bounds
(flexmarl.sim.bounds: perfect overlap, the least over the compared layouts, which no system
can beat; zero staleness, rollout span + the least tail of a zero-staleness step), moves
(instances moved between agents), swaps (training states in or out of trainer slots),
switches (colocated mode changes), and where trainer slot time goes per measured step
(slot-seconds, all slots together): swaps out (idle agents parked), in (loaded back in the
slot they are parked in, or restored), pulled (from another slot: a move and a load),
snapshots (recovery snapshots), train (micro-batches and optimizer steps); then the bytes of a
measured step: sync GB (the weight updates, all agents: a LoRA agent's is its adapter) and swap
GB (what the slots' swaps moved), and a memory line (the largest trainer state of an agent,
the weights one rollout instance of each unit holds, all instances' weights together).

With --json the last line is one JSON object: preset, systems.<name>.{step_s, tokens_per_s,
utilisation, perfect_overlap_s (its own layout's), gap_to_perfect_overlap,
gap_to_zero_staleness, snapshot_s, sync_s, write_s, swap_out_s, swap_in_s, pulled_s,
train_compute_s, sync_bytes, swap_bytes, state_bytes, instance_bytes,
rollout_weight_bytes, placement (the row's, in words), expressible (whether FlexMARL's config
can say it), ...}, bounds.{perfect_overlap_s, zero_staleness_s, rollout_only_s}, planned (the
placement FlexMARL's row runs: placement, label, kind, pipeline, balance, expressible, ...),
would_have_picked (a faster placement the product does not run here, with `refused`: why; or
null), plan (every placement tried), seed, plan_seeds, costs, pricing, kl_coef, nodes, wall_s
(for --preset all: presets.<name> of those; for several --costs or --pricing:
pricings.<costs>[/<pricing>] of that).
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import sys
import time

# `python bench/simulate.py` puts bench/, not the repository root, on sys.path.
if importlib.util.find_spec("flexmarl") is None:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from flexmarl.sim import plan  # noqa: E402
from flexmarl.sim.cluster import SYSTEMS, compare, plan_slots  # noqa: E402
from flexmarl.sim.costs import PRICINGS, load_costs  # noqa: E402
from flexmarl.sim.presets import PRESETS, get_preset  # noqa: E402


def _value(text: str) -> float | int:
    number = float(text)
    return int(number) if number.is_integer() and "." not in text and "e" not in text else number


def _seeds(text: str) -> tuple[int, ...]:
    """"100", "100,101" or "100-102" as seeds."""
    out: list[int] = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        first, sep, last = part.partition("-")
        out += range(int(first), int(last) + 1) if sep else [int(first)]
    if not out:
        raise argparse.ArgumentTypeError(f"no seed in {text!r}")
    return tuple(dict.fromkeys(out))


def table(out: dict) -> str:
    systems = out["systems"]
    bases = ("mas_rl", "marti", "sync_static")
    base = {b: systems[b]["step_s"] for b in bases if b in systems}
    b = out["bounds"]
    lines = [f"preset {out['preset']} on {out['nodes']} nodes: "
             f"{get_preset(out['preset']).description}",
             f"seed {out['seed']} (planned on seeds "
             f"{', '.join(map(str, out.get('plan_seeds') or [])) or '-'}), costs {out['costs']}, "
             f"pricing {out.get('pricing', 'new')}, kl_coef {out.get('kl_coef', 0.0):g}",
             f"{'system':22s} {'step s':>8s} {'tokens/s':>9s} {'util':>6s} "
             + " ".join(f"{'vs ' + x:>9s}" for x in ("mas_rl", "marti", "sync_st"))
             + f" {'to p.o.':>8s} {'to z.s.':>8s} {'moves':>6s} {'swaps':>6s} {'switch':>6s}"
             + " " + " ".join(f"{x:>7s}" for x in ("out", "in", "pulled", "snap", "train"))
             + f" {'sync GB':>8s} {'swap GB':>8s}"]
    for name, r in systems.items():
        ratios = [f"{base[x] / r['step_s']:8.2f}x" if x in base else f"{'-':>9s}"
                  for x in bases]
        lines.append(f"{name:22s} {r['step_s']:8.1f} {r['tokens_per_s']:9.1f} "
                     f"{r['utilisation']:6.1%} {' '.join(ratios)} "
                     f"{r['gap_to_perfect_overlap']:+8.1%} {r['gap_to_zero_staleness']:+8.1%} "
                     f"{r['moves']:6d} {r['swaps']:6d} {r['switches']:6d} "
                     + " ".join(f"{r.get(k, 0.0):7.1f}" for k in (
                         "swap_out_s", "swap_in_s", "pulled_s", "snapshot_s",
                         "train_compute_s"))
                     + f" {r.get('sync_bytes', 0.0) / 1e9:8.2f} {r.get('swap_bytes', 0.0) / 1e9:8.2f}")
    if systems:
        r = systems.get("flexmarl") or next(iter(systems.values()))
        lines.append(memory_line(r))
    for name, why in out.get("infeasible", {}).items():
        lines.append(f"{name:22s} does not fit: {why}")
    lines.append(f"bounds: perfect overlap {b['perfect_overlap_s']:.1f} s (the least over the "
                 f"layouts; p.o.), zero staleness {b['zero_staleness_s']:.1f} s (z.s.)")
    for name, r in systems.items():
        if "placement" in r:
            lines.append(f"placement {name}: {r['placement']}"
                         + ("" if r.get("expressible", True) else
                            " (not expressible as FlexMARL config)"))
    if out.get("planned"):
        best = out["planned"]
        lines.append(f"planned (auto, on the plan seeds): {best['label']} ({best['placement']}),"
                     f" {best['pipeline']}, {best['balance']}; tried " + ", ".join(
                         f"{p['label']} {p['pipeline']} {p['balance']}: {p['step_s']:.1f} s"
                         + (" (refused)" if p.get("refused") else "") for p in out["plan"]))
    if out.get("would_have_picked"):
        other = out["would_have_picked"]
        lines.append(f"would have picked {other['label']} ({other['placement']}), "
                     f"{other['pipeline']}, {other['balance']}: {other['step_s']:.1f} s on the "
                     f"plan seeds against {out['planned']['step_s']:.1f} s, but "
                     f"{other['refused']}")
    return "\n".join(lines)


def memory_line(r: dict) -> str:
    """A system row's memory: trainer state per agent, weights per rollout instance."""
    units = r.get("instance_bytes", {})
    per = ", ".join(f"{u if len(u) <= 24 else u[:21] + '...'} {b / 1e9:.1f}"
                    for u, b in list(units.items())[:3]) + (", ..." if len(units) > 3 else "")
    return (f"memory ({r['system']}): trainer state per agent up to "
            f"{max(r.get('state_bytes', {}).values(), default=0.0) / 1e9:.1f} GB; weights per "
            f"rollout instance (GB): {per}; all {sum(r['rollout_instances'].values())} "
            f"instances {r.get('rollout_weight_bytes', 0.0) / 1e9:.0f} GB")


def vs_full(lora: dict, full: dict, preset) -> str:
    """LoRA adapters against full copies, per system both ran."""
    lines = [f"{preset.name} on {lora['nodes']} nodes: {len(preset.lora)} LoRA agents "
             f"(adapters on a shared base) against the same team as full copies "
             f"({full['preset']}); per measured step",
             f"{'system':22s} {'team':9s} {'step s':>8s} {'tokens/s':>9s} {'sync GB':>9s} "
             f"{'swap GB':>9s} {'swap s':>7s} {'train s':>8s} {'state GB':>9s} "
             f"{'inst GB':>8s} {'rollout GB':>10s} {'inst':>5s} {'slots':>9s}"]
    names = [*lora["systems"], *lora.get("infeasible", {}), *full["systems"],
             *full.get("infeasible", {})]
    for name in dict.fromkeys(names):
        for team, out in (("adapters", lora), ("full", full)):
            r = out["systems"].get(name)
            if r is None:
                why = out.get("infeasible", {}).get(name, "not run")
                lines.append(f"{name:22s} {team:9s} does not fit: {why}")
                continue
            inst = r.get("instance_bytes", {})
            lines.append(
                f"{name:22s} {team:9s} {r['step_s']:8.1f} {r['tokens_per_s']:9.1f} "
                f"{r['sync_bytes'] / 1e9:9.3f} {r['swap_bytes'] / 1e9:9.3f} "
                f"{r['swap_out_s'] + r['swap_in_s'] + r['pulled_s']:7.3f} "
                f"{r['train_compute_s']:8.1f} "
                f"{max(r['state_bytes'].values(), default=0.0) / 1e9:9.1f} "
                f"{max(inst.values(), default=0.0) / 1e9:8.1f} "
                f"{r['rollout_weight_bytes'] / 1e9:10.0f} "
                f"{sum(r['rollout_instances'].values()):5d} "
                f"{'+'.join(map(str, r['trainer_slots'])):>9s}")
    for label, out in (("adapters", lora), ("full", full)):
        if out.get("planned"):
            best = out["planned"]
            lines.append(f"planned ({label}): {best['label']} {best['pipeline']} "
                         f"{best['balance']}, slots {best['slots']}, instances "
                         f"{sum(best['instances'].values())}")
    return "\n".join(lines)


def full_twin(preset):
    """The same team as full copies: the registered `<name>_full` preset, else the preset
    without its adapters."""
    from flexmarl.sim.presets import PRESETS
    twin = PRESETS.get(f"{preset.name}_full")
    if twin is not None:
        return dataclasses.replace(twin, nodes=preset.nodes)
    return dataclasses.replace(preset, name=f"{preset.name}_full", lora={},
                               description=f"{preset.name} as full copies")


SHORT = {"mas_rl": "mas_rl", "marti": "marti", "marti-lean": "m-lean", "sync_static": "sync_st",
         "one_step_off": "1off", "flexmarl": "flexmarl", "flexmarl+snapshots": "fx+snap",
         "flexmarl-one_step_off": "fx-1off", "flexmarl-no_pipeline": "no_pipe",
         "flexmarl-no_balance": "no_bal", "flexmarl-no_pool": "no_pool",
         "flexmarl-no_timeshare": "no_ts"}
ABLATIONS = ("flexmarl-no_pipeline", "flexmarl-no_balance", "flexmarl-no_pool",
             "flexmarl-no_timeshare")


def summary(cells: list[tuple[str, dict]]) -> str:
    """One line per (label, compare output): every system's step, the bounds, the planned
    placement, and whether flexmarl is at most marti and every ablation."""
    names = [n for n in SHORT if any(n in out["systems"] or n in out.get("infeasible", {})
                                     for _, out in cells)]
    lines = [f"{'cell':30s} " + " ".join(f"{SHORT[n]:>8s}" for n in names)
             + f" {'p.o.':>7s} {'z.s.':>7s} {'vs marti':>8s}  ok  planned"]
    for label, out in cells:
        systems = out["systems"]
        steps = [f"{systems[n]['step_s']:8.1f}" if n in systems else f"{'n/f':>8s}"
                 for n in names]
        flex = systems.get("flexmarl", {}).get("step_s")
        rivals = [systems[n]["step_s"] for n in ("marti", *ABLATIONS) if n in systems]
        ok = "yes" if flex is not None and all(flex <= r for r in rivals) else "NO"
        ratio = (f"{systems['marti']['step_s'] / flex:7.2f}x" if flex and "marti" in systems
                 else f"{'-':>8s}")
        b, plan = out["bounds"], out.get("planned") or {}
        lines.append(f"{label:30s} {' '.join(steps)} {b['perfect_overlap_s']:7.1f} "
                     f"{b['zero_staleness_s']:7.1f} {ratio} {ok:>3s}  {plan.get('label', '-')}"
                     f" {plan.get('pipeline', '')} {plan.get('balance', '')}"
                     + ("" if plan.get("expressible", True) else " (not expressible)"))
    return "\n".join(lines)


VERSUS = ("marti", "marti-lean", *ABLATIONS)
"""The rows a verdict compares flexmarl with."""


def verdict(out: dict) -> dict[str, str]:
    """Per rival row that ran: "yes" where flexmarl is at least as fast, else "NO"."""
    systems = out["systems"]
    flex = systems.get("flexmarl", {}).get("step_s")
    return {SHORT[n]: "yes" if flex is not None and flex <= systems[n]["step_s"] else "NO"
            for n in VERSUS if n in systems}


def pricing_changes(by_costs: dict[str, dict], names: list[str]) -> str:
    """The cells (preset, cost file) run under both pricings whose verdict changes, their old
    and new steps side by side (flexmarl and the rows of its verdict)."""
    lines, same = [], 0
    for key, olds in by_costs.items():
        base = key.removesuffix("/old")
        news = by_costs.get(f"{base}/new")
        if base == key or news is None:
            continue
        for name in names:
            a, b = olds[name], news[name]
            if verdict(a) == verdict(b):
                same += 1
                continue
            rows = [n for n in ("flexmarl", *VERSUS) if n in a["systems"] and n in b["systems"]]
            lines.append(f"{name} {a['nodes']}n s{a['seed']} {base}: " + ", ".join(
                f"{SHORT[n]} {a['systems'][n]['step_s']:.1f} -> {b['systems'][n]['step_s']:.1f}"
                for n in rows))
            lines.append("    verdict (flexmarl at least as fast): old " + ", ".join(
                f"{k} {v}" for k, v in verdict(a).items()) + "; new " + ", ".join(
                f"{k} {v}" for k, v in verdict(b).items()))
    head = (f"old -> new pricing (step s), cells whose verdict changes ({len(lines) // 2}; "
            f"{same} unchanged):")
    return "\n".join([head, *lines])


def run_preset(name: str, args: argparse.Namespace, costs) -> dict:
    started = time.perf_counter()

    def progress(system: str, result) -> None:
        print(f"  {name}/{system}: {result.step_s:.1f} s per step "
              f"({time.perf_counter() - started:.1f} s so far)", file=sys.stderr)

    preset = get_preset(name) if isinstance(name, str) else name
    name = preset.name
    if args.nodes is not None:
        preset = dataclasses.replace(preset, nodes=args.nodes)
    preset = dataclasses.replace(preset, kl_coef=args.kl_coef)
    out = compare(preset, args.systems, costs=costs, steps=args.steps, seed=args.seed,
                  plan_seeds=args.plan_seeds, deployment=deployment(args), progress=progress)
    out["nodes"] = preset.nodes
    out["wall_s"] = time.perf_counter() - started
    return out


def deployment(args: argparse.Namespace) -> plan.Deployment:
    """The presets' cluster: GPUs, flexmarl-node processes; unverified paths as asked."""
    return plan.Deployment(allow_unverified=args.allow_unverified)


def cores_main(args: argparse.Namespace) -> dict:
    """--cores: each team's step, start-up and run priced with its rollout and training split
    between this machine's cores and shared by both phases (the config's run.steps; costs_cpu.toml
    [cores]), and what devices.cores = "auto" picks."""
    from flexmarl import AgentSpec  # noqa: F401  (the team files import it)
    from flexmarl.checks import available_cpus
    from flexmarl.config.load import load_config
    from flexmarl.launch.model_dirs import resolve_model
    from flexmarl.sim import cpu_cores
    from flexmarl.team import load_team

    cores = args.cpu_count or len(available_cpus() or [1])
    prices = cpu_cores.load_prices()
    out = {"cores": cores, "teams": {}}
    print(f"devices.cores priced on {cores} cores (flexmarl.sim.cpu_cores, costs_cpu.toml "
          "[cores])\n")
    print(f"{'team':<32} {'steps':>5} {'split step':>10} {'shared step':>11} {'split start':>11} "
          f"{'shared start':>12} {'split run':>9} {'shared run':>10}  auto")
    for path in args.cores.split(","):
        config = load_config(overrides=[f"team.path={path}", *args.override])
        team = load_team(config.team.path)
        dirs = {s.name: resolve_model(s) for s in team.agents}
        work = cpu_cores.team_work(team, config, dirs)
        priced = cpu_cores.price(work, cores, config.run.steps, prices, cpu_cores.memory_bytes())
        best, why = cpu_cores.pick(priced)
        sp, sh = priced["split"], priced["shared"]
        print(f"{path:<32} {config.run.steps:>5} {sp.step_s:>10.2f} {sh.step_s:>11.2f} "
              f"{sp.startup_s:>11.1f} {sh.startup_s:>12.1f} {sp.run_s:>9.0f} {sh.run_s:>10.0f}  "
              f"{best}" + (f" ({sh.refused})" if sh.refused else ""))
        out["teams"][path] = {"steps": config.run.steps, "auto": best, "why": why,
                              **{k: dataclasses.asdict(v) for k, v in priced.items()},
                              "agents": [dataclasses.asdict(a) for a in work]}
    if args.json:
        print(json.dumps(out))
    return out


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default=None, help=f"one of {', '.join(PRESETS)}, or all")
    ap.add_argument("--cores", default=None, metavar="TEAM[,TEAM...]",
                    help="instead of a preset: price devices.cores split against shared for "
                         "these team files on this CPU machine (flexmarl.sim.cpu_cores)")
    ap.add_argument("--cpu-count", type=int, default=None,
                    help="with --cores: price for this many cores (default: this machine's)")
    ap.add_argument("--override", action="append", default=[], metavar="SECTION.KEY=VALUE",
                    help="with --cores: a run config override, e.g. plan.response_tokens=11")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--steps", type=int, default=None, help="simulated steps (preset default)")
    ap.add_argument("--seed", type=int, default=0, help="the seed the table reports")
    ap.add_argument("--plan-seeds", type=_seeds, default=plan.PLAN_SEEDS, metavar="SEEDS",
                    help="the planner's seeds, apart from --seed: 100 (default), 100,101 or "
                         "100-102 (each candidate's step the mean over them)")
    ap.add_argument("--nodes", type=int, default=None,
                    help="cluster size in nodes of 16 devices (preset default: 48)")
    ap.add_argument("--systems", type=lambda s: s.split(","), default=None,
                    help=f"comma-separated subset of {', '.join(SYSTEMS)}")
    ap.add_argument("--costs", default="gpu",
                    help="cost model: gpu (default), cpu-calibrated, or a TOML file; several "
                         "comma-separated run one after another, side by side")
    ap.add_argument("--pricing", default="new",
                    help=f"weight syncs and reference forwards priced as: {', '.join(PRICINGS)}"
                         " (before issue 54); old,new: both, then the cells whose verdict "
                         "changes side by side")
    ap.add_argument("--kl-coef", type=float, default=0.0,
                    help="trainer.kl_coef of every system (> 0: reference forwards priced)")
    ap.add_argument("--allow-unverified", action="store_true",
                    help="let the planner choose time-shared GPU placements (never run in "
                         "the product: devices.allow_unverified)")
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                    help="override one cost-model parameter (repeatable)")
    ap.add_argument("--plan", action="store_true",
                    help="only plan FlexMARL's shared trainer slots (flexmarl.sim.plan)")
    ap.add_argument("--write", default=None, metavar="PATH",
                    help="with --plan: write the chosen placement as a config file")
    ap.add_argument("--vs-full", action="store_true",
                    help="a preset with LoRA agents against the same team as full copies")
    args = ap.parse_args(argv)
    if args.cores:
        return cores_main(args)
    if not args.preset:
        ap.error("--preset is required (or --cores TEAM)")
    overrides = {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep:
            ap.error(f"--set takes SECTION.KEY=VALUE, got {item!r}")
        overrides[key] = _value(value)
    try:
        pricings = [load_costs(c, **overrides).with_pricing(p)
                    for c in args.costs.split(",") for p in args.pricing.split(",")]
        names = list(PRESETS) if args.preset == "all" else [get_preset(args.preset).name]
        if args.seed in args.plan_seeds:
            raise ValueError(f"--plan-seeds {','.join(map(str, args.plan_seeds))} include "
                             f"--seed {args.seed}: the planner would choose on the workload the "
                             "table reports; give plan seeds apart from it")
        for system in args.systems or []:
            if system not in SYSTEMS:
                raise ValueError(f"unknown system {system!r}; systems: {', '.join(SYSTEMS)}")
    except ValueError as exc:
        ap.error(str(exc))
    if args.write and not args.plan:
        ap.error("--write goes with --plan")
    if args.plan:
        return plan_main(args, names, pricings[0])
    if args.vs_full:
        return vs_full_main(args, names, pricings[0])
    several = len(args.pricing.split(",")) > 1
    by_costs = {}
    for costs in pricings:
        results = {}
        for name in names:
            results[name] = run_preset(name, args, costs)
            print(table(results[name]), f"\n({results[name]['wall_s']:.1f} s to simulate, "
                  f"costs {costs.name}, pricing {costs.pricing})\n")
        by_costs[costs.name + (f"/{costs.pricing}" if several else "")] = results
    cells = [(f"{name} {r['nodes']}n s{r['seed']} {c}", r)
             for c, results in by_costs.items() for name, r in results.items()]
    if len(cells) > 1:
        print(summary(cells) + "\n")
    if several:
        print(pricing_changes(by_costs, names) + "\n")
    outs = {c: (results[names[0]] if len(names) == 1 else {"presets": results})
            for c, results in by_costs.items()}
    out = next(iter(outs.values())) if len(outs) == 1 else {"pricings": outs}
    if args.json:
        print(json.dumps(out))
    return out


def _try_preset(preset, args: argparse.Namespace, costs) -> dict:
    """run_preset, or (the planner finds no placement) every system infeasible."""
    started = time.perf_counter()
    try:
        return run_preset(preset, args, costs)
    except ValueError as exc:
        return {"preset": preset.name, "nodes": args.nodes or preset.nodes, "systems": {},
                "infeasible": {n: f"(the planner) {exc}" for n in args.systems or ["flexmarl"]},
                "wall_s": time.perf_counter() - started}


def vs_full_main(args: argparse.Namespace, names: list[str], costs) -> dict:
    out = {}
    for name in names:
        preset = get_preset(name)
        if not preset.lora:
            if len(names) == 1:
                raise SystemExit(f"--vs-full: preset {name} has no LoRA agents")
            continue
        lora, full = (_try_preset(p, args, costs) for p in (preset, full_twin(preset)))
        print(vs_full(lora, full, preset), f"\n({lora['wall_s'] + full['wall_s']:.1f} s to "
              f"simulate, costs {costs.name})\n")
        out[name] = {"adapters": lora, "full": full}
    result = out[names[0]] if len(out) == 1 else {"presets": out}
    if args.json:
        print(json.dumps(result))
    return result


def plan_main(args: argparse.Namespace, names: list[str], costs) -> dict:
    out = {}
    for name in names:
        preset = get_preset(name)
        if args.nodes is not None:
            preset = dataclasses.replace(preset, nodes=args.nodes)
        started = time.perf_counter()
        preset = dataclasses.replace(preset, kl_coef=args.kl_coef)
        placements = plan_slots(preset, "flexmarl", costs=costs, steps=args.steps,
                                seeds=args.plan_seeds, deployment=deployment(args),
                                progress=lambda p: print(
                                    f"  {plan.label(costs, p)} {p.pipeline} {p.balance}: "
                                    f"{p.step_s:.1f} s per step", file=sys.stderr))
        print(plan.table(preset, costs, placements),
              f"\n({time.perf_counter() - started:.1f} s to simulate)\n")
        out[name] = {"nodes": preset.nodes, "costs": costs.name, "pricing": costs.pricing,
                     "plan_seeds": list(args.plan_seeds), "placements": [
                         plan.describe(preset, costs, p) for p in placements]}
        if args.write:
            with open(args.write, "w") as f:
                f.write(plan.placement_toml(preset, costs, placements[0]))
            print(f"wrote {args.write}", file=sys.stderr)
    result = out[names[0]] if len(names) == 1 else {"presets": out}
    if args.json:
        print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
