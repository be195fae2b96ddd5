"""`train(team, config)`: the whole system inside the caller's event loop.

    resolve models ─► start processes (rollout instances per agent, a trainer group per trainable
    agent) ─► [resume: each agent's saved state after the last recorded step into its trainer
    and its weights to its instances] ─► PipelineRun (flexmarl.pipeline): tasks from the data
    cursor, rollout, training and sync of every agent, overlapped as pipeline.mode allows
    ─► per agent and step: its whole state to RUN_DIR/state (run.save_state)
    ─► metrics.jsonl, one record per finished global step (also to the live dashboard,
    /metrics, TensorBoard, W&B) ─► final per-agent checkpoints ─► ordered shutdown ─► the run
    report ─► RunResult

The CLI (`flexmarl run`) is a thin wrapper over this function.
"""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
import os
import shutil
import signal
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Awaitable, Callable

from flexmarl.checkpoint import STATE_DIR, StateCheckpoints, resume_point
from flexmarl.gateway import Gateway
from flexmarl.openai_api import GatewayServer
from flexmarl.config import Config, ConfigError, role_cpus
from flexmarl.models import SIZES, ensure_model, load_tokenizer
from flexmarl.monitor import RunMonitor
from flexmarl.orchestrator import AgentRuntime, Orchestrator
from flexmarl.pipeline import PipelineRun, make_pipeline
from flexmarl.protocol import TrainState
from flexmarl.rollout.pool import InstancePool
from flexmarl.trainer_pool import AgentTrainer, TrainerPool
from flexmarl.rundir import Progress, RunDir
from flexmarl.server import StatusServer
from flexmarl.store import ExperienceStore
from flexmarl.team import AgentSpec, Team
from runtime.registry import NodeInfo, NodeRegistry
from runtime.supervisor import Supervisor, WorkerSpec
from runtime.transport import Connection, connect

if TYPE_CHECKING:
    from flexmarl.loggers import MetricLoggers

log = logging.getLogger(__name__)
MODEL_SEED = 0  # built-in models are built with one seed so every run shares the cache
_MODEL_FILES = ("config.json", "generation_config.json", "tokenizer.json",
                "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")


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


def resolve_model(spec: AgentSpec) -> str:
    """The model directory of an agent: a built-in size (built and cached) or a given path."""
    if spec.model in SIZES:
        kwargs = {} if spec.warm_start_steps is None else {"warm_start_steps": spec.warm_start_steps}
        return str(ensure_model(spec.model, seed=MODEL_SEED, **kwargs))
    return check_model(spec)


def check_model(spec: AgentSpec) -> str:
    """A given model path, checked (ConfigError naming the agent); built-in sizes pass as they
    are (they are built on demand). Cheap: `flexmarl run` checks every agent before it creates
    the run directory."""
    if spec.model in SIZES:
        return spec.model
    path = Path(spec.model).expanduser()
    # A configuration problem (ConfigError, a ValueError): `flexmarl run` says it in one line.
    if not path.is_dir():
        raise ConfigError(f"agent {spec.name}: model {spec.model!r} is neither a built-in size "
                          f"({', '.join(SIZES)}) nor a model directory: {str(path.absolute())!r} "
                          "does not exist")
    if not (path / "config.json").is_file():
        raise ConfigError(f"agent {spec.name}: model directory {str(path.absolute())!r} has no "
                          f"config.json (neither a built-in size ({', '.join(SIZES)}) nor a "
                          "Hugging Face model directory)")
    return str(path)


