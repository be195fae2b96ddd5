"""Ray as the cluster engine (cluster.launcher = "ray", runtime/ray_cluster.py).

Pure: the placement groups a run asks for (a trainer slot's ranks STRICT_PACKed in one group,
GPUs per worker, a sliver of a role's resource where the cluster marks nodes for roles), the
config's checks (Ray missing is one ConfigError naming the extra), the dry run's table, the
refusal of GPU sharing that Ray cannot seat, and the run's CURVE key on Ray (a fake Ray): a
pair of each run's own, never the user's key file, sent to a node only with Ray's token
authentication on (RAY_AUTH_MODE, read as Ray reads it), and not at all on a loopback Ray.

On a real Ray cluster of two nodes on this machine, started once for the module with the
documented commands (`ray start --head` with {"flexmarl_rollout": 8}, `ray start --address`
with {"flexmarl_trainer": 8}):
- a micro_batch run on Ray has the samples and the weights of the same run on local
  processes (bit-equal conditions of tests/test_pipeline.py: SYNC_WEIGHT_ATOL), zero staleness;
  its rollout workers land on the rollout node and its trainer ranks on the trainer node;
- a rollout actor killed through Ray mid-step is detected and replaced, and a trainer actor
  killed through Ray is recovered from its snapshot: every sample of every step, the same
  rewards and weights as a fault-free local run (tests/test_faults.py's checks);
- after each run, and after a SIGKILLed driver, no FlexMARL actor or placement group is left.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from safetensors.torch import load_file

from flexmarl.checks import ConfigError
from flexmarl.config.load import load_config
from flexmarl.placement.devices import Ask, Host, place_devices
from flexmarl.launch.workers import check_ray, check_ray_gpus
from flexmarl.launch.run import train
from flexmarl.observe.rundir import RunDir
from runtime.ray_cluster import bundle_of, placement_groups, role_resources
from runtime.supervisor import WorkerSpec

from tests.helpers.faults import _assert_nothing_lost
from tests.helpers.numerics import SYNC_WEIGHT_ATOL
from tests.helpers.runs import config as pipeline_config
from tests.helpers.teams import duo
from tests.helpers.workers import flexmarl_cli

ROOT = Path(__file__).resolve().parent.parent
ENTRY = "flexmarl.rollout.worker:rollout_worker"


# ---------------------------------------------------------------- pure

def test_a_slot_s_ranks_are_one_strict_pack_group_and_instances_groups_of_their_own():
    specs = [WorkerSpec(name="rollout-0", entry=ENTRY, role="rollout", gpus=2),
             WorkerSpec(name="rollout-1", entry=ENTRY, role="rollout"),
             *[WorkerSpec(name=f"trainer-0-{r}", entry=ENTRY, role="trainer", group="trainer-0",
                          group_size=2, group_index=r, gpus=1) for r in (1, 0)]]
    groups = {g.name: g for g in placement_groups(specs, 0.5, frozenset({"rollout"}))}
    assert list(groups) == ["rollout-0", "rollout-1", "trainer-0"]
    assert all(g.strategy == "STRICT_PACK" for g in groups.values())
    # One bundle holds a whole tensor-parallel instance (one process, its TP workers its own).
    assert groups["rollout-0"].bundles == ({"CPU": 0.5, "GPU": 2.0, "flexmarl_rollout": 0.001},)
    assert groups["rollout-1"].bundles == ({"CPU": 0.5, "flexmarl_rollout": 0.001},)
    # Only the marked role asks for its resource; the trainer ranks land wherever GPUs are.
    assert groups["trainer-0"].bundles == ({"CPU": 0.5, "GPU": 1.0},) * 2
    assert role_resources({"CPU": 4, "flexmarl_trainer": 8}) == frozenset({"trainer"})
    assert bundle_of(specs[1], 1.0) == {"CPU": 1.0}


def test_the_launcher_settings_are_checked():
    with pytest.raises(ConfigError, match="cluster.launcher.*needs cluster.listen"):
        load_config(overrides=["cluster.launcher=nodes"])
    with pytest.raises(ConfigError, match="cluster.listen.*leave it empty"):
        load_config(overrides=["cluster.launcher=ray", "cluster.listen=tcp://127.0.0.1:5555"])
    with pytest.raises(ConfigError, match="cluster.ray_address.*only with"):
        load_config(overrides=["cluster.ray_address=auto"])
    with pytest.raises(ConfigError, match="cluster.launcher.*one of local, nodes, ray"):
        load_config(overrides=["cluster.launcher=slurm"])
    assert load_config(overrides=["cluster.listen=tcp://127.0.0.1:5555"]).cluster.engine == "nodes"
    ray_config = load_config(overrides=["cluster.launcher=ray"]).cluster
    assert ray_config.engine == "ray" and ray_config.remote


async def test_without_ray_the_launcher_is_one_error_naming_the_extra(monkeypatch, tmp_path,
                                                                      capsys):
    import importlib.util
    find = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "ray" else find(name, *a))
    with pytest.raises(ConfigError, match=r"pip install 'flexmarl\[ray\]'"):
        check_ray()
    # `flexmarl run` says so before it makes a run directory (exit 2: a config error).
    code = await flexmarl_cli("run", "--set", "cluster.launcher=ray", "--set",
                              "rollout.backend=torch", "--set", f"run.dir={tmp_path / 'run'}")
    assert code == 2 and "pip install 'flexmarl[ray]'" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_the_dry_run_shows_the_placement_groups():
    from flexmarl.launch.cli import _gpu_placement
    config = load_config(overrides=["cluster.launcher=ray", "cluster.ray_worker_cpus=0.5",
                                    "rollout.backend=torch", "trainer_pool.slot_ranks=2"])
    shown = _gpu_placement(config.team.path, config.cluster, rollout=config.rollout,
                           trainer_device=config.trainer.device, devices=config.devices,
                           trainer_pool=config.trainer_pool)
    assert "Ray placement groups" in shown
    assert "#   rollout-0: {CPU: 0.5}" in shown
    assert "#   trainer-0: {CPU: 0.5} + {CPU: 0.5}" in shown  # one slot of two ranks


def test_gpu_sharing_ray_cannot_seat_is_refused():
    class FakeRay:
        shares_gpus = False  # as runtime.ray_cluster.RayLauncher

    shared = place_devices([Host("n1", (0,))], [Ask("trainer-0-0", "trainer", memory=0.4),
                                               Ask("rollout-0", "rollout", memory=0.5)],
                          colocate=True)
    with pytest.raises(ConfigError, match="devices.colocate"):
        check_ray_gpus(FakeRay(), shared)
    apart = place_devices([Host("n1", (0, 1))], [Ask("trainer-0-0", "trainer"),
                                                Ask("rollout-0", "rollout")])
    check_ray_gpus(FakeRay(), apart)  # GPUs of their own: fine
    from runtime.ray_cluster import RayLauncher
    assert RayLauncher.shares_gpus is False  # what FakeRay stands for


# The run's CURVE key on Ray.

class FakeRay:
    """The few calls RayLauncher's constructor makes, for a Ray already joined whose node (this
    process's) has the address `ip`: no cluster needed to see what it does with keys."""

    def __init__(self, ip: str) -> None:
        self.ip = ip
        self.util = SimpleNamespace(get_node_ip_address=lambda: ip)

    def is_initialized(self) -> bool:
        return True

    def get_runtime_context(self):
        return SimpleNamespace(get_node_id=lambda: "n1")

    def nodes(self) -> list[dict]:
        return [{"NodeID": "n1", "NodeManagerAddress": self.ip, "Alive": True,
                 "Resources": {"CPU": 2.0}}]

    def cluster_resources(self) -> dict:
        return {"CPU": 2.0}


