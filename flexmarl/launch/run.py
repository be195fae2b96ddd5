"""`train(team, config)`: the whole system inside the caller's event loop.

    build_run (flexmarl.launch.build, the one reader of the whole Config): checks, [slots
    planned by the cluster simulator], resume point, model directories, each part's sections
    ─► start processes (rollout instances per agent, a trainer group per trainable
    agent) ─► [resume: each agent's saved state after the last recorded step into its trainer
    and its weights to its instances] ─► [eval.before, not resumed: the starting weights on
    the held-out tasks, greedy and sampled, at once in RUN_DIR/eval.json; resumed: the one
    recorded there] ─► PipelineRun (flexmarl.orchestrator.loop): tasks from the data
    cursor, rollout, training and sync of every agent, overlapped as pipeline.mode allows
    ─► per agent and step, off the critical path (after the weight push has opened its gate):
    its whole state to RUN_DIR/state (run.save_state, every run.save_every steps and the last;
    fsynced, in step order)
    ─► metrics.jsonl, one record per finished global step, written once every agent's state of
    that step is on disk (also to the live dashboard, /metrics, TensorBoard, W&B); then the
    states it supersedes are pruned ─► [the loop returns once every save is done] ─► [eval.final:
    the same held-out measurement of the final weights; RUN_DIR/eval.json] ─► final
    per-agent checkpoints ─► ordered shutdown ─► the run report ─► RunResult

The CLI (`flexmarl run`) is a thin wrapper over this function.
"""
from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Sequence

from flexmarl.config.load import Config
from flexmarl.config.pipeline import EvalConfig
from flexmarl.config.sections import GatewayConfig, ObserveConfig
from flexmarl.console import phase
from flexmarl.gateway.app import serve_gateway, unless_app_exits
from flexmarl.launch.build import RunSetup, build_run
from flexmarl.launch.checkpoint import SaveSchedule, StateCheckpoints
from flexmarl.launch.compose import Parts, compose
from flexmarl.launch.model_dirs import save_model_dir
from flexmarl.launch.workers import watch_workers
from flexmarl.observe.monitor import RunMonitor
from flexmarl.observe.rundir import EVAL_FILE, Progress, RunDir
from flexmarl.observe.server import StatusServer
from flexmarl.orchestrator.evaluate import evaluate, heldout_tasks
from flexmarl.orchestrator.heldout import changes, measure, summary_line
from flexmarl.orchestrator.loop import PipelineRun
from flexmarl.orchestrator.policy import make_pipeline
from flexmarl.team import Team

if TYPE_CHECKING:
    from flexmarl.observe.loggers import MetricLoggers

log = logging.getLogger(__name__)


@dataclass
class RunResult:
    metrics: list[dict]
    run_dir: Path | None
    versions: dict[str, int]
    checkpoints: dict[str, Path] = field(default_factory=dict)
    wall_s: float = 0.0
    report: Path | None = None
    """RUN_DIR/report/report.html (observe.report), if it was written."""
    dashboard_url: str | None = None
    first_step: int = 0
    """The step this run started at (> 0: it resumed a run directory)."""
    final_eval: dict | None = None
    """The held-out evaluation of the final weights (eval.final; RUN_DIR/eval.json): the
    greedy measurement's fields at the top (evaluate()'s; the sampled one's when eval.modes
    has no greedy), and "before", "after" (each {"greedy", "sampled" (those of eval.modes),
    "seconds"}; a resumed run keeps the "before" its eval.json recorded, else {"skipped": why}),
    "heldout", "time_to_first_step_s"."""
    heldout: dict | None = None
    """{agent: {"greedy"|"sampled": {"before", "after", "se_change", "tasks"}}}: each trainable
    agent that took turns, its mean turn reward on the held-out tasks before training
    (eval.before; a resumed run's is the one its eval.json recorded; None when there is none)
    and after it (eval.final)."""
    time_to_first_step_s: float | None = None
    """Seconds from train()'s call (model builds and conversions, worker starts and the
    eval.before measurement included) to the first step's record."""
    timeline: list[list] = field(default_factory=list)
    """The activity log's intervals [who, kind, start, end] in seconds since the loop started,
    the origin of the records' t_* fields (flexmarl.observe.timeline reads them)."""
    loop_started: float = 0.0
    """time.perf_counter() when the loop started (that origin, on this process's clock)."""
    time_shares: dict = field(default_factory=dict)
    """devices.placement time_shared: per group {agents, switches, switch_s, sleeps,
    released_bytes (each of the last sleeps' resident memory released)}; {}: none."""


