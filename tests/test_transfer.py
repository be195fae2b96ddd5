"""Direct weight sync (flexmarl.weights.direct) on CPU: the instance side's gate, the fan-out
client vLLM's trainer engine drives, the direct sync and what a joining instance loads, and
the engine arguments. The NCCL/IPC bytes themselves need GPUs: tests/test_cuda.py and
bench/gpu_check.py."""
from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from flexmarl.checks import ConfigError
from flexmarl.config.balance import BalancerConfig
from flexmarl.config.rollout import RolloutConfig
from flexmarl.models import chat_prompt, load_model, load_tokenizer
from flexmarl.protocol import Generate, SamplingParams, WeightTransfer, WeightUpdate, WeightUpdateDone
from flexmarl.rollout.engine import EngineConfig
from flexmarl.rollout.pool import InstancePool
from flexmarl.weights.sync import WeightSync
from flexmarl.rollout.torch_engine import TorchEngine
from flexmarl.weights import direct
from flexmarl.placement.layout import resolve_transfer
from flexmarl.weights import published
from flexmarl.weights.direct import (DirectTransport, FanOut, Sender, TransferAborted,
                                     _init_info, cast_source, packed_buffer_bytes, rank_offsets)
from flexmarl.rollout.vllm_engine import engine_args
from flexmarl.rollout.worker import RolloutWorker
from runtime.config import TransportConfig
from runtime.errors import RemoteError
from runtime.transport import connect

TIMEOUT_S = 60.0
"""Generous: every call here is in-process and takes milliseconds."""


class TransferEngine(TorchEngine):
    """The torch engine with a weight-transfer engine that records its phases; "update" waits
    for `release` (the trainer's broadcast) and then perturbs the weights, as a received update
    would."""

    def __init__(self, config: EngineConfig, release: asyncio.Event | None = None) -> None:
        super().__init__(config)
        self.phases: list[tuple[str, dict]] = []
        self.release = release or asyncio.Event()
        self.fail_in: str = ""

    async def transfer(self, phase: str, info: dict) -> None:
        self.phases.append((phase, info))
        if phase == self.fail_in:
            raise RuntimeError(f"broken {phase}")
        if phase == "update":
            await self.release.wait()
            with torch.no_grad():
                for p in self.model.parameters():
                    p.add_(0.05)


@pytest.fixture
def prompt(tiny_model_dir) -> list[int]:
    return chat_prompt(load_tokenizer(tiny_model_dir), "Compute 12+34.")


async def test_an_instance_takes_no_request_between_start_and_finish(tiny_model_dir, prompt):
    engine = TransferEngine(EngineConfig(model_dir=tiny_model_dir))
    worker = RolloutWorker("r0", "inproc://direct-gate", engine)
    params = SamplingParams(n=2, temperature=0, max_tokens=6)
    async with worker.serving(), connect(worker.address) as conn:
        first = await conn.request(Generate("a", prompt_ids=prompt, params=params))
        with pytest.raises(RemoteError, match="without \"start\" first"):
            await conn.request(WeightTransfer("update", 1), timeout_s=TIMEOUT_S)
        await conn.request(WeightTransfer("start", 1), timeout_s=TIMEOUT_S)
        during = asyncio.ensure_future(conn.request(Generate("b", prompt_ids=prompt, params=params)))
        update = asyncio.ensure_future(conn.request(WeightTransfer("update", 1, {"names": ["x"]}),
                                                    timeout_s=TIMEOUT_S))
        await asyncio.sleep(0.2)
        assert not during.done() and worker.queued == 1 and worker.version == 0
        engine.release.set()
        await update
        assert not during.done()  # received, but the gate opens only at finish
        done = await conn.request(WeightTransfer("finish", 1), timeout_s=TIMEOUT_S)
        second = await during
        assert (first.version, done.version, second.version) == (0, 1, 1)
        assert first.samples[0].logprobs != second.samples[0].logprobs  # the new weights
        assert [p for p, _ in engine.phases] == ["start", "update", "finish"]
        with pytest.raises(RemoteError, match="stale weight update"):
            await conn.request(WeightTransfer("start", 1), timeout_s=TIMEOUT_S)


