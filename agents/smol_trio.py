"""Three SmolLM2-135M-Instruct agents as LoRA adapters on one shared base, on sums.

    task a + b ─► solver: "What is a + b? ..."                        ─► its claim c
               ─► checker: "A student says a + b = c. What is a + b?" ─► its answer d
               ─► judge: "One student says c, another says d. What is a + b?" ─► the team's

The sums, the rewards and the held-out split are agents/smol_duo.py's; a third agent makes the
team the case adapters are for: several roles of one model family. Each agent trains its own
adapter (rank 16 on the attention and MLP projections: 4.9M parameters against the base's
134.5M); the base is loaded once per rollout instance and never synced. `team_of(lora=False)`
is the same team as three full trainable copies (bench/lora.py compares the two).

    flexmarl run --team agents/smol_trio.py
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from flexmarl import AgentSpec, LoraSpec, Team


def _sibling(name: str):
    """A team file beside this one, by path (agents/ is not a package)."""
    spec = importlib.util.spec_from_file_location(f"flexmarl_agents_{name}",
                                                  Path(__file__).with_name(f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


_duo = _sibling("smol_duo")
HELDOUT, SAMPLING, TRAIN_TASKS, Sum = _duo.HELDOUT, _duo.SAMPLING, _duo.TRAIN_TASKS, _duo.Sum
chat, checker_prompt, last_number, right, solver_prompt = (
    _duo.chat, _duo.checker_prompt, _duo.last_number, _duo.right, _duo.solver_prompt)

AGENTS = ("solver", "checker", "judge")
LORA = LoraSpec(rank=16, alpha=32, target_modules=("q_proj", "k_proj", "v_proj", "o_proj",
                                                   "gate_proj", "up_proj", "down_proj"))
LORA_LR = 5e-4
"""Adapters take a larger step than full weights (smol_duo's 1e-4 on 6 blocks): B starts at 0."""
FULL_LR = 1e-4


def judge_prompt(task: Sum, claim: str | None, check: str | None) -> list[dict]:
    return chat(f"One student says {task.a} + {task.b} = {claim or '?'}, another says "
                f"{check or '?'}. What is {task.a} + {task.b}? Reply with only the number.")


async def workflow(ctx, task: Sum) -> None:
    [answer] = await ctx.generate("solver", solver_prompt(task))
    ctx.reward(answer, right(answer.text, task))
    claim = last_number(answer.text)
    [check] = await ctx.generate("checker", checker_prompt(task, claim))
    ctx.reward(check, right(check.text, task))
    [verdict] = await ctx.generate("judge", judge_prompt(task, claim, last_number(check.text)))
    ctx.reward(verdict, right(verdict.text, task))
    ctx.team_reward(right(verdict.text, task))  # the judge's answer is the team's


def team_of(lora: bool = True) -> Team:
    """The team as adapters on one base (`lora`), or as three full trainable copies."""
    return Team(
        name="smol_trio" if lora else "smol_trio_full",
        agents=[AgentSpec(name=name, model="smollm2-135m", sampling=SAMPLING,
                          lora=LORA if lora else None, lr=LORA_LR if lora else FULL_LR)
                for name in AGENTS],
        workflow=workflow, tasks=TRAIN_TASKS, heldout=HELDOUT)


team = team_of(lora=True)
