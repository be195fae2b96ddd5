"""Tasks from files (flexmarl.tasks.load_tasks) and a team trained on them
(flexmarl.launch.task_files): every format, field mapping, a seeded split, the errors a user
can fix, no network, the example dataset and the config keys of [team]."""
from __future__ import annotations

import copy
import csv
import dataclasses
import importlib.util
import json
import logging
import os
import pickle
import socket
from pathlib import Path

import pytest

from flexmarl.checks import ConfigError
from flexmarl.config.load import PACKAGE_ROOT, load_config
from flexmarl.config.sections import TeamRef
from flexmarl.launch.task_files import team_with_task_file
from flexmarl.tasks import FileTask, TaskFileError, load_tasks
from flexmarl.team import AgentSpec, Team, load_team

EXAMPLE = PACKAGE_ROOT / "agents" / "data" / "arithmetic.jsonl"
ROWS = [{"id": f"q{i}", "prompt": f"Compute {i}+1.", "answer": i + 1, "level": i % 3}
        for i in range(10)]


def write_jsonl(path: Path, rows: list, raw_lines: dict[int, str] | None = None) -> Path:
    lines = [json.dumps(r) for r in rows]
    for index, text in (raw_lines or {}).items():
        lines.insert(index, text)
    path.write_text("".join(line + "\n" for line in lines))
    return path


def write_csv(path: Path, rows: list[dict]) -> Path:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path


def by_id(tasks) -> dict[str, FileTask]:
    return {t.task_id: t for t in tasks}


# ------------------------------------------------------------------------------------ formats

def test_jsonl_rows_become_tasks_with_default_ids_and_other_columns_in_fields(tmp_path):
    split = load_tasks(write_jsonl(tmp_path / "sums.jsonl", ROWS))
    assert split.heldout == [] and split.source == str((tmp_path / "sums.jsonl").resolve())
    tasks = by_id(split.train)
    assert sorted(tasks) == sorted(f"sums-{i}" for i in range(10))  # stem-row index
    task = tasks["sums-3"]
    assert (task.prompt, task.answer) == ("Compute 3+1.", "4")      # str() of the int answer
    assert dict(task.fields) == {"id": "q3", "level": 0}            # id column not chosen
    assert task.level == 0                                          # columns as attributes
    with pytest.raises(TypeError):
        task.fields["level"] = 1                                    # read-only


def test_csv_cells_stay_text_and_ids_come_from_a_column(tmp_path):
    path = write_csv(tmp_path / "t.csv", [{"qid": 7, "question": "Pad 7.", "answer": "007",
                                           "note": "a, quoted"},
                                          {"qid": 8, "question": "Pad 8.", "answer": "008",
                                           "note": ""}])
    split = load_tasks(path, prompt="question", id="qid")
    tasks = by_id(split.train)
    assert tasks["7"].answer == "007"                       # not 7: the text as written
    assert tasks["7"].fields == {"note": "a, quoted"}


def test_parquet_keeps_types_and_chat_prompts(tmp_path):
    import datasets

    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}]
    datasets.Dataset.from_list([{"prompt": chat, "answer": 4, "tags": ["a", "b"]},
                                {"prompt": chat[1:], "answer": 2, "tags": []}]
                               ).to_parquet(str(tmp_path / "p.parquet"))
    tasks = by_id(load_tasks(tmp_path / "p.parquet").train)
    assert tasks["p-0"].prompt == chat and tasks["p-0"].answer == "4"
    assert tasks["p-0"].fields == {"tags": ["a", "b"]}
    assert tasks["p-1"].prompt == chat[1:] and tasks["p-1"].fields == {"tags": []}


def test_save_to_disk_dataset_directory(tmp_path):
    import datasets

    datasets.Dataset.from_list(ROWS).save_to_disk(str(tmp_path / "ds"))
    tasks = by_id(load_tasks(tmp_path / "ds", id="id").train)
    assert sorted(tasks) == sorted(r["id"] for r in ROWS)
    assert tasks["q2"].answer == "3" and tasks["q2"].fields == {"level": 2}


