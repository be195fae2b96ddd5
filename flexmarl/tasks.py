"""Built-in task data and rewards: n-digit addition, deterministic by seed.

A `Task` is what the orchestrator hands a team: the user-turn text (no chat formatting; the
model layer applies the chat template), the reference answer, and an id that groups samples of
the same task. Prompts and answers use printable ASCII only, which the character tokenizer in
`flexmarl.models` covers.

Tasks from files: `load_tasks(path)` reads the rows of a JSON Lines, CSV or Parquet file or of a
`datasets` directory (save_to_disk) as `FileTask`s, shuffled by a seed and split into train and
held-out tasks the same way in every process:

    FILE ─► rows (JSONL: json per line; CSV, Parquet, directory: `datasets`, local and offline)
         ─► FileTask(prompt, answer, task_id, other columns)  ─► shuffle(seed) ─► held out | train
"""
from __future__ import annotations

import contextlib
import csv
import json
import os
import random
import re
import tempfile
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from types import MappingProxyType
from typing import Any, Callable, Iterator, Mapping

MAX_DIGITS = 9
"""Largest operand width `addition_tasks` accepts; wider sums would outgrow the short prompts
the built-in models are trained on."""

# ASCII digits only: `\d` would also match Unicode digits such as Arabic-Indic ones.
_FIRST_NUMBER = re.compile(r"-?[0-9]+")


@dataclass(frozen=True)
class Task:
    """One prompt with its reference answer."""

    prompt: str
    """User-turn text, e.g. "Compute 37+45." (no chat template applied)."""
    answer: str
    """Reference answer as the model should write it, e.g. "82"."""
    task_id: str
    """Unique within one `addition_tasks` call and across seeds, e.g. "add2-s0-17"."""


def addition_tasks(n: int, *, seed: int = 0, digits: int = 2) -> list[Task]:
    """`n` addition problems "Compute a+b." with answer "a+b", both operands `digits` wide.

    Operands are drawn independently (with replacement) from a private RNG seeded by `seed`, so
    the same arguments give the same list in any process and the global `random` state is
    untouched. For digits=1 the operands are 0-9; otherwise they have no leading zero.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"n must be an int >= 0 (the number of tasks), got {n!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"seed must be an int, got {seed!r}")
    if isinstance(digits, bool) or not isinstance(digits, int) or not 1 <= digits <= MAX_DIGITS:
        raise ValueError(f"digits must be an int in 1..{MAX_DIGITS}, got {digits!r}")
    low = 0 if digits == 1 else 10 ** (digits - 1)
    high = 10**digits - 1
    rng = random.Random(f"flexmarl.addition:{digits}:{seed}")
    tasks = []
    for i in range(n):
        a, b = rng.randint(low, high), rng.randint(low, high)
        tasks.append(Task(prompt=f"Compute {a}+{b}.", answer=str(a + b),
                          task_id=f"add{digits}-s{seed}-{i}"))
    return tasks


def exact_match(completion_text: str, task: Task) -> float:
    """1.0 if the first integer in the completion is exactly `task.answer`, else 0.0.

    Only the first number counts, so echoing the question ("37+45=82") earns nothing; "082" is
    not "82". Any string is accepted (empty, binary junk, huge); a non-string is a caller bug.
    """
    if not isinstance(completion_text, str):
        raise TypeError(f"completion_text must be the decoded completion (str), "
                        f"got {type(completion_text).__name__}; decode token ids first")
    match = _FIRST_NUMBER.search(completion_text)
    return 1.0 if match is not None and match.group() == task.answer else 0.0


# ------------------------------------------------------------------------------- task files

SUPPORTED_FORMATS = (".jsonl", ".json", ".csv", ".parquet")
"""File types `load_tasks` reads; a directory written by `datasets`' save_to_disk also works."""
_OFFLINE_ENV = ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE")


