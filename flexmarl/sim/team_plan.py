"""A user's team and config as a cluster-simulator workload: `flexmarl plan` and
trainer_pool.slots = "auto".

    Team (its own workflow, tasks, agents) + Config ([pipeline], [run], [plan])
      ─► Preset(source=team): each agent a model size of the cost model (plan.models, or read
         from its model's name: "Qwen2.5-14B-Instruct" is 14b; a LoRA agent an adapter on
         that size, its LoraSpec's rank and targets), a median response length
         (plan.response_tokens, or a quarter of its sampling.max_tokens), the run's batch
         shape (pipeline.*), state writes every run.save_every steps, plan.nodes nodes
      ─► flexmarl.sim.plan: shared or one-per-agent trainer slots, time-shared groups,
         pipeline modes and balancing strategies, each
         simulated with the product's scheduling code (flexmarl.sim.cluster) on the run's seed
      ─► the placements tried, those this deployment runs first (`deployment`: time-shared on
         GPU only with devices.allow_unverified, never under the Ray launcher), best first;
         resolve_auto: the best one as the run's config ([devices] placement, [trainer_pool],
         [pipeline] mode, [balance]), and what it would have picked otherwise, with why not

The workflow runs for real against simulated engines: prompts count ~4 characters a token,
answers are empty texts of the simulated lengths. A workflow that branches on what its agents
say takes the branch an empty answer leads to; `flexmarl plan` says so in its output.
"""
from __future__ import annotations

import dataclasses
import logging
import re
from pathlib import Path
from typing import Any, Callable

from flexmarl.checks import ConfigError
from flexmarl.config.load import Config
from flexmarl.config.sections import pairs
from flexmarl.sim import plan
from flexmarl.sim.cluster import SYSTEMS, plan_slots
from flexmarl.sim.costs import DEFAULT_PATH, Costs, load_costs
from flexmarl.sim.presets import Preset
from flexmarl.team import Team

log = logging.getLogger(__name__)

_SIZE = re.compile(r"(?<![0-9.])(\d+(?:\.\d+)?)\s*[bB](?![a-zA-Z])")
"""A parameter count in a model's name: the 14B of Qwen2.5-14B-Instruct."""

NOTE = ("the team's workflow ran on simulated answers (empty texts of the simulated lengths): "
        "a workflow that branches on what its agents say took the branch an empty answer "
        "leads to")


def model_sizes(team: Team, costs: Costs, given: str = "") -> dict[str, str]:
    """Each agent's model size in the cost model: `given` ("a=14b,b=32b", plan.models), else
    the size its model's name states; a ConfigError naming plan.models otherwise."""
    chosen = _for_agents(team, pairs(given, "plan.models"), "plan.models")
    out = {}
    for spec in team.agents:
        size = chosen.get(spec.name)
        if size is None:
            named = [f"{m}b" for m in _SIZE.findall(Path(spec.model).name)]
            size = next((s for s in named if s in costs.models), None)
        if size is None or size not in costs.models:
            what = f"size {size!r}" if size else f"model {spec.model!r}"
            raise ConfigError(
                f"plan: agent {spec.name}'s {what} is not one of the cost model's sizes "
                f"({', '.join(costs.models)}); set plan.models, e.g. "
                f'--set plan.models="{spec.name}={next(iter(costs.models))}" (or add a '
                "[models.NAME] section to a copy of the cost model and set plan.costs)")
        out[spec.name] = size
    return out


def medians(team: Team, given: str = "") -> dict[str, float]:
    """Median response tokens per agent: one number for all, "a=256,b=64", or a quarter of
    each agent's sampling.max_tokens."""
    try:
        every = float(given)
    except ValueError:
        chosen = {a: float(v) for a, v in _for_agents(
            team, pairs(given, "plan.response_tokens"), "plan.response_tokens").items()}
        return {s.name: chosen.get(s.name, max(1.0, s.sampling.max_tokens / 4))
                for s in team.agents}
    return {s.name: every for s in team.agents}


def nodes(config: Config) -> int:
    """plan.nodes; 0: the run's nodes when it uses flexmarl-node (cluster.listen), else 1."""
    if config.plan.nodes:
        return config.plan.nodes
    c = config.cluster
    return max(1, c.rollout_nodes + c.trainer_nodes) if c.listen else 1


def preset_of(team: Team, config: Config, costs: Costs) -> Preset:
    """The team and the run's batch shape as a simulator preset."""
    p = config.pipeline
    preset = Preset(
        name=team.name, description=f"team {team.name} ({config.team.path})",
        models=model_sizes(team, costs, config.plan.models), stages=(), nodes=nodes(config),
        shared_slots="auto", tasks_per_step=p.tasks_per_step,
        trajectories_per_task=p.trajectories_per_task, steps=config.plan.steps,
        tasks=len(team.tasks),
        # No state writes at all: as if the one write came after the simulated steps.
        save_every=config.run.save_every if config.run.save_state else 1 << 30,
        source=team, medians=medians(team, config.plan.response_tokens),
        max_concurrent_tasks=p.max_concurrent_tasks, micro_batch_groups=p.micro_batch_groups,
        # LoRA agents: adapters on their size's base, one rollout unit per base
        lora={a.name: a.lora for a in team.agents if a.lora is not None},
        kl_coef=config.trainer.kl_coef,
        # Direct syncs where vLLM and the trainers are on GPU (flexmarl.placement.layout's
        # resolve_transfer), else the published files
        direct_sync=config.rollout.backend == "vllm" and config.trainer.device == "cuda"
        and config.rollout.weight_transfer != "stage")
    for agent in preset.lora:
        try:
            costs.model(preset.sizes[agent])
        except KeyError as e:
            raise ConfigError(f"plan: agent {agent}'s LoRA adapter: {e.args[0]}") from None
    return preset


