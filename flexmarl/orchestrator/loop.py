"""The one training loop: a rollout producer and one loop per agent, under a pipeline policy.

                         ┌──────────────────────── rollout producer ────────────────────────┐
     data cursor ──────► │ for step s: [team_barrier: wait step_done[s-1]]                  │
                         │   Orchestrator.rollout(s): every ctx.generate(A) waits gate[A]   │
                         │   ─► InstancePool ─► turns ─► ExperienceStore ─► rollout_done[s] │
                         └──────────────────────────────────────────────────────────────────┘
                                  │ complete GRPO groups of agent A, step s
                                  ▼
                         ┌──────────────────────── loop of agent A (one each) ──────────────┐
                         │ for step s: [not stream: wait rollout_done[s]]                   │
                         │   TrainSession: take groups as they complete ─► micro-batches ─► │
                         │   TrainerPool slot (bound on the first) ─► one optimizer step    │
                         │   ─► export ─┬─► sync task: weights.sync(A, version)             │
                         │              │   [defer_sync: after rollout s+1] ─► gate[A].open │
                         │              │   (s + 1 + lag) ─► A's record of step s           │
                         │              └─► save: staged (slot still bound) ─► slot released │
                         │                  ─► the ranks' write in place (the next batch    │
                         │                     waits for it)                                │
                         └──────────────────────────────────────────────────────────────────┘
                                  │ every agent's record of step s
                                  ▼
                         team record of step s (in step order) ─► step_done[s]
                         ─► emit, once every agent's state of step s is in place

    loop        consumes              produces              waits for            unblocked by
    producer    tasks (data cursor)   turns, groups in the  gate[A] per call;    A's sync of
                                      store; rollout_done   step_done[s-1]       step s-1 (opens
                                                            (team_barrier)       gate[A]); records
    agent A     A's groups of step s  A's update (version   groups in the store; a group done;
                                      +1), weights on A's   rollout_done[s];     the rollout of
                                      instances, A's record a free trainer slot; s (or s+1 for
                                      of step s             the previous sync    defer_sync); a
                                                                                 slot released
    records     every agent's record  the team record       step_done[s] in      the last agent's
                of step s                                   step order           record of s

Every mode is this loop with four knobs set differently (`PipelinePolicy`; the table of modes
is flexmarl.orchestrator.policy's). Each agent has its own loop, version and gate: A trains and
syncs as soon as its own batch is in. Zero staleness in micro_batch follows from the gate (A
generates for step s only with the weights trained on step s-1), checked per sample
(AgentRuntime.staleness, PipelinePolicy.admit); versions change only through AgentRuntime's
transitions (trained, synced, restored), all called here.

After A's optimizer step only the weight push is on the critical path: it opens A's gate, what
A's next rollout waits for. The state save runs beside it (TrainerPool.save: the ranks stage
their shards while A still holds the slot, then write them to the scratch dir, no tensor coming
here); A's next batch waits until that snapshot is in place, so a slot dying later always finds
A's last step. Durable copies (run.save_every) go on in the background; a step's record goes
out only once every agent's state of it is in place, so a record never names a step whose
states are not on disk (flexmarl.launch.checkpoint.resume_point), and the run returns only when
every save is done. A failing save fails the run. A slot that dies after the step's weights
went out but before its state was in place: the push is let finish, then the step is
re-trained from the previous snapshot on the same groups in the same micro-batches (the same
update) and saved; it is not pushed again (instances refuse a version they serve).

Handed in: the orchestrator, the store, the rollout pool, the weight sync (flexmarl.weights.sync:
"agent A at version v"), the trainer pool, the activity log and the `pipeline` section.
"""
from __future__ import annotations

import asyncio
import collections
import itertools
import logging
from typing import Any, Awaitable, Callable, Sequence