class TaskFileError(ValueError):
    """A task file (or a `load_tasks` argument) the user can fix. The message names the file,
    the row (1-based line for JSONL and CSV, row index otherwise) and the problem; `param` is
    the `load_tasks` keyword the problem is about ("prompt", "answer", "id", "heldout",
    "limit", "seed"), or None for the file's own content."""

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class FileTask:
    """One row of a task file: what `load_tasks` makes of it.

    Every other column of the row is in `fields` (read-only), and is also readable as an
    attribute, so a workflow written for its own task class (`task.difficulty`) runs on a file
    with that column. Equal rows are equal; the hash uses task_id and answer only (a chat
    prompt or a column may be a list)."""

    prompt: str | list = field(hash=False)
    """User-turn text (str() of the prompt column), or a chat: a list of {"role", "content"}
    dicts as the file has it."""
    answer: str
    """str() of the answer column; "" when load_tasks was told there is none (answer="")."""
    task_id: str
    """The id column's value as str, or "{file stem}-{row index}" (stable: the row's index in
    the file, before any shuffle or limit)."""
    extra: tuple[tuple[str, Any], ...] = field(default=(), hash=False)
    """The row's other columns as (name, value) pairs, in file order; read them via `fields`."""

    @property
    def fields(self) -> Mapping[str, Any]:
        """The row's other columns, name -> value (read-only)."""
        return MappingProxyType(dict(self.extra))

    def __getattr__(self, name: str) -> Any:
        # Only called when normal lookup fails. Dunders and `extra` itself never come from the
        # row: copy and pickle probe an instance whose __dict__ is still empty.
        if name.startswith("__") or name == "extra":
            raise AttributeError(name)
        extra = self.__dict__.get("extra", ())
        for key, value in extra:
            if key == name:
                return value
        columns = ", ".join(k for k, _ in extra) or "none"
        raise AttributeError(f"task {self.__dict__.get('task_id')!r} (a row of a task file) has "
                             f"no attribute or column {name!r}; its other columns: {columns}")


@dataclass(frozen=True)
class TaskSplit:
    """What `load_tasks` returns: tasks to train on, tasks held out, and the file they came
    from."""

    train: list[FileTask]
    heldout: list[FileTask]
    source: str
    """The file or directory read (an absolute path)."""


def load_tasks(path: str | Path, *, prompt: str = "prompt", answer: str = "answer",
               id: str = "", heldout: int | float = 0, seed: int = 0,
               limit: int = 0) -> TaskSplit:
    """The rows of a task file as `FileTask`s, shuffled by `seed` and split in train and held out.

    `path`: a .jsonl (or .json: JSON Lines, or one array of row objects), .csv or .parquet file,
    or a directory saved by `datasets` (Dataset or DatasetDict.save_to_disk; of a DatasetDict the
    "train" split, and when `heldout` is 0 its "test" or else "validation" split as held out).
    `prompt`, `answer`, `id`: the columns to use ("" answer: no answer, every task's is "";
    "" id: ids "{stem}-{row index}"). `heldout`: how many tasks to hold out, a count (int) or a
    fraction in (0, 1) of the rows (at least one). `limit` > 0: only the first `limit` rows of
    the file (of each split), for quick runs. The shuffle (random.Random("flexmarl.tasks:SEED"))
    comes before the split, so one file, arguments and seed give the same split everywhere.

    Files are read locally: JSON Lines with `json` (exact values and line numbers: `datasets`
    would turn "082" into 82 in a column that also holds numbers), the rest with `datasets`,
    with HF_DATASETS_OFFLINE and HF_HUB_OFFLINE set during the call, in memory, with its cache
    in a temporary directory (nothing is written beside the file). CSV cells stay text, as
    written (pandas would read the answer "007" as 7); an empty cell is None.
    Raises TaskFileError (a ValueError) naming the file, the row and the fix.
    """
    keys = _check_arguments(prompt, answer, id, heldout, seed, limit)
    path = Path(path).expanduser()
    parts = _read(path, limit)
    stem = path.name if path.is_dir() else path.stem
    if not parts[0].rows:
        raise TaskFileError(f"task file {path} has no rows")
    train = _tasks(path, stem, parts[0], keys)
    use_split = heldout == 0 and len(parts) > 1
    held = _tasks(path, stem, parts[1], keys) if use_split else []
    _check_unique(path, [(parts[0], train), *([(parts[1], held)] if use_split else [])])
    rng = random.Random(f"flexmarl.tasks:{seed}")
    rng.shuffle(train)
    rng.shuffle(held)
    if not use_split and heldout:
        count = max(1, round(heldout * len(train))) if heldout < 1 else int(heldout)
        if count >= len(train):
            raise TaskFileError(f"task file {path}: heldout={heldout!r} would hold out {count} "
                                f"of its {len(train)} rows; leave at least one to train on (a "
                                "smaller count, or a fraction such as 0.1)", param="heldout")
        held, train = train[:count], train[count:]
    return TaskSplit(train=train, heldout=held, source=str(path.resolve()))