class FakeHost:
    """A host actor's handle: what its node says of token auth, and the key text it was sent."""

    def __init__(self, token_auth: bool) -> None:
        self.sent: list[str] = []
        self.token_auth = SimpleNamespace(remote=lambda: self._value(token_auth))
        self.start = SimpleNamespace(remote=lambda boot, env, key_text: self._start(key_text))

    async def _value(self, value):
        return value

    async def _start(self, key_text: str) -> dict:
        self.sent.append(key_text)
        return {"pid": 1}


def launcher_on(monkeypatch, ip: str, **transport):
    from runtime.config import TransportConfig
    from runtime.ray_cluster import RayLauncher
    monkeypatch.setattr("runtime.ray_cluster.ray_module", lambda: FakeRay(ip))
    return RayLauncher(transport=TransportConfig(**transport))


@pytest.fixture
def user_key(tmp_path) -> Path:
    from runtime.keys import write_keys
    return write_keys(tmp_path / "keys", "mine")[1]


@pytest.mark.parametrize("with_user_key", [False, True])
def test_without_ray_token_auth_no_key_leaves_for_other_machines(monkeypatch, user_key,
                                                                   with_user_key):
    from runtime.ray_cluster import RayTokenAuthOff
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    extra = {"curve_secret_key_file": str(user_key)} if with_user_key else {}
    with pytest.raises(RayTokenAuthOff, match=r"the run's Ray driver\) runs without Ray's token "
                       r"authentication.*`export RAY_AUTH_MODE=token`.*ray get-auth-token"):
        launcher_on(monkeypatch, "10.1.2.3", **extra)
    # No CURVE wanted (plaintext allowed on a trusted network): nothing to send, no refusal.
    sup = launcher_on(monkeypatch, "10.1.2.3", plaintext_tcp_beyond_loopback=True)
    assert not sup.transport.curve_secret_key_file and sup._key_text == ""