def test_dataset_dict_takes_train_and_its_test_split_as_heldout(tmp_path):
    import datasets

    datasets.DatasetDict(train=datasets.Dataset.from_list(ROWS),
                         test=datasets.Dataset.from_list(ROWS[:4])).save_to_disk(str(tmp_path / "dd"))
    split = load_tasks(tmp_path / "dd")
    assert len(split.train) == 10 and len(split.heldout) == 4
    assert {t.task_id for t in split.heldout} == {f"dd-test-{i}" for i in range(4)}
    split = load_tasks(tmp_path / "dd", heldout=3)       # a held-out count: the test split unused
    assert len(split.train) == 7 and len(split.heldout) == 3
    assert all(t.task_id.startswith("dd-") and "test" not in t.task_id for t in split.heldout)


def test_json_array_file_and_answerless_rows(tmp_path):
    path = tmp_path / "a.json"
    path.write_text(json.dumps([{"text": "hi"}, {"text": "yo"}]))
    split = load_tasks(path, prompt="text", answer="")
    assert sorted((t.prompt, t.answer) for t in split.train) == [("hi", ""), ("yo", "")]


def test_chat_prompts_from_jsonl_stay_lists(tmp_path):
    chat = [{"role": "user", "content": "Compute 1+1."}]
    [task] = load_tasks(write_jsonl(tmp_path / "c.jsonl", [{"prompt": chat, "answer": "2"}])).train
    assert task.prompt == chat
    Team(name="t", agents=[AgentSpec(name="a", model="tiny")], workflow=_workflow, tasks=[task])


# ------------------------------------------------------------------------------ order and split

def test_shuffle_and_split_are_seeded(tmp_path):
    path = write_jsonl(tmp_path / "s.jsonl", ROWS)
    first, again = load_tasks(path, heldout=3, seed=5), load_tasks(path, heldout=3, seed=5)
    assert first == again                                  # the same split in every process
    other = load_tasks(path, heldout=3, seed=6)
    assert [t.task_id for t in other.heldout + other.train] != \
        [t.task_id for t in first.heldout + first.train]
    assert sorted(t.task_id for t in other.train + other.heldout) == \
        sorted(t.task_id for t in first.train + first.heldout)


def test_heldout_as_a_count_or_a_fraction(tmp_path):
    path = write_jsonl(tmp_path / "s.jsonl", ROWS)
    assert [len(load_tasks(path, heldout=h).heldout) for h in (0, 4, 4.0, 0.25, 0.01)] == \
        [0, 4, 4, 2, 1]                                    # a fraction rounds, at least one
    count = load_tasks(path, heldout=4)
    assert len(count.train) == 6 and not {t.task_id for t in count.train} & \
        {t.task_id for t in count.heldout}


def test_limit_keeps_the_first_rows_of_the_file(tmp_path):
    path = write_jsonl(tmp_path / "s.jsonl", ROWS, raw_lines={5: "{not json"})
    split = load_tasks(path, limit=4, heldout=1)           # the bad line 6 is never read
    assert sorted(t.task_id for t in split.train + split.heldout) == [f"s-{i}" for i in range(4)]


# ------------------------------------------------------------------------------------- errors

def _error(path, **kwargs) -> str:
    with pytest.raises(TaskFileError) as info:
        load_tasks(path, **kwargs)
    return str(info.value)


def test_missing_file_names_the_path_and_what_is_beside_it(tmp_path):
    write_jsonl(tmp_path / "real.jsonl", ROWS)
    message = _error(tmp_path / "typo.jsonl")
    assert str(tmp_path / "typo.jsonl") in message and "real.jsonl" in message
    assert "nor does its folder" in _error(tmp_path / "no" / "x.jsonl")


def test_unsupported_extension_and_non_dataset_directory(tmp_path):
    (tmp_path / "t.txt").write_text("hi")
    message = _error(tmp_path / "t.txt")
    assert "'.txt'" in message and ".jsonl, .json, .csv, .parquet" in message
    (tmp_path / "plain").mkdir()
    assert "not a dataset saved" in _error(tmp_path / "plain")