async def train(team: Team, config: Config, *, run_dir: RunDir | None = None,
                progress: bool | None = None,
                on_dashboard: Callable[[str], None] | None = None,
                resume: bool = False,
                on_gateway: Callable[[str], None] | None = None) -> RunResult:
    """Train `team` for config.run.steps global steps; returns the run's metrics.

    With observe.dashboard the run serves its dashboard, /api/status and /metrics while it
    trains; `on_dashboard(url)` is called once they are up (default: a log line). With
    gateway.enabled, `on_gateway(url)` once the gateway is; its clients send gateway.token, or
    when unset the token generated for the run, in RUN_DIR/gateway_token by then. With
    `resume`, `run_dir` is a run that stopped (or was killed) part way: training goes on from
    the step after its last recorded one, from every agent's saved state, and, with fixed
    seeds, ends with the same weights as an uninterrupted run."""
    started, started_at = time.perf_counter(), time.time()
    setup = await build_run(team, config, run_dir=run_dir, resume=resume)  # config: read there
    work = tempfile.mkdtemp(prefix="flexmarl-run-")
    try:
        async with setup.sup.serving():
            parts = await compose(setup, work)
            try:
                result = await _steps(setup, parts, progress, on_dashboard, on_gateway,
                                      started_at)
            finally:
                parts.store.close()
                await parts.trainers.close()
                for conn in [*parts.pool.conns.values(), *parts.trainers.slots.values()]:
                    await conn.aclose()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if run_dir is not None and setup.observe.report and result.metrics:
        from flexmarl.observe.report import write_report
        phase("writing the run report")
        try:
            result.report = await asyncio.to_thread(write_report, run_dir.path)
        except Exception as exc:  # the run itself succeeded: say why there is no report
            log.warning("writing the run report failed: %s: %s", type(exc).__name__, exc)
    result.wall_s = time.perf_counter() - started
    return result


