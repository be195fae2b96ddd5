"""LoRA adapter agents in the cluster simulator and the planner (flexmarl.sim).

(a) costs: an adapter's parameters from its rank and the targeted Linears' shapes; a LoRA
    agent's trainer state (the frozen base + the adapter's state), swap, snapshot and sync
    bytes (the adapter's), training FLOPs (no weight gradients for the base); a LoRA unit's
    instance holds one base and every member's adapter;
(b) a trainer slot swaps a LoRA agent's adapter state only, and the base when its devices
    held another model;
(c) the `lora6` preset end to end on the virtual clock: the real InstancePool with adapters,
    one unit's instances serving every adapter (each request naming it), per-adapter versions
    advancing on every instance, adapter-sized syncs and swaps, against its full-copy twin;
(d) the planner: a slot holds more adapter agents than full copies, and a team of more LoRA
    agents than devices has a placement where its full copies have none;
(e) bench/simulate.py --vs-full: adapters against full copies, the full team not fitting.
Exact byte counts; no wall-clock timing.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import math
from pathlib import Path

import pytest

from flexmarl.models.lora import LoraSpec
from flexmarl.protocol import SwapIn, SwapOut
from flexmarl.sim import clock, layouts, plan
from flexmarl.sim.cluster import plan_slots, simulate
from flexmarl.sim.costs import lora_key, load_costs
from flexmarl.sim.devices import DeviceGroup
from flexmarl.sim.engines import SimTrainer
from flexmarl.sim.presets import Preset, Stage, get_preset

ROOT = Path(__file__).resolve().parent.parent
COSTS = load_costs()
REL = 1e-12
# Qwen2.5-14B (costs.toml): hidden 5120, 40 heads x 128 = 5120 for q/o, 8 KV heads x 128 = 1024.
QKVO_14B = 48 * 16 * ((5120 + 5120) + (5120 + 1024) * 2 + (5120 + 5120))


# ----------------------------------------------------------------------------- (a) costs

def test_adapter_params_follow_rank_and_targets():
    m = COSTS.model("14b+lora16")
    assert m.is_adapter and m.base == "14b" and m.params == COSTS.model("14b").params
    assert m.adapter_params == QKVO_14B == 25_165_824
    qv = COSTS.model(lora_key("14b", 8, ("q_proj", "v_proj")))
    assert qv.adapter_params == 48 * 8 * ((5120 + 5120) + (5120 + 1024))
    mlp = COSTS.model(lora_key("32b", 4, ("gate_proj", "down_proj")))
    assert mlp.adapter_params == 64 * 4 * 2 * (5120 + 27648)
    assert COSTS.model("14b").adapter_params == 0
    # A model without its config's shapes: hidden = sqrt(params / (12 x layers)), MLP 4x.
    bare = dataclasses.replace(COSTS.models["14b"], hidden=0, intermediate=0, heads=0)
    hidden = round(math.sqrt(14.8e9 / (12 * 48)))
    assert bare.linear_shapes()["q_proj"] == (hidden, hidden // 128 * 128)
    assert bare.linear_shapes()["up_proj"] == (hidden, 4 * hidden)
    with pytest.raises(KeyError, match="lm_head"):
        COSTS.model(lora_key("14b", 16, ("lm_head",)))
    with pytest.raises(KeyError):
        COSTS.model("7b+lora16")


def test_adapter_agent_state_swap_and_sync_bytes_are_the_adapters():
    full, lora = COSTS.model("14b"), COSTS.model("14b+lora16")
    per_param = COSTS.train.state_bytes_per_param
    assert COSTS.state_bytes(full) == per_param * 14.8e9
    # Trainer: the frozen base's bf16 weights once + the adapter's full training state.
    assert COSTS.state_bytes(lora) == 2 * 14.8e9 + per_param * QKVO_14B
    # Swaps and snapshots move the adapter's state; a sync sends its bf16 weights.
    assert COSTS.swap_bytes(lora) == per_param * QKVO_14B
    assert COSTS.swap_bytes(full) == COSTS.state_bytes(full)
    assert lora.sync_bytes == 2 * QKVO_14B and full.sync_bytes == 2 * 14.8e9
    assert COSTS.weight_load_s(lora) == pytest.approx(
        COSTS.weight_load_s(full) * QKVO_14B / 14.8e9, rel=REL)
    assert COSTS.state_write_s(lora) == pytest.approx(per_param * QKVO_14B / 2e9, rel=REL)
    # Training: forward + activation gradients through the base (4), the adapter's 6.
    ratio = COSTS.train_s(lora, 8, 4, 4096) / COSTS.train_s(full, 8, 4, 4096)
    assert ratio == pytest.approx((4 * 14.8e9 + 6 * QKVO_14B) / (6 * 14.8e9), rel=REL)
    assert COSTS.optimizer_s(lora, 8) == pytest.approx(
        COSTS.optimizer_s(full, 8) * QKVO_14B / 14.8e9, rel=REL)
    # The state fits one 64 GB device where a full copy needs eight.
    assert COSTS.min_train_devices(lora) == 1 and COSTS.min_train_devices(full) == 8


def test_a_units_instance_holds_one_base_and_every_adapter():
    lora6 = get_preset("lora6")
    units = layouts.unit_models(lora6, COSTS)
    assert list(units) == ["+".join(f"role{i}" for i in range(6))]
    (unit,) = units.values()
    base = COSTS.model("14b").weight_bytes
    assert unit.served_bytes == base + 6 * 2 * QKVO_14B  # one base, six bf16 adapters
    full = layouts.unit_models(get_preset("lora6_full"), COSTS)
    assert len(full) == 6 and all(m.served_bytes == base for m in full.values())
    # Serving adapters: less KV cache (their weights) and a slower decode step.
    plain = COSTS.model("14b")
    assert COSTS.kv_capacity_tokens(unit) < COSTS.kv_capacity_tokens(plain)
    assert COSTS.decode_step_s(unit, 8, 4096) >= (COSTS.decode_step_s(plain, 8, 4096)
                                                  + COSTS.rollout.lora_step_overhead_s)


# ----------------------------------------------------------------------------- (b) swaps

def test_a_slot_swaps_adapter_state_and_keeps_the_base():
    models = {"a": COSTS.model("14b+lora16"), "b": COSTS.model("14b+lora16"),
              "full": COSTS.model("14b")}
    adapter = 16 * QKVO_14B  # its state only: 16 B per adapter parameter
    base = int(2 * 14.8e9)  # the bf16 base

    async def main() -> list[int]:
        slot = SimTrainer("t", COSTS, models, DeviceGroup("t", 8, COSTS), 8, "local://t")
        done = []

        async def swap_in(agent: str) -> None:
            done.append((await slot.on_swap_in(SwapIn(agent, "", {}), None)).num_bytes)

        async def swap_out() -> None:
            done.append((await slot.on_swap_out(SwapOut(), None)).num_bytes)
        await swap_in("a")       # fresh: the run's start-up, base and all
        await swap_out()         # a's adapter state to host memory
        await swap_in("b")       # fresh
        await swap_out()
        await swap_in("a")       # back in place: the base is still on the devices
        await swap_out()
        await swap_in("full")    # a full copy takes the devices (the base is dropped)
        await swap_out()
        await swap_in("a")       # the base comes back too
        return done

    bytes_ = clock.run(main())
    full = int(COSTS.state_bytes(models["full"]))
    assert bytes_ == [adapter, adapter, adapter, adapter, adapter, adapter, full, full,
                      adapter + base]


# ----------------------------------------------------------------------------- (c) end to end

def _run(name: str, slots: tuple[str, ...]):
    preset = dataclasses.replace(get_preset(name), shared_slots=slots, steps=4)
    return preset, simulate(preset, "flexmarl")


def test_lora_preset_runs_with_adapter_agents_sharing_instances():
    preset, r = _run("lora6", ("14b+lora16",))
    agents = list(preset.models)
    unit = "+".join(agents)
    assert r.rollout_instances == {unit: r.rollout_instances[unit]} and \
        r.rollout_instances[unit] == (64 - 16) // 2
    assert len(r.lora_instances) == r.rollout_instances[unit]
    served = {a: 0 for a in agents}
    for name, inst in r.lora_instances.items():
        assert inst["unit"] == unit
        # One instance serves the requests of several agents, each naming its adapter.
        assert sum(1 for n in inst["requests"].values() if n) >= 2, (name, inst)
        for a, n in inst["requests"].items():
            served[a] += n
    assert all(served.values()), served
    last = r.records[-1]["agents"]
    for a in agents:
        version = last[a]["version"]
        assert version >= 3  # trained (and synced) most steps, each on its own count
        # Every instance serves the agent's adapter at its version, loaded once per sync.
        assert {inst["versions"][a] for inst in r.lora_instances.values()} == {version}
        assert {inst["loads"][a] for inst in r.lora_instances.values()} == {version}
    # A sync sends the adapter only (bf16), once per trained step.
    synced = [rec["agents"][a]["sync_bytes"] for rec in r.records for a in agents
              if rec["agents"][a]["sync_bytes"]]
    assert synced and set(synced) == {2 * QKVO_14B}
    # The only base on the slot is theirs: every swap is one adapter's state (swap_bytes is
    # per measured step: all steps but the first and the last).
    swapped = r.swap_bytes * (len(r.records) - 2)
    assert r.swaps and swapped > 0 and swapped % (16 * QKVO_14B) == 0 and r.moves == 0
    assert r.state_bytes == {a: 2 * 14.8e9 + 16 * QKVO_14B for a in agents}
    assert r.rollout_weight_bytes == r.rollout_instances[unit] * (2 * 14.8e9 + 12 * QKVO_14B)


def test_lora_preset_moves_fewer_bytes_than_full_copies():
    _, lora = _run("lora6", ("14b+lora16",))
    _, full = _run("lora6_full", ("14b",))
    assert sum(full.rollout_instances.values()) == 6 * ((64 - 16) // 6 // 2)
    assert not full.lora_instances
    assert lora.sync_bytes * 100 < full.sync_bytes
    assert lora.swap_bytes * 100 < full.swap_bytes
    assert lora.swap_in_s + lora.swap_out_s < (full.swap_in_s + full.swap_out_s) / 100
    assert lora.train_compute_s < full.train_compute_s
    assert max(lora.state_bytes.values()) * 7 < max(full.state_bytes.values())


# ----------------------------------------------------------------------------- (d) planner

def test_a_slot_holds_more_adapter_agents_than_full_copies():
    for devices, states in ((8, 1), (16, 3)):  # 409.6 / 236.8 GB, 819.2 / 236.8 GB
        full = plan.slot_capacity(COSTS, "14b", devices)
        lora = plan.slot_capacity(COSTS, "14b+lora16", devices)
        assert full == states and lora > 100 * full
    # One device: no full 14B state, one base and many adapters.
    assert plan.slot_capacity(COSTS, "14b", 1) == 0
    room = 64e9 * 0.8 - 2 * 14.8e9
    assert plan.slot_capacity(COSTS, "14b+lora16", 1) == int(room // (16 * QKVO_14B))


def test_planner_places_more_lora_agents_than_devices():
    names = tuple(f"a{i}" for i in range(20))
    team = Preset("many", "20 adapter agents on one node", {a: "14b" for a in names},
                  (Stage(names, median=32, prompt=256, pick=(2, 2)),), nodes=1,
                  tasks_per_step=1, trajectories_per_task=2, steps=3, tasks=4,
                  lora={a: LoraSpec(rank=8) for a in names})
    placements = plan_slots(team, costs=COSTS)
    best = placements[0]
    assert best.result is not None and best.result.step_s > 0
    devices = COSTS.device.devices_per_node
    assert len(names) > devices
    used = best.rollout_devices + sum(plan.slot_devices(COSTS, best))
    assert used <= devices
    described = plan.describe(team, COSTS, best)
    assert list(described["instances"]) == ["+".join(names)]
    assert all(c >= len(names) for c in described["slot_capacity"])
    assert all(not p.timeshare for p in placements)  # the product does not time-share them
    # The same team as full copies: twenty instances of two devices and an 8-device slot.
    with pytest.raises(ValueError, match="no placement"):
        plan_slots(dataclasses.replace(team, lora={}), costs=COSTS)


# ----------------------------------------------------------------------------- the bench

def test_bench_compares_adapters_with_full_copies(capsys):
    spec = importlib.util.spec_from_file_location("bench_simulate",
                                                  ROOT / "bench" / "simulate.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = bench.main(["--preset", "lora6", "--vs-full", "--systems", "flexmarl", "--nodes",
                      "1", "--steps", "3"])
    printed = capsys.readouterr().out
    lora = out["adapters"]["systems"]["flexmarl"]
    assert lora["sync_bytes"] > 0 and lora["sync_bytes"] % (2 * QKVO_14B) == 0
    assert list(lora["instance_bytes"]) == ["+".join(f"role{i}" for i in range(6))]
    # Six full 14B copies need six 2-device instances and an 8-device slot: not on 16 devices.
    assert out["full"]["systems"] == {} and "no placement" in out["full"]["infeasible"][
        "flexmarl"]
    assert "flexmarl               adapters" in printed and "does not fit" in printed


def test_flexmarl_plan_plans_a_users_lora_team():
    from flexmarl.checks import ConfigError
    from flexmarl.config.load import load_config
    from flexmarl.protocol import SamplingParams
    from flexmarl.sim.team_plan import plan_team
    from flexmarl.tasks import addition_tasks
    from flexmarl.team import AgentSpec, Team

    def team_of(lora: LoraSpec | None) -> Team:
        async def workflow(ctx, task):
            for i in range(10):
                await ctx.generate(f"a{i}", task.prompt)
            ctx.team_reward(0.5)
        return Team(name="ten", workflow=workflow, tasks=addition_tasks(8, seed=0), agents=[
            AgentSpec(name=f"a{i}", model="Qwen2.5-14B-Instruct", lora=lora,
                      sampling=SamplingParams(max_tokens=64)) for i in range(10)])

    config = load_config(overrides=["plan.nodes=1", "plan.response_tokens=32", "plan.steps=3"])
    preset, costs, placements = plan_team(team_of(LoraSpec(rank=8, target_modules=(
        "q_proj", "v_proj"))), config)
    unit = "+".join(f"a{i}" for i in range(10))
    assert preset.units == {unit: [f"a{i}" for i in range(10)]}
    assert set(preset.sizes.values()) == {"14b+lora8:q_proj,v_proj"}
    best = placements[0]
    assert list(plan.instances(preset, costs, best)) == [unit]
    assert best.result.rollout_instances[unit] >= 1
    # Ten full 14B copies need ten instances of two devices and an 8-device slot.
    with pytest.raises(ConfigError, match="no placement"):
        plan_team(team_of(None), config)