@dataclass
class _Part:
    """The rows of one file or split, and where each came from."""

    split: str
    """"" for a file or a Dataset; the split's name in a DatasetDict."""
    rows: list[dict]
    locate: Callable[[int], str]
    """row index -> "line 3", "row index 3", ... for messages."""


def _check_arguments(prompt: Any, answer: Any, id: Any, heldout: Any, seed: Any,
                     limit: Any) -> dict[str, str]:
    """{"prompt": column, ...} of the columns asked for; TaskFileError for a bad argument."""
    if not isinstance(prompt, str) or not prompt:
        raise TaskFileError(f"prompt must name the prompt column, got {prompt!r}", param="prompt")
    for name, value in (("answer", answer), ("id", id)):
        if not isinstance(value, str):
            raise TaskFileError(f"{name} must be a column name or \"\" (none), got {value!r}",
                                param=name)
    keys = {k: v for k, v in (("prompt", prompt), ("answer", answer), ("id", id)) if v}
    seen: dict[str, str] = {}
    for role, column in keys.items():
        if column in seen:
            raise TaskFileError(f"{role}={column!r} is also the {seen[column]} column; prompt, "
                                "answer and id need different columns", param=role)
        seen[column] = role
    numeric = isinstance(heldout, (int, float)) and not isinstance(heldout, bool)
    if not (numeric and heldout >= 0 and (heldout < 1 or float(heldout).is_integer())):
        raise TaskFileError(f"heldout must be a count (an int >= 0) or a fraction in (0, 1), "
                            f"got {heldout!r}", param="heldout")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TaskFileError(f"seed must be an int, got {seed!r}", param="seed")
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
        raise TaskFileError(f"limit must be an int >= 0 (0: every row), got {limit!r}",
                            param="limit")
    return keys


def _read(path: Path, limit: int) -> list[_Part]:
    """The file's rows: [train] or, for a DatasetDict with one, [train, test or validation]."""
    if path.is_dir():
        if (path / "dataset_dict.json").is_file() or (
                (path / "dataset_info.json").is_file() and (path / "state.json").is_file()):
            return _read_saved(path, limit)
        raise TaskFileError(f"task path {path} is a directory but not a dataset saved by "
                            "`datasets` (no dataset_dict.json, nor dataset_info.json with "
                            "state.json); name a file or a save_to_disk directory")
    if not path.exists():
        raise TaskFileError(_missing(path))
    suffix = path.suffix.lower()
    if suffix not in SUPPORTED_FORMATS:
        raise TaskFileError(f"task file {path}: unsupported file type {suffix or '(none)'!r}; "
                            f"supported: {', '.join(SUPPORTED_FORMATS)} or a directory saved "
                            "by datasets' save_to_disk")
    if path.stat().st_size == 0:
        raise TaskFileError(f"task file {path} is empty (no rows)")
    if suffix in (".jsonl", ".json"):
        return [_read_json(path, limit)]
    return [_read_table(path, suffix, limit)]


def _missing(path: Path) -> str:
    parent = path.parent
    if not parent.is_dir():
        return f"task file {path} does not exist, nor does its folder {parent}"
    nearby = sorted(p.name + ("/" if p.is_dir() else "") for p in parent.iterdir()
                    if p.is_dir() or p.suffix.lower() in SUPPORTED_FORMATS)
    listed = ", ".join(nearby[:12]) + (", ..." if len(nearby) > 12 else "")
    return (f"task file {path} does not exist; {parent} has "
            + (listed if nearby else "no data files or directories"))


