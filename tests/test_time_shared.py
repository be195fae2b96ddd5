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
