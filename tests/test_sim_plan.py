"""The placement planner (flexmarl.sim.plan): what it tries, what it returns, what it writes.

(a) the search alone, with a stand-in simulation (pure, milliseconds): on random small teams
    (hypothesis, deterministic) the placement returned is no slower than each placement the
    planner guarantees to try: MARTI's layout run by FlexMARL's loop (time-shared, equal
    split) in each zero-staleness mode, one disaggregated slot per agent, and the best's
    variants without overlap or balancing (what the ablations remove);
(b) the real simulator on the `small` preset: the best is the fastest simulated and `compare`
    runs FlexMARL's rows on it, no slower than MARTI, its own loop in MARTI's layout, or any
    ablation; the product config it writes ([devices] placement, [trainer_pool], [pipeline]).
"""
from __future__ import annotations

import dataclasses
import zlib
from types import SimpleNamespace

import pytest
from hypothesis import given, settings, strategies as st

from flexmarl.sim import plan
from flexmarl.sim.cluster import SYSTEMS, compare, plan_slots, simulate
from flexmarl.sim.costs import load_costs
from flexmarl.sim.layouts import build
from flexmarl.sim.presets import Preset, get_preset

COSTS = load_costs()


def _fake(seed: int):
    """A stand-in simulation: a step time drawn from the candidate's layout, mode and
    balancing (any ranking at all), with per-agent tokens for the demand splits."""
    def simulate(preset: Preset, strategy: str, pipeline: str) -> SimpleNamespace:
        build(preset, SYSTEMS["flexmarl"], COSTS)  # a ValueError where it does not fit
        key = repr((preset.shared_slots, sorted((preset.train_devices or {}).items()),
                    sorted((preset.instances or {}).items()), preset.timeshare,
                    preset.timeshare_devices, strategy, pipeline, seed))
        step = 50.0 + zlib.crc32(key.encode()) % 1000 / 10.0
        tokens = {a: 100 + zlib.crc32(f"{a}{seed}".encode()) % 900 for a in preset.models}
        return SimpleNamespace(step_s=step, records=[{"agents": {a: {"tokens": n} for a, n
                                                                   in tokens.items()}}],
                               rollout_instances={a: 1 for a in preset.models})
    return simulate


@settings(max_examples=25, deadline=None, derandomize=True)
@given(models=st.lists(st.sampled_from(["14b", "32b"]), min_size=2, max_size=5),
       nodes=st.integers(2, 8), seed=st.integers(0, 1000))
def test_the_plan_is_no_slower_than_each_placement_it_guarantees(models, nodes, seed):
    preset = Preset("t", "random team", {f"a{i}": m for i, m in enumerate(models)}, (),
                    nodes=nodes)
    fake = _fake(seed)
    try:
        placements = plan.plan(preset, COSTS, fake)
    except ValueError as e:  # nothing fits: the message names the fix
        assert "add nodes" in str(e)
        return
    best = placements[0]
    assert [p.step_s for p in placements] == sorted(p.step_s for p in placements)
    assert plan.plan(preset, COSTS, fake) == placements  # deterministic
    fixed = [plan.Placement((), 0.0, 0, "least_loaded", pipeline=mode,
                            timeshare=tuple((a,) for a in preset.models))
             for mode in ("micro_batch", "sync")]  # FlexMARL's loop in MARTI's layout
    fixed += [dataclasses.replace(best, pipeline="sync"),  # what the ablations remove
              dataclasses.replace(best, balance="round_robin")]
    one_each = tuple(sorted(models, key=lambda m: -COSTS.models[m].train_devices))
    if plan.fits(preset, COSTS, one_each):
        fixed.append(plan.Placement(one_each, 0.0, 0, "hierarchical"))
    for p in fixed:
        try:
            step = fake(plan.preset_of(preset, p), p.balance, p.pipeline).step_s
        except ValueError:  # does not fit this cluster
            continue
        assert best.step_s <= step, (p, best)