async def train(team: Team, config: Config, *, run_dir: RunDir | None = None,
                progress: bool | None = None,
                on_dashboard: Callable[[str], None] | None = None,
                resume: bool = False,
                on_gateway: Callable[[str], None] | None = None) -> RunResult:
    """Train `team` for config.run.steps global steps; returns the run's metrics.

    With observe.dashboard the run serves its dashboard, /api/status and /metrics while it
    trains; `on_dashboard(url)` is called once they are up (default: a log line). With
    `resume`, `run_dir` is a run that stopped (or was killed) part way: training goes on from
    the step after its last recorded one, from every agent's saved state, and, with fixed
    seeds, ends with the same weights as an uninterrupted run."""
    started = time.perf_counter()
    saved, first_step = _saved_states(team, config, run_dir, resume)
    dashboard_url = None
    pipeline = make_pipeline(config.pipeline.mode, max_staleness=config.pipeline.max_staleness)
    log.info("resolving models of team %s", team.name)
    model_dirs = {}
    for spec in team.agents:  # may build and warm-start (minutes, once): off the event loop
        model_dirs[spec.name] = await asyncio.to_thread(resolve_model, spec)
    work = tempfile.mkdtemp(prefix="flexmarl-run-")
    sup = _launcher(config)
    try:
        async with sup.serving():
            if isinstance(sup, NodeRegistry):
                await sup.wait_for({"rollout": config.cluster.rollout_nodes,
                                    "trainer": config.cluster.trainer_nodes},
                                   config.cluster.join_timeout_s, report=log.warning)
            agents, pool, trainers = await _start_agents(sup, team, config, model_dirs, work,
                                                         snapshots=saved is not None)
            if isinstance(sup, NodeRegistry):  # a rollout node joining now gets instances
                sup.on_join = lambda node: _grow(pool, config, node)
                sup.started_run()
            if first_step:
                for name in trainers.agents:
                    trainers.restore(name, saved.load(name, first_step - 1))
            store = ExperienceStore([n for n, rt in agents.items() if rt.spec.trainable])
            p = config.pipeline
            gateway = None
            if config.gateway.enabled:  # the app's episodes are the tasks' trajectories
                g = config.gateway
                gateway = Gateway(agents, trajectories_per_task=p.trajectories_per_task,
                                  tasks_per_step=p.tasks_per_step,
                                  episode_timeout_s=g.episode_timeout_s,
                                  seat_timeout_s=g.seat_timeout_s)
            orch = Orchestrator(gateway.team(team) if gateway else team, agents, store, pool, trainers,
                                trajectories_per_task=p.trajectories_per_task,
                                max_concurrent_tasks=p.max_concurrent_tasks,
                                max_concurrent_calls=p.max_concurrent_calls,
                                micro_batch_groups=p.micro_batch_groups, seed=config.run.seed,
                                samples_per_request=p.samples_per_request)
            metrics: list[dict] = []
            monitor = RunMonitor(orch, mode=pipeline.name, steps=config.run.steps,
                                 run_dir=str(run_dir.path) if run_dir else "")
            loggers = _loggers(config, team, run_dir)

            def emit(record: dict) -> None:
                record["time"] = time.time()
                metrics.append(record)
                monitor.on_record(record)
                if run_dir is not None:
                    run_dir.metrics.write(record)
                if saved is not None:
                    # The record is durable before the states it replaces go: a kill between
                    # the two must leave a resume point whose states are all still on disk.
                    run_dir.metrics.sync()
                    saved.prune(keep_from=record["step"])
                if loggers is not None:
                    loggers.log(record)

            await pool.start()
            if first_step:  # instances serve what the resumed trainers hold
                for name in trainers.agents:
                    weights, _ = await orch.export(name)
                    await orch.push(name, weights)
                    agents[name].trainer_version = weights.version
                log.warning("resuming %s at step %d of %d", run_dir.path, first_step,
                            config.run.steps)

            async def save_state(agent: str, step: int) -> None:
                # Fresh (never updated): an empty state, restored as a fresh trainer.
                state = trainers.snapshots.get(agent) or TrainState(agent, 0, {}, {})
                await asyncio.to_thread(saved.save, agent, step, state)
            async with contextlib.AsyncExitStack() as observing:
                if config.observe.dashboard:
                    server = await observing.enter_async_context(StatusServer(
                        monitor.status, monitor.metrics, host=config.observe.host,
                        port=config.observe.port, token=config.observe.token))
                    dashboard_url = server.url
                    (on_dashboard or (lambda url: log.warning("dashboard at %s", url)))(server.url)
                sampler = asyncio.create_task(monitor.sample_loop(), name="monitor.sample")
                observing.callback(sampler.cancel)
                watcher = asyncio.create_task(_watch_workers(sup, pool, trainers),
                                              name="run.watch_workers")
                observing.callback(watcher.cancel)
                app = None
                if gateway is not None:
                    app = await _serve_gateway(observing, gateway, config, on_gateway)
                try:
                    async with orch.serving():
                        with Progress(config.run.steps, enabled=progress) as bar:
                            await _unless_app_exits(PipelineRun(
                                orch, pipeline, config.run.steps, p.tasks_per_step, emit=emit,
                                progress=_Tee(bar, monitor), first_step=first_step,
                                on_agent_step=save_state if saved else None).run(), app)
                    monitor.state = "finished"
                except BaseException:
                    monitor.state = "failed"
                    raise
                finally:
                    await pool.close()
                    if loggers is not None:
                        loggers.close()
                checkpoints = {}
                if run_dir is not None:
                    for name, rt in agents.items():
                        if rt.spec.trainable:
                            checkpoints[name] = await _checkpoint(orch, name,
                                                                  run_dir.checkpoint_dir(name))
            store.close()
            await trainers.close()
            for conn in [*pool.conns.values(), *trainers.slots.values()]:
                await conn.aclose()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report = None
    if run_dir is not None and config.observe.report and metrics:
        from flexmarl.report import write_report
        try:
            report = await asyncio.to_thread(write_report, run_dir.path)
        except Exception as exc:  # the run itself succeeded: say why there is no report
            log.warning("writing the run report failed: %s: %s", type(exc).__name__, exc)
    return RunResult(metrics, run_dir.path if run_dir else None,
                     {n: rt.version for n, rt in agents.items()}, checkpoints,
                     time.perf_counter() - started, report, dashboard_url, first_step)


