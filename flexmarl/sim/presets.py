"""Workload presets shaped like the paper's: teams, their workflows and their deployment.

The paper does not publish its workflows, so each preset is a plausible shape with the stated
properties (model sizes, skewed call ratios), described by `Stage`s:

    one trajectory: for each stage in order: pick `pick` of the stage's agents (weighted, the
    skew), call each `calls` times in parallel, `rounds` times in a row; each prompt is the
    stage's own `prompt` tokens plus everything the trajectory generated so far (capped at
    `max_context`); the simulated policy answers with a median of `median` tokens (long-tailed)

Every draw comes from a generator seeded by (task, trajectory): the same workload for every
system and every run. Training hyper-parameters follow the paper: global batch 64 = 4 tasks x
16 parallel samples, micro-batch 16 (one group), balancing threshold 5.
"""
from __future__ import annotations

import asyncio
import dataclasses
import random
import zlib
from dataclasses import dataclass, field
from typing import Any

from flexmarl.team import LoraSpec
from flexmarl.protocol import SamplingParams
from flexmarl.sim.costs import lora_key
from flexmarl.sim.engines import TOKEN
from flexmarl.team import AgentSpec, Team


@dataclass(frozen=True)
class Stage:
    agents: tuple[str, ...]
    median: int
    """Median response tokens of the simulated policy at this stage."""
    prompt: int = 1024
    """The stage's own prompt tokens (instructions, task, tool results)."""
    weights: tuple[float, ...] | None = None
    """Relative chance of each agent being picked (None: equal)."""
    pick: tuple[int, int] = (1, 1)
    calls: tuple[int, int] = (1, 1)
    rounds: tuple[int, int] = (1, 1)


@dataclass(frozen=True)
class Preset:
    name: str
    description: str
    models: dict[str, str]
    """agent -> model size in the cost model (14b, 32b)."""
    stages: tuple[Stage, ...]
    nodes: int = 48
    shared_slots: tuple[str, ...] | str = "auto"
    """FlexMARL's shared trainer pool: one slot per entry, sized for that model (an agent
    takes the smallest free slot that fits it), or "auto": the number of slots the planner
    (flexmarl.sim.plan) finds fastest for this workload and cluster."""
    tasks_per_step: int = 4
    trajectories_per_task: int = 16
    max_context: int = 8192
    steps: int = 6
    """Simulated steps; the first and the last are not measured (see cluster.py)."""
    tasks: int = 256
    save_every: int = 10
    """FlexMARL's durable state write every this many steps (run.save_every). Every step
    (1, the CPU default) is more than one disk can take at this scale: five 14B agents write
    5 x 237 GB per step, ~10 minutes at 2 GB/s, against ~2-minute steps."""
    train_devices: dict[str, int] | None = None
    """FlexMARL's trainer slot size per model size, in devices (the planner's choice); None:
    the cost model's train_devices. The baselines always use the cost model's."""
    instances: dict[str, int] | None = None
    """FlexMARL's rollout instances per agent (the planner's split); None: the devices the
    trainer slots leave (or a time-shared group's devices), split equally between agents. The
    baselines always split equally."""
    timeshare: tuple[tuple[str, ...], ...] = ()
    """FlexMARL's time-shared groups (the planner's): each group's devices alternate between
    its agents' engines and their trainers (flexmarl.sim.layouts); (): disaggregated."""
    timeshare_devices: tuple[int, ...] | None = None
    """Devices of each time-shared group; None: the cluster split equally between them."""
    source: Team | None = None
    """A user's team (flexmarl.sim.team_plan): its own workflow and tasks run instead of the
    stages, each agent answering with a median of `medians[agent]` tokens."""
    medians: dict[str, float] | None = None
    max_concurrent_tasks: int | None = None
    """Tasks generated at once (pipeline.max_concurrent_tasks; None: all of a step's)."""
    micro_batch_groups: int = 1
    """GRPO groups per trainer micro-batch (pipeline.micro_batch_groups)."""
    lora: dict[str, LoraSpec] = field(default_factory=dict)
    """LoRA agents (AgentSpec.lora): agent -> its adapter on its `models` size, the base. The
    LoRA agents on one base form a rollout unit (`units`): one set of instances serves all
    their adapters, as flexmarl.placement.lora_units groups them in the product."""
    kl_coef: float = 0.0
    """trainer.kl_coef, one setting for every system compared: > 0, every trainer runs its
    reference model's forward (FlexMARL's in its training step, MARTI's in its experience
    pass); 0 (the product's default), none does."""
    direct_sync: bool = True
    """A disaggregated full agent's versions reach its instances by the trainer's broadcast
    (flexmarl.weights.direct: vLLM on GPU, the presets' cluster); False: through the file its
    trainer publishes (flexmarl.weights.published: the CPU default, the torch engine)."""
    demand: dict[str, float] | None = None
    """Each agent's demand measured on the planner's seeds (parameters x tokens;
    flexmarl.sim.plan.demand): marti-lean splits its devices by it. None: no plan was made
    (it splits by parameters)."""

    @property
    def sizes(self) -> dict[str, str]:
        """agent -> its model key in the cost model (Costs.model): its size, or for a LoRA
        agent its base and adapter ("14b+lora16")."""
        return {a: lora_key(m, self.lora[a].rank, self.lora[a].target_modules)
                if a in self.lora else m for a, m in self.models.items()}

    @property
    def units(self) -> dict[str, list[str]]:
        """Rollout units -> their agents, in team order: a LoRA unit per base ("a+b", its
        agents joined by "+", as the product names it), every other agent its own."""
        by_base: dict[str, list[str]] = {}
        for a in self.models:
            if a in self.lora:  # a user's team: by its base model, as the product groups
                base = self.source.agent(a).model if self.source is not None else self.models[a]
                by_base.setdefault(base, []).append(a)
        lora_units = {"+".join(ms): ms for ms in by_base.values()}
        out: dict[str, list[str]] = {}
        for a in self.models:
            if a not in self.lora:
                out[a] = [a]
            else:
                unit = next(u for u, ms in lora_units.items() if a in ms)
                out.setdefault(unit, lora_units[unit])
        return out

    def unit_of(self, agent: str) -> str:
        return next(u for u, ms in self.units.items() if agent in ms)

    def adapters(self) -> dict[str, tuple[str, dict]]:
        """agent -> (its unit, its LoraSpec.as_dict()): InstancePool's `adapters`."""
        return {a: (self.unit_of(a), spec.as_dict()) for a, spec in self.lora.items()}

    @property
    def trainable(self) -> list[str]:
        if self.source is None:
            return list(self.models)
        return [a.name for a in self.source.agents if a.trainable]

    def team(self) -> Team:
        if self.source is not None:  # the agents' models are sizes of the cost model here
            return Team(name=self.source.name, agents=[
                dataclasses.replace(a, model=self.models[a.name]) for a in self.source.agents],
                workflow=self.source.workflow, tasks=list(self.source.tasks))
        return Team(name=self.name, agents=[
            AgentSpec(name=a, model=size, sampling=SamplingParams(max_tokens=8192, n=1),
                      lora=self.lora.get(a))
            for a, size in self.models.items()], workflow=_workflow(self), tasks=[
            SimTask(f"{self.name}-{i}") for i in range(self.tasks)])


