"""flexmarl.training.state_files (StateCheckpoints, re-exported by flexmarl.launch.checkpoint) and
flexmarl.launch.checkpoint: per-step training state on disk, bit for bit, atomic under SIGKILL.

The trainer test builds a 2-layer Qwen2 (about 80k parameters) here, never downloaded.
"""
from __future__ import annotations

import logging
import os
import pickle
import random
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import orjson
import pytest
import torch

from flexmarl.launch.checkpoint import (
    META_FILE,
    STATE_DIR,
    STATE_FILE,
    CheckpointError,
    StateCheckpoints,
    SaveSchedule,
    drop_records_after,
    resume_point,
)
from flexmarl.protocol import TrainMicroBatch, TrainState
from flexmarl.observe.rundir import METRICS_FILE, MetricsWriter, read_metrics

VOCAB = 64


def state(agent: str, step: int, n: int = 8) -> TrainState:
    """A small state whose every value is a function of `step`."""
    return TrainState(agent, step + 1, {
        "model/w": torch.arange(n, dtype=torch.float32) + step,
        "optim/w/step": torch.tensor(float(step)),
        "rng/cpu": (torch.arange(n) + step).to(torch.uint8)},
        {"version": step + 1, "param_groups": [{"lr": 1e-3, "betas": [0.9, 0.999]}]})


def assert_same(a: TrainState, b: TrainState) -> None:
    assert (a.agent, a.version, a.meta) == (b.agent, b.version, b.meta)
    assert a.tensors.keys() == b.tensors.keys()
    for k, x in a.tensors.items():
        y = b.tensors[k]
        assert (x.dtype, x.shape) == (y.dtype, y.shape), k
        # Bits, not values: NaN != NaN and -0.0 == 0.0 would hide a difference.
        assert torch.equal(x.reshape(-1).view(torch.uint8), y.reshape(-1).view(torch.uint8)), k


def leftovers(root: Path) -> list[str]:
    return sorted(p.name for p in root.glob("*/.*"))


# ----------------------------------------------------------------------------- round trips

def test_trainer_state_round_trips_and_resumes_bit_for_bit(tmp_path):
    """export_state -> save -> load -> load_state into a fresh trainer: the next step of both
    trainers gives the same state, bit for bit."""
    import transformers

    from flexmarl.training.trainer import GRPOTrainer, export_state, load_state
    from flexmarl.config.training import TrainerConfig

    cfg = transformers.Qwen2Config(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
                                   num_attention_heads=2, num_key_value_heads=1,
                                   intermediate_size=64, max_position_embeddings=64,
                                   tie_word_embeddings=True)
    torch.manual_seed(1234)
    transformers.Qwen2ForCausalLM(cfg).save_pretrained(tmp_path / "model")
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, VOCAB, (4, 10), generator=g)
    resp = torch.ones_like(ids)
    resp[:, :4] = 0
    mb = TrainMicroBatch(ids, torch.ones_like(ids), resp, torch.full((4, 10), -4.0),
                         torch.randn(4, generator=g), ref_logprobs=torch.full((4, 10), -4.0))

    def train_step(trainer: GRPOTrainer) -> None:
        trainer.begin_batch(int(resp.sum()))
        trainer.accumulate(mb)
        trainer.step()

    first = GRPOTrainer(str(tmp_path / "model"), TrainerConfig(lr=1e-2, seed=0))
    train_step(first)
    tensors, meta = export_state(first)
    assert any(t.dim() == 0 for t in tensors.values()), "AdamW's step should be 0-dim"
    assert tensors["rng/cpu"].dtype == torch.uint8
    saved = TrainState("alice", first.version, tensors, meta)
    ckpt = StateCheckpoints(tmp_path / STATE_DIR)
    ckpt.save("alice", 0, saved)
    loaded = StateCheckpoints(tmp_path / STATE_DIR).load("alice", 0)
    # meta is JSON on disk: the param_groups' betas tuple comes back a list.
    assert_same(TrainState("alice", saved.version, saved.tensors,
                           orjson.loads(orjson.dumps(meta))), loaded)
    assert loaded.meta["param_groups"][0]["betas"] == list(meta["param_groups"][0]["betas"])

    second = GRPOTrainer(str(tmp_path / "model"), TrainerConfig(lr=1e-2, seed=1))
    load_state(second, loaded.tensors, loaded.meta)
    train_step(first)
    train_step(second)
    after_first, _ = export_state(first)
    after_second, meta_second = export_state(second)
    assert not torch.equal(after_first["model/model.norm.weight"],
                           tensors["model/model.norm.weight"]), "the step changed nothing"
    assert_same(TrainState("a", 2, after_first, {}), TrainState("a", 2, after_second, {}))
    assert meta_second["version"] == 2


