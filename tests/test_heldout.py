"""Held-out accuracy before and after training (flexmarl.orchestrator.heldout, and its place in
a run: flexmarl.launch.run's eval.before and eval.final): the measurement, the change's standard
error, the result's shape, a resumed run's skip, RUN_DIR/eval.json."""
from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import statistics
from types import SimpleNamespace

import pytest

from flexmarl import AgentSpec, SamplingParams, Team
from flexmarl.config.pipeline import EvalConfig
from flexmarl.orchestrator.heldout import changes, measure, se_change, summary_line
from flexmarl.protocol import GenerateReply, Sample
from flexmarl.tasks import Task


class Runtime:
    """The part of AgentRuntime evaluation uses."""

    def __init__(self, name: str) -> None:
        self.spec = AgentSpec(name=name, model="tiny",
                              sampling=SamplingParams(max_tokens=4, temperature=0.7))

    def encode(self, prompt):
        return [ord(c) % 50 for c in prompt]

    def call_params(self, prompt, params):
        return params

    def check_room(self, prompt_ids, max_tokens):
        pass


class Engines:
    """A fake `generate`: answers the seed's parity (greedy: always "1"); records each request
    and the most requests in flight at once."""

    def __init__(self, version: int = 0) -> None:
        self.seen, self.version, self.in_flight, self.most = [], version, 0, 0

    async def __call__(self, agent, msg):
        self.seen.append((agent, msg))
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        await asyncio.sleep(0.001)  # let the other tasks in
        self.in_flight -= 1
        bit = 1 if msg.params.temperature == 0 else msg.params.seed % 2
        return GenerateReply(msg.request_id, self.version, msg.prompt_ids,
                             [Sample([1], [-0.1], "stop", str(bit))], None, "fake")


async def workflow(ctx, task) -> None:
    [a] = await ctx.generate("solver", task.prompt)
    ctx.reward(a, float(a.text == "1"))
    [b] = await ctx.generate("checker", task.prompt)
    ctx.reward(b, 1.0)


def make_team(n: int = 12) -> Team:
    return Team(name="t", workflow=workflow, tasks=[Task("q", "1", "x")],
                heldout=[Task(f"Compute {i}+1.", str(i + 1), f"h{i}") for i in range(n)],
                agents=[AgentSpec(name="solver", model="tiny"),
                        AgentSpec(name="checker", model="tiny", trainable=False)])


AGENTS = {n: Runtime(n) for n in ("solver", "checker")}


async def test_measure_runs_greedy_and_sampled_with_the_same_draws_every_time():
    settings = EvalConfig(final_tasks=10, max_concurrent_tasks=3, greedy=False, n=2)
    first, again = Engines(), Engines(version=5)
    before = await measure(make_team(), AGENTS, first, settings, seed=3, max_concurrent_calls=64)
    after = await measure(make_team(), AGENTS, again, settings, seed=3, max_concurrent_calls=64)
    assert before["greedy"]["mode"] == "greedy" and before["sampled"]["mode"] == "sampled (n=1)"
    assert before["greedy"]["tasks"] == before["sampled"]["tasks"] == 10  # eval.final_tasks
    temps = {m.params.temperature for _, m in first.seen}
    assert temps == {0.0, 0.7}  # greedy, and the agent's own sampling (eval.n is not used)
    assert len(first.seen) == 2 * 2 * 10
    # Both modes in flight together: never one request id twice (an engine refuses that).
    assert len({m.request_id for _, m in first.seen}) == len(first.seen)
    # Both modes share eval.max_concurrent_tasks: at most 3 tasks (one request each) at once.
    assert first.most <= 3
    sampled = sorted((m.request_id, m.params.seed) for _, m in first.seen
                     if m.params.temperature)
    assert sampled == sorted((m.request_id, m.params.seed) for _, m in again.seen
                             if m.params.temperature)
    assert before["greedy"]["agents"]["solver"]["reward"] == 1.0
    assert before["sampled"]["agents"] == after["sampled"]["agents"]
    assert after["sampled"]["versions"] == {"checker": [5, 5], "solver": [5, 5]}
    line = summary_line(before, ["solver"])
    assert line.startswith("solver greedy 1.000 sampled ") and "on 10 tasks" in line


