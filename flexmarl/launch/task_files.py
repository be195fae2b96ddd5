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
tasks in the same order.
"""
from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

from flexmarl.checks import ConfigError
from flexmarl.config.load import PACKAGE_ROOT
from flexmarl.config.sections import TeamRef
from flexmarl.tasks import TaskFileError, TaskSplit, load_tasks
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
    _warn_missing_attributes(team, split, path)
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
    if not dataclasses.is_dataclass(own):
        return
    wanted = {f.name for f in dataclasses.fields(own)} - _TASK_ATTRIBUTES
    missing = sorted(wanted - set(split.train[0].fields))
    if missing:
        log.warning("team %s: its own tasks have %s, which the rows of %s lack (columns: %s); "
                    "a workflow that reads them will fail", team.name, ", ".join(missing), path,
                    ", ".join(split.train[0].fields) or "none beyond prompt/answer/id")
