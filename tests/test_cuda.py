"""On a GPU machine only (marked `cuda`; skipped where torch sees no CUDA device): training on
CUDA in bf16, as a trainer worker runs it (FSDP2 on a mesh of one rank over NCCL, mixed
precision, activation checkpointing, DTensor parking into pinned buffers, full-state export
and load), the weight source's stream order, the torch engine on a GPU, vLLM on GPU, and a
direct weight update through vLLM's weight-transfer engine from a real trainer slot to a real
instance. Run them with `make TORCH=torch EXTRAS=dev,gpu,pretrained test` there;
bench/gpu_smoke.py is the first check of a new node, bench/gpu_check.py runs the whole
system. See docs/gpus.md for which of them have run on a GPU."""
from __future__ import annotations

import asyncio
import dataclasses

from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from flexmarl.config.training import TrainerConfig
from flexmarl.orchestrator.batch import micro_batch
from flexmarl.training.trainer import GRPOTrainer

pytestmark = pytest.mark.cuda

READY_TIMEOUT_S = 600.0
"""Generous: a cold vLLM engine with CUDA graphs off starts in well under a minute."""
TIMEOUT_S = 120.0


def batch(seed: int):
    g = torch.Generator().manual_seed(seed)
    rows = [([1, 2, 3], torch.randint(3, 60, (5,), generator=g).tolist(),
             (-torch.rand(5, generator=g)).tolist()) for _ in range(4)]
    return micro_batch(rows, torch.randn(4, generator=g).tolist())


def test_a_trainer_steps_on_cuda_in_bf16_with_float32_master_weights(tiny_model_dir):
    trainer = GRPOTrainer(tiny_model_dir, TrainerConfig(device="cuda", lr=1e-3,
                                                        param_dtype="bfloat16"))
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    mb = batch(0)
    trainer.begin_batch(int(mb.response_mask.sum()))
    stats = trainer.accumulate(mb)
    done = trainer.step()
    assert torch.isfinite(torch.tensor(stats.loss)) and done.version == 1 and not done.skipped
    for name, p in trainer.model.named_parameters():
        assert p.device.type == "cuda" and p.dtype == torch.float32
        assert not torch.equal(p, before[name])
    exported = trainer.export_weights()
    assert all(t.device.type == "cpu" for t in exported.values())


@pytest.fixture
def nccl_group(tmp_path):
    """A process group of one rank over NCCL on GPU 0, as every trainer worker has (then
    GRPOTrainer shards with FSDP2 even at world size 1); destroyed after the test, so other
    tests build unsharded trainers."""
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _sharded_trainer(model_dir: str) -> GRPOTrainer:
    return GRPOTrainer(model_dir, TrainerConfig(device="cuda", lr=1e-3, param_dtype="bfloat16",
                                                activation_checkpointing=True))


def test_a_sharded_trainer_steps_in_bf16_with_checkpointing_as_a_worker_does(
        tiny_model_dir, nccl_group):
    trainer = _sharded_trainer(tiny_model_dir)
    assert trainer.sharded and all(hasattr(p, "to_local") for p in trainer.model.parameters())
    for seed in (0, 1):
        mb = batch(seed)
        trainer.begin_batch(int(mb.response_mask.sum()))
        stats = trainer.accumulate(mb)
        done = trainer.step()
        assert torch.isfinite(torch.tensor(stats.loss)) and not done.skipped
    assert trainer.version == 2
    assert all(p.to_local().dtype == torch.float32 for p in trainer.model.parameters())
    exported = trainer.export_weights()
    assert exported and all(t.device.type == "cpu" and torch.isfinite(t).all()
                            for t in exported.values())


def _stepped_trainer(model_dir: str, rows: int) -> GRPOTrainer:
    """The FSDP2 trainer after one optimizer step on a batch of `rows`."""
    trainer = _sharded_trainer(model_dir)
    mb = batch(rows)
    trainer.begin_batch(int(mb.response_mask.sum()))
    trainer.accumulate(mb)
    trainer.step()
    return trainer


def test_a_sharded_trainer_parks_into_pinned_buffers_and_comes_back_bit_for_bit(
        tiny_model_dir, nccl_group):
    from flexmarl.training.parking import HostPool, local_tensors, park, unpark

    trainer = _stepped_trainer(tiny_model_dir, 2)
    before = {k: v.clone() for k, v in local_tensors(trainer).items()}
    pool, held = HostPool(pin=True), torch.cuda.memory_allocated()
    for _ in range(2):  # the second park reuses the first one's pinned buffer
        host = park(trainer, pool)
        assert torch.cuda.memory_allocated() < held - host.num_bytes // 2
        assert host.buffer.is_pinned() and pool.num_allocations == 1
        unpark(host, pool)
        after = local_tensors(trainer)
        assert all(torch.equal(before[k], after[k]) for k in before)
    buffer = pool.free[0]
    pool.close()  # let go: unpinned at once (torch's own pinned allocator would keep it)
    assert not buffer.is_pinned() and pool.pinned_bytes == 0


