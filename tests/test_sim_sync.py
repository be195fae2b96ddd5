"""Weight syncs and reference forwards as the simulator prices them since issue 54 (pricing
"new"), against hand computations, and the old pricing kept beside them.

(a) the prices alone (flexmarl/sim/costs.py): the trainer's gather, the direct broadcast from one
    rail, the published path (the trainer's publish once, each instance's fetch and load),
    the reference forward, MARTI's experience forwards;
(b) each price where the simulator pays it: an engine's read and load (a time-shared engine on
    the trainer's host, one on another host, a direct receiver, a moved instance), a trainer
    slot's export, the layout's remote receivers;
(c) whole runs on `small`: the old pricing as before, one KL setting for every system.
Exact up to float rounding (REL); no wall-clock timing.
"""
from __future__ import annotations

import asyncio
import dataclasses

import pytest

from flexmarl.clock import now
from flexmarl.protocol import ExportWeights
from flexmarl.sim import clock
from flexmarl.sim.cluster import SYSTEMS, simulate
from flexmarl.sim.costs import load_costs
from flexmarl.sim.devices import DeviceGroup
from flexmarl.sim.engines import SimRolloutEngine, SimTrainer
from flexmarl.sim.layouts import build
from flexmarl.sim.presets import get_preset

GPU = load_costs()
OLD = GPU.with_pricing("old")
REL = 1e-9
M14, M32 = GPU.models["14b"], GPU.models["32b"]
W14 = 2 * 14.8e9  # bf16 weights of the 14B model (costs.toml: 14.8 B parameters)
NVLINK, RAIL, EFF = 450e9, 50e9, 0.9  # costs.toml [links]
PCIE, PINNED, NODE_MEMORY, WRITE = 63e9, 0.87, 460e9, 11.8e9


# ----------------------------------------------------------------------------- (a) prices

def test_the_gather_is_an_all_gather_over_nvlink_in_a_node_and_the_rails_across():
    assert GPU.gather_s(M14, 16) == pytest.approx(W14 * 15 / 16 / (NVLINK * EFF), rel=REL)
    assert GPU.gather_s(M14, 32) == pytest.approx(W14 * 31 / 32 / (RAIL * EFF), rel=REL)
    assert GPU.gather_s(M14, 1) == 0.0


def test_the_direct_broadcast_is_one_rail_whatever_the_receivers():
    assert GPU.broadcast_s(M14) == pytest.approx(W14 / (RAIL * EFF), rel=REL)
    assert GPU.broadcast_s(M32) == pytest.approx(2 * 32.8e9 / (RAIL * EFF), rel=REL)
    # Before: each instance over its own devices' rails, two for a 14B instance, no gather.
    assert GPU.weight_load_s(M14) == pytest.approx(W14 / (2 * RAIL * EFF), rel=REL)


def test_the_published_path_publishes_once_then_each_instance_fetches_and_loads():
    gather = W14 * 15 / 16 / (NVLINK * EFF)
    assert GPU.publish_s(M14, 16) == pytest.approx(
        gather + W14 / (PCIE * PINNED) + W14 / WRITE, rel=REL)
    # Three instances on other hosts share the trainer host's rail: each waits for all.
    assert GPU.fetch_s(M14, 3) == pytest.approx(3 * W14 / (RAIL * EFF), rel=REL)
    # A 2-device instance: its two PCIe links (126 GB/s) against its devices' share of the
    # node's host memory (2/16 of 460 GB/s): the memory limits.
    assert GPU.host_load_s(M14) == pytest.approx(W14 / (NODE_MEMORY * 2 / 16 * PINNED), rel=REL)
    assert GPU.sync_s(M14, 16, published=True) == pytest.approx(
        GPU.publish_s(M14, 16) + GPU.fetch_s(M14, 1) + GPU.host_load_s(M14), rel=REL)
    assert GPU.sync_s(M14, 16, published=False) == pytest.approx(
        gather + W14 / (RAIL * EFF), rel=REL)
    assert OLD.sync_s(M14, 16, published=True) == GPU.weight_load_s(M14)
    # An adapter's bytes only (a LoRA agent's versions are published).
    lora = GPU.model("14b+lora16")
    assert GPU.fetch_s(lora, 1) == pytest.approx(lora.adapter_bytes / (RAIL * EFF), rel=REL)


