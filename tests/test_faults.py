"""Faults: workers killed by signal in real runs.

- A rollout worker SIGKILLed while it has requests in flight: the death is detected, those
  requests go to the agent's other instance, a replacement starts and loads the served version,
  every step completes with every sample (the same team rewards: the same samples, seed for
  seed), and the final weights equal a fault-free run's within WEIGHT_REL_TOL (the fault runs,
  and what they must keep: tests/helpers/faults.py).
- The same on the configuration users run: vLLM rollout, micro_batch mode, 2 instances for one
  agent. Every sample of every step is stored once, at the version of its step; see
  test_a_killed_vllm_instance_loses_nothing for why weights are not compared there.
- A rollout worker SIGSTOPped (alive, silent): the supervisor's heartbeat timeout treats it as
  dead, kills it, and the same recovery follows.
- A trainer worker SIGKILLed (at a random point, and mid-batch on purpose): its slot is
  replaced, its agent restored from the snapshot of its last step, the batch re-accumulated:
  every step and sample, weights within WEIGHT_REL_TOL. Without snapshots the run stops within
  seconds with an error naming the slot, instead of waiting out the request timeout.
- The control: the same run with one group of one step dropped on purpose fails both the
  weights check and the trained-sample counts (the trainer's own), so they can catch a loss.
"""
from __future__ import annotations

import asyncio
import os
import random
import signal

import pytest

from flexmarl import AgentSpec, SamplingParams, Team
from flexmarl.rollout.balancer import Balancer
from flexmarl.config.load import load_config
from flexmarl.tasks import addition_tasks
from runtime.errors import PeerDied
from tests.helpers.faults import (_assert_nothing_lost, _assert_same_weights, _config,
                                   _random_kill, _run, _steps_done)
from tests.helpers.teams import varied
from tests.helpers.workers import StoredSamples, kill_a_busy_instance, running_workers


def test_balancer_remove_and_add():
    bal = Balancer({"a": ["i0", "i1"], "b": ["i2"]})
    bal.route("a", "r1", 10.0, episode="e1")
    bal.remove("i0" if bal.loads.inflight("i0") else "i1")
    gone = "i0" if "i0" not in bal.loads.instances("a") else "i1"
    assert bal.loads.instances("a") == [i for i in ("i0", "i1") if i != gone]
    for k in range(5):  # nothing is routed to a removed instance
        assert bal.route("a", f"x{k}", 1.0) != gone
    bal.finish("r1")  # a request in flight there still finishes normally
    bal.loads.add("a", "i3")
    assert "i3" in bal.loads.instances("a")
    with pytest.raises(ValueError, match="new name"):
        bal.loads.add("a", gone)


def solo(model_dir: str, instances: int) -> Team:
    """One agent of the duo: two samples per task, each rewarded on its own."""
    async def workflow(ctx, task) -> None:
        for answer in await ctx.generate("solver", task.prompt, n=2):
            ctx.reward(answer, varied(answer))

    return Team(name="solo", workflow=workflow, tasks=addition_tasks(64, seed=3), agents=[
        AgentSpec(name="solver", model=model_dir, instances=instances,
                  sampling=SamplingParams(max_tokens=6))])


def _assert_detected_and_resent(result, victim: str) -> None:
    """The kill was seen as a death (not waited out) and its requests were re-sent. (These
    runs end before a replacement serves; tests/test_multinode.py checks one that does.)"""
    faults = [m["faults"] for m in result.metrics]
    assert [name for f in faults for name in f["dead"]] == [victim]
    assert sum(f["redispatched"] for f in faults) >= 1


@pytest.mark.slow
async def test_a_killed_rollout_worker_loses_nothing(tiny_model_dir, tmp_path, fault_free,
                                                    no_leftover_children):
    async def kill(base: str, run: asyncio.Task) -> str:
        return await kill_a_busy_instance(base)

    result, victim = await _run(tiny_model_dir, _config(tmp_path, "run"), kill)
    _assert_detected_and_resent(result, victim)
    _assert_nothing_lost(result, fault_free, tiny_model_dir)
    assert victim not in running_workers()


