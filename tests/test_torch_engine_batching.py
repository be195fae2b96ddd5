"""The torch rollout engine batches concurrent requests: what a request gets does not depend on
what it was batched with (greedy tokens, seeded draws, prompt log-probabilities), and a batch
of many requests is one forward pass per token, not one per request."""
from __future__ import annotations

import asyncio
import dataclasses

import pytest
import torch

from flexmarl.models import build_model_dir, chat_prompt, load_tokenizer
from flexmarl.protocol import SamplingParams
from flexmarl.rollout.engine import EngineConfig
from flexmarl.rollout.torch_engine import MIN_SHARED_PREFIX, TorchEngine, common_prefix

QUESTIONS = ["Be brief. Compute 12+34.", "Be brief. Compute 1+2.",
             "Be brief. What is 7 plus 8? Reply with the number.", "Be brief. Add 99 and 1.",
             "Be brief. Sum: 5 + 5 + 5"]
"""Prompts of different lengths (the batch pads them on the left) sharing a prefix (the batch
computes it once)."""


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    return str(build_model_dir("tiny", tmp_path_factory.mktemp("tiny") / "model", seed=0))


@pytest.fixture
async def engine(model_dir):
    engine = TorchEngine(EngineConfig(model_dir=model_dir, max_model_len=256, seed=3))
    await engine.start()
    yield engine
    await engine.close()


def prompts(engine: TorchEngine) -> list[list[int]]:
    tok = load_tokenizer(engine.config.model_dir)
    out = [chat_prompt(tok, q) for q in QUESTIONS]
    assert len({len(p) for p in out}) > 1, "the test needs prompts of different lengths"
    return out


def test_the_shared_prefix_leaves_every_prompt_its_last_token():
    assert common_prefix([[1, 2, 3, 4], [1, 2, 3, 5, 6]]) == 3
    assert common_prefix([[1, 2, 3], [1, 2, 3, 4]]) == 2  # the shorter keeps its last token
    assert common_prefix([[7, 1], [8, 1]]) == 0


@pytest.mark.parametrize("prompt_logprobs", [True, False], ids=["whole-prompts", "shared-prefix"])
async def test_greedy_batched_equals_alone_and_runs_as_one_batch(engine, prompt_logprobs):
    asked = prompts(engine)
    if not prompt_logprobs:  # the batch computes the prompts' common prefix once
        assert common_prefix(asked) >= MIN_SHARED_PREFIX
    params = SamplingParams(temperature=0.0, max_tokens=10, prompt_logprobs=prompt_logprobs)
    alone = [await engine.generate(p, params) for p in asked]
    before = engine.batches
    together = await asyncio.gather(*[engine.generate(p, params) for p in asked])
    assert engine.batches - before == 1  # one wave of requests: one batch
    for p, (a, a_lp), (b, b_lp) in zip(asked, alone, together):
        assert a[0].token_ids == b[0].token_ids and a[0].finish_reason == b[0].finish_reason
        # padding changes the order of float sums: equal to float32 noise, not bit for bit
        assert torch.allclose(torch.tensor(a[0].logprobs), torch.tensor(b[0].logprobs), atol=1e-4)
        if prompt_logprobs:
            assert torch.allclose(torch.tensor(a_lp), torch.tensor(b_lp), atol=1e-4)
            assert len(b_lp) == len(p) - 1  # the padding's columns are not the prompt's
        else:
            assert a_lp is None and b_lp is None


async def test_seeded_draws_do_not_depend_on_the_batch(engine):
    asked = prompts(engine)
    params = [SamplingParams(n=3, temperature=1.0, max_tokens=8, seed=11),
              SamplingParams(n=1, temperature=0.7, top_k=5, max_tokens=6, seed=12),
              SamplingParams(n=2, temperature=1.3, top_p=0.8, max_tokens=12, seed=13),
              SamplingParams(n=1, temperature=0.0, max_tokens=4),
              SamplingParams(n=4, temperature=1.0, max_tokens=3, seed=14)]
    alone = [await engine.generate(p, s) for p, s in zip(asked, params)]
    together = await asyncio.gather(*[engine.generate(p, s) for p, s in zip(asked, params)])
    for s, (a, _), (b, _) in zip(params, alone, together):
        assert len(b) == s.n and [x.token_ids for x in a] == [x.token_ids for x in b]
        assert all(len(x.token_ids) <= s.max_tokens for x in b)  # each row keeps its own budget
        assert all(x.finish_reason in ("stop", "length") for x in b)


async def test_unseeded_requests_draw_differently(engine):
    [p] = prompts(engine)[:1]
    params = SamplingParams(n=4, temperature=1.5, max_tokens=12)
    first, second = await asyncio.gather(engine.generate(p, params), engine.generate(p, params))
    assert [x.token_ids for x in first[0]] != [x.token_ids for x in second[0]]


async def test_a_batch_never_exceeds_max_num_seqs_rows(model_dir):
    engine = TorchEngine(EngineConfig(model_dir=model_dir, max_num_seqs=4))
    await engine.start()
    try:
        asked = prompts(engine)
        params = SamplingParams(n=2, temperature=1.0, max_tokens=3, seed=1)
        replies = await asyncio.gather(*[engine.generate(p, params) for p in asked])
        assert all(len(r[0]) == 2 for r in replies)
        assert engine.batches >= 3  # 10 rows, at most 4 per batch
    finally:
        await engine.close()


async def test_a_bad_request_fails_alone_with_a_named_error(engine):
    [p] = prompts(engine)[:1]
    with pytest.raises(ValueError, match="max_model_len"):
        await engine.generate(p, SamplingParams(max_tokens=10_000))
    with pytest.raises(ValueError, match="empty prompt"):
        await engine.generate([], SamplingParams(max_tokens=4))
    ok = await engine.generate(p, SamplingParams(temperature=0.0, max_tokens=4))
    assert len(ok[0][0].token_ids) <= 4


async def test_a_cancelled_request_leaves_the_others_served(engine):
    asked = prompts(engine)
    params = SamplingParams(temperature=0.0, max_tokens=6)
    tasks = [asyncio.create_task(engine.generate(p, params)) for p in asked]
    tasks[0].cancel()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert isinstance(results[0], asyncio.CancelledError)
    assert all(isinstance(r, tuple) and r[0][0].token_ids for r in results[1:])
    again = await engine.generate(asked[0], dataclasses.replace(params, max_tokens=2))
    assert again[0][0].token_ids
