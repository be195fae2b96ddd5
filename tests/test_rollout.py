"""Rollout worker with the torch backend over real transports: sampling, versions, load reports."""
from __future__ import annotations

import asyncio

import pytest
import torch

from flexmarl.config.training import TrainerConfig
from flexmarl.models import build_model_dir, chat_prompt, load_model, load_tokenizer
from flexmarl.protocol import (Generate, GenerateReply, LoadReport, SamplingParams, SubscribeLoad)
from flexmarl.rollout.backends import make_engine
from flexmarl.rollout.engine import EngineConfig
from flexmarl.rollout.torch_engine import TorchEngine
from flexmarl.rollout.worker import RolloutWorker
from flexmarl.weights.stage import push_weights
from flexmarl.orchestrator.batch import micro_batch
from flexmarl.training.grpo import token_logprobs
from flexmarl.training.trainer import GRPOTrainer
from runtime.errors import RemoteError
from runtime.transport import connect

PUSH_TIMEOUT_S = 120.0
"""Generous: a push of these tiny models takes well under a second, even on a loaded machine."""


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    return str(build_model_dir("tiny", tmp_path_factory.mktemp("tiny") / "model", seed=0))


@pytest.fixture
def prompt(model_dir) -> list[int]:
    return chat_prompt(load_tokenizer(model_dir), "Compute 12+34.")


class SlowEngine(TorchEngine):
    """Holds every generation until released, to observe versions and load mid-flight."""

    def __init__(self, config: EngineConfig) -> None:
        super().__init__(config)
        self.release = asyncio.Event()

    async def generate(self, prompt_ids, params):
        await self.release.wait()
        return await super().generate(prompt_ids, params)


def perturbed(model_dir: str, seed: int) -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    return {k: v + 0.05 * torch.randn_like(v) for k, v in load_model(model_dir).state_dict().items()}


@pytest.mark.parametrize("address", ["local://rollout", "ipc://*"])
async def test_generate_samples_and_prompt_logprobs(model_dir, prompt, address):
    worker = RolloutWorker("r0", address, make_engine(EngineConfig(model_dir=model_dir)))
    async with worker.serving(), connect(worker.address) as conn:
        reply = await conn.request(Generate("q1", prompt_ids=prompt, params=SamplingParams(
            n=4, temperature=1.0, max_tokens=12, seed=7, prompt_logprobs=True)))
        assert isinstance(reply, GenerateReply) and reply.version == 0 and reply.instance == "r0"
        assert reply.prompt_ids == prompt and len(reply.prompt_logprobs) == len(prompt) - 1
        assert len(reply.samples) == 4
        for s in reply.samples:
            assert len(s.token_ids) == len(s.logprobs) and 1 <= len(s.token_ids) <= 12
            assert s.finish_reason in ("stop", "length") and all(lp <= 0 for lp in s.logprobs)
        again = await conn.request(Generate("q2", prompt_ids=prompt, params=SamplingParams(
            n=4, temperature=1.0, max_tokens=12, seed=7)))
        assert [s.token_ids for s in again.samples] == [s.token_ids for s in reply.samples]
        by_text = await conn.request(Generate("q3", prompt="Compute 12+34.", params=SamplingParams(
            temperature=0, max_tokens=4)))
        assert by_text.prompt_ids == load_tokenizer(model_dir)("Compute 12+34.",
                                                              add_special_tokens=False)["input_ids"]
        with pytest.raises(RemoteError, match="rollout.max_model_len"):
            await conn.request(Generate("q4", prompt_ids=prompt, params=SamplingParams(
                max_tokens=10_000)))


SETTINGS = [dict(temperature=0.7), dict(temperature=1.0, top_p=0.9),
            dict(temperature=1.0, top_k=20), dict(temperature=0.7, top_k=20, top_p=0.9)]
RATIO_ATOL = 1e-4
"""On-policy importance ratio vs 1: engine and trainer in float32 on one CPU (observed ~1e-6)."""


def _name(setting: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in setting.items())