def test_a_row_without_the_prompt_or_answer_field(tmp_path):
    path = write_jsonl(tmp_path / "m.jsonl", [{"prompt": "a", "answer": "1"},
                                              {"question": "b", "answer": "2"}])
    message = _error(path)
    assert f"{path} line 2" in message and "'prompt'" in message and "question, answer" in message
    csv_path = write_csv(tmp_path / "m.csv", [{"prompt": "a", "solution": "1"}])
    message = _error(csv_path)
    assert f"{csv_path} line 2" in message and "'answer'" in message and "prompt, solution" \
        in message
    with pytest.raises(TaskFileError) as info:
        load_tasks(path, prompt="question")
    assert info.value.param == "prompt" and "line 1" in str(info.value)


def test_an_empty_prompt_names_its_line(tmp_path):
    path = write_jsonl(tmp_path / "e.jsonl", [{"prompt": "a", "answer": "1"},
                                              {"prompt": "  ", "answer": "2"}])
    assert f"{path} line 2: the prompt field 'prompt' is empty" in _error(path)
    csv_path = tmp_path / "e.csv"
    csv_path.write_text('prompt,answer\n"two\nlines",1\n\n,2\n')   # a quoted newline, a blank
    assert f"{csv_path} line 5: the prompt field 'prompt' is empty" in _error(csv_path)


def test_duplicate_ids_name_both_rows(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"id": "x", "prompt": "a", "answer": "1"},
                                              {"id": "y", "prompt": "b", "answer": "2"},
                                              {"id": "x", "prompt": "c", "answer": "3"}])
    message = _error(path, id="id")
    assert str(path) in message and "line 1 and line 3" in message and "'x'" in message


def test_a_malformed_json_line_names_its_number(tmp_path):
    path = write_jsonl(tmp_path / "b.jsonl", ROWS[:3], raw_lines={2: '{"prompt": oops}'})
    message = _error(path)
    assert f"{path} line 3: not valid JSON" in message and "column 12" in message
    write_jsonl(tmp_path / "l.jsonl", [["a", "b"]])
    assert "line 1: a row must be a JSON object" in _error(tmp_path / "l.jsonl")


def test_empty_files(tmp_path):
    for name in ("e.jsonl", "e.csv", "e.parquet"):
        (tmp_path / name).write_text("")
        assert f"{tmp_path / name} is empty" in _error(tmp_path / name)
    (tmp_path / "blank.jsonl").write_text("\n\n")
    assert "has no rows" in _error(tmp_path / "blank.jsonl")
    (tmp_path / "header.csv").write_text("prompt,answer\n")
    assert f"{tmp_path / 'header.csv'} has no rows" in _error(tmp_path / "header.csv")


def test_heldout_of_every_row_and_bad_arguments(tmp_path):
    path = write_jsonl(tmp_path / "s.jsonl", ROWS)
    for heldout in (10, 20):
        message = _error(path, heldout=heldout)
        assert f"task file {path}: heldout={heldout}" in message and "of its 10 rows" in \
            message and "leave at least one" in message
    for kwargs, param in (({"heldout": -1}, "heldout"), ({"heldout": 1.5}, "heldout"),
                          ({"heldout": True}, "heldout"), ({"limit": -1}, "limit"),
                          ({"prompt": ""}, "prompt"), ({"answer": "prompt"}, "answer")):
        with pytest.raises(TaskFileError) as info:
            load_tasks(path, **kwargs)
        assert info.value.param == param, kwargs


# --------------------------------------------------------------------------- no side effects

