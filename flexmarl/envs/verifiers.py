"""verifiers environments as FlexMARL teams: the env's own protocol and rubric, its model calls
the agents' turns (verifiers 0.4, `verifiers.v1`; the `envs` extra).

    verifiers_team(env object | installed package name + args, roles=..., heldout_args=...)
      tasks:    the env's taskset (its first `train` tasks)              ─► "{name}-{idx}"
      held out: the taskset loaded with `heldout_args` (its eval split, e.g. {"split": "test"}),
                else the `heldout` tasks after the train ones; a task also trained on is dropped
    workflow(ctx, task), one trajectory = one episode of the env, run unchanged in this process:
      env.run_episode(task)  the env's own run(): one agent, best-of-n, a simulated user, ...
        └ each role's rollout: verifiers' Rollout (trace, limits, @stop, scoring) in a
          subprocess runtime, its chat loop here (ChatHarness: the `null` harness's protocol)
          ─► verifiers' interception server (records the turn in the role's trace)
          ─► this module's endpoint: POST /v1/chat/completions (loopback, a token header; the
             trace id, X-Session-ID, names the rollout) ─► ctx.generate(the role's agent, messages)
      after it: each turn ─► ctx.reward(turn, its trace's reward: the rubric's Σ weight·score);
                each reward part and metric ─► ctx.score(agent, name, score);
                ctx.team_reward(mean reward of the traces of roles the env trains)

Roles to agents: every role of the env (an AgentConfig field of its config: `agent` in a
single-agent env, `assistant` and `user` in verifiers' user-sim, an env's own names) is played by
the FlexMARL agent of the same name, or by `roles[role]`; several roles may name one agent
(self-play). A role's calls are its agent's turns. A role the env keeps fixed (its setup() sets
`agents.user.trainable = False`) should map to a frozen AgentSpec (trainable=False): a trainable
agent playing it is trained on its trace's reward (warned once).

Harnesses: every role runs ChatHarness, verifiers' `null` harness protocol in this process (the
system prompt, then the prompt or the conversation so far; one reply per segment). A role whose
harness is `null` or the default `bash` runs so (bash's bash/edit/search tools are not offered:
they would run the model's commands on this machine); any other harness (a third-party agent
program) is refused, and every role's model and endpoint pins give way to its FlexMARL agent.

Tools are refused (ValueError, TOOLS_REFUSED): FlexMARL's chat path renders messages without
`tools` and parses no tool calls, and none of its model families has a chat template that
carries tools.
"""
from __future__ import annotations

import asyncio
import contextlib
import functools
import hmac
import logging
import secrets
import statistics
import time
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Mapping, Sequence

import aiohttp
from aiohttp import web

from flexmarl.envs import require
from flexmarl.protocol import SamplingParams
from flexmarl.team import AgentSpec, Completion, Team

log = logging.getLogger(__name__)

MODEL = "smollm2-135m"
"""verifiers_team's model for the agents it makes (agents= gives others)."""
SAMPLING = SamplingParams(temperature=0.7, max_tokens=32)
"""Their sampling; a request's own fields (an env role's `sampling`) override it per call."""
CHAT_HARNESSES = ("null", "bash")
"""The harnesses whose protocol ChatHarness runs (bash without its tools)."""
TOKEN_HEADER = "X-FlexMARL-Token"
"""The endpoint's token rides in a header of the client config (not an API key: verifiers reads
those from the environment, which this process's children inherit)."""
CONNECT_TIMEOUT_S = 30.0
"""ChatHarness's connect timeout to the interception server (on loopback: a dead server)."""
SESSION_HEADER = "X-Session-ID"
"""verifiers' per-rollout header (the trace id, the same on every turn)."""
TOOLS_REFUSED = (
    "FlexMARL does not carry tool calls yet: its chat path (flexmarl.orchestrator.prompts) "
    "renders messages without `tools` and parses no tool calls from a completion, and none of "
    "its model families (the built-in models, SmolLM2-135M-Instruct, Gemma 3 270M) has a chat "
    "template that takes tools. A tool-using env needs a model whose chat template carries "
    "`tools` (e.g. Qwen2.5-Instruct's, Hermes-style <tool_call> tags) and a parser of those calls "
    "into OpenAI `tool_calls` in that chat path; use an env without toolsets meanwhile")


@dataclass(frozen=True, eq=False)
class VerifiersTask:
    """One task of a verifiers taskset, as a FlexMARL task."""

    task_id: str
    """"{team}-{idx}", held out "{team}-heldout-{idx}" (idx: its place in the taskset)."""
    task: Any = field(repr=False)
    """The verifiers Task (its TaskData is `task.data`)."""