@pytest.mark.parametrize("setting", SETTINGS, ids=_name)
async def test_sampled_logprobs_are_the_behaviour_policy(model_dir, prompt, setting):
    """Each reported log-probability equals the trainer's scoring of the sample under the
    distribution it was sampled from (temperature, then top-k and top-p), and a trainer fed the
    samples with their settings sees an on-policy ratio of 1. Scored without the truncation,
    the same samples are off (the bug this guards against)."""
    engine = TorchEngine(EngineConfig(model_dir=model_dir))
    await engine.start()
    params = SamplingParams(n=4, max_tokens=8, seed=3, **setting)
    samples, _ = await engine.generate(prompt, params)
    await engine.close()
    model = load_model(model_dir)
    scored = (params.temperature, params.top_k, params.top_p)
    for s in samples:
        ids = torch.tensor([prompt + s.token_ids])
        with torch.no_grad():
            logits = model(ids).logits
        lp = token_logprobs(logits, ids, params.temperature, top_k=torch.tensor([params.top_k]),
                            top_p=torch.tensor([params.top_p]))[0, len(prompt):]
        assert torch.allclose(lp, torch.tensor(s.logprobs), atol=1e-5)
    rows = [(prompt, s.token_ids, s.logprobs) for s in samples]
    advantages = [1.0, -1.0, 0.5, -0.5]
    trainer = GRPOTrainer(model_dir, TrainerConfig(lr=1e-3))
    trainer.begin_batch(sum(len(s.token_ids) for s in samples))
    stats = trainer.accumulate(micro_batch(rows, advantages, sampling=[scored] * len(rows)))
    assert abs(stats.metrics["ratio_mean"] - 1.0) < RATIO_ATOL
    assert stats.metrics["clip_frac"] == 0.0
    if params.top_k or params.top_p < 1:  # truncated: scoring it untruncated is biased
        plain = GRPOTrainer(model_dir, TrainerConfig(lr=1e-3, temperature=params.temperature))
        plain.begin_batch(sum(len(s.token_ids) for s in samples))
        biased = plain.accumulate(micro_batch(rows, advantages))
        assert biased.metrics["ratio_mean"] < 1.0 - 10 * RATIO_ATOL


async def test_weight_update_waits_for_running_requests_and_bumps_version(model_dir, prompt):
    engine = SlowEngine(EngineConfig(model_dir=model_dir))
    worker = RolloutWorker("r0", "inproc://gate", engine)
    async with worker.serving(), connect(worker.address) as conn:
        params = SamplingParams(n=2, temperature=0, max_tokens=6)
        before = asyncio.ensure_future(conn.request(Generate("a", prompt_ids=prompt, params=params)))
        await asyncio.sleep(0.1)
        assert worker.running == 1
        update = asyncio.ensure_future(push_weights([conn], 1, perturbed(model_dir, 1),
                                                       timeout_s=PUSH_TIMEOUT_S))
        await asyncio.sleep(0.1)
        after = asyncio.ensure_future(conn.request(Generate("b", prompt_ids=prompt, params=params)))
        await asyncio.sleep(0.1)
        assert not update.done() and worker.queued == 1 and worker.version == 0
        engine.release.set()
        first, report, second = await asyncio.gather(before, update, after)
        assert (first.version, report.version, second.version) == (0, 1, 1)
        assert report.num_bytes > 0 and report.seconds > 0
        assert first.samples[0].logprobs != second.samples[0].logprobs  # new weights in use
        with pytest.raises(RemoteError, match="stale weight update"):
            await push_weights([conn], 1, perturbed(model_dir, 2), timeout_s=PUSH_TIMEOUT_S)


async def test_load_reports_are_pushed_to_subscribers(model_dir, prompt):
    engine = SlowEngine(EngineConfig(model_dir=model_dir))
    worker = RolloutWorker("r0", "inproc://load", engine)
    async with worker.serving(), connect(worker.address) as conn:
        first = await conn.request(SubscribeLoad())
        assert first == LoadReport("r0", 0, 0, 0, 0)
        pending = [asyncio.ensure_future(conn.request(Generate(f"g{i}", prompt_ids=prompt,
                   params=SamplingParams(n=3, max_tokens=5)))) for i in range(2)]
        seen = []
        while not seen or seen[-1].outstanding_tokens < 30:
            seen.append((await asyncio.wait_for(conn.recv(), 5)).msg)
        assert seen[-1].running + seen[-1].queued == 2 and seen[-1].outstanding_tokens == 30
        engine.release.set()
        await asyncio.gather(*pending)
        while seen[-1].outstanding_tokens:
            seen.append((await asyncio.wait_for(conn.recv(), 5)).msg)
        assert seen[-1] == LoadReport("r0", 0, 0, 0, 0)


