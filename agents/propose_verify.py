"""Proposer + verifier on a data file: tasks from agents/data/arithmetic.jsonl, rewards from
flexmarl.rewards.

The proposer answers each question; the verifier is shown the question and the proposed answer
and says whether it is right: 1 (or yes) or 0 (or no). Digits, because the built-in models are
character-level models warm-started on sums, which write digits and almost never "yes"; a real
model can answer either way. The proposer is asked again, up to MAX_ATTEMPTS times, while the
verifier rejects it:

    proposer  1.0 if its number is the answer (numeric_match)
    verifier  1.0 if its verdict is right about the proposal it saw (a leading 1/0 or yes/no;
              anything else is wrong)
    team      1.0 if the last proposal is right

So the verifier learns to judge, not to agree, and the proposer gets second chances only from a
verifier that rejects. The tasks are the data file's rows (its `prompt`, `answer` and the other
columns in task.fields); 50 of them, chosen by a seeded shuffle, are held out for evaluation:

    flexmarl run --team agents/propose_verify.py   # held-out evaluation every 5 steps (`config`)

The same file drives any team through the config instead, e.g. `--set team.tasks=my.jsonl
--set team.heldout=0.1` with the default team.
"""
from __future__ import annotations

import re
from pathlib import Path

from flexmarl import AgentSpec, SamplingParams, Team
from flexmarl.rewards import extract_answer, numeric_match
from flexmarl.tasks import load_tasks

MAX_ATTEMPTS = 2
DATA = Path(__file__).resolve().parent / "data" / "arithmetic.jsonl"
SPLIT = load_tasks(DATA, heldout=50, seed=0)
_VERDICT = re.compile(r"\s*(yes|no|1|0)(?![0-9])", re.IGNORECASE)


def verifier_prompt(question: str, proposed: str | None) -> str:
    return (f"{question} Proposed answer: {proposed or 'none'}. Reply 1 if it is right, 0 if "
            "it is wrong.")


def verdict(text: str) -> str | None:
    """"yes" or "no" when the text starts with one (or with 1 or 0), else None."""
    match = _VERDICT.match(text)
    if match is None:
        return None
    return "yes" if match.group(1).lower() in ("yes", "1") else "no"


async def workflow(ctx, task) -> None:
    for _ in range(MAX_ATTEMPTS):
        [proposal] = await ctx.generate("proposer", task.prompt)
        right = numeric_match(proposal.text, task)
        ctx.reward(proposal, right)
        proposed = extract_answer(proposal.text, "last_number")
        [judged] = await ctx.generate("verifier", verifier_prompt(task.prompt, proposed))
        said = verdict(judged.text)
        ctx.reward(judged, 1.0 if said == ("yes" if right else "no") else 0.0)
        if said == "yes":
            break  # accepted
    ctx.team_reward(right)


config = {"run": {"name": "propose_verify"}, "eval": {"every_steps": 5}}
"""The recommended run (flexmarl.team.load_team reads a team file's `config`)."""

team = Team(
    name="propose_verify",
    agents=[
        # math_duo.py's built-in models (cached once built: no second warm start).
        AgentSpec(name="proposer", model="small", warm_start_steps=250, lr=1e-5,
                  sampling=SamplingParams(temperature=1.0, max_tokens=8)),
        AgentSpec(name="verifier", model="medium", warm_start_steps=300, lr=1e-5,
                  sampling=SamplingParams(temperature=1.0, max_tokens=4)),
    ],
    workflow=workflow,
    tasks=SPLIT.train,
    heldout=SPLIT.heldout,
)
