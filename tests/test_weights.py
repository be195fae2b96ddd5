"""flexmarl.weights: WeightSync over fake instance connections and both transports' run ends,
and the published weights a trainer writes and an instance reads (pure and fast: no engine, no
process; the instances' ends: tests/test_transfer.py, tests/test_rollout.py)."""
from __future__ import annotations

import asyncio
import contextlib
import os

import pytest
import torch
from safetensors.torch import save_file

from flexmarl.protocol import SendWeights, WeightUpdate, WeightUpdateDone
from flexmarl.weights import published
from flexmarl.weights.base import SyncReport, weights_nbytes
from flexmarl.weights.direct import DirectTransport
from flexmarl.weights.stage import StageTransport
from flexmarl.weights.sync import WeightSync
from runtime.errors import PeerDied
from tests.helpers.fake_instances import RUN, FakeInstance, publish, weights


@pytest.fixture(autouse=True)
def model_dirs(tmp_path, monkeypatch):
    """Published weights under tmp_path; each agent's model directory holds weights(0.0)."""
    monkeypatch.setenv("FLEXMARL_WEIGHTS_DIR", str(tmp_path / "published"))
    dirs = {}
    for a in ("x", "y"):
        (tmp_path / a).mkdir()
        save_file(weights(0.0), str(tmp_path / a / "model.safetensors"))
        dirs[a] = str(tmp_path / a)
    return dirs


@pytest.fixture
def make_sync(model_dirs):
    def make(instances: dict[str, list[FakeInstance]], **kw) -> WeightSync:
        return WeightSync(list(instances), lambda agent: instances[agent],
                          {a: model_dirs[a] for a in instances}, timeout_s=5.0, **kw)
    return make


async def test_a_sync_reaches_every_instance_and_records_the_served_version(make_sync):
    insts = {"x": [FakeInstance("i0"), FakeInstance("i1")], "y": [FakeInstance("i2")]}
    ws = make_sync(insts)
    assert ws.exports and ws.fresh("x")  # staged: the loop has the trainer publish
    report = await ws.sync("x", 1, publish(1, weights(1.0)))
    assert isinstance(report, SyncReport) and report.version == 1
    assert report.num_bytes == weights_nbytes(weights(1.0)) == 7 * 4
    assert set(report.load_s) == {"i0", "i1"} and report.skipped == []
    assert [i.version for i in insts["x"]] == [1, 1] and insts["y"][0].version == 0
    assert all(i.tensors["a.weight"].eq(1.0).all() for i in insts["x"])
    assert ws.versions == {"x": 1, "y": 0} and not ws.fresh("x") and ws.fresh("y")
    # Only the file's name went to the instances, and the run keeps only that.
    assert all(m.tensors == {} and m.source["num_bytes"] == 28 for i in insts["x"]
               for m in i.got)
    served = await ws.served("x")
    assert set(served) == {"path", "host", "address", "num_bytes", "version", "run", "agent"}
    assert published.load(served["path"])["a.weight"].eq(1.0).all()


async def test_a_partial_update_sends_the_changed_tensors_and_a_joiner_gets_the_base_too(
        make_sync, model_dirs):
    insts = {"x": [FakeInstance("i0")]}
    ws = make_sync(insts)
    await ws.sync("x", 1, publish(1, weights(1.0)))
    changed = {"b.weight": torch.full((3,), 2.0)}
    await ws.sync("x", 2, publish(2, changed, complete=False))
    sent = insts["x"][0].got[-1]
    assert "base" not in sent.source and not sent.complete  # only the changed tensors travel
    assert insts["x"][0].tensors["a.weight"].eq(1.0).all()
    assert insts["x"][0].tensors["b.weight"].eq(2.0).all()
    # A joiner loads the version whole: the model directory's weights, then the update (the
    # layers a partial update leaves out are the model directory's: they never train).
    assert (await ws.served("x"))["base"] == model_dirs["x"]
    joiner = FakeInstance("new")
    async with ws.locked("x"):
        await ws.load_into(joiner, "x")
    assert joiner.version == 2 and joiner.tensors["a.weight"].eq(0.0).all()
    assert joiner.tensors["b.weight"].eq(2.0).all()


async def test_an_agent_never_synced_serves_its_model_directory(make_sync, model_dirs):
    ws = make_sync({"x": []})
    assert ws.fresh("x") and await ws.served("x") == {"base": model_dirs["x"]}
    moved = FakeInstance("moved")
    moved.version = 4  # it served another agent's version 4
    async with ws.locked("x"):
        await ws.load_into(moved, "x")
    assert moved.version == 0 and moved.tensors["a.weight"].eq(0.0).all()


async def test_a_sync_with_its_tensors_is_refused_the_run_carries_no_weights(make_sync):
    ws = make_sync({"x": [FakeInstance("i0")]})
    with pytest.raises(ValueError, match="came with its tensors: the run never carries"):
        await ws.sync("x", 1, WeightUpdate(1, weights(1.0)))
    assert ws.versions["x"] == 0


