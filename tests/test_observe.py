"""Watching a run: the activity log and the stall watch (pure), then /api/status and /metrics
during a real run, and a real run whose workflow hangs: the log and the dashboard say so.

The live test trains the two-agent test team for 3 steps on real processes (torch backend) with
the dashboard server on a free loopback port, polls both endpoints while it runs, and checks that
what they say changes as steps complete and parses as Prometheus text with the client library's
own parser.
"""
from __future__ import annotations

import asyncio

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from flexmarl.activity import ActivityLog
from flexmarl.checks import ConfigError
from flexmarl.config.load import load_config
from flexmarl.observe.rundir import RunDir
from flexmarl.launch.run import train
from flexmarl.observe.monitor import StallWatch, waiting_for
from flexmarl.sim import clock
from flexmarl import AgentSpec, SamplingParams, Team
from flexmarl.tasks import addition_tasks

from tests.helpers.teams import duo


# ----------------------------------------------------------------------------- activity log

def test_activity_log_counts_overlapping_uses_once_and_merges_back_to_back_ones():
    async def main():
        log = ActivityLog()
        log.enter("a", "rollout")
        await asyncio.sleep(1)
        log.enter("a", "rollout")  # a second request while the first runs: same interval
        await asyncio.sleep(1)
        log.exit("a", "rollout")
        await asyncio.sleep(1)
        log.exit("a", "rollout")
        await asyncio.sleep(5)
        log.enter("a", "train")
        await asyncio.sleep(1)
        log.exit("a", "train")
        log.enter("a", "train")  # back to back: the same interval goes on
        await asyncio.sleep(1)
        assert log.busy_s("a", "train") == 2.0  # the open part counts
        log.exit("a", "train")
        return log

    log = clock.run(main())  # virtual time: exact numbers
    assert log.busy_s("a", "rollout") == 3.0 and log.busy_s("a", "train") == 2.0
    assert [iv for iv in log.intervals] == [["a", "rollout", 0.0, 3.0], ["a", "train", 8.0, 10.0]]
    assert log.recent(5.0) == [["a", "train", 8.0, 10.0]]
    with pytest.raises(RuntimeError, match="exited more often"):
        log.exit("a", "sync")


def test_observe_config_errors_name_the_key():
    with pytest.raises(ConfigError, match="observe.port"):
        load_config(overrides=["observe.port=70000"])
    with pytest.raises(ConfigError, match="observe.wandb_mode"):
        load_config(overrides=["observe.wandb_mode=sometimes"])
    with pytest.raises(ConfigError, match="observe.stall_warn_s"):
        load_config(overrides=["observe.stall_warn_s=-1"])


# ----------------------------------------------------------------------------- stall watch

def test_stall_watch_says_it_once_per_period_and_forgets_on_progress():
    w = StallWatch(after_s=10.0)
    w.observe((0, 5), 0.0)
    w.observe((0, 5), 9.9)
    assert w.stalled_s(9.9) == 0.0 and not w.due(9.9)
    assert w.stalled_s(10.0) == 10.0 and w.due(10.0)
    assert not w.due(15.0) and w.due(20.0)  # again after another period, not every second
    w.observe((0, 6), 21.0)  # a sample stored: moving again
    assert w.stalled_s(25.0) == 0.0 and not w.due(25.0)
    assert w.due(31.0)
    off = StallWatch(after_s=0.0)
    off.observe(1, 0.0)
    assert off.stalled_s(1e9) == 0.0 and not off.due(1e9)


def test_waiting_for_names_requests_trainer_work_or_the_workflow():
    status = {"agents": {"solver": {"inflight": 3}, "checker": {"inflight": 0}},
              "instances": {"rollout-0": {"agent": "solver", "inflight": 2},
                            "rollout-1": {"agent": "solver", "inflight": 1},
                            "rollout-2": {"agent": "checker", "inflight": 0}},
              "timeline": {"now": 50.0, "intervals": [["checker", "train", 20.0, None],
                                                      ["solver", "rollout", 1.0, 2.0]]}}
    said = waiting_for(status)
    assert "3 requests of solver in flight (rollout-0: 2, rollout-1: 1)" in said
    assert "checker train under way for 30 s" in said and "rollout-2" not in said
    idle = {**status, "agents": {"solver": {"inflight": 0}},
            "timeline": {"now": 50.0, "intervals": []}}
    assert "the workflow awaits something of its own" in waiting_for(idle)


# ----------------------------------------------------------------------------- a live run

