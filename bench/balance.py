"""Load-balancing benchmark: round_robin, least_loaded and hierarchical side by side, simulated.

Runs one seeded skewed workload (flexmarl.sim.workload.SkewedWorkload: a solver called 4-8
times per verifier call, lognormal response lengths) once per strategy on the cluster
simulator (flexmarl.sim.routing): real RolloutWorker actors on the simulator's engines, whose
decode steps and prefills come from the cost model (flexmarl/sim/costs.toml, the one
bench/simulate.py uses), routed and moved by the real InstancePool and Balancer, on a virtual
clock. It reports per strategy:

- **step s**: mean over steps of a step's time (its first call to its last episode's end);
- **queue wait p50 / p99** per agent: a call's dispatch to its first sequence joining an
  instance's batch (continuous batching: it waits only while the instance is full);
- **load ratio**: max / min over instances of tokens served in the run (1 = even);
- **moves**: instances moved between agents (hierarchical only), with the final placement;

plus speedup_<strategy>_vs_round_robin = round_robin step s / that strategy's step s.

Every agent runs the cost model's `--model` (14b: an instance on 2 devices); a move drains the
instance, then loads the hot agent's weights (the cost model's weight_load_s: 1.2 s for 14b).
`--slots` is the most sequences an instance decodes together (the cost model's
rollout.max_num_seqs, replaced): by default 64, so that `--concurrency 256` episodes at once
fill the solver's 4 instances and routing decides who queues. `--concurrency 32` (this
project's default pipeline: 4 tasks x 8 trajectories) leaves them mostly idle. A default run
takes ~15 s.

    .venv/bin/python bench/balance.py [--json] [--steps 4] [--seed 0] [--instances 4]
                                       [--concurrency 256] [--episodes 512] [--slots 64]
                                       [--model 14b] [--prompt-tokens 256]
                                       [--cost section.key=value ...] [--set balance_key=value ...]

Changed with the move onto the cluster simulator: `--slots` now sets the engine's
max_num_seqs (it was the old instance model's batch size); `--calibrate` is gone (it measured
a vLLM-on-CPU instance to fit the old model's step times; service times now come from the
cost model, changed with `--cost`); `--model`, `--prompt-tokens` and `--cost` are new.

Why simulate at all: instances here share two cores, so a real run cannot show what balancing
buys instances that each have their own accelerator; the simulator gives each instance its own
devices and runs the real pool's routing, reports and moves (which are also tested on real
engines in tests/test_pipeline.py).

With --json the last line is one JSON object: strategies.<name>.{step_s, wait, load_ratio,
busy_ratio, moves, move_log, placement, ...}, speedup_hierarchical_vs_round_robin,
speedup_least_loaded_vs_round_robin, config.
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import math
import os
import sys
import time

# `python bench/balance.py` puts bench/, not the repository root, on sys.path.
if importlib.util.find_spec("flexmarl") is None:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from flexmarl.config.balance import BalancerConfig, STRATEGIES
from flexmarl.sim.costs import Costs, load_costs  # noqa: E402
from flexmarl.sim.routing import (RoutingConfig, RoutingResult, initial_placement,  # noqa: E402
                                  move_times, run_routing)
from flexmarl.sim.workload import SkewedWorkload  # noqa: E402


def simulate_strategies(workload: SkewedWorkload, config: RoutingConfig, instances: int,
                        strategies=STRATEGIES, balance: dict | None = None,
                        costs: Costs | None = None) -> dict[str, RoutingResult]:
    """Each strategy on the same workload and cost model, `instances` per agent at start;
    `balance` overrides BalancerConfig fields for every strategy."""
    results = {}
    for name in strategies:
        results[name] = run_routing(workload, initial_placement(workload.agent_names, instances),
                                    BalancerConfig(**{**(balance or {}), "strategy": name}),
                                    config, costs)
    return results


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None   # JSON has no inf/nan


def summarize(r: RoutingResult) -> dict:
    return {
        "step_s": r.mean_step_s,
        "step_s_each": r.step_s,
        "wait": {a: {k: _finite(v) for k, v in s.items()} for a, s in r.wait_stats().items()},
        "load_ratio": _finite(r.load_ratio),
        "busy_ratio": _finite(r.busy_ratio),
        "tokens_served": r.tokens_served,
        "moves": len(r.moves),
        "move_log": [{"t": move_times(m)[0], "instance": m.instance, "src": m.src,
                      "dst": m.dst, "src_load": m.src_load, "dst_load": m.dst_load,
                      "drain_s": m.drain_s, "reload_s": m.load_s} for m in r.moves],
        "placement": {a: len(v) for a, v in r.placement.items()},
        "all_finished": r.all_finished,
    }


def parse_balance(pairs: list[str]) -> dict:
    fields = {f.name: f for f in dataclasses.fields(BalancerConfig)}
    out = {}
    for pair in pairs:
        key, _, value = pair.partition("=")
        if key not in fields or key == "strategy":
            raise SystemExit(f"--set: {key!r} is not a balance setting (one of "
                             f"{', '.join(k for k in fields if k != 'strategy')})")
        default = getattr(BalancerConfig(), key)
        out[key] = type(default)(value)
    return out


def parse_costs(pairs: list[str]) -> dict:
    """--cost section.key=value pairs as load_costs overrides (ints stay ints)."""
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise SystemExit(f"--cost takes SECTION.KEY=VALUE, got {pair!r}")
        number = float(value)
        out[key] = int(number) if number.is_integer() and not any(
            c in value for c in ".eE") else number
    return out


def main(args: argparse.Namespace) -> None:
    workload = SkewedWorkload(episodes_per_step=args.episodes, seed=args.seed)
    overrides = parse_costs(args.cost)
    try:
        costs = load_costs(**overrides)
        config = RoutingConfig(model=args.model, max_num_seqs=args.slots,
                               prompt_tokens=args.prompt_tokens,
                               max_concurrent_episodes=args.concurrency, steps=args.steps)
        config.costs(costs)   # an unknown --model fails here, before any run
    except ValueError as exc:
        raise SystemExit(f"balance.py: {exc}")
    balance = parse_balance(args.set)
    started = time.perf_counter()
    results = simulate_strategies(workload, config, args.instances, balance=balance,
                                  costs=costs)
    wall = time.perf_counter() - started
    agents = workload.agent_names
    out: dict = {"strategies": {name: summarize(r) for name, r in results.items()}}
    assert all(s["all_finished"] for s in out["strategies"].values()), "a request was lost"

    print(f"simulated balancing: {args.steps} steps of {args.episodes} episodes, "
          f"{args.concurrency} at once, {args.instances} {args.model} instances per agent at "
          f"start, {args.slots} sequences each, seed {args.seed} ({wall:.1f} s wall)")
    waits = "  ".join(f"{a + ' wait p50/p99 s':>24}" for a in agents)
    print(f"{'strategy':<13} {'step s':>7}  {waits}  {'load ratio':>10} {'moves':>5}  placement")
    for name, s in out["strategies"].items():
        cells = "  ".join(f"{s['wait'][a]['p50']:>11.3f} / {s['wait'][a]['p99']:>8.3f}"
                          for a in agents)
        ratio = "inf" if s["load_ratio"] is None else f"{s['load_ratio']:.2f}"
        place = ", ".join(f"{a} {n}" for a, n in s["placement"].items())
        print(f"{name:<13} {s['step_s']:>7.2f}  {cells}  {ratio:>10} {s['moves']:>5}  {place}")
    if "round_robin" in results:
        base = out["strategies"]["round_robin"]["step_s"]
        for name in out["strategies"]:
            if name != "round_robin":
                speedup = base / out["strategies"][name]["step_s"]
                out[f"speedup_{name}_vs_round_robin"] = speedup
                print(f"{name} vs round_robin: {speedup:.2f}x step time")
    out["config"] = {"steps": args.steps, "seed": args.seed, "instances": args.instances,
                     "concurrency": args.concurrency, "episodes": args.episodes,
                     "slots": args.slots, "model": args.model, "balance": balance,
                     "sim": dataclasses.asdict(config), "costs": overrides, "wall_s": wall}
    if args.json:
        print(json.dumps(out))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--steps", type=int, default=4, help="steps per strategy")
    ap.add_argument("--seed", type=int, default=0, help="workload seed")
    ap.add_argument("--instances", type=int, default=4, help="instances per agent at start")
    ap.add_argument("--concurrency", type=int, default=256, help="episodes in flight at once")
    ap.add_argument("--episodes", type=int, default=512, help="episodes per step")
    ap.add_argument("--slots", type=int, default=64,
                    help="sequences an instance decodes at once (the engine's max_num_seqs)")
    ap.add_argument("--model", default="14b", help="the cost model's model every agent runs")
    ap.add_argument("--prompt-tokens", type=int, default=256, help="prompt length of a call")
    ap.add_argument("--cost", action="append", default=[], metavar="SECTION.KEY=VALUE",
                    help="override one cost-model parameter (repeatable), e.g. "
                         "rollout.decode_step_overhead_s=0.01")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="BalancerConfig override for every strategy, e.g. ratio=3")
    # Removed with the old instance model; named so that old command lines fail clearly.
    ap.add_argument("--calibrate", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.calibrate is not None:
        ap.error("--calibrate was removed: service times come from the cluster simulator's "
                 "cost model (flexmarl/sim/costs.toml); change them with --cost")
    for name in ("steps", "instances", "concurrency", "episodes", "slots", "prompt_tokens"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1")
    return args


if __name__ == "__main__":
    main(parse_args())
