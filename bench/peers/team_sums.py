"""bench/peers.py's workload "sums" as a FlexMARL team: one SmolLM2-135M agent answers a + b.

The tasks, prompts, reward and settings are bench/peers/workloads.py's (the default team's), so
TRL's GRPOTrainer trains on exactly this work.

    flexmarl run --team bench/peers/team_sums.py
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # workloads.py, stdlib only
import workloads as w  # noqa: E402

from flexmarl import AgentSpec, SamplingParams, Team  # noqa: E402

S = w.Setting()
SAMPLING = SamplingParams(temperature=S.temperature, max_tokens=S.max_new_tokens)
TRAIN, HELDOUT = w.split()


async def workflow(ctx, task: w.Sum) -> None:
    [answer] = await ctx.generate("solver", w.solver_prompt(task))
    reward = w.right(answer.text, task)
    ctx.reward(answer, reward)
    ctx.team_reward(reward)


team = Team(
    name="peers_sums",
    agents=[AgentSpec(name="solver", model="smollm2-135m", train_layers=S.train_layers,
                      lr=S.lr, sampling=SAMPLING)],
    workflow=workflow,
    tasks=TRAIN,
    heldout=HELDOUT,
)
