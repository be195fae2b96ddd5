"""flexmarl.weights.published: the files a trainer's rank 0 writes once per version and the
instances read (pure and fast: files under tmp_path, no process; a trainer serving FetchWeights
and an instance fetching from it: tests/test_trainer.py; nodes on "other hosts":
tests/test_multinode.py)."""
from __future__ import annotations

import os

import pytest
import torch
from safetensors.torch import load_file, save_file

from flexmarl.weights import published


@pytest.fixture(autouse=True)
def weights_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("FLEXMARL_WEIGHTS_DIR", str(tmp_path / "published"))
    return tmp_path / "published"


def tensors(value: float) -> dict[str, torch.Tensor]:
    return {"a": torch.full((3, 2), value), "b": torch.full((5,), value, dtype=torch.bfloat16)}


def test_a_version_is_a_safetensors_file_any_reader_reads():
    run = published.run_name()
    source = published.publish(tensors(1.0), run, "solver", 3, "tcp://t:1")
    assert source["num_bytes"] == 3 * 2 * 4 + 5 * 2 and source["version"] == 3
    assert source["host"] == published.host_id() and source["address"] == "tcp://t:1"
    theirs = load_file(source["path"])  # safetensors' own reader
    ours = published.load(source["path"], 3)
    for k, v in tensors(1.0).items():
        assert torch.equal(theirs[k], v) and torch.equal(ours[k], v)
    assert published.version_of(source["path"]) == 3
    assert published.names_of(source["path"]) == ["a", "b"]


def test_versions_take_two_files_in_turn_rewritten_in_place():
    """v and v+2 share a file (the same inode: no fresh tmpfs pages), v+1 has the other; a
    reader that names an overwritten version is told, not handed the newer weights."""
    run = published.run_name()
    s1 = published.publish(tensors(1.0), run, "x", 1, "")
    s2 = published.publish(tensors(2.0), run, "x", 2, "")
    inode = os.stat(s1["path"]).st_ino
    s3 = published.publish(tensors(3.0), run, "x", 3, "")
    assert s3["path"] == s1["path"] != s2["path"] and os.stat(s3["path"]).st_ino == inode
    assert published.load(s2["path"], 2)["a"].eq(2.0).all()  # the served one stays
    assert published.load(s3["path"], 3)["a"].eq(3.0).all()
    with pytest.raises(FileNotFoundError, match="holds version 3 now, not 1"):
        published.load(s1["path"], 1)
    # Another layout (a partial update beside full ones) gets a new file under the same name.
    s5 = published.publish({"a": torch.zeros(3, 2)}, run, "x", 5, "")
    assert s5["path"] == s1["path"] and os.stat(s5["path"]).st_ino != inode
    assert list(published.load(s5["path"], 5)) == ["a"]


def test_names_that_would_leave_the_run_directory_are_refused():
    run = published.run_name()
    for agent in ("../x", "a/b", "", ".."):
        with pytest.raises(ValueError, match="cannot name published weights"):
            published.publish(tensors(1.0), run, agent, 1, "")
    with pytest.raises(ValueError, match="must start with"):
        published.publish(tensors(1.0), "my-run", "x", 1, "")


def test_only_files_it_published_count_as_published(tmp_path, weights_dir):
    """FetchWeights serves a path a request names: only a version file under a run's dir on
    this host, never any other file the trainer can read."""
    source = published.publish(tensors(1.0), published.run_name(), "x", 1, "")
    assert published.is_published(source["path"])
    other = tmp_path / "model.safetensors"
    save_file(tensors(1.0), str(other))
    (weights_dir / "flexmarl-weights-1-a" / "x").mkdir(parents=True)
    link = weights_dir / "flexmarl-weights-1-a" / "x" / "v0-1.safetensors"
    link.symlink_to(other)  # resolves outside the root
    escaped = os.path.join(os.path.dirname(source["path"]), "..", "..", "..",
                           "model.safetensors")
    for path in (str(other), str(link), escaped, "/etc/passwd", source["path"] + ".tmp"):
        assert not published.is_published(path), path


async def test_an_instance_reads_the_file_here_and_fetches_it_from_elsewhere(tmp_path,
                                                                           monkeypatch):
    source = published.publish(tensors(1.0), published.run_name(), "x", 1, "tcp://trainer:1")
    fetched = []

    async def fetch(src):
        fetched.append(src["path"])
        return tensors(7.0)
    assert (await published.read(source, fetch))["a"].eq(1.0).all() and fetched == []
    # On another host (the file is not there for it), from the trainer.
    monkeypatch.setattr(published, "host_id", lambda: "elsewhere")
    assert (await published.read(source, fetch))["a"].eq(7.0).all()
    assert fetched == [source["path"]]
    with pytest.raises(FileNotFoundError, match="names no trainer"):
        await published.read(source | {"address": ""}, fetch)
    # A base model directory loads first, the file over it (a partial update whole).
    base = tmp_path / "model"
    base.mkdir()
    save_file({"a": torch.zeros(3, 2), "c": torch.ones(4)}, str(base / "model.safetensors"))
    monkeypatch.undo()
    whole = await published.read(source | {"base": str(base)}, fetch)
    assert set(whole) == {"a", "b", "c"} and whole["a"].eq(1.0).all()


def test_a_run_removes_its_files_and_a_writer_only_its_own(weights_dir):
    run = published.run_name()
    mine = published.publish(tensors(1.0), run, "x", 1, "")
    theirs = weights_dir / run / "y" / "v0-999999.safetensors"
    theirs.parent.mkdir(parents=True)
    save_file(tensors(1.0), str(theirs))
    published.remove_own(run)
    assert not os.path.exists(mine["path"]) and theirs.exists()
    published.remove(run)
    assert not (weights_dir / run).exists()
    # A run whose process is gone (pid 999999 is not alive) is an orphan; a live one is not.
    dead, live = weights_dir / "flexmarl-weights-999999-ab", weights_dir / run
    dead.mkdir()
    published.publish(tensors(1.0), run, "x", 1, "")
    published.remove_orphans()
    assert not dead.exists() and live.exists()