def test_odd_tensors_round_trip_bit_for_bit(tmp_path):
    base = torch.arange(12, dtype=torch.float32)
    odd = {
        "zero_dim/f32": torch.tensor(3.5), "zero_dim/i64": torch.tensor(2**40),
        "zero_dim/bf16": torch.tensor(-1.25, dtype=torch.bfloat16),
        "zero_dim/bool": torch.tensor(True),
        "empty/a": torch.zeros(0), "empty/b": torch.zeros(0, 3, dtype=torch.float16),
        "transposed": base.reshape(3, 4).t(),  # not contiguous
        "view/head": base[:6], "view/tail": base[6:],  # one storage, two names
        "alias/1": base, "alias/2": base,  # one tensor, two names
        "specials": torch.tensor([float("nan"), -0.0, float("inf"), -float("inf"), 1e-45]),
        "rng/cpu": torch.get_rng_state(),
        "grad": torch.ones(3, requires_grad=True) * 2,
    }
    ckpt = StateCheckpoints(tmp_path)
    saved = TrainState("a", 7, odd, {"nested": {"x": [1, 2.5, None, True, "s"]}})
    ckpt.save("a", 0, saved)
    loaded = ckpt.load("a", 0)
    assert_same(TrainState("a", 7, {k: v.detach() for k, v in odd.items()}, saved.meta), loaded)
    assert loaded.tensors["transposed"].shape == (4, 3)
    assert torch.equal(base, torch.arange(12, dtype=torch.float32)), "save changed the input"


def test_save_refuses_what_it_cannot_round_trip(tmp_path):
    ckpt = StateCheckpoints(tmp_path)
    bad = [state("a", 0), state("a", 0), state("a", 0), state("a", 0), state("b", 0)]
    bad[0].tensors["__metadata__"] = torch.ones(1)  # safetensors would write an unreadable file
    bad[1].tensors["count"] = 3
    bad[2].tensors["sparse"] = torch.ones(2).to_sparse()
    bad[3].meta["groups"] = {1, 2}  # a set: not JSON
    for s in bad:
        with pytest.raises(CheckpointError, match="agent 'a' step 0"):
            ckpt.save("a", 0, s)
    assert ckpt.steps("a") == [] and leftovers(tmp_path) == []
    for agent, step in (("", 0), (".", 0), ("..", 0), ("x/y", 0), ("a", -1), ("a", True)):
        with pytest.raises(ValueError):
            ckpt.save(agent, step, state(agent, 0))
    assert [p.name for p in tmp_path.iterdir()] == ["a"]


# ----------------------------------------------------------------------------- listing, deleting

def test_steps_agents_prune_and_drop_after(tmp_path):
    ckpt = StateCheckpoints(tmp_path)
    for step in range(6):
        ckpt.save("bob", step, state("bob", step))
        if step % 2:
            ckpt.save("alice", step, state("alice", step))
    (tmp_path / "carol").mkdir()  # no state: not an agent with saved state
    for junk in ("step-1", "step-0000007", "step-00000x", "notes", ".tmp-step-000009-zz"):
        (tmp_path / "bob" / junk).mkdir()
    (tmp_path / "bob" / "step-000008").write_text("a file, not a step dir")
    assert ckpt.agents() == ["alice", "bob"]
    assert ckpt.steps("bob") == [0, 1, 2, 3, 4, 5]
    assert ckpt.steps("alice") == [1, 3, 5] and ckpt.steps("nobody") == []

    ckpt.prune(2)
    assert ckpt.steps("bob") == [2, 3, 4, 5] and ckpt.steps("alice") == [3, 5]
    ckpt.drop_after(3)
    assert ckpt.steps("bob") == [2, 3] and ckpt.steps("alice") == [3]
    ckpt.drop_after(2)
    assert ckpt.agents() == ["bob"]
    assert_same(ckpt.load("bob", 2), state("bob", 2))
    assert not list((tmp_path / "alice").iterdir())  # deleted, not just hidden


