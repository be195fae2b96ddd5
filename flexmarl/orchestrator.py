"""The orchestrator: runs the team's workflow on many tasks at once and owns version boundaries.

    tasks ──► rollout(): ≤ max_concurrent_tasks tasks at once, each as trajectories_per_task
              trajectories ──► workflow(ctx, task) ──ctx.generate──► rollout instance of agent
                                        │ every turn of a trainable agent ──► ExperienceStore
              all trajectories of a task done ──► store.complete_input (groups + advantages)
    train(agent): complete groups ──► micro-batches ──► trainer (begin, accumulate…, step)
    sync(agent):  trainer.export ──► push_weights to every instance of the agent (new version)

The pipeline policy (flexmarl.pipeline) decides when each of these runs. Rollout instances are
chosen round-robin per agent for now; the hierarchical balancer replaces `pick_instance`.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Iterator

from flexmarl.batch import micro_batch
from flexmarl.protocol import (ExportWeights, Generate, GenerateReply, TrainBeginBatch, TrainStep, WeightUpdate)
from flexmarl.store import ExperienceStore, Group, Turn
from flexmarl.team import AgentSpec, Completion, Team
from flexmarl.weight_sync import push_weights
from runtime.actor import Actor
from runtime.transport import Connection

log = logging.getLogger(__name__)


def task_stream(tasks: list[Any], seed: int) -> Iterator[Any]:
    """The data cursor: every task once per epoch, in a fresh seeded order each epoch."""
    rng = random.Random(seed)
    while True:
        order = list(range(len(tasks)))
        rng.shuffle(order)
        yield from (tasks[i] for i in order)


@dataclass
class AgentRuntime:
    """One agent's live pieces: its rollout instances, its trainer, its current version."""

    spec: AgentSpec
    model_dir: str
    tokenizer: Any
    instances: list[Connection]
    trainer: Connection | None
    version: int = 0
    request_timeout_s: float = 300.0
    _next: int = 0

    def pick_instance(self) -> Connection:
        conn = self.instances[self._next % len(self.instances)]
        self._next += 1
        return conn

    def encode(self, prompt: str | list[dict] | list[int]) -> list[int]:
        if isinstance(prompt, str):
            prompt = [{"role": "user", "content": prompt}]
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], dict):
            text = self.tokenizer.apply_chat_template(prompt, tokenize=False,
                                                      add_generation_prompt=True)
            return self.tokenizer.encode(text, add_special_tokens=False)
        if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
            return list(prompt)
        raise TypeError(f"agent {self.spec.name}: a prompt is a str, a list of chat messages "
                        f"or a list of token ids, got {type(prompt).__name__}")


@dataclass
class RolloutStats:
    seconds: float = 0.0
    team_rewards: list[float] = field(default_factory=list)
    rewards: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    samples: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    tokens: dict[str, int] = field(default_factory=lambda: defaultdict(int))


@dataclass
class TrainResult:
    version: int
    groups: int
    samples: int
    tokens: int
    loss: float
    seconds: float
    staleness: float
    """Mean of (version trained from - policy_version of each trained sample)."""
    skipped: bool = False


class TrajectoryContext:
    """The `ctx` of one workflow run (see flexmarl.team.Context)."""

    def __init__(self, orch: "Orchestrator", task: Any, input_id: str, trajectory: int,
                 calls: asyncio.Semaphore) -> None:
        self.orch = orch
        self.task = task
        self.input_id = input_id
        self.trajectory = trajectory
        self._calls = calls
        self._turns: dict[str, int] = defaultdict(int)
        self._own: dict[str, float] = {}
        self._made: list[Completion] = []
        self._team: float | None = None

    async def generate(self, agent: str, prompt: str | list[dict] | list[int], *,
                       n: int = 1, **sampling: Any) -> list[Completion]:
        rt = self.orch.agents.get(agent)
        if rt is None:
            raise ValueError(f"workflow called unknown agent {agent!r}; the team has "
                             f"{sorted(self.orch.agents)}")
        prompt_ids = rt.encode(prompt)
        params = dataclasses.replace(rt.spec.sampling, n=n, **sampling)
        turn = self._turns[agent]
        self._turns[agent] += 1
        async with self._calls:
            reply: GenerateReply = await rt.pick_instance().request(
                Generate(f"{self.input_id}/{self.trajectory}/{agent}/{turn}",
                         prompt_ids=prompt_ids, params=params), timeout_s=rt.request_timeout_s)
        out = []
        for k, s in enumerate(reply.samples):
            traj_id = str(self.trajectory) if n == 1 else f"{self.trajectory}.{k}"
            row = Turn(agent=agent, input_id=self.input_id, turn=turn, traj_id=traj_id,
                       policy_version=reply.version, prompt_ids=reply.prompt_ids,
                       response_ids=s.token_ids, logprobs=s.logprobs)
            if rt.spec.trainable:
                await self.orch.store.put(row)
            out.append(Completion(agent, s.text, s.token_ids, s.logprobs, reply.version,
                                  s.finish_reason, reply.prompt_ids, row.sample_id))
        self._made.extend(out)
        return out

    def reward(self, completion: Completion, value: float) -> None:
        self._own[completion.sample_id + "@" + completion.agent] = float(value)

    def team_reward(self, value: float) -> None:
        self._team = float(value)

    def finish(self, stats: RolloutStats) -> None:
        """Settle every turn's reward: its own, else the team's, else 0."""
        team = self._team if self._team is not None else 0.0
        stats.team_rewards.append(team)
        for c in self._made:
            value = self._own.get(c.sample_id + "@" + c.agent, team)
            stats.rewards[c.agent].append(value)
            stats.samples[c.agent] += 1
            stats.tokens[c.agent] += len(c.token_ids)
            if self.orch.agents[c.agent].spec.trainable:
                self.orch.store.set_reward(c.agent, c.sample_id, value)