def test_groups_are_dealt_by_demand_and_sized_to_hold_their_states():
    demand = {"a": 5.0, "b": 4.0, "c": 3.0, "d": 1.0}
    assert plan._deal(list(demand), demand, 2) == (("a", "d"), ("b", "c"))
    preset = Preset("t", "", {"a": "32b", "b": "14b", "c": "14b", "d": "14b"}, (), nodes=4)
    devices = plan._group_devices(preset, COSTS, (("a", "d"), ("b", "c")), demand)
    assert sum(devices) == 64 and devices[0] >= 16 and devices[1] >= 8
    assert plan._group_devices(dataclasses.replace(preset, nodes=1), COSTS,
                               (("a",), ("b",), ("c",), ("d",)), demand) is None


def test_placement_keys_and_config():
    per_agent = plan.Placement((), 70.0, 64, "least_loaded", pipeline="sync",
                               timeshare=(("planner",), ("worker",), ("writer",)))
    grouped = dataclasses.replace(per_agent, timeshare=(("planner", "writer"), ("worker",)),
                                  timeshare_devices=(40, 24))
    assert plan.placement_key(per_agent) == "time_shared"
    assert plan.placement_key(grouped) == "planner+writer=time_shared,worker=time_shared"
    assert plan.placement_key(plan.Placement(("14b",), 1.0, 48)) == "disaggregated"
    preset = get_preset("small")
    text = plan.placement_toml(preset, COSTS, grouped)
    assert '[devices]\nplacement = "planner+writer=time_shared,worker=time_shared"' in text
    assert "slots = 0" in text and "planner+writer 40, worker 24" in text
    assert '[pipeline]\nmode = "sync"' in text
    assert 'ranks_per_agent = 21' in plan.placement_toml(preset, COSTS, per_agent)


@pytest.fixture(scope="module")
def small_auto() -> tuple[Preset, list[plan.Placement], dict]:
    preset = dataclasses.replace(get_preset("small"), shared_slots="auto")
    return preset, plan_slots(preset, costs=COSTS), compare(preset)


def test_the_planner_picks_the_fastest_and_flexmarl_runs_it(small_auto):
    preset, placements, out = small_auto
    # Disaggregated: every count of shared slots at 16 and 8 devices; time-shared per agent
    # (equal, MARTI's layout) in both zero-staleness modes; one group of all three.
    assert {(len(p.slots), (p.train_devices or {}).get("14b", 16)) for p in placements
            if not p.timeshare} == {(k, n) for k in (1, 2, 3) for n in (16, 8)}
    assert {(p.pipeline, p.timeshare_devices) for p in placements if p.kind == "time_shared"} \
        >= {("micro_batch", None), ("sync", None)}
    assert any(p.kind == "grouped" for p in placements)
    best = placements[0]
    assert best.step_s == min(p.step_s for p in placements)
    system = dataclasses.replace(SYSTEMS["flexmarl"], balance=best.balance,
                                 pipeline=best.pipeline)
    assert best.step_s == simulate(plan.preset_of(preset, best), system).step_s
    s = out["systems"]
    assert s["flexmarl"]["step_s"] == best.step_s
    assert out["planned"]["placement"] == plan.placement_key(best)
    for rival in ("marti", "marti-lean", "flexmarl-no_pipeline", "flexmarl-no_balance",
                  "flexmarl-no_pool", "flexmarl-no_timeshare"):
        assert s["flexmarl"]["step_s"] <= s[rival]["step_s"], rival
    # Its own loop in MARTI's layout (time-shared per agent, equal split), as planned.
    marti_layout = [p for p in placements
                    if p.kind == "time_shared" and p.timeshare_devices is None]
    assert s["flexmarl"]["step_s"] <= min(p.step_s for p in marti_layout)
    # No system beats its own layout's perfect-overlap bound (exact, virtual time).
    for name, r in s.items():
        assert r["step_s"] >= r["perfect_overlap_s"] * (1 - 1e-9), name


def test_bench_plan_writes_the_placement(tmp_path, capsys):
    import importlib.util
    from pathlib import Path
    root = Path(__file__).resolve().parent.parent
    spec = importlib.util.spec_from_file_location("bench_simulate", root / "bench/simulate.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    path = tmp_path / "plan.toml"
    bench.main(["--preset", "small", "--plan", "--steps", "3", "--write", str(path)])
    assert "placements of small on 4 nodes" in capsys.readouterr().out
    written = path.read_text()
    assert "[devices]\nplacement = " in written and "[trainer_pool]" in written
    assert "[balance]\nstrategy = " in written and "[pipeline]\nmode = " in written