async def _serve_gateway(stack: contextlib.AsyncExitStack, gateway: Gateway, config: Config,
                         on_gateway: Callable[[str], None] | None
                         ) -> asyncio.subprocess.Process | None:
    """Serve the OpenAI-compatible endpoints (until `stack` closes) and start gateway.app."""
    g = config.gateway
    server = await stack.enter_async_context(GatewayServer(gateway, host=g.host, port=g.port,
                                                           token=g.token))
    expiry = asyncio.create_task(gateway.expire_loop(), name="gateway.expire")
    stack.callback(expiry.cancel)
    stack.callback(gateway.close)  # before the server stops: waiting calls answered at once
    (on_gateway or (lambda url: log.warning("gateway at %sv1", url)))(server.url)
    if not g.app:
        return None
    env = {**os.environ, "OPENAI_BASE_URL": server.url + "v1",
           "OPENAI_API_KEY": g.token or "flexmarl", "FLEXMARL_GATEWAY": server.url}
    app = await asyncio.create_subprocess_shell(g.app, env=env, start_new_session=True)
    log.warning("gateway app started (pid %d): %s", app.pid, g.app)

    async def stop_app() -> None:
        if app.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(app.pid, signal.SIGTERM)
            try:
                await asyncio.wait_for(app.wait(), 10)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(app.pid, signal.SIGKILL)
                await app.wait()
    stack.push_async_callback(stop_app)
    return app


async def _unless_app_exits(run: Awaitable, app: asyncio.subprocess.Process | None) -> None:
    """Await `run`; if the gateway's app exits first, stop it and say so (its episodes were
    the run's only data)."""
    if app is None:
        await run
        return
    work = asyncio.ensure_future(run)
    ended = asyncio.ensure_future(app.wait())
    try:
        await asyncio.wait([work, ended], return_when=asyncio.FIRST_COMPLETED)
    finally:
        ended.cancel()
        if not work.done():
            work.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await work
    if not work.cancelled():
        work.result()
        return
    raise RuntimeError(f"the gateway app (gateway.app, pid {app.pid}) exited with code "
                       f"{app.returncode} before the run ended; its output is above")