def test_loading_never_touches_the_network_or_writes_beside_the_file(tmp_path, monkeypatch):
    import datasets

    write_jsonl(tmp_path / "s.jsonl", ROWS)
    write_csv(tmp_path / "s.csv", ROWS)
    datasets.Dataset.from_list(ROWS).to_parquet(str(tmp_path / "s.parquet"))
    datasets.Dataset.from_list(ROWS).save_to_disk(str(tmp_path / "ds"))
    before = sorted(p for p in tmp_path.rglob("*"))

    def refuse(self, *args):
        raise OSError("test: no network")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    for name in ("s.jsonl", "s.csv", "s.parquet", "ds"):
        assert len(load_tasks(tmp_path / name).train) == 10
    assert sorted(p for p in tmp_path.rglob("*")) == before
    assert "HF_DATASETS_OFFLINE" not in os.environ         # restored after the call


def test_file_tasks_hash_print_copy_and_pickle():
    task = FileTask(prompt=[{"role": "user", "content": "x"}], answer="1", task_id="f-0",
                    extra=(("tags", ["a"]),))
    assert hash(task) == hash(FileTask(prompt="other", answer="1", task_id="f-0"))
    assert "task_id='f-0'" in repr(task) and "tags" in repr(task)
    assert copy.deepcopy(task) == task == pickle.loads(pickle.dumps(task))
    with pytest.raises(AttributeError, match="no attribute or column 'level'; its other "
                                             "columns: tags"):
        task.level
    with pytest.raises(dataclasses.FrozenInstanceError):
        task.answer = "2"


# ------------------------------------------------------------------------ example and a team

