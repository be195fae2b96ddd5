"""The cluster simulator (flexmarl.sim): virtual clock, cost model, simulated engines, and the
product's scheduling code running on them.

Layers:
(a) the virtual-time loop alone: hours of sleeps in milliseconds, flexmarl.clock.now() on it,
    a deadlock reported instead of hanging;
(b) cost model and engines against hand-computed service times (exact up to float rounding,
    REL = 1e-9), continuous batching, colocated mode switches;
(c) whole systems on the `small` preset (under a second each): determinism across processes
    with different hash seeds, zero staleness in flexmarl, one version in one_step_off, and a
    change to a policy object changing the simulated result.
"""
from __future__ import annotations

import asyncio
import dataclasses
import importlib.util
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flexmarl.clock import now
from flexmarl.config.balance import BalancerConfig
from flexmarl.orchestrator.policy import make_pipeline
from flexmarl.protocol import SamplingParams
from flexmarl.sim import clock
from flexmarl.sim.cluster import SYSTEMS, compare, simulate
from flexmarl.sim.costs import load_costs
from flexmarl.sim.devices import DeviceGroup
from flexmarl.sim.engines import SimRolloutEngine
from flexmarl.sim.presets import PRESETS, get_preset

ROOT = Path(__file__).resolve().parent.parent
REL = 1e-9
COSTS = load_costs()


# ----------------------------------------------------------------------------- virtual clock

def test_virtual_loop_jumps_to_the_next_timer():
    async def main():
        async def sleeper(hours: float) -> float:
            await asyncio.sleep(hours * 3600)
            return now()
        finished = await asyncio.gather(*(sleeper(h) for h in (3, 1, 2)))
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(asyncio.Event().wait(), 60)
        return finished, now()

    started = time.perf_counter()
    finished, end = clock.run(main())
    assert finished == [3 * 3600.0, 3600.0, 2 * 3600.0]
    assert end == 3 * 3600.0 + 60
    assert time.perf_counter() - started < 2.0  # three simulated hours, not real ones


def test_virtual_loop_reports_a_deadlock():
    async def main():
        await asyncio.Event().wait()  # nobody will ever set it

    with pytest.raises(clock.SimulationStalled, match="deadlock"):
        clock.run(main(), stall_s=0.05)


def test_now_is_real_time_outside_the_simulator():
    async def main():
        return now()

    before = time.perf_counter()
    assert asyncio.run(main()) >= before


# ----------------------------------------------------------------------------- cost model

def test_cost_model_overrides_and_errors():
    costs = load_costs(**{"train.mfu": 0.5})
    assert costs.train.mfu == 0.5
    with pytest.raises(ValueError, match="no parameter 'train.nope'"):
        load_costs(**{"train.nope": 1})


def test_decode_step_grows_with_the_kv_read_and_is_compute_bound_at_scale():
    m = COSTS.models["14b"]
    one = COSTS.decode_step_s(m, 1, 1000)
    assert COSTS.decode_step_s(m, 8, 8 * 4000) > one
    d, r = COSTS.device, COSTS.rollout
    memory = (m.weight_bytes + m.kv_bytes_per_token * 1000) / (
        m.rollout_devices * d.hbm_bandwidth * r.decode_bandwidth_efficiency)
    assert one == pytest.approx(memory + r.decode_step_overhead_s, rel=REL)


# ----------------------------------------------------------------------------- engines

def _engine(group: DeviceGroup | None = None) -> SimRolloutEngine:
    m = COSTS.models["14b"]
    return SimRolloutEngine(COSTS, m, group or DeviceGroup("g", 2, COSTS), agent_of=lambda: "a")


def test_one_sequence_takes_prefill_plus_its_decode_steps():
    """Exact: no other sequence, so the step time changes only with the sequence's own KV."""
    engine = _engine()
    params = SamplingParams(max_tokens=300, seed=1)
    prompt = [100] + [7] * 99

    async def main():
        await engine.start()
        [length] = engine.lengths(prompt, params)
        samples, _ = await engine.generate(prompt, params)
        return length, samples, now()

    length, samples, took = clock.run(main())
    assert len(samples[0].token_ids) == length
    m, seg = COSTS.models["14b"], COSTS.rollout.segment_tokens
    expected, done = COSTS.prefill_s(m, len(prompt)), 0
    while done < length:  # the engine re-evaluates the step time every segment
        tokens = min(seg, length - done)
        expected += tokens * COSTS.decode_step_s(m, 1, len(prompt) + done)
        done += tokens
    assert took == pytest.approx(expected, rel=REL)
    assert engine.group.active_device_s == pytest.approx(2 * took, rel=REL)


