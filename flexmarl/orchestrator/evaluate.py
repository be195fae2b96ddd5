"""Evaluation: the team's own workflow on held-out tasks with training off.

    held-out tasks (Team.heldout, or team.heldout of a task file) ─► evaluate(): each task once
      greedy (temperature 0), or eval.n times sampled at the agents' own settings (fixed seeds)
      ─► workflow(EvalContext, task): ctx.generate goes straight to `generate` (the run's
         rollout pool, or flexmarl eval's engines): no step gate, nothing stored, no training
      ─► ctx.reward / ctx.team_reward collected ─► per agent and team means (and best of n)

During a run (`eval.every_steps`) the rollout producer evaluates between two steps' rollouts,
so no training sample is generated meanwhile; the step's record waits for it and carries it as
`record["eval"]`. Before the first step (`eval.before`) and after the last (`eval.final`) the run
measures its starting and final weights greedy and sampled (flexmarl.orchestrator.heldout), and
`flexmarl eval RUN_DIR` evaluates saved checkpoints the same way (flexmarl.launch.evaluation).
A workflow that raises fails that trajectory (counted, not scored), as in training.
"""
from __future__ import annotations

import asyncio
import dataclasses
import math
import statistics
import time
from collections import defaultdict
from typing import Any, Awaitable, Callable

from flexmarl.config.pipeline import EvalConfig
from flexmarl.orchestrator.agents import AgentRuntime
from flexmarl.orchestrator.orchestrator import _RUN_ERRORS, TrajectoryContext, request_seed
from flexmarl.protocol import Generate, GenerateReply
from flexmarl.team import Completion, Team

Generator = Callable[[str, Generate], Awaitable[GenerateReply]]
"""(agent, request) -> reply: the rollout pool's generate, or flexmarl eval's engines'."""


def heldout_tasks(team: Team, config: EvalConfig, *, final: bool = False,
                  before: bool = False) -> list[Any]:
    """The tasks an evaluation uses: the first eval.tasks of Team.heldout, or with `final` (the
    before and final measurements) the first eval.final_tasks, and with `before` too the
    first eval.before_tasks where that is set; where the team names each task's round
    (Team.heldout_round: a game team's deal number), each count is of rounds: the tasks of
    the first `count` rounds (games per (agent, opponent) pair, however many each has)."""
    tasks = list(team.heldout)
    count = config.final_tasks if final else config.tasks
    if final and before and config.before_tasks:
        count = config.before_tasks
    if not count:
        return tasks
    if team.heldout_round is not None:
        return [t for t in tasks if team.heldout_round(t) < count]
    return tasks[:count]


class EvalContext(TrajectoryContext):
    """A workflow's `ctx` during evaluation: the same calls, straight to `generate`, nothing
    stored, greedy or seeded sampling forced."""

    def __init__(self, team: Team, agents: dict[str, AgentRuntime], generate: Generator,
                 task: Any, input_id: str, trajectory: int, config: EvalConfig,
                 calls: asyncio.Semaphore, seed: int) -> None:
        self.team, self.agents, self._generate, self.config = team, agents, generate, config
        self.task, self.input_id, self.trajectory = task, input_id, trajectory
        self.episode = f"eval/{input_id}/{trajectory}"
        self._calls, self.seed = calls, seed
        self._turns: dict[str, int] = defaultdict(int)
        self._labels: dict[str, set[str]] = defaultdict(set)
        self._own: dict[str, float] = {}
        self._weight: dict[str, float] = {}
        self._made: list[Completion] = []
        self._team: float | None = None
        self._task_turns, self._turn_of = None, {}  # nothing stored: no group to close
        self.versions: dict[str, set[int]] = defaultdict(set)
        self.scores: dict[tuple[str, str], list[float]] = defaultdict(list)
        """(agent, name) -> the values ctx.score gave this trajectory."""

    def score(self, agent: str, name: str, value: float) -> None:
        where = f"ctx.score({agent!r}, {name!r}) (task {self._task_id})"
        if not isinstance(name, str) or not name:
            raise ValueError(f"{where}: the name must be a non-empty str")
        self.scores[(agent, name)].append(self._finite(value, where))

    async def generate(self, agent: str, prompt: Any, *, n: int = 1, turn: str | None = None,
                       **sampling: Any) -> list[Completion]:
        _, prompt_ids, params, turn = self._call(self.agents, agent, prompt, n, sampling, turn)
        request_id = f"eval/{self.input_id}/{self.trajectory}/{agent}/{turn}"
        if self.config.greedy:
            params = dataclasses.replace(params, temperature=0.0, top_k=0, top_p=1.0)
        params = dataclasses.replace(params, seed=request_seed(self.seed, request_id))
        async with self._calls:
            reply = await self._generate(agent, Generate(request_id, prompt_ids=prompt_ids,
                                                         params=params))
        self.versions[agent].add(reply.version)
        out = [Completion(agent, s.text, s.token_ids, s.logprobs, reply.version,
                          s.finish_reason, reply.prompt_ids, f"{request_id}/{k}")
               for k, s in enumerate(reply.samples)]
        self._made.extend(out)
        return out

    def rewards(self) -> tuple[float, dict[str, list[float]]]:
        """The trajectory's team reward and each agent's turn rewards (own, else the team's)."""
        team = self._team if self._team is not None else 0.0
        per: dict[str, list[float]] = defaultdict(list)
        for c in self._made:
            per[c.agent].append(self._own.get(c.sample_id + "@" + c.agent, team))
        return team, per