def test_the_summary_line_of_a_measurement_whose_trajectories_failed_names_the_first_error():
    """A held-out line "no trainable agent took a turn on 8 tasks, 16 failed" says why (here a
    prompt past the context), not only how many failed."""
    error = "RequestError: agent p1: the prompt has 443 tokens and max_tokens asks for 128 more"
    failed = {"tasks": 8, "failed": 8, "errors": [error], "agents": {}}
    line = summary_line({"greedy": failed, "sampled": failed, "seconds": 1.0}, ["p1"])
    assert line == (f"no trainable agent took a turn on 8 tasks, 16 failed, 1 s (first error: "
                    f"{error})")
    ok = {"tasks": 8, "failed": 0, "errors": [], "agents": {"p1": {"reward": 0.5}}}
    assert "error" not in summary_line({"greedy": ok, "seconds": 1.0}, ["p1"])


def test_se_change_is_the_standard_error_of_a_difference_of_two_means():
    b = {"reward": 0.2, "var": statistics.variance([1, 0, 0, 0, 0]), "turns": 5}
    a = {"reward": 0.6, "var": statistics.variance([1, 1, 1, 0, 0]), "turns": 5}
    assert se_change(b, a) == pytest.approx(math.sqrt(0.2 / 5 + 0.3 / 5))
    # Any reward, not only 0/1: the variance of the turn rewards is what counts.
    graded = {"reward": 0.5, "var": statistics.variance([0.25, 0.75] * 50), "turns": 100}
    assert se_change(graded, graded) == pytest.approx(math.sqrt(2 * 0.25 ** 2 * 100 / 99 / 100))
    assert se_change(None, a) is None and se_change(b, {"reward": 1, "var": None, "turns": 1}) \
        is None


def _result(rewards: dict[str, float], tasks: int = 4) -> dict:
    agents = {n: {"reward": r, "var": 0.25, "turns": tasks} for n, r in rewards.items()}
    return {"greedy": {"agents": agents, "tasks": tasks, "failed": 0},
            "sampled": {"agents": agents, "tasks": tasks, "failed": 0}, "seconds": 1.0}


def test_changes_per_trainable_agent_that_took_turns_in_both_modes():
    before = _result({"solver": 0.25, "checker": 0.5})
    after = _result({"solver": 0.75, "checker": 0.5})
    out = changes(before, after, ["solver", "idle"])  # idle: trainable, never asked
    assert out == {"solver": {m: {"before": 0.25, "after": 0.75,
                                  "se_change": pytest.approx(math.sqrt(0.25 / 4 * 2)),
                                  "tasks": 4} for m in ("greedy", "sampled")}}
    # Not measured before (eval.before off, or a resumed run): after only, no error.
    assert changes(None, after, ["solver"])["solver"]["greedy"] == {
        "before": None, "after": 0.75, "se_change": None, "tasks": 4}
    assert changes(before, None, ["solver"])["solver"]["sampled"]["after"] is None
    assert changes(None, None, ["solver"]) is None


# ------------------------------------------------------------ in a run (flexmarl.launch.run)

def _parts(versions: dict[str, int]) -> SimpleNamespace:
    agents = {n: SimpleNamespace(spec=SimpleNamespace(trainable=n != "checker"), version=v)
              for n, v in versions.items()}
    return SimpleNamespace(agents=agents)


async def test_a_resumed_run_skips_the_measurement_before_and_says_why():
    from flexmarl.launch.run import _before

    async def never() -> dict:
        raise AssertionError("a resumed run must not measure its (restored) starting weights")

    skipped = await _before(never, 3, _parts({"solver": 3}))
    assert skipped == {"skipped": "skipped: the run resumed at step 3, its starting weights "
                                  "are no longer the initial ones, and its eval.json records "
                                  "no measurement of them"}
    assert await _before(None, 0, _parts({"solver": 0})) is None  # eval.before = false

    async def now() -> dict:
        return _result({"solver": 0.5})
    assert (await _before(now, 0, _parts({"solver": 0})))["greedy"]["agents"]["solver"]


