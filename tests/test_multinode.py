"""Multi-node: `flexmarl-node` processes join a run over loopback TCP, CURVE-authenticated.

- The registry waits for the nodes a run needs and says which are missing when they do not come.
- A node refuses entry points outside its allow-list (no code named by the network).
- A node with another key pair is refused at the handshake and gives up with a clear message;
  one with the right key joins.
- A whole run: three nodes (rollout, trainer, any) host every worker of the test team; the one
  shared trainer slot has 2 ranks, one on each trainer-capable node, which rendezvous through
  the run's TCPStore; a fourth (rollout) node joins after the first step and its new instance
  serves requests; all nodes exit when the run ends.
"""
from __future__ import annotations

import asyncio
import re
import signal
import socket
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flexmarl.config.load import load_config
from flexmarl.observe.rundir import RunDir
from flexmarl.launch.run import train
from runtime.config import TransportConfig
from runtime.keys import write_keys
from runtime.node import NodeAgent, NodeOptions
from runtime.protocol import NodeHello, Ping, Pong, StartWorker
from runtime.registry import NodeRegistry, NodesMissing

from tests.helpers.teams import duo

ROOT = Path(__file__).resolve().parent.parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def keys(tmp_path_factory) -> dict[str, str]:
    d = tmp_path_factory.mktemp("keys")
    return {"good": str(write_keys(d, "node")[1]), "other": str(write_keys(d, "intruder")[1])}


def _node(tmp_path: Path, name: str, role: str, port: int, key: str, *extra: str,
          host: str | None = None) -> tuple[subprocess.Popen, Path]:
    """A `flexmarl-node` process; `host`: the host it claims to be (FLEXMARL_HOST_ID), so its
    workers take what another node published as being on another machine."""
    log = tmp_path / f"{name}.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "flexmarl.launch.nodes", "--connect", f"tcp://127.0.0.1:{port}",
         "--role", role, "--name", name, "--key-file", key, "--advertise", "127.0.0.1",
         "--log-level", "INFO", *extra],
        cwd=ROOT, stdout=log.open("w"), stderr=subprocess.STDOUT,
        env={**os.environ, **({"FLEXMARL_HOST_ID": host} if host else {})})
    return proc, log


def _logs(run_log: Path, nodes: dict) -> str:
    """The ends of the run's and the nodes' logs, for a failure message."""
    parts = [(run_log.name, run_log)] + [(f"{n}.log", log) for n, (_, log) in nodes.items()]
    return "\n".join(f"--- {name} (last 40 lines)\n" + "\n".join(
        log.read_text(errors="replace").splitlines()[-40:]) for name, log in parts)


def _started(log: Path) -> list[str]:
    """Workers a node's supervisor reported ready, from its log."""
    return re.findall(r"worker (\S+) ready", log.read_text())


async def test_the_registry_names_missing_nodes():
    async with NodeRegistry("tcp://127.0.0.1:0").serving() as reg:
        lines = []
        with pytest.raises(NodesMissing, match=r"lacks 2 rollout node\(s\), 1 trainer node"):
            await reg.wait_for({"rollout": 2, "trainer": 1}, 0.3, report=lines.append)
        assert lines and "2 more rollout" in lines[0] and "joined: none" in lines[0]


async def test_a_hello_repeated_by_the_same_node_is_accepted_and_a_namesake_refused():
    """A node retries its hello when the answer is late (a busy registry): the retry is the
    same process and is accepted again; another process with the same name is refused."""
    async with NodeRegistry("tcp://127.0.0.1:0").serving() as reg, \
            NodeRegistry("tcp://127.0.0.1:0").serving() as fake_node:  # something to connect to
        from runtime.transport import connect
        hello = NodeHello("n1", "127.0.0.1", ["rollout"], fake_node.address, 4242)
        async with connect(reg.address) as conn:
            await conn.request(hello, timeout_s=30)
            await conn.request(hello, timeout_s=30)  # the retry
            with pytest.raises(Exception, match="has joined already"):
                await conn.request(NodeHello("n1", "127.0.0.1", ["rollout"], fake_node.address,
                                             4343), timeout_s=30)
        assert list(reg.nodes) == ["n1"] and reg.nodes["n1"].alive