def test_export_and_load_state_of_a_sharded_trainer_carry_the_cuda_generator(
        tiny_model_dir, nccl_group):
    from flexmarl.training.trainer import export_state, load_state

    trainer = _stepped_trainer(tiny_model_dir, 3)
    tensors, meta = export_state(trainer)
    assert "rng/cuda" in tensors and meta["version"] == 1
    expected = torch.rand(4, device="cuda")
    fresh = _sharded_trainer(tiny_model_dir)
    load_state(fresh, tensors, meta)
    assert torch.equal(torch.rand(4, device="cuda"), expected)  # the generator came back
    again, _ = export_state(fresh)
    assert all(torch.equal(tensors[k], again[k]) for k in tensors if not k.startswith("rng/"))


async def test_the_weight_source_reads_parameters_after_the_optimizer_steps_queued_work():
    """vLLM's packed NCCL producer reads the source on side streams of its own: without the
    source ordering them after the step's stream, they read the weights of before the step.
    The probe is bench/gpu_smoke.py's `streams` check (it raises when a read came early)."""
    pytest.importorskip("vllm")
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        "gpu_smoke", Path(__file__).resolve().parent.parent / "bench" / "gpu_smoke.py")
    smoke = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(smoke)
    assert "1048576 of 1048576" in await smoke.child_streams("", "")


async def test_the_torch_engine_generates_on_the_gpu_and_loads_staged_weights(tiny_model_dir):
    from flexmarl.models import load_model
    from flexmarl.protocol import SamplingParams
    from flexmarl.rollout.engine import EngineConfig
    from flexmarl.rollout.torch_engine import TorchEngine

    engine = TorchEngine(EngineConfig(model_dir=tiny_model_dir, device="cuda",
                                      gpu_memory_utilization=0.3))
    await engine.start()
    try:
        assert next(engine.model.parameters()).device.type == "cuda"
        params = SamplingParams(n=3, temperature=1.0, max_tokens=8, seed=7)
        first, again = await asyncio.gather(engine.generate([1, 2, 3], params),
                                            engine.generate([1, 2, 3], params))
        assert [s.token_ids for s in first[0]] == [s.token_ids for s in again[0]]  # its seed
        greedy = SamplingParams(n=1, temperature=0, max_tokens=8)
        [before], _ = await engine.generate([1, 2, 3], greedy)
        torch.manual_seed(0)
        await engine.load_weights({k: v + 0.05 * torch.randn_like(v)
                                   for k, v in load_model(tiny_model_dir).state_dict().items()})
        [after], _ = await engine.generate([1, 2, 3], greedy)
        assert before.logprobs != after.logprobs
        held = torch.cuda.memory_allocated()
        await engine.sleep()
        assert torch.cuda.memory_allocated() < held
        await engine.wake_up()
        [woken], _ = await engine.generate([1, 2, 3], greedy)
        assert woken.token_ids == after.token_ids
    finally:
        await engine.close()
        torch.cuda.set_per_process_memory_fraction(1.0)  # the engine's cap is this process's


def test_swap_out_frees_the_gpu_memory_and_swap_in_restores_it_bit_for_bit(tiny_model_dir):
    from flexmarl.training.parking import park, unpark

    trainer = GRPOTrainer(tiny_model_dir, TrainerConfig(device="cuda", lr=1e-3))
    mb = batch(1)
    trainer.begin_batch(int(mb.response_mask.sum()))
    trainer.accumulate(mb)
    trainer.step()
    state = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    held = torch.cuda.memory_allocated()
    host = park(trainer)
    assert torch.cuda.memory_allocated() < held - host.num_bytes // 2
    assert all(copy.is_pinned() for _, copy in host.storages)
    back = unpark(host)
    assert all(torch.equal(p, state[n]) for n, p in back.model.named_parameters())


def _vllm_on_gpu() -> None:
    """For tests marked `vllm` (installed and importable, or skipped): a CUDA build of it."""
    from flexmarl.rollout.vllm_engine import on_gpu
    if not on_gpu():
        pytest.skip("the installed vLLM is not a CUDA build")


@pytest.mark.vllm
async def test_vllm_serves_on_gpu_and_reloads_staged_weights(tiny_model_dir):
    _vllm_on_gpu()
    from flexmarl.models import load_model
    from flexmarl.protocol import SamplingParams
    from flexmarl.rollout.engine import EngineConfig
    from flexmarl.rollout.vllm_engine import VllmEngine

    engine = VllmEngine(EngineConfig(backend="vllm", model_dir=tiny_model_dir,
                                     gpu_memory_utilization=0.2))
    await engine.start()
    try:
        assert engine.on_gpu
        params = SamplingParams(n=1, temperature=0, max_tokens=8)
        [before], _ = await engine.generate([1, 2, 3], params)
        torch.manual_seed(0)
        await engine.load_weights({k: v + 0.05 * torch.randn_like(v)
                                   for k, v in load_model(tiny_model_dir).state_dict().items()})
        [after], _ = await engine.generate([1, 2, 3], params)
        assert before.logprobs != after.logprobs
    finally:
        await engine.close()