@dataclass(frozen=True)
class SimTask:
    task_id: str


def _workflow(preset: Preset) -> Any:
    async def workflow(ctx: Any, task: SimTask) -> None:
        rng = random.Random(zlib.crc32(f"{task.task_id}/{ctx.trajectory}".encode()))
        context = 0
        for stage in preset.stages:
            agents = _pick(rng, stage)
            for _ in range(rng.randint(*stage.rounds)):
                calls = [(agent, rng.randint(*stage.calls)) for agent in agents]
                prompt_len = stage.prompt + min(context, preset.max_context)
                # Token 0 tells the simulated policy the median length it answers with.
                prompt = [stage.median] + [TOKEN] * (prompt_len - 1)
                outs = await asyncio.gather(*(ctx.generate(agent, prompt)
                                              for agent, k in calls for _ in range(k)))
                context += sum(len(c.token_ids) for out in outs for c in out)
        ctx.team_reward(rng.random())  # a learning signal in every group (the value is moot)

    return workflow


def _pick(rng: random.Random, stage: Stage) -> list[str]:
    k = min(rng.randint(*stage.pick), len(stage.agents))
    pool = list(stage.agents)
    weights = list(stage.weights or [1.0] * len(pool))
    chosen = []
    for _ in range(k):
        i = rng.choices(range(len(pool)), weights=weights)[0]
        chosen.append(pool.pop(i))
        weights.pop(i)
    return chosen


def _chain(*stages: Stage) -> tuple[Stage, ...]:
    return tuple(stages)


PRESETS: dict[str, Preset] = {}


def _add(p: Preset) -> None:
    PRESETS[p.name] = p