async def test_a_node_starts_only_allowed_entries(keys):
    curve = TransportConfig(curve_secret_key_file=keys["good"])
    async with NodeRegistry("tcp://127.0.0.1:0", transport=curve).serving() as reg:
        node = NodeAgent(NodeOptions(name="n1", registry=reg.address, advertise="127.0.0.1",
                                     allowed_entries=("tests.helpers.workers:echo",), transport=curve))
        async with node.serving():
            await asyncio.wait_for(node.joined.wait(), 10)
            conn = reg.nodes["n1"].conn
            with pytest.raises(Exception, match="does not start 'os:system'"):
                await conn.request(StartWorker("w0", "os:system", {}), timeout_s=10)
            with pytest.raises(Exception, match=r"does not set environment variables \['LD_PRE"):
                await conn.request(StartWorker("w0", "tests.helpers.workers:echo", {},
                                               {"LD_PRELOAD": "/tmp/x.so"}), timeout_s=10)
            from runtime.supervisor import WorkerSpec
            worker = await reg.start_worker(WorkerSpec(name="w1", entry="tests.helpers.workers:echo"))
            assert worker.node == "n1" and worker.address.startswith("tcp://127.0.0.1:")
            reg.kill("w1", "test")
            event = await asyncio.wait_for(reg.events.get(), 10)
            assert (event.name, event.reason) == ("w1", "test")


@pytest.mark.slow
async def test_a_node_with_another_key_is_refused(tmp_path, keys, caplog):
    port = _free_port()
    curve = TransportConfig(curve_secret_key_file=keys["good"])
    async with NodeRegistry(f"tcp://127.0.0.1:{port}", transport=curve).serving() as reg:
        intruder, intruder_log = _node(tmp_path, "intruder", "rollout", port, keys["other"],
                                       "--join-timeout", "4")
        friend, _ = _node(tmp_path, "friend", "rollout", port, keys["good"])
        try:
            await asyncio.wait_for(reg.wait_for({"rollout": 1}, 60), 70)
            code = await asyncio.to_thread(intruder.wait, 60)
        finally:
            for p in (intruder, friend):
                p.terminate()
                p.wait(30)
        assert list(reg.nodes) == ["friend"]
        assert code == 1
        assert "no answer from" in intruder_log.read_text()
        assert "same CURVE key pair" in intruder_log.read_text()
    assert any("refused" in r.getMessage() for r in caplog.records)


@pytest.mark.slow
async def test_a_node_whose_process_ends_is_lost_at_once(tmp_path, keys, caplog):
    """SIGKILL a node: its connection closes, and that is evidence enough; its loss does not
    wait for cluster.node_timeout_s of silence (here 600 s, past this test's deadline)."""
    port = _free_port()
    curve = TransportConfig(curve_secret_key_file=keys["good"])
    async with NodeRegistry(f"tcp://127.0.0.1:{port}", transport=curve,
                            node_timeout_s=600).serving() as reg:
        node, _ = _node(tmp_path, "doomed", "rollout", port, keys["good"])
        try:
            await asyncio.wait_for(reg.wait_for({"rollout": 1}, 120), 130)
            # Our connection to it is up (as once it hosts a worker): a node gone before that
            # leaves only silence to go by.
            assert await reg.nodes["doomed"].conn.request(Ping(1), timeout_s=60) == Pong(1)
            node.kill()
            node.wait(30)
            killed_at = time.monotonic()
            while reg.nodes["doomed"].alive:
                assert time.monotonic() - killed_at < 60, "the dead node was not noticed"
                await asyncio.sleep(0.05)
        finally:
            if node.poll() is None:
                node.kill()
                node.wait(30)
    assert any("node doomed lost (its connection closed)" in r.getMessage()
               for r in caplog.records)