async def _steps(setup: RunSetup, parts: Parts, progress: bool | None,
                 on_dashboard: Callable[[str], None] | None,
                 on_gateway: Callable[[str], None] | None, started_at: float) -> RunResult:
    """The instances up, the observers and the gateway on, the held-out measurement before,
    the loop's steps, the one after; the final checkpoints. `started_at`: train()'s call
    (time.time())."""
    run_dir, saved, first_step = setup.run_dir, setup.saved, setup.first_step
    steps = setup.run.steps
    pipeline = make_pipeline(setup.pipeline.mode, max_staleness=setup.pipeline.max_staleness)
    monitor = RunMonitor(parts.orch, parts.pool, parts.trainers, parts.activity,
                         mode=pipeline.name, steps=steps,
                         run_dir=str(run_dir.path) if run_dir else "",
                         stall_after_s=setup.observe.stall_warn_s,
                         cluster={"launcher": setup.cluster.engine,
                                  "dashboard": getattr(setup.sup, "dashboard_url", "")})
    loggers = _loggers(setup.observe, run_dir, setup.config_dict)
    metrics: list[dict] = []
    schedule = SaveSchedule(setup.run.save_every, steps, first_step)
    emit = _emitter(metrics, monitor, run_dir, saved, loggers, schedule, setup.run.keep_every)
    await parts.pool.start()
    if first_step:
        await _serve_restored(parts)
        phase(f"resuming {run_dir.path} at step {first_step} of {steps}")

    async with contextlib.AsyncExitStack() as observing:
        dashboard_url, app = await _observe(observing, parts, monitor, setup.observe,
                                            setup.gateway, setup.stop_timeout_s, on_dashboard,
                                            on_gateway, run_dir)
        try:
            evaluate_at = evaluator(parts, setup.eval, setup.run.seed,
                                    setup.pipeline.max_concurrent_calls)
            measure_now = None if evaluate_at is None else functools.partial(
                measure, parts.orch.team, parts.agents, parts.pool.generate, setup.eval,
                seed=setup.run.seed, max_concurrent_calls=setup.pipeline.max_concurrent_calls)
            async with parts.orch.serving():
                monitor.state = "evaluating"  # the dashboard's state; no stall warnings
                before = await _before(
                    functools.partial(measure_now, before=True)
                    if measure_now is not None and setup.eval.before else None, first_step, parts,
                    run_dir)
                policies = {}
                if before is not None and "skipped" not in before:
                    policies["before"] = (_recorded(run_dir, "policies", "before") if first_step
                                          else await _policies(parts, "before/"))
                    if not first_step:  # kept at once: a killed run's --resume reuses them
                        _record_before(run_dir, before, policies)
                monitor.state = "starting"
                phase(f"training: steps {first_step}-{steps - 1} ({pipeline.name} pipeline)")
                with Progress(steps, enabled=progress) as bar:
                    loop = PipelineRun(parts.orch, parts.store, parts.pool, parts.trainers,
                                       parts.activity, setup.pipeline, steps,
                                       weights=parts.weights,
                                       policy=pipeline, emit=emit, progress=_Tee(bar, monitor),
                                       first_step=first_step,
                                       saves=schedule.saves if saved else None,
                                       evaluate=evaluate_at,
                                       eval_every=setup.eval.every_steps,
                                       serial=setup.serial)
                    past = getattr(parts.orch.team.analysis, "pool", None)
                    keeping = (asyncio.create_task(_keep_pool(past, parts), name="past-pool")
                               if past is not None else None)
                    try:
                        await unless_app_exits(loop.run(), app)
                    finally:
                        if keeping is not None:
                            keeping.cancel()
                            await asyncio.gather(keeping, return_exceptions=True)
                after = None
                if measure_now is not None and setup.eval.final:
                    monitor.state = "evaluating"
                    phase("evaluating the final weights on the held-out tasks "
                          f"({' and '.join(setup.eval.modes)})")
                    after = await measure_now()
                    policies["after"] = await _policies(parts, "after/")
            first_record_s = metrics[0]["time"] - started_at if metrics else None
            final_eval, heldout = _heldout_results(parts, before, after, steps, run_dir, loggers,
                                                   first_record_s, policies)
            monitor.state = "finished"
        except BaseException:
            monitor.state = "failed"
            raise
        finally:
            await parts.pool.close()
            if loggers is not None:
                loggers.close()
        checkpoints = {}
        if run_dir is not None:
            for name, rt in parts.agents.items():
                if rt.spec.trainable:
                    checkpoints[name] = await save_model_dir(
                        parts.trainers, name, rt.model_dir, run_dir.checkpoint_dir(name),
                        merged=setup.run.merge_adapters and rt.spec.lora is not None)
    t0 = loop.started
    timeline = [[who, kind, start - t0, None if end is None else end - t0]
                for who, kind, start, end in parts.activity.intervals]
    return RunResult(metrics, run_dir.path if run_dir else None,
                     {n: rt.version for n, rt in parts.agents.items()}, checkpoints,
                     dashboard_url=dashboard_url, first_step=first_step,
                     final_eval=final_eval, heldout=heldout,
                     time_to_first_step_s=first_record_s, timeline=timeline, loop_started=t0,
                     time_shares=parts.shares.status())


def evaluator(parts: Parts, settings: EvalConfig, seed: int, max_concurrent_calls: int
              ) -> Callable[[int], Awaitable[dict]] | None:
    """The loop's `evaluate(step)`: the workflow on the held-out tasks ([eval] `settings`),
    through the run's own rollout instances (flexmarl.orchestrator.evaluate)."""
    team = parts.orch.team
    if parts.gateway is not None or not team.heldout:
        return None
    tasks = heldout_tasks(team, settings)

    async def run(step: int) -> dict:
        return await evaluate(team, parts.agents, parts.pool.generate, tasks, settings,
                              seed=seed, max_concurrent_calls=max_concurrent_calls)
    return run


async def _before(measure_now: Callable[[], Awaitable[dict]] | None, first_step: int,
                  parts: Parts, run_dir: RunDir | None = None) -> dict | None:
    """eval.before (`measure_now`: None without it): the starting weights on the held-out
    tasks, before step 1's rollout (it delays that step: its duration is logged and kept in
    RUN_DIR/eval.json). A resumed run keeps the measurement its run directory's eval.json
    recorded (of the same starting weights); without one it skips it and says why."""
    if measure_now is None:
        return None
    trainable = [n for n, rt in parts.agents.items() if rt.spec.trainable]
    if first_step:
        kept = _recorded(run_dir, "before")
        if kept is not None:
            phase(f"held-out before training (the run's own, from {EVAL_FILE}): "
                  f"{summary_line(kept, trainable)}")
            return kept
        why = (f"skipped: the run resumed at step {first_step}, its starting weights are no "
               f"longer the initial ones, and its {EVAL_FILE} records no measurement of them")
        log.warning("held-out measurement before training %s", why)
        return {"skipped": why}
    phase("evaluating the starting weights on the held-out tasks")
    result = await measure_now()
    phase(f"held-out before training: {summary_line(result, trainable)}")
    return result


