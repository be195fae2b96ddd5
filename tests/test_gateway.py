"""The OpenAI-compatible gateway against a live run: an app on the official `openai` client.

- An in-test app (AsyncOpenAI) drives every trajectory of a 2-step run: calls reach the named
  agent, each call is stored as that agent's turn with exactly the token ids and log-probs the
  engine produced (checked against the logprobs the response carries), rewards attach per agent
  and per team, an episode left open expires and is dropped as a failed trajectory (made idle
  past gateway.episode_timeout_s on purpose: a loaded machine's pauses expire nothing else),
  late or unknown episode operations get OpenAI-style 404/409 errors, and both agents train.
- The app of gateway.app gets the run's token as OPENAI_API_KEY; its exiting early fails the
  run, naming it. Its command runs from any directory: `python` is the run's own, a relative
  path is found in the package root as --team is.
- The example app (agents/openai_duo_app.py) trains from the one documented command, with the
  token generated for the run (RUN_DIR/gateway_token, mode 0600).
- Requests the client must fix (token ids out of the vocabulary, a prompt or max_tokens past
  the context) are 400 invalid_request_error naming the field, on both engines, and the run
  goes on.
"""
from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest
from openai import AsyncOpenAI

from flexmarl.config.load import load_config
from flexmarl.gateway.api import TOKEN_FILE
from flexmarl.gateway.app import app_command
from flexmarl.gateway.backend import Gateway
from flexmarl.models import load_tokenizer
from flexmarl.observe.rundir import RunDir, read_metrics
from flexmarl.launch.run import train
from flexmarl.orchestrator.orchestrator import WorkflowError
from flexmarl.orchestrator.store import ExperienceStore

from tests.helpers.teams import duo

ROOT = Path(__file__).resolve().parent.parent
EPISODE_TIMEOUT_S = 60.0
"""gateway.episode_timeout_s of the live run: far past any pause of a loaded machine between an
episode's calls; the episode meant to expire is made idle that long (`idle_past_expiry`)."""


def idle_past_expiry(gateway: Gateway, episode: str) -> None:
    """As if `episode` had been idle for twice gateway.episode_timeout_s: the gateway's own
    expiry loop expires it at its next tick (about a second)."""
    gateway.episodes[episode].last_active -= 2 * gateway.episode_timeout_s


def _config(tmp_path: Path, *extra: str):
    return load_config(overrides=[
        f"run.dir={tmp_path / 'run'}", "run.steps=2", "rollout.backend=torch",
        "pipeline.mode=micro_batch", "pipeline.tasks_per_step=2",
        "pipeline.trajectories_per_task=2", "pipeline.micro_batch_groups=1", "trainer.lr=1e-3",
        "observe.dashboard=false", "observe.tensorboard=false", "observe.report=false",
        "gateway.enabled=true", *extra])