def _launcher(config: Config) -> "Supervisor | NodeRegistry":
    """Where workers run: local processes (a Supervisor), or `flexmarl-node`s that join at
    cluster.listen (a NodeRegistry; see flexmarl/nodes.py)."""
    if not config.cluster.listen:
        return Supervisor(config=config.supervisor, transport=config.transport)
    return NodeRegistry(config.cluster.listen, transport=config.transport,
                        node_timeout_s=config.cluster.node_timeout_s,
                        start_timeout_s=config.rollout.ready_timeout_s)


def _grow(pool: InstancePool, config: Config, node: NodeInfo) -> None:
    """A node joined mid-run: if it hosts rollout, start instances on it (the registry places a
    new worker on the least busy node of its role: this one)."""
    if not node.serves("rollout") or "trainer" in node.hello.roles:
        return
    for _ in range(config.cluster.instances_per_node):
        agent = min(pool.versions, key=lambda a: len(pool.balancer.instances(a)))
        log.warning("node %s joined: a new rollout instance for %s", node.name, agent)
        pool.grow(agent)


def _saved_states(team: Team, config: Config, run_dir: RunDir | None, resume: bool
                  ) -> tuple[StateCheckpoints | None, int]:
    """Where each agent's state is saved per step (None: nowhere), and the step to start at."""
    if resume and (run_dir is None or not config.run.save_state):
        raise ConfigError("resuming needs the run directory and run.save_state = true (the "
                          "saved training states are what a resumed run starts from)")
    if run_dir is None or not config.run.save_state:
        return None, 0
    saved = StateCheckpoints(run_dir.path / STATE_DIR)
    if not resume:
        return saved, 0
    first_step = resume_point(run_dir.path, [a.name for a in team.agents if a.trainable])
    if first_step >= config.run.steps:
        raise ConfigError(f"run {run_dir.path} has finished all {first_step} steps of "
                          f"run.steps = {config.run.steps}; to train on, resume with "
                          f"--set run.steps=N for some N > {first_step}")
    saved.drop_after(first_step - 1)  # a killed run's later states: this run redoes them
    return saved, first_step


async def _watch_workers(sup: Supervisor, pool: InstancePool, trainers: TrainerPool) -> None:
    """Worker deaths: a rollout instance is replaced (its requests re-sent); a trainer slot's
    pending requests fail at once with PeerDied and the slot is replaced, its agent restarting
    its step from its snapshot (without snapshots the run stops with the cause)."""
    while True:
        event = await sup.events.get()
        if event.name in pool.conns:
            pool.instance_died(event.name, event.reason)
        elif not trainers.worker_died(event.name, f"{event.reason} (returncode "
                                                  f"{event.returncode})"):
            log.info("worker %s ended (%s): already replaced", event.name, event.reason)


class _Tee:
    """The pipeline's progress reports to the terminal bars and to the monitor."""

    def __init__(self, bar: Progress, monitor: RunMonitor) -> None:
        self.bar, self.monitor = bar, monitor

    def start_step(self, step: int, total_samples: int) -> None:
        self.monitor.start_step(step)
        self.bar.start_step(step, total_samples)

    def add_samples(self, n: int) -> None:
        self.bar.add_samples(n)

    def end_step(self, step: int, rewards: dict[str, float], seconds: float | None = None
                 ) -> None:
        self.bar.end_step(step, rewards, seconds)


