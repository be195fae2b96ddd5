"""Planning a user's own team on a cluster (flexmarl.sim.team_plan): `flexmarl plan` and
trainer_pool.slots = "auto".

From pure pieces (a model's size read from its name, median answer lengths, the [plan]
section's checks) to the planner over a real team file (deterministic, best first), the
command line (table, --write that `flexmarl run` reads back, --json, errors that name the
fix), and a real run whose slots are planned at start. Simulated times are virtual: nothing
here depends on the machine's speed.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from flexmarl import AgentSpec, SamplingParams, Team
from flexmarl.checks import ConfigError
from flexmarl.config.load import load_config
from flexmarl.sim import plan
from flexmarl.sim.costs import load_costs
from flexmarl.sim.team_plan import medians, model_sizes, plan_team, resolve_auto
from flexmarl.tasks import addition_tasks
from flexmarl.team import load_team

ROOT = Path(__file__).resolve().parent.parent
MATH_DUO = str(ROOT / "agents" / "math_duo.py")
SIZES = "plan.models=solver=14b,checker=32b"


def team(*models: str, max_tokens: int = 64) -> Team:
    async def workflow(ctx, task):
        for i in range(len(models)):
            await ctx.generate(f"a{i}", task.prompt)
        ctx.team_reward(0.5)
    return Team(name="t", workflow=workflow, tasks=addition_tasks(16, seed=0), agents=[
        AgentSpec(name=f"a{i}", model=m, sampling=SamplingParams(max_tokens=max_tokens))
        for i, m in enumerate(models)])


def test_an_agents_size_is_read_from_its_model_name_or_given():
    costs = load_costs()
    t = team("/models/Qwen2.5-14B-Instruct", "qwen2.5-32b", "small")
    assert model_sizes(t, costs, "a2=14b") == {"a0": "14b", "a1": "32b", "a2": "14b"}
    assert model_sizes(t, costs, "a0=32b,a2=32b")["a0"] == "32b"  # given wins
    with pytest.raises(ConfigError, match=r"agent a2's model 'small' .*plan\.models"):
        model_sizes(t, costs)
    with pytest.raises(ConfigError, match=r"agent a2's size '7b' is not one of .*14b, 32b"):
        model_sizes(t, costs, "a2=7b")
    with pytest.raises(ConfigError, match=r"plan.models names zz, not an agent of team t"):
        model_sizes(t, costs, "zz=14b")


def test_median_answer_lengths():
    t = team("a", "b", max_tokens=100)
    assert medians(t) == {"a0": 25.0, "a1": 25.0}  # a quarter of max_tokens
    assert medians(t, "300") == {"a0": 300.0, "a1": 300.0}
    assert medians(t, "a1=40") == {"a0": 25.0, "a1": 40.0}


@pytest.mark.parametrize("key,value,message", [
    ("plan.nodes", "-1", "plan.nodes must be >= 0"),
    ("plan.steps", "2", "plan.steps must be >= 3"),
    ("plan.models", "solver", "plan.models must be comma-separated AGENT=VALUE pairs"),
    ("plan.response_tokens", "solver=x", "plan.response_tokens must give positive numbers"),
    ("plan.response_tokens", "0", "plan.response_tokens must be a positive number"),
    ("trainer_pool.slots", "many", 'trainer_pool.slots must be >= 0 .* or "auto"'),
])
def test_plan_settings_are_checked(key, value, message):
    with pytest.raises(ConfigError, match=message):
        load_config(overrides=[f"{key}={value}"])


def test_the_planner_is_deterministic_and_lists_the_best_first():
    config = load_config(overrides=[SIZES, "plan.nodes=6", "plan.response_tokens=128"],
                         team=MATH_DUO)
    duo = load_team(config.team.path)
    preset, costs, placements = plan_team(duo, config)
    assert preset.models == {"solver": "14b", "checker": "32b"} and preset.nodes == 6
    steps = [p.step_s for p in placements]
    assert steps == sorted(steps)
    assert {len(p.slots) for p in placements if not p.timeshare} == {1, 2}
    assert {p.kind for p in placements} == {"disaggregated", "time_shared", "grouped"}
    assert {p.balance for p in placements} == {"hierarchical", "least_loaded", "round_robin"}
    # One shared slot swaps two states per step: a slot each, or time-sharing, is faster.
    assert len(placements[0].slots) != 1
    again = [p.step_s for p in plan_team(duo, config)[2]]
    assert again == steps  # virtual time: identical, not close

    resolved = resolve_auto(load_config(overrides=[SIZES, "plan.nodes=6", "plan.response_tokens"
                                                   "=128", "trainer_pool.slots=auto"]), duo)
    assert resolved.trainer_pool.slots == 0  # as many slots as agents: one each, no swaps
    assert resolved.balance.strategy == placements[0].balance
    assert resolved.devices.placement == plan.placement_key(placements[0])
    assert resolved.pipeline.mode == placements[0].pipeline
    assert resolve_auto(config, duo) is config  # nothing to plan


def test_too_few_nodes_is_one_error_naming_the_fix():
    # One node: the 32B agent's smallest slot (16 devices) leaves no rollout device.
    config = load_config(overrides=[SIZES, "plan.nodes=1"], team=MATH_DUO)
    with pytest.raises(ConfigError, match=r"no placement .*add nodes"):
        plan_team(load_team(config.team.path), config)


@pytest.mark.parametrize("settings,placement", [
    (["trainer.device=cuda"], "disaggregated"),                     # unverified: refused
    (["trainer.device=cuda", "devices.allow_unverified=true"], "time_shared"),
    (["trainer.device=cuda", "devices.allow_unverified=true", "cluster.launcher=ray"],
     "disaggregated"),                                               # Ray refuses it at start
    (["trainer.device=cpu"], "time_shared"),                         # time-shared on CPU has run
])
def test_auto_slots_write_a_time_shared_gpu_placement_only_when_allowed(monkeypatch, caplog,
                                                                        settings, placement):
    """trainer_pool.slots = "auto" with a stand-in simulation in which time-sharing is the
    fastest: the run's deployment (trainer.device, devices.allow_unverified, the launcher)
    decides what may be written; the log says what it would have picked and why not."""
    from types import SimpleNamespace

    from flexmarl.sim import team_plan
    from flexmarl.sim.layouts import build
    from flexmarl.sim.cluster import SYSTEMS

    def fast_time_sharing(preset, strategy, pipeline):
        build(preset, SYSTEMS["flexmarl"], load_costs())
        return SimpleNamespace(step_s=(10.0 if preset.timeshare else 50.0),
                               records=[], rollout_instances={a: 1 for a in preset.models})

    monkeypatch.setattr(team_plan, "plan_slots", lambda preset, system, *, costs, progress,
                        deployment, **_: plan.plan(preset, costs, fast_time_sharing, progress,
                                                   deployment=deployment))
    config = load_config(overrides=[SIZES, "plan.nodes=6", "trainer_pool.slots=auto",
                                    *settings], team=MATH_DUO)
    resolved = resolve_auto(config, load_team(config.team.path))
    assert resolved.devices.placement == placement
    if placement == "disaggregated":
        assert "would have picked ts 2x48" in caplog.text


def _plan(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flexmarl.launch.cli", "plan", *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=240)


@pytest.mark.slow
def test_flexmarl_plan_prints_writes_and_errs(tmp_path):
    out_file = tmp_path / "planned.toml"
    done = _plan("--team", MATH_DUO, "--nodes", "2", "--set", SIZES.replace("32b", "14b"),
                 "--write", str(out_file), "--json")
    assert done.returncode == 0, done.stderr
    assert "rollout devices" in done.stdout and "empty answer" in done.stdout
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["nodes"] == 2 and report["models"] == {"solver": "14b", "checker": "14b"}
    # 2 nodes: one 16-device slot, or one or two of 8 devices (the fewest for a 14B state);
    # two 16-device slots would leave no rollout device.
    tried = {(p["slots"], tuple(p["slot_devices"])) for p in report["placements"]
             if p["placement"] == "disaggregated"}
    assert tried == {(1, (16,)), (1, (8,)), (2, (8, 8))}
    assert "time_shared" in {p["placement"] for p in report["placements"]}
    best = report["placements"][0]
    assert best["slots"] != 1  # one shared slot swaps 14B states: slower
    written = load_config(str(out_file))  # the user's config with the placement: runnable
    assert written.trainer_pool.slots == 0  # a slot per agent, or time-shared groups
    assert written.devices.placement == best["placement"]
    assert written.balance.strategy == best["balance"]
    assert written.pipeline.mode == best["pipeline"]
    counts = set(best["instances"].values())
    if len(counts) == 1:  # an equal split is written as rollout.instances_per_agent
        assert written.rollout.instances_per_agent == counts.pop()
    else:  # a split by demand is for AgentSpec.instances in the team file: listed, not written
        assert written.rollout.instances_per_agent == 1
        assert "AgentSpec.instances" in done.stdout
    # 16 rollout devices beside the slots (32 time-shared), 2 per 14B instance
    assert sum(best["instances"].values()) * 2 <= (16 if best["placement"] == "disaggregated"
                                                   else 32)
    assert written.team.path == MATH_DUO

    bad = _plan("--team", MATH_DUO)  # the built-in "small" model has no cluster size
    assert bad.returncode == 2 and "set plan.models" in bad.stderr, bad.stderr


async def test_a_run_with_auto_slots_trains_on_the_planned_pool(tiny_model_dir, tmp_path,
                                                               no_leftover_children):
    """1 node fits one 14B slot (8 devices) beside rollout: the run shares one trainer slot
    between its two agents, swapping their states, and still updates both every step."""
    from flexmarl.launch.run import train
    from tests.helpers.teams import duo

    config = load_config(overrides=[
        "run.steps=2", "rollout.backend=torch", "pipeline.tasks_per_step=2",
        "pipeline.trajectories_per_task=2", "trainer.lr=1e-3", "observe.dashboard=false",
        "trainer_pool.slots=auto", "plan.nodes=1", "plan.models=solver=14b,checker=14b"])
    result = await train(duo(tiny_model_dir), config, progress=False)
    assert [m["step"] for m in result.metrics] == [0, 1]
    assert sum(len(m["swaps"]) for m in result.metrics) > 0  # one slot, two agents
    assert result.versions == {"solver": 2, "checker": 2}