@pytest.mark.slow
@pytest.mark.timeout(600)  # its own deadlines: 120 s to the gateway, 300 s for the run
async def test_an_openai_app_trains_through_the_gateway(tiny_model_dir, tmp_path, monkeypatch):
    stored, rewards, gateways = {}, {}, []
    put, set_reward, init = ExperienceStore.put, ExperienceStore.set_reward, Gateway.__init__

    async def recording_put(self, row, **kwargs):
        stored[row.sample_id + "@" + row.agent] = row
        return await put(self, row, **kwargs)

    def recording_set_reward(self, agent, sample_id, value, **kwargs):
        rewards[sample_id + "@" + agent] = value
        return set_reward(self, agent, sample_id, value, **kwargs)

    def recording_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        gateways.append(self)

    monkeypatch.setattr(ExperienceStore, "put", recording_put)
    monkeypatch.setattr(ExperienceStore, "set_reward", recording_set_reward)
    monkeypatch.setattr(Gateway, "__init__", recording_init)
    url: asyncio.Future = asyncio.get_running_loop().create_future()
    team = duo(tiny_model_dir)
    config = _config(tmp_path, f"gateway.episode_timeout_s={EPISODE_TIMEOUT_S}")
    run_dir = RunDir.create(config)
    run = asyncio.create_task(train(team, config, run_dir=run_dir, progress=False,
                                    on_gateway=url.set_result))
    base = await asyncio.wait_for(url, 120)
    token = (run_dir.path / TOKEN_FILE).read_text()  # generated for the run: it is there now
    client = AsyncOpenAI(base_url=base + "v1", api_key=token)
    seen: list[tuple] = []  # (agent, episode, messages, choice)
    errors: dict[str, int] = {}

    async def episode(http, eid: str, reward: float, *, end: bool = True) -> None:
        messages = [{"role": "user", "content": "Compute 12+34."}]
        for agent in ("checker", "solver"):
            r = await client.chat.completions.create(
                model=agent, messages=messages, max_tokens=6, logprobs=True,
                extra_headers={"X-Episode-Id": eid})
            assert r.model == agent
            seen.append((agent, eid, messages, r.choices[0]))
        async with http.post(f"{base}v1/episodes/{eid}/reward", json={
                "team": reward, "agents": {"checker": 1.0 - reward}}) as resp:
            assert resp.status == 200, await resp.text()
        if end:
            async with http.post(f"{base}v1/episodes/{eid}/end") as resp:
                assert resp.status == 200, await resp.text()

    async def app() -> None:
        async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {token}"}) as http:
            # step 0: one episode is never ended and expires; steps go on
            await asyncio.gather(episode(http, "a/0", 1.0), episode(http, "a/1", 0.0),
                                 episode(http, "b/0", 1.0), episode(http, "b/1", 0.0, end=False))
            [gateway] = gateways
            idle_past_expiry(gateway, "b/1")
            async with http.post(f"{base}v1/episodes/nope/reward", json={"team": 1}) as resp:
                errors["unknown"] = resp.status
                assert (await resp.json())["error"]["code"] == "episode_not_found"
            async with http.post(f"{base}v1/episodes/a/0/reward", json={"team": 1}) as resp:
                errors["ended"] = resp.status
            k = 0
            while not run.done():  # later steps: whatever the run still needs
                await asyncio.gather(*(episode(http, f"c{k}/{j}", float(j)) for j in range(2)))
                k += 1

    driver = asyncio.create_task(app())
    result = await asyncio.wait_for(run, 300)
    driver.cancel()
    await asyncio.gather(driver, return_exceptions=True)

    assert [m["step"] for m in result.metrics] == [0, 1]
    assert errors == {"unknown": 404, "ended": 409}
    assert result.metrics[0]["failed_trajectories"] == 1  # b/1 expired
    assert "EpisodeExpired" in result.metrics[0]["errors"][0]
    for m in result.metrics:
        for agent in ("solver", "checker"):
            assert m["agents"][agent]["trained_samples"] > 0
    tok = {a.name: load_tokenizer(a.model) for a in team.agents}
    checked = 0
    for agent, eid, messages, choice in seen:
        # The response names its stored turn: "AGENT-KEY" (KEY: the agent table's sample id).
        key = choice.flexmarl["sample_id"].removeprefix(agent + "-") + "@" + agent
        row = stored[key]
        assert [t.logprob for t in choice.logprobs.content] == pytest.approx(row.logprobs,
                                                                            abs=1e-6)
        assert tok[agent].decode(row.response_ids, skip_special_tokens=True) == \
            choice.message.content
        text = tok[agent].apply_chat_template(messages, tokenize=False,
                                              add_generation_prompt=True)
        assert row.prompt_ids == tok[agent].encode(text, add_special_tokens=False)
        assert row.policy_version == choice.flexmarl["version"]
        if eid in ("a/0", "a/1") and key in rewards:
            expected = (1.0 if eid == "a/0" else 0.0) if agent == "solver" else \
                (0.0 if eid == "a/0" else 1.0)
            assert rewards[key] == expected, (eid, agent)
            checked += 1
    assert checked == 4  # per-agent reward for the checker, the team's for the solver