def _read_json(path: Path, limit: int) -> _Part:
    """JSON Lines (one object per line; blank lines skipped), or a .json array of objects."""
    data = path.read_bytes()
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    if path.suffix.lower() == ".json" and data.lstrip()[:1] == b"[":
        try:
            rows = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise TaskFileError(f"task file {path} is not a valid JSON array: {e}") from None
        rows = rows[:limit] if limit else rows
        for i, row in enumerate(rows):
            if not isinstance(row, dict):
                raise TaskFileError(f"task file {path} item {i}: a row must be a JSON object, "
                                    f"got {type(row).__name__}")
        return _Part("", rows, lambda i: f"item {i}")
    rows, lines = [], []
    for number, raw in enumerate(data.splitlines(), 1):
        if limit and len(rows) >= limit:
            break
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise TaskFileError(f"task file {path} line {number}: not UTF-8 text ({e})") from None
        if not text.strip():
            continue
        try:
            row = json.loads(text)
        except json.JSONDecodeError as e:
            raise TaskFileError(f"task file {path} line {number}: not valid JSON: {e.msg} "
                                f"(column {e.colno}); each line must be one JSON object"
                                ) from None
        if not isinstance(row, dict):
            raise TaskFileError(f"task file {path} line {number}: a row must be a JSON object "
                                f"{{...}}, got {type(row).__name__}")
        rows.append(row)
        lines.append(number)
    return _Part("", rows, lambda i: f"line {lines[i]}")


def _read_table(path: Path, suffix: str, limit: int) -> _Part:
    """A CSV or Parquet file through `datasets`."""
    kind = suffix[1:].upper() if suffix == ".csv" else "Parquet"
    with _offline_datasets() as (datasets, cache_dir):
        try:
            if suffix == ".csv":
                dataset = datasets.Dataset.from_csv(
                    str(path), keep_in_memory=True, cache_dir=cache_dir,
                    converters={c: str for c in _csv_header(path)})
            else:
                dataset = datasets.Dataset.from_parquet(str(path), keep_in_memory=True,
                                                        cache_dir=cache_dir)
        except Exception as e:
            if suffix == ".csv" and not _csv_lines(path):
                raise TaskFileError(f"task file {path} has no rows (a header at most)") from None
            raise TaskFileError(f"task file {path} could not be read as {kind}: "
                                f"{_root_cause(e)}") from e
        rows = _rows(dataset, limit)
    if suffix == ".csv":
        lines = cache(lambda: _csv_lines(path))  # only an error message needs them
        return _Part("", rows, lambda i: f"line {lines()[i]}")
    return _Part("", rows, lambda i: f"row index {i}")


def _read_saved(path: Path, limit: int) -> list[_Part]:
    """A Dataset or DatasetDict directory (save_to_disk)."""
    with _offline_datasets() as (datasets, _):
        try:
            loaded = datasets.load_from_disk(str(path), keep_in_memory=True)
        except Exception as e:
            raise TaskFileError(f"task path {path} could not be read as a saved dataset: "
                                f"{_root_cause(e)}") from e
        if isinstance(loaded, datasets.Dataset):
            return [_Part("", _rows(loaded, limit), lambda i: f"row index {i}")]
        if "train" not in loaded:
            raise TaskFileError(f"task path {path} is a DatasetDict without a 'train' split "
                                f"(it has {', '.join(loaded) or 'none'}); save the split to "
                                "train on as 'train'")
        names = ["train"] + [s for s in ("test", "validation") if s in loaded][:1]
        return [_Part(s, _rows(loaded[s], limit), lambda i, s=s: f"split {s!r} row index {i}")
                for s in names]


def _rows(dataset: Any, limit: int) -> list[dict]:
    if limit and limit < len(dataset):
        dataset = dataset.select(range(limit))
    return dataset.to_list()