def _recorded(run_dir: RunDir | None, *keys: str) -> dict | None:
    """RUN_DIR/eval.json's value at `keys` ("before"; "policies", "before") where it is a
    measurement (not a skip), else None."""
    import orjson
    if run_dir is None:
        return None
    try:
        value = orjson.loads((run_dir.path / EVAL_FILE).read_bytes())
        for key in keys:
            value = value.get(key)
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, dict) and "skipped" not in value else None


def _record_before(run_dir: RunDir | None, before: dict, policies: dict) -> None:
    """The measurement before training in RUN_DIR/eval.json as soon as it is made (the run's
    end rewrites the file whole, "after" added)."""
    import orjson
    if run_dir is None:
        return
    document = {"before": before} | ({"policies": {"before": policies["before"]}}
                                     if policies.get("before") is not None else {})
    (run_dir.path / EVAL_FILE).write_bytes(orjson.dumps(document, option=orjson.OPT_INDENT_2))


POOL_POLL_S = 1.0
"""How often the past-opponent pool looks at the agents' served versions (PastPool)."""


async def _keep_pool(pool: Any, parts: Parts) -> None:
    """Fill a game team's pool of past versions (Team.analysis.pool: openspiel_team's
    train_opponents "past") while the run trains: a snapshot of each learner's policy table
    every pool.every versions. A failed snapshot is logged and tried again: the games meet
    the newest versions the pool has (the learner itself while it has none)."""
    while True:
        try:
            for agent, version in await pool.refresh(parts.agents, parts.pool.generate):
                log.info("past-opponent pool: %s version %d added", agent, version)
        except Exception as exc:  # noqa: BLE001 - a snapshot is not worth the run
            log.warning("past-opponent pool: a snapshot failed (%s: %s); trying again",
                        type(exc).__name__, exc)
        await asyncio.sleep(POOL_POLL_S)


async def _policies(parts: Parts, tag: str) -> dict | None:
    """The team's exact policy measures (Team.analysis: an OpenSpiel team's tables and
    NashConv) of the weights the instances serve now; None for a team without them."""
    analysis = parts.orch.team.analysis
    if analysis is None:
        return None
    phase(f"measuring the policies exactly ({tag.rstrip('/')} training)")
    result = await analysis.measure(parts.agents, parts.pool.generate, tag)
    phase("policies " + tag.rstrip("/") + " training: NashConv " + ", ".join(
        f"{n} {v['nash_conv']:.3f}" for n, v in result["agents"].items())
        + f" (uniform random {result['uniform_nash_conv']:.3f}, Nash 0)")
    return result


def _heldout_results(parts: Parts, before: dict | None, after: dict | None, steps: int,
                     run_dir: RunDir | None, loggers: "MetricLoggers | None",
                     first_record_s: float | None, policies: dict | None = None
                     ) -> tuple[dict | None, dict | None]:
    """(RunResult.final_eval, RunResult.heldout) from the measurements before and after
    training; both, the measurements and the time to the first step go to RUN_DIR/eval.json.
    The final one's greedy fields sit at the file's top, as `flexmarl eval` writes its own.
    `policies`: the team's exact policy measures before and after (Team.analysis), if any."""
    trainable = [n for n, rt in parts.agents.items() if rt.spec.trainable]
    heldout = changes(None if before is None or "skipped" in before else before, after,
                      trainable)
    final = None
    if after is not None:
        first = "greedy" if "greedy" in after else "sampled"  # eval.modes: one may be left out
        final = after[first] | {
            "after_step": steps - 1, "final": True,
            "versions_final": {n: rt.version for n, rt in parts.agents.items()}}
        if loggers is not None:  # at step `steps`: after the last step's record
            loggers.log({"step": steps, "eval": final})
        log.info("held-out after training: %s", summary_line(after, trainable))
    document = (final or {}) | {"before": before, "after": after, "heldout": heldout,
                                "time_to_first_step_s": first_record_s}
    policies = {k: v for k, v in (policies or {}).items() if v is not None}
    if policies:
        document["policies"] = policies
        if final is not None:
            final["policies"] = policies
    if run_dir is not None and (before is not None or after is not None):
        import orjson
        (run_dir.path / EVAL_FILE).write_bytes(orjson.dumps(document,
                                                            option=orjson.OPT_INDENT_2))
    return (document if final is not None else None), heldout


