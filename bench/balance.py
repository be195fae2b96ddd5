"""Load-balancing benchmark: round_robin, least_loaded and hierarchical side by side, simulated.

Runs one seeded skewed workload (flexmarl.sim.workload.SkewedWorkload: a solver called 4-8 times per
verifier call, lognormal response lengths) through the discrete-event simulator of rollout
instances (flexmarl.sim.routing), once per strategy, with the same Balancer class the rollout pool
uses, and reports per strategy:

- **step s**: mean over steps of a step's time (its first call to its last episode's end);
- **queue wait p50 / p99** per agent: a request's dispatch to its first decode step;
- **load ratio**: max / min over instances of tokens served in the run (1 = even);
- **moves**: instances moved between agents (hierarchical only), with the final placement;

plus speedup_<strategy>_vs_round_robin = round_robin step s / that strategy's step s.

By default `--concurrency 256` episodes run at once, which fills the solver's instances
(4 x 64 slots): the regime where routing matters. `--concurrency 32` (this project's default
pipeline: 4 tasks x 8 trajectories) leaves them mostly idle and the strategies close.
The engine model's numbers and why are in flexmarl/sim/routing.py. A default run takes ~2 s.

    .venv/bin/python bench/balance.py [--json] [--steps 4] [--seed 0] [--instances 4]
                                       [--concurrency 256] [--episodes 512] [--slots 64]
                                       [--calibrate vllm|torch] [--set balance_key=value ...]

`--calibrate vllm` first measures a real vLLM instance on this machine and simulates with its
step times. Why simulate at all: instances here share two cores, so a real run cannot show what
balancing buys instances that each have their own accelerator; the simulator gives each
instance its own capacity and drives the same Balancer class as the real rollout pool
(whose routing and moves are tested on real engines in tests/test_pipeline.py).

With --json the last line is one JSON object: strategies.<name>.{step_s, wait, load_ratio,
busy_ratio, moves, ...}, speedup_hierarchical_vs_round_robin,
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

from flexmarl.rollout.balancer import STRATEGIES, Balancer, BalancerConfig  # noqa: E402
from flexmarl.sim.routing import SimConfig, SimResult, placement, simulate  # noqa: E402
from flexmarl.sim.workload import SkewedWorkload  # noqa: E402


def simulate_strategies(workload: SkewedWorkload, sim: SimConfig, instances: int,
                        strategies=STRATEGIES, balance: dict | None = None
                        ) -> dict[str, SimResult]:
    """Each strategy on the same workload and engine model, `instances` per agent at start;
    `balance` overrides BalancerConfig fields for every strategy."""
    results = {}
    for name in strategies:
        config = BalancerConfig(**{**(balance or {}), "strategy": name})
        results[name] = simulate(workload, Balancer(placement(workload.agent_names, instances),
                                                    config), sim)
    return results


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None   # JSON has no inf/nan


def summarize(r: SimResult) -> dict:
    return {
        "step_s": r.mean_step_s,
        "step_s_each": r.step_s,
        "wait": {a: {k: _finite(v) for k, v in s.items()} for a, s in r.wait_stats().items()},
        "load_ratio": _finite(r.load_ratio),
        "busy_ratio": _finite(r.busy_ratio),
        "tokens_served": r.tokens_served,
        "moves": len(r.moves),
        "move_log": [{"t": m.planned_at, "instance": m.move.instance, "src": m.move.src,
                      "dst": m.move.dst, "src_load": m.move.src_load,
                      "dst_load": m.move.dst_load, "drain_s": m.drain_s,
                      "reload_s": m.reload_s} for m in r.moves],
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


async def calibrate(backend: str = "vllm", size: str = "small", tokens: int = 48,
                    batches: tuple[int, ...] = (1, 4, 16, 32)) -> dict:
    """Measure one real rollout instance (pinned to one core): the wall time of a decode step
    with k sequences, for a few k, fitted as step_base_s + step_per_seq_s * k.

    The model is the built-in size with random weights (no warm start): it rarely samples EOS,
    so sequences run to max_tokens and a request's time over its length is the step time."""
    import asyncio

    from flexmarl.models import ensure_model
    from flexmarl.protocol import Generate, SamplingParams
    from runtime.supervisor import Supervisor, WorkerSpec
    from runtime.transport import connect

    model_dir = str(await asyncio.to_thread(ensure_model, size, warm_start_steps=0))
    core = sorted(os.sched_getaffinity(0))[0]
    sup = Supervisor()
    points = []
    async with sup.serving():
        handle = await sup.start_worker(WorkerSpec(
            name="calibrate", entry="flexmarl.rollout.worker:rollout_worker",
            args={"backend": backend, "model_dir": model_dir, "kv_cache_bytes": 64 << 20},
            ready_timeout_s=600, cpus=(core,), env={"VLLM_CPU_OMP_THREADS_BIND": str(core)}))
        async with connect(handle.address) as conn:
            params = SamplingParams(n=1, max_tokens=tokens, temperature=1.0)

            async def one(rid: str) -> int:
                reply = await conn.request(Generate(rid, prompt_ids=[5, 6, 7, 8], params=params),
                                           timeout_s=600)
                return len(reply.samples[0].token_ids)

            await asyncio.gather(*(one(f"warm{i}") for i in range(4)))
            for k in batches:
                started = time.perf_counter()
                lengths = await asyncio.gather(*(one(f"k{k}.{i}") for i in range(k)))
                points.append((k, (time.perf_counter() - started) / max(lengths)))
        await sup.stop_workers()
    n = len(points)
    mx = sum(k for k, _ in points) / n
    my = sum(t for _, t in points) / n
    slope = sum((k - mx) * (t - my) for k, t in points) / sum((k - mx) ** 2 for k, _ in points)
    return {"backend": backend, "size": size, "step_base_s": max(1e-5, my - slope * mx),
            "step_per_seq_s": max(0.0, slope), "points": points}


