"""Pipeline modes: policy logic, the TrainSession, and the staleness guarantees on real runs.

Layers: pure policy objects and gates; the TrainSession against a recording trainer double;
then whole `train()` runs (torch rollout backend, real trainer processes, the tiny model, two
agents) that prove the guarantees from the samples actually trained:
- micro_batch: every trained sample's policy_version equals the version being updated;
- micro_batch and sync end with the same weights from the same samples (fp32; SYNC_WEIGHT_ATOL);
- one_step_off: exactly one version stale after the first step; bounded: never more than k;
- the weight push alone opens the next rollout: state saves run beside it, in step order.
"""
from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import pytest
from safetensors.torch import load_file

from flexmarl import AgentSpec, SamplingParams, Team
from flexmarl.orchestrator.batch import TrainSession
from flexmarl.orchestrator.agents import StalenessError
from flexmarl.orchestrator.agents import AgentRuntime, BusyClock, StepGate
from flexmarl.orchestrator.policy import PIPELINES, make_pipeline
from flexmarl.protocol import TrainBeginBatch, TrainMicroBatch, TrainStats, TrainStep, TrainStepDone
from flexmarl.orchestrator.store import Group, Turn
from flexmarl.tasks import addition_tasks
from tests.helpers.numerics import MIXED_REL_TOL, SYNC_WEIGHT_ATOL, relative_distance
from tests.helpers.runs import config, hist, run
from tests.helpers.teams import duo, varied  # the two-agent team of the end-to-end test


# ----------------------------------------------------------------------------- policies

def test_policy_table():
    knobs = {m: (p.stream, p.lag, p.team_barrier, p.defer_sync, p.max_staleness)
             for m in PIPELINES for p in [make_pipeline(m, max_staleness=2)]}
    assert knobs == {"sync": (False, 0, True, False, 0),
                     "micro_batch": (True, 0, False, False, 0),
                     "one_step_off": (True, 1, False, True, 1),
                     "bounded": (True, 2, False, False, 2)}
    with pytest.raises(ValueError, match="not one of"):
        make_pipeline("async")
    with pytest.raises(ValueError, match="max_staleness must be >= 1"):
        make_pipeline("bounded", max_staleness=0)


def test_admit_strict_modes_raise_and_bounded_drops():
    strict = make_pipeline("micro_batch")
    assert strict.admit(0, step=5)
    with pytest.raises(StalenessError, match="1 versions old"):
        strict.admit(1, step=5)
    off = make_pipeline("one_step_off")
    assert off.admit(1, step=3) and off.admit(0, step=3)  # 0 after a step without update
    with pytest.raises(StalenessError):
        off.admit(2, step=3)
    bounded = make_pipeline("bounded", max_staleness=2)
    assert bounded.admit(2, step=9) and not bounded.admit(3, step=9)


async def test_step_gate_wakes_waiters_in_order():
    gate = StepGate(0)
    woke: list[int] = []

    async def waiter(step: int) -> None:
        await gate.wait(step)
        woke.append(step)

    tasks = [asyncio.create_task(waiter(s)) for s in (2, 0, 1)]
    await asyncio.sleep(0)
    assert woke == [0]
    gate.open(1)
    await asyncio.sleep(0)
    assert woke == [0, 1]
    gate.open(0)  # monotone: never closes again
    gate.open(2)
    await asyncio.gather(*tasks)
    assert woke == [0, 1, 2] and gate.open_to == 2


def test_busy_clock_counts_overlapping_requests_once(monkeypatch):
    now = [0.0]
    monkeypatch.setattr("flexmarl.orchestrator.agents.now", lambda: now[0])
    clock = BusyClock()
    clock.enter()            # t=0  one request
    now[0] = 1.0
    clock.enter()            # t=1  two
    now[0] = 2.0
    clock.exit()             # t=2  one
    now[0] = 3.0
    clock.exit()             # t=3  idle: busy 3 s, not 4
    now[0] = 10.0
    clock.enter()
    now[0] = 10.5
    assert clock.seconds == pytest.approx(3.5)  # an ongoing interval counts so far


# ----------------------------------------------------------------------------- TrainSession

