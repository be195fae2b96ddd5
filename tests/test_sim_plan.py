"""The placement planner (flexmarl.sim.plan): what it tries, what it returns, what it writes.

(a) the search alone, with a stand-in simulation (pure, milliseconds): on random small teams
    (hypothesis, deterministic) the placement returned is no slower than each placement the
    planner guarantees to try that the product runs here: MARTI's layout run by FlexMARL's loop
    (time-shared, equal split; on GPU only with allow_unverified) in each zero-staleness mode,
    one disaggregated slot per agent, and the best's variants without overlap or balancing
    (what the ablations remove); refused placements (unverified, the Ray launcher's, the
    inexpressible) are ranked last, never chosen, the fastest of them reported;
(b) the real simulator on the `small` preset: planned on the plan seeds, reported on another
    (an overlap refused), every planner simulation on a plan seed, marti-lean split by the
    demand measured there; `compare` runs FlexMARL's rows on the chosen placement and says per
    row whether its placement is expressible; the product config it writes ([devices]
    placement, [trainer_pool], [pipeline]).
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
from flexmarl.sim.layouts import build, split_by_demand
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
       nodes=st.integers(2, 8), seed=st.integers(0, 1000), allow=st.booleans())
def test_the_plan_is_no_slower_than_each_placement_it_guarantees(models, nodes, seed, allow):
    """Among the placements the product runs here (time-shared GPU ones only with
    allow_unverified); those it refuses come last and are never chosen."""
    preset = Preset("t", "random team", {f"a{i}": m for i, m in enumerate(models)}, (),
                    nodes=nodes)
    fake = _fake(seed)
    deployment = plan.Deployment(allow_unverified=allow)
    try:
        placements = plan.plan(preset, COSTS, fake, deployment=deployment)
    except ValueError as e:  # nothing fits (or only what is refused): the message says so
        assert "add nodes" in str(e)
        return
    best = placements[0]
    assert not best.refused and plan.expressible(best)
    allowed = [p for p in placements if not p.refused]
    assert placements[:len(allowed)] == allowed  # the refused ones last
    for part in (allowed, placements[len(allowed):]):
        assert [p.step_s for p in part] == sorted(p.step_s for p in part)
    assert all(p.refused == plan.refusal(p, deployment) for p in placements)
    assert allow or not any(p.timeshare for p in allowed)  # unverified: time-shared on GPU
    assert plan.plan(preset, COSTS, fake, deployment=deployment) == placements  # deterministic
    fixed = [plan.Placement((), 0.0, 0, "least_loaded", pipeline=mode,
                            timeshare=tuple((a,) for a in preset.models))
             for mode in ("micro_batch", "sync")]  # FlexMARL's loop in MARTI's layout
    fixed += [dataclasses.replace(best, pipeline="sync"),  # what the ablations remove
              dataclasses.replace(best, balance="round_robin")]
    one_each = tuple(sorted(models, key=lambda m: -COSTS.models[m].train_devices))
    if plan.fits(preset, COSTS, one_each):
        fixed.append(plan.Placement(one_each, 0.0, 0, "hierarchical"))
    for p in fixed:
        if plan.refusal(p, deployment):
            continue
        try:
            step = fake(plan.preset_of(preset, p), p.balance, p.pipeline).step_s
        except ValueError:  # does not fit this cluster
            continue
        assert best.step_s <= step, (p, best)


def test_groups_are_dealt_by_demand_and_sized_to_hold_their_states():
    demand = {"a": 5.0, "b": 4.0, "c": 3.0, "d": 1.0}
    assert plan._deal(list(demand), demand, 2) == (("a", "d"), ("b", "c"))
    preset = Preset("t", "", {"a": "32b", "b": "14b", "c": "14b", "d": "14b"}, (), nodes=4)
    devices = split_by_demand(preset, COSTS, (("a", "d"), ("b", "c")), demand)
    assert sum(devices) == 64 and devices[0] >= 16 and devices[1] >= 8
    assert split_by_demand(dataclasses.replace(preset, nodes=1), COSTS,
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


def test_the_planner_picks_the_fastest_it_runs_and_flexmarl_runs_it(small_auto):
    """Planned on seed 100 (PLAN_SEEDS), reported on seed 0; time-shared candidates are
    simulated but refused (unverified on GPU), the fastest of them reported if faster."""
    preset, placements, out = small_auto
    # Disaggregated: every count of shared slots at 16 and 8 devices; time-shared per agent
    # (equal, MARTI's layout) in both zero-staleness modes; one group of all three.
    assert {(len(p.slots), (p.train_devices or {}).get("14b", 16)) for p in placements
            if not p.timeshare} == {(k, n) for k in (1, 2, 3) for n in (16, 8)}
    assert {(p.pipeline, p.timeshare_devices) for p in placements if p.kind == "time_shared"} \
        >= {("micro_batch", None), ("sync", None)}
    assert any(p.kind == "grouped" for p in placements)
    assert all(p.refused == plan.UNVERIFIED for p in placements if p.timeshare)
    assert all(not p.refused for p in placements if not p.timeshare)
    best = placements[0]
    assert not best.timeshare and best.step_s == min(p.step_s for p in placements
                                                     if not p.refused)
    system = dataclasses.replace(SYSTEMS["flexmarl"], balance=best.balance,
                                 pipeline=best.pipeline)
    laid_out = plan.preset_of(preset, best)
    assert best.step_s == simulate(laid_out, system, seed=100).step_s  # the plan's seed
    s = out["systems"]
    assert (out["seed"], out["plan_seeds"]) == (0, [100])
    assert s["flexmarl"]["step_s"] == simulate(laid_out, system, seed=0).step_s  # reported
    assert out["planned"]["placement"] == plan.placement_key(best)
    assert out["planned"]["expressible"] and out["planned"]["refused"] == ""
    faster = [p for p in placements if p.refused and p.step_s < best.step_s]
    if faster:
        assert out["would_have_picked"]["refused"] == plan.UNVERIFIED
        assert out["would_have_picked"]["step_s"] == min(p.step_s for p in faster)
    else:
        assert out["would_have_picked"] is None
    # Every row says its placement and whether FlexMARL's config can say it.
    for name, r in s.items():
        assert isinstance(r["expressible"], bool) and r["placement"], name
    assert s["marti"]["expressible"] and s["sync_static"]["expressible"]
    assert not s["mas_rl"]["expressible"]
    # No system beats its own layout's perfect-overlap bound (exact, virtual time).
    for name, r in s.items():
        assert r["step_s"] >= r["perfect_overlap_s"] * (1 - 1e-9), name


def test_plan_seeds_and_reported_seeds_cannot_overlap(capsys):
    preset = dataclasses.replace(get_preset("small"), shared_slots="auto")
    with pytest.raises(ValueError, match="include the reported seed 100"):
        compare(preset, ["flexmarl"], seed=100, plan_seeds=(99, 100))
    with pytest.raises(ValueError, match="include the reported seed 0"):
        simulate(preset, "flexmarl", plan_seeds=(0,))
    with pytest.raises(SystemExit) as exit_:
        _bench().main(["--preset", "small", "--seed", "7", "--plan-seeds", "5-8"])
    assert exit_.value.code == 2 and "include --seed 7" in capsys.readouterr().err


def test_the_plan_uses_only_the_plan_seeds(monkeypatch):
    """Every simulation the planner runs is on a plan seed; every reported row on the
    reported seed; marti-lean's devices are split by the demand measured on the plan seeds."""
    from flexmarl.sim import cluster
    seen: list[tuple[bool, int]] = []
    planning = [False]
    real_simulate, real_plan = cluster.simulate, plan.plan

    def spy(*args, seed=0, **kwargs):
        seen.append((planning[0], seed))
        return real_simulate(*args, seed=seed, **kwargs)

    def planner(*args, **kwargs):
        planning[0] = True
        try:
            return real_plan(*args, **kwargs)
        finally:
            planning[0] = False

    monkeypatch.setattr(cluster, "simulate", spy)
    monkeypatch.setattr(plan, "plan", planner)
    preset = dataclasses.replace(get_preset("small"), shared_slots="auto")
    out = compare(preset, ["flexmarl", "marti-lean"], steps=3, seed=1, plan_seeds=(7, 8))
    assert {s for inside, s in seen if inside} == {7, 8}
    assert {s for inside, s in seen if not inside} == {1}
    # Each candidate's step is the mean over both plan seeds.
    best = out["planned"]
    system = dataclasses.replace(SYSTEMS["flexmarl"], balance=best["balance"],
                                 pipeline=best["pipeline"])
    chosen = next(p for p in plan_slots(preset, costs=COSTS, steps=3, seeds=(7, 8))
                  if plan.describe(preset, COSTS, p) == best)
    steps = [real_simulate(plan.preset_of(preset, chosen), system, steps=3, seed=s).step_s
             for s in (7, 8)]
    assert best["step_s"] == pytest.approx(sum(steps) / 2, rel=1e-12)
    demand = plan.agent_demand(preset, COSTS, chosen)
    devices = split_by_demand(preset, COSTS, (("planner",), ("worker",), ("writer",)), demand)
    assert out["systems"]["marti-lean"]["placement"].startswith(
        f"per agent, {'+'.join(map(str, devices))} devices")