def test_save_over_an_existing_step_replaces_it(tmp_path):
    ckpt = StateCheckpoints(tmp_path)
    ckpt.save("a", 3, state("a", 3))
    ckpt.save("a", 3, state("a", 30))
    assert ckpt.steps("a") == [3]
    assert_same(ckpt.load("a", 3), state("a", 30))
    assert leftovers(tmp_path) == []


# ----------------------------------------------------------------------------- interrupted saves

class Killed(BaseException):
    """Stands for the process dying at that instant: nothing after it runs."""


def fail_rename(monkeypatch, exc: BaseException, at: int = 1) -> None:
    """Make the `at`-th os.rename from now raise `exc`."""
    real, calls = os.rename, []

    def rename(src, dst):
        calls.append(src)
        if len(calls) == at:
            raise exc
        real(src, dst)
    monkeypatch.setattr(os, "rename", rename)


def test_a_save_killed_before_its_rename_leaves_no_step(tmp_path, monkeypatch, caplog):
    ckpt = StateCheckpoints(tmp_path)
    fail_rename(monkeypatch, Killed())
    with pytest.raises(Killed):
        ckpt.save("a", 0, state("a", 0))
    monkeypatch.undo()
    assert ckpt.steps("a") == [] and ckpt.agents() == []
    assert len(leftovers(tmp_path)) == 1 and leftovers(tmp_path)[0].startswith(".tmp-step-000000")
    with caplog.at_level(logging.INFO, logger="flexmarl.training.state_files"):
        StateCheckpoints(tmp_path)
    assert leftovers(tmp_path) == [] and "interrupted save" in caplog.text


def test_a_failed_save_cleans_up_after_itself(tmp_path, monkeypatch):
    ckpt = StateCheckpoints(tmp_path)
    fail_rename(monkeypatch, OSError(28, "No space left on device"))
    # The OS's message often names no file (ENOSPC from a write): the error names the step dir.
    where = re.escape(f"step 0 ({tmp_path / 'a' / 'step-000000'}): ")
    with pytest.raises(CheckpointError, match=where + "cannot write the state .*No space"):
        ckpt.save("a", 0, state("a", 0))
    assert ckpt.steps("a") == [] and leftovers(tmp_path) == []


def test_a_disk_full_in_safetensors_is_a_checkpoint_error_naming_the_dir(tmp_path, monkeypatch):
    """safetensors reports a full disk as its own SafetensorError, not an OSError."""
    from safetensors import SafetensorError

    def full(tensors, path):
        raise SafetensorError("Error while serializing: I/O error: No space left on device "
                              "(os error 28)")

    monkeypatch.setattr("flexmarl.training.state_files.save_file", full)
    ckpt = StateCheckpoints(tmp_path)
    with pytest.raises(CheckpointError, match="step-000002.*No space left"):
        ckpt.save("a", 2, state("a", 2))
    assert ckpt.steps("a") == [] and leftovers(tmp_path) == []


@pytest.mark.parametrize("exc", [Killed(), OSError(5, "I/O error")])
def test_a_replacing_save_cut_between_its_renames_keeps_the_old_state(tmp_path, monkeypatch,
                                                                      exc):
    ckpt = StateCheckpoints(tmp_path)
    ckpt.save("a", 3, state("a", 3))
    fail_rename(monkeypatch, exc, at=2)  # the old one is moved aside, the new one not in
    with pytest.raises(CheckpointError if isinstance(exc, OSError) else type(exc)):
        ckpt.save("a", 3, state("a", 30))
    monkeypatch.undo()
    after = StateCheckpoints(tmp_path)
    assert after.steps("a") == [3] and leftovers(tmp_path) == []
    assert_same(after.load("a", 3), state("a", 3))


def test_a_delete_killed_midway_leaves_no_half_step(tmp_path, monkeypatch):
    ckpt = StateCheckpoints(tmp_path)
    for step in range(3):
        ckpt.save("a", step, state("a", step))

    def rmtree_one_file(path, ignore_errors=False):
        next(Path(path).rglob(STATE_FILE)).unlink()
        raise Killed()
    monkeypatch.setattr(shutil, "rmtree", rmtree_one_file)
    with pytest.raises(Killed):
        ckpt.prune(1)
    monkeypatch.undo()
    assert ckpt.steps("a") == [1, 2]
    assert StateCheckpoints(tmp_path).steps("a") == [1, 2] and leftovers(tmp_path) == []


