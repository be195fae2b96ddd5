"""flexmarl.weights.published: the files a trainer's rank 0 writes once per version and the
instances read (pure and fast: files under tmp_path, no process; a trainer serving FetchWeights
and an instance fetching from it: tests/test_trainer.py; nodes on "other hosts":
tests/test_multinode.py)."""
from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import threading
from pathlib import Path

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
    # Another layout (a partial update beside full ones): the file it would take goes, and
    # the version gets a new one; the newest (v3) stays.
    s5 = published.publish({"a": torch.zeros(3, 2)}, run, "x", 5, "")
    assert s5["path"] not in (s1["path"], s2["path"]) and not os.path.exists(s2["path"])
    assert list(published.load(s5["path"], 5)) == ["a"]
    assert published.load(s3["path"], 3)["a"].eq(3.0).all()


def test_a_reader_two_versions_behind_keeps_its_version_while_the_writer_goes_on():
    """No torn read, whatever the loop's order: a reader holding v1 (a slow or joining
    instance) while the writer publishes v3, v4, v5 keeps v1 intact (the writer writes new
    files instead of taking the held one), and once it lets go the files shrink back to two."""
    run = published.run_name()
    s1 = published.publish(tensors(1.0), run, "x", 1, "")
    published.publish(tensors(2.0), run, "x", 2, "")
    with published.holding(s1["path"], 1) as views:
        later = [published.publish(tensors(float(v)), run, "x", v, "") for v in (3, 4, 5)]
        assert all(t.eq(1.0).all() for t in views.values())  # never rewritten under it
        assert s1["path"] not in [s["path"] for s in later]
        for s in later[-2:]:  # the newest two stay readable meanwhile
            assert published.load(s["path"], s["version"])["a"].eq(s["version"]).all()
    for v in (6, 7):
        last = published.publish(tensors(float(v)), run, "x", v, "")
    assert len(list(Path(last["path"]).parent.glob("*.safetensors"))) == 2
    assert published.load(last["path"], 7)["b"].eq(7.0).all()


def test_readers_racing_a_writer_get_whole_versions_or_are_told_it_moved_on():
    """A writer publishing as fast as it can, readers loading (and serving, as FetchWeights
    does) the versions it names meanwhile (threads: a flock is per open file, so they
    exclude each other as processes would, and the mapping caches are shared): every read is
    one whole version (all values equal to it) or FileNotFoundError, never a mix, and nothing
    else fails (the red team saw the shared caches raise while changed under a reader)."""
    run = published.run_name()
    names: list[dict] = [published.publish(tensors(0.0), run, "x", 0, "")]
    stop = threading.Event()
    mixed, errors, loaded = [], [], [0]

    def reader(serving: bool):
        while not stop.is_set():
            source = names[-1 - (loaded[0] % min(3, len(names)))]  # lag up to two behind
            try:
                if serving:
                    version, got = published.serve(source["path"])
                else:
                    version, got = source["version"], published.load(source["path"],
                                                                     source["version"])
            except FileNotFoundError:
                continue
            except Exception as exc:  # noqa: BLE001 - any other failure is the finding
                errors.append(repr(exc))
                continue
            loaded[0] += 1
            values = {float(x) for t in got.values() for x in t.float().flatten()}
            if values != {float(version % 128)}:
                mixed.append((version, values))
    threads = [threading.Thread(target=reader, args=(serving,)) for serving in (0, 0, 1)]
    for t in threads:
        t.start()
    try:
        for v in range(1, 300):  # values v % 128: exact in bfloat16 too
            names.append(published.publish(tensors(float(v % 128)), run, "x", v, ""))
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert mixed == [] and errors == [] and loaded[0] > 0


def test_a_sweep_beside_runs_being_made_removes_none_of_them(weights_dir):
    """Another process makes, publishes into and removes runs in a tight loop while this one
    sweeps orphans: a run being made is never swept from under its maker (a directory with
    no lease yet gets one, taken exclusively, and its maker makes it again), and neither
    making nor removing fails (the red team's races: between mkdir and the lease, and between
    a release and the removal)."""
    maker = subprocess.Popen(
        [sys.executable, "-c",
         "import os, torch; from flexmarl.weights import published\n"
         "for i in range(400):\n"
         "    run = published.run_name()\n"
         "    s = published.publish({'a': torch.full((4,), float(i))}, run, 'x', 1, '')\n"
         "    assert published.load(s['path'], 1)['a'].eq(float(i)).all(), i\n"
         "    published.remove(run)\n"
         "print('made 400', flush=True)\n"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "FLEXMARL_WEIGHTS_DIR": str(weights_dir)})
    sweeps = 0
    while maker.poll() is None:
        published.remove_orphans()
        sweeps += 1
    out, err = maker.communicate()
    assert maker.returncode == 0 and out.strip() == "made 400", err[-2000:]
    assert sweeps > 10


@pytest.mark.skipif(os.geteuid() != 0, reason="making another user's directory needs root "
                    "(the check it exercises is the owner's uid)")