class Orchestrator(Actor):
    """Rollout, training and weight sync of one team; the pipeline policy sequences them.

    An actor on the caller's event loop (local:// by default): it owns the data cursor and the
    agents' versions, answers Ping, and is where status and control requests will land.
    """

    def __init__(self, team: Team, agents: dict[str, AgentRuntime], store: ExperienceStore, *,
                 trajectories_per_task: int, max_concurrent_tasks: int,
                 max_concurrent_calls: int, micro_batch_groups: int, seed: int = 0,
                 address: str = "local://*") -> None:
        super().__init__("orchestrator", address)
        self.cursor = task_stream(list(team.tasks), seed)
        self.team = team
        self.agents = agents
        self.store = store
        self.trajectories_per_task = trajectories_per_task
        self.max_concurrent_tasks = max_concurrent_tasks
        self.max_concurrent_calls = max_concurrent_calls
        self.micro_batch_groups = micro_batch_groups

    def next_tasks(self, n: int) -> list[Any]:
        """The next `n` tasks of the data cursor."""
        return [next(self.cursor) for _ in range(n)]

    @property
    def trainable(self) -> list[str]:
        return [n for n, rt in self.agents.items() if rt.spec.trainable]

    # ------------------------------------------------------------------ rollout

    async def rollout(self, step: int, tasks: list[Any]) -> RolloutStats:
        stats = RolloutStats()
        started = time.perf_counter()
        slots = asyncio.Semaphore(self.max_concurrent_tasks)

        async def one_task(i: int, task: Any) -> None:
            async with slots:
                input_id = f"s{step}t{i}"
                calls = asyncio.Semaphore(self.max_concurrent_calls)
                contexts = [TrajectoryContext(self, task, input_id, j, calls)
                            for j in range(self.trajectories_per_task)]
                await asyncio.gather(*(self.team.workflow(ctx, task) for ctx in contexts))
                for ctx in contexts:
                    ctx.finish(stats)
                self.store.complete_input(input_id, default_reward=0.0)

        async with asyncio.TaskGroup() as tg:
            for i, task in enumerate(tasks):
                tg.create_task(one_task(i, task), name=f"task[{step}.{i}]")
        stats.seconds = time.perf_counter() - started
        return stats

    # ------------------------------------------------------------------ training

    async def drain_groups(self, agent: str) -> list[Group]:
        groups: list[Group] = []
        while batch := await self.store.take_groups(agent, 1 << 30, flush=True):
            groups.extend(batch)
        return groups

    async def train(self, agent: str, groups: list[Group]) -> TrainResult | None:
        """One optimizer step of `agent` on `groups` (the whole global batch)."""
        rt = self.agents[agent]
        assert rt.trainer is not None, f"agent {agent} is frozen"
        started = time.perf_counter()
        # Groups whose advantages are all zero carry no GRPO signal: skip their compute.
        useful = [g for g in groups if any(t.advantage for t in g.turns)]
        turns = [t for g in useful for t in g.turns]
        if not turns:
            log.info("agent %s: no group with a learning signal this step; not stepping", agent)
            return None
        tokens = sum(len(t.response_ids) for t in turns)
        await rt.trainer.request(TrainBeginBatch(tokens), timeout_s=rt.request_timeout_s)
        loss = 0.0
        pad = rt.tokenizer.pad_token_id or 0
        for i in range(0, len(useful), self.micro_batch_groups):
            chunk = [t for g in useful[i:i + self.micro_batch_groups] for t in g.turns]
            mb = micro_batch([(t.prompt_ids, t.response_ids, t.logprobs) for t in chunk],
                             [t.advantage for t in chunk], pad_id=pad)
            stats = await rt.trainer.request(mb, timeout_s=rt.request_timeout_s)
            loss += stats.loss
        done = await rt.trainer.request(TrainStep(), timeout_s=rt.request_timeout_s)
        staleness = sum(rt.version - t.policy_version for t in turns) / len(turns)
        return TrainResult(done.version, len(useful), len(turns), tokens, loss,
                           time.perf_counter() - started, staleness, done.skipped)

    async def sync(self, agent: str) -> tuple[int, float, int]:
        """Push the trainer's weights to every instance; returns (version, seconds, bytes)."""
        rt = self.agents[agent]
        assert rt.trainer is not None
        started = time.perf_counter()
        weights: WeightUpdate = await rt.trainer.request(ExportWeights(),
                                                         timeout_s=rt.request_timeout_s)
        report = await push_weights(rt.instances, weights.version, weights.tensors,
                                    timeout_s=rt.request_timeout_s)
        rt.version = weights.version
        return weights.version, time.perf_counter() - started, report.num_bytes