def test_the_reference_forward_and_marti_s_experience_forwards_follow_one_kl_setting():
    plain = GPU.train_s(M14, 16, 4, 4096)
    assert GPU.train_s(M14, 16, 4, 4096, reference=True) == pytest.approx(
        plain * (6 + 2) / 6, rel=REL)
    assert GPU.reference(0.01) and not GPU.reference(0.0) and not OLD.reference(0.01)
    assert GPU.experience_forwards(0.0) == 1.0   # the actor's
    assert GPU.experience_forwards(0.01) == 2.0  # and the reference's
    assert OLD.experience_forwards(0.0) == 2.0   # before: the reference always
    with pytest.raises(ValueError, match="unknown pricing"):
        GPU.with_pricing("newer")


# ----------------------------------------------------------------------------- (b) where paid

def _engine(costs=GPU, **attrs) -> SimRolloutEngine:
    engine = SimRolloutEngine(costs, M14, DeviceGroup("g", 16, costs), agent_of=lambda: "a")
    for key, value in attrs.items():
        setattr(engine, key, value)
    return engine


def _sync(engine: SimRolloutEngine, agent: str = "a") -> tuple[float, float]:
    """(read done, load done) of one published update naming `agent`'s version."""
    async def main():
        await engine.read_published({"agent": agent, "num_bytes": int(W14)})
        read = now()
        await engine.load_weights({})
        return read, now()
    return clock.run(main())


def test_an_engine_pays_its_part_of_its_path():
    # A time-shared (published) engine on the trainer's host: the file is mapped, then loaded.
    assert _sync(_engine(sync_path="published")) == pytest.approx(
        (0.0, GPU.host_load_s(M14)), rel=REL)
    # On another host, one of four there: its share of the trainer host's rail, then the load.
    read = GPU.fetch_s(M14, 4)
    assert _sync(_engine(sync_path="published", remote_receivers=4)) == pytest.approx(
        (read, read + GPU.host_load_s(M14)), rel=REL)
    # A direct receiver: the broadcast, its gate closed (the gather is the trainer's).
    assert _sync(_engine()) == pytest.approx((0.0, GPU.broadcast_s(M14)), rel=REL)
    # A moved instance (another agent's version) of a direct agent: its trainer publishes
    # the version on demand, the instance fetches it alone, then loads it; the next version
    # of that agent is an ordinary sync.
    moved = _engine()
    read = GPU.publish_s(M14, 16) + GPU.fetch_s(M14, 1)
    assert _sync(moved, "b") == pytest.approx((read, read + GPU.host_load_s(M14)), rel=REL)
    assert moved.serving == "b"
    assert _sync(moved, "b") == pytest.approx((0.0, GPU.broadcast_s(M14)), rel=REL)
    # The old pricing: everything in the load, over the instance's rails (NVLink when
    # time-shared).
    assert _sync(_engine(OLD)) == pytest.approx((0.0, OLD.weight_load_s(M14)), rel=REL)
    assert _sync(_engine(OLD, time_shared=True, sync_path="published")) == pytest.approx(
        (0.0, OLD.local_weight_load_s(M14)), rel=REL)


@pytest.mark.parametrize("costs,how,expected", [
    (GPU, "published", GPU.publish_s(M14, 16)),
    (GPU, "direct", GPU.gather_s(M14, 16)),
    (GPU, "marti", 0.0),  # its engines pay the gather in its broadcast
    (OLD, "published", 0.0),
])
def test_a_trainer_slot_pays_the_gather_or_the_publish_at_export(costs, how, expected):
    group = DeviceGroup("slot", 16, costs)
    trainer = SimTrainer("t", costs, {"a": M14}, group, 16, "local://t", sync={"a": how})
    trainer.agent, trainer.version = "a", 3

    async def main():
        update = await trainer.on_export(ExportWeights(), None)
        return update, now()

    update, took = clock.run(main())
    assert took == pytest.approx(expected, rel=REL) and trainer.sync_s == took
    assert update.source == {"path": "sim://a/3", "agent": "a", "num_bytes": int(W14)}