# ----------------------------------------------------------------------------- damaged states

def flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x01  # in the tensor data, past the header
    path.write_bytes(bytes(data))


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:-5])


def edit_meta(**changes):
    def edit(path: Path) -> None:
        record = orjson.loads(path.read_bytes())
        path.write_bytes(orjson.dumps(record | changes))
    return edit


@pytest.mark.parametrize("file, damage, message", [
    (STATE_FILE, flip_byte, "sha256 differs"),
    (STATE_FILE, truncate, "truncated"),
    (STATE_FILE, Path.unlink, "No such file"),
    (META_FILE, truncate, "unreadable"),
    (META_FILE, Path.unlink, "unreadable"),
    (META_FILE, edit_meta(format=2), "format 2"),
    (META_FILE, edit_meta(step=4), "not agent 'a' step 3"),
    (META_FILE, edit_meta(agent="b"), "not agent 'a' step 3"),
])
def test_a_damaged_state_is_refused_naming_the_file(tmp_path, file, damage, message):
    ckpt = StateCheckpoints(tmp_path)
    path = ckpt.save("a", 3, state("a", 3, n=64)) / file
    ckpt.load("a", 3)
    damage(path)
    with pytest.raises(CheckpointError, match=message) as e:
        ckpt.load("a", 3)
    assert str(path) in str(e.value)


def test_loading_a_step_never_saved_names_the_path(tmp_path):
    ckpt = StateCheckpoints(tmp_path)
    ckpt.save("a", 1, state("a", 1))
    with pytest.raises(CheckpointError, match=r"step-000002 does not exist \(saved steps: \[1\]"):
        ckpt.load("a", 2)


# ----------------------------------------------------------------------------- untrusted .metadata

def dcp_state(ckpt: StateCheckpoints, agent: str, step: int, tensors: dict,
                  metadata: bytes | None = None) -> Path:
    """A format-2 state as a slot's ranks leave it: DCP files (here from one process), committed
    with their sha256s. `metadata`: written over DCP's .metadata first, as someone who made the
    run dir could (the sha256s in meta.json are then of the file they wrote)."""
    import warnings

    import torch.distributed.checkpoint as dcp

    from flexmarl.training.state_files import commit_step

    tmp, target = ckpt.begin(agent, step)
    with warnings.catch_warnings():  # "no process group: saving in a single process": meant
        warnings.simplefilter("ignore", UserWarning)
        dcp.save(tensors, storage_writer=dcp.FileSystemWriter(tmp), no_dist=True)
    if metadata is not None:
        (tmp / ".metadata").write_bytes(metadata)
    return commit_step(tmp, target, agent, step, 1, {})[0]


def test_a_sharded_state_loads_through_the_safe_reader(tmp_path, monkeypatch):
    ckpt = StateCheckpoints(tmp_path)
    saved = state("a", 3, n=64).tensors
    dcp_state(ckpt, "a", 3, saved)
    # torch's own reader would pickle.load the metadata: never called on this path.
    monkeypatch.setattr(pickle, "load", lambda *a, **k: pytest.fail("pickle.load was called"))
    assert_same(TrainState("a", 1, saved, {}), ckpt.load("a", 3))


def _payloads(marker: Path) -> dict[str, bytes]:
    """Pickles that run code when a plain pickle.load reads them: each creates `marker`."""
    class System:
        def __reduce__(self):
            return os.system, (f"touch {marker}",)

    class Eval:
        def __reduce__(self):
            return eval, (f"open({str(marker)!r}, 'w').close()",)

    return {"os.system": pickle.dumps(System()), "builtins.eval": pickle.dumps(Eval())}


