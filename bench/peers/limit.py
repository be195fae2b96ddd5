"""The physical limit of one training step of a bench/peers.py workload: the step no scheduler
can beat on this machine.

    CPU-seconds to generate the step's tokens with the rollout engine alone
  + CPU-seconds of the same samples' forward and backward and the optimizer step alone
  ─────────────────────────────────────────────────────────────────────────────────────  = limit
                              cores the run has

The trainer's part is also priced per group (one micro-batch each) and per optimizer step, so
bench/peers.py prices each system's limit on the groups it trains (limit_for): every group for
the peers, FlexMARL's trained samples for it (it skips groups whose rewards are all equal).
Both are measured here on one thread (torch.set_num_threads(1)), so their CPU-seconds are the
work itself, with none of a thread pool's spinning: FlexMARL's batched torch rollout engine
(flexmarl.rollout.torch_engine, the engine `rollout.backend = "auto"` picks on this machine) on
exactly the workload's calls (4 tasks x 8 samples per agent, the duo's checker calls made from
the solver's claims), then FlexMARL's GRPO trainer (flexmarl.training.trainer, last 6 blocks and
the final norm trainable) on all of those samples, one micro-batch of 8 rows at a time, then
one optimizer step, per agent. The first of `--steps` rounds warms the allocator and is left out.
Each agent is priced with its own model, lr and new tokens (workloads.agent_setting: mixed's
Gemma 3 270M solver and SmolLM2 checker), its prompts rendered as FlexMARL renders them for
that model (the chat template, or the plain rendering with its stop).

    .venv/bin/python bench/peers/limit.py --workload duo [--steps 3] [--json]
        [--model SMOLLM2_DIR] [--model-dir gemma3-270m=DIR]   (default: FlexMARL's cached ones)
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import workloads as w  # noqa: E402

ROWS_PER_MICRO_BATCH = 8


async def measure(workload: str, steps: int, setting: w.Setting) -> dict:
    import torch

    from flexmarl import AgentSpec, SamplingParams
    from flexmarl.launch.model_dirs import resolve_model
    from flexmarl.orchestrator.agents import AgentRuntime
    from flexmarl.orchestrator.batch import micro_batch
    from flexmarl.rollout.backends import make_engine
    from flexmarl.rollout.engine import EngineConfig
    from flexmarl.training.trainer import GRPOTrainer
    from flexmarl.config.training import TrainerConfig

    torch.set_num_threads(1)
    agents = w.AGENTS[workload]
    flow = w.WORKFLOW[workload]
    settings, samplings = {}, {}
    engines, runtimes, trainers = {}, {}, {}
    for name in agents:  # one engine and one trainer per agent, as every system has
        sa = w.agent_setting(setting, workload, name)  # its own model, lr and new tokens
        model_dir = sa.model or resolve_model(AgentSpec(name=name, model=sa.family))
        settings[name] = sa = dataclasses.replace(sa, model=model_dir)
        samplings[name] = SamplingParams(temperature=sa.temperature, max_tokens=sa.max_new_tokens)
        engines[name] = make_engine(EngineConfig(backend="torch", model_dir=model_dir,
                                                 max_model_len=512, seed=sa.seed))
        await engines[name].start()
        runtimes[name] = AgentRuntime(AgentSpec(name=name, model=model_dir,
                                                sampling=samplings[name]),
                                      model_dir, engines[name].tokenizer)
        trainers[name] = GRPOTrainer(model_dir, TrainerConfig(
            lr=sa.lr, train_layers=sa.train_layers, temperature=sa.temperature,
            grad_clip=sa.grad_clip, clip_eps=sa.clip_eps, seed=sa.seed))
    pads = {name: engines[name].tokenizer.pad_token_id or 0 for name in agents}

    async def ask(name: str, prompts: list[list[dict]], salt: int) -> list:
        # call_params: the plain rendering's stop where the agent's model gets it (Gemma).
        rt = runtimes[name]
        calls = [engines[name].generate(rt.encode(p), dataclasses.replace(
                     rt.call_params(p, samplings[name]), seed=salt + k))
                 for k, p in enumerate(prompts)]
        return [(rt.encode(p), r[0][0]) for p, r in zip(prompts, await asyncio.gather(*calls))]

    rounds = []
    for s, tasks in enumerate(w.step_tasks(dataclasses.replace(setting, steps=steps))):
        calls = [t for t in tasks for _ in range(setting.group_size)]
        cpu, wall = time.process_time(), time.perf_counter()
        out = {agents[0]: await ask(agents[0], [w.solver_prompt(t) for t in calls], 1000 * s)}
        if flow == "joint":
            out["b"] = await ask("b", [w.solver_prompt(t) for t in calls], 1000 * s + 500)
        elif flow == "duo":
            claims = [w.last_number(x.text) for _, x in out["solver"]]
            out["checker"] = await ask("checker", [w.checker_prompt(t, c)
                                                   for t, c in zip(calls, claims)], 1000 * s + 500)
        gen_cpu, gen_wall = time.process_time() - cpu, time.perf_counter() - wall
        tokens = sum(len(x.token_ids) for rows in out.values() for _, x in rows)
        cpu, wall = time.process_time(), time.perf_counter()
        group_cpu, step_cpu, groups, signal = 0.0, 0.0, 0, 0
        per_agent: dict[str, dict] = {}
        for name, rows in out.items():
            a_cpu, a_groups = 0.0, 0
            rewards = [w.right(x.text, t) for (_, x), t in zip(rows, calls)]
            # Every sample trains (the peers train zero-advantage groups too): advantages of
            # +-1 where a group's rewards are all equal, so every row has a gradient.
            advantages = [r - 0.5 for r in rewards]
            trainer = trainers[name]
            batch = [(p, x.token_ids, x.logprobs) for p, x in rows]
            trainer.begin_batch(None)
            for i in range(0, len(batch), ROWS_PER_MICRO_BATCH):  # one group per micro-batch
                c0 = time.process_time()
                trainer.accumulate(micro_batch(batch[i:i + ROWS_PER_MICRO_BATCH],
                                               advantages[i:i + ROWS_PER_MICRO_BATCH],
                                               pad_id=pads[name]))
                group_cpu += time.process_time() - c0
                a_cpu += time.process_time() - c0
                groups += 1
                a_groups += 1
                signal += len(set(rewards[i:i + ROWS_PER_MICRO_BATCH])) > 1
            c0 = time.process_time()
            trainer.step(sum(len(x.token_ids) for _, x in rows))
            step_cpu += time.process_time() - c0
            # Each agent's own prices: two models (mixed) train at very different costs.
            per_agent[name] = {"group_cpu_s": a_cpu / a_groups,
                               "optimizer_cpu_s": time.process_time() - c0}
        train_cpu, train_wall = time.process_time() - cpu, time.perf_counter() - wall
        rounds.append({"gen_cpu_s": gen_cpu, "gen_wall_s": gen_wall, "train_cpu_s": train_cpu,
                       "train_wall_s": train_wall, "tokens": tokens,
                       "samples": sum(len(r) for r in out.values()),
                       "group_cpu_s": group_cpu / groups, "optimizer_cpu_s": step_cpu,
                       "groups": groups, "signal_groups": signal, "agents": per_agent})
    for e in engines.values():
        await e.close()
    timed = rounds[1:] or rounds
    med = {k: statistics.median(r[k] for r in timed) for k in timed[0] if k != "agents"}
    med["agents"] = {a: {k: statistics.median(r["agents"][a][k] for r in timed)
                         for k in timed[0]["agents"][a]} for a in timed[0]["agents"]}
    cores = len(os.sched_getaffinity(0))
    limit = (med["gen_cpu_s"] + med["train_cpu_s"]) / cores
    return {"workload": workload, **med, "cores": cores, "limit_step_s": limit,
            "limit_samples_per_s": med["samples"] / limit, "group_size": ROWS_PER_MICRO_BATCH,
            "rounds": rounds}


def limit_for(lim: dict, trained_per_step: float | None = None,
              by_agent: dict[str, float] | None = None) -> float:
    """The limit's step priced on the work a system does: its generation, the optimizer steps
    and the groups it trains, in groups of lim["group_size"]: `by_agent` (samples each agent
    trained per step) at each agent's own price per group where the limit has them (two
    models train at very different costs), else `trained_per_step` at the mean price; None
    for both: every group (the peers' work, lim["limit_step_s"]). Limits measured before the
    per-group prices existed give limit_step_s."""
    if (trained_per_step is None and by_agent is None) or "group_cpu_s" not in lim:
        return lim["limit_step_s"]
    prices = lim.get("agents") or {}
    if by_agent is not None and prices and set(by_agent) <= set(prices):
        train = sum(n / lim["group_size"] * prices[a]["group_cpu_s"] for a, n in by_agent.items())
    else:
        total = trained_per_step if trained_per_step is not None else sum(by_agent.values())
        train = total / lim["group_size"] * lim["group_cpu_s"]
    return (lim["gen_cpu_s"] + lim["optimizer_cpu_s"] + train) / lim["cores"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", choices=w.WORKLOADS, required=True)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--model", default="", help="the converted SmolLM2-135M-Instruct directory")
    ap.add_argument("--model-dir", action="append", default=[], metavar="FAMILY=DIR",
                    help="another family's converted directory (mixed: gemma3-270m=DIR)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    models = tuple(tuple(x.split("=", 1)) for x in args.model_dir)
    r = asyncio.run(measure(args.workload, args.steps, w.Setting(model=args.model,
                                                                 models=models)))
    print(f"{args.workload}: generate {r['gen_cpu_s']:.2f} CPU-s, train {r['train_cpu_s']:.2f} "
          f"CPU-s for {r['samples']:.0f} samples ({r['tokens']:.0f} tokens) on one thread "
          f"({r['group_cpu_s']:.2f} a group, {r['optimizer_cpu_s']:.2f} the optimizer steps; "
          f"{r['signal_groups']:.0f} of {r['groups']:.0f} groups with a GRPO signal); limit on "
          f"{r['cores']} cores {r['limit_step_s']:.2f} s per step every group trained "
          f"({r['limit_samples_per_s']:.2f} samples/s), "
          f"{limit_for(r, r['signal_groups'] * r['group_size']):.2f} s the groups with a "
          "signal only")
    if args.json:
        print(json.dumps(r))


if __name__ == "__main__":
    main()