class RecordingTrainer:
    """Stands in for a trainer connection: records requests, answers like GRPOTrainer."""

    def __init__(self, version: int) -> None:
        self.version = version
        self.requests: list = []
        self.rows = 0

    async def request(self, msg, timeout_s=None):
        self.requests.append(msg)
        if isinstance(msg, TrainMicroBatch):
            n = int(msg.response_mask.sum())
            self.rows += int(msg.input_ids.shape[0])
            return TrainStats(loss=float(n), num_tokens=n)
        if isinstance(msg, TrainStep):
            self.version += 1
            rows, self.rows = self.rows, 0
            return TrainStepDone(version=self.version, grad_norm=1.0, step_s=0.0, samples=rows)
        return None


class _Tok:
    pad_token_id = 0


class OneSlot:
    """Stands in for the TrainerPool: every bind of the agent yields the same trainer."""

    def __init__(self, trainer: RecordingTrainer) -> None:
        self.trainer = trainer
        self.binds = 0

    @contextlib.asynccontextmanager
    async def bind(self, agent: str):
        self.binds += 1
        yield self.trainer


def group(i: int, version: int, rewards=(0.0, 1.0), agent: str = "a") -> Group:
    turns = [Turn(agent, f"s0t{i}", 0, str(j), version, [1, 2], [3] * (j + 1), [-0.5] * (j + 1),
                  reward=r, advantage=r - sum(rewards) / len(rewards))
             for j, r in enumerate(rewards)]
    return Group(agent, f"s0t{i}", 0, turns)


def session(trainer_version: int, admit, micro_batch_groups: int = 2):
    trainer = RecordingTrainer(trainer_version)
    rt = AgentRuntime(AgentSpec(name="a", model="tiny"), "", _Tok(),
                      trainer_version=trainer_version, version=trainer_version)
    # kl_coef = 0: a group with equal rewards is not trained (tests/test_batch_objective.py)
    return TrainSession(rt, OneSlot(trainer), micro_batch_groups, admit, kl_coef=0.0), trainer


async def test_session_micro_batches_and_declares_tokens_at_the_step():
    s, trainer = session(3, lambda age: make_pipeline("micro_batch").admit(age, 0))
    await s.add([group(0, 3)])
    assert trainer.requests == []  # one group < micro_batch_groups: buffered
    await s.add([group(1, 3), group(2, 3, rewards=(1.0, 1.0))])  # the last has no signal
    await s.add([group(3, 3)])
    result = await s.finish()
    kinds = [type(m).__name__ for m in trainer.requests]
    assert kinds == ["TrainBeginBatch", "TrainMicroBatch", "TrainMicroBatch", "TrainStep"]
    assert trainer.requests[0] == TrainBeginBatch(0)  # count deferred to the step
    assert [m.input_ids.shape[0] for m in trainer.requests[1:3]] == [4, 2]
    assert trainer.requests[-1].num_tokens == 9 == result.tokens  # 3 groups x (1 + 2) tokens
    assert result.loss == pytest.approx(1.0)  # token sum / tokens
    assert (result.version, result.groups, result.samples) == (4, 3, 6)
    assert result.staleness_hist == {0: 6} and result.staleness == 0.0
    assert s.rt.trainer_version == 3  # the loop moves the version (AgentRuntime.trained)
    s.rt.trained(result.version)
    assert s.rt.trainer_version == 4
    with pytest.raises(StalenessError, match="at 4 already"):  # a version never goes back
        s.rt.trained(4)
    assert s.trainers.binds == 1  # one slot binding for the whole batch


async def test_session_strict_mode_refuses_a_stale_sample():
    s, trainer = session(3, lambda age: make_pipeline("micro_batch").admit(age, 0))
    with pytest.raises(StalenessError, match="1 versions old"):
        await s.add([group(0, 2)])
    assert trainer.requests == []


async def test_session_bounded_drops_groups_beyond_k():
    s, trainer = session(5, lambda age: make_pipeline("bounded", max_staleness=2).admit(age, 0))
    await s.add([group(0, 5), group(1, 3), group(2, 2), group(3, 4)])
    result = await s.finish()
    assert result.dropped_stale == 2  # group 2 (3 versions old), both samples
    assert result.staleness_hist == {0: 2, 1: 2, 2: 2}
    assert result.groups == 3


async def test_session_refuses_samples_newer_than_the_trainer():
    s, _ = session(1, lambda age: make_pipeline("bounded", max_staleness=2).admit(age, 0))
    with pytest.raises(StalenessError, match="trainer is at version 1"):
        await s.add([group(0, 2)])