def test_the_example_dataset_loads_and_makes_a_valid_team():
    split = load_tasks(EXAMPLE, id="id")
    assert len(split.train) == 400 and len({t.task_id for t in split.train}) == 400
    assert all(t.prompt.isascii() and t.prompt.startswith("Compute ") for t in split.train)
    assert sum(t.digits == 1 for t in split.train) == 60
    team = load_team(PACKAGE_ROOT / "agents" / "math_duo.py")
    dataclasses.replace(team, tasks=split.train)           # Team validates the tasks
    spec = importlib.util.spec_from_file_location("make_arithmetic", EXAMPLE.with_name(
        "make_arithmetic.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.text() == EXAMPLE.read_text()            # the generator reproduces the file


def test_team_with_task_file_replaces_tasks_and_heldout():
    team = load_team(PACKAGE_ROOT / "agents" / "math_duo.py")
    config = load_config(None, ["team.tasks=agents/data/arithmetic.jsonl", "team.heldout=50"])
    assert config.team.tasks, ("load_config dropped team.tasks: it must keep every [team] key "
                               "when it resolves team.path (flexmarl/config/load.py: "
                               "dataclasses.replace(config.team, path=...))")
    new = team_with_task_file(team, config.team, config.run.seed)
    assert len(new.tasks) == 350 and len(new.heldout) == 50
    assert {t.task_id for t in new.tasks + new.heldout} == {f"arithmetic-{i}" for i in range(400)}
    assert new.workflow is team.workflow
    # Seeded by run.seed: the same split.
    assert team_with_task_file(team, config.team, config.run.seed) == new
    assert team_with_task_file(team, TeamRef(), 0) is team     # team.tasks unset: unchanged


def test_team_with_task_file_keeps_the_teams_heldout_and_maps_errors_to_keys(tmp_path):
    team = load_team(PACKAGE_ROOT / "agents" / "math_duo.py")
    path = write_jsonl(tmp_path / "s.jsonl", ROWS)
    new = team_with_task_file(team, TeamRef(tasks=str(path)), 3)  # run.seed = 3
    assert len(new.tasks) == 10 and new.heldout == team.heldout   # no rows held out
    with pytest.raises(ConfigError, match=r"line 1: no field 'question'.*team\.prompt_field"):
        team_with_task_file(team, TeamRef(tasks=str(path), prompt_field="question"), 0)
    with pytest.raises(ConfigError, match=r"team\.heldout"):
        team_with_task_file(team, TeamRef(tasks=str(path), heldout=10), 0)
    with pytest.raises(ConfigError, match=r"team\.tasks 'nope\.jsonl'.*does not exist"):
        team_with_task_file(team, TeamRef(tasks="nope.jsonl"), 0)


def test_a_team_whose_own_tasks_have_other_attributes_is_warned(tmp_path, caplog):
    @dataclasses.dataclass(frozen=True)
    class Graded:
        prompt: str
        answer: str
        task_id: str
        difficulty: int
        level: int

    team = Team(name="graded", agents=[AgentSpec(name="a", model="tiny")], workflow=_workflow,
                tasks=[Graded("Compute 1+1.", "2", "g-0", 1, 0)])
    path = write_jsonl(tmp_path / "s.jsonl", ROWS)          # has a "level" column, no "difficulty"
    with caplog.at_level(logging.WARNING, logger="flexmarl.launch.task_files"):
        new = team_with_task_file(team, TeamRef(tasks=str(path)), 0)
    assert "its own tasks have difficulty, which the rows of" in caplog.text
    assert new.tasks[0].level in (0, 1, 2)                  # a column the workflow may read


def test_the_default_teams_missing_columns_are_named_once_and_right(tmp_path, caplog):
    """The CLI applies team.tasks and so does train() (build_run): the second time, on the
    file's own rows, it is a no-op, not a second warning naming FileTask's `extra`."""
    team = load_team(PACKAGE_ROOT / "agents" / "smol_duo.py")  # its workflow reads task.a, .b
    ref = TeamRef(tasks=str(write_jsonl(tmp_path / "s.jsonl", ROWS)), heldout=2)
    with caplog.at_level(logging.WARNING, logger="flexmarl.launch.task_files"):
        once = team_with_task_file(team, ref, 0)
        assert team_with_task_file(once, ref, 0) is once
    [warning] = caplog.messages
    assert "its own tasks have a, b, which the rows of" in warning and "extra" not in warning
    # The example file carries the operands: the default team trains on it as it is.
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="flexmarl.launch.task_files"):
        team_with_task_file(team, TeamRef(tasks=str(EXAMPLE), heldout=50), 0)
    assert not caplog.messages
    assert {"a", "b"} <= set(load_tasks(EXAMPLE).train[0].fields)


def test_a_file_without_held_out_rows_keeps_the_teams_own_and_says_how_many_it_trains_on(
        caplog):
    """team.heldout = 0: the team file's own held-out tasks stay; propose_verify's are rows of
    the same file, so all 50 are trained on, and the warning says so."""
    team = load_team(PACKAGE_ROOT / "agents" / "propose_verify.py")
    with caplog.at_level(logging.WARNING, logger="flexmarl.launch.task_files"):
        new = team_with_task_file(team, TeamRef(tasks=str(EXAMPLE)), 0)
    assert new.heldout == team.heldout and len(new.tasks) == 400
    [warning] = caplog.messages
    assert warning.startswith("team.heldout = 0: the held-out tasks stay team propose_verify's "
                              "own 50, not rows of arithmetic.jsonl; 50 of them are among its "
                              "400 training rows"), warning
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="flexmarl.launch.task_files"):
        team_with_task_file(team, TeamRef(tasks=str(EXAMPLE), heldout=50), 0)
    assert not caplog.messages  # the file's own held-out rows: nothing to say


@pytest.mark.parametrize("kwargs, key", [
    ({"tasks": "t.jsonl", "prompt_field": ""}, "team.prompt_field"),
    ({"tasks": "t.jsonl", "answer_field": "prompt"}, "team.answer_field"),
    ({"tasks": "t.jsonl", "id_field": "answer"}, "team.id_field"),
    ({"tasks": "t.jsonl", "heldout": -1.0}, "team.heldout"),
    ({"tasks": "t.jsonl", "heldout": 2.5}, "team.heldout"),
    ({"tasks": "t.jsonl", "limit": -1}, "team.limit"),
    ({"heldout": 50.0}, "team.heldout"),                   # without team.tasks: no effect
])
def test_team_section_keys_are_checked(kwargs, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        TeamRef(**kwargs)
    TeamRef(tasks="t.jsonl", heldout=0.1, limit=5, id_field="id", answer_field="")


async def _workflow(ctx, task) -> None:
    await ctx.generate("a", task.prompt)
