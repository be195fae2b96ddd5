"""The orchestrator: runs the team's workflow on many tasks at once, turn by turn into the store.

    tasks ──► rollout(step): ≤ max_concurrent_tasks tasks at once, each as trajectories_per_task
              trajectories ──► workflow(ctx, task) ──ctx.generate──► gate[agent] (may this step
              generate yet?) ──► InstancePool.generate: an instance of the agent chosen by the
              hierarchical balancer (flexmarl.rollout.pool, flexmarl.rollout.balancer)
                                        │ every turn of a trainable agent ──► ExperienceStore
              all trajectories of a task done ──► store.complete_input (groups + advantages)

What happens to the groups next (training, weight sync) and when each agent's gate opens is the
loop's (flexmarl.orchestrator.loop). Every request carries a seed derived from the run seed and
its request id, so the same weights give the same samples whatever the scheduling (the torch
backend exactly).
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import random
import zlib
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from flexmarl.clock import now
from flexmarl.activity import ActivityLog
from flexmarl.config.pipeline import PipelineConfig
from flexmarl.orchestrator.agents import AgentRuntime
from flexmarl.protocol import Generate, GenerateReply
from flexmarl.orchestrator.store import ExperienceStore, Group, StoreClosed, Turn
from flexmarl.team import Completion, Team
from flexmarl.rollout.pool import InstancePool
from runtime.actor import Actor
from runtime.errors import PeerDied, TransportClosed

log = logging.getLogger(__name__)


def task_stream(tasks: list[Any], seed: int) -> Iterator[Any]:
    """The data cursor: every task once per epoch, in a fresh seeded order each epoch."""
    rng = random.Random(seed)
    while True:
        order = list(range(len(tasks)))
        rng.shuffle(order)
        yield from (tasks[i] for i in order)


def request_seed(run_seed: int, request_id: str) -> int:
    """Sampling seed of one request: stable across runs, modes and schedules."""
    return zlib.crc32(f"{run_seed}/{request_id}".encode()) & 0x7FFFFFFF


MAX_FAILED_FRACTION = 0.5
"""A step in which more than this fraction of the trajectories failed (their workflow raised),
or every one did, raises WorkflowError after its rollout: that is a broken workflow, not bad
luck, and training on what is left would hide it. Below it, failed trajectories are dropped
and counted (RolloutStats.failed_trajectories, the step record's `failed_trajectories`)."""
MAX_ERRORS = 5
"""Distinct error messages kept per step (RolloutStats.errors)."""
_ERROR_CHARS = 300
_RUN_ERRORS = (StoreClosed, PeerDied, TransportClosed)
"""Raised inside a workflow but not its fault: the run's machinery failed or is shutting down.
They fail the run as before instead of one trajectory."""


class WorkflowError(RuntimeError):
    """Too many trajectories of a step failed (MAX_FAILED_FRACTION); names the first error."""


@dataclass
class RolloutStats:
    seconds: float = 0.0
    started: float = 0.0
    """perf_counter() when the step's first task started."""
    team_rewards: list[float] = field(default_factory=list)
    """One per successful trajectory."""
    rewards: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    samples: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    """Samples generated, failed trajectories' included (work done)."""
    tokens: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    tasks: int = 0
    """Tasks completed (each with all its trajectories, failed ones included)."""
    failed_trajectories: int = 0
    """Trajectories whose workflow raised: dropped from training (see Orchestrator.rollout)."""
    errors: list[str] = field(default_factory=list)
    """The first MAX_ERRORS distinct errors of the step, each with where it first happened."""
    error_counts: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    """"ExcType: message" -> failed trajectories of the step with that error."""


class TaskTurns:
    """The turns one task's trajectories made and rewarded, to close each GRPO group as soon
    as its rewards are final (Store.complete_group) instead of when the task's last
    trajectory ends: in a two-turn workflow the first agent's groups then train while the
    second agent still generates (what micro_batch overlaps).

    The rule (flexmarl.team.Context.reward), the same whatever order the trajectories run in:
    a turn's own reward is final once given, and its sample trains with it whatever its
    trajectory does next. A trajectory that fails (its workflow raised) loses at once every
    sample it had not rewarded (the team reward they waited for will not come) and is settled
    for every turn: it makes no more calls. A group (agent, turn) closes once every trajectory
    of the task has either made that call and rewarded each of its samples, or failed. A turn
    left to the team reward closes with the task, as before. With credit "trajectory" no group
    closes early and a failed trajectory loses every sample (its return needs all its turns).
    """

    def __init__(self, store: ExperienceStore, input_id: str, trajectories: int) -> None:
        self.store, self.input_id, self.trajectories = store, input_id, trajectories
        self.made: dict[tuple[str, int], dict[int, list[str]]] = defaultdict(dict)
        """(agent, turn) -> trajectory -> the sample ids of its call."""
        self.stored: dict[int, list[tuple[str, str]]] = defaultdict(list)
        """trajectory -> (agent, sample_id) of every row it stored (before its call returns)."""
        self.own: set[tuple[str, str]] = set()
        """(agent, sample_id) given its reward by ctx.reward (set in the store at once)."""
        self.final: set[tuple[str, str]] = set()
        """(agent, sample_id) of the rows of groups closed early: their advantages are fixed."""
        self.closed: set[tuple[str, int]] = set()
        self.failed: set[int] = set()
        """Trajectories whose workflow raised."""

    def put(self, agent: str, trajectory: int, sample_id: str) -> None:
        """A row of `trajectory` was stored."""
        if trajectory in self.failed:  # by a call its workflow left running when it raised
            self.store.discard_samples(agent, [sample_id])
            return
        self.stored[trajectory].append((agent, sample_id))

    def call(self, agent: str, turn: int | str, trajectory: int, sample_ids: list[str]) -> None:
        """`trajectory`'s call `turn` of `agent` returned these samples to its workflow."""
        if trajectory in self.failed:
            return
        self.made[(agent, turn)][trajectory] = sample_ids
        self._try_close(agent, turn)

    def reward(self, agent: str, turn: int | str, sample_id: str, value: float,
               weight: float = 1.0) -> None:
        """A sample's own reward (ctx.reward checked it is the first): final from now on."""
        self.store.set_reward(agent, sample_id, value, weight=weight)
        self.own.add((agent, sample_id))
        self._try_close(agent, turn)

    def drop(self, trajectory: int) -> None:
        """`trajectory` failed: its rows without their own reward go now (all of them with
        credit "trajectory"), and the groups that waited only for it close. Called again, it
        does nothing."""
        if trajectory in self.failed:
            return
        self.failed.add(trajectory)
        rows = self.stored.pop(trajectory, [])
        if self.store.credit == "trajectory":
            self.store.discard_trajectory(self.input_id, str(trajectory))
            return
        unrewarded: dict[str, list[str]] = defaultdict(list)
        for agent, sample_id in rows:
            if (agent, sample_id) not in self.own:
                unrewarded[agent].append(sample_id)
        for agent, sample_ids in unrewarded.items():
            self.store.discard_samples(agent, sample_ids)
        for agent, turn in list(self.made):
            self._try_close(agent, turn)

    def _try_close(self, agent: str, turn: int | str) -> None:
        if self.store.credit == "trajectory" or (agent, turn) in self.closed:
            return  # trajectory credit: an advantage needs all its rows (closes with the task)
        calls = self.made.get((agent, turn), {})
        for trajectory in range(self.trajectories):
            if trajectory in self.failed:
                continue
            sample_ids = calls.get(trajectory)
            if sample_ids is None or not all((agent, s) in self.own for s in sample_ids):
                return
        self.closed.add((agent, turn))
        self.final.update((agent, s) for sample_ids in calls.values() for s in sample_ids
                          if (agent, s) in self.own)
        self.store.complete_group(agent, self.input_id, turn)


class TrajectoryContext:
    """The `ctx` of one workflow run (see flexmarl.team.Context)."""

    failed = False
    """Set by fail() the moment the workflow raises: from then on nothing of this trajectory is
    stored or rewarded (calls it left running return [])."""

    def __init__(self, orch: "Orchestrator", task: Any, input_id: str, trajectory: int,
                 calls: asyncio.Semaphore, step: int = 0, turns: TaskTurns | None = None
                 ) -> None:
        self.orch = orch
        self.task = task
        self.input_id = input_id
        self.trajectory = trajectory
        self.step = step
        self.episode = f"{input_id}/{trajectory}"
        """Sticky routing key: one trajectory's turns of an agent share a prompt prefix."""
        self._calls = calls
        self._turns: dict[str, int] = defaultdict(int)
        self._labels: dict[str, set[str]] = defaultdict(set)
        """agent -> the turn labels this trajectory gave (ctx.generate(turn=...))."""
        self._own: dict[str, float] = {}
        self._weight: dict[str, float] = {}
        self._made: list[Completion] = []
        self.finished = False
        """Set by finish(): later replies (calls left running by a failed workflow) are
        not stored."""
        self._team: float | None = None
        self._task_turns = turns
        """The task's turns (TaskTurns): groups close when their rewards are final."""
        self._turn_of: dict[str, int | str] = {}
        """sample_id -> its call's turn (number or label) (of stored rows)."""

    def _call(self, agents: dict[str, AgentRuntime], agent: str, prompt: Any, n: int,
              sampling: dict[str, Any], label: str | None = None
              ) -> tuple[AgentRuntime, list[int], Any, int | str]:
        """What every ctx.generate starts with (training and evaluation alike): the agent,
        the prompt's ids, the call's sampling settings (checked against the context) and its
        turn: the workflow's `label` (ctx.generate(turn=...)), else the call's number."""
        rt = agents.get(agent)
        if rt is None:
            raise ValueError(f"workflow called unknown agent {agent!r}; the team has "
                             f"{sorted(agents)}")
        if label is not None:
            if not isinstance(label, str) or not label or "/" in label or label.isdigit():
                raise ValueError(f"ctx.generate({agent!r}, turn={label!r}): a turn label is a "
                                 "str without '/', not only digits (those are unlabelled calls' "
                                 "numbers), e.g. 'move3' or 'move3.retry1'")
            if label in self._labels[agent]:
                raise ValueError(f"ctx.generate({agent!r}, turn={label!r}): this trajectory "
                                 "already called the agent with that turn label; each call's "
                                 "label names one turn (its GRPO group across the task's "
                                 "trajectories)")
        prompt_ids = rt.encode(prompt)
        params = rt.call_params(prompt, dataclasses.replace(rt.spec.sampling, n=n, **sampling))
        rt.check_room(prompt_ids, params.max_tokens)
        if label is not None:
            self._labels[agent].add(label)
            return rt, prompt_ids, params, label
        turn = self._turns[agent]
        self._turns[agent] += 1
        return rt, prompt_ids, params, turn

    async def generate(self, agent: str, prompt: str | list[dict] | list[int], *,
                       n: int = 1, turn: str | None = None, **sampling: Any) -> list[Completion]:
        rt, prompt_ids, params, turn = self._call(self.orch.agents, agent, prompt, n, sampling,
                                                  turn)
        request_id = f"{self.input_id}/{self.trajectory}/{agent}/{turn}"
        if params.seed is None:
            params = dataclasses.replace(params, seed=request_seed(self.orch.seed, request_id))
        if self.step > rt.gate.open_to:  # the pipeline policy holds this step's calls for now
            self.orch.activity.enter(agent, "gate")  # (timed: flexmarl.observe.timeline)
            try:
                await rt.gate.wait(self.step)
            finally:
                self.orch.activity.exit(agent, "gate")
        rt.first_call.setdefault(self.step, now())
        clock = rt.rollout_busy[self.step]
        # Intra-query parallelism: the n samples are independent branches; split them into
        # requests of at most samples_per_request, which the balancer spreads over instances.
        per = self.orch.samples_per_request or n
        sizes = [min(per, n - i) for i in range(0, n, per)]

        async def part(j: int, size: int) -> GenerateReply:
            rid, p = request_id, params
            if len(sizes) > 1:
                rid = f"{request_id}#{j}"
                p = dataclasses.replace(params, n=size, seed=params.seed + j * per)
            async with self._calls:
                clock.enter()
                self.orch.activity.enter(agent, "rollout")
                try:
                    return await self.orch.pool.generate(
                        agent, Generate(rid, prompt_ids=prompt_ids, params=p),
                        episode=self.episode)
                finally:
                    clock.exit()
                    self.orch.activity.exit(agent, "rollout")

        replies = await asyncio.gather(*(part(j, size) for j, size in enumerate(sizes)))
        if self.finished or self.failed:
            # A call the workflow left running when it raised (e.g. a sibling in its
            # asyncio.gather): the trajectory is settled; nothing is stored, nobody reads this.
            log.debug("trajectory %s already ended; %s's late reply is dropped", self.episode,
                      agent)
            return []
        out = []
        # What each sample's logprobs are under, so the trainer scores it the same way.
        scored = ((params.temperature, params.top_k, params.top_p) if params.temperature > 0
                  else (1.0, 0, 1.0))
        samples = [(reply, s) for reply in replies for s in reply.samples]
        self.orch.samples[agent] += len(samples)
        for k, (reply, s) in enumerate(samples):
            traj_id = str(self.trajectory) if n == 1 else f"{self.trajectory}.{k}"
            row = Turn(agent=agent, input_id=self.input_id, turn=turn, traj_id=traj_id,
                       policy_version=reply.version, prompt_ids=reply.prompt_ids,
                       response_ids=s.token_ids, logprobs=s.logprobs, sampling=scored)
            if rt.spec.trainable:
                stored = await self.orch.store.put(
                    row, urgent=lambda a=agent: self.orch.awaited(a, self.step))
                if stored and self._task_turns is not None:
                    self._task_turns.put(agent, self.trajectory, row.sample_id)
            out.append(Completion(agent, s.text, s.token_ids, s.logprobs, reply.version,
                                  s.finish_reason, reply.prompt_ids, row.sample_id))
        if self.failed:  # it raised while this call stored its rows: they are dropped
            return []
        self._made.extend(out)
        if rt.spec.trainable and self._task_turns is not None:
            for c in out:
                self._turn_of[c.sample_id] = turn
            self._task_turns.call(agent, turn, self.trajectory, [c.sample_id for c in out])
        return out

    def reward(self, completion: Completion, value: float, *, weight: float = 1.0) -> None:
        if not isinstance(completion, Completion):
            raise TypeError(f"ctx.reward (task {self._task_id}, trajectory {self.trajectory}): "
                            "the first argument is a Completion returned by ctx.generate, got "
                            f"{type(completion).__name__}")
        where = (f"ctx.reward: agent {completion.agent!r}, sample {completion.sample_id} "
                 f"(task {self._task_id}, trajectory {self.trajectory})")
        value = self._finite(value, where)
        weight = self._finite(weight, where.replace("ctx.reward", "ctx.reward's weight", 1))
        if weight < 0:
            raise ValueError(f"{where}: the weight must be >= 0, got {weight}")
        key = completion.sample_id + "@" + completion.agent
        if key in self._own and self._task_turns is not None:  # training: evaluation stores none
            raise ValueError(f"{where}: this turn's reward was already given and is final "
                             f"(it was {self._own[key]:g}: its sample trains with it, its GRPO "
                             "group may be training already); give each turn's reward once")
        turn = self._turn_of.get(completion.sample_id)
        if turn is not None and not self.finished and not self.failed:
            self._task_turns.reward(completion.agent, turn, completion.sample_id, value, weight)
        self._own[key] = value
        self._weight[key] = weight

    def fail(self) -> None:
        """The workflow raised, now: nothing more of this trajectory is stored or rewarded,
        its rows without their own reward are dropped and the groups that waited only for it
        close (TaskTurns.drop). finish() counts the failure once every trajectory has ended."""
        self.failed = True
        if self._task_turns is not None:
            self._task_turns.drop(self.trajectory)

    def score(self, agent: str, name: str, value: float) -> None:
        """An evaluation score (flexmarl.team.Context.score): training ignores it."""

    def team_reward(self, value: float) -> None:
        where = (f"ctx.team_reward: task {self._task_id}, trajectory {self.trajectory} "
                 f"({self.episode})")
        self._team = self._finite(value, where)

    @property
    def _task_id(self) -> str:
        return str(getattr(self.task, "task_id", "?"))

    @staticmethod
    def _finite(value: Any, where: str) -> float:
        """`value` as a float, or ValueError naming `where` (a reward must be a finite number:
        NaN or inf would poison every advantage of its group)."""
        number = None
        if not isinstance(value, (str, bytes)):
            try:
                number = float(value)
            except (TypeError, ValueError):
                pass
        if number is None or not math.isfinite(number):
            raise ValueError(f"{where}: a reward must be a finite number, got {value!r:.80}"
                             + ("" if number is None else f" ({number})"))
        return number

    def finish(self, stats: RolloutStats, error: Exception | None = None) -> None:
        """Settle every turn's reward: its own, else the team's, else 0. With `error` (the
        workflow raised it) the trajectory failed: its turns without their own reward were
        dropped when it raised (fail(); the team reward they waited for never came), those it
        rewarded train, and the failure is counted and logged."""
        self.finished = True
        for agent in self._turns:
            self.orch.pool.balancer.end_episode(agent, self.episode)
        for c in self._made:  # work done, whether or not the trajectory succeeded
            stats.samples[c.agent] += 1
            stats.tokens[c.agent] += len(c.token_ids)
        if error is not None:
            self._fail(stats, error)
            return
        team = self._team if self._team is not None else 0.0
        stats.team_rewards.append(team)
        for c in self._made:
            key = c.sample_id + "@" + c.agent
            value = self._own.get(key, team)
            stats.rewards[c.agent].append(value)
            final = (self._task_turns is not None
                     and (c.agent, c.sample_id) in self._task_turns.final)
            if self.orch.agents[c.agent].spec.trainable and not final:
                self.orch.store.set_reward(c.agent, c.sample_id, value,
                                           weight=self._weight.get(key, 1.0))

    def _fail(self, stats: RolloutStats, error: Exception) -> None:
        # Its rows without their own reward were dropped when it raised (fail(): also those
        # put but not yet handed to the workflow), the rewarded ones stay: the input's GRPO
        # groups are formed from those and the trajectories that finished.
        if self._task_turns is not None:
            self._task_turns.drop(self.trajectory)
        else:
            self.orch.store.discard_trajectory(self.input_id, str(self.trajectory))
        stats.failed_trajectories += 1
        message = f"{type(error).__name__}: {error}"
        if len(message) > _ERROR_CHARS:
            message = message[:_ERROR_CHARS - 3] + "..."
        stats.error_counts[message] += 1
        first = stats.error_counts[message] == 1
        if first and len(stats.errors) < MAX_ERRORS:
            stats.errors.append(f"{message} (task {self._task_id}, trajectory {self.trajectory})")
        if first:  # once per distinct message and step; the traceback at DEBUG
            log.warning("workflow of team %s failed on task %s, trajectory %d (%s): %s; the "
                        "trajectory is dropped from training, the run goes on (repeats of "
                        "this error in step %d are counted, not logged; "
                        "--set run.log_level=DEBUG shows the traceback)", self.orch.team.name,
                        self._task_id, self.trajectory, self.episode, message, self.step)
        log.debug("workflow failure on task %s, trajectory %d", self._task_id, self.trajectory,
                  exc_info=error)


class Orchestrator(Actor):
    """The team's rollouts: workflows on the step's tasks, their turns into the store.

    An actor on the caller's event loop (local:// by default): it owns the data cursor and the
    agents' runtimes (their versions change only through AgentRuntime's transitions), answers
    Ping, and is where status and control requests will land.
    """

    def __init__(self, team: Team, agents: dict[str, AgentRuntime], store: ExperienceStore,
                 pool: InstancePool | None, config: PipelineConfig, *, seed: int = 0,
                 activity: ActivityLog | None = None, address: str = "local://*",
                 on_rollout_end: Callable[[RolloutStats], None] | None = None) -> None:
        """`config` (section `pipeline`): trajectories per task and the parallelism of tasks,
        calls and samples; `activity` records the agents' rollout intervals (shared with the
        pool and the loop, read by the monitor); `on_rollout_end(stats)` is called as each
        step's rollout returns (the simulator takes its device accounting there)."""
        super().__init__("orchestrator", address)
        self.cursor = task_stream(list(team.tasks), seed)
        self.seed = seed
        self.team = team
        self.agents = agents
        self.store = store
        self.pool = pool
        self.on_rollout_end = on_rollout_end
        self.trajectories_per_task = config.trajectories_per_task
        self.max_concurrent_tasks = config.max_concurrent_tasks
        self.max_concurrent_calls = config.max_concurrent_calls
        self.samples_per_request = config.samples_per_request
        self.input_step: dict[str, int] = {}
        """input_id -> global step it was sampled for."""
        self.activity = activity if activity is not None else ActivityLog()
        """Busy intervals of agents (rollout, train, sync) and instances, for monitoring."""
        self.samples: Counter[str] = Counter()
        """Samples generated so far, per agent."""
        self.training_step: dict[str, int] = {}
        """agent -> the global step its trainer waits for now (set by the training loop): the
        rows of that step and older are stored whatever the store's capacity."""

    def awaited(self, agent: str, step: int) -> bool:
        """Does `agent`'s trainer wait for its rows of `step` now (or did it already)?"""
        return step <= self.training_step.get(agent, -1)

    def status(self) -> dict[str, Any]:
        """The team's agents now: {team, agents: name -> {trainable, version, trainer_version,
        samples}} (flexmarl.observe.monitor reads it)."""
        return {"team": self.team.name, "agents": {
            name: {"trainable": rt.spec.trainable, "version": rt.version,
                   "trainer_version": rt.trainer_version, "samples": self.samples.get(name, 0)}
            for name, rt in self.agents.items()}}

    def next_tasks(self, n: int) -> list[Any]:
        """The next `n` tasks of the data cursor."""
        return [next(self.cursor) for _ in range(n)]

    @property
    def trainable(self) -> list[str]:
        return [n for n, rt in self.agents.items() if rt.spec.trainable]

    # ------------------------------------------------------------------ rollout

    async def rollout(self, step: int, tasks: list[Any], *,
                      on_task_done: Callable[[int], None] | None = None) -> RolloutStats:
        """Run the workflow on every task of `step`; `on_task_done(samples)` after each task."""
        stats = RolloutStats(started=now())
        slots = asyncio.Semaphore(self.max_concurrent_tasks)
        if hasattr(self.pool, "step_started"):  # the rollout pool's balancer: phase of a step
            self.pool.step_started()

        async def one_task(i: int, task: Any) -> None:
            async with slots:
                input_id = f"s{step}t{i}"
                self.input_step[input_id] = step
                calls = asyncio.Semaphore(self.max_concurrent_calls)
                turns = TaskTurns(self.store, input_id, self.trajectories_per_task)
                contexts = [TrajectoryContext(self, task, input_id, j, calls, step, turns)
                            for j in range(self.trajectories_per_task)]

                async def trajectory(ctx: TrajectoryContext) -> Exception | None:
                    # A workflow that raises fails its own trajectory, not the run (its reward
                    # code included: a NaN reward raises in ctx.reward). Cancellation and
                    # KeyboardInterrupt are not Exceptions and propagate; so do _RUN_ERRORS.
                    try:
                        await self.team.workflow(ctx, task)
                    except _RUN_ERRORS:
                        raise
                    except Exception as exc:
                        ctx.fail()  # at once, whatever the other trajectories are doing
                        return exc
                    return None

                outcomes = await asyncio.gather(*(trajectory(ctx) for ctx in contexts))
                # Settled once every trajectory has ended: the successful ones' rewards (own,
                # else the team's) are set; a failed one's were settled when it raised.
                for ctx, error in zip(contexts, outcomes):
                    ctx.finish(stats, error)
                self.store.complete_input(input_id, default_reward=0.0)
                stats.tasks += 1
                if on_task_done is not None:
                    on_task_done(len(contexts))

        async with asyncio.TaskGroup() as tg:
            for i, task in enumerate(tasks):
                tg.create_task(one_task(i, task), name=f"task[{step}.{i}]")
        stats.seconds = now() - stats.started
        total = len(tasks) * self.trajectories_per_task
        failed = stats.failed_trajectories
        if failed and (failed == total or failed > MAX_FAILED_FRACTION * total):
            raise WorkflowError(
                f"team {self.team.name}: the workflow failed in {failed} of {total} trajectories "
                f"of step {step} (more than MAX_FAILED_FRACTION={MAX_FAILED_FRACTION:g}): it "
                f"is broken, not unlucky; first error: {stats.errors[0]}")
        if self.on_rollout_end is not None:
            self.on_rollout_end(stats)
        return stats

    def of_step(self, step: int) -> Callable[[Group], bool]:
        """Store selector: the groups sampled for global step `step`."""
        return lambda g: self.input_step.get(g.input_id) == step