def _loggers(config: Config, team: Team, run_dir: RunDir | None) -> "MetricLoggers | None":
    """TensorBoard / W&B sinks of the per-step records (they need a run directory)."""
    obs = config.observe
    if run_dir is None or not (obs.tensorboard or obs.wandb):
        return None
    from flexmarl.loggers import MetricLoggers
    return MetricLoggers(run_dir.path, tensorboard=obs.tensorboard, wandb=obs.wandb,
                         wandb_project=obs.wandb_project, wandb_mode=obs.wandb_mode,
                         run_name=run_dir.path.name, config=config.to_dict())


async def _start_agents(sup: "Supervisor | NodeRegistry", team: Team, config: Config, model_dirs: dict[str, str],
                        work: str, *, snapshots: bool = False
                        ) -> tuple[dict[str, AgentRuntime], InstancePool, TrainerPool]:
    """Start every rollout instance and trainer group at once (engine starts overlap).

    Instances are named rollout-K, not after an agent: the balancer may move them."""
    r = config.rollout
    transport = config.transport
    store = None
    if isinstance(sup, NodeRegistry):  # trainer ranks on several nodes meet at a TCPStore
        import torch.distributed as dist
        store = dist.TCPStore("0.0.0.0", config.cluster.store_port, is_master=True,
                              wait_for_workers=False)
        sup.store = store  # kept alive (and closed) with the registry
    # Cores of this machine: nodes pin their workers themselves (flexmarl-node --cpus).
    rollout_cpus, train_cpus = role_cpus(config) if store is None else ((), ())
    if rollout_cpus or train_cpus:
        log.info("rollout processes on cores %s, trainer processes on cores %s",
                 list(rollout_cpus) or "all", list(train_cpus) or "all")
    # vLLM binds its OpenMP threads itself ("auto" picks cores by NUMA node): name ours.
    rollout_env = ({"VLLM_CPU_OMP_THREADS_BIND": ",".join(map(str, rollout_cpus))}
                   if rollout_cpus else {})
    counter = itertools.count()

    def rollout_spec(agent: str) -> WorkerSpec:
        k = next(counter)
        return WorkerSpec(
            name=f"rollout-{k}", entry="flexmarl.rollout.worker:rollout_worker",
            args={"backend": r.backend, "model_dir": model_dirs[agent],
                  "max_model_len": r.max_model_len, "kv_cache_bytes": r.kv_cache_bytes,
                  "seed": config.run.seed + k}, ready_timeout_s=r.ready_timeout_s,
            cpus=rollout_cpus, env=rollout_env, role="rollout")

    async def respawn(dead: str, agent: str) -> tuple[str, Connection]:
        """A replacement for a dead instance: a new process (and name) with the agent's model."""
        handle = await sup.start_worker(rollout_spec(agent))
        return handle.name, connect(handle.address, transport)

    starts = []
    placement: dict[str, list[str]] = {}
    for spec in team.agents:
        placement[spec.name] = []
        for _ in range(spec.instances or r.instances_per_agent):
            worker = rollout_spec(spec.name)
            placement[spec.name].append(worker.name)
            starts.append(sup.start_worker(worker))
    trainable = [spec for spec in team.agents if spec.trainable]
    needs = {spec.name: spec.train_ranks or config.train.ranks_per_agent for spec in trainable}
    sizes = _slot_sizes(config, needs)
    generations = itertools.count(1)

    def trainer_specs(k: int, generation: int = 0) -> list[WorkerSpec]:
        """The processes of slot trainer-K; a replacement generation gets new names and a new
        rendezvous file (the old group's is spent)."""
        suffix = f"-r{generation}" if generation else ""
        # On nodes the node fills in the host it reaches the run at (runtime.node).
        init = (f"store://{{registry_host}}:{store.port}/trainer-{k}{suffix}" if store else
                f"file://{work}/trainer-{k}{suffix}.store")
        return [WorkerSpec(
            name=f"trainer-{k}-{rank}{suffix}", entry="flexmarl.trainer_worker:trainer_worker",
            args={"rank": rank, "world_size": sizes[k], "init_method": init},
            ready_timeout_s=r.ready_timeout_s, cpus=train_cpus, role="trainer")
            for rank in range(sizes[k])]

    async def respawn_slot(slot: str, old: list[str]) -> tuple[list[str], Connection]:
        """New processes for a dead slot; what is left of its old group is killed first (a
        rank whose peer died is stuck in a collective)."""
        for name in old:
            sup.kill(name, f"its trainer group {slot} lost a rank")
        started = await asyncio.gather(*(sup.start_worker(w) for w in
                                         trainer_specs(int(slot.rsplit("-", 1)[1]),
                                                       next(generations))),
                                       return_exceptions=True)
        failed = [h for h in started if isinstance(h, BaseException)]
        if failed:
            for h in started:
                if not isinstance(h, BaseException):
                    sup.kill(h.name, "another rank of its replacement group failed to start")
            raise failed[0]
        return [h.name for h in started], connect(started[0].address, transport)

    # Trainer slots start empty; an agent's trainer is built in a slot when it is bound there.
    for k in range(len(sizes)):
        starts.extend(sup.start_worker(w) for w in trainer_specs(k))
    handles = {h.name: h for h in await asyncio.gather(*starts)}
    agents = {}
    for spec in team.agents:
        agents[spec.name] = AgentRuntime(spec, model_dirs[spec.name],
                                         load_tokenizer(model_dirs[spec.name]), None)
    slots = {f"trainer-{k}": connect(handles[f"trainer-{k}-0"].address, transport)
             for k in range(len(sizes))}
    trainers = TrainerPool(slots, {f"trainer-{k}": n for k, n in enumerate(sizes)},
                           {spec.name: AgentTrainer(model_dirs[spec.name],
                                                    _trainer_config(config, spec),
                                                    needs[spec.name])
                            for spec in trainable},
                           static=not (config.train.slots or config.train.slot_ranks),
                           snapshots=snapshots or config.train.snapshots, respawn=respawn_slot,
                           workers={f"trainer-{k}-{rank}": f"trainer-{k}"
                                    for k, n in enumerate(sizes) for rank in range(n)},
                           kill=lambda name: sup.kill(name, "its trainer slot stopped answering"))
    conns = {name: connect(handles[name].address, transport) for names in placement.values()
             for name in names}
    return agents, InstancePool(conns, placement, model_dirs, config.balance, respawn=respawn,
                                kill=lambda name: sup.kill(name, "unresponsive")), trainers


