"""Lower bounds on a preset's step time, measured with the simulator on the systems' layouts.

    rollout-only run   the system's layout and balancer with training, swaps, snapshots,
                       state writes and weight syncs free (and no gate held back: staleness
                       allowed): how fast the instances alone serve one step's workflow
    train work         trainer compute-seconds per step (micro-batches + optimizer steps),
                       the same in every run on a layout (the workload is seeded)

    perfect overlap   = max(rollout-only step, train work / slots): rollout and training fully
                        overlapped and training spread evenly over the slots. No mode can beat
                        its layout's; the preset's is the least over the compared layouts.
    zero staleness    = rollout-only step (FlexMARL's shared layout) + the least tail a step
                        with zero staleness must have: after the step's last group is generated
                        some agent must still train that group, step its optimizer and sync
                        the new weights to its instances before its next call (the cheapest
                        such agent, on its own slot size, Costs.sync_s; mean over the measured
                        steps).

For colocated layouts (mas_rl, marti), whose slots share devices with rollout, the perfect
overlap bound is valid but loose (rollout and training there cannot overlap on one device).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

from flexmarl.sim.costs import Costs

SystemResult = Any  # flexmarl.sim.cluster.SystemResult (cluster imports this module)


def free_training(costs: Costs) -> Costs:
    """`costs` with everything but rollout free: training, optimizer, MARTI's experience pass,
    host transfers (swaps, mode switches), moves of states between slots, weight syncs,
    snapshots and state writes."""
    inf = math.inf
    return dataclasses.replace(
        costs, train=dataclasses.replace(costs.train, flops_per_token_per_param=0.0,
                                         optimizer_passes=0.0),
        links=dataclasses.replace(costs.links, host_link_per_device=inf,
                                  host_memory_per_node=inf, nvlink_per_device=inf,
                                  rdma_per_device=inf, host_write_per_process=inf),
        storage=dataclasses.replace(costs.storage, write_bandwidth=inf),
        baselines=dataclasses.replace(costs.baselines, experience_forwards=0.0))


def perfect_overlap_s(result: SystemResult, rollout_only: SystemResult) -> float:
    return max(rollout_only.step_s, result.train_compute_s / len(result.trainer_slots))


def measured_windows(result: SystemResult) -> list[tuple[float, float]]:
    """(start, end] between the records of consecutive measured steps: a step's last
    micro-batch is trained before its record (its rollout's end is too early: the last
    group reaches the trainer just after it)."""
    marks = result.emits
    first, last = (1, len(marks) - 2) if len(marks) >= 3 else (0, len(marks) - 1)
    return [(marks[i - 1] if i else 0.0, marks[i]) for i in range(first, last + 1)]


def least_tail_s(preset: Any, rollout_only: SystemResult, costs: Costs) -> float:
    """Mean over the measured steps of the cheapest agent's train-last-group + optimizer step
    + weight load, priced with the real `costs` from the rollout-only run's micro-batches."""
    tails = []
    for start, end in measured_windows(rollout_only):
        last: dict[str, tuple[int, int]] = {}
        for t, agent, rows, tokens in rollout_only.micro_batches:
            if start < t <= end:
                last[agent] = (rows, tokens)
        per_agent = []
        for agent, (rows, tokens) in last.items():
            m = costs.model(preset.sizes[agent])
            published = agent in preset.lora or bool(preset.timeshare)
            per_agent.append(costs.train_s(m, m.train_devices, rows, tokens,
                                           reference=costs.reference(preset.kl_coef))
                             + costs.optimizer_s(m, m.train_devices)
                             + costs.sync_s(m, m.train_devices, published=published))
        if per_agent:
            tails.append(min(per_agent))
    return sum(tails) / len(tails) if tails else 0.0
