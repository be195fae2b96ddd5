"""A tiny verifiers environment package for tests/test_verifiers.py: one-digit sums.

Loaded by name as an installed environment is (`verifiers_team("vf-tiny-env", ...)`): the tests
put its project folder (tests/data/vf-tiny-env) on the path, or pip-install it into a scratch
folder, and verifiers' loader imports the module its taskset id names and takes the Taskset
subclass it exports through `__all__`.

    split "train":   a + b for a in 0..4, b in 0..4 (25 sums), the first `n`
    split "heldout": a + b for a in 5..9, b in 0..4, the first `n`
    rubric: correct (weight 0.75: the reply's last number is the sum; it raises on a reply with
            "boom", as a broken rubric would) + brief (weight 0.25: the
            reply has no letters); metric chars (the reply's length)

Prompts and answers are printable ASCII, which the test suite's tiny character model covers.
"""
from __future__ import annotations

import re
from typing import Literal

import verifiers.v1 as vf

SYSTEM = "Add."
_NUMBER = re.compile(r"-?[0-9]+")


class TinyConfig(vf.TasksetConfig):
    split: Literal["train", "heldout"] = "train"
    n: int = 8


class TinyData(vf.TaskData):
    answer: str


class TinyTask(vf.Task[TinyData, vf.State, vf.TaskConfig]):
    @vf.reward(weight=0.75)
    async def correct(self, task, trace) -> float:
        if "boom" in trace.last_reply:  # a rubric that breaks: verifiers retries the rollout
            raise RuntimeError("the rubric cannot score a boom")
        numbers = _NUMBER.findall(trace.last_reply)
        return 1.0 if numbers and numbers[-1] == task.answer else 0.0

    @vf.reward(weight=0.25)
    async def brief(self, trace) -> float:
        return 0.0 if re.search(r"[A-Za-z]", trace.last_reply) else 1.0

    @vf.metric
    async def chars(self, trace) -> float:
        return float(len(trace.last_reply))


class TinyTaskset(vf.Taskset[TinyTask, TinyConfig]):
    def load(self):
        low = 0 if self.config.split == "train" else 5
        sums = [(a, b) for a in range(low, low + 5) for b in range(5)]
        for a, b in sums[:self.config.n]:
            yield TinyTask(TinyData(prompt=f"{a}+{b}=", system_prompt=SYSTEM,
                                    answer=str(a + b)), self.config.task)


__all__ = ["TinyTaskset"]