def test_another_users_runs_are_never_removed(weights_dir):
    weights_dir.mkdir(parents=True, exist_ok=True)
    theirs = weights_dir / published.run_name()
    (theirs / "x").mkdir(parents=True)
    os.chown(theirs, 12345, 12345)
    assert published.remove_orphans() == [] and (theirs / "x").exists()


def test_a_served_file_is_that_very_file_even_where_inodes_are_reused(tmp_path, weights_dir):
    """On ext4 a file made after one is deleted may get its inode number: a registration
    keeps its file open, so nothing made later at that path is served; nor is a FIFO there
    (the open does not block), and a root this makes is 0700."""
    source = published.publish(tensors(1.0), published.run_name(), "x", 1, "")
    assert stat.S_IMODE(weights_dir.stat().st_mode) == 0o700
    path = source["path"]
    published.serve(path)
    for _ in range(20):  # the red team's ext4 saw the inode reused on its first try
        os.unlink(path)
        save_file(tensors(-1.0), path)
        with pytest.raises(FileNotFoundError, match="replaced"):
            published.serve(path)
    os.unlink(path)
    os.mkfifo(path)
    result: list = []
    reader = threading.Thread(target=lambda: result.append(
        pytest.raises(FileNotFoundError, published.serve, path)), daemon=True)
    reader.start()
    reader.join(10)  # generous: an open that blocks on a FIFO never returns
    assert not reader.is_alive() and result


def test_names_that_would_leave_the_run_directory_are_refused():
    run = published.run_name()
    for agent in ("../x", "a/b", "", ".."):
        with pytest.raises(ValueError, match="cannot name published weights"):
            published.publish(tensors(1.0), run, agent, 1, "")
    with pytest.raises(ValueError, match="must start with"):
        published.publish(tensors(1.0), "my-run", "x", 1, "")


def test_only_files_this_process_wrote_are_served_and_nobody_else_may_read_them(
        tmp_path, weights_dir):
    """FetchWeights serves a path a request names: only a file this process published (or
    read), opened without following a link and checked to be that very file; files 0600 in
    0700 directories, so no other user of the host reads a run's weights."""
    run = published.run_name()
    source = published.publish(tensors(1.0), run, "x", 1, "")
    assert published.serve(source["path"])[0] == 1
    path = Path(source["path"])
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    for d in (path.parent, path.parent.parent):
        assert stat.S_IMODE(d.stat().st_mode) == 0o700, d
    # A file where published weights sit, written by someone else (a copy of a real one).
    planted = path.parent / "0123456789ab.safetensors"
    shutil.copyfile(path, planted)
    other = tmp_path / "model.safetensors"
    save_file(tensors(9.0), str(other))
    escaped = os.path.join(os.path.dirname(source["path"]), "..", "..", "..",
                           "model.safetensors")
    for hostile in (str(planted), str(other), escaped, "/etc/passwd", source["path"] + ".tmp"):
        with pytest.raises(FileNotFoundError):
            published.serve(hostile)
    # Its own path, swapped for a link to another file, or for another file: refused.
    saved = path.with_suffix(".kept")
    os.rename(path, saved)
    path.symlink_to(other)
    with pytest.raises(FileNotFoundError, match="link"):
        published.serve(str(path))
    path.unlink()
    shutil.copyfile(saved, path)
    with pytest.raises(FileNotFoundError, match="replaced"):
        published.serve(str(path))


def test_a_fetched_version_is_kept_once_per_host_and_its_holders_serve_it(weights_dir):
    """Instances that fetched a version from another host keep one copy of it on theirs
    (the first to finish writes it, the others use it), each may serve it, and copies two
    versions old go."""
    run = published.run_name()
    source = {"path": f"/elsewhere/{run}/x/abc.safetensors", "host": "other", "version": 1,
              "run": run, "agent": "x", "address": "tcp://t:1", "num_bytes": 0}
    first = published.keep_copy(tensors(1.0), source)
    again = published.keep_copy(tensors(1.0), source)  # a second instance of this host
    assert first == again and published.load(first, 1)["a"].eq(1.0).all()
    assert published.serve(first)[0] == 1
    for v in (2, 3):
        last = published.keep_copy(tensors(float(v)), source | {"version": v})
    assert not os.path.exists(first) and published.serve(last)[0] == 3
    assert sorted(p.name for p in Path(last).parent.iterdir()) == \
        ["copy-2.safetensors", "copy-3.safetensors"]


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
    with pytest.raises(FileNotFoundError, match="names no trainer or instance"):
        await published.read(source | {"address": ""}, fetch)
    # A base model directory loads first, the file over it (a partial update whole).
    base = tmp_path / "model"
    base.mkdir()
    save_file({"a": torch.zeros(3, 2), "c": torch.ones(4)}, str(base / "model.safetensors"))
    monkeypatch.undo()
    whole = await published.read(source | {"base": str(base)}, fetch)
    assert set(whole) == {"a", "b", "c"} and whole["a"].eq(1.0).all()