def test_batching_serves_many_sequences_nearly_as_fast_as_one():
    engine = _engine()
    params = SamplingParams(max_tokens=64, seed=3)

    async def run(prompts: int) -> float:
        await engine.start()
        await asyncio.gather(*(engine.generate([50, 7, 7], dataclasses.replace(params, seed=3))
                               for _ in range(prompts)))
        return now()

    alone, together = clock.run(run(1)), clock.run(run(16))
    assert alone < together < 2 * alone  # 16 at once in less than twice the time of one


def test_lengths_are_seeded_long_tailed_and_capped():
    engine = _engine()
    params = SamplingParams(n=2000, max_tokens=8192, seed=5)
    lengths = engine.lengths([256], params)
    assert lengths == engine.lengths([256], params)
    ordered = sorted(lengths)
    assert 200 <= ordered[1000] <= 320  # median around the prompt's 256
    assert ordered[1980] > 5 * 256  # a long tail (p99 ~ 10x the median)
    assert max(lengths) <= 8192


def test_colocated_group_serves_one_mode_at_a_time_and_pays_each_switch():
    """Each mode holds 25 GB: the first switch loads it (from nothing), the next one puts it
    back to host memory and loads the other's (both ways at the host copy rate)."""
    group = DeviceGroup("g", 16, COSTS, colocated=True, resident_bytes=lambda mode: 25e9)
    log = []

    async def use(mode, seconds):
        await group.acquire(mode)
        log.append(("start", mode, now()))
        await asyncio.sleep(seconds)
        log.append(("end", mode, now()))
        group.release(mode)

    async def main():
        await asyncio.gather(use(("rollout", "a"), 5), use(("train", "a"), 1),
                             use(("rollout", "a"), 2))

    clock.run(main())
    one = COSTS.host_transfer_s(25e9, 16)
    assert one == pytest.approx(25e9 / (COSTS.host_rate(16) * COSTS.links.swap_host_efficiency))
    # Both rollout requests run together after the first switch; training waits for both,
    # then switches (out, then in).
    assert [(e, m) for e, m, _ in log] == [
        ("start", ("rollout", "a")), ("start", ("rollout", "a")), ("end", ("rollout", "a")),
        ("end", ("rollout", "a")), ("start", ("train", "a")), ("end", ("train", "a"))]
    times = [t for *_, t in log]
    assert times == pytest.approx([one, one, one + 2, one + 5, 3 * one + 5, 3 * one + 6],
                                  rel=REL)
    assert group.switches == 2 and group.switch_s == pytest.approx(3 * one, rel=REL)


# ----------------------------------------------------------------------------- systems

@pytest.fixture(scope="module")
def small() -> dict:
    return compare("small")


def test_small_preset_runs_every_system_in_seconds(small):
    assert set(small["systems"]) == set(SYSTEMS)
    for name, r in small["systems"].items():
        assert r["step_s"] > 0 and r["tokens_per_s"] > 0, name
        assert 0 < r["utilisation"] < 1, name
    # Mechanisms did what they are: moves only with hierarchical balancing, swaps only with
    # fewer slots than agents (or colocated), switches only colocated (mas_rl, marti).
    s = small["systems"]
    assert s["flexmarl"]["moves"] > 0 and s["flexmarl-no_balance"]["moves"] == 0
    assert s["flexmarl"]["swaps"] > 0 and s["flexmarl-no_pool"]["swaps"] == 0
    assert s["mas_rl"]["switches"] > 0 and s["marti"]["switches"] > 0
    assert s["sync_static"]["switches"] == 0
    # Checkpoints are priced for no system; the +snapshots row pays the product's snapshots.
    assert s["flexmarl+snapshots"]["snapshot_s"] > 0 and s["flexmarl+snapshots"]["write_s"] > 0
    assert s["flexmarl"]["snapshot_s"] == s["flexmarl"]["write_s"] == 0
    assert s["sync_static"]["snapshot_s"] == s["marti"]["write_s"] == 0


def test_no_system_beats_the_perfect_overlap_bound(small):
    """Exact (virtual time, no tolerance): each system's step is at least its own layout's
    perfect-overlap bound, so at least the preset's (the least of them)."""
    b = small["bounds"]
    assert b["perfect_overlap_s"] == min(r["perfect_overlap_s"]
                                         for r in small["systems"].values())
    for name, r in small["systems"].items():
        assert r["step_s"] >= r["perfect_overlap_s"] >= b["perfect_overlap_s"] > 0, name
        assert r["gap_to_perfect_overlap"] >= 0, name
    # The zero-staleness bound adds a positive tail to FlexMARL's rollout-only step.
    assert b["zero_staleness_s"] > b["rollout_only_s"]["shared/hierarchical/flexmarl"]


