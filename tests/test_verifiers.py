"""flexmarl.envs.verifiers: verifiers environments (verifiers.v1) as teams.

An environment package loaded by name (tests/data/vf-tiny-env: its source folder on the path
for the scripted tests, pip-installed into a scratch folder for its training run) and a taskset
written in code (agents/verifiers_sums.py); their episodes
run through verifiers' real machinery (rollout, interception, the rubric) in this process, the
model calls answered by a scripted ctx; verifiers' own user-sim env for two roles and several
turns; the refusals (tools, program harnesses, roles); and two short runs of the tiny model: the
code env, with `flexmarl eval RUN_DIR` agreeing with the run's own evaluation, and the package.
"""
from __future__ import annotations

import asyncio
import importlib.util
import json
import sys
from pathlib import Path

import pytest

from flexmarl import AgentSpec, SamplingParams
from flexmarl.envs import EXTRA_HINT, MissingExtra
from flexmarl.team import Completion, load_team

pytestmark = pytest.mark.skipif(importlib.util.find_spec("verifiers") is None,
                                reason=f"verifiers is not installed: {EXTRA_HINT}")

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "tests" / "data" / "vf-tiny-env"
SUMS = ROOT / "agents" / "verifiers_sums.py"


@pytest.fixture
def tiny_env(monkeypatch):
    """The package's source folder on the path: `vf_tiny_env` imports as if installed."""
    monkeypatch.syspath_prepend(str(PACKAGE))


@pytest.fixture
def installed_env(tmp_path, monkeypatch):
    """The package pip-installed (no index, no build isolation: setuptools is beside us) into
    a scratch folder, which goes on the path as a site directory would."""
    import subprocess
    site = tmp_path / "site"
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                           "--no-index", "--no-build-isolation", "--disable-pip-version-check",
                           "--target", str(site), str(PACKAGE)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (site / "vf_tiny_env" / "__init__.py").is_file()
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.delitem(sys.modules, "vf_tiny_env", raising=False)  # this copy, not the source
    return site


def team_of(*args, **kwargs):
    from flexmarl.envs.verifiers import verifiers_team
    return verifiers_team(*args, **kwargs)


class ScriptedCtx:
    """A workflow's ctx whose agents answer from `script` (agent -> texts, in turn), or raise."""

    def __init__(self, script: dict[str, list], trajectory: int = 0) -> None:
        self.script = {agent: list(texts) for agent, texts in script.items()}
        self.calls: list[tuple[str, list]] = []
        self.rewards: list[tuple[str, str, float]] = []
        self.scores: dict[tuple[str, str], float] = {}
        self.weights: dict[str, float] = {}
        """completion text -> the weight its reward was given with."""
        self.team: float | None = None

    async def generate(self, agent, prompt, *, n=1, turn=None, **sampling):
        self.calls.append((agent, prompt))
        text = self.script[agent].pop(0)
        if isinstance(text, Exception):
            raise text
        return [Completion(agent, text, [7] * len(text), [0.0] * len(text), 0, "stop", [1, 2],
                           f"{len(self.calls)}_{agent}")]

    def reward(self, completion, value, *, weight=1.0):
        self.rewards.append((completion.agent, completion.text, value))
        self.weights[completion.text] = weight

    def score(self, agent, name, value):
        self.scores[(agent, name)] = value

    def team_reward(self, value):
        self.team = value


async def play(team, *scripts: dict) -> list[ScriptedCtx]:
    """One trajectory of team.tasks[i] per script, then the team's endpoint stopped."""
    ctxs = [ScriptedCtx(script) for script in scripts]
    try:
        for task, ctx in zip(team.tasks, ctxs):
            await team.workflow(ctx, task)
    finally:
        await team.workflow.__self__.aclose()
    return ctxs


# ------------------------------------------------------------------------------ tasks

def test_an_installed_package_loads_by_name_with_its_eval_split_held_out(tiny_env):
    team = team_of("vf-tiny-env", args={"n": 6}, heldout_args={"split": "heldout"}, heldout=3,
                   model="tiny")
    assert team.name == "vf-tiny-env" and [a.name for a in team.agents] == ["agent"]
    assert [t.task_id for t in team.tasks] == [f"vf-tiny-env-{i}" for i in range(6)]
    assert [t.task_id for t in team.heldout] == [f"vf-tiny-env-heldout-{i}" for i in range(3)]
    assert team.tasks[1].task.data.prompt == "0+1=" and team.heldout[0].task.data.prompt == "5+0="
    # Without an eval split, the held-out tasks are the last of the first train + heldout.
    carved = team_of("vf-tiny-env", args={"n": 9}, train=5, heldout=3, model="tiny")
    assert [t.task.data.prompt for t in carved.tasks] == ["0+0=", "0+1=", "0+2=", "0+3=", "0+4="]
    assert [t.task.data.prompt for t in carved.heldout] == ["1+0=", "1+1=", "1+2="]