async def test_a_dead_instance_is_skipped_and_any_other_failure_raises(make_sync):
    insts = {"x": [FakeInstance("i0"), FakeInstance("dead", PeerDied("gone"))]}
    ws = make_sync(insts)
    report = await ws.sync("x", 1, publish(1, weights(1.0)))
    assert report.skipped == ["dead"] and set(report.load_s) == {"i0"}
    assert ws.versions["x"] == 1
    insts["x"].append(FakeInstance("bad", RuntimeError("engine failed")))
    with pytest.raises(RuntimeError, match="engine failed"):
        await ws.sync("x", 2, publish(2, weights(2.0)))
    assert ws.versions["x"] == 1  # not served by all: the version stays
    assert published.version_of((await ws.served("x"))["path"]) == 1


async def test_a_sync_with_every_instance_gone_is_served_to_the_replacement(make_sync):
    """A node lost with all of an agent's instances: the sync records the version and its
    weights, and the replacement that joins later loads them."""
    insts = {"x": []}
    ws = make_sync(insts)
    report = await ws.sync("x", 1, publish(1, weights(1.0)))
    assert report.version == 1 and report.load_s == {} and ws.versions["x"] == 1
    replacement = FakeInstance("new")
    async with ws.locked("x"):
        await ws.load_into(replacement, "x")
    assert replacement.version == 1 and replacement.tensors["a.weight"].eq(1.0).all()


async def test_a_direct_sync_with_every_instance_gone_leaves_the_weights_in_the_trainer(make_sync):
    trainers = FakeTrainers()
    ws = make_sync({"x": []}, transport=DirectTransport(
        trainers, "nccl", tensor_parallel_size=1, dtype="auto", timeout_s=5.0))
    report = await ws.sync("x", 1, None)
    assert report.version == 1 and trainers.requests == [] and ws.versions["x"] == 1
    assert not ws.fresh("x")  # a replacement asks the trainer for what it serves


async def test_an_instance_loaded_by_a_move_gets_exactly_the_served_version(make_sync):
    insts = {"x": [FakeInstance("i0")], "y": [FakeInstance("i1")]}
    ws = make_sync(insts)
    for v in (1, 2, 3):
        await ws.sync("y", v, publish(v, weights(float(v))))
    moved = insts["x"][0]
    moved.version = 7  # it served x's version 7: y's version 3 is loaded all the same
    async with ws.locked("x", "y"):
        report = await ws.load_into(moved, "y")
    assert report.version == moved.version == 3 and moved.got[-1].force
    assert moved.tensors["a.weight"].eq(3.0).all()
    assert report.num_bytes == weights_nbytes(weights(3.0))


async def test_a_sync_waits_for_a_move_under_the_lock(make_sync):
    insts = {"x": [FakeInstance("i0")]}
    ws = make_sync(insts)
    async with ws.locked("x"):
        pending = asyncio.ensure_future(ws.sync("x", 1, publish(1, weights(1.0))))
        await asyncio.sleep(0.01)
        assert not pending.done() and insts["x"][0].got == []
    await pending
    assert ws.versions["x"] == 1


async def test_a_sync_is_refused_without_the_tensors_a_staged_transport_needs(make_sync):
    ws = make_sync({"x": [FakeInstance("i0")]})
    with pytest.raises(ValueError, match="needs its published export"):
        await ws.sync("x", 1, None)
    with pytest.raises(ValueError, match="exported weights are version 2"):
        await ws.sync("x", 1, publish(2, weights(1.0)))
    with pytest.raises(RuntimeError, match="nothing to fetch"):
        await StageTransport(1.0).fetch("x")


class Failing:
    """A transport whose send fails: the sync aborts the transfer and raises."""

    exports = False

    def __init__(self) -> None:
        self.aborted = 0

    def begin(self, agent, version, instances):
        transport = self

        class Transfer:
            async def send(self, tensors):
                raise ConnectionError("the link broke")

            async def finish(self):
                raise AssertionError("never reached")

            async def abort(self):
                transport.aborted += 1
        return Transfer()

    async def fetch(self, agent):
        raise AssertionError("never reached")


async def test_a_failed_send_is_aborted_and_the_version_stays(make_sync):
    transport = Failing()
    ws = make_sync({"x": [FakeInstance("i0")]}, transport=transport)
    with pytest.raises(ConnectionError):
        await ws.sync("x", 1, None)
    assert transport.aborted == 1 and ws.versions["x"] == 0 and ws.fresh("x")