def costs_of(config: Config) -> Costs:
    path = config.plan.costs or DEFAULT_PATH
    try:
        return load_costs(path)
    except FileNotFoundError:
        raise ConfigError(f"plan.costs {str(path)!r}: no such file") from None
    except ValueError as e:
        raise ConfigError(f"plan.costs {str(path)!r}: {e}") from None


def deployment(config: Config) -> plan.Deployment:
    """What the run's product runs: on GPU (trainer.device = "cuda": a time-shared agent's
    engines are then on GPU too, flexmarl.placement.layout) time-shared placements only with
    devices.allow_unverified, and never under the Ray launcher."""
    return plan.Deployment(gpu=config.trainer.device == "cuda", launcher=config.cluster.engine,
                           allow_unverified=config.devices.allow_unverified)


def plan_team(team: Team, config: Config,
              progress: Callable[[plan.Placement], Any] | None = None
              ) -> tuple[Preset, Costs, list[plan.Placement]]:
    """The placements the simulator tried for this team and config, best first."""
    if not any(a.trainable for a in team.agents):
        raise ConfigError(f"plan: team {team.name} has no trainable agent: no trainer slot "
                          "to plan")
    costs = costs_of(config)
    preset = preset_of(team, config, costs)
    system = dataclasses.replace(SYSTEMS["flexmarl"], pipeline=config.pipeline.mode)
    try:
        placements = plan_slots(preset, system, costs=costs, steps=config.plan.steps,
                                seeds=(config.run.seed,), progress=progress,
                                deployment=deployment(config))
    except ValueError as e:  # nothing fits: the message names the fix (nodes)
        raise ConfigError(f"plan: {e} (plan.nodes, or --nodes of flexmarl plan)") from None
    return preset, costs, placements


def slot_ranks(team: Team, config: Config, placement: plan.Placement) -> list[int]:
    """The run's ranks of each planned slot: as the planner sizes k slots for the k largest
    agents, the k largest of the agents' own ranks (AgentSpec.train_ranks or
    trainer_pool.ranks_per_agent)."""
    needs = sorted((s.train_ranks or config.trainer_pool.ranks_per_agent
                    for s in team.agents if s.trainable), reverse=True)
    return needs[:len(placement.slots)]


def planned_config(config: Config, team: Team, preset: Preset, costs: Costs,
                   placement: plan.Placement, *, instances: bool = False) -> Config:
    """`config` with the placement: devices.placement (time-shared groups train on their own
    devices, outside trainer_pool.slots), its shared trainer slots (as many as trainable
    agents, or time-shared: 0, one each, no pool), pipeline mode and balancing strategy; with
    `instances`, also its rollout instances per agent when every agent gets as many (else
    AgentSpec.instances, in the team file, is theirs)."""
    ranks = slot_ranks(team, config, placement)
    trainable = sum(1 for a in team.agents if a.trainable)
    pool = dataclasses.replace(config.trainer_pool, slots=0, slot_ranks="") \
        if len(ranks) == trainable or placement.timeshare else \
        dataclasses.replace(config.trainer_pool, slots=len(ranks),
                            slot_ranks=",".join(map(str, ranks)))
    out = dataclasses.replace(config, trainer_pool=pool, balance=dataclasses.replace(
        config.balance, strategy=placement.balance), pipeline=dataclasses.replace(
        config.pipeline, mode=placement.pipeline))
    out = dataclasses.replace(out, devices=dataclasses.replace(
        config.devices, placement=plan.placement_key(placement)))
    counts = set(plan.instances(preset, costs, placement).values())
    if instances and len(counts) == 1:
        out = dataclasses.replace(out, rollout=dataclasses.replace(
            config.rollout, instances_per_agent=counts.pop()))
    return out


def resolve_auto(config: Config, team: Team) -> Config:
    """`config` with trainer_pool.slots = "auto" replaced by the best planned placement's
    slots and balancing (planned_config). Other configs come back as they are."""
    if config.trainer_pool.slots != "auto":
        return config
    preset, costs, placements = plan_team(team, config)
    best = placements[0]
    log.warning("trainer_pool.slots = \"auto\": %s (placement %s), %s, balance %s "
                "(simulated step %.1f s on %d node(s); tried %s)", plan.label(costs, best),
                plan.placement_key(best), best.pipeline, best.balance, best.step_s,
                preset.nodes, ", ".join(f"{plan.label(costs, p)}/{p.pipeline}/{p.balance}: "
                                        f"{p.step_s:.1f} s" + (" (refused)" if p.refused else "")
                                        for p in placements))
    if (other := plan.would_have(placements)) is not None:
        log.warning("trainer_pool.slots = \"auto\" would have picked %s (placement %s, "
                    "simulated step %.1f s), but %s", plan.label(costs, other),
                    plan.placement_key(other), other.step_s, other.refused)
    return planned_config(config, team, preset, costs, best)


def _for_agents(team: Team, values: dict[str, str], name: str) -> dict[str, str]:
    unknown = set(values) - {a.name for a in team.agents}
    if unknown:
        raise ConfigError(f"{name} names {', '.join(sorted(unknown))}, not an agent of team "
                          f"{team.name} (agents: {', '.join(a.name for a in team.agents)})")
    return values