async def test_eager_session_sends_what_each_add_brings():
    s, trainer = session(0, lambda age: True, micro_batch_groups=3)
    s.eager = True
    await s.add([group(0, 0)])
    await s.add([group(i, 0) for i in range(1, 6)])  # a backlog: one full micro-batch, then 2
    await s.finish()
    sizes = [m.input_ids.shape[0] // 2 for m in trainer.requests
             if isinstance(m, TrainMicroBatch)]
    assert sizes == [1, 3, 2]


async def test_session_without_signal_does_not_step():
    s, trainer = session(0, lambda age: True)
    await s.add([group(0, 0, rewards=(1.0, 1.0))])
    assert await s.finish() is None and trainer.requests == []


# ----------------------------------------------------------------------------- real runs

@pytest.mark.slow
async def test_micro_batch_trains_only_current_version_samples(tiny_model_dir, tmp_path,
                                                                no_leftover_children):
    result = await run(duo(tiny_model_dir), config(tmp_path, "micro_batch"))
    for name in ("solver", "checker"):
        assert [m["agents"][name]["version"] for m in result.metrics] == [1, 2, 3]
        for m in result.metrics:
            a = m["agents"][name]
            assert a["trained_samples"] > 0
            # Every trained sample was generated by the version it updated (per sample, from the
            # policy_version each turn recorded), or the TrainSession would have raised.
            assert hist(m, name) == {0: a["trained_samples"]}
            assert a["train_s"] > 0 and a["sync_s"] > 0 and a["rollout_busy_s"] > 0
            assert a["t_first_call"] < a["t_done"]
            # The agent's step is its trainer's busy, syncing and idle time.
            assert a["train_s"] + a["sync_s"] + a["train_idle_s"] == pytest.approx(a["step_s"])
            assert a["rollout_busy_s"] + a["rollout_idle_s"] == pytest.approx(a["step_s"])
            assert "is_weight_mean" not in a["train_metrics"] and a["train_metrics"]["grad_norm"] > 0


@pytest.mark.slow
@pytest.mark.parametrize("shape", ["one_group", "mixed"])
async def test_micro_batch_and_sync_end_with_the_same_weights(shape, tiny_model_dir, tmp_path,
                                                              monkeypatch, no_leftover_children):
    """one_group: one task at a time, one group per micro-batch and an engine that runs every
    request alone, so both modes accumulate the same micro-batches in the same order, their
    behaviour log-probabilities included (checked), and end bit-equal. (Without
    rollout.max_num_seqs=1 the torch engine may batch a task's two checker calls together in
    one run and apart in the other, as the trainer's work beside rollout delays one: the
    padding then changes log-probabilities in the last bits, and AdamW carries that to ~1e-5
    in the weights.) mixed: 4 tasks in flight and 2 groups
    per micro-batch: micro_batch sends whatever is ready when the trainer is free, sync sends
    the stored batch, so the two modes' micro-batches differ in composition, order and padding
    (checked), and the weights agree within MIXED_REL_TOL. That this check can fail: a
    per-micro-batch normaliser breaks it, and the gradient equality it rests on
    (tests/test_trainer.py::test_micro_batches_of_any_composition_and_padding_give_the_same_gradient)."""
    extra = (("pipeline.max_concurrent_tasks=1", "pipeline.micro_batch_groups=1",
              "rollout.max_num_seqs=1")
             if shape == "one_group" else
             ("pipeline.max_concurrent_tasks=4", "pipeline.micro_batch_groups=2"))
    # mode -> [(agent, version, input ids of a micro-batch, its turns' tokens and log-probs)]
    send, sent = TrainSession._send, {}

    async def recording_send(self, groups):
        turns = tuple((tuple(t.prompt_ids), tuple(t.response_ids), tuple(t.logprobs))
                      for g in groups for t in g.turns)
        sent[list(sent)[-1]].append((self.rt.spec.name, self.version,
                                     tuple(g.input_id for g in groups), turns))
        await send(self, groups)

    monkeypatch.setattr(TrainSession, "_send", recording_send)
    results = {}
    for mode in ("sync", "micro_batch"):
        sent[mode] = []
        results[mode] = await run(duo(tiny_model_dir), config(tmp_path, mode, *extra))
    if shape == "mixed":
        assert sorted(m[:3] for m in sent["sync"]) != sorted(m[:3] for m in sent["micro_batch"]), \
            "the two modes fed identical micro-batches: this case would prove nothing"
    else:  # the precondition of bit-equality: each agent's micro-batches the same, in one order
        def by_agent(mbs):  # stable: an agent's own order kept, the two agents' interleaving not
            return sorted(mbs, key=lambda m: m[0])

        assert by_agent(sent["sync"]) == by_agent(sent["micro_batch"]), \
            "the two modes fed different micro-batches (or the engine's log-probabilities differed)"
    sync, micro = results["sync"], results["micro_batch"]
    for a, b in zip(sync.metrics, micro.metrics):
        for name in ("solver", "checker"):  # the same samples: per-request seeds, same weights
            x, y = a["agents"][name], b["agents"][name]
            assert (x["tokens"], x["reward"], x["trained_samples"]) == \
                   (y["tokens"], y["reward"], y["trained_samples"])
    start = load_file(str(Path(tiny_model_dir) / "model.safetensors"))
    for name in ("solver", "checker"):
        ws = load_file(str(sync.checkpoints[name] / "model.safetensors"))
        wm = load_file(str(micro.checkpoints[name] / "model.safetensors"))
        moved = max((ws[k] - start[k]).abs().max().item() for k in ws)
        diff = max((ws[k] - wm[k]).abs().max().item() for k in ws)
        rel = relative_distance(ws, wm, start)
        print(f"{shape} {name}: moved {moved:.3g}, micro_batch vs sync max abs diff {diff:.3g}, "
              f"relative to the distance moved {rel:.3g}")
        assert moved > 1e-4  # they did learn
        if shape == "one_group":
            assert diff <= SYNC_WEIGHT_ATOL
        else:
            assert rel <= MIXED_REL_TOL