def main(args: argparse.Namespace) -> None:
    workload = SkewedWorkload(episodes_per_step=args.episodes, seed=args.seed)
    engine: dict = {}
    if args.calibrate:
        import asyncio
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
        engine = asyncio.run(calibrate(args.calibrate))
        print(f"calibrated on a real {engine['backend']} instance ({engine['size']} model, one "
              f"core): decode step {engine['step_base_s'] * 1e3:.2f} ms + "
              f"{engine['step_per_seq_s'] * 1e3:.3f} ms per sequence "
              f"(k, s/step: {[(k, round(t, 5)) for k, t in engine['points']]})")
    sim = SimConfig(steps=args.steps, slots=args.slots, max_concurrent_episodes=args.concurrency,
                    **{k: engine[k] for k in ("step_base_s", "step_per_seq_s") if k in engine})
    balance = parse_balance(args.set)
    started = time.perf_counter()
    results = simulate_strategies(workload, sim, args.instances, balance=balance)
    wall = time.perf_counter() - started
    agents = workload.agent_names
    out: dict = {"strategies": {name: summarize(r) for name, r in results.items()}}
    assert all(s["all_finished"] for s in out["strategies"].values()), "a request was lost"

    print(f"simulated balancing: {args.steps} steps of {args.episodes} episodes, "
          f"{args.concurrency} at once, {args.instances} instances per agent at start, "
          f"{args.slots} slots each, seed {args.seed} ({wall:.1f} s wall)")
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
                     "slots": args.slots, "balance": balance,
                     "sim": dataclasses.asdict(sim), "calibration": engine or None,
                     "wall_s": wall}
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
    ap.add_argument("--slots", type=int, default=64, help="sequences an instance decodes at once")
    ap.add_argument("--calibrate", choices=("vllm", "torch"), default=None,
                    help="measure the engine model's step times on a real instance of this "
                         "backend first (about a minute) instead of the built-in assumptions")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="BalancerConfig override for every strategy, e.g. ratio=3")
    args = ap.parse_args(argv)
    for name in ("steps", "instances", "concurrency", "episodes", "slots"):
        if getattr(args, name) < 1:
            ap.error(f"--{name} must be >= 1")
    return args


if __name__ == "__main__":
    main(parse_args())