def load_environment(name: str, *, args: Mapping[str, Any] | None = None,
                     env_args: Mapping[str, Any] | None = None) -> Any:
    """The verifiers Env of the installed environment package `name` (its taskset id: "my-env",
    a hub id "owner/my-env@1.0", ...) with taskset arguments `args` and env settings `env_args`
    (e.g. {"id": "user-sim"} to pair it with a bundled env, or a role's settings)."""
    vf = _vf().vf
    try:
        config = vf.resolve_env_config({**(env_args or {}),
                                        "taskset": {**(args or {}), "id": name}})
    except ModuleNotFoundError as exc:
        raise ValueError(f"no verifiers environment {name!r} here ({exc}): install its package "
                         "(its module exports its Taskset in __all__)") from exc
    except ValueError as exc:  # pydantic's ValidationError: a bad argument, named by field
        raise ValueError(f"verifiers environment {name!r}: {exc}") from exc
    return vf.load_environment(config)


def verifiers_team(env: Any, *, name: str | None = None, args: Mapping[str, Any] | None = None,
                   env_args: Mapping[str, Any] | None = None,
                   roles: Mapping[str, str] | None = None,
                   agents: Sequence[AgentSpec] | None = None, model: str = MODEL,
                   sampling: SamplingParams = SAMPLING, train: int | None = None,
                   heldout: int = 0, heldout_args: Mapping[str, Any] | None = None) -> Team:
    """A Team of verifiers environment `env` (an Env, or an installed package's name with
    `args`, `env_args`: load_environment); the module docstring says what runs.

    roles: role -> agent name (default: each role's own name). agents: the team's AgentSpecs
    (default: one per agent the roles name, on `model` with `sampling`). train: how many of the
    taskset's tasks (default: all; an infinite taskset needs it). heldout_args: taskset
    arguments of the held-out tasks (its eval split), of which the first `heldout` (0: all);
    without them the `heldout` tasks after the train ones. ValueError names what to fix."""
    vfx = _vf()
    if isinstance(env, str):
        env = load_environment(env, args=args, env_args=env_args)
    elif args or env_args:
        raise ValueError("verifiers_team: args and env_args load an environment by name; an Env "
                         "object comes configured")
    if not isinstance(env, vfx.vf.Env):
        raise TypeError(f"verifiers_team: env must be a verifiers.v1 Env or an installed "
                        f"environment's name, got {type(env).__name__}")
    role_names = list(vfx.agent_config_fields(env.config))
    roles = dict(roles or {})
    if unknown := sorted(set(roles) - set(role_names)):
        raise ValueError(f"verifiers_team: roles names {unknown}, not roles of "
                         f"{type(env).__name__} (its roles: {role_names})")
    roles = {role: roles.get(role, role) for role in role_names}
    if agents is None:
        agents = [AgentSpec(name=a, model=model, sampling=sampling)
                  for a in dict.fromkeys(roles.values())]
    names = {a.name for a in agents}
    if missing := sorted(set(roles.values()) - names):
        raise ValueError(f"verifiers_team: roles are played by agents {missing}, which are not "
                         f"among the team's agents {sorted(names)}")
    if idle := sorted(names - set(roles.values())):
        raise ValueError(f"verifiers_team: agents {idle} play no role of {type(env).__name__} "
                         f"(its roles: {role_names}); map one to them with roles=")
    _refuse_tools(env)
    workflow = VerifiersWorkflow(env, roles, {a.name: a.trainable for a in agents})
    name = name or env.config.env_id or type(env).__name__
    tasks, held = _split(env.taskset, name, train, heldout, heldout_args)
    return Team(name=name, agents=list(agents), workflow=workflow.run, tasks=tasks, heldout=held)