def _fast_time_sharing(preset: Preset, strategy: str, pipeline: str) -> SimpleNamespace:
    """A stand-in simulation in which time-shared placements are the fastest."""
    build(preset, SYSTEMS["flexmarl"], COSTS)  # a ValueError where it does not fit
    step = 10.0 if preset.timeshare else 50.0 + len(preset.shared_slots)
    return SimpleNamespace(step_s=step + ORDER_COST[strategy], records=[{"agents": {
        a: {"tokens": 100} for a in preset.models}}],
        rollout_instances={a: 1 for a in preset.models})


ORDER_COST = {"hierarchical": 0.0, "least_loaded": 0.1, "round_robin": 0.2}


def test_unverified_time_sharing_is_refused_by_default_and_chosen_with_the_opt_in():
    preset = Preset("t", "three agents", {"a": "14b", "b": "14b", "c": "14b"}, (), nodes=4)
    default = plan.plan(preset, COSTS, _fast_time_sharing)
    assert not default[0].timeshare and not default[0].refused
    other = plan.would_have(default)
    assert other.timeshare and other.refused == plan.UNVERIFIED and other.step_s < 11
    assert "would have picked ts 3x21" in plan.table(preset, COSTS, default)
    allowed = plan.plan(preset, COSTS, _fast_time_sharing,
                        deployment=plan.Deployment(allow_unverified=True))
    assert allowed[0].timeshare and plan.would_have(allowed) is None
    ray = plan.plan(preset, COSTS, _fast_time_sharing,
                    deployment=plan.Deployment(allow_unverified=True, launcher="ray"))
    assert not ray[0].timeshare and plan.would_have(ray).refused == plan.RAY_REFUSES
    cpu = plan.plan(preset, COSTS, _fast_time_sharing, deployment=plan.Deployment(gpu=False))
    assert cpu[0].timeshare  # time-shared on CPU has run: no opt-in needed


