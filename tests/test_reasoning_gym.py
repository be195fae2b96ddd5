"""flexmarl.envs.reasoning_gym on real reasoning-gym datasets (small sizes): the train/held-out
split, scoring through each dataset's own scorer, answer extraction, the solve-and-verify
workflow's rewards on scripted replies, agents/gym_duo.py, and the missing-extra error."""
from __future__ import annotations

import importlib.util
import json
import logging
import sys
import types
from pathlib import Path

import pytest

from flexmarl.envs import EXTRA_HINT, MissingExtra
from flexmarl.envs import reasoning_gym as gym
from flexmarl.team import load_team

pytestmark = pytest.mark.skipif(importlib.util.find_spec("reasoning_gym") is None,
                                reason=f"reasoning-gym is not installed: {EXTRA_HINT}")

AGENTS = Path(__file__).resolve().parents[1] / "agents"
LETTERS = {"min_words": 1, "max_words": 3}
EASY = {  # dataset -> a small config (answers: numbers, except spell_backward's words)
    "letter_counting": LETTERS,
    "leg_counting": {"min_animals": 1, "max_animals": 2, "min_instances": 1, "max_instances": 3},
    "chain_sum": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2},
    "basic_arithmetic": {"min_terms": 2, "max_terms": 2, "min_digits": 2, "max_digits": 2,
                         "operators": ("+", "-"), "allow_parentheses": False,
                         "allow_negation": False},
    "spell_backward": {"min_word_len": 3, "max_word_len": 5},
}


def tasks(name: str = "letter_counting", train: int = 40, heldout: int = 10, **kw):
    return gym.gym_tasks(name, train=train, heldout=heldout, config=EASY[name], **kw)


# ------------------------------------------------------------------------------- the split

def test_train_and_heldout_share_no_question_and_no_seed():
    train, held = gym.gym_tasks("chain_sum", train=300, heldout=40, config=EASY["chain_sum"],
                                seed=0, heldout_seed=10_000)
    assert len(train) == 300 and len(held) == 40
    train_questions = {t.question for t in train}
    held_questions = [t.question for t in held]
    assert not train_questions & set(held_questions)
    assert len(set(held_questions)) == len(held_questions)
    # The filter is what keeps them apart: at this config the held-out seeds alone repeat
    # train questions.
    import reasoning_gym
    raw = reasoning_gym.create_dataset("chain_sum", seed=10_000, size=100, **EASY["chain_sum"])
    assert any(raw[i]["question"] in train_questions for i in range(100))
    assert [t.task_id for t in train[:2]] == ["chain_sum-0", "chain_sum-1"]
    assert [t.task_id for t in held[:2]] == ["chain_sum-heldout-0", "chain_sum-heldout-1"]


def test_the_same_arguments_give_the_same_tasks():
    assert tasks() == tasks()
    assert tasks(seed=5)[0] != tasks()[0]


def test_overlapping_seed_ranges_are_refused():
    with pytest.raises(ValueError, match="overlap"):
        tasks(train=100, heldout=10, seed=0, heldout_seed=50)
    with pytest.raises(ValueError, match="overlap"):  # held-out draws reach into train seeds
        tasks(train=10, heldout=10, seed=1000, heldout_seed=900)


def test_too_few_distinct_heldout_questions_is_an_error_naming_the_fix():
    one_digit = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1,
                 "operators": ("+",), "allow_parentheses": False, "allow_negation": False}
    with pytest.raises(ValueError, match=r"found only \d+ held-out.*harder config"):
        gym.gym_tasks("basic_arithmetic", train=500, heldout=50, config=one_digit)


def test_an_unknown_dataset_is_a_value_error_naming_it_and_close_names():
    with pytest.raises(ValueError, match=r"'leg_countin'.*leg_counting"):
        gym.gym_tasks("leg_countin", train=2, heldout=0)