async def evaluate(team: Team, agents: dict[str, AgentRuntime], generate: Generator,
                   tasks: list[Any], config: EvalConfig, *, seed: int = 0,
                   max_concurrent_calls: int = 64,
                   slots: asyncio.Semaphore | None = None, tag: str = "") -> dict[str, Any]:
    """Run the workflow on `tasks` with training off; the means as plain data:
    {tasks, trajectories, failed, team_reward, best_team (n > 1), agents: {name: {reward,
    var, turns, scores (if any): {score name: {mean, var, n}}}}, versions: {name: [lowest,
    highest]}, mode, seconds}; `scores`: what ctx.score gave (a game's win, its moves'
    invalid flags), agents that only have scores included. `var`: the sample
    variance of the agent's turn rewards (None under 2 turns), for the standard error of a
    change in any reward. `slots`: the tasks-at-once limit shared with evaluations running
    at the same time (default: eval.max_concurrent_tasks of this one); `tag` prefixes its
    request ids, which must differ from theirs (the seeds follow the ids)."""
    if not tasks:
        raise ValueError(f"team {team.name} has no held-out tasks to evaluate: give the team "
                         "Team.heldout, or a task file with team.heldout (config)")
    started = time.perf_counter()
    trajectories = 1 if config.greedy else config.n
    slots = slots or asyncio.Semaphore(config.max_concurrent_tasks)
    calls = asyncio.Semaphore(max_concurrent_calls)
    team_rewards: list[list[float]] = [[] for _ in tasks]
    agent_rewards: dict[str, list[float]] = defaultdict(list)
    versions: dict[str, set[int]] = defaultdict(set)
    scores: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    failed: list[str] = []

    async def one(i: int, task: Any) -> None:
        async with slots:
            for j in range(trajectories):
                ctx = EvalContext(team, agents, generate, task, f"{tag}h{i}", j, config, calls,
                                  seed)
                try:
                    await team.workflow(ctx, task)
                except _RUN_ERRORS:
                    raise
                except Exception as exc:  # the trajectory fails, the evaluation goes on
                    failed.append(f"{type(exc).__name__}: {exc}"[:300])
                    continue
                value, per = ctx.rewards()
                team_rewards[i].append(value)
                for agent, values in per.items():
                    agent_rewards[agent].extend(values)
                for agent, seen in ctx.versions.items():
                    versions[agent] |= seen
                for (agent, name), values in ctx.scores.items():
                    scores[agent][name].extend(values)

    async with asyncio.TaskGroup() as tg:
        for i, task in enumerate(tasks):
            tg.create_task(one(i, task), name=f"eval[{i}]")
    scored = [r for r in team_rewards if r]
    out: dict[str, Any] = {
        "mode": "greedy" if config.greedy else f"sampled (n={config.n})",
        "tasks": len(tasks), "trajectories": sum(map(len, team_rewards)) + len(failed),
        "failed": len(failed), "errors": sorted(set(failed))[:3],
        "team_reward": _mean([v for r in scored for v in r]),
        "agents": {a: {"reward": _mean(agent_rewards.get(a, [])),
                       "var": _var(agent_rewards.get(a, [])),
                       "turns": len(agent_rewards.get(a, []))}
                   | ({"scores": {n: {"mean": _mean(v), "var": _var(v), "n": len(v)}
                                  for n, v in sorted(scores[a].items())}} if a in scores else {})
                   for a in sorted(agent_rewards.keys() | scores.keys())},
        "versions": {a: [min(v), max(v)] for a, v in sorted(versions.items())},
        "seconds": time.perf_counter() - started}
    if trajectories > 1:
        out["best_team"] = _mean([max(r) for r in scored])
    return out


def _mean(values: list[float]) -> float | None:
    return math.fsum(values) / len(values) if values else None


def _var(values: list[float]) -> float | None:
    """The sample variance (n - 1): its mean's standard error is sqrt(var / n)."""
    return statistics.variance(values) if len(values) >= 2 else None