@pytest.mark.vllm
async def test_vllm_sleeps_frees_its_gpu_memory_and_wakes_serving_the_same(tiny_model_dir):
    """devices.placement time_shared on GPU: vLLM's sleep mode (level 1) gives the GPU memory
    back while the agent trains and wakes with the same weights (the same greedy tokens)."""
    _vllm_on_gpu()
    from flexmarl.protocol import SamplingParams
    from flexmarl.rollout.engine import EngineConfig
    from flexmarl.rollout.vllm_engine import VllmEngine

    engine = VllmEngine(EngineConfig(backend="vllm", model_dir=tiny_model_dir,
                                     gpu_memory_utilization=0.3, sleep_mode=True))
    await engine.start()
    try:
        params = SamplingParams(n=1, temperature=0, max_tokens=8)
        [before], _ = await engine.generate([1, 2, 3], params)
        free_awake = torch.cuda.mem_get_info()[0]
        await engine.sleep()
        free_asleep = torch.cuda.mem_get_info()[0]
        # most of its 30% share of the GPU comes back (the KV cache at least)
        assert free_asleep - free_awake > 0.2 * torch.cuda.mem_get_info()[1]
        await engine.wake_up()
        [after], _ = await engine.generate([1, 2, 3], params)
        assert after.token_ids == before.token_ids
    finally:
        await engine.close()


@pytest.mark.vllm
@pytest.mark.parametrize("backend", ["ipc", "nccl"])
async def test_a_trainer_slot_sends_its_weights_to_an_instance_directly(
        tiny_model_dir, tmp_path, backend):
    """A real slot and a real instance as a run starts them: after one training step the slot
    sends version 1 through vLLM's engine (ipc: both on GPU 0; nccl: GPUs 0 and 1) and the
    instance serves it, with different log-probabilities than version 0's."""
    _vllm_on_gpu()
    if backend == "nccl" and torch.cuda.device_count() < 2:
        pytest.skip("NCCL between a trainer and an instance needs two GPUs")
    from flexmarl.protocol import (Generate, SamplingParams, SendWeights, SwapIn,
                                   TrainBeginBatch, TrainStep)
    from flexmarl.rollout.engine import EngineConfig
    from runtime.supervisor import Supervisor, WorkerSpec
    from runtime.transport import connect

    config = dataclasses.asdict(TrainerConfig(device="cuda", lr=1e-2))
    env = {"VLLM_ALLOW_INSECURE_SERIALIZATION": "1"} if backend == "ipc" else {}
    engine = dataclasses.asdict(EngineConfig(
        backend="vllm", model_dir=tiny_model_dir, gpu_memory_utilization=0.3,
        weight_transfer=backend))
    specs = [WorkerSpec(name="slot", entry="flexmarl.training.worker:trainer_worker",
                        args={"rank": 0, "world_size": 1, "config": config,
                              "init_method": f"file://{tmp_path}/slot",
                              "memory_fraction": 0.3 if backend == "ipc" else 0.0},
                        env={"CUDA_VISIBLE_DEVICES": "0"}),
             WorkerSpec(name="instance", entry="flexmarl.rollout.worker:rollout_worker",
                        args=engine, ready_timeout_s=READY_TIMEOUT_S,
                        env={**env, "CUDA_VISIBLE_DEVICES": "0" if backend == "ipc" else "1"})]
    sup = Supervisor()
    async with sup.serving():
        slot, instance = [await sup.start_worker(s) for s in specs]
        async with connect(slot.address) as trainer, connect(instance.address) as rollout:
            ask = Generate("g", prompt_ids=[1, 2, 3],
                           params=SamplingParams(n=1, temperature=0, max_tokens=8))
            before = await rollout.request(ask, timeout_s=TIMEOUT_S)
            await trainer.request(SwapIn("agent", tiny_model_dir, config), timeout_s=TIMEOUT_S)
            mb = batch(2)
            await trainer.request(TrainBeginBatch(0))
            await trainer.request(mb, timeout_s=TIMEOUT_S)
            await trainer.request(TrainStep(int(mb.response_mask.sum())), timeout_s=TIMEOUT_S)
            # In the engine's dtype (rollout.dtype "auto": bfloat16 on GPU), as a run sends.
            done = await trainer.request(SendWeights(1, [instance.address], backend, 1,
                                                     "bfloat16"), timeout_s=TIMEOUT_S)
            assert done.version == 1 and done.num_bytes > 0
            after = await rollout.request(ask, timeout_s=TIMEOUT_S)
            assert (before.version, after.version) == (0, 1)
            assert before.samples[0].logprobs != after.samples[0].logprobs
        await sup.stop_workers()