def test_engine_config_names_the_field():
    with pytest.raises(ValueError, match="rollout.backend"):
        EngineConfig(backend="tgi", model_dir="x")
    with pytest.raises(ValueError, match="rollout.model_dir"):
        EngineConfig()
    with pytest.raises(ValueError, match="sampling.top_p"):
        SamplingParams(top_p=0)


class VersionBumpingEngine(TorchEngine):
    """A broken gate, simulated: the worker's version changes while a request runs."""

    worker: RolloutWorker

    async def generate(self, prompt_ids, params):
        self.worker.version += 1
        return await super().generate(prompt_ids, params)


async def test_a_sample_that_would_mix_versions_is_refused_with_a_named_error(model_dir, prompt):
    """The no-mixed-versions invariant is an explicit check (InvariantError), not an assert,
    so it holds under python -O too; the request fails instead of returning the sample."""
    engine = VersionBumpingEngine(EngineConfig(model_dir=model_dir))
    worker = RolloutWorker("r0", "inproc://mixed", engine)
    engine.worker = worker
    async with worker.serving(), connect(worker.address) as conn:
        with pytest.raises(RemoteError, match="InvariantError.*mix two versions"):
            await conn.request(Generate("a", prompt_ids=prompt,
                                        params=SamplingParams(max_tokens=2)))


def test_framework_guarantees_are_not_asserts():
    """`python -O` strips asserts: no module of flexmarl/ may rely on one."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent / "flexmarl"
    found = [f"{path.relative_to(root.parent)}:{node.lineno}"
             for path in sorted(root.rglob("*.py"))
             for node in ast.walk(ast.parse(path.read_text()))
             if isinstance(node, ast.Assert)]
    assert not found, f"asserts in framework code (use an explicit check): {found}"


def test_weights_of_a_sharded_model_directory(model_dir, tmp_path):
    """A Hugging Face directory saved in shards (model.safetensors.index.json) gives the same
    tensors as a single-file one: what an instance move or a partial export completes from."""
    from flexmarl.models import model_weights

    model = load_model(model_dir)
    model.save_pretrained(tmp_path / "sharded", max_shard_size="20KB")
    assert not (tmp_path / "sharded" / "model.safetensors").exists()
    assert len(list((tmp_path / "sharded").glob("model-*.safetensors"))) > 1
    whole, sharded = model_weights(model_dir), model_weights(str(tmp_path / "sharded"))
    assert sharded.keys() == whole.keys()
    assert all(torch.equal(whole[k], sharded[k]) for k in whole)
    with pytest.raises(FileNotFoundError, match="neither model.safetensors"):
        model_weights(str(tmp_path))


def test_a_staging_dir_without_room_names_the_size_and_the_setting(monkeypatch, tmp_path):
    import shutil

    from flexmarl.rollout import vllm_engine

    monkeypatch.setattr(shutil, "disk_usage",
                        lambda path: shutil._ntuple_diskusage(64 << 20, 60 << 20, 4 << 20))
    with pytest.raises(RuntimeError, match=r"538 MB weight update.*4 MB free.*rollout.staging_dir"):
        vllm_engine.check_staging_room(str(tmp_path), 538_000_000)
    monkeypatch.undo()
    vllm_engine.check_staging_room(str(tmp_path), 1000)  # room enough: no error


async def test_a_staging_dir_that_fills_up_while_writing_names_the_setting(monkeypatch, tmp_path,
                                                                        model_dir):
    """Room checked, then taken by someone else before the write ends (ENOSPC): the same clear
    error, not a bare OSError, and no staged file left behind."""
    import errno

    import safetensors.torch

    from flexmarl.rollout.vllm_engine import VllmEngine

    def full(tensors, path):
        raise OSError(errno.ENOSPC, "No space left on device", path)

    monkeypatch.setattr(safetensors.torch, "save_file", full)
    engine = VllmEngine(EngineConfig(backend="vllm", model_dir=model_dir,
                                     staging_dir=str(tmp_path)))
    with pytest.raises(RuntimeError, match=r"MB weight update.*MB free.*rollout.staging_dir"):
        await engine.load_weights({"w": torch.zeros(4)})
    assert list(tmp_path.iterdir()) == []