async def _serve_restored(parts: Parts) -> None:
    """A resumed run: every instance serves what its agent's restored trainer holds."""
    for name in parts.trainers.agents:
        rt = parts.agents[name]
        weights = await parts.trainers.export(name)
        rt.restored(weights.version)
        if weights.version > 0:  # version 0 never stepped: the instances start with it already
            await parts.weights.sync(name, weights.version, weights)
        rt.synced(weights.version)


async def _observe(stack: contextlib.AsyncExitStack, parts: Parts, monitor: RunMonitor,
                   observe: ObserveConfig, gateway: GatewayConfig, stop_timeout_s: float,
                   on_dashboard: Callable[[str], None] | None,
                   on_gateway: Callable[[str], None] | None, run_dir: RunDir | None
                   ) -> tuple[str | None, "asyncio.subprocess.Process | None"]:
    """Until `stack` closes: the dashboard (observe.dashboard), the monitor's sampling, the
    watch on worker deaths, and the gateway with its app (given `stop_timeout_s` to stop; its
    token in RUN_DIR/gateway_token); (dashboard url, the app process)."""
    url = None
    if observe.dashboard:
        server = await stack.enter_async_context(StatusServer(
            monitor.status, monitor.metrics, host=observe.host,
            port=observe.port, token=observe.token))
        url = server.url
        (on_dashboard or (lambda u: log.warning("dashboard at %s", u)))(server.url)
    for coro, name in ((monitor.sample_loop(), "monitor.sample"),
                       (watch_workers(parts.sup, parts.pool, parts.trainers), "run.watch_workers")):
        task = asyncio.create_task(coro, name=name)
        stack.callback(task.cancel)
    app = None
    if parts.gateway is not None:
        app = await serve_gateway(stack, parts.gateway, gateway, on_gateway,
                                  stop_timeout_s=stop_timeout_s,
                                  run_dir=run_dir.path if run_dir is not None else None)
    return url, app


def _emitter(metrics: list[dict], monitor: RunMonitor, run_dir: RunDir | None,
             saved: StateCheckpoints | None, loggers: "MetricLoggers | None",
             schedule: SaveSchedule, keep_every: int = 0) -> Callable[[dict], Awaitable[None]]:
    """Where each step record goes: the result, the monitor, metrics.jsonl, the loggers. The
    loop awaits one record's emit before the next one's. `keep_every`: run.keep_every."""
    def write(record: dict) -> None:  # in a thread: fsync and deletes take ms to seconds
        run_dir.metrics.write(record)
        if saved is not None:
            # The record is durable before the states it replaces go: a kill between the
            # two must leave a resume point whose states are all still on disk (with
            # run.save_every, the last saved step's, which may be before this record's).
            run_dir.metrics.sync()
            saved.prune(keep_from=max(schedule.last_saved(record["step"]), 0),
                        keep_every=keep_every)

    async def emit(record: dict) -> None:
        record["time"] = time.time()
        metrics.append(record)
        monitor.on_record(record)
        if run_dir is not None:
            await asyncio.to_thread(write, record)
        if loggers is not None:
            loggers.log(record)
    return emit


class _Tee:
    """The pipeline's progress reports to the terminal bars and to the monitor."""

    def __init__(self, bar: Progress, monitor: RunMonitor) -> None:
        self.bar, self.monitor = bar, monitor

    def start_step(self, step: int, total_samples: int) -> None:
        self.monitor.start_step(step)
        self.bar.start_step(step, total_samples)

    def add_samples(self, n: int) -> None:
        self.bar.add_samples(n)

    def end_step(self, step: int, rewards: dict[str, float], seconds: float | None = None,
                 no_signal: Sequence[str] = (), team: float | None = None) -> None:
        self.bar.end_step(step, rewards, seconds, no_signal, team=team)

    def evaluated(self, step: int, result: dict) -> None:
        self.bar.evaluated(step, result)


def _loggers(obs: ObserveConfig, run_dir: RunDir | None, config_dict: dict
             ) -> "MetricLoggers | None":
    """TensorBoard / W&B sinks of the per-step records (they need a run directory);
    `config_dict`: the run's config as plain data, recorded with the W&B run."""
    if run_dir is None or not (obs.tensorboard or obs.wandb):
        return None
    from flexmarl.observe.loggers import MetricLoggers
    return MetricLoggers(run_dir.path, tensorboard=obs.tensorboard, wandb=obs.wandb,
                         wandb_project=obs.wandb_project, wandb_mode=obs.wandb_mode,
                         run_name=run_dir.path.name, config=config_dict)