@pytest.mark.parametrize("config, match", [
    ({"min_animals": 0}, "min_animals must be positive"),
    ({"bogus": 1}, "bogus"),
    ({"seed": 3}, "seed or size"),
])
def test_an_invalid_config_is_a_value_error_naming_the_dataset(config, match):
    with pytest.raises(ValueError, match=rf"'leg_counting'.*{match}"):
        gym.gym_tasks("leg_counting", train=2, heldout=0, config=config)


def test_tasks_are_json_safe_and_prompt_with_the_answer_format():
    [task], _ = gym.gym_tasks("basic_arithmetic", train=1, heldout=0,
                              config=EASY["basic_arithmetic"], system="Be brief.")
    assert json.loads(json.dumps(task.entry)) == task.entry
    assert task.prompt[0] == {"role": "system", "content": "Be brief."}
    assert task.prompt[1]["role"] == "user"
    assert task.prompt[1]["content"].startswith(task.question.strip())
    assert task.prompt[1]["content"].endswith(gym.INSTRUCTION)


# --------------------------------------------------------------------------------- scoring

@pytest.mark.parametrize("name", sorted(EASY))
def test_the_oracle_scores_one_and_a_wrong_answer_zero(name):
    train, held = tasks(name, train=5, heldout=5)
    for task in train + held:
        assert gym.score(task, task.answer) == 1.0
        assert gym.score(task, f"<answer>{task.answer}</answer>") == 1.0
        assert gym.score(task, f"  {task.answer}.\n") == 1.0
        # Not the oracle, nor containing it (the base scorer's substring credit).
        wrong = str(int(task.answer) + 1) if task.numeric else "qqqqq"
        assert gym.score(task, wrong) == 0.0
        assert gym.score(task, "") == 0.0


def test_a_numeric_answer_is_the_last_number_of_a_sentence():
    task = next(t for t in tasks(train=40)[0] if t.answer == "1")
    assert gym.score(task, 'The letter "w" appears 1 time in the text: "what"') == 1.0
    assert gym.score(task, "It appears 2 times.") == 0.0
    # The dataset's own substring partial credit stays ("10" contains "1").
    assert gym.score(task, "10") == 0.5


@pytest.mark.parametrize("text, number, answer", [
    ("<answer> 42 </answer>", False, "42"),
    ("first <answer>1</answer> then <answer>2</answer>", False, "2"),
    ("42", False, "42"),
    ("  42.  \n\n", False, "42"),
    ("Some thinking.\nThe answer is: 42.", False, "42"),
    ("Answer: **nus**", False, "nus"),
    ('"olleh"', False, "olleh"),
    ("<answer>olle", False, "olle"),        # cut off by max_tokens
    ("", False, None),
    ("   \n ", False, None),
    ("There are 2 dogs, so 8 legs.", True, "8"),
    ("The result is -3.", True, "-3"),
    ("2.5 apples", True, "2.5"),
    ("<answer>12</answer> and 99 more", True, "12"),
    ("no digits here", True, None),
])
def test_answer_of(text, number, answer):
    assert gym.answer_of(text, number=number) == answer


def test_a_scorer_that_raises_scores_zero_and_is_logged_once(monkeypatch, caplog):
    [task], _ = tasks(train=1, heldout=0)
    dataset = gym._scorer(task.dataset, json.dumps(task.config, sort_keys=True))

    def broken(answer, entry):
        raise RuntimeError("scorer bug")

    monkeypatch.setattr(dataset, "score_answer", broken)
    monkeypatch.setattr(gym, "_scorer_failed", set())
    with caplog.at_level(logging.WARNING, logger=gym.log.name):
        assert gym.score(task, task.answer) == 0.0
        assert gym.score(task, task.answer) == 0.0
    assert len([r for r in caplog.records if "score_answer raised" in r.message]) == 1


def test_a_score_outside_zero_one_is_clamped(monkeypatch):
    [task], _ = tasks(train=1, heldout=0)
    dataset = gym._scorer(task.dataset, json.dumps(task.config, sort_keys=True))
    monkeypatch.setattr(dataset, "score_answer", lambda answer, entry: 3.0)
    assert gym.score(task, "x") == 1.0
    monkeypatch.setattr(dataset, "score_answer", lambda answer, entry: float("nan"))
    assert gym.score(task, "x") == 0.0


