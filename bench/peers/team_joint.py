"""bench/peers.py's workload "joint" as a FlexMARL team: two SmolLM2-135M agents, each its own
model, answer the same sum at once; both get the joint reward (right(a) + right(b)) / 2.

Trajectory j of a task pairs agent a's j-th answer with agent b's j-th (G joint samples per
task, G samples per agent), CoMLRL MAGRPOTrainer's shape. Tasks, prompts, reward and settings are
bench/peers/workloads.py's.

    flexmarl run --team bench/peers/team_joint.py
"""
from __future__ import annotations

import asyncio
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # workloads.py, stdlib only
import workloads as w  # noqa: E402

from flexmarl import AgentSpec, SamplingParams, Team  # noqa: E402

S = w.Setting()
SAMPLING = SamplingParams(temperature=S.temperature, max_tokens=S.max_new_tokens)
TRAIN, HELDOUT = w.split()


async def workflow(ctx, task: w.Sum) -> None:
    prompt = w.solver_prompt(task)
    [a], [b] = await asyncio.gather(ctx.generate("a", prompt), ctx.generate("b", prompt))
    reward = w.joint_reward(a.text, b.text, task)
    ctx.reward(a, reward)
    ctx.reward(b, reward)
    ctx.team_reward(reward)


team = Team(
    name="peers_joint",
    agents=[AgentSpec(name=name, model="smollm2-135m", train_layers=S.train_layers, lr=S.lr,
                      sampling=SAMPLING) for name in w.AGENTS["joint"]],
    workflow=workflow,
    tasks=TRAIN,
    heldout=HELDOUT,
)