@pytest.mark.slow
async def test_one_step_off_is_exactly_one_version_stale(tiny_model_dir, tmp_path,
                                                         no_leftover_children):
    result = await run(duo(tiny_model_dir), config(tmp_path, "one_step_off", "run.steps=4"))
    for name in ("solver", "checker"):
        assert [m["agents"][name]["version"] for m in result.metrics] == [1, 2, 3, 4]
        trained = [m["agents"][name]["trained_samples"] for m in result.metrics]
        assert [hist(m, name) for m in result.metrics] == \
               [{0: trained[0]}] + [{1: n} for n in trained[1:]]


@pytest.mark.slow
async def test_bounded_never_trains_past_k(tiny_model_dir, tmp_path, no_leftover_children):
    result = await run(duo(tiny_model_dir), config(tmp_path, "bounded", "run.steps=4",
                                                    "pipeline.max_staleness=2"))
    seen = set()
    for m in result.metrics:
        for name in ("solver", "checker"):
            seen |= hist(m, name).keys()
            assert max(hist(m, name), default=0) <= 2
            # Stale tokens are corrected by the truncated importance weight (pipeline.is_cap).
            metrics = m["agents"][name]["train_metrics"]
            assert 0 < metrics["is_weight_mean"] <= 2.0 and 0 <= metrics["is_truncated_frac"] <= 1
    assert seen - {0}, "bounded ran fully synchronously: nothing was ever stale"


async def heavy_checker_workflow(ctx, task) -> None:
    [answer] = await ctx.generate("solver", task.prompt)
    ctx.reward(answer, varied(answer))
    refs = await ctx.generate("checker", task.prompt, n=16)
    for r in refs:
        ctx.reward(r, varied(r))


@pytest.mark.slow
async def test_agents_advance_independently(tiny_model_dir, tmp_path, no_leftover_children):
    """micro_batch: the solver (a small batch) syncs and starts generating for the next step
    while the checker (a much larger batch) is still training; sync holds everyone back."""
    team = Team(name="lopsided", workflow=heavy_checker_workflow, tasks=addition_tasks(64, seed=5),
                agents=[AgentSpec(name="solver", model=tiny_model_dir,
                                  sampling=SamplingParams(max_tokens=2)),
                        AgentSpec(name="checker", model=tiny_model_dir,
                                  sampling=SamplingParams(max_tokens=64))])
    extra = ("pipeline.micro_batch_groups=64", "rollout.max_model_len=128")
    micro = await run(team, config(tmp_path, "micro_batch", *extra))
    sync = await run(team, config(tmp_path, "sync", *extra))
    steps = range(len(micro.metrics) - 1)
    margins = [micro.metrics[s]["agents"]["checker"]["t_done"]
               - micro.metrics[s + 1]["agents"]["solver"]["t_first_call"] for s in steps]
    print("solver's next step started this long before the checker finished:", margins)
    ahead = [m > 0 for m in margins]
    assert any(ahead), [(m["agents"]["solver"]["t_done"], m["agents"]["checker"]["t_done"])
                        for m in micro.metrics]
    for s in steps:  # the synchronous baseline: nobody starts step s+1 before all finished s
        done = max(a["t_done"] for a in sync.metrics[s]["agents"].values())
        assert all(a["t_first_call"] >= done for a in sync.metrics[s + 1]["agents"].values())