class VerifiersWorkflow:
    """A verifiers team's workflow (`run`): one episode of the env per trajectory."""

    def __init__(self, env: Any, roles: dict[str, str], trainable: dict[str, bool]) -> None:
        self.roles = roles
        self.trainable = trainable
        self.env = self._in_process(env)
        self._services: dict[asyncio.AbstractEventLoop, _Service] = {}
        """event loop -> its _Service (one endpoint and one env.serving() per loop: a run's,
        `flexmarl eval`'s); a closed loop's is dropped at the next start."""
        self._warned: set[str] = set()

    async def run(self, ctx: Any, task: VerifiersTask) -> None:
        service = await self.service()
        role_of: dict[str, str] = {}
        made: dict[str, list[Completion]] = {}

        def minted(trace: Any) -> None:  # a role's rollout begins: before its first call
            role_of[trace.id] = role = trace.agent.name
            service.rollouts[trace.id] = (ctx, self.roles[role], made.setdefault(trace.id, []))

        try:
            episode = await self.env.run_episode(task.task, service.model_ctx, on_trace=minted)
        finally:
            for trace_id in role_of:
                service.rollouts.pop(trace_id, None)
        if not episode.ok:
            errors = [*episode.errors, *(t.last_error for t in episode.traces if t.last_error)]
            raise RuntimeError(f"verifiers episode of task {task.task_id} failed: " + (
                f"{errors[0].type}: {errors[0].message}" if errors else "a rollout failed"))
        # A role's attempt verifiers discarded and retried (a per-agent retry) is not in the
        # episode: its turns are not trained on, neither with the retry's reward nor with the
        # team's (weight 0; they stay in their group, which they no longer move).
        kept = {trace.id for trace in episode.traces}
        for trace_id, completions in made.items():
            if trace_id not in kept:
                for completion in completions:
                    ctx.reward(completion, 0.0, weight=0.0)
        trained: list[float] = []
        rewards: list[float] = []
        for trace in episode.traces:
            agent = self.roles[role_of[trace.id]]
            for completion in made.get(trace.id, []):
                ctx.reward(completion, trace.reward)
            parts = {k: r.score for k, r in trace.rewards.items() if r is not None}
            metrics = {(f"metric.{k}" if k in parts else k): v
                       for k, v in trace.metrics.items() if v is not None}
            for key, value in {**parts, **metrics}.items():
                ctx.score(agent, key, value)
            rewards.append(trace.reward)
            if trace.agent.trainable:
                trained.append(trace.reward)
            elif self.trainable[agent] and agent not in self._warned:
                self._warned.add(agent)
                log.warning("verifiers env %s keeps role %s fixed, but its agent %s trains: map "
                            "the role to a frozen AgentSpec (trainable=False) to keep it so",
                            type(self.env).__name__, role_of[trace.id], agent)
        ctx.team_reward(statistics.fmean(trained or rewards))

    async def service(self) -> _Service:
        """This event loop's endpoint and serving resources, started on first use."""
        loop = asyncio.get_running_loop()
        for old in [other for other in self._services if other.is_closed()]:
            del self._services[old]
        service = self._services.get(loop)
        if service is None:
            service = self._services[loop] = _Service(self.env)
        await service.ready()
        return service

    async def aclose(self) -> None:
        """Stop this loop's endpoint and serving resources (at a loop's end asyncio.run does,
        cancelling the tasks left)."""
        service = self._services.pop(asyncio.get_running_loop(), None)
        if service is not None:
            await service.close()

    def _in_process(self, env: Any) -> Any:
        """`env` again, each role with ChatHarness in a subprocess runtime, its model its agent's
        name (traces say who played), its endpoint ours; other harnesses are refused."""
        vfx = _vf()
        harnesses = env.config.agent_harnesses()
        updates = {}
        for role, spec in vfx.agent_config_fields(env.config).items():
            if harnesses[role].id not in CHAT_HARNESSES:
                raise ValueError(
                    f"verifiers env {type(env).__name__}: role {role} runs harness "
                    f"{harnesses[role].id!r}, a program FlexMARL cannot run in-process; its "
                    f"roles run verifiers' null-harness chat loop: pin the role's harness to "
                    f"one of {CHAT_HARNESSES} (env_args={{{role!r}: {{'harness': {{'id': "
                    "'null'}}}})")
            updates[role] = spec.model_copy(update={
                "runtime": vfx.SubprocessConfig(), "model": self.roles[role], "client": None,
                "harness": vfx.vf.harness_config_type("null")(id="null")})
        cls, workflow = type(env), self

        async def setup(self: Any, agents: Any) -> None:
            http = workflow._services[asyncio.get_running_loop()].http
            for role in updates:
                agent = getattr(agents, role)
                agent.harness = vfx.ChatHarness(agent.harness.config, http)
            await cls.setup(self, agents)

        wrapped = type(f"InProcess{cls.__name__}", (cls,),
                       {"setup": setup, "__module__": __name__, "__doc__": cls.__doc__})
        return wrapped(env.config.model_copy(update=updates))