@contextlib.contextmanager
def _offline_datasets() -> Iterator[tuple[Any, str]]:
    """`datasets` with the hub switched off, no progress bars and its cache in a temporary
    directory, all restored afterwards. (The offline switches are read when `datasets` is first
    imported; reading local files never fetches anything either way.)"""
    saved = {k: os.environ.get(k) for k in _OFFLINE_ENV}
    os.environ.update({k: "1" for k in _OFFLINE_ENV})
    bars_on = None
    try:
        try:
            import datasets
        except ImportError as e:
            raise TaskFileError(f"reading CSV, Parquet or dataset directories needs the "
                                f"`datasets` package (pip install datasets): {e}") from None
        bars_on = not datasets.are_progress_bars_disabled()
        datasets.disable_progress_bars()
        with tempfile.TemporaryDirectory(prefix="flexmarl-tasks-") as cache_dir:
            yield datasets, cache_dir
    finally:
        if bars_on:
            datasets.enable_progress_bars()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _root_cause(error: BaseException) -> str:
    """The innermost error's message: `datasets` wraps the parser's in its own."""
    for _ in range(20):  # a chain is short; a cycle must not hang an error message
        inner = error.__cause__ or error.__context__
        if inner is None:
            break
        error = inner
    return f"{type(error).__name__}: {error}"


def _csv_header(path: Path) -> list[str]:
    with open(path, newline="", encoding="utf-8") as f:
        return next(csv.reader(f), [])


def _csv_lines(path: Path) -> list[int]:
    """The file line each CSV data row starts on (1-based; the header is line 1), blank lines
    skipped as pandas does."""
    starts = []
    with open(path, newline="", encoding="utf-8", errors="replace") as f:
        reader = csv.reader(f)
        next(reader, None)
        start = reader.line_num + 1
        for row in reader:
            if row:
                starts.append(start)
            start = reader.line_num + 1
    return starts


def _tasks(path: Path, stem: str, part: _Part, keys: dict[str, str]) -> list[FileTask]:
    """One FileTask per row, in file order."""
    used = set(keys.values())
    prefix = f"{stem}-{part.split}-" if part.split and part.split != "train" else f"{stem}-"
    tasks = []
    for i, row in enumerate(part.rows):
        for role, column in keys.items():
            if column not in row:
                raise TaskFileError(f"task file {path} {part.locate(i)}: no field {column!r} "
                                    f"(the {role} column); the row has: "
                                    f"{', '.join(map(str, row)) or 'no fields'}", param=role)
        where = f"task file {path} {part.locate(i)}"
        task_id = prefix + str(i)
        if "id" in keys:
            value = row[keys["id"]]
            task_id = "" if value is None else str(value)
            if not task_id.strip():
                raise TaskFileError(f"{where}: the id field {keys['id']!r} is empty")
        tasks.append(FileTask(
            prompt=_prompt(row[keys["prompt"]], where, keys["prompt"]),
            answer=_answer(row[keys["answer"]], where, keys["answer"]) if "answer" in keys else "",
            task_id=task_id,
            extra=tuple((str(k), v) for k, v in row.items() if k not in used)))
    return tasks


def _prompt(value: Any, where: str, column: str) -> str | list:
    if isinstance(value, (list, tuple)):
        if not value:
            raise TaskFileError(f"{where}: the prompt field {column!r} is an empty list")
        if all(isinstance(m, dict) and {"role", "content"} <= m.keys() for m in value):
            return [dict(m) for m in value]
        raise TaskFileError(f"{where}: the prompt field {column!r} is a list but not a chat; "
                            "a chat prompt is a list of {\"role\": ..., \"content\": ...} "
                            f"objects, got {str(value)[:80]}")
    if value is None or isinstance(value, dict):
        got = "empty (null)" if value is None else "an object"
        raise TaskFileError(f"{where}: the prompt field {column!r} is {got}; it must be text "
                            "or a chat (a list of {\"role\", \"content\"} objects)")
    text = str(value)
    if not text.strip():
        raise TaskFileError(f"{where}: the prompt field {column!r} is empty")
    return text


def _answer(value: Any, where: str, column: str) -> str:
    if value is None:
        raise TaskFileError(f"{where}: the answer field {column!r} is null; give every row an "
                            "answer, or load without one (answer=\"\")")
    return str(value)


def _check_unique(path: Path, parts: list[tuple[_Part, list[FileTask]]]) -> None:
    seen: dict[str, str] = {}
    for part, tasks in parts:
        for i, task in enumerate(tasks):
            where = part.locate(i)
            if task.task_id in seen:
                raise TaskFileError(f"task file {path}: {seen[task.task_id]} and {where} have "
                                    f"the same id {task.task_id!r}; task ids must be unique",
                                    param="id")
            seen[task.task_id] = where
