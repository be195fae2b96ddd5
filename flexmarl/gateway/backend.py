"""The OpenAI-compatible gateway's backend: an external app's episodes are the run's trajectories.

    app ──HTTP (flexmarl.gateway.api)──► Gateway.generate(agent, episode, prompt)
         a new episode id ─► a seat: one trajectory of a group of a step the pipeline is rolling
                             out (the gateway team's workflow waits there for an episode)
         ─► ctx.generate: the same gate, balancer, rollout instances and store as a workflow's
            calls (exact token ids, log-probs and policy version of every turn)
    POST /v1/episodes/ID/reward ─► ctx.team_reward / ctx.reward (per agent, per call)
    POST /v1/episodes/ID/end, or idle for episode_timeout_s (expired: dropped as failed)
                             ─► the trajectory returns ─► GRPO groups, training, as usual

Groups: an episode id "GROUP/ANYTHING" joins a group of episodes named GROUP (trajectories of
one task: GRPO compares them); episodes of one group fill one group of the step
(pipeline.trajectories_per_task of them). An id without "/" fills any free seat. An episode that
finds no free seat (the step is full) waits, and its call with it, until the next step opens:
backpressure, never a dropped call.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
from dataclasses import dataclass, field
from typing import Any

from flexmarl.clock import now
from flexmarl.config.pipeline import PipelineConfig
from flexmarl.config.sections import GatewayConfig
from flexmarl.gateway.api import ApiError
from flexmarl.team import AgentSpec, Completion, Team

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Slot:
    """A placeholder task: one group position of a step, filled by the app's episodes."""

    task_id: str


class EpisodeExpired(RuntimeError):
    """An episode went idle past gateway.episode_timeout_s (its trajectory is dropped)."""


@dataclass
class Seat:
    ctx: Any
    group: str
    """input_id of the group (one task's trajectories) this seat belongs to."""
    claimed: asyncio.Future = field(
        default_factory=lambda: asyncio.get_running_loop().create_future())


@dataclass
class Episode:
    id: str
    label: str | None
    seat: Seat | None = None
    calls: dict[str, Completion] = field(default_factory=dict)
    done: asyncio.Event = field(default_factory=asyncio.Event)
    seated: asyncio.Event = field(default_factory=asyncio.Event)
    last_active: float = field(default_factory=now)
    state: str = "waiting"
    """waiting (no seat yet), active, ended, expired."""
    active_calls: int = 0


def gateway_team(name: str, agents: list[AgentSpec], *, heldout: int = 0) -> Team:
    """A team file's `team` for an app trained through the gateway: its agents; its tasks and
    workflow come from the app's episodes (gateway.enabled). `heldout`: how many of the app's
    held-out episodes `flexmarl eval RUN_DIR` scores (gateway.eval_app plays them;
    flexmarl.gateway.heldout), 0: none."""

    async def through_the_gateway(ctx: Any, task: Any) -> None:
        raise RuntimeError(f"team {name} is trained through the gateway: run it with "
                           "--set gateway.enabled=true")

    through_the_gateway.gateway_team = True  # type: ignore[attr-defined]  # is_gateway_team
    if not isinstance(heldout, int) or isinstance(heldout, bool) or heldout < 0:
        raise ValueError(f"gateway_team {name}: heldout must be a count of episodes >= 0, got "
                         f"{heldout!r}")
    return Team(name=name, agents=agents, workflow=through_the_gateway, tasks=[Slot("gateway")],
                heldout=[Slot(f"heldout-{i}") for i in range(heldout)])


def is_gateway_team(team: Team) -> bool:
    """Whether `team` was made by gateway_team (its episodes are an app's)."""
    return getattr(team.workflow, "gateway_team", False) is True