@pytest.mark.slow
@pytest.mark.timeout(600)  # its own deadline: 300 s
async def test_the_run_fails_when_its_app_exits(tiny_model_dir, tmp_path):
    # Exits 3 only if it got the run's token as OPENAI_API_KEY.
    config = _config(tmp_path, f'gateway.app=test "$OPENAI_API_KEY" = '
                               f'"$(cat {tmp_path / "run" / TOKEN_FILE})" && exit 3; exit 4')
    # A WorkflowError: `flexmarl run` says it in one line (exit 1), not with a traceback.
    with pytest.raises(WorkflowError, match="gateway app .* exited with code 3"):
        await asyncio.wait_for(train(duo(tiny_model_dir), config,
                                     run_dir=RunDir.create(config), progress=False), 300)


def test_the_app_command_runs_from_any_directory_with_the_runs_python(tmp_path):
    """gateway.app="python agents/openai_duo_app.py" (docs/gateway.md) from outside the
    checkout: `python` is the run's own Python (it has httpx and openai), and the app's path is
    found in the package root when the current directory has no such file, as --team is."""
    app = ROOT / "agents" / "openai_duo_app.py"
    assert app_command("python agents/openai_duo_app.py", cwd=tmp_path) == \
        f"{sys.executable} {app}"
    assert app_command("python3 agents/openai_duo_app.py --heldout", cwd=tmp_path) == \
        f"{sys.executable} {app} --heldout"
    (tmp_path / "agents").mkdir()
    (tmp_path / "agents" / "openai_duo_app.py").write_text("")  # the current directory first
    assert app_command("python agents/openai_duo_app.py", cwd=tmp_path) == \
        f"{sys.executable} agents/openai_duo_app.py"
    for kept in ("node app.js", "my_app --out runs/x", "pythonic agents/openai_duo_app.py x",
                 "python 'unclosed"):
        assert app_command(kept, cwd=tmp_path) == kept