# ------------------------------------------------------------------------- the workflow

class ScriptedCtx:
    """A workflow's ctx whose agents answer from `script` (agent -> texts, in turn)."""

    def __init__(self, script: dict[str, list[str]]) -> None:
        self.script = {agent: list(texts) for agent, texts in script.items()}
        self.prompts: dict[str, list] = {}
        self.rewards: dict[str, float] = {}
        self.team: float | None = None

    async def generate(self, agent, prompt, **_):
        self.prompts[agent] = prompt
        return [types.SimpleNamespace(agent=agent, text=self.script[agent].pop(0))]

    def reward(self, completion, value):
        assert completion.agent not in self.rewards, "one reward per turn"
        self.rewards[completion.agent] = value

    def team_reward(self, value):
        self.team = value


async def run(task, solver: str, verifier: str) -> ScriptedCtx:
    ctx = ScriptedCtx({"solver": [solver], "verifier": [verifier]})
    await gym.solve_verify_workflow(ctx, task)
    return ctx


async def test_workflow_rewards_a_right_answer_and_a_verifier_that_accepts_it():
    task = tasks(train=1, heldout=0)[0][0]
    ctx = await run(task, f"The letter appears {task.answer} times.", "Yes, it is.")
    assert ctx.rewards == {"solver": 1.0, "verifier": 1.0}
    assert ctx.team == 1.0
    shown = ctx.prompts["verifier"][-1]["content"]
    assert task.question.strip() in shown and f"Proposed answer: {task.answer}" in shown
    ctx = await run(task, task.answer, "no")
    assert ctx.rewards == {"solver": 1.0, "verifier": 0.0}


async def test_workflow_rewards_a_verifier_that_rejects_a_wrong_answer():
    task = tasks(train=1, heldout=0)[0][0]
    wrong = str(int(task.answer) + 1)
    ctx = await run(task, wrong, "No.")
    assert ctx.rewards == {"solver": 0.0, "verifier": 1.0}
    assert ctx.team == 0.0
    ctx = await run(task, wrong, "YES")
    assert ctx.rewards == {"solver": 0.0, "verifier": 0.0}
    ctx = await run(task, wrong, "The proposed answer is")  # no verdict: wrong
    assert ctx.rewards["verifier"] == 0.0
    ctx = await run(task, "I don't know", "no")          # no answer: "no" is right
    assert ctx.rewards == {"solver": 0.0, "verifier": 1.0}
    assert "Proposed answer: (none)" in ctx.prompts["verifier"][-1]["content"]


async def test_a_partly_right_answer_is_wrong_to_the_verifier():
    task = next(t for t in tasks(train=40)[0] if t.answer == "1")
    ctx = await run(task, "10", "no")
    assert ctx.rewards == {"solver": 0.5, "verifier": 1.0}
    assert ctx.team == 0.5


def test_verdict():
    assert [gym.verdict(t) for t in ("Yes.", " no, it is not", "**No**", "yesterday",
                                     "Nope", "It is yes")] == ["yes", "no", "no", None,
                                                               None, None]


# ------------------------------------------------------------------------- the team file

def test_gym_duo_loads_with_disjoint_train_and_heldout_tasks():
    team = load_team(AGENTS / "gym_duo.py")
    assert [a.name for a in team.agents] == ["solver", "verifier"]
    assert team.workflow is gym.solve_verify_workflow
    assert len(team.tasks) >= 1000 and 100 <= len(team.heldout) <= 200
    assert not {t.task_id for t in team.tasks} & {t.task_id for t in team.heldout}
    assert not {t.question for t in team.tasks} & {t.question for t in team.heldout}
    assert all(gym.score(t, t.answer) == 1.0 for t in team.heldout[:20])


# --------------------------------------------------------------------- the missing extra

def test_without_reasoning_gym_missing_extra_names_the_envs_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)  # import fails as if uninstalled
    with pytest.raises(MissingExtra, match=r"reasoning-gym.*envs"):
        gym.gym_tasks("letter_counting", train=2, heldout=0)
