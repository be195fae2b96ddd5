"""reasoning-gym datasets as FlexMARL tasks, scored by each dataset's own `score_answer`.

    gym_tasks("leg_counting", train=2000, heldout=100, config={...})
        train:    one dataset at `seed`, items 0..train-1      ─► GymTask "leg_counting-7"
        held out: one dataset at `heldout_seed`, items drawn until `heldout` questions are
                  found that are neither in the train set nor repeated ─► "leg_counting-heldout-3"
    score(task, completion text) = dataset.score_answer(answer_of(text), task.entry) in [0, 1]
    solve_verify_team(...)       a solver answers; a verifier says whether that answer is right

Two facts of reasoning-gym shape this module. Item `i` of a dataset at seed `s` is drawn from
`Random(s + i)`, so item i of seed s is item i+k of seed s-k: train and held-out seed ranges must
not overlap, and gym_tasks refuses ones that do. And an easy config has few distinct questions
(1-digit sums: about 240), so disjoint seeds still repeat train questions: held-out items are
also filtered by question text.

The scorers compare strings without stripping (" 30" scores 0.667 against "30", a substring
match gets partial credit), so `answer_of` extracts and cleans the answer before scoring: the
last number of a reply when the task's answer is a number, else its last line without labels,
quotes or a final period.

reasoning-gym is imported only when a function needs it (flexmarl.envs.require): without the
`envs` extra, MissingExtra says how to install it.
"""
from __future__ import annotations

import dataclasses
import difflib
import json
import logging
import math
import re
from dataclasses import dataclass, field
from functools import cache
from typing import Any, Callable

from flexmarl.envs import require
from flexmarl.protocol import SamplingParams
from flexmarl.team import AgentSpec, Team

log = logging.getLogger(__name__)

INSTRUCTION = "Reply with only the answer."
"""The answer format asked for by default: a bare answer, because a small model rarely writes
<answer> tags (answer_of reads both)."""
HELDOUT_DRAWS = 20
"""Held-out items drawn per held-out task wanted, at most, before gym_tasks gives up: repeats of
train questions and of each other are skipped."""
SOLVER_SAMPLING = SamplingParams(temperature=0.7, max_tokens=16)
"""Room for a short sentence around the answer, which is how SmolLM2-135M answers."""
VERIFIER_SAMPLING = SamplingParams(temperature=0.7, max_tokens=4)
"""A verdict is one word; a few tokens leave room for "Yes." and stop a ramble early."""

_LABEL = re.compile(r"^(?:the\s+)?(?:final\s+)?answer\b(?:\s+is\b)?\s*[:=]?\s*", re.IGNORECASE)
_WRAP = "\"'`*"
# ASCII digits only (\d would match other scripts' digits); no thousands separators.
_NUMBER = re.compile(r"-?[0-9]+(?:\.[0-9]+)?")
_VERDICT = re.compile(r"\W*(yes|no)\b", re.IGNORECASE)
_scorer_failed: set[str] = set()


@dataclass(frozen=True)
class GymTask:
    """One reasoning-gym item: its question as a chat prompt, and the entry its scorer reads."""

    task_id: str
    """"{dataset}-{index}" for train tasks, "{dataset}-heldout-{index}" for held-out ones."""
    dataset: str
    """The reasoning-gym dataset name, e.g. "leg_counting"."""
    question: str
    answer: str
    """The dataset's oracle answer."""
    entry: dict = field(hash=False, repr=False)
    """The full entry {question, answer, metadata}, after a JSON round trip (tuples are lists):
    what `score_answer` reads."""
    config: dict = field(hash=False, repr=False)
    """The dataset's difficulty config (no seed or size): some scorers depend on it, so the
    scoring dataset is built with it."""
    prompt: list = field(hash=False, repr=False)
    """[system?, user: question + the answer-format instruction], for ctx.generate."""

    @property
    def numeric(self) -> bool:
        """Whether the oracle answer is a number: then the last number of a reply is its
        answer (answer_of). The form of the answer, never its value, picks the rule."""
        return _NUMBER.fullmatch(self.answer) is not None


