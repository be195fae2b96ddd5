"""The torch rollout engine serves several LoRA adapters on one base model: each request through
its own adapter (or the base), in mixed batches, exactly as that adapter alone and as PEFT's own
model computes it; an adapter reloads in place without touching the others."""
from __future__ import annotations

import asyncio

import pytest
import torch

from flexmarl.models import build_model_dir, chat_prompt, load_tokenizer
from flexmarl.models.lora import LoraSpec
from flexmarl.protocol import SamplingParams
from flexmarl.rollout.engine import EngineConfig
from flexmarl.rollout.torch_engine import TorchEngine
from tests.helpers.lora import ENGINE_SPEC, random_adapter

AGENTS = ("solver", "checker", "critic")
PEFT_LOGPROB_ATOL = 1e-5
"""Engine (batched, KV cache, left padding) vs PEFT's model on the one prompt, float32: what
the engine's own batching docstring allows (sums in another order), well below what a wrong
adapter gives (tests below see differences of ~1e-1 between adapters)."""


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    return str(build_model_dir("tiny", tmp_path_factory.mktemp("tiny") / "model", seed=0))


@pytest.fixture
async def engine(model_dir):
    engine = TorchEngine(EngineConfig(model_dir=model_dir, max_model_len=256, seed=3,
                                      adapters=AGENTS, max_lora_rank=8, max_loras=3))
    await engine.start()
    yield engine
    await engine.close()


def prompts(model_dir: str) -> list[list[int]]:
    tok = load_tokenizer(model_dir)
    return [chat_prompt(tok, q) for q in ("Compute 12+34.", "What is 7 plus 8?", "Add 9 and 1.")]


GREEDY = SamplingParams(temperature=0.0, max_tokens=8, prompt_logprobs=True)


def peft_prompt_logprobs(model, prompt: list[int]) -> torch.Tensor:
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt])).logits[0, :-1].float()
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(prompt[1:])[:, None])[:, 0]


async def test_each_request_goes_through_its_own_adapter_in_one_mixed_batch(engine, model_dir):
    asked = prompts(model_dir)
    base = [await engine.generate(p, GREEDY) for p in asked]
    # Adapters not loaded yet are the base (PEFT's B starts at 0): the same, bit for bit.
    assert [await engine.generate(p, GREEDY, "solver") for p in asked] == base
    models = {}
    for i, agent in enumerate(AGENTS):
        models[agent], tensors = random_adapter(model_dir, seed=i)
        await engine.load_adapter(agent, tensors, ENGINE_SPEC.as_dict())
    jobs = [(agent, p) for p in asked for agent in (*AGENTS, None)]
    alone = [await engine.generate(p, GREEDY, agent) for agent, p in jobs]
    before = engine.batches
    together = await asyncio.gather(*[engine.generate(p, GREEDY, agent) for agent, p in jobs])
    assert engine.batches - before == 1, "the test meant one mixed batch"
    for (agent, p), (a, a_lp), (b, b_lp) in zip(jobs, alone, together):
        assert [s.token_ids for s in a] == [s.token_ids for s in b]
        assert b_lp == pytest.approx(a_lp, abs=PEFT_LOGPROB_ATOL)
        expected = peft_prompt_logprobs(models[agent], p) if agent else None
        if agent:  # what PEFT's own model of that adapter gives: the on-policy exactness
            assert torch.tensor(b_lp) == pytest.approx(expected, abs=PEFT_LOGPROB_ATOL)
    # The adapters really differ from each other and from the base (the test can fail).
    lps = {agent: together[i][1] for i, (agent, _) in enumerate(jobs[:4])}
    for x in AGENTS:
        for y in (*AGENTS, None):
            if x != y:
                assert max(abs(u - v) for u, v in zip(lps[x], lps[y])) > 1e-2


async def test_an_adapter_reloads_in_place_and_the_others_stay(engine, model_dir):
    asked = prompts(model_dir)[:1]
    for i, agent in enumerate(AGENTS):
        await engine.load_adapter(agent, random_adapter(model_dir, seed=i)[1],
                                  ENGINE_SPEC.as_dict())
    before = {a: await engine.generate(asked[0], GREEDY, a) for a in AGENTS}
    new_model, new_tensors = random_adapter(model_dir, seed=99)
    await engine.load_adapter("checker", new_tensors, ENGINE_SPEC.as_dict())
    after = {a: await engine.generate(asked[0], GREEDY, a) for a in AGENTS}
    assert after["solver"] == before["solver"] and after["critic"] == before["critic"]
    assert after["checker"] != before["checker"]
    assert torch.tensor(after["checker"][1]) == pytest.approx(
        peft_prompt_logprobs(new_model, asked[0]), abs=PEFT_LOGPROB_ATOL)


async def test_an_adapter_of_another_shape_is_rebuilt(engine, model_dir):
    prompt = prompts(model_dir)[0]
    other = LoraSpec(rank=8, alpha=4, target_modules=("o_proj",))
    model, tensors = random_adapter(model_dir, seed=5, spec=other)
    await engine.load_adapter("critic", random_adapter(model_dir, seed=1)[1], ENGINE_SPEC.as_dict())
    await engine.load_adapter("critic", tensors, other.as_dict())
    _, lp = await engine.generate(prompt, GREEDY, "critic")
    assert torch.tensor(lp) == pytest.approx(peft_prompt_logprobs(model, prompt),
                                             abs=PEFT_LOGPROB_ATOL)


async def test_bad_adapters_are_refused_by_name(engine, model_dir):
    prompt = prompts(model_dir)[0]
    with pytest.raises(ValueError, match=r"no LoRA adapter 'judge'.*serves \['solver'"):
        await engine.generate(prompt, GREEDY, "judge")
    wide = LoraSpec(rank=16, alpha=16)
    with pytest.raises(ValueError, match="rank 16 is above .* max_lora_rank 8"):
        await engine.load_adapter("solver", random_adapter(model_dir, 0, wide)[1], wide.as_dict())
    missing = LoraSpec(rank=4, alpha=4, target_modules=("c_attn",))
    with pytest.raises(ValueError, match=r"\['c_attn'\] are not Linear modules.*'q_proj'"):
        await engine.load_adapter("solver", {}, missing.as_dict())
    # Nothing was half-loaded: the adapter still serves the base.
    assert await engine.generate(prompt, GREEDY, "solver") == await engine.generate(prompt, GREEDY)
