"""How the simulator prices what each system's code does (flexmarl/sim/costs.toml, layouts.py).

The cost files load and every number carries its source; the GPU-measured default and the
CPU-calibrated profile differ only in the swap path's efficiencies; a host transfer is priced
per device with the node's host memory as the cap; mode switches pay both ways; MARTI's
experience pass adds time in proportion to the step's samples; time-shared groups run the
product's own arbiter (flexmarl.placement.timeshare).
"""
from __future__ import annotations

import dataclasses
import re

import pytest

from flexmarl.sim.cluster import SYSTEMS, simulate
from flexmarl.sim.costs import PROFILES, load_costs
from flexmarl.sim.layouts import build
from flexmarl.sim.presets import get_preset

GPU = load_costs()
CPU = load_costs("cpu-calibrated")
REL = 1e-9


def test_every_number_in_the_cost_files_says_where_it_comes_from():
    """A `key = number` line has a comment on it, or continues a commented block."""
    for path in PROFILES.values():
        lines = path.read_text().splitlines()
        for i, line in enumerate(lines):
            if re.match(r"\s*\w+\s*=\s*[-+0-9.e]+\s*(#.*)?$", line):
                assert "#" in line or lines[i - 1].lstrip().startswith("#"), \
                    f"{path.name}:{i + 1}: {line!r} has no source"


def test_the_profiles_differ_only_in_the_swap_path():
    assert GPU.name == "gpu" and CPU.name == "cpu-calibrated"
    assert dataclasses.replace(CPU.links, swap_host_efficiency=GPU.links.swap_host_efficiency,
                               swap_move_efficiency=GPU.links.swap_move_efficiency) == GPU.links
    assert (CPU.device, CPU.train, CPU.models) == (GPU.device, GPU.train, GPU.models)
    assert (CPU.links.swap_host_efficiency, CPU.links.swap_move_efficiency) == (0.2, 0.1)
    assert load_costs(PROFILES["gpu"]) == GPU


def test_host_copies_are_per_device_with_the_node_memory_as_cap():
    """PCIe 5.0 x16 per device at the measured pinned-copy fraction (nvbandwidth ~55 GB/s),
    a node's host memory shared: a 32B state (16 B/param) on its two-node slot moves in well
    under the paper's ~11 s on the GPU pricing, and 0.87/0.2 times that on the CPU one."""
    link = GPU.links
    assert link.host_link_per_device * link.swap_host_efficiency == pytest.approx(55e9, rel=0.01)
    assert GPU.host_rate(2) == 2 * link.host_link_per_device          # link-bound
    assert GPU.host_rate(16) == link.host_memory_per_node              # memory-bound
    assert GPU.host_rate(32) == 2 * GPU.host_rate(16)                   # nodes in parallel
    m = GPU.models["32b"]
    state = GPU.state_bytes(m)
    seconds = GPU.host_transfer_s(state, m.train_devices)
    assert seconds == pytest.approx(state / (2 * link.host_memory_per_node * 0.87), rel=REL)
    assert seconds < 1.0
    assert CPU.host_transfer_s(state, 32) == pytest.approx(seconds * 0.87 / 0.2, rel=REL)
    assert GPU.move_s(state, 16, 32) == pytest.approx(
        state / (16 * link.rdma_per_device * link.swap_move_efficiency), rel=REL)
    w = GPU.models["14b"]
    assert GPU.weight_load_s(w) == pytest.approx(
        w.weight_bytes / (2 * link.rdma_per_device * link.link_efficiency), rel=REL)
    assert GPU.local_weight_load_s(w) < GPU.weight_load_s(w)  # NVLink beats a rail


def test_a_switch_pays_both_ways():
    assert GPU.switch_s(10e9, 30e9, 16) == pytest.approx(
        GPU.offload_s(10e9, 16) + GPU.onload_s(30e9, 16), rel=REL)
    assert GPU.switch_s(0.0, 30e9, 16) < GPU.switch_s(10e9, 30e9, 16)


