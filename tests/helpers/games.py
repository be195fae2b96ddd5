"""A game workflow's ctx for the game tests (tests/test_textarena.py, tests/test_openspiel.py):
its agents answer from a Python policy instead of a model, and it records what a workflow
asked and gave."""
from __future__ import annotations

import types


class GameCtx:
    """A workflow's ctx whose agents answer from `policy(agent, prompt messages) -> text`;
    `prompts` (agent, messages), `labels` (agent, turn), `rewards`, `scores` and `team` record
    the calls and what the workflow gave."""

    def __init__(self, policy, input_id: str = "t0", trajectory: int = 0) -> None:
        self.policy, self.input_id, self.trajectory = policy, input_id, trajectory
        self.prompts: list[tuple[str, list]] = []
        self.labels: list[tuple[str, str]] = []
        self.rewards: list[tuple[str, str, float, float]] = []
        self.scores: list[tuple[str, str, float]] = []
        self.team: float | None = None

    @property
    def calls(self) -> list[tuple[str, str, str]]:
        """(agent, turn label, the prompt's last message) of each call, in order."""
        return [(agent, turn, prompt[-1]["content"])
                for (agent, prompt), (_, turn) in zip(self.prompts, self.labels)]

    async def generate(self, agent, prompt, *, turn=None, **_):
        self.prompts.append((agent, prompt))
        self.labels.append((agent, turn))
        return [types.SimpleNamespace(agent=agent, text=self.policy(agent, prompt))]

    def reward(self, completion, value, *, weight=1.0):
        self.rewards.append((completion.agent, completion.text, value, weight))

    def team_reward(self, value):
        self.team = value

    def score(self, agent, name, value):
        self.scores.append((agent, name, value))