@pytest.mark.slow
async def test_a_stalled_registry_keeps_its_nodes_and_a_silent_node_is_lost(tmp_path, keys,
                                                                          caplog):
    """The registry's own loop blocked for 2 node timeouts is not its nodes' silence; a node that
    is really silent (SIGSTOPped: alive, connected, mute) is lost, never before the timeout."""
    timeout_s = 5.0
    port = _free_port()
    curve = TransportConfig(curve_secret_key_file=keys["good"])
    async with NodeRegistry(f"tcp://127.0.0.1:{port}", transport=curve,
                            node_timeout_s=timeout_s).serving() as reg:
        node, _ = _node(tmp_path, "mute", "rollout", port, keys["good"])
        try:
            await asyncio.wait_for(reg.wait_for({"rollout": 1}, 120), 130)
            time.sleep(2 * timeout_s)  # blocks this loop: no await
            for _ in range(8):
                await asyncio.sleep(reg.silence.tick_s)
            assert reg.nodes["mute"].alive
            node.send_signal(signal.SIGSTOP)
            stopped_at = time.monotonic()
            while reg.nodes["mute"].alive:
                assert time.monotonic() - stopped_at < 3 * timeout_s + 30
                await asyncio.sleep(0.05)
            assert time.monotonic() - stopped_at >= timeout_s - reg.silence.tick_s - 1.0
        finally:
            node.kill()
            node.wait(30)
    assert any("node mute lost (silent for" in r.getMessage() for r in caplog.records)


@pytest.mark.slow
@pytest.mark.timeout(1200)  # its own deadline is 600 s: a whole run over 4 node processes
async def test_a_run_on_three_nodes_and_one_that_joins_mid_run(tiny_model_dir, tmp_path, keys):
    port = _free_port()
    # Each node its own host, as far as published weights go: the instances fetch each version
    # from the trainer's rank 0 over the run's CURVE transport instead of reading its file.
    nodes = {name: _node(tmp_path, name, role, port, keys["good"], host=f"host-{name}")
             for name, role in (("r1", "rollout"), ("t1", "trainer"), ("a1", "any"))}
    late: dict[str, tuple] = {}
    config = load_config(overrides=[
        f"run.dir={tmp_path / 'run'}", "run.steps=6", "rollout.backend=torch",
        "rollout.instances_per_agent=1", "pipeline.mode=sync", "pipeline.tasks_per_step=6",
        "pipeline.trajectories_per_task=2", "pipeline.micro_batch_groups=2", "trainer.lr=1e-3",
        "trainer_pool.slot_ranks=2", "observe.tensorboard=false", "observe.report=false",
        f"cluster.listen=tcp://127.0.0.1:{port}", "cluster.rollout_nodes=1",
        "cluster.trainer_nodes=2", "cluster.join_timeout_s=120",
        f"transport.curve_secret_key_file={keys['good']}"])
    url: asyncio.Future = asyncio.get_running_loop().create_future()

    async def add_a_node() -> float:
        # Started once the run serves its dashboard (its workers are up, step 0 is running):
        # a node process takes seconds to start (importing torch), over 15 s on a loaded
        # machine, and the run's 6 steps take about 20 s; one started later could find the run
        # over and wait out its join_timeout_s.
        await url
        late["r2"] = _node(tmp_path, "r2", "rollout", port, keys["good"], host="host-r2")
        return time.monotonic()

    joining = asyncio.create_task(add_a_node())
    try:
        result = await asyncio.wait_for(train(duo(tiny_model_dir), config,
                                              run_dir=RunDir.create(config), progress=False,
                                              on_dashboard=url.set_result), 600)
        await joining
        codes = {n: await asyncio.to_thread(p.wait, 60)
                 for n, (p, _) in {**nodes, **late}.items()}
    finally:
        for proc, _ in [*nodes.values(), *late.values()]:
            if proc.poll() is None:
                proc.kill()
                proc.wait(30)
    assert [m["step"] for m in result.metrics] == list(range(6))
    assert codes == {"r1": 0, "t1": 0, "a1": 0, "r2": 0}  # released when the run ended
    started = {n: _started(log) for n, (_, log) in {**nodes, **late}.items()}
    # Rollout instances on the rollout-capable nodes, the slot's two ranks on two nodes.
    rollout = {n: [w for w in started[n] if w.startswith("rollout-")] for n in ("r1", "a1")}
    assert sorted(rollout["r1"] + rollout["a1"]) == ["rollout-0", "rollout-1"]
    assert len(rollout["r1"]) == len(rollout["a1"]) == 1  # spread, not stacked
    assert {"trainer-0-0", "trainer-0-1"} == {w for n in ("t1", "a1") for w in started[n]
                                              if w.startswith("trainer-")}
    assert not [w for w in started["t1"] if w.startswith("rollout")]
    [new] = started["r2"]
    served = [m["instance_tokens"].get(new, 0) for m in result.metrics]
    assert sum(served) > 0, served  # the late node's instance took requests
    for m in result.metrics:
        for agent in ("solver", "checker"):
            assert m["agents"][agent]["trained_samples"] > 0
    # No weights through the run: every rollout node's instance fetched each version from the
    # trainer's host (a sync, or the late node's joining load), none read it as a local file.
    for n in ("r1", "r2"):
        fetched = re.findall(r"fetched version (\d+) .* on host host-(\w+)",
                             {**nodes, **late}[n][1].read_text())
        assert fetched and {h for _, h in fetched} <= {"t1", "a1"}, (n, fetched)
    assert len(re.findall(r"fetched version", nodes["r1"][1].read_text())) >= 5, \
        nodes["r1"][1].read_text()[-4000:]  # 5 syncs at least


