"""Which simulated devices do what: rollout instances per agent, trainer slots, device groups.

    colocated     (mas_rl) one group of every device: every agent's instances and one trainer
                  slot; one mode resident at a time (agents generate and train in turn)
    time-shared   a group per agent (MARTI's layout; FlexMARL's "time_shared") or per few
                  agents (FlexMARL's "a+b=time_shared"): the group's devices hold its agents'
                  engines, all awake together in mode ("rollout", group), or one agent's
                  training state in mode ("train", agent); each agent its own trainer slot on
                  the group's devices, so a group of several agents swaps states at its mode
                  changes (priced as the group's switches, not as pool swaps)
    disaggregated rollout devices apart from trainer slots: one per agent ("static") or a
                  shared pool (preset.shared_slots)

Rollout instances are per unit (flexmarl.sim.presets.Preset.units): an agent, or a LoRA unit
(the LoRA agents on one base) whose instances hold the base once and serve every member's
adapter (Costs.unit_model). LoRA agents are never time-shared: the product refuses it
(flexmarl.placement.lora_units), so those layouts raise for a preset with LoRA agents.

MARTI's row differs from FlexMARL's time-shared one in what its code does (costs.toml
[baselines]): its experience pass (ExperiencePass) before any training, its offload moving 14
of 16 bytes per parameter, and its weight broadcast one agent after another, each waking its
engines for it and putting them back to sleep (CUDA IPC after a ZeRO-3 gather).

How each engine's weights arrive (SimRolloutEngine.sync_path; Costs, pricing "new"): a
time-shared FlexMARL agent's and a LoRA agent's through the file their trainer publishes
(flexmarl.weights.published: the trainer's rank 0 on the group's first node, so the group's
instances on its other nodes, and every instance of a disaggregated LoRA unit, fetch it from
there); every other agent's by the direct broadcast (flexmarl.weights.direct), as the product
syncs disaggregated vLLM agents on GPU, or where it does not (Preset.direct_sync: the CPU
default, the torch engine) published too. Pricing "old" (before issue 54): time-shared engines
over NVLink from their trainer, every other one over its own rails.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, Callable

from flexmarl.sim.costs import Costs, Model
from flexmarl.sim.devices import DeviceGroup
from flexmarl.sim.engines import SimRolloutEngine
from flexmarl.sim.presets import Preset


@dataclass
class Layout:
    groups: list[DeviceGroup]
    """Every group of devices (utilisation is summed over them)."""
    instances: dict[str, list[tuple[str, SimRolloutEngine]]]
    """Unit (an agent, or a LoRA unit "a+b") -> its instances (the pool's placement)."""
    slots: dict[str, tuple[int, DeviceGroup]]
    """Trainer slot name -> (devices, group); with `static`, in the trainable agents' order."""
    static: bool
    """One slot per trainable agent (the pool's static reservation: no pool swaps)."""
    ranks: dict[str, int] = field(default_factory=dict)
    """Agent -> its trainer's ranks where they are not its model's train_devices."""
    experience: "ExperiencePass | None" = None
    sync: dict[str, str] = field(default_factory=dict)
    """Agent -> how its trainer sends a version: "published" (flexmarl.weights.published),
    "marti" (MARTI's broadcast, priced by its engines), else "direct"
    (flexmarl.weights.direct)."""


class ExperiencePass:
    """MARTI's experience pass (multi_agent_experience_maker.py `make_experience`): after a
    step's rollout and before any training, every agent's actor and reference model run
    forward over the step's samples (all of them; `own`: the agent's own only), one agent after
    another on its own devices. `arm` starts it at a rollout's end; every training computation
    `wait`s for it (SimTrainer.gate)."""

    def __init__(self, costs: Costs, members: list[tuple[str, Model, DeviceGroup, int]],
                 engines: dict[str, list[SimRolloutEngine]], own: bool,
                 kl_coef: float = 0.0) -> None:
        self.costs = costs
        self.members = members
        self.engines = engines
        self.own = own
        self.forwards = costs.experience_forwards(kl_coef)
        """The actor's forward, and the reference model's where kl_coef > 0."""
        self.seconds = 0.0
        self._seen = {a: 0 for a in engines}
        self._done: asyncio.Future | None = None
        self._task: asyncio.Task | None = None

    def arm(self) -> None:
        tokens = {}
        for agent, engines in self.engines.items():
            total = sum(e.sequence_tokens for e in engines)
            tokens[agent], self._seen[agent] = total - self._seen[agent], total
        loop = asyncio.get_running_loop()
        self._done = loop.create_future()
        self._task = loop.create_task(self._run(tokens, self._done), name="sim.experience")

    async def _run(self, tokens: dict[str, int], done: asyncio.Future) -> None:
        every = sum(tokens.values())
        for agent, model, group, devices in self.members:
            seconds = self.forwards * self.costs.forward_s(
                model, devices, tokens.get(agent, 0) if self.own else every)
            await asyncio.sleep(seconds)
            group.busy(devices, seconds)
            self.seconds += seconds
        done.set_result(None)

    async def wait(self) -> None:
        if self._done is not None:
            await self._done


def fits_state(costs: Costs, model: Model, devices: int) -> bool:
    """Does a training state fit `devices` within train.state_memory_fraction of memory?"""
    return costs.state_bytes(model) <= (devices * costs.device.memory_bytes
                                        * costs.train.state_memory_fraction)


def agent_models(preset: Preset, costs: Costs) -> dict[str, Model]:
    """agent -> its model in the cost model (a LoRA agent's: its base and adapter)."""
    return {a: costs.model(key) for a, key in preset.sizes.items()}


def unit_models(preset: Preset, costs: Costs) -> dict[str, Model]:
    """Rollout unit -> the model one of its instances holds: the agent's, or a LoRA unit's
    base serving every member's adapter."""
    models = agent_models(preset, costs)
    return {u: costs.unit_model(preset.models[ms[0]], [models[a] for a in ms])
            if ms[0] in preset.lora else models[ms[0]] for u, ms in preset.units.items()}


def build(preset: Preset, system: Any, costs: Costs) -> Layout:
    """The layout of `system` (flexmarl.sim.cluster.System) on `preset`'s cluster; a
    ValueError naming the fix when it does not fit."""
    agents = agent_models(preset, costs)
    models = unit_models(preset, costs)  # rollout: per unit
    units = preset.units
    total = preset.nodes * costs.device.devices_per_node
    instances: dict[str, list] = {u: [] for u in models}
    counter = iter(range(1 << 30))

    def add(unit: str, group: DeviceGroup, model: Model) -> SimRolloutEngine:
        name = f"rollout-{next(counter)}"
        lora = {a: agents[a] for a in units[unit] if a in preset.lora}
        engine = SimRolloutEngine(costs, model, group, agent_of=lambda u=unit: u,
                                  medians=preset.medians, adapters=lora)
        instances[unit].append((name, engine))
        return engine

    if system.trainers == "colocated":
        group = DeviceGroup("cluster", total, costs, colocated=True)
        per = {u: total // m.rollout_devices for u, m in models.items()}
        # Its slot's states move through the pool's swaps; a rollout mode holds the unit's
        # weights on every instance of the cluster.
        group.resident_bytes = lambda mode: (per[mode[1]] * models[mode[1]].served_bytes
                                             if mode[0] == "rollout" else 0.0)
        for unit, model in models.items():
            for _ in range(per[unit]):
                add(unit, group, model)
        return Layout([group], instances, {"trainer-0": (total, group)}, static=False)
    if preset.lora and (system.trainers == "per_agent" or (system.flexmarl
                                                             and preset.timeshare)):
        raise ValueError(f"preset {preset.name}: LoRA agents {sorted(preset.lora)} cannot be "
                         "time-shared (their unit's instances serve every adapter; the product "
                         "refuses it: flexmarl.placement.lora_units)")
    if system.trainers == "per_agent":  # MARTI
        groups = [(a,) for a in models]
        devices = marti_split(preset, costs, system.split)
        return _time_shared(preset, system, costs, groups, devices, add, instances, marti=True)
    if system.flexmarl and preset.timeshare:
        devices = list(preset.timeshare_devices or
                       [total // len(preset.timeshare)] * len(preset.timeshare))
        return _time_shared(preset, system, costs, list(preset.timeshare), devices, add,
                            instances, marti=False)
    return _disaggregated(preset, system, costs, models, agents, total, add, instances)


def marti_split(preset: Preset, costs: Costs, split: str) -> list[int]:
    """MARTI's devices per agent: equal (its examples' one global setting), ("demand") by the
    demand the planner measured on its seeds (preset.demand, split as FlexMARL's planner
    splits time-shared devices: split_by_demand), or ("params", and "demand" without a plan)
    in proportion to each agent's parameters, whole instances each."""
    total = preset.nodes * costs.device.devices_per_node
    models = list(agent_models(preset, costs).values())
    if split == "equal":
        return [total // len(models)] * len(models)
    if split == "demand" and preset.demand:
        devices = split_by_demand(preset, costs, tuple((a,) for a in preset.models),
                                  preset.demand)
        if devices is not None:
            return list(devices)
    params = sum(m.params for m in models)
    return [int(total * m.params / params) // m.rollout_devices * m.rollout_devices
            for m in models]


def _time_shared(preset: Preset, system: Any, costs: Costs, groups: list[tuple[str, ...]],
                 devices: list[int], add: Callable, instances: dict, *, marti: bool) -> Layout:
    models = agent_models(preset, costs)
    trainable = set(preset.trainable)
    if sum(devices) > preset.nodes * costs.device.devices_per_node:
        raise ValueError(f"preset {preset.name}: time-shared groups of {devices} devices need "
                         f"more than the cluster's; add nodes")
    out: list[DeviceGroup] = []
    group_of: dict[str, tuple[DeviceGroup, int]] = {}
    driver = DeviceGroup("driver", 0, costs, colocated=True, resident_bytes=lambda mode: 0.0)
    for k, (members, n) in enumerate(zip(groups, devices)):
        key = "+".join(members)
        group = DeviceGroup(f"group-{key}", n, costs).time_shared(
            tuple(a for a in members if a in trainable))
        counts = {}
        for agent in members:
            model = models[agent]
            counts[agent] = (preset.instances or {}).get(agent) or \
                n // len(members) // model.rollout_devices
            if counts[agent] < 1 or (agent in trainable and not fits_state(costs, model, n)):
                raise ValueError(f"preset {preset.name}, system {system.name}: {n} devices "
                                 f"hold no instance or no training state of agent {agent}; "
                                 "add nodes")
        if sum(counts[a] * models[a].rollout_devices for a in members) > n:
            raise ValueError(f"preset {preset.name}: instances {counts} need more than the "
                             f"{n} devices of their group")
        awake = sum(counts[a] * models[a].weight_bytes for a in members)
        per_param = costs.baselines.offload_bytes_per_param if marti else \
            costs.train.state_bytes_per_param
        group.resident_bytes = lambda mode, awake=awake: (
            awake if mode[0] == "rollout" else per_param * models[mode[1]].params)
        # The trainer's rank 0 (where a version is published) is on the group's first node:
        # the group's instances there read the file, the others fetch it from there.
        near = min(1.0, costs.device.devices_per_node / n)
        for agent in members:
            model = models[agent]
            # MARTI wakes an agent's engines to broadcast to them, then puts them back to sleep.
            extra = 2 * costs.host_transfer_s(counts[agent] * model.weight_bytes, n)
            local = int(counts[agent] * near)
            for k in range(counts[agent]):
                engine = add(agent, group, model)
                engine.rollout_key = key
                engine.trainer_devices = n
                if marti:
                    engine.broadcasts, engine.broadcast_extra_s = driver, extra
                else:
                    engine.time_shared, engine.sync_path = True, "published"
                    engine.remote_receivers = 0 if k < local else counts[agent] - local
            group_of[agent] = (group, n)
        out.append(group)
    slots = {f"trainer-{k}": (group_of[a][1], group_of[a][0])
             for k, a in enumerate(preset.trainable)}
    ranks = {a: min(models[a].train_devices, group_of[a][1]) for a in preset.trainable}
    layout = Layout(out, instances, slots, static=True, ranks=ranks,
                    sync=dict.fromkeys(preset.trainable, "marti" if marti else "published"))
    if marti and system.experience:
        layout.experience = ExperiencePass(
            costs, [(a, models[a], *group_of[a]) for a in preset.trainable],
            {a: [e for _, e in instances[a]] for a in models}, own=system.experience == "own",
            kl_coef=preset.kl_coef)
    return layout


def _disaggregated(preset: Preset, system: Any, costs: Costs, models: dict[str, Model],
                   agents: dict[str, Model], total: int, add: Callable,
                   instances: dict) -> Layout:
    """`models`: per rollout unit; `agents`: per agent (their trainer slots)."""
    if system.trainers == "static":
        sizes = [agents[a].train_devices for a in preset.trainable]
    elif preset.shared_slots == "auto":
        raise ValueError("resolve shared_slots='auto' first (flexmarl.sim.plan)")
    else:
        sizes = [costs.model(size).train_devices for size in preset.shared_slots]
    slots = {f"trainer-{k}": (n, DeviceGroup(f"trainer-{k}", n, costs))
             for k, n in enumerate(sizes)}
    rollout_devices = total - sum(sizes)
    share = rollout_devices // len(models)
    group = DeviceGroup("rollout", rollout_devices, costs)
    split = preset.instances if system.flexmarl else None
    if split and sum(split[a] * m.rollout_devices for a, m in models.items()) > rollout_devices:
        raise ValueError(f"preset {preset.name}: instances {split} need more than the "
                         f"{rollout_devices} devices the trainer slots leave")
    for agent, model in models.items():  # each rollout unit
        count = split[agent] if split else share // model.rollout_devices
        if count < 1:
            raise ValueError(f"preset {preset.name}, system {system.name}: {rollout_devices} "
                             f"rollout devices leave agent {agent} no instance "
                             f"({model.rollout_devices} devices each); add nodes")
        published = preset.units[agent][0] in preset.lora or not preset.direct_sync
        for _ in range(count):
            engine = add(agent, group, model)
            if published:  # a LoRA unit's adapters, or the CPU default: every instance
                # apart from the trainer slots, so on other hosts where there are several
                engine.sync_path = "published"
                engine.remote_receivers = count if preset.nodes > 1 else 0
    published = [a for a in agents if a in preset.lora or not preset.direct_sync]
    return Layout([group] + [g for _, g in slots.values()], instances, slots,
                  static=system.trainers == "static", sync=dict.fromkeys(published, "published"))


def split_by_demand(preset: Preset, costs: Costs, groups: tuple[tuple[str, ...], ...],
                    demand: dict[str, float]) -> tuple[int, ...] | None:
    """Devices per group in proportion to its agents' demand, each at least what holds its
    largest training state and an instance of each agent, in whole instances of its largest
    model (largest remainders); None when the minimums do not fit. (FlexMARL's planner for
    its grouped candidates before issue 54; marti-lean's split.)"""
    total = preset.nodes * costs.device.devices_per_node
    models = agent_models(preset, costs)
    unit = [max(models[a].rollout_devices for a in grp) for grp in groups]
    least = []
    for grp, u in zip(groups, unit):
        n = max(sum(models[a].rollout_devices for a in grp), u)
        while not all(fits_state(costs, models[a], n) for a in grp
                      if a in preset.trainable):
            n += u
        least.append(n)
    free = total - sum(least)
    if free < 0:
        return None
    weight = [sum(demand[a] for a in grp) for grp in groups]
    extra = [w / sum(weight) * free / u for w, u in zip(weight, unit)]
    out = [n + int(x) * u for n, x, u in zip(least, extra, unit)]
    left = total - sum(out)
    for k in sorted(range(len(groups)), key=lambda k: (-(extra[k] - int(extra[k])), k)):
        if unit[k] <= left:
            out[k] += unit[k]
            left -= unit[k]
    return tuple(out)
