"""Placement planning with the simulator: where a team trains and rolls out, and how.

    disaggregated  k = 1 .. agents shared trainer slots, sized for the k largest agents'
                   models (every agent then fits the first; k = agents: one slot each, no
                   swaps), the rest of the devices serving rollout
    slot sizes     the cost model's train_devices per model, then halved step by step down to
                   the fewest devices that hold the model's training state (14b: 16, 8; 32b:
                   32, 16): smaller slots train slower but leave more devices for rollout and
                   fit more slots, so fewer agents share one (fewer swaps)
    search         per slot size, each candidate simulated (the product's scheduling code,
                   flexmarl.sim.cluster) on the preset's workload and seed; coarse first
                   (every third k, the ends always), then the neighbours of that size's best
    balancing      each slot size's best once more with instance moves off ("least_loaded")
                   and with no balancing ("round_robin")
    instances      the best once more with rollout instances split by demand (each agent's
                   decoding device-seconds in the best's simulation, at least one each)
    time-shared    each agent its own group of devices alternating between its engines and
                   its trainer, the devices split equally (MARTI's layout: FlexMARL's own loop
                   there is always a candidate), with the zero-staleness modes (the system's,
                   and sync); then g groups of a few agents each (g = agents/2, agents/3;
                   agents dealt to groups by demand, largest first), the devices split
                   equally, with the better mode. Balancing within each agent only
                   ("least_loaded", and "round_robin"): an instance cannot move to another
                   group's agent. Groups of different sizes are not tried (not expressible,
                   below)
    last round     the best so far with pipeline sync and with balancing round_robin (what the
                   ablations remove), repeated while one of them is faster: FlexMARL's row is
                   then never slower than its ablations

Seeds (issue 54): the `simulate` given (flexmarl.sim.cluster.plan_slots) runs every candidate
on the planner's own seeds (PLAN_SEEDS, or bench/simulate.py --plan-seeds), its step the mean
over them, and the demand splits come from their tokens; a comparison reports other seeds
(flexmarl.sim.cluster.compare refuses an overlap): the plan never sees the workload it is
judged on.

What the product runs here (Deployment, `refusal`): every candidate is simulated, but only one
the product can run is chosen; the fastest refused one is reported with the reason (`would_have`).
Refused: a placement the product's config cannot express (`expressible`: time-shared groups of
different sizes), a time-shared GPU placement under the Ray launcher (it refuses them at start:
flexmarl.launch.workers.check_ray_gpus), and a time-shared GPU placement at all unless the
deployment allows unverified paths (devices.allow_unverified): vLLM's sleep / wake_up on GPU
has never run in this product.

LoRA agents (Preset.lora): their model keys ("14b+lora16") size their slots by their own state
(the frozen base + the adapter's training state: a 14B one fits one device, where a full copy
needs eight), rollout instances are counted per unit (one set of instances per base serves all
its adapters), the instance split by demand is per unit, and their swaps and syncs are priced
as adapters (Costs.swap_bytes, Model.sync_bytes) in every simulated candidate: a team of more
LoRA agents than devices can have a placement where its full copies have none.
`slot_capacity` says how many agents' states a slot holds at once (the base counted once).
Time-shared candidates are not tried for them (the product refuses time-shared LoRA agents).

The fastest step the product runs here wins; among equals: disaggregated before time-shared,
fewer slots, the hierarchical balancer, the system's own pipeline, the larger slots. A candidate
that does not fit the cluster is skipped. `trainer_pool.slots = "auto"` in the simulator
(Preset.shared_slots = "auto") is this search; `bench/simulate.py --plan` prints its table,
`flexmarl plan` plans a user's own team (flexmarl.sim.team_plan).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable

from flexmarl.sim.costs import Costs
from flexmarl.sim.layouts import agent_models, unit_models
from flexmarl.sim.presets import Preset

ORDER = {"hierarchical": 0, "least_loaded": 1, "round_robin": 2}
PLAN_SEEDS = (100,)
"""The planner's seeds where none are given: apart from the seeds the tables report (0, 1)."""

UNVERIFIED = ("unverified: a time-shared placement on GPU (vLLM's sleep / wake_up, its trainer "
              "parked beside it) has never run in this product; devices.allow_unverified = true "
              "(bench/simulate.py --allow-unverified) lets the planner pick it")
RAY_REFUSES = ('cluster.launcher = "ray" refuses a time-shared GPU placement at start (Ray gives '
               "each GPU worker GPUs of its own: flexmarl.launch.workers.check_ray_gpus)")
