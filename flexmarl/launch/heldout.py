"""Held-out accuracy of each agent: does the training generalise beyond the tasks it saw?

    for each trainable agent with a model directory (before: its starting weights; after: its
    final checkpoint) ─► TorchEngine in this process ─► every held-out task once greedy and
    once sampled (the agent's own sampling settings, a fixed seed per task) ─► team.score
    ─► {"greedy": accuracy, "sampled": accuracy} in [0, 1]

The torch engine keeps this independent of the run's workers and exact across runs (the same
weights give the same numbers). It runs after (or before) a run, never during one.
"""
from __future__ import annotations

import dataclasses
from flexmarl.orchestrator.agents import AgentRuntime
from flexmarl.rollout.engine import EngineConfig
from flexmarl.rollout.torch_engine import TorchEngine
from flexmarl.team import AgentSpec, Team

SEED = 1234
"""Sampled answers use seed SEED + task index: before and after see the same random draws."""


async def heldout_accuracy(team: Team, spec: AgentSpec, model_dir: str, *,
                           limit: int | None = None) -> dict[str, float]:
    """Greedy and sampled accuracy of `spec`'s agent with the weights in `model_dir` on the
    team's held-out tasks (at most `limit` of them)."""
    if not team.heldout or team.score is None:
        raise ValueError(f"team {team.name} has no held-out tasks (Team.heldout and Team.score)")
    tasks = list(team.heldout)[:limit]
    engine = TorchEngine(EngineConfig(model_dir=model_dir, max_model_len=1024))
    await engine.start()
    agent = AgentRuntime(spec, model_dir, engine.tokenizer)
    try:
        greedy = dataclasses.replace(spec.sampling, n=1, temperature=0.0, seed=None)
        right = {"greedy": 0.0, "sampled": 0.0}
        for i, task in enumerate(tasks):
            asked = team.prompts(spec.name, task) if team.prompts is not None else task.prompt
            prompt = agent.encode(asked)  # as ctx.generate encodes it
            for mode, params in (("greedy", greedy), ("sampled", dataclasses.replace(
                    spec.sampling, n=1, seed=SEED + i))):
                [sample], _ = await engine.generate(prompt, params)
                right[mode] += float(team.score(spec.name, sample.text, task))
    finally:
        await engine.close()
    return {mode: total / len(tasks) for mode, total in right.items()}


__all__ = ["heldout_accuracy"]