@pytest.mark.slow
@pytest.mark.vllm
# Its deadlines: two engines start (rollout.ready_timeout_s, 600 s), then the replacement does.
@pytest.mark.timeout(1800)
async def test_a_killed_vllm_instance_loses_nothing(tiny_model_dir, tmp_path,
                                                    no_leftover_children, caplog):
    """vLLM rollout, micro_batch mode (the defaults), one agent on 2 instances (one agent: two
    engines to start, not three, on a 2-core machine): one is SIGKILLed with requests in flight
    during step 1. Every step stores each of its samples once
    (sample ids, counts), each at the version of its step (zero staleness), and every agent
    steps once per step. Weights are not compared with a fault-free run here: a re-sent request joins
    another vLLM batch, and a batch of another shape can change logits in the last bits, so the
    seeded sample can differ in a token. bench/chaos.py --backend vllm measures how often."""
    steps, tasks, trajectories = 3, 8, 2
    config = load_config(overrides=[
        f"run.dir={tmp_path / 'run'}", f"run.steps={steps}", "rollout.backend=vllm",
        "rollout.kv_cache_bytes=33554432", "pipeline.mode=micro_batch",
        f"pipeline.tasks_per_step={tasks}", f"pipeline.trajectories_per_task={trajectories}",
        "pipeline.micro_batch_groups=2", "trainer.lr=1e-3", "observe.tensorboard=false",
        "observe.report=false"])

    async def kill(base: str, run: asyncio.Task) -> str:
        return await kill_a_busy_instance(base, agent="solver")

    with StoredSamples() as stored:
        result, victim = await _run(tiny_model_dir, config, kill,
                                    team=solo(tiny_model_dir, instances=2))
    assert [m["step"] for m in result.metrics] == list(range(steps))
    _assert_detected_and_resent(result, victim)
    keys = stored.keys()
    assert len({(agent, sid) for agent, sid, _ in keys}) == len(keys)  # each stored once
    per_call = {"solver": 2}  # the workflow's n
    for step, m in enumerate(result.metrics):
        for agent, n in per_call.items():
            a = m["agents"][agent]
            # Groups whose rewards are all equal carry no signal and are not trained on.
            assert a["samples"] == tasks * trajectories * n and 0 < a["trained_samples"]
            assert a["version"] == step + 1 and a["duplicates"] == 0
            # Zero staleness: the step's samples were all generated by the version of its step.
            assert sum(1 for ag, _, v in keys if ag == agent and v == step) == a["samples"]
    assert victim not in running_workers()
    # At the end every vLLM worker exits on SIGTERM within supervisor.stop_timeout_s (they used
    # to be SIGKILLed, one warning per instance: vLLM's 5 s + 5 s engine teardown, then seconds
    # of interpreter finalization, on a shared core).
    assert not [r.getMessage() for r in caplog.records if "ignored SIGTERM" in r.getMessage()]


@pytest.mark.slow
async def test_a_silent_rollout_worker_is_treated_as_dead(tiny_model_dir, tmp_path, fault_free,
                                                        no_leftover_children, caplog):
    async def stop(base: str, run: asyncio.Task) -> str:
        while await _steps_done(base) < 1:
            await asyncio.sleep(0.02)
        os.kill(running_workers()["rollout-1"], signal.SIGSTOP)  # alive, but never answers again
        return "rollout-1"

    # 10 s: long enough that no healthy worker of a loaded machine goes that long unheard (they
    # heartbeat from a thread), short enough to keep the test brief; the default is 30 s.
    config = _config(tmp_path, "run", "supervisor.heartbeat_timeout_s=10")
    result, _ = await _run(tiny_model_dir, config, stop)
    _assert_nothing_lost(result, fault_free, tiny_model_dir)
    assert "rollout-1" not in running_workers()
    # The hang was detected during the run (as a hang), not only ended by the shutdown.
    assert [name for m in result.metrics for name in m["faults"]["dead"]] == ["rollout-1"]
    assert any("worker rollout-1 died: heartbeat_timeout" in r.getMessage()
               for r in caplog.records)


@pytest.mark.slow
async def test_the_checks_catch_one_dropped_group(tiny_model_dir, tmp_path, fault_free,
                                                 monkeypatch):
    """The control of what the fault tests assert (WEIGHT_REL_TOL, the trained-sample counts):
    the fault-free run again, with one group of the solver's step 2 (one with a learning
    signal) dropped before its trainer. Both checks must fail on it, or they could not catch a
    lost sample either. The counts are the trainer's own (TrainStepDone.samples)."""
    from flexmarl.orchestrator.batch import TrainSession
    real_add, dropped = TrainSession.add, []

    async def add(self, groups):
        signal = [g for g in groups if any(t.advantage for t in g.turns)]
        if self.rt.spec.name == "solver" and self.version == 2 and signal and not dropped:
            dropped.append(signal[0])
            groups = [g for g in groups if g is not signal[0]]
        await real_add(self, groups)
    monkeypatch.setattr(TrainSession, "add", add)
    result, _ = await _run(tiny_model_dir, _config(tmp_path, "dropped"))
    assert len(dropped) == 1
    trained = [m["agents"]["solver"]["trained_samples"] for m in result.metrics]
    expected = [m["agents"]["solver"]["trained_samples"] for m in fault_free.metrics]
    expected[2] -= len(dropped[0].turns)
    assert trained == expected
    with pytest.raises(AssertionError):
        _assert_same_weights(result, fault_free, tiny_model_dir)
    with pytest.raises(AssertionError):
        _assert_nothing_lost(result, fault_free, tiny_model_dir)