async def skewed_workflow(ctx, task) -> None:
    """The hot agent is called six times per call of the cold one, with longer answers."""
    [ref] = await ctx.generate("cold", task.prompt)
    ctx.reward(ref, varied(ref))
    for _ in range(6):
        [answer] = await ctx.generate("hot", task.prompt, max_tokens=24)
        ctx.reward(answer, varied(answer))


@pytest.mark.slow
async def test_rebalancing_moves_instances_to_the_hot_agent(tiny_model_dir, tmp_path,
                                                            no_leftover_children):
    """Real engines: an instance of the cold agent is drained, loaded with the hot agent's
    served weights and routed to; no request is lost and every trained sample is still
    exactly of the version it updates (micro_batch would raise otherwise). The mechanism is
    under test, so the ratio rule alone decides (balance.cost_aware off: whether a move pays
    on real engines this small is noise; the cost test has its own tests)."""
    team = Team(name="skewed", workflow=skewed_workflow, tasks=addition_tasks(64, seed=7),
                agents=[AgentSpec(name="hot", model=tiny_model_dir, instances=2,
                                  sampling=SamplingParams(max_tokens=24)),
                        AgentSpec(name="cold", model=tiny_model_dir, instances=2,
                                  sampling=SamplingParams(max_tokens=4))])
    cfg = config(tmp_path, "micro_batch", "run.steps=4", "pipeline.max_concurrent_tasks=4",
                 "balance.ratio=2", "balance.patience=2", "balance.check_interval_s=0.05",
                 "balance.demand_window_s=2", "balance.cooldown_s=0.5",
                 "balance.min_load_tokens=8", "balance.cost_aware=false")
    result = await run(team, cfg)
    moves = [mv for m in result.metrics for mv in m["moves"]]
    print("moves:", [(mv["instance"], mv["src"], mv["dst"], round(mv["drain_s"], 3),
                      round(mv["load_s"], 3)) for mv in moves])
    assert moves and all((mv["src"], mv["dst"]) == ("cold", "hot") for mv in moves)
    assert len(moves) == 1  # the cold agent keeps balance.min_instances = 1: no flapping
    assert result.metrics[-1]["agents"]["hot"]["instances"] == 3
    assert result.metrics[-1]["agents"]["cold"]["instances"] == 1
    for m in result.metrics:  # every call of every trajectory came back
        assert m["agents"]["hot"]["samples"] == 4 * 2 * 6 and m["agents"]["cold"]["samples"] == 8
        for name in ("hot", "cold"):
            a = m["agents"][name]
            assert set(hist(m, name)) <= {0}, (name, a["staleness_hist"])
    assert moves[0]["version"] >= 0 and moves[0]["num_bytes"] > 0


async def fan_out_workflow(ctx, task) -> None:
    samples = await ctx.generate("solver", task.prompt, n=4)
    for s in samples:
        ctx.reward(s, varied(s))


@pytest.mark.slow
async def test_samples_of_one_call_are_spread_over_instances(tiny_model_dir, tmp_path,
                                                             no_leftover_children):
    """pipeline.samples_per_request splits a call's n samples into requests the balancer
    spreads over the agent's instances; they come back as one call's samples, one group."""
    team = Team(name="fan", workflow=fan_out_workflow, tasks=addition_tasks(64, seed=9),
                agents=[AgentSpec(name="solver", model=tiny_model_dir, instances=2,
                                  sampling=SamplingParams(max_tokens=6))])
    cfg = config(tmp_path, "micro_batch", "run.steps=2", "pipeline.samples_per_request=1",
                 "balance.strategy=least_loaded")
    result = await run(team, cfg)
    for m in result.metrics:
        a = m["agents"]["solver"]
        assert a["samples"] == 4 * 2 * 4 and a["latency"]["requests"] == 4 * 2 * 4
        assert a["trained_samples"] % 8 == 0 and hist(m, "solver") == {0: a["trained_samples"]}
        assert sorted(m["instance_tokens"]) == ["rollout-0", "rollout-1"]
        assert all(t > 0 for t in m["instance_tokens"].values()), m["instance_tokens"]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["sync", "micro_batch"])