def _slot_sizes(config: Config, needs: dict[str, int]) -> list[int]:
    """Ranks of each trainer slot: one per agent of its size (static), `train.slots` of
    ranks_per_agent each, or the explicit `train.slot_ranks` list (a shared pool)."""
    if not needs:
        return []
    if config.train.slot_ranks:
        return [int(x) for x in config.train.slot_ranks.split(",")]
    if config.train.slots:
        return [config.train.ranks_per_agent] * config.train.slots
    return list(needs.values())


def _trainer_config(config: Config, spec: AgentSpec) -> dict:
    """TrainerConfig fields of one agent: the `trainer` section with the agent's overrides."""
    cfg = dataclasses.asdict(config.trainer)
    cfg["seed"] = config.run.seed
    cfg["temperature"] = spec.sampling.temperature or 1.0
    if spec.lr is not None:
        cfg["lr"] = spec.lr
    if config.pipeline.mode == "bounded" and not cfg["is_cap"]:
        cfg["is_cap"] = config.pipeline.is_cap  # correct for stale samples
    return cfg


async def _checkpoint(orch: Orchestrator, agent: str, directory: Path) -> Path:
    """Save the agent's current weights as a loadable model directory."""
    from safetensors.torch import save_file

    rt = orch.agents[agent]
    weights, _ = await orch.export(agent)
    target = directory / f"version-{weights.version}"
    target.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in weights.tensors.items()},
              str(target / "model.safetensors"))
    for name in _MODEL_FILES:
        src = Path(rt.model_dir) / name
        if src.is_file():
            shutil.copy2(src, target / name)
    return target