from flexmarl.activity import ActivityLog
from flexmarl.clock import now
from flexmarl.config.pipeline import PipelineConfig
from flexmarl.orchestrator.batch import TrainResult, TrainSession
from flexmarl.orchestrator.lane import TrainerLane
from flexmarl.orchestrator.orchestrator import Orchestrator, RolloutStats
from flexmarl.orchestrator.policy import PipelinePolicy, make_pipeline
from flexmarl.orchestrator.records import StepRecorder
from flexmarl.orchestrator.store import ExperienceStore, Group
from flexmarl.protocol import StateSaved, WeightUpdate
from flexmarl.rollout.pool import InstancePool
from flexmarl.training.pool import TrainerPool
from flexmarl.weights.sync import WeightSync
from runtime.errors import PeerDied

log = logging.getLogger(__name__)
MAX_TRAIN_ATTEMPTS = 4
"""Attempts of one agent's step whose trainer slot keeps dying before the run gives up."""


def _leaves(group: BaseExceptionGroup) -> list[BaseException]:
    out: list[BaseException] = []
    for exc in group.exceptions:
        out.extend(_leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc])
    return out


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


class Progress:
    """What the loop reports while it runs (flexmarl.observe.rundir.Progress fits)."""

    def start_step(self, step: int, total_samples: int) -> None: ...
    def add_samples(self, n: int) -> None: ...
    def end_step(self, step: int, rewards: dict[str, float], seconds: float | None = None,
                 no_signal: Sequence[str] = (), team: float | None = None) -> None: ...
    def evaluated(self, step: int, result: dict) -> None: ...