async def test_a_resumed_run_keeps_the_measurement_before_its_eval_json_recorded(tmp_path):
    """The measurement before training is in eval.json as soon as it is made; a --resume of the
    run (killed, or trained further) keeps it, so the before -> after change is still there."""
    from flexmarl.launch.run import _before, _heldout_results, _record_before

    run_dir = SimpleNamespace(path=tmp_path)
    before = _result({"solver": 0.25})
    _record_before(run_dir, before, {"before": {"agents": {"solver": {"nash_conv": 1.0}}}})
    on_disk = json.loads((tmp_path / "eval.json").read_text())
    assert on_disk["before"] == before and on_disk["policies"]["before"]

    async def never() -> dict:
        raise AssertionError("a resumed run must not measure its (restored) starting weights")
    kept = await _before(never, 3, _parts({"solver": 3}), run_dir)
    assert kept == before
    _heldout_results(_parts({"solver": 5}), kept, _result({"solver": 0.75}), 5, run_dir, None,
                     1.0)
    again = await _before(never, 5, _parts({"solver": 5}), run_dir)  # resumed a second time
    assert again == before
    cell = json.loads((tmp_path / "eval.json").read_text())["heldout"]["solver"]["greedy"]
    assert (cell["before"], cell["after"]) == (0.25, 0.75)


def test_the_results_and_eval_json(tmp_path):
    from flexmarl.launch.run import _heldout_results

    run_dir = SimpleNamespace(path=tmp_path)
    parts = _parts({"solver": 2, "checker": 0})
    before, after = _result({"solver": 0.25, "checker": 1.0}), _result({"solver": 0.5})
    final, heldout = _heldout_results(parts, before, after, 2, run_dir, None, 12.5)
    assert set(heldout) == {"solver"} and heldout["solver"]["greedy"]["after"] == 0.5
    assert final["final"] and final["after_step"] == 1
    assert final["versions_final"] == {"solver": 2, "checker": 0}
    assert final["agents"] == after["greedy"]["agents"]  # the greedy fields at the top
    on_disk = json.loads((tmp_path / "eval.json").read_text())
    assert on_disk["heldout"] == heldout and on_disk["time_to_first_step_s"] == 12.5
    assert on_disk["before"]["greedy"]["agents"]["checker"]["reward"] == 1.0
    # Resumed: the skip recorded, only "after" values; no eval.final: no final_eval, but the
    # file still keeps what was measured.
    final, heldout = _heldout_results(parts, {"skipped": "why"}, after, 2, run_dir, None, None)
    assert heldout["solver"]["greedy"]["before"] is None and final["before"] == {"skipped": "why"}
    final, heldout = _heldout_results(parts, before, None, 2, run_dir, None, 3.0)
    assert final is None and heldout["solver"]["sampled"] == {
        "before": 0.25, "after": None, "se_change": None, "tasks": 4}
    assert json.loads((tmp_path / "eval.json").read_text())["after"] is None


# ------------------------------------------------------- scores, modes and the before's size

async def scoring_workflow(ctx, task) -> None:
    [a] = await ctx.generate("solver", task.prompt)
    ctx.reward(a, float(a.text == "1"))
    ctx.score("solver", "games.random.win", float(a.text == "1"))
    ctx.score("solver", "games.random.invalid", 0.0)
    ctx.score("solver", "games.random.invalid", 1.0)  # two moves: scored per value given


async def test_scores_are_measured_per_agent_and_changes_carry_them_in_the_modes_asked():
    team = dataclasses.replace(make_team(), workflow=scoring_workflow)
    settings = EvalConfig(final_tasks=10, before_tasks=4, modes=("sampled",))
    before = await measure(team, AGENTS, Engines(), settings, seed=3, max_concurrent_calls=8,
                           before=True)
    after = await measure(team, AGENTS, Engines(), settings, seed=3, max_concurrent_calls=8)
    assert set(before) == {"sampled", "seconds"} and before["sampled"]["tasks"] == 4
    assert after["sampled"]["tasks"] == 10  # eval.before_tasks sizes the before one alone
    scores = after["sampled"]["agents"]["solver"]["scores"]
    assert scores["games.random.invalid"] == {"mean": 0.5, "var": pytest.approx(20 / 19 / 4),
                                              "n": 20}
    assert scores["games.random.win"]["n"] == 10
    out = changes(before, after, ["solver"])
    assert list(out["solver"]) == ["sampled"]
    cell = out["solver"]["sampled"]["scores"]["games.random.win"]
    assert cell["n"] == 10 and cell["se_change"] is not None
    assert cell["before"] == before["sampled"]["agents"]["solver"]["scores"][
        "games.random.win"]["mean"]
    assert "greedy" not in summary_line(after, ["solver"])


def test_eval_modes_are_checked():
    from flexmarl.checks import ConfigError
    for bad in ((), ("greedy", "greedy"), ("beam",), "greedy"):
        with pytest.raises(ConfigError, match="eval.modes"):
            EvalConfig(modes=bad)
    assert EvalConfig(modes=["sampled"]).modes == ("sampled",)