_add(Preset(
    "merchant", "Merchant-Assistant-shaped: 5 agents, all 14B; the tool caller gets ~5x the "
    "calls of the others (skewed call ratios)",
    {"intent": "14b", "planner": "14b", "tool_caller": "14b", "analyst": "14b",
     "responder": "14b"},
    _chain(Stage(("intent",), median=32),
           Stage(("planner",), median=128, prompt=1536),
           Stage(("tool_caller",), median=64, calls=(2, 8)),
           Stage(("analyst",), median=192, rounds=(1, 2)),
           Stage(("responder",), median=256))))

_add(Preset(
    "category", "Category-Assistant-shaped: 5 agents, 3 x 14B and 2 x 32B; the retriever is "
    "called 3-6 times per trajectory",
    {"router": "14b", "retriever": "14b", "reasoner": "32b", "critic": "14b", "writer": "32b"},
    _chain(Stage(("router",), median=32),
           Stage(("retriever",), median=48, calls=(3, 6)),
           Stage(("reasoner",), median=384, prompt=2048),
           Stage(("critic",), median=96),
           Stage(("writer",), median=256)),))

_add(Preset(
    "5x32b", "scalability: 5 x 32B agents; a planner, 3 specialists (1-2 picked per "
    "trajectory, skewed 4:2:1), a writer",
    {"planner": "32b", "spec_a": "32b", "spec_b": "32b", "spec_c": "32b", "writer": "32b"},
    _chain(Stage(("planner",), median=96),
           Stage(("spec_a", "spec_b", "spec_c"), median=192, weights=(4, 2, 1), pick=(1, 2),
                 calls=(1, 3)),
           Stage(("writer",), median=256)),))

_14b = tuple(f"spec{i}" for i in range(7))
_add(Preset(
    "3x32b_7x14b", "scalability: 3 x 32B (planner, reviewer, writer) and 7 x 14B specialists "
    "(2-3 picked per trajectory, Zipf-skewed)",
    {"planner": "32b", **{a: "14b" for a in _14b}, "reviewer": "32b", "writer": "32b"},
    _chain(Stage(("planner",), median=96),
           Stage(_14b, median=128, weights=tuple(1 / (i + 1) for i in range(7)), pick=(2, 3),
                 calls=(1, 4)),
           Stage(("reviewer",), median=96),
           Stage(("writer",), median=256)),))

_15 = tuple(f"spec{i}" for i in range(12))
_add(Preset(
    "15x14b", "scalability: 15 x 14B; a planner, 12 specialists (3 picked per trajectory, "
    "Zipf-skewed), an aggregator and a writer",
    {"planner": "14b", **{a: "14b" for a in _15}, "aggregator": "14b", "writer": "14b"},
    _chain(Stage(("planner",), median=96),
           Stage(_15, median=128, weights=tuple(1 / (i + 1) for i in range(12)), pick=(3, 3),
                 calls=(1, 4)),
           Stage(("aggregator",), median=128),
           Stage(("writer",), median=256)),))

_add(Preset(
    "small", "a small test deployment: 3 x 14B agents on 4 nodes, 4 steps of 2 tasks x 4 "
    "samples (seconds to simulate)",
    {"planner": "14b", "worker": "14b", "writer": "14b"},
    _chain(Stage(("planner",), median=128),
           Stage(("worker",), median=256, calls=(1, 4)),
           Stage(("writer",), median=256)),
    nodes=4, shared_slots=("14b",), tasks_per_step=2, trajectories_per_task=4, steps=4,
    tasks=16))


_lora = tuple(f"role{i}" for i in range(6))
_LORA_STAGES = _chain(Stage(("role0",), median=96),
                      Stage(_lora[1:5], median=160, weights=(4, 3, 2, 1), pick=(2, 3),
                            calls=(1, 3)),
                      Stage(("role5",), median=256))
_add(Preset(
    "lora6", "LoRA: 6 agents as rank-16 adapters (q/k/v/o) on one 14B base: one rollout unit "
    "serves every adapter, adapter-only syncs and swaps; a planner, 4 specialists (2-3 picked, "
    "skewed 4:3:2:1), a writer, on 4 nodes (lora6_full: the same team as full copies)",
    {a: "14b" for a in _lora}, _LORA_STAGES, nodes=4, shared_slots="auto", tasks_per_step=2,
    trajectories_per_task=8, steps=5, tasks=32, lora={a: LoraSpec(rank=16) for a in _lora}))

_add(dataclasses.replace(
    PRESETS["lora6"], name="lora6_full", description="lora6's team and workload as 6 full "
    "14B copies (each agent its own weights, rollout instances and full training state)",
    lora={}))


def get_preset(name: str) -> Preset:
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; presets: {', '.join(PRESETS)}")
    return PRESETS[name]


__all__ = ["PRESETS", "Preset", "SimTask", "Stage", "get_preset"]