def hold(run: str, weights_dir: Path) -> subprocess.Popen:
    """Another process holding `run`'s lease under weights_dir (until killed)."""
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys; from pathlib import Path; from flexmarl.weights import ownership; "
         f"folder = ownership.lease({run!r}, Path({str(weights_dir)!r})); "
         "(folder / 'x').mkdir(exist_ok=True); print('held', flush=True); sys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    return holder


def test_a_run_removes_its_files_and_a_writer_only_its_own(weights_dir):
    """A writer stopping removes its own files; the run's directory stays while another
    process holds it, and goes with the last holder (or with the run's end)."""
    run = published.run_name()
    mine = published.publish(tensors(1.0), run, "x", 1, "")
    holder = hold(run, weights_dir)
    try:
        theirs = weights_dir / run / "y" / "0123456789ab.safetensors"
        theirs.parent.mkdir()
        save_file(tensors(1.0), str(theirs))
        published.remove_own(run)
        assert not os.path.exists(mine["path"]) and theirs.exists()
    finally:
        holder.kill()
        holder.wait()
    published.remove(run)
    assert not (weights_dir / run).exists()
    alone = published.run_name()
    published.publish(tensors(1.0), alone, "x", 1, "")
    published.remove_own(alone)  # nobody else holds it: the last holder cleans up
    assert not (weights_dir / alone).exists()


def test_orphans_are_runs_nobody_holds_whatever_their_pids(weights_dir):
    """A run's files belong to whoever holds its lease, not to a pid: a live run whose holder
    is in another pid namespace or on another host (here: a process that holds the lease of
    a directory named after a pid that is not alive) keeps its files; once its holder is gone
    (SIGKILL: the kernel drops the lock) the next run's start removes them."""
    held = weights_dir / "flexmarl-weights-999999-ab"  # the old scheme's "dead pid 999999"
    holder = hold(held.name, weights_dir)
    try:
        orphan = weights_dir / published.run_name()
        (orphan / "x").mkdir(parents=True)  # no lease at all: a SIGKILLed run's, or older
        mine = published.run_name()
        published.publish(tensors(1.0), mine, "x", 1, "")  # this process holds its lease
        assert published.remove_orphans() == [orphan]
        assert (held / "x").exists() and (weights_dir / mine / "x").exists()
    finally:
        holder.kill()
        holder.wait()
    assert published.remove_orphans() == [held]
    assert (weights_dir / mine).exists()
    published.remove(mine)


def test_registrations_are_one_per_file_and_go_with_their_file(weights_dir):
    """Threads registering one file at once keep one descriptor of it (the red team's second
    round leaked one per lost race, each pinning its file); a removed file's registration
    goes at the next read (its memory freed), and a path that now fails otherwise than
    "not found" (a component replaced by a file) is dropped, not raised to every later
    registration."""
    from flexmarl.weights import ownership

    source = published.publish(tensors(1.0), published.run_name(), "x", 1, "")
    path = source["path"]
    fds = lambda: len(os.listdir("/proc/self/fd"))  # noqa: E731
    before = fds()

    def register():
        for _ in range(200):
            fd = os.open(path, os.O_RDONLY)
            ownership.register(path, fd)
            os.close(fd)
    threads = [threading.Thread(target=register) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert fds() == before and ownership.registered(path)
    os.unlink(path)
    ownership.drop_stale()
    assert not ownership.registered(path) and fds() == before - 1
    other = published.publish(tensors(2.0), published.run_name(), "y", 1, "")
    agent_dir = Path(other["path"]).parent
    shutil.rmtree(agent_dir)
    agent_dir.write_text("not a directory")  # stat of the old path: NotADirectoryError
    again = published.publish(tensors(3.0), published.run_name(), "z", 1, "")
    assert published.serve(again["path"])[0] == 1 and not ownership.registered(other["path"])


def test_a_lease_never_waits_on_an_event_loop_and_an_open_root_is_refused(tmp_path,
                                                                           weights_dir):
    """A reader on an event loop takes a run's lease only if it is free this instant (a
    sweep holding it would stall the loop); a root any user may rename things in (writable
    by all, not sticky) is refused, naming the fix."""
    import fcntl

    from flexmarl.weights import ownership

    run = published.run_name()
    folder = ownership.lease(run, weights_dir)
    ownership.release(run)
    fd = os.open(folder / ownership.LEASE, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)  # a sweep, this instant
    try:
        assert ownership.lease(run, weights_dir, wait=False) is None
    finally:
        os.close(fd)
    assert ownership.lease(run, weights_dir, wait=False) == folder
    ownership.release(run)
    open_root = tmp_path / "open"
    open_root.mkdir()
    os.chmod(open_root, 0o777)
    with pytest.raises(PermissionError, match="not sticky"):
        ownership.lease(published.run_name(), open_root)
    os.chmod(open_root, 0o1777)  # as /dev/shm and /tmp: fine
    assert ownership.lease(run, open_root).is_dir()
    ownership.release(run)