class FakeTrainers:
    """The trainer pool as the direct transport sees it: bind(agent) gives its slot's
    connection (which answers SendWeights), export(agent) its weights."""

    def __init__(self, fail: BaseException | None = None, publish: str = RUN) -> None:
        self.requests: list = []
        self.fail = fail
        self.version = 0
        self.publish = publish
        self.exports = 0

    @contextlib.asynccontextmanager
    async def bind(self, agent):
        trainers = self

        class Slot:
            async def request(self, msg, *, timeout_s=None):
                trainers.requests.append((agent, msg))
                if trainers.fail is not None:
                    raise trainers.fail
                return WeightUpdateDone(msg.version, 1000, 0.5)
        yield Slot()

    async def export(self, agent):
        """Published, as TrainerPool.export does in a run."""
        self.exports += 1
        return publish(self.version, weights(float(self.version)), agent=agent)


async def test_a_direct_sync_asks_the_bound_trainer_and_a_new_instance_loads_its_weights(make_sync):
    trainers = FakeTrainers()
    insts = {"x": [FakeInstance("i0"), FakeInstance("i1")]}
    ws = make_sync(insts, transport=DirectTransport(
        trainers, "nccl", tensor_parallel_size=2, dtype="auto", timeout_s=5.0))
    assert not ws.exports
    report = await ws.sync("x", 1, None)
    (agent, msg), = trainers.requests
    assert agent == "x" and isinstance(msg, SendWeights)
    assert (msg.version, msg.instances, msg.backend, msg.tensor_parallel_size, msg.dtype) == \
        (1, ["i0", "i1"], "nccl", 2, "bfloat16")
    assert report.num_bytes == 1000 and report.load_s == {"i0": 0.5, "i1": 0.5}
    assert ws.versions["x"] == 1 and not ws.fresh("x")
    assert all(i.got == [] for i in insts["x"])  # nothing went through the run
    trainers.version = 1
    new = FakeInstance("new")
    assert (await ws.load_into(new, "x")).version == 1 and new.tensors["a.weight"].eq(1.0).all()
    trainers.version = 2  # stepped past the served version: refused
    with pytest.raises(RuntimeError, match="holds version 2, its instances serve 1"):
        await ws.load_into(FakeInstance("late"), "x")
    # A staged update (a resumed run's restored weights) is loaded from its file all the same.
    await ws.sync("x", 2, publish(2, weights(2.0)))
    assert [i.version for i in insts["x"]] == [2, 2]


async def test_a_failed_direct_send_aborts_every_instance(make_sync):
    trainers = FakeTrainers(fail=PeerDied("trainer died"))
    insts = {"x": [FakeInstance("i0"), FakeInstance("dead", PeerDied("gone"))]}
    ws = make_sync(insts, transport=DirectTransport(
        trainers, "ipc", tensor_parallel_size=1, dtype="float32", timeout_s=5.0))
    with pytest.raises(PeerDied, match="trainer died"):
        await ws.sync("x", 1, None)
    assert trainers.requests[0][1].dtype == "float32"
    for inst in insts["x"]:  # a dead one's failure does not hide the others' abort
        assert [(m.phase, m.version) for m in inst.got] == [("abort", 1)]
    assert ws.versions["x"] == 0


async def test_a_direct_transport_whose_pool_publishes_nothing_refuses_before_exporting(
        make_sync):
    """An instance joining between direct syncs loads the published version: a pool that
    publishes nothing is refused before its trainer exports (the tensors would come to the
    run first)."""
    trainers = FakeTrainers(publish="")
    ws = make_sync({"x": [FakeInstance("i0")]}, transport=DirectTransport(
        trainers, "nccl", tensor_parallel_size=1, dtype="auto", timeout_s=5.0))
    await ws.sync("x", 1, None)
    with pytest.raises(RuntimeError, match="publishes no weights"):
        async with ws.locked("x"):
            await ws.load_into(FakeInstance("new"), "x")
    assert trainers.exports == 0


async def test_the_instances_that_hold_the_served_version_become_its_copies(make_sync):
    """Each instance that reports a file of the version it loaded (WeightUpdateDone.held)
    is a holder of the served source (a joiner fetches from it when the trainer is gone):
    the latest first, one per address, and a new version starts with its own holders."""
    insts = {"x": [FakeInstance("i0", held={"host": "a", "path": "/a/v1"}),
                   FakeInstance("i1")]}
    ws = make_sync(insts)
    await ws.sync("x", 1, publish(1, weights(1.0)))
    served = await ws.served("x")
    assert served["copies"] == [{"host": "a", "path": "/a/v1", "address": "i0"}]
    joiner = FakeInstance("j", held={"host": "b", "path": "/b/copy-1"})
    async with ws.locked("x"):
        await ws.load_into(joiner, "x")
    assert [h["address"] for h in (await ws.served("x"))["copies"]] == ["j", "i0"]
    assert [h["address"] for h in published.holders(await ws.served("x"))] == \
        ["inproc://no-trainer", "j", "i0"]
    insts["x"][0].held = {"host": "a", "path": "/a/v2"}
    await ws.sync("x", 2, publish(2, weights(2.0)))
    assert (await ws.served("x"))["copies"] == [{"host": "a", "path": "/a/v2", "address": "i0"}]