async def test_a_failed_transfer_stops_the_instance_and_opens_its_gate(tiny_model_dir):
    """Half-received weights must never serve: the instance stops (the pool replaces it with
    one that loads the served version); a failed "init" leaves it serving."""
    engine = TransferEngine(EngineConfig(model_dir=tiny_model_dir))
    engine.fail_in = "init"
    worker = RolloutWorker("r0", "inproc://direct-fail", engine)
    async with worker.serving(), connect(worker.address) as conn:
        with pytest.raises(RemoteError, match="broken init"):
            await conn.request(WeightTransfer("init", 1), timeout_s=TIMEOUT_S)
        engine.fail_in = "update"
        engine.release.set()
        await conn.request(WeightTransfer("start", 1), timeout_s=TIMEOUT_S)
        with pytest.raises(RemoteError, match="broken update"):
            await conn.request(WeightTransfer("update", 1), timeout_s=TIMEOUT_S)
        await asyncio.wait_for(worker.stopped.wait(), TIMEOUT_S)
        assert worker._gate.is_set() and worker.version == 0


async def test_the_torch_backend_has_no_transfer_engine(tiny_model_dir):
    worker = RolloutWorker("r0", "inproc://direct-torch", TorchEngine(
        EngineConfig(model_dir=tiny_model_dir)))
    async with worker.serving(), connect(worker.address) as conn:
        with pytest.raises(RemoteError, match="needs backend \"vllm\""):
            await conn.request(WeightTransfer("start", 1), timeout_s=TIMEOUT_S)
    with pytest.raises(ValueError, match="needs rollout.backend = \"vllm\""):
        EngineConfig(model_dir=tiny_model_dir, weight_transfer="nccl")


async def test_fan_out_reaches_every_instance_at_once_with_its_rank_offset(tiny_model_dir):
    """vLLM's trainer engine calls the client from its own threads and blocks in the NCCL
    broadcast while "update" runs: the update must reach every instance concurrently (here
    both engines wait for one shared release, which only comes once both are in)."""
    release = asyncio.Event()
    engines = [TransferEngine(EngineConfig(model_dir=tiny_model_dir), release) for _ in range(2)]
    workers = [RolloutWorker(f"r{i}", f"inproc://fan{i}", e) for i, e in enumerate(engines)]

    async def both_in() -> None:
        while sum(p == "update" for e in engines for p, _ in e.phases) < 2:
            await asyncio.sleep(0.01)
        release.set()

    async with workers[0].serving(), workers[1].serving():
        conns = [connect(w.address) for w in workers]
        loop = asyncio.get_running_loop()
        client = FanOut(loop, conns, [2, 2], version=1, timeout_s=TIMEOUT_S)

        def trainer_side() -> None:  # what vLLM's NCCLTrainerWeightTransferEngine does
            client.init_weight_transfer_engine({"master_port": 1, "world_size": 5,
                                                "rank_offset": 1})
            client.start_weight_update()
            client.update_weights({"names": ["w"], "dtype_names": ["bfloat16"], "shapes": [[1]]})
            client.finish_weight_update()

        watcher = asyncio.ensure_future(both_in())
        await asyncio.wait_for(asyncio.to_thread(trainer_side), TIMEOUT_S)
        await watcher
        assert [w.version for w in workers] == [1, 1]
        assert [e.phases[0][1]["rank_offset"] for e in engines] == [1, 3]
        # IPC's init info has no group to place the instances in: it goes as it is.
        await asyncio.to_thread(client.init_weight_transfer_engine, {"packed": True})
        assert [e.phases[-1] for e in engines] == [("init", {"packed": True})] * 2
        assert all(e.phases[2][1]["names"] == ["w"] for e in engines)
        assert set(client.load_s) == {c.address for c in conns}
        for c in conns:
            await c.aclose()
    assert rank_offsets([1, 1, 1]) == [1, 2, 3] and rank_offsets([4, 2]) == [1, 5]


class FakeDirect(DirectTransport):
    """The direct transport: records sends; its trainer holds `version` and `tensors`."""

    def __init__(self, tensors: dict[str, torch.Tensor]) -> None:
        super().__init__(None, "nccl", tensor_parallel_size=1, dtype="auto", timeout_s=TIMEOUT_S)
        self.sent: list[tuple] = []
        self.version, self.tensors = 0, tensors

    async def trainer_send(self, agent, version, addresses):
        self.sent.append((agent, version, tuple(addresses)))
        return WeightUpdateDone(version, 123, 0.01)

    async def fetch(self, agent):
        """Published on this host, as TrainerPool.export has the trainer do in a run."""
        return WeightUpdate(self.version, {}, source=published.publish(
            self.tensors, published.run_name(), agent, self.version, "inproc://no-trainer"))


