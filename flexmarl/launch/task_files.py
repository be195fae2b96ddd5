"""A team on tasks from a data file: config.team.tasks replaces the team file's own tasks.

    team.tasks (path) ─► resolved: current dir, then package root ─► flexmarl.tasks.load_tasks
        (team.prompt_field / answer_field / id_field / heldout / limit, shuffled by run.seed)
        ─► dataclasses.replace(team, tasks=train, heldout=held out or the team's own)

Everything else of the team is kept: its agents, its workflow, and its `score` function, which
keeps scoring the held-out tasks, now FileTasks. A workflow sees each row as a
`flexmarl.tasks.FileTask`: `task.prompt`, `task.answer`, `task.task_id`, and every other column
in `task.fields` and as an attribute (`task.difficulty` for a "difficulty" column); a column the
workflow reads but the file lacks fails with an AttributeError that lists the row's columns.
The split depends only on the file, these keys and run.seed, so a resumed run sees the same
tasks in the same order. With team.heldout = 0 and no test split in the file, the team's own
held-out tasks stay, with a warning that says how many of them the file trains on.
"""
from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

from flexmarl.checks import ConfigError
from flexmarl.config.load import PACKAGE_ROOT
from flexmarl.config.sections import TeamRef
from flexmarl.tasks import FileTask, TaskFileError, TaskSplit, load_tasks
from flexmarl.team import Team

log = logging.getLogger(__name__)

_KEYS = {"prompt": "team.prompt_field", "answer": "team.answer_field", "id": "team.id_field",
         "heldout": "team.heldout", "limit": "team.limit", "seed": "run.seed"}
"""load_tasks keyword -> the config key that sets it, for error messages."""
_TASK_ATTRIBUTES = {"prompt", "answer", "task_id"}


def team_with_task_file(team: Team, ref: TeamRef, seed: int) -> Team:
    """`team` with its tasks (and held-out tasks, when the file gives some) read from
    team.tasks (`ref`: the [team] section), split by `seed` (run.seed); `team` itself when
    team.tasks is "". ConfigError for a file or key to fix."""
    if not ref.tasks:
        return team
    path = resolve_task_path(ref.tasks)
    split = _load(path, ref, seed)
    if list(team.tasks) == list(split.train):  # done already (the CLI, then build_run): once
        return team
    _warn_missing_attributes(team, split, path)
    if not split.heldout:
        _warn_own_heldout(team, split, path)
    try:
        # The file's held-out tasks are its own: counted as tasks, not by the team's rounds.
        return dataclasses.replace(team, tasks=split.train, heldout=split.heldout or team.heldout,
                                   heldout_round=None if split.heldout else team.heldout_round)
    except (TypeError, ValueError) as e:  # Team's own checks of the new tasks
        raise ConfigError(f"team.tasks = {ref.tasks!r}: {e}") from None


def resolve_task_path(path: str) -> Path:
    """An existing task file or directory: absolute, else relative to the current directory,
    else to the package root (as team.path)."""
    p = Path(path).expanduser()
    candidates = [p] if p.is_absolute() else [Path.cwd() / p, PACKAGE_ROOT / p]
    for c in candidates:
        if c.exists():
            return c.resolve()
    try:  # load_tasks says what lies next to the path the user most likely meant
        load_tasks(candidates[0])
    except TaskFileError as e:
        raise ConfigError(f"team.tasks {path!r}: {e}"
                          + (f" (nor is there {candidates[1]})" if len(candidates) > 1 else "")
                          ) from None
    raise ConfigError(f"team.tasks {path!r} does not exist")  # pragma: no cover


def _load(path: Path, ref: TeamRef, seed: int) -> TaskSplit:
    heldout = int(ref.heldout) if ref.heldout >= 1 else ref.heldout
    try:
        return load_tasks(path, prompt=ref.prompt_field, answer=ref.answer_field,
                          id=ref.id_field, heldout=heldout, seed=seed,
                          limit=ref.limit)
    except TaskFileError as e:
        key = _KEYS.get(e.param or "")
        raise ConfigError(f"team.tasks: {e}" + (f" (set by {key})" if key else "")) from None


def _warn_missing_attributes(team: Team, split: TaskSplit, path: Path) -> None:
    """The team file's own tasks had attributes (a dataclass's fields) the file's rows lack: its
    workflow may read them. A warning, not an error: it may not."""
    own = team.tasks[0]
    if isinstance(own, FileTask):  # rows of another file: its columns are what it may read
        wanted = set(own.fields)
    elif dataclasses.is_dataclass(own):
        wanted = {f.name for f in dataclasses.fields(own)} - _TASK_ATTRIBUTES
    else:
        return
    missing = sorted(wanted - set(split.train[0].fields))
    if missing:
        log.warning("team %s: its own tasks have %s, which the rows of %s lack (columns: %s); "
                    "a workflow that reads them will fail", team.name, ", ".join(missing), path,
                    ", ".join(split.train[0].fields) or "none beyond prompt/answer/id")


def _warn_own_heldout(team: Team, split: TaskSplit, path: Path) -> None:
    """team.heldout = 0 and the file gives no held-out split: the team's own held-out tasks
    stay. Said, with how many of them the file trains on (their scores would then measure
    tasks trained on, not held out)."""
    if not team.heldout:
        return
    trained = {repr(t.prompt) for t in split.train}
    seen = sum(repr(getattr(t, "prompt", None)) in trained for t in team.heldout)
    why = (f"{seen} of them are among its {len(split.train)} training rows (the same prompt), "
           "so their scores measure tasks it trains on" if seen else
           "they are not rows of the file")
    log.warning("team.heldout = 0: the held-out tasks stay team %s's own %d, not rows of %s; %s "
                "(set team.heldout to a count or a fraction to hold rows of the file out)",
                team.name, len(team.heldout), path.name, why)
