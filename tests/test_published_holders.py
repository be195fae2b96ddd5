"""A served version outlives its trainer: real processes, a trainer SIGKILLed between a sync and
an instance joining on another "host" (FLEXMARL_HOST_ID, as in tests/test_multinode.py; the
files themselves are in one FLEXMARL_WEIGHTS_DIR, which an instance of another host id does
not read directly: it fetches).

The pure rules (leases, locks, what FetchWeights serves, copies): tests/test_published.py;
the run's record of a version's holders: tests/test_weights.py.
"""
from __future__ import annotations

import asyncio
import os
import signal

import pytest
import torch

from flexmarl.protocol import ExportWeights, FetchWeights
from flexmarl.rollout.worker import PROBE_TIMEOUT_S
from flexmarl.weights import published
from flexmarl.weights.sync import WeightSync
from runtime.errors import RemoteError
from runtime.supervisor import Supervisor, WorkerSpec
from runtime.transport import connect
from tests.helpers.trainers import CONFIG, FAST, train_step


@pytest.mark.slow
async def test_a_served_version_is_fetched_from_an_instance_once_its_trainer_is_dead(
        tiny_model_dir, tmp_path, no_leftover_children):
    """Trainer and instance r1 on host a; the sync loads version 1 into r1 (from the file, on
    its host), which becomes a holder. The trainer is SIGKILLed; r2 joins on host b: its
    trainer does not answer, so r2 fetches the version from r1 (within the fetch's probe of
    the dead one, PROBE_TIMEOUT_S), loads it, keeps it on its host and serves it in turn."""
    weights_dir = tmp_path / "published"
    env = {"FLEXMARL_WEIGHTS_DIR": str(weights_dir)}
    run = published.run_name()
    sup = Supervisor(config=FAST)
    async with sup.serving():
        trainer = await sup.start_worker(WorkerSpec(
            name="trainer", entry="flexmarl.training.worker:trainer_worker",
            args={"model_dir": tiny_model_dir, "agent": "solver", "world_size": 1, "rank": 0,
                  "init_method": f"file://{tmp_path}/store", "config": CONFIG,
                  "num_threads": 1, "collective_timeout_s": 60},
            env={**env, "FLEXMARL_HOST_ID": "a"}))

        async def instance(name: str, host: str):
            handle = await sup.start_worker(WorkerSpec(
                name=name, entry="flexmarl.rollout.worker:rollout_worker",
                args={"model_dir": tiny_model_dir}, env={**env, "FLEXMARL_HOST_ID": host}))
            return connect(handle.address)

        r1 = await instance("r1", "a")
        ws = WeightSync(["solver"], lambda agent: [r1], {"solver": tiny_model_dir},
                        timeout_s=120.0)
        async with connect(trainer.address) as lead:
            await train_step(lead, 1)
            update = await lead.request(ExportWeights(run))
        assert update.version == 1 and update.source["host"] == "a"
        expected = published.load(update.source["path"], 1)
        report = await ws.sync("solver", 1, update)
        assert [h["address"] for h in report.held] == [r1.address]
        os.kill(trainer.pid, signal.SIGKILL)
        r2 = await instance("r2", "b")
        started = asyncio.get_running_loop().time()
        async with ws.locked("solver"):
            done = await ws.load_into(r2, "solver")
        took = asyncio.get_running_loop().time() - started
        assert done.version == 1 and took < PROBE_TIMEOUT_S + 60, took
        (held,) = done.held
        assert held["address"] == r2.address and held["host"] == "b"
        assert [h["address"] for h in (await ws.served("solver"))["copies"]] == \
            [r2.address, r1.address]
        # r2 serves its copy (the same bytes as the dead trainer's file), and nothing else.
        got = await r2.request(FetchWeights(held["path"]), timeout_s=60)
        assert got.version == 1
        assert all(torch.equal(got.tensors[k], expected[k]) for k in expected)
        with pytest.raises(RemoteError, match="not weights this process"):
            await r2.request(FetchWeights(update.source["path"]), timeout_s=60)
        for conn in (r1, r2):
            await conn.aclose()