@pytest.mark.slow
@pytest.mark.timeout(1200)  # its own deadlines: 480 s to step 2, 480 s to the end
def test_the_documented_commands_survive_a_node_killed_mid_run(tiny_model_dir, tmp_path, keys):
    """`flexmarl run CONFIG --listen ...` and `flexmarl-node` processes as the docs show them;
    a rollout node SIGKILLed after step 1: its instance is lost with it (node_lost, noticed by
    its closed connection, under the default cluster.node_timeout_s), replaced on the other
    rollout node, and the run completes every step."""
    import psutil

    from flexmarl.observe.rundir import read_metrics

    port = _free_port()
    team = tmp_path / "team.py"
    # loaded by `python -m flexmarl.launch.cli` run from ROOT, where tests.helpers imports
    team.write_text(f"from tests.helpers.teams import duo\nteam = duo({tiny_model_dir!r})\n")
    config, run_log = tmp_path / "run.toml", tmp_path / "run.log"
    config.write_text(load_config(overrides=[
        f"run.dir={tmp_path / 'run'}", "run.steps=5", "rollout.backend=torch",
        "rollout.instances_per_agent=1", "pipeline.mode=sync", "pipeline.tasks_per_step=6",
        "pipeline.trajectories_per_task=2", "trainer.lr=1e-3", "observe.dashboard=false",
        "observe.tensorboard=false", "observe.report=false"]
        ).to_toml())
    run = subprocess.Popen(
        [sys.executable, "-m", "flexmarl.launch.cli", "run", str(config), "--team", str(team),
         "--listen", f"tcp://127.0.0.1:{port}", "--set", "cluster.rollout_nodes=2", "--set",
         "cluster.trainer_nodes=1", "--set", f"transport.curve_secret_key_file={keys['good']}"],
        cwd=ROOT, stdout=run_log.open("w"), stderr=subprocess.STDOUT)
    nodes = {name: _node(tmp_path, name, role, port, keys["good"])
             for name, role in (("r1", "rollout"), ("r2", "rollout"), ("t1", "trainer"))}
    try:
        metrics = tmp_path / "run" / "metrics.jsonl"
        deadline = time.monotonic() + 480  # a loaded machine: 5 processes start torch on 2 cores
        while not (metrics.exists() and len(read_metrics(metrics)) >= 2):
            assert run.poll() is None, _logs(run_log, nodes)
            assert time.monotonic() < deadline, _logs(run_log, nodes)
            time.sleep(0.05)
        victim = nodes["r2"][0]
        doomed = [victim.pid] + [c.pid for c in psutil.Process(victim.pid).children(True)]
        for pid in doomed:
            psutil.Process(pid).kill()
        run.wait(480)
        out = run_log.read_text()
        assert run.returncode == 0, _logs(run_log, nodes)
        codes = {n: p.wait(60) for n, (p, _) in nodes.items() if n != "r2"}
    finally:
        for proc, _ in [(run, None), *nodes.values()]:
            if proc.poll() is None:
                proc.kill()
                proc.wait(30)
    assert codes == {"r1": 0, "t1": 0}
    records = read_metrics(metrics)
    assert [m["step"] for m in records] == list(range(5))
    [gone] = [name for m in records for name in m["faults"]["dead"]]
    assert f"worker {gone} died: node_lost" in out and gone in _started(nodes["r2"][1])
    assert "node r2 lost (its connection closed)" in out  # evidence, not cluster.node_timeout_s
    replacement = [r["new"] for m in records for r in m["faults"]["replacements"]]
    assert replacement and replacement[0] in _started(nodes["r1"][1])
    assert not [p for p in doomed if psutil.pid_exists(p) and
                psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