async def test_with_token_auth_each_node_gets_a_run_key_never_the_user_s(monkeypatch, user_key):
    from runtime.keys import load_keys
    from runtime.ray_cluster import RayTokenAuthOff
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    sup = launcher_on(monkeypatch, "10.1.2.3", curve_secret_key_file=str(user_key),
                      curve_allowed=(load_keys(user_key)[0],))
    try:
        run_key = Path(sup.transport.curve_secret_key_file)
        assert run_key.parent == Path(sup._key_dir)
        assert stat.S_IMODE(run_key.stat().st_mode) == 0o600
        assert load_keys(run_key) != load_keys(user_key)  # a pair of this run's own
        # One pair for the driver and every worker: the user's allow-list is set aside too.
        assert (sup.transport.curve_server_key, sup.transport.curve_allowed) == ("", ())
        host = FakeHost(token_auth=True)
        assert await sup._start_host(host, "rollout-0", {}, {}) == {"pid": 1}
        assert host.sent == [run_key.read_text()] and user_key.read_text() not in host.sent
        # A node whose Ray does not check tokens is sent nothing, whatever the driver says.
        open_node = FakeHost(token_auth=False)
        with pytest.raises(RayTokenAuthOff, match="The Ray node of rollout-1 runs without"):
            await sup._start_host(open_node, "rollout-1", {}, {})
        assert open_node.sent == []
    finally:
        shutil.rmtree(sup._key_dir)


async def test_a_ray_of_this_machine_alone_sends_no_key(monkeypatch, user_key):
    """Its address is loopback: every node is this machine, the workers read the run key's file
    here, and token auth is not needed for it."""
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    plain = launcher_on(monkeypatch, "127.0.0.1")
    assert not plain.transport.curve_secret_key_file and not plain._key_dir  # no CURVE asked
    sup = launcher_on(monkeypatch, "127.0.0.1", curve_secret_key_file=str(user_key))
    try:
        assert Path(sup.transport.curve_secret_key_file).parent == Path(sup._key_dir)
        host = FakeHost(token_auth=False)
        await sup._start_host(host, "rollout-0", {}, {})
        assert host.sent == [""]
    finally:
        shutil.rmtree(sup._key_dir)


# ---------------------------------------------------------------- a real Ray cluster

# RAY_AUTH_MODE=token is set by conftest.py (Ray reads it when first imported).
ray = pytest.importorskip("ray", reason="Ray is not installed; `make test` installs the ray extra")


