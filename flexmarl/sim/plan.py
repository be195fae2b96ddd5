"""Placement planning with the simulator: how many shared trainer slots a team should get,
and how big.

    candidates  k = 1 .. agents shared slots, sized for the k largest agents' models (every
                agent then fits the first), the rest of the devices serving rollout
    slot sizes  the cost model's train_devices per model, then halved step by step down to
                the fewest devices that hold the model's training state (14b: 16, 8; 32b:
                32, 16): smaller slots train slower but leave more devices for rollout and
                fit more slots, so fewer agents share one (fewer swaps)
    search      per slot size, each candidate simulated (the product's scheduling code,
                flexmarl.sim.cluster) on the preset's workload and seed; coarse first (every
                third k, the ends always), then the neighbours of that size's best; the
                fastest step wins, fewer slots among equals (more devices left for rollout),
                then the larger slots
    balancing   each slot size's best placement once more with instance moves off
                (balance.strategy "least_loaded": routing within each agent only) and with no
                balancing at all ("round_robin"); the fastest is kept, so the balancer steps
                aside where it does not pay on this workload (the hierarchical one among
                equals)
    instances   the best once more with rollout instances split by demand instead of
                equally: in proportion to each agent's decoding device-seconds in the best's
                simulation (at least one each), with each balancing strategy

`trainer_pool.slots = "auto"` in the simulator (Preset.shared_slots = "auto") is this search;
`bench/simulate.py --plan` prints its table, `flexmarl plan` plans a user's own team
(flexmarl.sim.team_plan).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable

from flexmarl.sim.costs import Costs
from flexmarl.sim.presets import Preset


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


def candidates(preset: Preset, costs: Costs) -> list[tuple[str, ...]]:
    """k = 1 .. agents slots, each sized for one of the k largest agents' models."""
    sizes = sorted((preset.models[a] for a in preset.trainable),
                   key=lambda s: -costs.models[s].train_devices)
    return [tuple(sizes[:k]) for k in range(1, len(sizes) + 1)]


def fits(preset: Preset, costs: Costs, slots: tuple[str, ...]) -> bool:
    """Do the slots leave every agent at least one rollout instance?"""
    total = preset.nodes * costs.device.devices_per_node
    rollout = total - sum(costs.models[s].train_devices for s in slots)
    share = rollout // len(preset.models)
    return all(share >= costs.models[m].rollout_devices for m in preset.models.values())