@pytest.mark.slow
@pytest.mark.timeout(900)  # its own deadline: 600 s for the command
def test_the_example_app_trains_from_the_documented_command(tiny_model_dir, tmp_path):
    run_dir = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "flexmarl.launch.cli", "run", "--team", "agents/openai_duo.py",
         "--set", "gateway.enabled=true",
         "--set", f"gateway.app={sys.executable} agents/openai_duo_app.py",
         "--set", f"run.dir={run_dir}", "--set", "run.steps=2",
         "--set", "rollout.backend=torch", "--set", "pipeline.tasks_per_step=2",
         "--set", "pipeline.trajectories_per_task=2", "--set", "observe.dashboard=false",
         "--set", "observe.report=false", "--set", "observe.tensorboard=false"],
        cwd=ROOT, env={**os.environ, "FLEXMARL_EXAMPLE_MODEL": tiny_model_dir},
        capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "flexmarl: gateway at http://127.0.0.1:" in proc.stdout
    assert f"the token in {run_dir / TOKEN_FILE}" in proc.stdout
    assert stat.S_IMODE((run_dir / TOKEN_FILE).stat().st_mode) == 0o600
    records = read_metrics(run_dir / "metrics.jsonl")
    assert [m["step"] for m in records] == [0, 1]
    assert all(m["agents"][a]["samples"] > 0 for m in records for a in ("solver", "checker"))
    assert "app: " in proc.stdout + proc.stderr  # the app ran and printed its progress

    # Issue 65: `flexmarl eval RUN_DIR` of a gateway team plays the app's held-out episodes
    # (gateway.eval_app, the app with --heldout) on the final weights and scores each agent.
    env = {**os.environ, "FLEXMARL_EXAMPLE_MODEL": tiny_model_dir}
    evaluated = subprocess.run(
        [sys.executable, "-m", "flexmarl.launch.cli", "eval", str(run_dir), "--json",
         "--set", f"gateway.eval_app={sys.executable} agents/openai_duo_app.py --heldout",
         "--set", "eval.tasks=4"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert evaluated.returncode == 0, evaluated.stdout + evaluated.stderr
    result = json.loads(evaluated.stdout.strip().splitlines()[-1])
    assert (result["tasks"], result["failed"]) == (4, 0), result
    assert {a: result["agents"][a]["turns"] for a in ("solver", "checker")} == {
        "solver": 4, "checker": 4}  # one call each per held-out episode, rewarded by the app
    assert (run_dir / "eval-final.json").is_file()
    # Without an eval app: one error naming the key, no loop of advice.
    missing = subprocess.run(
        [sys.executable, "-m", "flexmarl.launch.cli", "eval", str(run_dir),
         "--set", "gateway.eval_app="], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=600)
    assert missing.returncode == 2 and "set gateway.eval_app" in missing.stderr, missing.stderr


@pytest.mark.slow
@pytest.mark.timeout(1200)  # its deadlines: 600 s to the gateway (an engine starts), 300 s more
@pytest.mark.parametrize("backend", ["torch", pytest.param("vllm", marks=pytest.mark.vllm)])
async def test_requests_the_client_must_fix_are_400s_naming_the_field(backend, tiny_model_dir,
                                                                     tmp_path,
                                                                     no_leftover_children):
    """Checked where a call enters, before an engine: vLLM answered an out-of-vocabulary id with
    a 500 (which the openai client retried twice), the torch engine a prompt past the context
    with a 500, vLLM cut it short with a 200. Each bad call is made in an episode that then
    goes on with a good one: the run completes its step."""
    config = _config(tmp_path, f"rollout.backend={backend}", "rollout.kv_cache_bytes=33554432",
                     "run.steps=1", "rollout.max_model_len=512")
    vocab = len(load_tokenizer(tiny_model_dir))
    bad = [  # (episode, path, body, param, message)
        ("e0/0", "completions", {"model": "solver", "prompt": [5, vocab + 3], "max_tokens": 4},
         "prompt", f"prompt token ids must be in [0, {vocab})"),
        ("e0/1", "completions", {"model": "solver", "prompt": [5, 6], "max_tokens": 600},
         "max_tokens", "set max_tokens to at most 510"),
        ("e1/0", "chat/completions", {"model": "solver", "max_tokens": 4, "messages": [
            {"role": "user", "content": "word " * 200}]}, "messages", "shorten the prompt")]
    url: asyncio.Future = asyncio.get_running_loop().create_future()
    # One agent (one engine to start): what is checked happens before any engine.
    team = dataclasses.replace(duo(tiny_model_dir), agents=duo(tiny_model_dir).agents[:1])
    run_dir = RunDir.create(config)
    run = asyncio.create_task(train(team, config, run_dir=run_dir,
                                    progress=False, on_gateway=url.set_result))
    base = await asyncio.wait_for(url, 600)
    token = (run_dir.path / TOKEN_FILE).read_text()
    answers = []

    async def app() -> None:
        async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {token}"}) as http:
            async def post(eid: str, path: str, body: dict) -> tuple[int, dict]:
                async with http.post(f"{base}v1/{path}", json=body,
                                     headers={"X-Episode-Id": eid}) as r:
                    return r.status, await r.json()

            for eid, path, body, _, _ in bad:
                answers.append(await post(eid, path, body))
            k = 0
            while True:  # the same episodes go on with good calls, then more until the run ends
                for eid in (["e0/0", "e0/1", "e1/0", "e1/1"] if k == 0 else
                            [f"f{k}/0", f"f{k}/1"]):
                    await post(eid, "chat/completions", {
                        "model": "solver", "max_tokens": 4,
                        "messages": [{"role": "user", "content": "Compute 1+2."}]})
                    await post(eid, f"episodes/{eid}/reward", {"team": float(k % 2)})
                    await post(eid, f"episodes/{eid}/end", {})
                k += 1

    driver = asyncio.create_task(app())
    try:
        result = await asyncio.wait_for(run, 300)
    finally:
        driver.cancel()
        await asyncio.gather(driver, return_exceptions=True)
    assert len(answers) == len(bad)
    for (status, out), (eid, _, _, param, message) in zip(answers, bad):
        assert status == 400, (eid, out)
        assert out["error"]["type"] == "invalid_request_error" and out["error"]["param"] == param
        assert message in out["error"]["message"], out
    assert [m["step"] for m in result.metrics] == [0]
