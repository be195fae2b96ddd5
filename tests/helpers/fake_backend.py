"""The OpenAI gateway's fake backend (tests/test_openai_api.py, tests/test_doors.py): agents,
episodes and completions in memory, every call recorded; and a chat request it answers."""
from __future__ import annotations

import asyncio
from typing import Any

from flexmarl.gateway.api import ApiError
from flexmarl.team import Completion

FINISH = ["stop", "length", "abort"]  # the third maps to "stop" on the wire


class FakeBackend:
    """Agents "solver" and "checker"; episodes e1, e2 (open), done (ended), boom (raises a bug),
    slow (hangs until cancelled). Records every call."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.episodes = {"e1", "e2", "boom", "slow", "grp/7"}
        self.ended = {"done"}
        self.cancelled = asyncio.Event()

    def models(self) -> list[str]:
        return ["solver", "checker"]

    def _check(self, episode: str) -> None:
        if episode in self.ended:
            raise ApiError(409, f"episode {episode!r} has ended", code="episode_ended")
        if episode not in self.episodes:
            raise ApiError(404, f"no episode {episode!r}", code="episode_not_found")

    async def generate(self, agent: str, episode: str, prompt: Any, n: int,
                       params: dict) -> list[Completion]:
        self.calls.append(("generate", (agent, episode, prompt, n, params)))
        self._check(episode)
        if episode == "boom":
            raise RuntimeError("engine fell over")
        if episode == "slow":
            try:
                await asyncio.sleep(5)
            except asyncio.CancelledError:
                self.cancelled.set()
                raise
        prompt_ids = prompt if isinstance(prompt, list) and all(
            isinstance(t, int) for t in prompt) else list(range(5))
        out = []
        for i in range(n):
            ids = [100 + i, 7, 200 + i]
            out.append(Completion(agent=agent, text="".join(self.token_texts(agent, ids)),
                                  token_ids=ids, logprobs=[-0.5 - i, -0.25, -1.0],
                                  version=3, finish_reason=FINISH[i % 3],
                                  prompt_ids=list(prompt_ids), sample_id=f"{episode}_0_{i}"))
        return out

    def token_texts(self, agent: str, token_ids: list[int]) -> list[str]:
        return ["é" if t == 7 else f"t{t} " for t in token_ids]

    async def reward(self, episode: str, body: dict) -> dict:
        self.calls.append(("reward", (episode, body)))
        self._check(episode)
        return {"episode": episode, "accepted": True}

    async def end(self, episode: str) -> dict:
        self.calls.append(("end", episode))
        self._check(episode)
        self.episodes.discard(episode)
        self.ended.add(episode)
        return {"episode": episode, "ended": True}

    async def status(self) -> dict:
        return {"open_episodes": sorted(self.episodes), "versions": {"solver": 3}}

    def generated(self) -> list[tuple]:
        return [args for kind, args in self.calls if kind == "generate"]


CHAT = {"model": "solver", "messages": [{"role": "user", "content": "hi"}], "user": "e1"}