def _marti(system: str = "marti", *, kl_coef: float = 0.0, pricing: str = "new",
           **costs_overrides) -> object:
    costs = (load_costs(**costs_overrides) if costs_overrides else GPU).with_pricing(pricing)
    preset = dataclasses.replace(get_preset("small"), kl_coef=kl_coef)
    return simulate(preset, system, costs=costs, steps=3)


def test_martis_experience_pass_is_priced_per_sample():
    """Forwards of every agent over every sample, agent after agent: its actor's (1, the
    default), and its reference model's where the comparison's kl_coef > 0 (one setting for
    every system; pricing "old": always). Without it (0 forwards) the step is shorter, and each
    forward adds the same time again (the workload is seeded: same samples)."""
    none = _marti(**{"baselines.experience_forwards": 0})
    one = _marti(**{"baselines.experience_forwards": 1})
    two = _marti(**{"baselines.experience_forwards": 2})
    assert none.step_s < one.step_s < two.step_s
    assert _marti().step_s == one.step_s                      # kl_coef = 0: the actor's only
    assert _marti(kl_coef=0.01).step_s == two.step_s          # and the reference's
    assert _marti(pricing="old").step_s > one.step_s          # old: the reference always
    assert two.step_s - one.step_s == pytest.approx(one.step_s - none.step_s, rel=1e-6)
    # What the pass costs per step: 2 x params x tokens / (devices x peak x mfu) per agent
    # and forward, every agent over every sample.
    preset = get_preset("small")
    layout = build(preset, SYSTEMS["marti"], GPU)
    devices = layout.slots["trainer-0"][0]
    m = GPU.models["14b"]
    tokens_per_step = (two.step_s - one.step_s) / (len(preset.models) * GPU.forward_s(m, devices, 1))
    assert 1e4 < tokens_per_step < 1e6
    # Each agent over its own samples only (marti-lean's judgement) costs less.
    lean = dataclasses.replace(SYSTEMS["marti"], name="own", experience="own")
    assert simulate("small", lean, steps=3).step_s < two.step_s


def test_time_shared_groups_run_the_products_arbiter_with_zero_staleness():
    """FlexMARL time-shared per agent (MARTI's layout, its own loop): the groups are the
    product's TimeShare, switches are paid, every sample trained is zero stale."""
    preset = dataclasses.replace(get_preset("small"), timeshare=(("planner",), ("worker",),
                                                                 ("writer",)))
    layout = build(preset, SYSTEMS["flexmarl"], GPU)
    assert all(g.share is not None for g in layout.groups)
    assert layout.static and len(layout.slots) == 3
    result = simulate(preset, dataclasses.replace(SYSTEMS["flexmarl"], balance="least_loaded"),
                      steps=3)
    assert result.switches > 0
    for rec in result.records:
        for a in rec["agents"].values():
            assert set(a["staleness_hist"]) == {"0"}
    # Grouped: the planner and the writer share one group (one slot each on its devices).
    grouped = dataclasses.replace(preset, timeshare=(("planner", "writer"), ("worker",)),
                                  timeshare_devices=(32, 32))
    two = build(grouped, SYSTEMS["flexmarl"], GPU)
    assert [g.devices for g in two.groups] == [32, 32]
    assert two.slots["trainer-0"][1] is two.slots["trainer-2"][1]
    assert simulate(grouped, dataclasses.replace(SYSTEMS["flexmarl"], balance="least_loaded"),
                    steps=3).step_s > 0


def test_a_time_shared_group_must_hold_its_agents_state():
    """A 14B state (237 GB) in 80% of 4 x 64 GB does not fit; in 6 devices it does."""
    preset = dataclasses.replace(get_preset("small"), nodes=1,
                                 timeshare=(("planner",), ("worker",), ("writer",)),
                                 timeshare_devices=(4, 6, 6))
    with pytest.raises(ValueError, match="no training state of agent planner"):
        build(preset, SYSTEMS["flexmarl"], GPU)
    assert build(dataclasses.replace(preset, timeshare_devices=(6, 6, 6), nodes=2),
                 SYSTEMS["flexmarl"], GPU).ranks == {"planner": 6, "worker": 6, "writer": 6}