class Gateway:
    """The backend of flexmarl.gateway.api for one run (see the module docstring)."""

    def __init__(self, agents: dict[str, Any], config: GatewayConfig,
                 pipeline: PipelineConfig) -> None:
        """`agents`: name -> flexmarl.orchestrator.agents.AgentRuntime (its tokenizer is used);
        `config` (section `gateway`): the episode and seat timeouts; `pipeline`: the batch
        shape the app's episodes fill (tasks per step, trajectories per task)."""
        self.agents = agents
        self.trajectories_per_task = pipeline.trajectories_per_task
        self.tasks_per_step = pipeline.tasks_per_step
        self.episode_timeout_s = config.episode_timeout_s
        self.seat_timeout_s = config.seat_timeout_s
        self.episodes: dict[str, Episode] = {}
        self._seats: list[Seat] = []
        self._labels: dict[str, str | None] = {}
        """group (input_id) -> the label of the episodes filling it (None: unlabeled)."""
        self._pending: list[Episode] = []
        self.counts = {"episodes": 0, "ended": 0, "expired": 0, "calls": 0}
        self.closed = False

    def close(self) -> None:
        """The run is over: calls still waiting for a seat get 503 now (not at a timeout)."""
        self.closed = True
        for ep in self._pending:
            ep.seated.set()
        self._pending.clear()

    def team(self, team: Team) -> Team:
        """`team`'s agents; tasks are group slots, the workflow waits for the app's episodes."""
        return Team(name=team.name, agents=team.agents, workflow=self.trajectory,
                    tasks=[Slot(f"group-{i}") for i in range(self.tasks_per_step)],
                    heldout=team.heldout)

    # ------------------------------------------------------------------ seats

    async def trajectory(self, ctx: Any, slot: Slot) -> None:
        """The workflow of the gateway team: wait for an episode to take this seat, then for
        the episode to end."""
        seat = Seat(ctx, ctx.input_id)
        self._seats.append(seat)
        self._match()
        try:
            episode: Episode = await asyncio.wait_for(asyncio.shield(seat.claimed),
                                                      self.seat_timeout_s)
        except TimeoutError:
            raise TimeoutError(f"no episode came for a seat of step {ctx.step} within "
                               f"gateway.seat_timeout_s={self.seat_timeout_s:g} s (has the app "
                               "stopped?)") from None
        finally:
            if seat in self._seats:
                self._seats.remove(seat)
        await episode.done.wait()
        if episode.state == "expired":
            raise EpisodeExpired(f"episode {episode.id} was idle for more than "
                                 f"gateway.episode_timeout_s={self.episode_timeout_s:g} s "
                                 "without /end")

    def _match(self) -> None:
        """Give waiting episodes free seats: an episode's group first, else a fresh group."""
        for episode in list(self._pending):
            seat = self._seat_for(episode.label)
            if seat is None:
                continue
            self._pending.remove(episode)
            self._seats.remove(seat)
            self._labels.setdefault(seat.group, episode.label)
            episode.seat, episode.state = seat, "active"
            episode.seated.set()
            seat.claimed.set_result(episode)

    def _seat_for(self, label: str | None) -> Seat | None:
        free = [s for s in self._seats if not s.claimed.done()]
        if label is not None:
            for seat in free:
                if self._labels.get(seat.group, "") == label:
                    return seat
        taken = {g for g in self._labels}
        fresh = [s for s in free if s.group not in taken]
        if label is None:  # unlabeled: fill partly used unlabeled groups first
            for seat in free:
                if seat.group in taken and self._labels[seat.group] is None:
                    return seat
        return fresh[0] if fresh else None

    # ------------------------------------------------------------------ Backend

    def models(self) -> list[str]:
        return list(self.agents)

    def token_texts(self, agent: str, token_ids: list[int]) -> list[str]:
        tok = self.agents[agent].tokenizer
        return [tok.decode([t]) for t in token_ids]

    async def generate(self, agent: str, episode: str, prompt: str | list[dict] | list[int],
                       n: int, params: dict) -> list[Completion]:
        if self.closed:
            raise ApiError(503, "the run has ended: it takes no more episodes",
                           type="server_error", code="run_ended")
        if agent not in self.agents:
            raise ApiError(404, f"the model {agent!r} does not exist: models are the team's "
                                f"agents {sorted(self.agents)}", code="model_not_found",
                           param="model")
        ep = self.episodes.get(episode)
        if ep is None:
            group, sep, _ = episode.rpartition("/")
            ep = self.episodes[episode] = Episode(episode, group if sep and group else None)
            self.counts["episodes"] += 1
            self._pending.append(ep)
            self._match()
        if ep.state in ("ended", "expired"):
            raise ApiError(409, f"episode {episode} has {ep.state}; start a new episode id",
                           code="episode_" + ep.state)
        ep.active_calls += 1
        ep.last_active = now()
        try:
            if ep.seat is None:  # the step is full: wait for the next one (backpressure)
                await ep.seated.wait()
                if self.closed:
                    raise ApiError(503, "the run has ended: it takes no more episodes",
                                   type="server_error", code="run_ended")
                if ep.seat is None:
                    raise ApiError(409, f"episode {episode} has {ep.state}")
            try:
                out = await ep.seat.ctx.generate(agent, prompt, n=n, **params)
            except (TypeError, ValueError) as exc:  # a prompt or parameter the agent refuses
                # RequestError names its field; a chat request's prompt is its messages.
                param = getattr(exc, "param", None)
                if param == "prompt" and isinstance(prompt, list) and prompt \
                        and isinstance(prompt[0], dict):
                    param = "messages"
                raise ApiError(400, str(exc), param=param) from exc
        finally:
            ep.active_calls -= 1
            ep.last_active = now()
        self.counts["calls"] += 1
        # Store keys are per agent (two agents' first turns share one): the app sees
        # "AGENT-KEY", unique in the episode, and rewards calls by it.
        public = []
        for c in out:
            ep.calls[f"{agent}-{c.sample_id}"] = c
            public.append(dataclasses.replace(c, sample_id=f"{agent}-{c.sample_id}"))
        return public

    def _open(self, episode: str) -> Episode:
        ep = self.episodes.get(episode)
        if ep is None:
            raise ApiError(404, f"no episode {episode!r}: an episode starts with its first "
                                "call", code="episode_not_found")
        if ep.state in ("ended", "expired"):
            raise ApiError(409, f"episode {episode} has {ep.state}: rewards must come before "
                                "/end", code="episode_" + ep.state)
        return ep

    async def reward(self, episode: str, body: dict) -> dict:
        """{"team": r, "agents": {agent: r}, "calls": {call id: r}}, any of them."""
        ep = self._open(episode)
        unknown = sorted(set(body) - {"team", "agents", "calls"})
        if unknown:
            raise ApiError(400, f"unknown reward fields {unknown}: use team, agents, calls",
                           param=unknown[0])
        if ep.seat is None:
            raise ApiError(409, f"episode {episode} has made no call yet")
        ctx = ep.seat.ctx
        given = 0
        try:
            if "team" in body:
                ctx.team_reward(body["team"])
                given += 1
            for agent, value in _mapping(body, "agents").items():
                made = [c for c in ep.calls.values() if c.agent == agent]
                if agent not in self.agents:
                    raise ApiError(400, f"agents: {agent!r} is not an agent of the team",
                                   param="agents")
                for c in made:
                    ctx.reward(c, value)
                given += len(made)
            for call, value in _mapping(body, "calls").items():
                sid = call.removeprefix("chatcmpl-").removeprefix("cmpl-")
                if sid not in ep.calls:
                    raise ApiError(400, f"calls: {call!r} is not a call of episode {episode}",
                                   param="calls")
                ctx.reward(ep.calls[sid], value)
                given += 1
        except ValueError as exc:  # not a finite number
            raise ApiError(400, str(exc)) from exc
        ep.last_active = now()
        return {"episode": episode, "rewarded": given}

    async def end(self, episode: str) -> dict:
        ep = self._open(episode)
        if ep.active_calls:
            raise ApiError(409, f"episode {episode} still has {ep.active_calls} call(s) in "
                                "flight; end it once they have returned")
        ep.state = "ended"
        if ep in self._pending:
            self._pending.remove(ep)
        ep.done.set()
        self.counts["ended"] += 1
        return {"episode": episode, "state": "ended", "calls": len(ep.calls)}

    async def status(self) -> dict:
        return {"agents": self.models(), "trajectories_per_task": self.trajectories_per_task,
                "tasks_per_step": self.tasks_per_step,
                "episodes_active": sum(e.state == "active" for e in self.episodes.values()),
                "episodes_waiting": len(self._pending), "free_seats": len(self._seats),
                **self.counts}

    async def expire_loop(self) -> None:
        """Expire episodes idle past episode_timeout_s (their trajectories are dropped)."""
        while True:
            await asyncio.sleep(min(1.0, self.episode_timeout_s / 4))
            t = now()
            for ep in list(self.episodes.values()):
                if ep.state in ("active", "waiting") and not ep.active_calls and \
                        t - ep.last_active > self.episode_timeout_s:
                    log.warning("gateway: episode %s idle for %.0f s: expired", ep.id,
                                t - ep.last_active)
                    ep.state = "expired"
                    if ep in self._pending:
                        self._pending.remove(ep)
                    ep.done.set()
                    ep.seated.set()  # a call waiting for a seat gets its 409
                    self.counts["expired"] += 1
                elif ep.state in ("ended", "expired") and \
                        t - ep.last_active > 4 * self.episode_timeout_s:
                    del self.episodes[ep.id]  # long settled: forget it (a late call is new)


def _mapping(body: dict, key: str) -> dict:
    value = body.get(key, {})
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise ApiError(400, f"{key} must be an object of name -> reward", param=key)
    return value