class _Service:
    """One event loop's endpoint and the env's serving resources, held open by `_hold_loop`,
    a task this owns: close() cancels it, and so does the loop's end (asyncio.run cancels the
    tasks left), each resource closing in turn."""

    def __init__(self, env: Any) -> None:
        self.env = env
        self.token = secrets.token_urlsafe(32)
        self.rollouts: dict[str, tuple[Any, str, list[Completion]]] = {}
        """trace id -> (its trajectory's ctx, the agent of its role, the turns it made)."""
        self.http: aiohttp.ClientSession | None = None
        self.model_ctx: Any = None
        self._up: asyncio.Future | None = None
        self._task: asyncio.Task | None = None

    async def ready(self) -> None:
        if self._task is None:
            self._up = asyncio.get_running_loop().create_future()
            self._task = asyncio.create_task(self._hold_loop(), name="verifiers endpoint")
        await asyncio.shield(self._up)  # one caller giving up does not stop the others' start

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _hold_loop(self) -> None:
        vf = _vf().vf
        app = web.Application(client_max_size=64 << 20)
        app.router.add_post("/v1/chat/completions", self.chat)
        runner = web.AppRunner(app, access_log=None)
        try:
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", 0).start()
            port = runner.addresses[0][1]
            self.model_ctx = vf.ModelContext(model="flexmarl", client=vf.EvalClientConfig(
                base_url=f"http://127.0.0.1:{port}/v1", api_key_var="FLEXMARL_VERIFIERS_NO_KEY",
                headers={TOKEN_HEADER: self.token}))
            # No total timeout: a call may wait at the pipeline's step gate for minutes.
            timeout = aiohttp.ClientTimeout(total=None, connect=CONNECT_TIMEOUT_S)
            async with aiohttp.ClientSession(timeout=timeout) as self.http, self.env.serving():
                self._up.set_result(None)
                await asyncio.Event().wait()  # until cancelled
        except BaseException as exc:
            if not self._up.done():
                self._up.set_exception(exc if isinstance(exc, Exception) else
                                       RuntimeError("the verifiers endpoint was stopped"))
            raise
        finally:
            await runner.cleanup()

    async def chat(self, request: web.Request) -> web.Response:
        """POST /v1/chat/completions of one rollout: a turn of its role's agent."""
        if not hmac.compare_digest(request.headers.get(TOKEN_HEADER, "").encode(),
                                   self.token.encode()):
            return _error(401, f"missing or wrong {TOKEN_HEADER}")
        try:
            body = await request.json()
            if body.get("tools") or body.get("functions"):
                return _error(400, TOOLS_REFUSED)
            if body.get("stream"):
                return _error(400, "stream: this endpoint answers whole replies")
            rollout = self.rollouts.get(request.headers.get(SESSION_HEADER, ""))
            if rollout is None:
                return _error(404, "no running rollout has this X-Session-ID")
            ctx, agent, made = rollout
            messages = [{"role": m["role"], "content": _text(m.get("content"))}
                        for m in body["messages"]]
            out = await ctx.generate(agent, messages, **_sampling(body))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            return _error(400, f"{type(exc).__name__}: {exc}")
        if not out:
            return _error(409, "the trajectory has ended")
        made.extend(out)
        prompt = len(out[0].prompt_ids)
        completion = sum(len(c.token_ids) for c in out)
        return web.json_response({
            "id": f"chatcmpl-{out[0].sample_id}", "object": "chat.completion",
            "created": int(time.time()), "model": agent,
            "choices": [{"index": i, "message": {"role": "assistant", "content": c.text},
                         "finish_reason": "length" if c.finish_reason == "length" else "stop",
                         "logprobs": None} for i, c in enumerate(out)],
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                      "total_tokens": prompt + completion}})


# -------------------------------------------------------------------------------- internals

@functools.cache
def _vf() -> SimpleNamespace:
    """verifiers.v1, and the classes here that subclass its own (built on first use: verifiers
    is optional, imported only when needed: MissingExtra names the extra)."""
    vf = require("verifiers.v1", "verifiers")
    from verifiers.v1.configs.agent import agent_config_fields
    from verifiers.v1.dialects.chat import message_to_wire
    from verifiers.v1.runtimes import ProgramResult, SubprocessConfig

    class ChatHarness(vf.Harness[vf.HarnessConfig]):
        """verifiers' `null` harness protocol in this process: the system prompt, the prompt
        (or the conversation so far, on a resumed segment), one model reply through the
        rollout's interception endpoint. No tools; no program, so no uv or container."""

        APPENDS_SYSTEM_PROMPT = True
        SUPPORTS_RESUME = True
        EXECUTES_CODE = False
        NEEDS_CONTAINER = False

        def __init__(self, config: Any, http: Any) -> None:
            super().__init__(config)
            self.http = http

        async def launch(self, ctx: Any, trace: Any, runtime: Any, endpoint: str, secret: str,
                         mcp_urls: dict, data: Any, tool_interception_url: str | None = None
                         ) -> Any:
            system, prompt = self.resolve_prompt(data)
            messages = [{"role": "system", "content": system}] if system else []
            if isinstance(prompt, str):
                messages.append({"role": "user", "content": prompt})
            else:
                messages += [message_to_wire(m) for m in prompt or []]
            async with self.http.post(f"{endpoint.rstrip('/')}/chat/completions",
                                      json={"model": ctx.model, "messages": messages},
                                      headers={"Authorization": f"Bearer {secret}"}) as reply:
                text = await reply.text()
            ok = reply.status == 200
            return ProgramResult(exit_code=0 if ok else 1, stdout="", stderr="" if ok else text)

    return SimpleNamespace(vf=vf, agent_config_fields=agent_config_fields,
                           SubprocessConfig=SubprocessConfig, ChatHarness=ChatHarness)