UNEQUAL_GROUPS = ("not expressible: time-shared groups of different sizes (the product's config "
                  "gives every group trainer_pool.ranks_per_agent devices; placement_toml could "
                  "write the sizes as a comment only)")


@dataclass(frozen=True)
class Deployment:
    """What the product in use can run; the planner simulates every candidate, chooses only
    among those, and says what it would have chosen otherwise."""

    gpu: bool = True
    """Engines and trainers on GPUs (the presets' cluster; a run with trainer.device "cuda")."""
    launcher: str = "nodes"
    """cluster.launcher in effect ("local", "nodes", "ray")."""
    allow_unverified: bool = False
    """devices.allow_unverified: paths that never ran on this hardware may be chosen."""
    timeshare: bool = True
    """Time-shared placements are tried at all (False: the product in use has none)."""


@dataclass(frozen=True)
class Placement:
    slots: tuple[str, ...]
    """Model size each shared slot is sized for."""
    step_s: float
    rollout_devices: int
    balance: str = "hierarchical"
    """balance.strategy: "hierarchical" (instances move between agents), "least_loaded"
    (within each agent only) or "round_robin" (none)."""
    train_devices: dict[str, int] | None = dataclasses.field(default=None, hash=False)
    """Devices of a slot per model size (None: the cost model's train_devices)."""
    instances: dict[str, int] | None = dataclasses.field(default=None, hash=False)
    """Rollout instances per agent (None: the devices left, split equally)."""
    result: Any = dataclasses.field(default=None, repr=False, compare=False)
    """The simulation's SystemResult."""
    pipeline: str = "micro_batch"
    """pipeline.mode the placement was simulated with."""
    timeshare: tuple[tuple[str, ...], ...] = ()
    """Time-shared groups of agents (every agent in one); (): disaggregated."""
    timeshare_devices: tuple[int, ...] | None = None
    """Devices of each time-shared group (None: an equal split)."""
    refused: str = dataclasses.field(default="", compare=False)
    """Why the product would not run it in this deployment (`refusal`); "": it would."""

    @property
    def kind(self) -> str:
        """disaggregated, time_shared (one agent per group) or grouped."""
        if not self.timeshare:
            return "disaggregated"
        return "time_shared" if all(len(g) == 1 for g in self.timeshare) else "grouped"


def candidates(preset: Preset, costs: Costs) -> list[tuple[str, ...]]:
    """k = 1 .. agents slots, each sized for one of the k largest agents' models."""
    sizes = sorted((preset.sizes[a] for a in preset.trainable),
                   key=lambda s: -costs.model(s).train_devices)
    return [tuple(sizes[:k]) for k in range(1, len(sizes) + 1)]


def fits(preset: Preset, costs: Costs, slots: tuple[str, ...]) -> bool:
    """Does each slot hold the training state of the model it is sized for, and do the slots
    leave every rollout unit (an agent, or a LoRA unit: one set of instances for all its
    adapters) at least one instance?"""
    total = preset.nodes * costs.device.devices_per_node
    if not all(slot_capacity(costs, s, costs.model(s).train_devices) for s in slots):
        return False
    rollout = total - sum(costs.model(s).train_devices for s in slots)
    units = unit_models(preset, costs)
    share = rollout // len(units)
    return all(share >= m.rollout_devices for m in units.values())


def slot_capacity(costs: Costs, size: str, devices: int) -> int:
    """How many agents of model `size` (a LoRA key: adapters on one base) have their training
    states on a slot of `devices` at once (Costs.slot_capacity: the base counted once)."""
    return costs.slot_capacity(costs.model(size), devices)