class PipelineRun:
    """One run of `steps` global steps under `policy`; `await run()` returns the records."""

    def __init__(self, orch: Orchestrator, store: ExperienceStore, pool: InstancePool,
                 trainers: TrainerPool, activity: ActivityLog, config: PipelineConfig,
                 steps: int, *, weights: WeightSync, policy: PipelinePolicy | None = None,
                 emit: Callable[[dict], Awaitable[None] | None] | None = None,
                 progress: Progress | None = None, first_step: int = 0,
                 saves: Callable[[int], bool] | None = None,
                 evaluate: Callable[[int], Awaitable[dict]] | None = None,
                 eval_every: int = 0, serial: bool = False) -> None:
        """`config` (section `pipeline`) gives the batch shape and, unless `policy` is given,
        the policy; `weights` (the pool's) syncs each update to the agent's instances.
        `emit(record)` gets each step's record, in step order, from one task (it may be a
        coroutine function: the next record waits for it). `first_step` > 0 resumes a run
        (steps before it are done; their tasks are skipped in the data cursor). The ranks save
        the agents' states (TrainerPool.save) every step with trainer_pool.snapshots on, else
        on `saves(step)` (run.save_every: durable ones); a record waits for its step's.
        `evaluate(step)` (flexmarl.orchestrator.evaluate) runs after every `eval_every` steps
        but the last, between two steps' rollouts; the step's record waits for it and carries
        it as "eval". `serial`: the agents' trainer slots share cores, so their requests go
        one at a time, an agent whose gate holds calls first (flexmarl.orchestrator.lane)."""
        if not 0 <= first_step <= steps:
            raise ValueError(f"first_step must be in [0, {steps}], got {first_step}")
        self.orch, self.store, self.pool, self.weights = orch, store, pool, weights
        self.trainers, self.activity = trainers, activity
        self.policy = policy or make_pipeline(config.mode, max_staleness=config.max_staleness)
        self.lane = (TrainerLane(lambda agent: orch.agents[agent].gate.waiting > 0)
                     if serial else None)
        self.tasks_per_step = config.tasks_per_step
        self.micro_batch_groups = config.micro_batch_groups
        self.steps, self.first_step = steps, first_step
        self.saves = saves
        self._pending_sync: dict[str, asyncio.Task | None] = {}
        self.trainer_restarts = 0
        """Agent steps restarted because their trainer slot died."""
        self._next_record = first_step
        self._unemitted: collections.deque[dict] = collections.deque()
        """Built records (in step order) waiting for their step's saves before `emit`."""
        self._next_emit = first_step
        self._saves_left: dict[int, set[str]] = {}  # step -> agents whose state is not in place
        self._ready: asyncio.Queue[dict] = asyncio.Queue()
        """Records whose states are saved, in step order, for `_emitter`."""
        self._tg: asyncio.TaskGroup | None = None
        self.emit = emit
        self.progress = progress or Progress()
        self.rollout_done = [asyncio.Event() for _ in range(steps)]
        self.rollouts: dict[int, RolloutStats] = {}
        self.done: list[dict[str, dict]] = [{} for _ in range(steps)]
        """Per step: agent -> its record, once the agent has finished the step."""
        self.step_done = [asyncio.Event() for _ in range(steps)]
        self.records: list[dict] = []
        self._finished_at: dict[str, float] = {}
        self._last_team_end = 0.0
        self._recorder: StepRecorder | None = None
        self.started = 0.0
        self.evaluate = evaluate
        self._eval_pending = ({s for s in range(first_step, steps - 1) if (s + 1) % eval_every == 0}
                              if evaluate is not None and eval_every else set())
        """Steps whose evaluation is due and not done: their records wait for it."""
        self.evals: dict[int, dict] = {}

    async def run(self) -> list[dict]:
        orch = self.orch
        for rt in orch.agents.values():
            rt.start(self.first_step, self.policy.lag, self.steps)
        if self.first_step:  # the data cursor where the resumed run left it
            orch.next_tasks(self.first_step * self.tasks_per_step)
        started = self.started = now()
        self._recorder = StepRecorder(self.store, self.pool, self.trainers, started)
        self._last_team_end = started
        self._finished_at = {name: started for name in orch.agents}
        saving = set(orch.trainable) if self.trainers.snapshots_on or self.saves else set()
        self._saves_left = {s: set(saving) for s in range(self.first_step, self.steps)}
        try:
            async with asyncio.TaskGroup() as tg:
                self._tg = tg  # sync tasks and writers fail the run like the loops do
                tg.create_task(self._produce(), name="pipeline.rollout")
                tg.create_task(self._emitter(), name="pipeline.emit")
                for name in orch.trainable:
                    tg.create_task(self._agent_loop(name), name=f"pipeline.{name}")
                if not orch.trainable:  # a frozen team: steps end with their rollouts
                    tg.create_task(self._frozen_steps(), name="pipeline.frozen")
        except BaseExceptionGroup as group:
            # One task failed and the others were cancelled: raise its error, not the group.
            # Tasks failing at once (two agents' saves on one full disk) raise the first; the
            # group, their cause, holds the others.
            raise _leaves(group)[0] from group
        return self.records

    # ------------------------------------------------------------------ rollout

    async def _produce(self) -> None:
        per_task = self.orch.trajectories_per_task
        for step in range(self.first_step, self.steps):
            if self.policy.team_barrier and step > self.first_step:
                await self.step_done[step - 1].wait()
            if step - 1 in self._eval_pending:
                await self._evaluate(step - 1)
            tasks = self.orch.next_tasks(self.tasks_per_step)
            self.progress.start_step(step, len(tasks) * per_task)
            self.rollouts[step] = await self.orch.rollout(step, tasks,
                                                          on_task_done=self.progress.add_samples)
            self.rollout_done[step].set()

    async def _evaluate(self, step: int) -> None:
        """The held-out evaluation after `step`, with no rollout of training samples meanwhile:
        once every agent has finished `step` (trained and synced: its instances serve the
        weights after it), except with defer_sync (one_step_off), whose sync of `step` waits
        for the next rollout: then it evaluates what the instances serve when the rollout of
        `step` has ended (the result's `versions` says which)."""
        if not self.policy.defer_sync:
            await self.step_done[step].wait()
        result = await self.evaluate(step)
        result["after_step"] = step
        self.evals[step] = result
        self._eval_pending.discard(step)
        self.progress.evaluated(step, result)
        self._flush()

    async def _frozen_steps(self) -> None:
        for step in range(self.first_step, self.steps):
            await self.rollout_done[step].wait()
            self._agents_finished(step)

    # ------------------------------------------------------------------ one agent

    async def _agent_loop(self, agent: str) -> None:
        orch = self.orch
        rt = orch.agents[agent]
        self._pending_sync[agent] = None
        for step in range(self.first_step, self.steps):
            self._awaiting(agent, step)
            taken: list[list[Group]] = []  # the step's groups, to re-feed if the slot dies
            synced: list[asyncio.Task] = []  # the step's sync task, once its weights went out
            for attempt in itertools.count():
                try:
                    result, state = await self._train_step(agent, step, taken, synced)
                    break
                except PeerDied as exc:  # the trainer slot died (rollout deaths never get here)
                    if not self.trainers.recoverable() or attempt + 1 >= MAX_TRAIN_ATTEMPTS:
                        raise
                    if synced:  # it died after the export, before the snapshot landed: the
                        await synced[0]  # push lands first (it checks the trainer's version)
                    rt.restored(self.trainers.restored_version(agent))
                    self.trainer_restarts += 1
                    log.warning("agent %s: step %d restarts from its snapshot (version %d) on a "
                                "new trainer slot, re-feeding %d taken groups: %s", agent, step,
                                rt.trainer_version, sum(map(len, taken)), exc)
            if result is None:  # no update: nothing to push; the gate opens, the record goes
                await self._sync(agent, step, None, None)
                if self._saves(step):  # its state is that of step - 1, saved as step's too
                    state = await (await self.trainers.save(
                        agent, step, durable=self._durable(step), updated=False))
            self._tg.create_task(self._saved(agent, step), name=f"pipeline.{agent}.saved")
        if (pending := self._pending_sync[agent]) is not None:
            await pending
        self._awaiting(agent, self.steps)
        rt.synced(rt.version)  # raises unless the last update reached the instances

    async def _saved(self, agent: str, step: int) -> None:
        """`agent`'s state of `step` in place, its durable copy too: the record may go out."""
        if (copy := self.trainers.saving.copies.pop((agent, step), None)) is not None:
            try:
                await copy
            except Exception:  # the steps before it are on disk: their records go out first
                while self._next_emit < step and (self._unemitted or self._ready.qsize()):
                    await asyncio.sleep(0.01)
                raise
        self._saves_left[step].discard(agent)
        self._flush()

    def _saves(self, step: int) -> bool:
        """Do the agents' ranks write their states after `step`? Always with snapshots on (the
        recovery point); else on the run's schedule (`saves`: run.save_every)."""
        return self.trainers.snapshots_on or self._durable(step)

    def _durable(self, step: int) -> bool:
        """Is `step`'s state a checkpoint (the run's state dir), not only a snapshot?"""
        return self.saves is not None and self.saves(step)

    def _awaiting(self, agent: str, step: int) -> None:
        """`agent` now trains `step`: its rows of that step must never wait for store capacity
        (in `sync` mode nothing is consumed before the whole step is stored)."""
        self.orch.training_step[agent] = step
        self.store.wake()

    async def _train_step(self, agent: str, step: int, taken: list[list[Group]],
                          synced: list[asyncio.Task]) -> tuple[TrainResult | None,
                                                               StateSaved | None]:
        """One global batch of `agent`: `taken` groups first (a restarted attempt), then the
        step's groups as they come (appended to `taken`), one optimizer step, the weights
        exported and sent out by a sync task (appended to `synced`; not again by a restarted
        attempt), and, beside that push, the state snapshot taken while the slot is still
        bound; (the result, the snapshot)."""
        orch, policy = self.orch, self.policy
        rt = orch.agents[agent]
        if not rt.spec.trainable:
            raise ValueError(f"agent {agent} is frozen (trainable=False); it has no trainer")
        select = orch.of_step(step)
        if not policy.stream:
            await self.rollout_done[step].wait()
        async with TrainSession(rt, self.trainers, self.micro_batch_groups,
                                lambda age, s=step: policy.admit(age, s), eager=policy.stream,
                                activity=self.activity, lane=self.lane) as session:
            for groups in taken:
                await session.add(groups)
            while groups := await self._next_groups(agent, select, self.rollout_done[step]):
                taken.append(groups)
                await session.add(groups)
            if (pending := self._pending_sync[agent]) is not None:
                await pending  # the last update is out before this one lands
                self._pending_sync[agent] = None
            result = await session.finish()
            if result is None:
                return None, None
            rt.trained(result.version)
            if not synced:
                # Exported while the slot is bound; pushed to the instances by the sync task
                # (later for defer_sync), which opens the gate without waiting for the snapshot.
                # A transport that does not export (direct, GPU): the trainer sends at sync time.
                weights = await session.export() if self.weights.exported(agent) else (None, 0.0)
                deferred = policy.defer_sync and step + 1 < self.steps
                task = self._tg.create_task(self._sync(agent, step, result, weights,
                                                       deferred=deferred),
                                            name=f"pipeline.{agent}.sync")
                synced.append(task)
                self._pending_sync[agent] = task
            # else: a restart after the step's weights went out: the instances serve them
            # already (a version is pushed once), and the re-trained state is the same update.
            async with session.turn():  # staged while bound; written while the slot goes on
                landing = (await self.trainers.save(agent, step, durable=self._durable(step))
                           if self._saves(step) else None)
        # Out of the session: the slot is free while the ranks write. The next batch waits for
        # the write, so a slot dying later always finds this step's state to restore.
        return result, (await landing if landing is not None else None)

    async def _next_groups(self, agent: str, select: Callable[[Group], bool],
                           rollout_done: asyncio.Event) -> list[Group]:
        """Up to a micro-batch worth of the step's groups: while the step is generating, as soon
        as one is ready (with any others ready by then); once it has ended, what is left
        ([] when all are taken). Called whenever the trainer is free."""
        store, n = self.store, self.micro_batch_groups
        while not rollout_done.is_set():
            take = asyncio.ensure_future(store.take_groups(agent, 1, select=select))
            ended = asyncio.ensure_future(rollout_done.wait())
            try:
                await asyncio.wait([take, ended], return_when=asyncio.FIRST_COMPLETED)
            except BaseException:  # the run is stopping: leave no orphan waiting on the store
                take.cancel()
                ended.cancel()
                raise
            ended.cancel()
            if not take.done():
                take.cancel()  # nothing was taken: take_groups only takes when it returns
                try:
                    await take
                except asyncio.CancelledError:
                    continue
            # Read even if the rollout ended too: taken groups must not be lost.
            first = take.result()
            more = await store.take_groups(agent, n - 1, select=select, flush=True) if n > 1 else []
            return first + more
        return await store.take_groups(agent, n, select=select, flush=True)

    async def _sync(self, agent: str, step: int, result: TrainResult | None,
                    weights: tuple[WeightUpdate | None, float] | None, *, deferred: bool = False
                    ) -> None:
        """Push the update (if any), then open the agent's gate and record its step."""
        orch = self.orch
        sync_s, sync_bytes = 0.0, 0
        if result is not None and weights is not None:
            if deferred:
                await self.rollout_done[step + 1].wait()
            update, export_s = weights
            started = now()
            self.activity.enter(agent, "sync")
            try:
                sync_bytes = (await self.weights.sync(agent, result.version, update)).num_bytes
            finally:
                self.activity.exit(agent, "sync")
            sync_s = export_s + (now() - started)
            orch.agents[agent].synced(result.version)
        rt = orch.agents[agent]
        rt.gate.open(step + 1 + self.policy.lag)
        t = now()
        period = t - self._finished_at[agent]
        self._finished_at[agent] = t
        rollout_busy = rt.rollout_busy.pop(step).seconds if step in rt.rollout_busy else 0.0
        first_call = rt.first_call.pop(step, None)
        train_busy = result.seconds if result else 0.0
        self.done[step][agent] = {
            "trained_samples": result.samples if result else 0,
            "groups": result.groups if result else 0,
            "loss": result.loss if result else None,
            "train_s": train_busy,
            "sync_s": sync_s,
            "sync_bytes": sync_bytes,
            "version": rt.version,
            "staleness": result.staleness if result else None,
            "staleness_hist": {str(k): v for k, v in result.staleness_hist.items()}
            if result else {},
            "dropped_stale": result.dropped_stale if result else 0,
            "skipped_update": bool(result and result.skipped),
            "train_metrics": result.metrics if result else {},
            "step_s": period,
            "rollout_busy_s": rollout_busy,
            "train_idle_s": max(0.0, period - train_busy - sync_s),
            "rollout_idle_s": max(0.0, period - rollout_busy),
            # Timeline, seconds since the run started: when the agent's first request of the
            # step passed its gate, and when the agent finished the step (trained and synced).
            "t_first_call": None if first_call is None else first_call - self.started,
            "t_done": t - self.started,
        }
        if all(a in self.done[step] for a in orch.trainable):
            await self.rollout_done[step].wait()
            self._agents_finished(step)

    # ------------------------------------------------------------------ records

    def _agents_finished(self, step: int) -> None:
        self.step_done[step].set()
        # Records go out in step order: agents can finish step s+1 before others finish s.
        while self._next_record < self.steps and self.step_done[self._next_record].is_set():
            self._next_record += 1
            self._record(self._next_record - 1)

    def _record(self, step: int) -> None:
        orch = self.orch
        rollout = self.rollouts.pop(step)
        t = now()
        record: dict[str, Any] = {
            "step": step, "mode": self.policy.name, "step_s": t - self._last_team_end,
            "rollout_s": rollout.seconds, "team_reward": _mean(rollout.team_rewards),
            "tasks": rollout.tasks,
            # Trajectories whose workflow raised (dropped from training) and the first few
            # distinct errors, "ExcType: message (task ID, trajectory J)".
            "failed_trajectories": rollout.failed_trajectories,
            "errors": list(rollout.errors),
            # Timeline, seconds since the run started (the agents' own are in their records).
            "t_rollout_start": rollout.started - self.started,
            "t_rollout_end": rollout.started + rollout.seconds - self.started,
            "agents": {}}
        self._last_team_end = t
        self._recorder.machinery(record, self.trainer_restarts)
        loads = self._recorder.loads(record)
        for name, rt in orch.agents.items():
            record["agents"][name] = {
                "instances": loads[name]["instances"],
                "latency": loads[name]["latency"],
                "reward": _mean(rollout.rewards.get(name, [])),
                "samples": rollout.samples.get(name, 0),
                "tokens": rollout.tokens.get(name, 0),
                "trainable": rt.spec.trainable,
                # Samples the store refused as already stored or trained (a re-sent request
                # must never be trained twice), since the run started.
                "duplicates": loads[name]["duplicates"],
                **{k: loads[name][k] for k in ("lora_group",) if k in loads[name]},
                **self.done[step].get(name, {"version": rt.version}),
            }
            if not rt.spec.trainable:
                busy = rt.rollout_busy.pop(step, None)
                record["agents"][name]["rollout_busy_s"] = busy.seconds if busy else 0.0
                rt.first_call.pop(step, None)
        self.done[step] = {}
        self.records.append(record)
        self._unemitted.append(record)
        no_signal = [n for n, a in record["agents"].items()
                     if a.get("trainable") and not a.get("trained_samples")]
        rewards = {n: a["reward"] for n, a in record["agents"].items() if a["reward"] is not None}
        self.progress.end_step(step, rewards, record["step_s"], no_signal, record["team_reward"])
        self._flush()

    def _flush(self) -> None:
        """Pass on the built records whose step's saves have all returned (and evaluation, if
        one is due), in step order: a record (the resume point) is never out before the
        states it names."""
        while self._unemitted:
            step = self._unemitted[0]["step"]
            if self._saves_left.get(step) or step in self._eval_pending:
                return  # its states are not on disk yet, or its evaluation is running
            record = self._unemitted.popleft()
            if step in self.evals:
                record["eval"] = self.evals.pop(step)
            self._ready.put_nowait(record)

    async def _emitter(self) -> None:
        """`emit` every record, one at a time: a launcher's emit writes and fsyncs it in a
        thread (flexmarl.launch.run), so the event loop never waits for the disk."""
        for _ in range(self.first_step, self.steps):
            record = await self._ready.get()
            if self.emit is not None and (pending := self.emit(record)) is not None:
                await pending
            self._next_emit = record["step"] + 1