def gym_tasks(name: str, *, train: int, heldout: int, config: dict | None = None,
              seed: int = 0, heldout_seed: int = 1_000_000, system: str | None = None,
              instruction: str = INSTRUCTION) -> tuple[list[GymTask], list[GymTask]]:
    """(train tasks, held-out tasks) of reasoning-gym dataset `name` at difficulty `config`.

    Train tasks are items 0..train-1 of the dataset at `seed` (repeats kept: they are draws).
    Held-out tasks are the first `heldout` items of the dataset at `heldout_seed` whose question
    is in neither the train set nor an earlier held-out task, drawn from at most
    heldout * HELDOUT_DRAWS items. ValueError for an unknown name, an invalid config, seed
    ranges that overlap, or too few distinct held-out questions.
    """
    for arg, value, low in (("train", train, 1), ("heldout", heldout, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"gym_tasks: {arg} must be an int >= {low}, got {value!r}")
    config = dict(config or {})
    draws = heldout * HELDOUT_DRAWS
    if heldout and seed < heldout_seed + draws and heldout_seed < seed + train:
        raise ValueError(
            f"gym_tasks({name!r}): train seeds [{seed}, {seed + train}) overlap held-out seeds "
            f"[{heldout_seed}, {heldout_seed + draws}) (up to {HELDOUT_DRAWS} draws per held-out "
            "task); reasoning-gym draws item i of seed s from Random(s + i), so overlapping "
            f"ranges share items: set heldout_seed >= {seed + train} or <= {seed - draws}")
    prompt = _prompter(system, instruction)
    train_ds = _create(name, config, seed=seed, size=train)
    train_tasks = [_task(f"{name}-{i}", name, config, _json_safe(name, train_ds[i]), prompt)
                   for i in range(train)]
    if not heldout:
        return train_tasks, []
    seen = {t.question for t in train_tasks}
    held_ds = _create(name, config, seed=heldout_seed, size=draws)
    held_tasks: list[GymTask] = []
    for i in range(draws):
        entry = held_ds[i]
        if entry["question"] in seen:
            continue
        seen.add(entry["question"])
        held_tasks.append(_task(f"{name}-heldout-{len(held_tasks)}", name, config,
                                _json_safe(name, entry), prompt))
        if len(held_tasks) == heldout:
            return train_tasks, held_tasks
    raise ValueError(
        f"gym_tasks({name!r}): found only {len(held_tasks)} held-out questions that are not in "
        f"the {train} train tasks (or repeated) in {draws} draws, wanted {heldout}: config "
        f"{config} has too few distinct questions; use a harder config, or fewer held-out (or "
        "train) tasks")


def answer_of(text: str, *, number: bool = False) -> str | None:
    """The answer a completion gives, cleaned for the dataset's scorer; None if it gives none.

    The rule: the last <answer>...</answer> if there is one (reasoning_gym.utils.extract_answer),
    else the whole text. With `number` (the dataset's answers are numbers), the last number in
    it: a small model answers in a sentence ("The letter "r" appears 2 times."), as SmolLM2 does
    even when asked for only the answer. Otherwise its last non-empty line, without an "Answer:"
    or "The answer is" label, a dangling "<answer>" (a reply cut off by max_tokens), quotes,
    backticks or ** around it, and a trailing period. The scorers compare without stripping and
    give a substring partial credit ("The answer is 30." scores 0.125 against "30"), so cleaning
    decides most of a score; a wordy answer keeps only that small credit.
    """
    tagged = require("reasoning_gym.utils", "reasoning-gym").extract_answer(text)
    span = text if tagged is None else tagged
    if number:
        numbers = _NUMBER.findall(span)
        return numbers[-1] if numbers else None
    lines = [line.strip() for line in span.splitlines() if line.strip()]
    if not lines:
        return None
    answer = lines[-1].rsplit("<answer>", 1)[-1].strip()
    answer = _LABEL.sub("", answer).strip(_WRAP + " ")
    if answer.endswith("."):
        answer = answer[:-1].rstrip()
    return answer.strip(_WRAP + " ") or None


def score(task: GymTask, text: str) -> float:
    """The dataset's own score of the completion `text` on `task`, in [0, 1].

    A scorer that raises scores 0.0 (logged once per dataset): one odd completion must not end
    a run."""
    dataset = _scorer(task.dataset, json.dumps(task.config, sort_keys=True))
    try:
        answer = answer_of(text, number=task.numeric)
        value = float(dataset.score_answer(answer=answer, entry=task.entry))
    except Exception:
        if task.dataset not in _scorer_failed:
            _scorer_failed.add(task.dataset)
            log.warning("reasoning-gym %s: score_answer raised; scoring 0.0 (logged once)",
                        task.dataset, exc_info=True)
        return 0.0
    return min(1.0, max(0.0, value)) if math.isfinite(value) else 0.0


# -------------------------------------------------------------------------- solve and verify

def verifier_prompt(task: GymTask, claimed: str | None) -> list[dict]:
    """The question and the solver's answer; a yes/no question about it."""
    system = [m for m in task.prompt if m["role"] == "system"]
    return system + [{"role": "user", "content": (
        f"{task.question.strip()}\nProposed answer: {claimed if claimed is not None else '(none)'}"
        "\nIs the proposed answer right? Reply with only yes or no.")}]


def verdict(text: str) -> str | None:
    """"yes" or "no" when the reply starts with one (case and punctuation aside), else None."""
    match = _VERDICT.match(text)
    return match.group(1).lower() if match else None


async def solve_verify_workflow(ctx: Any, task: GymTask) -> None:
    """solver answers (reward: its score); verifier judges it (reward: 1 if its verdict is right).

    "Right" means the solver's answer scores 1.0: a partly-right answer (partial credit) is
    wrong to the verifier. A reply that is neither yes nor no is a wrong verdict. The team
    reward is the solver's score, and held-out evaluation runs this same workflow, so each
    agent's held-out turn reward is its accuracy."""
    [solved] = await ctx.generate("solver", task.prompt)
    value = score(task, solved.text)
    ctx.reward(solved, value)
    claimed = answer_of(solved.text, number=task.numeric)
    [judged] = await ctx.generate("verifier", verifier_prompt(task, claimed))
    right = "yes" if value >= 1.0 else "no"
    ctx.reward(judged, 1.0 if verdict(judged.text) == right else 0.0)
    ctx.team_reward(value)


def solve_verify_team(name: str, tasks: list[GymTask], heldout: list[GymTask], *,
                      model: str = "smollm2-135m", train_layers: int | None = None,
                      lr: float | None = None, sampling: SamplingParams = SOLVER_SAMPLING,
                      verifier_sampling: SamplingParams = VERIFIER_SAMPLING) -> Team:
    """A Team `name` of two trainable copies of `model`, "solver" and "verifier", running
    solve_verify_workflow on `tasks` (held out: `heldout`)."""
    agents = [AgentSpec(name="solver", model=model, train_layers=train_layers, lr=lr,
                        sampling=sampling),
              AgentSpec(name="verifier", model=model, train_layers=train_layers, lr=lr,
                        sampling=verifier_sampling)]
    return Team(name=name, agents=agents, workflow=solve_verify_workflow, tasks=tasks,
                heldout=heldout)


# -------------------------------------------------------------------------------- internals

def _prompter(system: str | None, instruction: str) -> Callable[[str], list[dict]]:
    head = [{"role": "system", "content": system}] if system else []
    tail = f"\n{instruction}" if instruction else ""
    return lambda question: head + [{"role": "user", "content": question.strip() + tail}]


def _task(task_id: str, name: str, config: dict, entry: dict,
          prompt: Callable[[str], list[dict]]) -> GymTask:
    return GymTask(task_id=task_id, dataset=name, question=entry["question"],
                   answer=str(entry["answer"]), entry=entry, config=config,
                   prompt=prompt(entry["question"]))


def _create(name: str, config: dict, *, seed: int, size: int) -> Any:
    """reasoning_gym.create_dataset, its errors as ValueErrors that name the fix."""
    rg = require("reasoning_gym", "reasoning-gym")
    registry = require("reasoning_gym.factory", "reasoning-gym").DATASETS
    if name not in registry:
        close = difflib.get_close_matches(str(name), list(registry), n=5, cutoff=0.5)
        hint = f"close names: {', '.join(close)}" if close else f"{len(registry)} are registered"
        raise ValueError(f"unknown reasoning-gym dataset {name!r} ({hint}; all: "
                         "reasoning_gym.factory.DATASETS)")
    if {"seed", "size"} & config.keys():
        raise ValueError(f"reasoning-gym dataset {name!r}: config must not set seed or size; "
                         "gym_tasks sets them from its seed, heldout_seed, train and heldout")
    try:
        return rg.create_dataset(name, seed=seed, size=max(size, 1), **config)
    except (TypeError, AssertionError, ValueError) as exc:
        fields = [f.name for f in dataclasses.fields(registry[name][1])
                  if f.name not in ("seed", "size")]
        raise ValueError(f"reasoning-gym dataset {name!r}: invalid config {config}: "
                         f"{exc or type(exc).__name__} (its fields: {', '.join(fields)})"
                         ) from exc


@cache
def _scorer(name: str, config_json: str) -> Any:
    """One dataset per (name, config), kept for scoring only (its items are never drawn)."""
    return _create(name, json.loads(config_json), seed=0, size=1)


def _json_safe(name: str, entry: dict) -> dict:
    try:
        return json.loads(json.dumps(entry))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"reasoning-gym dataset {name!r}: an entry is not JSON-serialisable "
                         f"({exc}); GymTask keeps entries as plain JSON data") from exc


__all__ = ["GymTask", "INSTRUCTION", "answer_of", "gym_tasks", "score", "solve_verify_team",
           "solve_verify_workflow", "verdict", "verifier_prompt"]