def slot_sizes(preset: Preset, costs: Costs) -> list[dict[str, int] | None]:
    """The slot sizes tried: the cost model's (None), then halved step by step while some
    model's slot can still shrink (to its min_train_devices: the state must fit)."""
    sizes = {m: costs.model(m).train_devices for m in set(preset.sizes.values())}
    out: list[dict[str, int] | None] = [None]
    while True:
        smaller = {m: max(costs.min_train_devices(costs.model(m)), n // 2)
                   for m, n in sizes.items()}
        if smaller == sizes:
            return out
        out.append(dict(sorted(smaller.items())))
        sizes = smaller


def plan(preset: Preset, costs: Costs, simulate: Callable[[Preset, str, str], Any],
         progress: Callable[[Placement], Any] | None = None, *,
         pipeline: str = "micro_batch", deployment: Deployment = Deployment()
         ) -> list[Placement]:
    """Every evaluated placement, those the product runs in `deployment` first, each part best
    first (placements[0] is the choice; a ValueError where none is run); `simulate(preset,
    strategy, pipeline)` runs the system on a preset laid out as the candidate (shared_slots,
    train_devices, instances, timeshare), with that balance.strategy and pipeline.mode, on the
    planner's seeds. `pipeline`: the system's own mode; sync is tried beside it where it keeps
    the same staleness (micro_batch)."""
    total = preset.nodes * costs.device.devices_per_node
    modes = [pipeline] + (["sync"] if pipeline == "micro_batch" else [])
    done: dict[tuple[int, int], Placement] = {}
    scales = slot_sizes(preset, costs)
    tried: dict[tuple, Placement] = {}

    def run(candidate: Placement) -> Placement | None:
        key = _key(candidate)
        if key in tried:
            return tried[key]
        try:
            result = simulate(preset_of(preset, candidate), candidate.balance,
                              candidate.pipeline)
        except ValueError:  # does not fit the cluster
            return None
        placement = dataclasses.replace(candidate, step_s=result.step_s, result=result,
                                        refused=refusal(candidate, deployment))
        tried[key] = placement
        if progress is not None:
            progress(placement)
        return placement

    def shared(j: int, slots: tuple[str, ...], strategy: str,
               instances: dict[str, int] | None = None) -> Placement | None:
        sized = costs.with_train_devices(scales[j] or {})
        return run(Placement(slots, 0.0, total - sum(sized.model(s).train_devices
                                                     for s in slots),
                             strategy, scales[j], instances, pipeline=pipeline))

    for j, devices in enumerate(scales):
        sized = costs.with_train_devices(devices or {})
        options = [c for c in candidates(preset, sized) if fits(preset, sized, c)]

        asked: set[int] = set()

        def evaluate(k: int) -> None:
            if k not in asked and 0 <= k < len(options):
                asked.add(k)
                if (p := shared(j, options[k], "hierarchical")) is not None:
                    done[(j, k)] = p

        for k in sorted({*range(0, len(options), 3), len(options) - 1}):
            evaluate(k)
        while any(i == j for i, _ in done):  # refine around this size's best
            best = min((k for (i, k) in done if i == j), key=lambda k: (done[(j, k)].step_s, k))
            missing = [k for k in (best - 1, best + 1)
                       if 0 <= k < len(options) and k not in asked]
            if not missing:
                break
            for k in missing:
                evaluate(k)
    # Each slot size's best once more with less balancing.
    for j in sorted({j for j, _ in done}):
        k = min((k for i, k in done if i == j), key=lambda k: (done[(j, k)].step_s, k))
        for strategy in ("least_loaded", "round_robin"):
            shared(j, done[(j, k)].slots, strategy)
    if tried:
        best = min(tried.values(), key=rank)
        split = by_demand(preset, costs, best)
        if split is not None:  # instances where the work is, with each balancing strategy
            for strategy in ORDER:
                shared(scales.index(best.train_devices), best.slots, strategy, split)
    if deployment.timeshare:
        _time_shared(preset, costs, run, modes, list(tried.values()))
    if not tried:
        raise ValueError(f"preset {preset.name} on {preset.nodes} nodes: no placement (number "
                         "of shared trainer slots, or time-shared groups) leaves every agent a "
                         "rollout instance and room for its training state; add nodes")
    while True:  # the last round: what the ablations remove, on the best
        best = min(tried.values(), key=rank)
        for variant in (dataclasses.replace(best, pipeline="sync"),
                        dataclasses.replace(best, balance="round_robin")):
            run(variant)
        if min(tried.values(), key=rank) is best:
            break
    placements = sorted(tried.values(), key=rank)
    if placements[0].refused:
        raise ValueError(f"preset {preset.name} on {preset.nodes} nodes: no placement that fits "
                         "is one the product runs here; the fastest, "
                         f"{label(costs, placements[0])} ({placement_key(placements[0])}, "
                         f"{placements[0].step_s:.1f} s), is refused: {placements[0].refused}; "
                         "or add nodes")
    return placements


def expressible(p: Placement) -> bool:
    """Can the product's config say `p`? Not time-shared groups of different sizes: the
    product sizes a group by its slot's ranks (flexmarl.placement.layout.slot_layout: one
    trainer_pool.ranks_per_agent for all, AgentSpec.train_ranks aside), and the simulated
    group trains on as many devices as it has, so `placement_toml` could only write the sizes
    as a comment. Disaggregated slots (trainer_pool.slots, slot_ranks) and per-agent instances
    (rollout.instances_per_agent, AgentSpec.instances) it can."""
    return not (p.timeshare and p.timeshare_devices
                and len(set(p.timeshare_devices)) > 1)


def refusal(p: Placement, deployment: Deployment) -> str:
    """Why the product would not run `p` in `deployment` ("": it would)."""
    if not expressible(p):
        return UNEQUAL_GROUPS
    if p.timeshare and deployment.gpu:
        if deployment.launcher == "ray":
            return RAY_REFUSES
        if not deployment.allow_unverified:
            return UNVERIFIED
    return ""


def would_have(placements: list[Placement]) -> Placement | None:
    """The fastest refused placement, where it is faster than the chosen one (placements[0])."""
    refused = [p for p in placements if p.refused]
    if not placements or not refused:
        return None
    best = min(refused, key=rank)
    return best if best.step_s < placements[0].step_s else None


def _time_shared(preset: Preset, costs: Costs, run: Callable[[Placement], Placement | None],
                 modes: list[str], evaluated: list[Placement]) -> None:
    """The time-shared candidates (see the module docstring). Not for a team with frozen
    agents: they have no trainer to share devices with, and a placement mixing time-shared
    and disaggregated agents is not searched."""
    agents = list(preset.models)
    if len(preset.trainable) < len(agents) or preset.lora:
        return
    total = preset.nodes * costs.device.devices_per_node
    demand = _demand(preset, costs, min(evaluated, key=rank) if evaluated else None)
    equal = Placement((), 0.0, total, "least_loaded", timeshare=tuple((a,) for a in agents))
    found = [p for mode in modes
             if (p := run(dataclasses.replace(equal, pipeline=mode))) is not None]
    if not found:
        return
    best = min(found, key=rank)
    run(dataclasses.replace(best, balance="round_robin"))
    for g in sorted({len(agents) // 2, len(agents) // 3} - {0, len(agents)}, reverse=True):
        run(Placement((), 0.0, total, best.balance, pipeline=best.pipeline,
                      timeshare=_deal(agents, demand, g)))


def agent_demand(preset: Preset, costs: Costs, placement: Placement | None
                 ) -> dict[str, float]:
    """Each agent's demand in `placement`'s simulation (on the planner's seeds): what
    marti-lean's devices are split by (Preset.demand), the same information the planner has."""
    return _demand(preset, costs, placement)


def _demand(preset: Preset, costs: Costs, placement: Placement | None) -> dict[str, float]:
    """Each agent's work in `placement`'s simulation: parameters x tokens generated (decoding
    and training both scale with it); equal tokens without one."""
    tokens = {a: 1.0 for a in preset.models}
    if placement is not None:
        for record in placement.result.records:
            for agent, stats in record["agents"].items():
                tokens[agent] = tokens.get(agent, 0.0) + stats.get("tokens", 0)
    return {a: m.params * tokens[a] for a, m in agent_models(preset, costs).items()}


def _deal(agents: list[str], demand: dict[str, float], g: int) -> tuple[tuple[str, ...], ...]:
    """`agents` dealt into g groups, largest demand first, each to the lightest group."""
    groups: list[list[str]] = [[] for _ in range(g)]
    load = [0.0] * g
    for a in sorted(agents, key=lambda a: (-demand[a], a)):
        k = min(range(g), key=lambda k: (load[k], k))
        groups[k].append(a)
        load[k] += demand[a]
    return tuple(tuple(sorted(grp, key=agents.index)) for grp in groups if grp)


def rank(p: Placement) -> tuple:
    """Run here before refused, then fastest, then the tie-breaks of the module docstring."""
    return (bool(p.refused), p.step_s, bool(p.timeshare), len(p.slots), ORDER[p.balance],
            p.pipeline == "sync", -sum(slot_devices_of(p)), p.instances is not None)


def slot_devices_of(p: Placement) -> list[int]:
    return list(p.train_devices.values()) if p.train_devices else []


def _key(p: Placement) -> tuple:
    return (p.slots, tuple(sorted((p.train_devices or {}).items())),
            tuple(sorted((p.instances or {}).items())), p.balance, p.pipeline, p.timeshare,
            p.timeshare_devices)


def preset_of(preset: Preset, p: Placement) -> Preset:
    """`preset` laid out as placement `p` (for FlexMARL's rows)."""
    return dataclasses.replace(preset, shared_slots=p.slots, train_devices=p.train_devices,
                               instances=p.instances, timeshare=p.timeshare,
                               timeshare_devices=p.timeshare_devices)


def subset(placements: list[Placement], without: str, preset: Preset) -> Placement | None:
    """The best evaluated placement without a shared slot ("pool": one slot per trainable
    agent, disaggregated or time-shared) or without time-sharing ("timeshare")."""
    def keep(p: Placement) -> bool:
        if without == "pool":
            return bool(p.timeshare) or len(p.slots) >= len(preset.trainable)
        return not p.timeshare
    kept = [p for p in placements if keep(p) and not p.refused]
    return min(kept, key=rank) if kept else None


def by_demand(preset: Preset, costs: Costs, placement: Placement) -> dict[str, int] | None:
    """Rollout instances per unit (an agent, or a LoRA unit) in proportion to the
    device-seconds of decoding each needed in the placement's simulation (its agents' tokens
    x devices per instance), at least one each, on the devices the slots leave (largest
    remainders); None when that is the equal split."""
    units = unit_models(preset, costs)
    unit_of = {a: u for u, ms in preset.units.items() for a in ms}
    tokens = {u: 0 for u in units}
    for record in placement.result.records:
        for agent, stats in record["agents"].items():
            if agent in unit_of:
                tokens[unit_of[agent]] += stats.get("tokens", 0)
    size = {u: m.rollout_devices for u, m in units.items()}
    demand = {u: tokens[u] * size[u] for u in units}
    free = placement.rollout_devices - sum(size.values())  # after one instance each
    total = sum(demand.values())
    if free < 0 or not total:
        return None
    extra = {a: demand[a] / total * free / size[a] for a in demand}  # instances beyond one
    counts = {a: 1 + int(x) for a, x in extra.items()}
    left = placement.rollout_devices - sum(counts[a] * size[a] for a in counts)
    for a in sorted(extra, key=lambda a: (-(extra[a] - int(extra[a])), a)):
        if size[a] <= left:
            counts[a] += 1
            left -= size[a]
    return None if counts == instances(preset, costs, placement) else counts


def slot_devices(costs: Costs, placement: Placement) -> list[int]:
    """Devices of each of the placement's slots."""
    sized = costs.with_train_devices(placement.train_devices or {})
    return [sized.model(m).train_devices for m in placement.slots]


def table(preset: Preset, costs: Costs, placements: list[Placement]) -> str:
    """The placements tried, best first, as a text table."""
    lines = [f"placements of {preset.name} on {preset.nodes} nodes of "
             f"{costs.device.devices_per_node} devices (flexmarl, costs {costs.name}, pricing "
             f"{costs.pricing}), those the product runs here first, each best first",
             f"{'placement':28s} {'rollout devices':>15s} {'instances':>10s} {'balance':>13s} "
             f"{'pipeline':>12s} {'step s':>8s}  runs here"]
    reasons: dict[str, int] = {}
    for p in placements:
        split = "by demand" if p.instances or p.timeshare_devices else "equal"
        mark = "yes" if not p.refused else \
            f"no ({reasons.setdefault(p.refused, len(reasons) + 1)})"
        lines.append(f"{label(costs, p):28s} {p.rollout_devices:15d} {split:>10s} "
                     f"{p.balance:>13s} {p.pipeline:>12s} {p.step_s:8.1f}  {mark}")
    lines += [f"({k}) {why}" for why, k in reasons.items()]
    if (other := would_have(placements)) is not None:
        lines.append(f"would have picked {label(costs, other)} ({placement_key(other)}, "
                     f"{other.pipeline}, {other.balance}: {other.step_s:.1f} s against "
                     f"{placements[0].step_s:.1f} s), but {other.refused}")
    return "\n".join(lines)


def label(costs: Costs, p: Placement) -> str:
    """Short: '5x16' (shared slots x devices, by model size; '+demand': instances split by
    demand), 'ts 15x8' (time-shared groups x devices; '+demand': devices split by demand),
    'ts 5 groups'."""
    if p.timeshare:
        sizes = p.timeshare_devices or (p.rollout_devices // len(p.timeshare),)
        head = f"ts {len(p.timeshare)} groups" if p.kind == "grouped" else (
            f"ts {len(p.timeshare)}x" + (str(sizes[0]) if len(set(sizes)) == 1 else "var"))
        return head + ("+demand" if p.timeshare_devices else "")
    counts: dict[int, int] = {}
    for n in slot_devices(costs, p):
        counts[n] = counts.get(n, 0) + 1
    return "+".join(f"{k}x{n}" for n, k in counts.items()) + ("+demand" if p.instances else "")


def placement_key(p: Placement) -> str:
    """The product's `[devices] placement` value for `p`."""
    if not p.timeshare:
        return "disaggregated"
    if p.kind == "time_shared":
        return "time_shared"
    return ",".join("+".join(g) + "=time_shared" for g in p.timeshare)


def group_devices(preset: Preset, costs: Costs, p: Placement) -> list[int]:
    """Devices of each time-shared group of `p` (as flexmarl.sim.layouts lays them out)."""
    total = preset.nodes * costs.device.devices_per_node
    return list(p.timeshare_devices or [total // len(p.timeshare)] * len(p.timeshare))


def describe(preset: Preset, costs: Costs, p: Placement) -> dict:
    """A placement as JSON."""
    sized = costs.with_train_devices(p.train_devices or {})
    return {"placement": placement_key(p), "label": label(costs, p), "kind": p.kind,
            "slots": list(p.slots), "slot_devices": slot_devices(costs, p),
            "slot_capacity": [slot_capacity(sized, m, n)
                              for m, n in zip(p.slots, slot_devices(costs, p))],
            "groups": [list(g) for g in p.timeshare],
            "group_devices": group_devices(preset, costs, p) if p.timeshare else [],
            "rollout_devices": p.rollout_devices, "instances": instances(preset, costs, p),
            "balance": p.balance, "pipeline": p.pipeline, "step_s": p.step_s,
            "expressible": expressible(p), "refused": p.refused}


def instances(preset: Preset, costs: Costs, placement: Placement) -> dict[str, int]:
    """Rollout instances per unit (an agent, or a LoRA unit "a+b") of a placement: its own
    split, or as flexmarl.sim.layouts lays them out (the devices left by the slots, or each
    group's, split equally)."""
    if placement.instances:
        return dict(placement.instances)
    if placement.result is not None:
        return dict(placement.result.rollout_instances)
    units = unit_models(preset, costs)
    share = placement.rollout_devices // len(units)
    return {u: share // m.rollout_devices for u, m in units.items()}


def placement_toml(preset: Preset, costs: Costs, placement: Placement,
                   ranks: list[int] | None = None) -> str:
    """The placement as FlexMARL config: [devices] placement, [trainer_pool] with each shared
    slot's `ranks` (default: one rank per device of the cost model's slot; time-shared groups
    train on their own devices, outside trainer_pool.slots), [pipeline] mode, [balance], and
    the rollout instances (rollout.instances_per_agent when every agent has as many, else a
    comment with AgentSpec.instances per agent)."""
    if placement.timeshare:
        sizes = group_devices(preset, costs, placement)
        key = ("slots = 0                 # no shared slot: each time-shared group trains on "
               "its own devices\n" + (f"ranks_per_agent = {sizes[0]}" if len(set(sizes)) == 1
                                      else "# trainer ranks per group: " + ", ".join(
                                          f"{'+'.join(g)} {n}" for g, n in
                                          zip(placement.timeshare, sizes))))
    else:
        sizes = ranks or slot_devices(costs, placement)
        key = (f"ranks_per_agent = {sizes[0]}\nslots = {len(sizes)}" if len(set(sizes)) == 1
               else f'slot_ranks = "{",".join(map(str, sizes))}"')
        if len(sizes) == len(preset.trainable):  # a slot for every agent: no pool, no swaps
            key = (f"ranks_per_agent = {sizes[0]}\n" if len(set(sizes)) == 1 else "") + \
                "slots = 0                 # one slot per trainable agent: no swaps"
    counts = instances(preset, costs, placement)
    rollout = (f"[rollout]\ninstances_per_agent = {next(iter(counts.values()))}\n"
               if len(set(counts.values())) == 1 else
               "# rollout instances per agent (AgentSpec.instances): "
               + ", ".join(f"{a} {n}" for a, n in counts.items()) + "\n")
    return (f"# flexmarl plan: {preset.name} on {preset.nodes} nodes, simulated step "
            f"{placement.step_s:.1f} s (costs {costs.name})\n"
            f'[devices]\nplacement = "{placement_key(placement)}"\n\n'
            f"[trainer_pool]\n{key}\n\n"
            f'[pipeline]\nmode = "{placement.pipeline}"\n\n'
            f'[balance]\nstrategy = "{placement.balance}"\n\n{rollout}')