@pytest.mark.slow
@pytest.mark.ray
def test_token_auth_on_reads_ray_auth_mode_as_ray_does():
    """runtime.ray_cluster.token_auth_on reads RAY_AUTH_MODE (Ray has no public call for the
    mode): for each value, the same answer as Ray's own (private) get_authentication_mode. In a
    process of its own: Ray caches its config, and this one's Ray is the tests'."""
    code = textwrap.dedent("""
        import json, os
        from ray._raylet import AuthenticationMode, Config, get_authentication_mode
        from runtime.ray_cluster import token_auth_on
        out = []
        for value in ["token", "TOKEN", " token", "token ", "disabled", "", None, "k8s"]:
            if value is None:
                os.environ.pop("RAY_AUTH_MODE", None)
            else:
                os.environ["RAY_AUTH_MODE"] = value
            Config.initialize("")  # as ray.init does after setting the variable
            out.append([value, get_authentication_mode() == AuthenticationMode.TOKEN,
                        token_auth_on()])
        print(json.dumps(out))
        """)
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json.loads(done.stdout.strip().splitlines()[-1])
    assert [r[1] for r in rows] == [r[2] for r in rows], rows
    assert [r[0] for r in rows if r[2]] == ["token", "TOKEN"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ray_cli(*args: str, env: dict) -> None:
    cli = shutil.which("ray", path=str(Path(sys.executable).parent)) or "ray"
    done = subprocess.run([cli, *args], env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, f"ray {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}"


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory):
    """Two Ray nodes on this machine, as a user starts them: a head for rollout and a worker
    node for training, each with 2 CPUs. Token authentication on, as Ray's default. Yields
    the head's address; `ray stop` at the end."""
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    cli = [shutil.which("ray", path=str(Path(sys.executable).parent)) or "ray"]
    subprocess.run([*cli, "get-auth-token", "--generate"], env=env, capture_output=True,
                   timeout=60)
    port = _free_port()
    try:
        _ray_cli("start", "--head", f"--port={port}", "--num-cpus=2",
                 "--resources", json.dumps({"flexmarl_rollout": 8}),
                 "--include-dashboard=false", env=env)
        _ray_cli("start", f"--address=127.0.0.1:{port}", "--num-cpus=2",
                 "--resources", json.dumps({"flexmarl_trainer": 8}), env=env)
        yield f"127.0.0.1:{port}"
    finally:
        subprocess.run([*cli, "stop", "--force"], env=env, capture_output=True, timeout=120)


def _leftovers(address: str, timeout_s: float) -> list[str]:
    """FlexMARL's live actors and placement groups on the cluster, asked from a process of its
    own (this one's Ray connection belongs to the runs)."""
    code = ("import json, ray\nfrom runtime.ray_cluster import leftovers\n"
            f"ray.init(address={address!r}, log_to_driver=False)\n"
            f"print(json.dumps(leftovers(ray, {timeout_s})))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, timeout=timeout_s + 120)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def _ray(address: str, *extra: str) -> list[str]:
    return ["cluster.launcher=ray", f"cluster.ray_address={address}",
            "cluster.ray_worker_cpus=0.25", "cluster.join_timeout_s=120", *extra]


def _nodes_of(caplog) -> dict[str, str]:
    """worker -> the Ray node id it started on (from the launcher's log)."""
    return dict(re.findall(r"worker (\S+) on Ray node \S+ id (\w+)", caplog.text))


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.timeout(900)  # two runs of 3 steps (about a minute each) and the cluster's start
async def test_a_run_on_ray_matches_local_processes_and_lands_by_role(
        ray_cluster, tiny_model_dir, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="runtime.ray_cluster")
    extra = ("pipeline.max_concurrent_tasks=1", "pipeline.micro_batch_groups=1",
             "rollout.max_num_seqs=1", "observe.report=false", "observe.tensorboard=false")
    results = {}
    for where, more in (("local", ()), ("ray", _ray(ray_cluster))):
        cfg = pipeline_config(tmp_path / where, "micro_batch", *extra, *more)
        results[where] = await asyncio.wait_for(
            train(duo(tiny_model_dir), cfg, run_dir=RunDir.create(cfg), progress=False), 600)
    local, on_ray = results["local"], results["ray"]
    for a, b in zip(local.metrics, on_ray.metrics, strict=True):
        for name in ("solver", "checker"):
            x, y = a["agents"][name], b["agents"][name]
            assert (x["tokens"], x["reward"], x["trained_samples"]) == \
                   (y["tokens"], y["reward"], y["trained_samples"])
            assert {int(k): v for k, v in y["staleness_hist"].items()} == \
                   {0: y["trained_samples"]}  # zero staleness on Ray too
    for name in ("solver", "checker"):
        wl = load_file(str(local.checkpoints[name] / "model.safetensors"))
        wr = load_file(str(on_ray.checkpoints[name] / "model.safetensors"))
        diff = max((wl[k] - wr[k]).abs().max().item() for k in wl)
        assert diff <= SYNC_WEIGHT_ATOL, (name, diff)
    # Where they landed: the rollout node hosts the instances, the trainer node the ranks.
    ray.init(address=ray_cluster, log_to_driver=False)
    try:
        marked = {n["NodeID"]: n["Resources"] for n in ray.nodes() if n["Alive"]}
    finally:
        ray.shutdown()
    nodes = _nodes_of(caplog)
    assert sorted(nodes) == ["rollout-0", "rollout-1", "trainer-0-0", "trainer-1-0"], nodes
    for worker, node in nodes.items():
        role = "rollout" if worker.startswith("rollout") else "trainer"
        assert f"flexmarl_{role}" in marked[node], (worker, marked[node])
    assert _leftovers(ray_cluster, 30) == []


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.timeout(900)
async def test_actors_killed_through_ray_are_replaced_and_lose_nothing(
        ray_cluster, tiny_model_dir, tmp_path, fault_free):
    from tests.helpers.faults import STEPS, _config

    async def kill(base: str, run: asyncio.Task) -> list[str]:
        """Through Ray, as a lost node or an OOM kill would: a rollout actor with requests in
        flight once step 1 is done, then a trainer rank's actor once step 3 is done."""
        import aiohttp
        killed = []
        async with aiohttp.ClientSession() as http:
            for prefix, after in (("rollout-", 1), ("trainer-", 3)):
                while True:
                    async with http.get(base + "api/status") as r:
                        st = await r.json()
                    if st["run"]["steps_done"] >= after:
                        busy = sorted(n for n, i in st["instances"].items() if i["inflight"])
                        named = {a["name"].rsplit(".", 1)[1]: a["name"] for a in
                                 ray.util.list_named_actors(all_namespaces=True)
                                 if a["name"].startswith("flexmarl.")}
                        pick = ([n for n in busy if n in named] if prefix == "rollout-" else
                                sorted(n for n in named if n.startswith(prefix)))
                        if pick:
                            ray.kill(ray.get_actor(named[pick[0]], namespace="flexmarl"))
                            killed.append(pick[0])
                            break
                    await asyncio.sleep(0.01)
        return killed

    cfg = _config(tmp_path, "ray", *_ray(ray_cluster))
    url: asyncio.Future = asyncio.get_running_loop().create_future()
    run = asyncio.create_task(train(duo(tiny_model_dir), cfg, run_dir=RunDir.create(cfg),
                                    progress=False, on_dashboard=url.set_result))
    injected = asyncio.create_task(kill(await url, run))
    result = await asyncio.wait_for(run, 600)
    victims = await injected
    assert len(victims) == 2 and STEPS >= 4
    rollout_dead = [n for m in result.metrics for n in m["faults"]["dead"]]
    assert rollout_dead == [victims[0]]
    trainer = [m["faults"]["trainer"] for m in result.metrics]
    assert sum(f["dead"] for f in trainer) == 1
    [replaced] = [r for f in trainer for r in f["replacements"]]
    assert replaced["slot"] == victims[1].rsplit("-", 1)[0]
    _assert_nothing_lost(result, fault_free, tiny_model_dir)  # helpers/faults.py WEIGHT_REL_TOL
    assert _leftovers(ray_cluster, 30) == []


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.timeout(600)
def test_a_sigkilled_driver_leaves_nothing_on_the_cluster(ray_cluster, tiny_model_dir, tmp_path):
    """`flexmarl run` on Ray, SIGKILLed once its workers serve: Ray ends its job, and with it
    every actor and placement group it made; the workers (the actors' children) go too."""
    team = tmp_path / "team.py"
    team.write_text("from tests.helpers.teams import duo\nteam = duo(%r)\n" % tiny_model_dir)
    overrides = [f"run.dir={tmp_path / 'run'}", f"team.path={team}", "run.steps=50",
                 "rollout.backend=torch", "observe.report=false", *_ray(ray_cluster)]
    log = (tmp_path / "driver.log").open("w")
    before = set(_worker_pids())
    driver = subprocess.Popen([sys.executable, "-m", "flexmarl.launch.cli", "run",
                               *[a for o in overrides for a in ("--set", o)]],
                              cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                              env={**os.environ, "RAY_AUTH_MODE": "token"})
    try:
        deadline = time.monotonic() + 300
        while "step 1/" not in (tmp_path / "driver.log").read_text():
            assert driver.poll() is None, (tmp_path / "driver.log").read_text()[-3000:]
            assert time.monotonic() < deadline, (tmp_path / "driver.log").read_text()[-3000:]
            time.sleep(0.5)
        assert _leftovers(ray_cluster, 0)  # it is running on the cluster
        workers = set(_worker_pids()) - before
        assert len(workers) == 4, workers  # 2 instances, 2 trainer ranks
        driver.send_signal(signal.SIGKILL)
        driver.wait(30)
    finally:
        if driver.poll() is None:
            driver.kill()
    assert _leftovers(ray_cluster, 60) == []
    # The worker processes went with their actors.
    deadline = time.monotonic() + 60
    while (left := workers & set(_worker_pids())) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left


def _worker_pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()
            and "runtime.worker" in _cmdline(int(p))]


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(
            errors="replace")
    except OSError:
        return ""