def test_the_code_env_splits_its_sums_and_maps_its_role_to_the_solver():
    team = load_team(SUMS)
    assert team.name == "verifiers_sums" and [a.name for a in team.agents] == ["solver"]
    assert len(team.tasks) == 300 and len(team.heldout) == 100
    prompts = {t.task.data.prompt for t in team.tasks}
    assert not prompts & {t.task.data.prompt for t in team.heldout}
    assert team.config == {"run": {"name": "verifiers_sums", "steps": 20}}


# ------------------------------------------------------------------------ episodes

async def test_a_trajectory_is_one_episode_rewarded_by_its_rubric(tiny_env):
    team = team_of("vf-tiny-env", args={"n": 2}, model="tiny")
    right, worded = await play(team, {"agent": ["0+0=0"]}, {"agent": ["it is 1"]})
    assert right.calls == [("agent", [{"role": "system", "content": "Add."},
                                      {"role": "user", "content": "0+0="}])]
    # The rubric: correct (weight 0.75) + brief (0.25); each part and the metric as scores.
    assert right.rewards == [("agent", "0+0=0", 1.0)] and right.team == 1.0
    assert right.scores == {("agent", "correct"): 1.0, ("agent", "brief"): 1.0,
                            ("agent", "chars"): 5.0}
    assert worded.rewards == [("agent", "it is 1", 0.75)] and worded.team == 0.75
    assert worded.scores[("agent", "brief")] == 0.0


async def test_an_attempt_verifiers_discards_is_not_trained_with_the_retrys_reward(tiny_env):
    """A per-agent retry (the rubric raised on the first reply): the discarded attempt's turn
    gets weight 0, not the retry's reward nor the team's (the review found it trained at 1.0)."""
    team = team_of("vf-tiny-env", args={"n": 1}, model="tiny",
                   env_args={"agent": {"retries": {"max_retries": 1}}})
    [ctx] = await play(team, {"agent": ["boom", "0"]})
    assert [text for _, text, _ in ctx.rewards] == ["boom", "0"]
    assert ctx.weights == {"boom": 0.0, "0": 1.0}
    assert dict((t, v) for _, t, v in ctx.rewards)["0"] == 1.0 and ctx.team == 1.0


def test_request_sampling_fields_are_passed_or_named_once():
    from flexmarl.envs.verifiers import _sampling
    body = {"temperature": 0.0, "top_k": 5, "top_p": 0.9, "max_tokens": 4, "stop": "\n",
            "seed": 1, "frequency_penalty": 1.5}
    assert _sampling(body) == {"temperature": 0.0, "top_k": 5, "top_p": 0.9, "max_tokens": 4,
                               "stop": ["\n"]}  # seed: FlexMARL seeds requests itself


async def test_two_roles_and_several_turns_map_to_their_agents(tiny_env):
    """verifiers' user-sim: a simulated user (kept fixed by the env) opens, the assistant
    answers, the user ends; each role's calls are its agent's turns, with its trace's reward."""
    agents = [AgentSpec(name="assistant", model="tiny"),
              AgentSpec(name="simulator", model="tiny", trainable=False)]
    team = team_of("vf-tiny-env", args={"n": 1}, env_args={"id": "user-sim"},
                   roles={"user": "simulator"}, agents=agents)
    [ctx] = await play(team, {"simulator": ["What is 0+0?", "###DONE###"],
                              "assistant": ["0"]})
    assert [agent for agent, _ in ctx.calls] == ["simulator", "assistant", "simulator"]
    assert ctx.calls[1][1][-1] == {"role": "user", "content": "What is 0+0?"}
    assert ctx.calls[2][1][-1] == {"role": "user", "content": "0"}  # the user sees the answer
    assert ctx.rewards == [("assistant", "0", 1.0), ("simulator", "What is 0+0?", 0.0),
                           ("simulator", "###DONE###", 0.0)]
    assert ctx.team == 1.0  # the trained role's reward: the env keeps the user fixed
    assert ctx.scores[("assistant", "user_turns")] == 2.0  # the env's own metric


async def test_a_failed_rollout_fails_the_trajectory(tiny_env):
    team = team_of("vf-tiny-env", args={"n": 1}, model="tiny")
    with pytest.raises(RuntimeError, match="failed: .*prompt too long"):
        await play(team, {"agent": [ValueError("prompt too long")]})


# ------------------------------------------------------------------------ refusals

def test_tools_are_refused_naming_what_they_need(tiny_env, monkeypatch):
    from vf_tiny_env import TinyTask
    monkeypatch.setattr(TinyTask, "toolsets", classmethod(lambda cls, config: ["search"]))
    with pytest.raises(ValueError, match=r"offers tools.*chat template that takes tools"):
        team_of("vf-tiny-env", model="tiny")