@pytest.mark.slow
@pytest.mark.parametrize("seed", [2])
async def test_a_killed_trainer_is_replaced_and_loses_nothing(tiny_model_dir, tmp_path,
                                                             fault_free, seed,
                                                             no_leftover_children):
    """A trainer process SIGKILLed at a seeded random point: its slot gets new processes, its
    agent's state comes back from the snapshot of its last step, the step completes."""
    kill = _random_kill(random.Random(seed), "trainer-", 0.5)
    result, victim = await _run(tiny_model_dir, _config(tmp_path, "run"), kill)
    assert victim
    _assert_nothing_lost(result, fault_free, tiny_model_dir)
    faults = [m["faults"]["trainer"] for m in result.metrics]
    assert sum(f["dead"] for f in faults) == 1
    [replaced] = [r for f in faults for r in f["replacements"]]
    assert replaced["slot"] == victim.rsplit("-", 1)[0] and 0 < replaced["seconds"] < 60
    assert victim not in running_workers()


@pytest.mark.slow
async def test_a_trainer_killed_mid_batch_re_accumulates_it(tiny_model_dir, tmp_path, fault_free,
                                                           monkeypatch, no_leftover_children):
    """The kill lands after the solver's trainer accumulated a micro-batch of step 2: the
    replacement gets the snapshot of step 1 and the groups already taken are fed again."""
    from flexmarl.orchestrator.batch import TrainSession

    send, sent = TrainSession._send, []

    async def send_then_die(self, groups):
        await send(self, groups)
        if self.rt.spec.name == "solver" and self.version == 2:  # step 2's batch
            sent.append(len(groups))
            if len(sent) == 1:
                os.kill(running_workers()["trainer-0-0"], signal.SIGKILL)

    monkeypatch.setattr(TrainSession, "_send", send_then_die)
    result, _ = await _run(tiny_model_dir, _config(tmp_path, "run"))
    _assert_nothing_lost(result, fault_free, tiny_model_dir)
    assert len(sent) > 1, "the kill did not land mid-batch"
    step2 = result.metrics[2]["faults"]["trainer"]
    assert (step2["dead"], len(step2["replacements"]), step2["restarted_steps"]) == (1, 1, 1)
    assert step2["replacements"][0]["workers"] == ["trainer-0-0-r1"]
    assert result.metrics[2]["agents"]["solver"]["version"] == 3


@pytest.mark.slow
async def test_without_snapshots_a_dead_trainer_stops_the_run_naming_the_slot(
        tiny_model_dir, tmp_path, no_leftover_children):
    async def kill(base: str, run: asyncio.Task) -> float:
        while await _steps_done(base) < 1:
            await asyncio.sleep(0.02)
        os.kill(running_workers()["trainer-0-0"], signal.SIGKILL)
        return asyncio.get_running_loop().time()

    config = _config(tmp_path, "run", f"run.steps={50}", "trainer_pool.snapshots=false",
                     "run.save_state=false")
    with pytest.raises(PeerDied, match="trainer slot trainer-0 died: trainer-0-0 exited"):
        # Well below the 300 s request timeout the run would wait out without the death event
        # (a loaded machine needs a while for step 0 alone).
        await asyncio.wait_for(_run(tiny_model_dir, config, kill), 200)


@pytest.mark.slow
async def test_a_dead_follower_rank_of_a_shared_two_rank_slot_is_replaced(
        tiny_model_dir, tmp_path, monkeypatch, no_leftover_children):
    """One shared slot of 2 FSDP ranks for both agents (states swapped between them): rank 1
    SIGKILLed while the checker trains step 1. Rank 0, stuck in a collective with a dead peer,
    is killed too, two new ranks form a new group, and the run equals a fault-free one."""
    from flexmarl.orchestrator.batch import TrainSession

    extra = ("trainer_pool.slot_ranks=2", "rollout.instances_per_agent=1", "run.steps=3")
    clean, _ = await _run(tiny_model_dir, _config(tmp_path, "clean", *extra))
    send, killed = TrainSession._send, []

    async def send_then_die(self, groups):
        await send(self, groups)
        if self.rt.spec.name == "checker" and self.version == 1 and not killed:
            killed.append(True)
            os.kill(running_workers()["trainer-0-1"], signal.SIGKILL)

    monkeypatch.setattr(TrainSession, "_send", send_then_die)
    result, _ = await _run(tiny_model_dir, _config(tmp_path, "run", *extra))
    assert killed
    assert [m["step"] for m in result.metrics] == [0, 1, 2]
    faults = result.metrics[1]["faults"]["trainer"]
    # The checker's step restarts; so does the solver's when its state save of step 1, staged
    # before the checker took the slot, was still being written by the slot's ranks (its
    # snapshot then is step 0's, and step 1 is re-trained on the same groups).
    assert faults["dead"] == 1 and faults["restarted_steps"] in (1, 2)
    assert sorted(faults["replacements"][0]["workers"]) == ["trainer-0-0-r1", "trainer-0-1-r1"]
    _assert_same_weights(result, clean, tiny_model_dir)
    assert not [n for n in running_workers() if n in ("trainer-0-0", "trainer-0-1")]