def _refuse_tools(env: Any) -> None:
    taskset = env.taskset
    if type(taskset).toolsets(taskset.config) or \
            type(taskset).task_type().toolsets(taskset.config.task):
        raise ValueError(f"verifiers env {env.config.env_id or type(env).__name__} offers tools "
                         f"(its taskset's or tasks' toolsets): {TOOLS_REFUSED}")


def _split(taskset: Any, name: str, train: int | None, heldout: int,
           heldout_args: Mapping[str, Any] | None) -> tuple[list, list]:
    """(train tasks, held-out tasks) of `taskset` (verifiers_team's docstring)."""
    for arg, value in (("train", train), ("heldout", heldout)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or value < 0):
            raise ValueError(f"verifiers_team: {arg} must be an int >= 0, got {value!r}")
    if heldout_args is None:
        rows = _take(taskset, None if train is None else train + heldout, "train + heldout")
        cut = max(len(rows) - heldout, 0)
        train_rows, held_rows = rows[:cut], rows[cut:]
    else:
        config = taskset.config
        try:
            held_config = type(config).model_validate({**config.model_dump(), **heldout_args})
        except ValueError as exc:
            raise ValueError(f"verifiers_team: heldout_args {dict(heldout_args)}: {exc}") from exc
        train_rows = _take(taskset, train, "train")
        held_rows = _take(_vf().vf.load_taskset(held_config), heldout or None, "heldout")
    seen = {t.key for t in train_rows}
    held_rows = [t for t in held_rows if t.key not in seen]
    return ([VerifiersTask(f"{name}-{t.data.idx}", t) for t in train_rows],
            [VerifiersTask(f"{name}-heldout-{t.data.idx}", t) for t in held_rows])


def _take(taskset: Any, count: int | None, what: str) -> list:
    if count is None:
        if not taskset.bounded:
            raise ValueError(f"verifiers taskset {type(taskset).__name__} is infinite: give "
                             f"verifiers_team how many tasks to take ({what})")
        return list(taskset)
    return list(taskset.take(count))


def _text(content: Any) -> str:
    """A message's content as text: a str, or OpenAI's text parts joined by newlines."""
    if content is None or isinstance(content, str):
        return content or ""
    return "\n".join(p["text"] for p in content if p.get("type") == "text")


IGNORED_SAMPLING = ("seed", "frequency_penalty", "presence_penalty", "logit_bias",
                    "repetition_penalty", "min_p", "logprobs", "top_logprobs")
"""Request fields the endpoint does not honour: `seed` because a role's fixed seed would make
every trajectory of a GRPO group the same (FlexMARL seeds requests itself), the rest because
the engines do not take them. Each is logged once, not refused: the env's own sampling
settings would otherwise stop the run."""
_IGNORED: set[str] = set()


def _sampling(body: dict) -> dict:
    """ctx.generate's n and sampling overrides from a request's OpenAI fields (top_k is
    vLLM's extension, which verifiers' sampling config carries)."""
    out = {k: body[k] for k in ("n", "temperature", "top_p", "top_k")
           if body.get(k) is not None}
    for key in IGNORED_SAMPLING:
        if body.get(key) not in (None, False) and key not in _IGNORED:
            _IGNORED.add(key)
            log.warning("verifiers endpoint: a request sets %s, which FlexMARL ignores (%s)",
                        key, "it seeds every request itself" if key == "seed"
                        else "its engines do not take it")
    max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
    if max_tokens is not None:
        out["max_tokens"] = max_tokens
    if stop := body.get("stop"):
        out["stop"] = [stop] if isinstance(stop, str) else list(stop)
    return out


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": {"message": message, "type": "invalid_request_error",
                                        "code": status}}, status=status)


__all__ = ["CHAT_HARNESSES", "TOOLS_REFUSED", "VerifiersTask", "VerifiersWorkflow",
           "load_environment", "verifiers_team"]