@pytest.mark.parametrize("kind, name", [("os.system", "system"), ("builtins.eval", "eval")])
def test_a_metadata_pickle_that_runs_code_is_refused_unrun(tmp_path, kind, name):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    from flexmarl.training.safe_dcp import SafeReader
    from flexmarl.training.state_files import read_whole

    marker = tmp_path / "ran"
    payload = _payloads(marker)[kind]
    pickle.loads(payload)  # the payload is real: a plain unpickling runs it
    assert marker.exists()
    marker.unlink()
    ckpt = StateCheckpoints(tmp_path / "states")
    path = dcp_state(ckpt, "a", 3, state("a", 3).tensors, metadata=payload)
    with pytest.raises(pickle.UnpicklingError, match=rf"names \w+\.{name}, .*refused unread.*"
                       "not a DCP checkpoint made by FlexMARL"):
        read_whole(path)
    with pytest.raises(CheckpointError, match="UnpicklingError.*not a DCP checkpoint made by"):
        ckpt.load("a", 3)
    # As a slot's ranks read it (flexmarl.training.sharded_state.read): DCP wraps the error.
    with pytest.raises(CheckpointException, match="not a DCP checkpoint made by FlexMARL"):
        dcp.load({"model/w": torch.zeros(8)}, storage_reader=SafeReader(str(path)), no_dist=True)
    assert not marker.exists()


def test_metadata_of_allowed_classes_in_the_wrong_places_is_refused(tmp_path):
    """A "bytes" entry (DCP reads it with torch.load(weights_only=False): a second pickle), a
    data file outside the checkpoint dir and a pickle of something else than DCP's Metadata."""
    import dataclasses

    from torch.distributed.checkpoint.metadata import BytesStorageMetadata

    from flexmarl.training.state_files import read_whole

    ckpt = StateCheckpoints(tmp_path)
    good = dcp_state(ckpt, "a", 0, state("a", 0).tensors)
    metadata = pickle.loads((good / ".metadata").read_bytes())  # our own file: trusted here
    with_bytes = dataclasses.replace(metadata, state_dict_metadata={
        **metadata.state_dict_metadata, "model/w": BytesStorageMetadata()})
    escaping = dataclasses.replace(metadata, storage_data={
        k: dataclasses.replace(v, relative_path="../../elsewhere.distcp")
        for k, v in metadata.storage_data.items()})
    for step, (bad, message) in enumerate([
            (with_bytes, "BytesStorageMetadata, which a FlexMARL checkpoint's metadata never"),
            (escaping, "data file '../../elsewhere.distcp' is not a file of the checkpoint dir"),
            (metadata.storage_meta, "holds a StorageMeta, not DCP Metadata")], start=1):
        path = dcp_state(ckpt, "a", step, state("a", step).tensors,
                             metadata=pickle.dumps(bad))
        with pytest.raises(pickle.UnpicklingError, match=re.escape(message)):
            read_whole(path)


# ----------------------------------------------------------------------------- a real SIGKILL

CRASHING_SAVER = textwrap.dedent("""
    import sys, torch
    from flexmarl.launch.checkpoint import StateCheckpoints
    from flexmarl.protocol import TrainState
    ckpt = StateCheckpoints(sys.argv[1])
    for step in range(1000):
        n = 5_000_000  # 20 MB of float32
        ckpt.save("a", step, TrainState("a", step, {
            "model/w": torch.arange(n, dtype=torch.float32) * (step + 1),
            "optim/w/step": torch.tensor(float(step))}, {"step": step}))
        ckpt.prune(step - 2)  # deletions get killed too
        print(step, flush=True)
""")


@pytest.mark.parametrize("seed", [0, 1])
def test_states_survive_sigkill_at_a_random_instant(tmp_path, seed):
    root = tmp_path / STATE_DIR
    proc = subprocess.Popen([sys.executable, "-c", CRASHING_SAVER, str(root)],
                            stdout=subprocess.PIPE, text=True)
    try:
        acknowledged = int(proc.stdout.readline())  # blocks until the first save is done
        time.sleep(random.Random(seed).uniform(0.0, 0.5))
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    rest = proc.stdout.read().split()
    proc.stdout.close()
    acknowledged = int(rest[-1]) if rest else acknowledged

    ckpt = StateCheckpoints(root)
    steps = ckpt.steps("a")
    assert steps and steps[-1] >= acknowledged and acknowledged in steps
    assert steps == list(range(steps[0], steps[-1] + 1)) and len(steps) <= 4
    for step in steps:
        loaded = ckpt.load("a", step)
        assert loaded.version == step and loaded.meta == {"step": step}
        assert torch.equal(loaded.tensors["model/w"],
                           torch.arange(5_000_000, dtype=torch.float32) * (step + 1))
        assert loaded.tensors["optim/w/step"].shape == () and \
            loaded.tensors["optim/w/step"].item() == step
    assert leftovers(root) == []