def _samples(text: str) -> dict[tuple, float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


@pytest.mark.slow
async def test_status_and_metrics_follow_a_real_run(tiny_model_dir, tmp_path,
                                                    no_leftover_children):
    config = load_config(overrides=[
        f"run.dir={tmp_path / 'run'}", "run.steps=3", "rollout.backend=torch",
        "pipeline.tasks_per_step=3", "pipeline.trajectories_per_task=2",
        "pipeline.micro_batch_groups=2", "trainer.lr=1e-3", "observe.tensorboard=false",
        "observe.report=false"])
    url: asyncio.Future = asyncio.get_running_loop().create_future()
    run = asyncio.create_task(train(duo(tiny_model_dir), config, run_dir=RunDir.create(config),
                                    progress=False, on_dashboard=url.set_result))
    base = await asyncio.wait_for(asyncio.shield(url), 300)
    assert base.startswith("http://127.0.0.1:")
    statuses, scrapes = [], []
    async with aiohttp.ClientSession() as http:
        async with http.get(base) as page:
            assert page.status == 200 and "html" in page.headers["Content-Type"]
        while not run.done():
            try:
                async with http.get(base + "api/status") as r:
                    assert r.status == 200 and r.headers["Content-Type"] == "application/json"
                    statuses.append(await r.json())
                async with http.get(base + "metrics") as r:
                    assert r.status == 200 and r.headers["Content-Type"].startswith("text/plain")
                    scrapes.append(await r.text())
            except aiohttp.ClientConnectionError:
                break  # the run ended and closed its server between checks
            await asyncio.sleep(0.2)
    result = await run
    assert result.dashboard_url == base
    assert len(statuses) >= 3, "the run ended before it could be watched"

    # Values change as steps complete: steps_done goes 0 -> 3 without going back.
    done = [s["run"]["steps_done"] for s in statuses]
    assert done == sorted(done) and done[0] < done[-1]
    last = statuses[-1]
    assert last["run"]["team"] == "duo" and last["run"]["steps"] == 3
    assert last["run"]["mode"] == "micro_batch"
    assert set(last["agents"]) == {"solver", "checker"}
    for name, a in last["agents"].items():
        assert a["trainable"] and a["samples"] > 0 and len(a["instances"]) == 1
        assert a["version"] >= 1
    assert {i["agent"] for i in last["instances"].values()} == {"solver", "checker"}
    assert len(last["slots"]) == 2
    # On CPU no worker has a GPU: the placement is empty and the tables say so ("" -> "cpu").
    assert last["devices"] == []
    assert {i["gpus"] for i in last["instances"].values()} | \
        {s["gpus"] for s in last["slots"].values()} == {""}
    assert [h["step"] for h in last["history"]] == list(range(len(last["history"])))
    kinds = {(who, kind) for who, kind, *_ in last["timeline"]["intervals"]}
    for name in ("solver", "checker"):
        assert {(name, "rollout"), (name, "train"), (name, "sync")} <= kinds, kinds
    for who, kind, start, end in last["timeline"]["intervals"]:
        assert end is None or 0 <= start <= end <= last["timeline"]["now"] + 1e-6

    # Prometheus text, parsed by the client library: the same story.
    first, final = _samples(scrapes[0]), _samples(scrapes[-1])
    assert final[("flexmarl_steps", ())] == 3.0
    assert first[("flexmarl_steps_done", ())] <= final[("flexmarl_steps_done", ())]
    assert final[("flexmarl_steps_done", ())] == last["run"]["steps_done"] or \
        final[("flexmarl_steps_done", ())] >= 1
    for name in ("solver", "checker"):
        assert final[("flexmarl_agent_version", (("agent", name),))] >= 1
        assert final[("flexmarl_agent_samples_total", (("agent", name),))] > 0
    assert any(k[0] == "flexmarl_instance_util" for k in final)
    assert any(k[0] == "flexmarl_slot_util" for k in final)


@pytest.mark.slow
async def test_a_run_that_stops_moving_says_so_and_what_it_waits_for(tiny_model_dir, tmp_path,
                                                                     caplog,
                                                                     no_leftover_children):
    """Step 1's workflow awaits a reward that never comes: nothing is in flight and nothing is
    stored. With observe.stall_warn_s = 2 the log and /api/status say the run is stalled and
    that FlexMARL holds nothing (the workflow waits on its own), instead of looking alive."""
    never = asyncio.Event()

    async def hanging(ctx, task) -> None:
        [answer] = await ctx.generate("solver", task.prompt)
        if ctx.step >= 1:
            await never.wait()  # a reward service that never answers
        ctx.reward(answer, float(len(answer.token_ids) % 2))

    team = Team(name="hangs", workflow=hanging, tasks=addition_tasks(32, seed=1), agents=[
        AgentSpec(name="solver", model=tiny_model_dir, sampling=SamplingParams(max_tokens=4))])
    config = load_config(overrides=[
        f"run.dir={tmp_path / 'run'}", "run.steps=3", "rollout.backend=torch",
        "pipeline.tasks_per_step=2", "pipeline.trajectories_per_task=2", "trainer.lr=1e-3",
        "observe.tensorboard=false", "observe.report=false", "observe.stall_warn_s=2"])
    url: asyncio.Future = asyncio.get_running_loop().create_future()
    run = asyncio.create_task(train(team, config, run_dir=RunDir.create(config),
                                    progress=False, on_dashboard=url.set_result))
    base = await asyncio.wait_for(asyncio.shield(url), 300)
    stalled = None
    try:
        async with aiohttp.ClientSession() as http:
            for _ in range(600):  # a loaded machine needs a while for step 0 alone
                async with http.get(base + "api/status") as r:
                    st = await r.json()
                if st["run"]["stalled"] and st["run"]["steps_done"] >= 1:  # step 1 hangs
                    stalled = st
                    async with http.get(base + "metrics") as r:
                        scrape = await r.text()
                    break
                assert not run.done(), "the run ended instead of hanging"
                await asyncio.sleep(0.5)
        # The warning is logged by the monitor's sampling loop (every second), which may tick
        # just after the status said "stalled": give it a few ticks.
        for _ in range(20):
            if any("no progress for" in r.getMessage() for r in caplog.records):
                break
            await asyncio.sleep(0.5)
    finally:
        run.cancel()
        await asyncio.gather(run, return_exceptions=True)
    assert stalled is not None, "the dashboard never said the run had stalled"
    assert stalled["run"]["steps_done"] == 1 and stalled["run"]["stalled"]["for_s"] >= 2
    assert "the workflow awaits something of its own" in stalled["run"]["stalled"]["waiting_for"]
    warnings = [r.getMessage() for r in caplog.records if "no progress for" in r.getMessage()]
    assert "flexmarl_stalled_seconds" in scrape and "flexmarl_stalled_seconds 0.0" not in scrape
    assert any("observe.stall_warn_s = 2" in w and "the workflow awaits something of its own"
               in w for w in warnings), warnings