@pytest.mark.parametrize("kwargs, match", [
    ({"roles": {"judge": "agent"}}, r"\['judge'\], not roles"),
    ({"roles": {"agent": "solver"}, "agents": [AgentSpec(name="other", model="tiny")]},
     r"agents \['solver'\], which are not"),
    ({"agents": [AgentSpec(name="agent", model="tiny"), AgentSpec(name="idle", model="tiny")]},
     r"\['idle'\] play no role"),
    ({"env_args": {"agent": {"harness": {"id": "codex"}}}}, r"harness 'codex'.*in-process"),
    ({"train": -1}, "train must be an int >= 0"),
])
def test_a_team_that_cannot_run_is_a_value_error(tiny_env, kwargs, match):
    with pytest.raises(ValueError, match=match):
        team_of("vf-tiny-env", **{"model": "tiny", **kwargs})


def test_an_environment_that_is_not_installed_is_named():
    with pytest.raises(ValueError, match=r"no verifiers environment 'vf-absent-env'"):
        team_of("vf-absent-env")


def test_without_verifiers_missing_extra_names_the_envs_extra(monkeypatch):
    from flexmarl.envs import verifiers as module
    monkeypatch.setitem(sys.modules, "verifiers.v1", None)  # import fails as if uninstalled
    module._vf.cache_clear()
    try:
        with pytest.raises(MissingExtra, match=r"verifiers.*envs"):
            team_of("vf-tiny-env")
    finally:
        module._vf.cache_clear()


# ------------------------------------------------------------------------ training runs

def _config(tmp_path: Path, *extra: str):
    from flexmarl.config.load import load_config
    return load_config(overrides=[
        f"run.dir={tmp_path / 'run'}", "run.steps=2", "rollout.backend=torch",
        "pipeline.tasks_per_step=2", "pipeline.trajectories_per_task=2", "trainer.lr=1e-3",
        "eval.greedy=false", "eval.modes=['sampled']", "eval.tasks=3", "eval.final_tasks=3",
        "observe.report=false", *extra])


async def _train(team, config):
    from flexmarl.launch.run import train
    from flexmarl.observe.rundir import RunDir
    # Two steps and two held-out measurements of a tiny model: a minute here, 300 s is slack.
    return await asyncio.wait_for(train(team, config, run_dir=RunDir.create(config),
                                        progress=False), 300)


TINY_SUMS = '''import dataclasses
from flexmarl import AgentSpec, SamplingParams
from flexmarl.team import load_team

team = dataclasses.replace(load_team({sums!r}), config=None, agents=[
    AgentSpec(name="solver", model={model!r}, sampling=SamplingParams(max_tokens=6))])
'''


@pytest.mark.slow
async def test_the_code_env_trains_and_flexmarl_eval_agrees(tiny_model_dir, tmp_path, capsys,
                                                            no_leftover_children):
    """agents/verifiers_sums.py on the tiny model: two steps, the held-out scores of its
    rubric's parts before and after, and `flexmarl eval RUN_DIR` on the final weights giving
    the run's own numbers (seeded samples: the same draws from the same weights)."""
    path = tmp_path / "tiny_sums.py"
    path.write_text(TINY_SUMS.format(sums=str(SUMS), model=tiny_model_dir))
    team = load_team(path)
    result = await _train(team, _config(tmp_path, f"team.path={path}"))
    assert [r["step"] for r in result.metrics] == [0, 1]
    assert all(r["failed_trajectories"] == 0 for r in result.metrics)
    final = result.final_eval["after"]["sampled"]
    assert final["tasks"] == 3 and final["failed"] == 0
    scores = result.heldout["solver"]["sampled"]["scores"]
    assert {"correct", "brief", "chars"} <= set(scores)
    assert all(0.0 <= scores[k]["after"] <= 1.0 for k in ("correct", "brief"))

    from tests.helpers.workers import flexmarl_cli as cli

    assert await cli("eval", str(result.run_dir), "--json") == 0
    again = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert again["weights"] == "final" and again["team_reward"] == final["team_reward"]
    assert again["agents"] == final["agents"]


@pytest.mark.slow
async def test_an_installed_package_trains_by_name(tiny_model_dir, tmp_path, installed_env,
                                                   no_leftover_children):
    team = team_of("vf-tiny-env", args={"n": 8}, heldout_args={"split": "heldout"}, heldout=3,
                   agents=[AgentSpec(name="agent", model=tiny_model_dir,
                                     sampling=SamplingParams(max_tokens=4))])
    import vf_tiny_env  # verifiers' loader imported it by the package's name: the pip copy
    assert Path(vf_tiny_env.__file__).is_relative_to(installed_env)
    result = await _train(team, _config(tmp_path))
    assert [r["step"] for r in result.metrics] == [0, 1]
    assert all(r["failed_trajectories"] == 0 for r in result.metrics)
    assert set(result.heldout["agent"]["sampled"]["scores"]) == {"correct", "brief", "chars"}