async def test_a_step_larger_than_the_store_capacity_completes(mode, tiny_model_dir, tmp_path,
                                                               monkeypatch, no_leftover_children):
    """A step's rows never wait for store capacity: in `sync` mode nothing is consumed before
    the whole step is stored, so a step of 8 solver rows against a capacity of 3 used to wait
    for ever. Rows sampled ahead (the next step's) are still held to the capacity."""
    import flexmarl.launch.compose as compose_module
    from flexmarl.orchestrator.store import ExperienceStore

    stores = []

    def small_store(*args, **kwargs):
        stores.append(ExperienceStore(*args, **{**kwargs, "capacity_per_agent": 3}))
        return stores[-1]

    monkeypatch.setattr(compose_module, "ExperienceStore", small_store)
    result = await run(duo(tiny_model_dir), config(tmp_path, mode, "run.steps=2"))
    assert [m["step"] for m in result.metrics] == [0, 1]
    for m in result.metrics:  # 4 tasks x 2 trajectories: 8 checker rows, 16 solver rows
        assert m["agents"]["checker"]["samples"] == 8 and m["agents"]["solver"]["samples"] == 16
    assert stores[0].capacity_per_agent == 3


# ----------------------------------------------------------------------------- off the critical path

SLOW_SAVE_S = 1.0


@pytest.mark.slow
async def test_the_gate_opens_before_the_state_is_saved(tiny_model_dir, tmp_path, monkeypatch,
                                                        no_leftover_children):
    """Every state save takes SLOW_SAVE_S: each agent's next rollout passes its gate while the
    saves of its previous step are still running; one agent's saves run one at a time in step
    order; a step's record is never written before its states; the run returns only once the
    last save is done."""
    import time

    from flexmarl.observe.rundir import read_metrics
    from flexmarl.training.pool import TrainerPool

    saves: list[tuple[str, int, float, float]] = []  # agent, step, started, ended
    passes: list[tuple[int, float]] = []  # gate passes: step, when
    save, wait = TrainerPool.save, StepGate.wait
    cfg = config(tmp_path, "micro_batch")
    metrics = Path(cfg.run.dir) / "metrics.jsonl"

    async def slow_save(self, agent, step, **kwargs):  # the ranks' write takes SLOW_SAVE_S more
        started = time.perf_counter()
        recorded = [m["step"] for m in read_metrics(metrics)] if metrics.exists() else []
        assert step not in recorded, (agent, step, recorded)  # the record waits for its states
        landing = await save(self, agent, step, **kwargs)

        async def slow() -> object:
            out = await landing
            await asyncio.sleep(SLOW_SAVE_S)
            saves.append((agent, step, started, time.perf_counter()))
            return out
        return asyncio.ensure_future(slow())

    async def timed_wait(self, step):
        await wait(self, step)
        passes.append((step, time.perf_counter()))

    monkeypatch.setattr(TrainerPool, "save", slow_save)
    monkeypatch.setattr(StepGate, "wait", timed_wait)
    result = await run(duo(tiny_model_dir), cfg)
    returned = time.perf_counter()

    assert [m["step"] for m in result.metrics] == [0, 1, 2]
    for agent in ("solver", "checker"):
        own = [s for s in saves if s[0] == agent]
        assert [s[1] for s in own] == [0, 1, 2]  # in step order
        assert all(a[3] <= b[2] for a, b in zip(own, own[1:]))  # one at a time
    # Step s+1's calls passed their gates before step s's saves were done (both agents' gates
    # count: a call of the duo's workflow waits for the checker's, then the solver's).
    for step in (0, 1):
        saved = min(end for _, s, _, end in saves if s == step)
        first_pass = min(t for s, t in passes if s == step + 1)
        assert first_pass < saved - SLOW_SAVE_S / 2, (step, saved - first_pass)
    assert max(end for *_, end in saves) < returned  # the run waited for the last save
    state = Path(cfg.run.dir) / "state"
    assert {p.name for p in (state / "solver").iterdir()} == {"step-000002"}