def test_a_time_shared_group_s_instances_off_the_trainer_s_host_fetch_the_version():
    """Two groups of 32 devices (two nodes each), 16 instances of 2 devices per agent: the
    trainer's rank 0 is on the group's first node, so 8 instances map the file and 8 fetch it,
    sharing the rail; the trainers publish (MARTI's broadcast, equal split, is its own)."""
    preset = dataclasses.replace(get_preset("small"), nodes=4, models={"a": "14b", "b": "14b"},
                                 timeshare=(("a",), ("b",)))
    layout = build(preset, SYSTEMS["flexmarl"], GPU)
    engines = [e for _, e in layout.instances["a"]]
    assert len(engines) == 16 and all(e.sync_path == "published" for e in engines)
    assert [e.remote_receivers for e in engines] == [0] * 8 + [8] * 8
    assert layout.sync == {"a": "published", "b": "published"}
    marti = build(dataclasses.replace(preset, timeshare=()), SYSTEMS["marti"], GPU)
    assert marti.sync == {"a": "marti", "b": "marti"}
    assert all(e.broadcasts is not None and e.trainer_devices == 32
               for e in (e for _, e in marti.instances["a"]))
    disaggregated = build(dataclasses.replace(preset, timeshare=(), shared_slots=("14b",)),
                          SYSTEMS["flexmarl"], GPU)
    assert disaggregated.sync == {} and all(
        e.sync_path == "direct" for _, e in disaggregated.instances["a"])


# ----------------------------------------------------------------------------- (c) runs

def test_a_kl_coefficient_is_priced_for_every_system_alike():
    """kl_coef > 0: FlexMARL's trainer runs the reference forward (its training grows by
    2/6 of the micro-batches' FLOPs), MARTI's experience pass gets its second forward; the
    old pricing charged MARTI always and FlexMARL never."""
    small = get_preset("small")
    kl = dataclasses.replace(small, kl_coef=0.01)
    flex, flex_kl = (simulate(p, "flexmarl", steps=3) for p in (small, kl))
    assert flex_kl.train_compute_s > flex.train_compute_s
    old = [simulate(p, "flexmarl", steps=3, costs=OLD).train_compute_s for p in (small, kl)]
    # The old pricing charges no reference forward; kl_coef > 0 still trains more (groups of
    # equal rewards carry the KL gradient: orchestrator/batch.py trains them), never less.
    assert old[1] >= old[0] and flex_kl.train_compute_s > old[1]
    marti, marti_kl = (simulate(p, "marti", steps=3).step_s for p in (small, kl))
    assert marti_kl > marti


def test_the_old_pricing_is_kept_side_by_side():
    """Pricing "old" pays no gather and no publish; "new" pays them on every sync."""
    old = simulate("small", "sync_static", steps=3, costs=OLD)
    new = simulate("small", "sync_static", steps=3)
    assert old.sync_s == 0.0 and new.sync_s > 0.0
    assert old.sync_bytes == new.sync_bytes  # the same versions, other prices
    assert old.step_s != new.step_s


def test_a_trainer_export_waits_for_its_time_shared_devices():
    """In a time-shared group the publish runs in the agent's train mode (the trainer's
    devices), after the rollout that holds them."""
    group = DeviceGroup("g", 16, GPU).time_shared(("a",))
    group.resident_bytes = lambda mode: 0.0
    trainer = SimTrainer("t", GPU, {"a": M14}, group, 16, "local://t",
                         sync={"a": "published"})
    trainer.agent = "a"

    async def main():
        async def rollout():
            await group.acquire(("rollout", "a"))
            await asyncio.sleep(5.0)
            group.release(("rollout", "a"))
        task = asyncio.ensure_future(rollout())
        await asyncio.sleep(0)
        await trainer.on_export(ExportWeights(), None)
        await task
        return now()

    assert clock.run(main()) == pytest.approx(5.0 + GPU.publish_s(M14, 16), rel=REL)