def test_marti_broadcasts_one_agent_after_another():
    """MARTI's driver loads each agent's engines in turn: one agent's instances together,
    the next agent's after them (flexmarl.sim.cluster's `marti` row)."""
    driver = DeviceGroup("driver", 0, COSTS, colocated=True, resident_bytes=lambda mode: 0.0)
    engines = [_engine() for _ in range(3)]
    for engine, agent in zip(engines, ("a", "a", "b")):
        engine.agent_of = lambda agent=agent: agent
        engine.broadcasts = driver
    ends = {}

    async def load(k):
        await engines[k].load_weights({})
        ends[k] = now()

    async def main():
        await asyncio.gather(*(load(k) for k in range(3)))

    clock.run(main())
    m = COSTS.models["14b"]  # its actor's ZeRO-3 gather (16 ranks), then CUDA IPC
    one = COSTS.gather_s(m, m.train_devices) + COSTS.local_weight_load_s(m)
    assert ends[0] == ends[1] == pytest.approx(one, rel=REL)
    assert ends[2] == pytest.approx(2 * one, rel=REL)


def test_pipeline_guarantees_hold_in_simulation():
    flex = simulate("small", "flexmarl")
    off = simulate("small", "one_step_off")
    for rec in flex.records:
        for name, a in rec["agents"].items():
            assert a["trained_samples"] > 0, (rec["step"], name)
            assert set(a["staleness_hist"]) == {"0"}, (rec["step"], name)
    for rec in off.records[1:]:
        for a in rec["agents"].values():
            assert set(a["staleness_hist"]) == {"1"}


def test_changing_a_policy_object_changes_the_result():
    """The simulator runs the product's code: a different PipelinePolicy or BalancerConfig
    object (the ones `flexmarl run` builds from its config) gives another schedule."""
    base = simulate("small", "flexmarl")
    no_stream = simulate("small", "flexmarl",
                         policy=dataclasses.replace(make_pipeline("micro_batch"), stream=False))
    assert no_stream.step_s != base.step_s
    assert no_stream.steps != base.steps
    never_move = simulate("small", "flexmarl", balance=BalancerConfig(ratio=1e9))
    assert never_move.moves == 0 and base.moves > 0
    # Without the cost test every imbalance over the ratio moves an instance.
    eager = simulate("small", "flexmarl", balance=BalancerConfig(cost_aware=False))
    assert eager.moves > base.moves
    assert eager.step_s != base.step_s  # (the per-record times are set by the one slot's swaps)


def test_same_seed_same_table_across_processes():
    """Two processes with different hash seeds print the same JSON (modulo wall time). They
    run at once: the suite's time is mostly their imports."""
    procs = [subprocess.Popen(
        [sys.executable, "bench/simulate.py", "--preset", "small", "--json", "--steps", "3",
         "--systems", "marti,flexmarl"], cwd=ROOT, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONHASHSEED": hash_seed})
        for hash_seed in ("1", "2")]
    outs = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=300)
        assert proc.returncode == 0, stderr[-2000:]
        out = json.loads(stdout.strip().splitlines()[-1])
        out.pop("wall_s")
        outs.append(out)
    assert outs[0] == outs[1]
    for name in ("marti", "flexmarl"):
        for key in ("step_s", "tokens_per_s", "utilisation"):
            assert math.isfinite(outs[0]["systems"][name][key])
    assert set(outs[0]["bounds"]) >= {"perfect_overlap_s", "zero_staleness_s"}


def _bench_simulate():
    """bench/simulate.py as a module: its main() in this process (no second torch import)."""
    spec = importlib.util.spec_from_file_location("bench_simulate", ROOT / "bench" / "simulate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_different_seed_gives_a_different_workload():
    assert simulate("small", "marti", seed=1).steps != simulate("small", "marti").steps


def test_presets_and_bench_errors(capsys):
    assert {"merchant", "category", "5x32b", "3x32b_7x14b", "15x14b"} <= set(PRESETS)
    with pytest.raises(ValueError, match="unknown preset"):
        get_preset("nope")
    with pytest.raises(ValueError, match="unknown system"):
        simulate("small", "nope")
    with pytest.raises(SystemExit) as exit_:
        _bench_simulate().main(["--preset", "small", "--set", "train.nope=1"])
    assert exit_.value.code == 2 and "no parameter 'train.nope'" in capsys.readouterr().err


def test_a_layout_that_does_not_fit_is_reported_not_run():
    """On 3 nodes a dedicated 16-device slot per agent leaves no rollout device: those systems
    are listed as not fitting, with the reason; the others still run."""
    preset = dataclasses.replace(get_preset("small"), nodes=3)
    out = compare(preset, ["sync_static", "flexmarl"])
    assert "add nodes" in out["infeasible"]["sync_static"]
    assert set(out["systems"]) == {"flexmarl"}