# ----------------------------------------------------------------------------- resume_point

def write_metrics(run_dir: Path, steps: range, torn: bytes = b"") -> None:
    with MetricsWriter(run_dir / METRICS_FILE) as m:
        m.write({"event": "start"})  # a record without a step
        for step in steps:
            m.write({"step": step, "team_reward": 0.5})
    with open(run_dir / METRICS_FILE, "ab") as f:
        f.write(torn)


def test_resume_point_is_zero_without_step_records(tmp_path):
    assert resume_point(tmp_path, ["a"]) == 0
    (tmp_path / METRICS_FILE).write_bytes(b"")
    assert resume_point(tmp_path, ["a"]) == 0
    write_metrics(tmp_path, range(0))
    assert resume_point(tmp_path, ["a"]) == 0


def test_resume_point_is_after_the_last_step_record(tmp_path):
    ckpt = StateCheckpoints(tmp_path / STATE_DIR)
    for agent in ("a", "b"):
        for step in (2, 3, 4):  # step 4: saved, then killed before its record
            ckpt.save(agent, step, state(agent, step))
    write_metrics(tmp_path, range(4), torn=b'{"step": 4, "team_rew')
    assert resume_point(tmp_path, ["a", "b"]) == 4
    write_metrics(tmp_path, range(0))  # the torn line is cut, then a start record
    assert resume_point(tmp_path, ["a", "b"]) == 4


def test_resume_point_needs_every_agents_state(tmp_path):
    write_metrics(tmp_path, range(4))
    with pytest.raises(CheckpointError, match=r"step 3 for agent\(s\) 'a' "):
        resume_point(tmp_path, ["a"])  # a run made with run.save_state off
    assert not (tmp_path / STATE_DIR).exists()
    ckpt = StateCheckpoints(tmp_path / STATE_DIR)
    ckpt.save("a", 3, state("a", 3))
    ckpt.save("b", 2, state("b", 2))
    with pytest.raises(CheckpointError, match=r"step 3 for agent\(s\) 'b', 'c' .*save_state"):
        resume_point(tmp_path, ["a", "b", "c"])
    assert resume_point(tmp_path, ["a"]) == 4


def test_resume_point_is_after_the_last_step_every_agent_saved(tmp_path):
    """run.save_every: the records may run ahead of the last common saved step."""
    ckpt = StateCheckpoints(tmp_path / STATE_DIR)
    for step in (1, 3):
        ckpt.save("a", step, state("a", step))
    ckpt.save("b", 1, state("b", 1))
    write_metrics(tmp_path, range(5))
    assert resume_point(tmp_path, ["a"]) == 4
    assert resume_point(tmp_path, ["a", "b"]) == 2  # b's step 3 was never written
    ckpt.save("b", 6, state("b", 6))  # after the last record: not a resume point
    assert resume_point(tmp_path, ["b"]) == 2


def test_drop_records_after_cuts_the_redone_steps_in_place(tmp_path):
    write_metrics(tmp_path, range(5), torn=b'{"step": 5, "te')
    path = tmp_path / METRICS_FILE
    with MetricsWriter(path) as writer:  # open (O_APPEND) while the file is cut, as in a run
        assert drop_records_after(tmp_path, 2) == 2  # steps 3 and 4; the torn line goes too
        writer.write({"step": 3, "team_reward": 1.0})
    records = read_metrics(path)
    assert [r.get("step") for r in records] == [None, 0, 1, 2, 3]
    assert records[-1]["team_reward"] == 1.0
    assert drop_records_after(tmp_path, 9) == 0


@pytest.mark.parametrize("every,steps,first", [(1, 5, 0), (2, 5, 0), (3, 10, 0), (4, 10, 3),
                                               (5, 3, 0)])
def test_save_schedule_keeps_a_saved_step_at_or_before_every_record(every, steps, first):
    schedule = SaveSchedule(every, steps, first)
    saved = [s for s in range(first, steps) if schedule.saves(s)]
    assert saved[-1] == steps - 1  # the last step is always written
    assert all((s + 1) % every == 0 for s in saved[:-1])
    for step in range(first, steps):
        expected = max([s for s in saved if s <= step], default=first - 1)
        assert schedule.last_saved(step) == expected, step