def test_an_inexpressible_placement_is_never_chosen():
    """Time-shared groups of different sizes: no config says them. The planner does not
    try them, and one that is faster than the rest is still ranked after every placement the
    product runs, whatever the deployment allows."""
    preset = Preset("t", "three agents", {"a": "14b", "b": "14b", "c": "14b"}, (), nodes=4)
    placements = plan.plan(preset, COSTS, _fast_time_sharing,
                           deployment=plan.Deployment(allow_unverified=True, gpu=False))
    assert all(plan.expressible(p) for p in placements)
    assert all(p.timeshare_devices is None for p in placements if p.timeshare)
    unequal = plan.Placement((), 1.0, 64, "least_loaded", timeshare=(("a",), ("b",), ("c",)),
                             timeshare_devices=(24, 20, 20))
    assert not plan.expressible(unequal)
    anything = plan.Deployment(allow_unverified=True, gpu=False)
    assert plan.refusal(unequal, anything) == plan.UNEQUAL_GROUPS
    ranked = sorted([dataclasses.replace(unequal, refused=plan.refusal(unequal, anything)),
                     *placements], key=plan.rank)
    assert ranked[0] is placements[0] and ranked[-1].timeshare_devices == (24, 20, 20)


def _bench():
    import importlib.util
    from pathlib import Path
    root = Path(__file__).resolve().parent.parent
    spec = importlib.util.spec_from_file_location("bench_simulate", root / "bench/simulate.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


def test_bench_json_says_per_system_whether_its_placement_is_expressible(capsys):
    import json
    bench = _bench()
    bench.main(["--preset", "small", "--steps", "3", "--systems", "marti,marti-lean,flexmarl",
                "--json"])
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert set(out["systems"]) == {"marti", "marti-lean", "flexmarl"}
    assert all(isinstance(r["expressible"], bool) for r in out["systems"].values())
    assert out["pricing"] == "new" and out["kl_coef"] == 0.0


def test_bench_plan_writes_the_placement(tmp_path, capsys):
    bench = _bench()
    path = tmp_path / "plan.toml"
    bench.main(["--preset", "small", "--plan", "--steps", "3", "--write", str(path)])
    assert "placements of small on 4 nodes" in capsys.readouterr().out
    written = path.read_text()
    assert "[devices]\nplacement = " in written and "[trainer_pool]" in written
    assert "[balance]\nstrategy = " in written and "[pipeline]\nmode = " in written