def slot_sizes(preset: Preset, costs: Costs) -> list[dict[str, int] | None]:
    """The slot sizes tried: the cost model's (None), then halved step by step while some
    model's slot can still shrink (to its min_train_devices: the state must fit)."""
    sizes = {m: costs.models[m].train_devices for m in set(preset.models.values())}
    out: list[dict[str, int] | None] = [None]
    while True:
        smaller = {m: max(costs.min_train_devices(costs.models[m]), n // 2)
                   for m, n in sizes.items()}
        if smaller == sizes:
            return out
        out.append(dict(sorted(smaller.items())))
        sizes = smaller


def plan(preset: Preset, costs: Costs, simulate: Callable[[Preset, str], Any],
         progress: Callable[[Placement], Any] | None = None) -> list[Placement]:
    """Every evaluated placement, best first; `simulate(preset, strategy)` runs the system on
    a preset whose shared_slots (and train_devices) are the candidate's, with that
    balance.strategy."""
    total = preset.nodes * costs.device.devices_per_node
    done: dict[tuple[int, int], Placement] = {}
    scales = slot_sizes(preset, costs)

    def run(j: int, slots: tuple[str, ...], strategy: str,
            instances: dict[str, int] | None = None) -> Placement:
        sized = costs.with_train_devices(scales[j] or {})
        result = simulate(dataclasses.replace(preset, shared_slots=slots,
                                              train_devices=scales[j], instances=instances),
                          strategy)
        placement = Placement(slots, result.step_s,
                              total - sum(sized.models[s].train_devices for s in slots),
                              strategy, scales[j], instances, result)
        if progress is not None:
            progress(placement)
        return placement

    for j, devices in enumerate(scales):
        sized = costs.with_train_devices(devices or {})
        options = [c for c in candidates(preset, sized) if fits(preset, sized, c)]

        def evaluate(k: int) -> None:
            if (j, k) not in done and 0 <= k < len(options):
                done[(j, k)] = run(j, options[k], "hierarchical")

        for k in sorted({*range(0, len(options), 3), len(options) - 1}):
            evaluate(k)
        while options:  # refine around this size's best until its neighbours are known
            best = min((k for (i, k) in done if i == j), key=lambda k: (done[(j, k)].step_s, k))
            missing = [k for k in (best - 1, best + 1)
                       if 0 <= k < len(options) and (j, k) not in done]
            if not missing:
                break
            for k in missing:
                evaluate(k)
    if not done:
        raise ValueError(f"preset {preset.name} on {preset.nodes} nodes: no number of shared "
                         "trainer slots leaves every agent a rollout instance; add nodes")
    # Each slot size's best once more with less balancing (equal: fewer slots, more devices
    # for rollout).
    others = []
    for j in sorted({j for j, _ in done}):
        k = min((k for i, k in done if i == j), key=lambda k: (done[(j, k)].step_s, k))
        others += [run(j, done[(j, k)].slots, s) for s in ("least_loaded", "round_robin")]
    # Equal: keep the moves (the hierarchical balancer is the default and adapts at run time).
    order = {"hierarchical": 0, "least_loaded": 1, "round_robin": 2}
    # Then the larger slots (faster training).
    def rank(p: Placement) -> tuple:
        return (p.step_s, len(p.slots), order[p.balance], -sum(slot_devices(costs, p)),
                p.instances is not None)

    best = min([*done.values(), *others], key=rank)
    j = scales.index(best.train_devices)
    split = by_demand(preset, costs, best)
    if split is not None:  # instances where the work is, with each balancing strategy
        others += [run(j, best.slots, s, split) for s in order]
    return sorted([*done.values(), *others], key=rank)


def by_demand(preset: Preset, costs: Costs, placement: Placement) -> dict[str, int] | None:
    """Rollout instances per agent in proportion to the device-seconds of decoding each
    needed in the placement's simulation (tokens x devices per instance), at least one each,
    on the devices the slots leave (largest remainders); None when that is the equal split."""
    tokens = {a: 0 for a in preset.models}
    for record in placement.result.records:
        for agent, stats in record["agents"].items():
            tokens[agent] = tokens.get(agent, 0) + stats.get("tokens", 0)
    size = {a: costs.models[m].rollout_devices for a, m in preset.models.items()}
    demand = {a: tokens[a] * size[a] for a in preset.models}
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
    return [sized.models[m].train_devices for m in placement.slots]


def table(preset: Preset, costs: Costs, placements: list[Placement]) -> str:
    """The placements tried, best first, as a text table."""
    lines = [f"placements of {preset.name} on {preset.nodes} nodes of "
             f"{costs.device.devices_per_node} devices (flexmarl), best first",
             f"{'slots':>5s} {'slot sizes (devices)':24s} {'rollout devices':>15s} "
             f"{'instances':>10s} {'balance':>13s} {'step s':>8s}"]
    for p in placements:
        sizes = ",".join(map(str, slot_devices(costs, p)))
        split = "by demand" if p.instances else "equal"
        lines.append(f"{len(p.slots):5d} {sizes:24s} {p.rollout_devices:15d} {split:>10s} "
                     f"{p.balance:>13s} {p.step_s:8.1f}")
    return "\n".join(lines)


def instances(preset: Preset, costs: Costs, placement: Placement) -> dict[str, int]:
    """Rollout instances per agent of a placement: its own split, or the devices left by the
    slots split equally between the agents (as flexmarl.sim.cluster lays them out)."""
    if placement.instances:
        return dict(placement.instances)
    share = placement.rollout_devices // len(preset.models)
    return {a: share // costs.models[m].rollout_devices for a, m in preset.models.items()}


def placement_toml(preset: Preset, costs: Costs, placement: Placement,
                   ranks: list[int] | None = None) -> str:
    """The placement as FlexMARL config: [trainer_pool] with each slot's `ranks` (default: one
    rank per device of the cost model's slot), [balance], and the rollout instances
    (rollout.instances_per_agent when every agent has as many, else a comment with
    AgentSpec.instances per agent)."""
    sizes = ranks or slot_devices(costs, placement)
    key = (f"ranks_per_agent = {sizes[0]}\nslots = {len(sizes)}" if len(set(sizes)) == 1 else
           f'slot_ranks = "{",".join(map(str, sizes))}"')
    if len(sizes) == len(preset.trainable):  # a slot for every agent: no pool, no swaps
        key = (f"ranks_per_agent = {sizes[0]}\n" if len(set(sizes)) == 1 else "") + \
            "slots = 0                 # one slot per trainable agent: no swaps"
    counts = instances(preset, costs, placement)
    rollout = (f"[rollout]\ninstances_per_agent = {next(iter(counts.values()))}\n"
               if len(set(counts.values())) == 1 else
               "# rollout instances per agent (AgentSpec.instances): "
               + ", ".join(f"{a} {n}" for a, n in counts.items()) + "\n")
    return (f"# flexmarl plan: {preset.name} on {preset.nodes} nodes, simulated step "
            f"{placement.step_s:.1f} s\n[trainer_pool]\n{key}\n\n"
            f'[balance]\nstrategy = "{placement.balance}"\n\n{rollout}')
