"""An orchestrator on a fake instance pool, for tests of workflows, rewards and groups without
any worker process (tests/test_bad_input.py, tests/test_task_turns.py)."""
from __future__ import annotations

import asyncio
import types

from flexmarl import AgentSpec, Team
from flexmarl.config.pipeline import PipelineConfig
from flexmarl.orchestrator.agents import AgentRuntime, StepGate
from flexmarl.orchestrator.orchestrator import Orchestrator
from flexmarl.orchestrator.store import ExperienceStore
from flexmarl.protocol import GenerateReply, Sample
from flexmarl.tasks import addition_tasks

PROMPT = [1, 2, 3]  # token ids: no tokenizer needed


# ----------------------------------------------------------------------------- fakes

class FakePool:
    """An instance pool answering every request at once: `n` samples of two tokens."""

    def __init__(self) -> None:
        self.balancer = types.SimpleNamespace(end_episode=lambda agent, episode: None)
        self.activity = None

    async def generate(self, agent, msg, *, episode=None) -> GenerateReply:
        await asyncio.sleep(0)
        return GenerateReply(msg.request_id, 0, list(msg.prompt_ids),
                             [Sample([7, 8], [-0.5, -0.25], "stop", "ab")
                              for _ in range(msg.params.n)])


def make_orch(workflow, *, tasks=None, trajectories: int = 4, frozen: bool = False,
              credit: str = "turn") -> Orchestrator:
    specs = [AgentSpec(name="a", model="tiny")]
    if frozen:
        specs.append(AgentSpec(name="f", model="tiny", trainable=False))
    team = Team(name="flaky", agents=specs, workflow=workflow,
                tasks=tasks or addition_tasks(8, seed=1))
    agents = {s.name: AgentRuntime(s, "", None, gate=StepGate(1 << 30)) for s in specs}
    store = ExperienceStore([s.name for s in specs if s.trainable], credit=credit)
    return Orchestrator(team, agents, store, FakePool(), PipelineConfig(
        trajectories_per_task=trajectories, max_concurrent_tasks=4, max_concurrent_calls=8,
        micro_batch_groups=1))


async def take_all(orch: Orchestrator, agent: str = "a"):
    return await orch.store.take_groups(agent, 1000, flush=True)