async def test_a_direct_sync_and_a_joining_instance_loads_from_the_trainer(
        tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("FLEXMARL_WEIGHTS_DIR", str(tmp_path))
    tensors = {k: v + 1.0 for k, v in load_model(tiny_model_dir).state_dict().items()}
    workers = [RolloutWorker(f"r{i}", f"inproc://pool-direct{i}",
                             TorchEngine(EngineConfig(model_dir=tiny_model_dir)))
               for i in range(2)]
    direct = FakeDirect(tensors)
    async with workers[0].serving(), workers[1].serving():
        conns = {w.name: connect(w.address) for w in workers}
        weights = WeightSync(["a"], None, {"a": tiny_model_dir},
                             timeout_s=RolloutConfig().request_timeout_s, transport=direct)
        pool = InstancePool(conns, {"a": ["r0", "r1"]}, {"a": tiny_model_dir}, RolloutConfig(),
                            BalancerConfig(), weights=weights)
        assert not pool.weights.exports  # the loop exports nothing: the trainer sends
        report = await pool.weights.sync("a", 1, None)
        assert direct.sent == [("a", 1, tuple(c.address for c in conns.values()))]
        assert pool.versions["a"] == 1 and report.num_bytes == 123
        assert "a" not in pool.weights._sources  # the tensors never came through the run
        # A replacement or a moved instance loads the trainer's weights, but only the served
        # version: a trainer that stepped past it is refused (no sample of a newer version).
        direct.version = 2
        with pytest.raises(RuntimeError, match="holds version 2, its instances serve 1"):
            await pool.weights.served("a")
        direct.version = 1
        served = await pool.weights.served("a")
        assert published.load(served["path"]).keys() == tensors.keys()
        async with pool.weights.locked("a"):  # a joiner loads the trainer's published file
            await pool.weights.load_into(conns["r0"], "a")
        live = workers[0].engine.model.state_dict()
        assert all(torch.equal(live[k], tensors[k]) for k in tensors)
        for c in conns.values():
            await c.aclose()


def test_weight_transfer_resolution():
    assert resolve_transfer("auto", vllm_on_gpu=True, trainer_on_gpu=True, colocate=False) == "nccl"
    assert resolve_transfer("auto", vllm_on_gpu=True, trainer_on_gpu=True, colocate=True) == "ipc"
    assert resolve_transfer("auto", vllm_on_gpu=True, trainer_on_gpu=False, colocate=False) == "stage"
    assert resolve_transfer("auto", vllm_on_gpu=False, trainer_on_gpu=False, colocate=False) == "stage"
    assert resolve_transfer("stage", vllm_on_gpu=True, trainer_on_gpu=True, colocate=False) == "stage"
    with pytest.raises(ConfigError, match="needs vLLM and the trainers on GPU"):
        resolve_transfer("nccl", vllm_on_gpu=False, trainer_on_gpu=False, colocate=False)
    with pytest.raises(ConfigError, match="devices.colocate = true"):
        resolve_transfer("ipc", vllm_on_gpu=True, trainer_on_gpu=True, colocate=False)
    with pytest.raises(ConfigError, match="rollout.weight_transfer must be one of"):
        RolloutConfig(weight_transfer="rdma")
    with pytest.raises(ConfigError, match="rollout.gpu_memory_utilization"):
        RolloutConfig(gpu_memory_utilization=1.0)


def test_engine_args_on_cpu_and_on_gpu(tiny_model_dir):
    cfg = EngineConfig(backend="vllm", model_dir=tiny_model_dir, tensor_parallel_size=2,
                       gpu_memory_utilization=0.4, enforce_eager=False, weight_transfer="nccl")
    cpu, gpu = engine_args(cfg, gpu=False), engine_args(cfg, gpu=True)
    assert cpu["dtype"] == "float32" and cpu["kv_cache_memory_bytes"] == cfg.kv_cache_bytes
    assert "tensor_parallel_size" not in cpu and "gpu_memory_utilization" not in cpu
    assert gpu["dtype"] == "bfloat16" and "kv_cache_memory_bytes" not in gpu
    assert (gpu["tensor_parallel_size"], gpu["gpu_memory_utilization"],
            gpu["enforce_eager"]) == (2, 0.4, False)
    assert gpu["weight_transfer_config"].backend == "nccl"
    assert "weight_transfer_config" not in engine_args(
        EngineConfig(backend="vllm", model_dir=tiny_model_dir), gpu=True)
    from vllm.engine.arg_utils import AsyncEngineArgs
    AsyncEngineArgs(**gpu)  # every key is one vLLM 0.32 takes


def test_a_follower_rank_gathers_every_parameter_in_order_without_a_group(tiny_model_dir):
    """Ranks other than 0 only take part in the gathers (FSDP's full_tensor collectives): vLLM's
    trainer engine opens nothing for them, and the source sends the engine's dtype and leaves
    a tied LM head out (vLLM ties it to the embeddings itself)."""
    model = load_model(tiny_model_dir)
    source = cast_source(model, torch.bfloat16, {"lm_head.weight"})
    names = [m.name for m in source.metadata()]
    assert names == [n for n, _ in model.named_parameters() if n != "lm_head.weight"]
    assert all(m.dtype == torch.bfloat16 for m in source.metadata())
    assert [(n, t.dtype) for n, t in source][:1] == [(names[0], torch.bfloat16)]
    loop = asyncio.new_event_loop()
    try:
        sender = Sender(rank=1, loop=loop, transport=None, timeout_s=TIMEOUT_S)
        spec = {"version": 1, "instances": ["tcp://10.0.0.1:1"], "backend": "nccl",
                "tensor_parallel_size": 1, "dtype": "bfloat16", "host": "127.0.0.1", "port": 1}
        num_bytes, _ = sender.send(model, spec, tied=True)
        assert num_bytes == 0 and sender._client.conns == []
    finally:
        loop.close()


def test_ipc_handles_travel_as_plain_data_and_come_back_as_torch_objects():
    """CUDA IPC handles are rebuild_cuda_tensor arguments (classes, a torch.Size, a dtype,
    handle bytes): they cross the runtime's codec (no pickle) and come back equal; a class
    outside the tensor/storage allow-list is refused both ways."""
    from flexmarl.weights.codec import ipc_payload, plain_handles
    from runtime.codec import decode, encode

    args = (torch.Tensor, torch.Size([4, 8]), (8, 1), 0, torch.UntypedStorage, torch.bfloat16,
            0, b"\x01handle", 64, 0, False, b"ref", 0, b"event", True)
    info = {"names": ["w"], "dtype_names": ["bfloat16"], "shapes": [[4, 8]],
            "ipc_handles": {"GPU-uuid": args}, "tensor_sizes": [64]}
    payload = ipc_payload(info)
    assert "ipc_handles" not in payload
    frames = encode(WeightTransfer("update", 1, payload))
    received = decode(frames).msg.info
    assert plain_handles(received["ipc_handles_plain"]) == {"GPU-uuid": args}
    with pytest.raises(TypeError, match="not a tensor or storage class"):
        ipc_payload({"ipc_handles": {"u": (dict,)}})
    with pytest.raises(ValueError, match="not a tensor or storage class"):
        plain_handles({"type": "os.system"})


class FakeTrainerEngine:
    """Stands in for vLLM's NCCL trainer engine (which needs CUDA): it drives the client the
    way NCCLTrainerWeightTransferEngine does: init at trainer_init, then start, update and
    finish per send; `fail` makes the next send raise after start."""

    made: list["FakeTrainerEngine"] = []

    def __init__(self, init_info, client, source):
        self.client, self.source, self.shut, self.fail = client, source, False, False
        client.init_weight_transfer_engine({"master_port": init_info.master_port,
                                            "world_size": init_info.world_size,
                                            "rank_offset": 1})
        FakeTrainerEngine.made.append(self)

    def send_weights(self):
        meta = self.source.metadata()
        self.client.start_weight_update()
        if self.fail:
            raise RuntimeError("broadcast failed")
        self.client.update_weights({"names": [m.name for m in meta]})
        self.client.finish_weight_update()

    def shutdown(self):
        self.shut = True


async def test_rank_0_sends_through_a_cached_group_made_again_when_the_instances_change(
        tiny_model_dir, monkeypatch):
    from vllm.distributed.weight_transfer import WeightTransferTrainerFactory

    FakeTrainerEngine.made = []
    monkeypatch.setattr(WeightTransferTrainerFactory, "trainer_init", classmethod(
        lambda cls, info, *, client, source: FakeTrainerEngine(info, client, source)))
    release = asyncio.Event()
    release.set()
    engines = [TransferEngine(EngineConfig(model_dir=tiny_model_dir), release) for _ in range(2)]
    workers = [RolloutWorker(f"r{i}", f"inproc://send{i}", e) for i, e in enumerate(engines)]
    model = load_model(tiny_model_dir)
    sender = Sender(rank=0, loop=asyncio.get_running_loop(), transport=TransportConfig(),
                    timeout_s=TIMEOUT_S)

    def spec(version, addresses):
        return {"version": version, "instances": addresses, "backend": "nccl",
                "tensor_parallel_size": 1, "dtype": "bfloat16", "host": "127.0.0.1",
                "port": 1}

    async with workers[0].serving(), workers[1].serving():
        both = [w.address for w in workers]
        num_bytes, _ = await asyncio.to_thread(sender.send, model, spec(1, both), False)
        assert num_bytes == 2 * sum(p.numel() for p in model.parameters())  # bf16
        await asyncio.to_thread(sender.send, model, spec(2, both), False)
        assert [w.version for w in workers] == [2, 2] and len(FakeTrainerEngine.made) == 1
        assert [p for p, _ in engines[0].phases] == ["init"] + ["start", "update", "finish"] * 2
        # One instance moved away: a new group with the one left.
        await asyncio.to_thread(sender.send, model, spec(3, both[:1]), False)
        assert len(FakeTrainerEngine.made) == 2 and FakeTrainerEngine.made[0].shut
        assert [w.version for w in workers] == [3, 2]
        # A failed send closes its group; the next one forms a new group.
        FakeTrainerEngine.made[-1].fail = True
        with pytest.raises(RuntimeError, match="broadcast failed"):
            await asyncio.to_thread(sender.send, model, spec(4, both[:1]), False)
        assert FakeTrainerEngine.made[-1].shut and sender._key is None
        await asyncio.wait_for(workers[0].stopped.wait(), TIMEOUT_S)  # half-loaded: it stops
        await asyncio.to_thread(sender.send, model, spec(4, both[1:]), False)
        assert len(FakeTrainerEngine.made) == 3 and workers[1].version == 4


class BlockedGroup:
    """Stands in for vLLM's PyNcclCommunicator on the trainer side: a broadcast to a peer that
    is gone blocks until the communicator is aborted (destroy: ncclCommAbort)."""

    def __init__(self) -> None:
        self.aborted = threading.Event()

    def destroy(self) -> None:
        self.aborted.set()


class BroadcastingEngine(FakeTrainerEngine):
    """Drives the client as NCCLTrainerWeightTransferEngine.send_weights does: the instances'
    "update" on a thread of its own while this thread broadcasts; the broadcast returns only
    once the group is aborted (the peer never joins), as a real one waiting on a dead peer."""

    def __init__(self, init_info, client, source):
        super().__init__(init_info, client, source)
        self.model_update_group = BlockedGroup()

    def send_weights(self):
        self.client.start_weight_update()
        exe = ThreadPoolExecutor(max_workers=1)
        try:
            future = exe.submit(self.client.update_weights, {"names": ["w"]})
            self.model_update_group.aborted.wait()  # the broadcast
            future.result()
        finally:
            exe.shutdown(wait=False)
        self.client.finish_weight_update()


def _direct_spec(version, addresses, timeout_s):
    return {"version": version, "instances": addresses, "backend": "nccl",
            "tensor_parallel_size": 1, "dtype": "bfloat16", "host": "127.0.0.1", "port": 1,
            "timeout_s": timeout_s}


ABORT_WAIT_S = 60.0
"""direct.ABORT_TIMEOUT_S in the abort tests: a send that waited for an unanswerable abort
would take this long; one that did not takes about a second (half of it leaves room for a
loaded machine)."""


@pytest.mark.parametrize("case", ["deadline", "instance fails"])
async def test_a_send_that_cannot_finish_aborts_the_group_and_the_instances_instead_of_hanging(
        tiny_model_dir, monkeypatch, case):
    """vLLM's NCCL broadcast has no timeout: an instance that dies or hangs mid-send would
    block trainer rank 0 forever. Past the send's deadline (rollout.request_timeout_s), or at
    once when an instance fails a phase, the group is aborted (the broadcast returns), the
    phases still waiting return, the instances are told to abort (one mid-update stops) and
    the send raises."""
    from vllm.distributed.weight_transfer import WeightTransferTrainerFactory

    FakeTrainerEngine.made = []
    # Longer than the send may take: an abort sent to the instance that failed (and stopped)
    # would wait this long for a reply that never comes.
    monkeypatch.setattr(direct, "ABORT_TIMEOUT_S", ABORT_WAIT_S)
    monkeypatch.setattr(WeightTransferTrainerFactory, "trainer_init", classmethod(
        lambda cls, info, *, client, source: BroadcastingEngine(info, client, source)))
    engine = TransferEngine(EngineConfig(model_dir=tiny_model_dir))  # "update" never released
    if case == "instance fails":
        engine.fail_in = "update"
    # Its hung "update" is in flight when it stops: drained briefly, then cancelled.
    worker = RolloutWorker("r0", f"inproc://abort-{case.replace(' ', '-')}", engine,
                           drain_timeout_s=0.5)
    sender = Sender(rank=0, loop=asyncio.get_running_loop(), transport=TransportConfig(),
                    timeout_s=TIMEOUT_S)
    # "deadline": a short one, which the hung instance outlasts; "instance fails": a long one,
    # which the abort must not wait for (it would end in a TimeoutError).
    timeout_s = 0.5 if case == "deadline" else TIMEOUT_S
    async with worker.serving():
        started = time.monotonic()
        with pytest.raises(TimeoutError if case == "deadline" else RemoteError,
                           match=r"rollout.request_timeout_s" if case == "deadline"
                           else "broken update"):
            await asyncio.to_thread(sender.send, load_model(tiny_model_dir),
                                    _direct_spec(1, [worker.address], timeout_s), False)
        # The abort went only where it is answered: the hung instance ("deadline") answers it;
        # the one that failed its phase ("instance fails") has stopped and is not sent one.
        assert time.monotonic() - started < ABORT_WAIT_S / 2
        [made] = FakeTrainerEngine.made
        assert made.model_update_group.aborted.is_set() and made.shut
        assert sender._key is None  # the next send forms a new group
        await asyncio.wait_for(worker.stopped.wait(), TIMEOUT_S)  # half-loaded: it stops
        assert worker._gate.is_set() and worker.version == 0


async def test_an_aborted_fan_out_refuses_later_phases():
    client = FanOut(asyncio.get_running_loop(), [], [1], version=1, timeout_s=TIMEOUT_S)
    await asyncio.to_thread(client.fail, "deadline passed")
    with pytest.raises(TransferAborted, match="deadline passed"):
        await asyncio.to_thread(client.finish_weight_update)


async def test_an_instance_whose_trainer_vanishes_mid_update_stops_past_its_deadline(
        tiny_model_dir):
    """A trainer that dies between "start" and "finish" sends no "abort": the instance keeps
    its gate closed only until the deadline the trainer gave at "start", then stops (its
    weights may be half loaded; the pool replaces it), instead of until the pool's request
    timeout."""
    engine = TransferEngine(EngineConfig(model_dir=tiny_model_dir))
    worker = RolloutWorker("r0", "inproc://vanished-trainer", engine)
    async with worker.serving(), connect(worker.address) as conn:
        await conn.request(WeightTransfer("start", 1, {"deadline_s": 0.3}), timeout_s=TIMEOUT_S)
        assert not worker._gate.is_set()
        await asyncio.wait_for(worker.stopped.wait(), TIMEOUT_S)
        assert worker._gate.is_set() and worker.version == 0
    # A transfer that finishes in time cancels its deadline.
    engine = TransferEngine(EngineConfig(model_dir=tiny_model_dir))
    engine.release.set()
    worker = RolloutWorker("r1", "inproc://finished-in-time", engine)
    async with worker.serving(), connect(worker.address) as conn:
        for phase in ("start", "update", "finish"):
            await conn.request(WeightTransfer(phase, 1, {"deadline_s": 0.3} if phase == "start"
                                              else {}), timeout_s=TIMEOUT_S)
        assert worker._transfer_deadline is None and not worker.stopped.is_set()


def test_the_packed_ipc_buffer_holds_the_largest_tensor_and_no_more_than_the_model():
    """vLLM's IPC producer allocates exactly its buffer on the trainer's GPU and refuses a
    tensor above it: a 7B model's bf16 embedding (152064 x 3584 x 2 bytes = 1.09 GB) is over
    the 1 GiB default; a small model needs less than 1 GiB."""
    embedding = 152064 * 3584 * 2
    assert packed_buffer_bytes([embedding, 3584 * 2, 18944 * 3584 * 2] * 3) == embedding
    assert packed_buffer_bytes([1000, 24, 500]) == 1524
    assert packed_buffer_bytes([600 << 20] * 4) == 1 << 30
    assert packed_buffer_bytes([]) == 0
    spec = _direct_spec(1, ["tcp://x:1"], 1.0) | {"backend": "ipc"}
    info = _init_info(spec, 0, 1, embedding)
    assert info.packed and info.packed_buffer_size_bytes == embedding


# ----------------------------------------------------------------------------- a whole run

class StagedDirect(DirectTransport):
    """The direct transport for a CPU run: the trainer "sends" by publishing its weights and
    having the addresses it is given load them (what NCCL does on GPU, here through the
    transport), so the loop's direct branch (no export in the session, WeightSync.sync with no
    tensors at sync time, the trainer's version checked) runs end to end."""

    sends: list[tuple[str, int, int]] = []

    async def trainer_send(self, agent, version, addresses):
        update = await self.trainers.export(agent)
        assert update.version == version, (update.version, version)
        conns = [connect(a) for a in addresses]
        try:
            await asyncio.gather(*(c.request(WeightUpdate(version, {}, source=update.source),
                                             timeout_s=TIMEOUT_S) for c in conns))
        finally:
            for c in conns:
                await c.aclose()
        StagedDirect.sends.append((agent, version, len(addresses)))
        return WeightUpdateDone(version, update.source["num_bytes"], 0.0)

    async def fetch(self, agent):
        return await self.trainers.export(agent)


@pytest.mark.slow
async def test_a_run_synced_by_its_trainers_ends_like_a_staged_run(tiny_model_dir, tmp_path,
                                                                   monkeypatch):
    """The same seeded run twice, weights pushed through the run (staged) and sent by the
    trainer at sync time (the direct branch GPU runs take): the same rewards and the same
    final weights, bit for bit, and every step's version reached the instances. The engine
    runs every request alone (rollout.max_num_seqs=1): otherwise a task's two concurrent calls
    may be batched together in one run and apart in the other (a loaded machine delays one),
    and padding changes the behaviour log-probabilities in the last bits, which AdamW carries
    into the weights (seen once in CI; see test_pipeline's one_group case)."""
    from safetensors.torch import load_file

    import flexmarl.launch.compose as compose
    from flexmarl.config.load import load_config
    from flexmarl.launch.run import train
    from flexmarl.observe.rundir import RunDir
    from tests.helpers.teams import duo

    def cfg(name):
        return load_config(overrides=[
            f"run.dir={tmp_path / name}", "run.steps=2", "rollout.backend=torch",
            "pipeline.mode=micro_batch", "pipeline.tasks_per_step=4",
            "pipeline.trajectories_per_task=2", "pipeline.max_concurrent_tasks=1",
            "pipeline.micro_batch_groups=1", "rollout.max_num_seqs=1", "trainer.lr=1e-3",
            "observe.report=false"])

    results = {}
    for name in ("staged", "direct"):
        if name == "direct":
            StagedDirect.sends = []
            monkeypatch.setattr(compose, "DIRECT", ("stage",))
            monkeypatch.setattr(compose, "DirectTransport", StagedDirect)
        config = cfg(name)
        results[name] = await asyncio.wait_for(
            train(duo(tiny_model_dir), config, run_dir=RunDir.create(config), progress=False),
            300)
    staged, direct = results["staged"], results["direct"]
    assert sorted(StagedDirect.sends) == [(a, v, 1) for a in ("checker", "solver")
                                          for v in (1, 2)]
    for a, b in zip(staged.metrics, direct.metrics):
        for name in ("solver", "checker"):
            x, y = a["agents"][name], b["agents"][name]
            assert (x["reward"], x["trained_samples"], x["version"]) == \
                (y["reward"], y["trained_samples"], y["version"])
            assert y["sync_bytes"] > 0
    for name in ("solver", "checker"):
        ws = load_file(str(staged.checkpoints[name] / "model.safetensors"))
        wd = load_file(str(direct.checkpoints[name] / "model.safetensors"))
        assert all(torch.equal(ws[k], wd[k]) for k in ws)
