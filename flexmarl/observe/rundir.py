"""What one run leaves on disk, and what it shows in the terminal.

    run dir/
      config.toml        the resolved config: `flexmarl run run_dir/config.toml` repeats the run
      metrics.jsonl      one JSON object per line, appended and flushed as it is written
      run.log            the log: this process's records, Python warnings, and the workers'
                         stdout and stderr (engine logs), which stay off the console unless -v
      checkpoints/AGENT/ one directory per agent
      eval.json          the held-out measurements before (written as soon as made; kept by a
                         --resume) and after training (flexmarl.launch.run); eval-final.json,
                         eval-step-N.json: `flexmarl eval`'s; gateway_token: a gateway run's

`Progress` writes one line per step with its mean reward per agent and the team's; on a
terminal two tqdm bars (global steps; samples of the current step) stay below those lines.
"""
from __future__ import annotations

import logging
import os
import re
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from collections.abc import Sequence
from typing import IO, Any

import orjson

from flexmarl.checks import ConfigError
from flexmarl.config.load import Config

log = logging.getLogger(__name__)

CONFIG_FILE = "config.toml"
METRICS_FILE = "metrics.jsonl"
LOG_FILE = "run.log"
CHECKPOINTS_DIR = "checkpoints"
EVAL_FILE = "eval.json"
"""The run's held-out measurements before and after training (flexmarl.launch.run)."""
TIMESTAMP_FORMAT = "%Y%m%d-%H%M%S"


class RunDir:
    """The directory of one run; make it with `RunDir.create(config)`."""

    def __init__(self, path: Path, config: Config, *, verbose: bool = False) -> None:
        self.path = path
        self.config = config
        self.verbose = verbose
        """`flexmarl run -v`: the workers' output on the console, not only in the log."""
        self.metrics = MetricsWriter(path / METRICS_FILE)

    @property
    def log_path(self) -> Path:
        return self.path / LOG_FILE

    @property
    def worker_log(self) -> Path | None:
        """Where the workers' stdout and stderr go: the log, or (verbose) the console."""
        return None if self.verbose else self.log_path

    @classmethod
    def create(cls, config: Config, *, resume: bool = False, verbose: bool = False) -> RunDir:
        """Make the run directory and write the resolved config (`verbose`: see .verbose).

        `run.dir` if set (it must be new or empty, unless `resume`), else a new
        `run.out_dir/run.name-YYYYmmdd-HHMMSS` (with `-1`, `-2`, ... if that second is taken).
        """
        if config.run.dir:
            path = Path(config.run.dir)
            if path.exists() and not path.is_dir():
                raise ConfigError(f"run.dir {str(path)!r} exists and is not a directory; "
                                  "set run.dir to a new or empty directory")
            if path.is_dir() and any(path.iterdir()) and not resume:
                raise ConfigError(f"run.dir {str(path)!r} exists and is not empty; set run.dir "
                                  "to a new or empty directory, or leave it empty for a "
                                  "timestamped one")
            path.mkdir(parents=True, exist_ok=True)
        else:
            parent = Path(config.run.out_dir)
            parent.mkdir(parents=True, exist_ok=True)
            stem = f"{config.run.name}-{time.strftime(TIMESTAMP_FORMAT)}"
            path = parent / stem
            for n in range(1, 1000):
                try:
                    path.mkdir()  # atomic: two runs started in one second get different dirs
                    break
                except FileExistsError:
                    path = parent / f"{stem}-{n}"
            else:
                raise ConfigError(f"run.out_dir {str(parent)!r} already holds 1000 runs named "
                                  f"{stem!r}; choose another run.name")
        (path / CONFIG_FILE).write_text(config.to_toml(), encoding="utf-8")
        return cls(path, config, verbose=verbose)

    def checkpoint_dir(self, agent: str) -> Path:
        """`path/checkpoints/agent`, created."""
        if not agent or agent in (".", "..") or "/" in agent or os.sep in agent:
            raise ValueError(f"agent name {agent!r} cannot name a checkpoint directory")
        d = self.path / CHECKPOINTS_DIR / agent
        d.mkdir(parents=True, exist_ok=True)
        return d

    def close(self) -> None:
        self.metrics.close()

    def __enter__(self) -> RunDir:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"


class MetricsWriter:
    """Appends JSON lines to a file, flushing each to the OS: a crash of this process loses
    nothing already written (a machine crash may still lose the page cache; no fsync per line)."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        _drop_torn_tail(self.path)
        self._file: IO[bytes] | None = open(self.path, "ab")

    def write(self, record: dict[str, Any]) -> dict[str, Any]:
        """Append `record` and return it. A `time` (unix seconds) is added to `record` itself
        if it has none, so a caller's list of records equals what `read_metrics` gives back."""
        if self._file is None:
            raise ValueError(f"MetricsWriter for {self.path} is closed")
        record.setdefault("time", time.time())
        line = orjson.dumps(record, default=_plain,
                            option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_APPEND_NEWLINE)
        self._file.write(line)
        self._file.flush()
        return record

    def sync(self) -> None:
        """Make what was written durable (fsync): before deleting what a record supersedes."""
        if self._file is not None:
            os.fsync(self._file.fileno())

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> MetricsWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _plain(obj: Any) -> Any:
    """orjson fallback: one-element tensors (and arrays) become Python numbers."""
    if hasattr(obj, "item"):
        try:
            return obj.item()
        except (ValueError, RuntimeError):  # more than one element
            pass
    raise TypeError(f"metrics values must be JSON data or scalars, got {type(obj).__name__}")


def _drop_torn_tail(path: Path) -> None:
    """Cut a line left half-written by a crash, so appended lines start on a line of their own."""
    try:
        with open(path, "rb+") as f:
            data = f.read()
            if data and not data.endswith(b"\n"):
                keep = data.rfind(b"\n") + 1
                log.warning("%s: dropping a torn last line (%d bytes) before appending",
                            path, len(data) - keep)
                f.truncate(keep)
    except FileNotFoundError:
        pass


def read_metrics(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The records of a metrics file; a torn last line (a crash mid-write) is skipped, a
    malformed line elsewhere raises ValueError naming it."""
    lines = Path(path).read_bytes().split(b"\n")
    records = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            records.append(orjson.loads(line))
        except orjson.JSONDecodeError as e:
            if i == len(lines) - 1:  # no newline after it: the write was cut short
                break
            raise ValueError(f"{path}: line {i + 1} is not JSON ({e})") from None
    return records


class Progress:
    """Steps and samples of a run in the terminal: `start_step`, `add_samples`*, `end_step`.

    `enabled=None` shows tqdm bars when stderr is a terminal; otherwise (or with
    `enabled=False`) each `end_step` writes one line to `file` (default stderr). Plain lines
    rather than logging records, so they show under the default WARNING log level.
    """

    def __init__(self, total_steps: int, enabled: bool | None = None, *,
                 file: IO[str] | None = None) -> None:
        self.total_steps = total_steps
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self._file = file
        self._step_started = time.perf_counter()
        self._stack = ExitStack()
        if self.enabled:
            from tqdm import tqdm
            from tqdm.contrib.logging import logging_redirect_tqdm

            # Log records go through tqdm.write while the bars are up, not through them.
            self._stack.enter_context(logging_redirect_tqdm())
            self._steps_bar = self._stack.enter_context(
                tqdm(total=total_steps, desc="steps", unit="step", position=0, dynamic_ncols=True))
            self._samples_bar = self._stack.enter_context(
                tqdm(total=0, desc="trajectories", unit="traj", position=1, leave=False,
                     dynamic_ncols=True))

    def start_step(self, step: int, total_samples: int) -> None:
        self._step_started = time.perf_counter()
        if self.enabled:
            self._samples_bar.reset(total=total_samples)
            self._samples_bar.set_description(f"step {step} trajectories")

    def add_samples(self, n: int) -> None:
        """`n` more samples of the step whose rollout started last."""
        if self.enabled:
            self._samples_bar.update(n)

    def end_step(self, step: int, rewards: dict[str, float], seconds: float | None = None,
                 no_signal: Sequence[str] = (), team: float | None = None) -> None:
        """Step `step` finished (its rollout may have ended steps ago: pipelines overlap):
        one line, "step 3/20  12.4 s  team 0.410  solver 0.380  checker 0.520" (`team`: the
        team reward's mean). `no_signal`: trainable agents that did not update in it (every
        group's rewards equal)."""
        if seconds is None:
            seconds = time.perf_counter() - self._step_started
        line = step_line(step, self.total_steps, seconds, rewards, team)
        if no_signal:
            line += (f"  no learning signal: {', '.join(no_signal)} (equal rewards in every "
                     "group)")
        if self.enabled:
            self._steps_bar.update(1)
            self._steps_bar.write(line, file=sys.stderr)
            return
        print(line, file=self._file or sys.stderr, flush=True)

    def evaluated(self, step: int, result: dict) -> None:
        """A held-out evaluation after `step` (flexmarl.orchestrator.evaluate): one line."""
        line = f"eval after step {step}: {eval_line(result)}"
        if self.enabled:
            self._steps_bar.write(line, file=sys.stderr)
        else:
            print(line, file=self._file or sys.stderr, flush=True)

    def close(self) -> None:
        self._stack.close()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def step_line(step: int, total_steps: int, seconds: float, rewards: dict[str, float],
              team: float | None = None) -> str:
    """"step 3/20  12.4 s  team 0.410  solver 0.380  checker 0.520": the step's mean rewards."""
    parts = [f"step {step}/{total_steps}", f"{seconds:.1f} s"]
    if team is not None:
        parts.append(f"team {team:.3f}")
    parts.append("  ".join(f"{name} {value:.3f}" for name, value in rewards.items()) or
                 "no rewards")
    return "  ".join(parts)


def eval_line(result: dict) -> str:
    """"team 0.420 (solver 0.500, checker 0.610) on 50 held-out tasks, greedy, 3.1 s"."""
    def f(v: Any) -> str:
        return "-" if v is None else f"{v:.3f}"
    agents = ", ".join(f"{a} {f(v['reward'])}" for a, v in result.get("agents", {}).items())
    best = f", best of n {f(result['best_team'])}" if "best_team" in result else ""
    failed = f", {result['failed']} failed" if result.get("failed") else ""
    return (f"team {f(result.get('team_reward'))}{best} ({agents}) on {result['tasks']} "
            f"held-out tasks, {result['mode']}{failed}, {result['seconds']:.1f} s")


def policy_lines(policies: dict | None) -> list[tuple[str, str]]:
    """A team's exact policy measures before and after training (eval.json's "policies":
    Team.analysis, an OpenSpiel team's), one per agent: ("p0 NashConv", "2.010 -> 0.830 (-59%;
    uniform random 0.917, Nash 0), legal replies 0.412 -> 0.975"); [] without them."""
    before, after = (policies or {}).get("before") or {}, (policies or {}).get("after") or {}
    out = []
    for agent in dict.fromkeys([*before.get("agents", {}), *after.get("agents", {})]):
        b = before.get("agents", {}).get(agent) or {}
        a = after.get("agents", {}).get(agent) or {}

        def f(cell: dict, key: str) -> str:
            return "-" if cell.get(key) is None else f"{cell[key]:.3f}"
        change = (f"{(a['nash_conv'] - b['nash_conv']) / b['nash_conv']:+.0%}; "
                  if a.get("nash_conv") is not None and b.get("nash_conv") else "")
        scale = (after or before).get("uniform_nash_conv")
        out.append((f"{agent} NashConv",
                    f"{f(b, 'nash_conv')} -> {f(a, 'nash_conv')} ({change}uniform random "
                    f"{scale:.3f}, Nash 0), legal replies {f(b, 'legal_mass')} -> "
                    f"{f(a, 'legal_mass')}"))
    return out


def game_lines(heldout: dict | None) -> list[tuple[str, str]]:
    """A game team's held-out results (RunResult.heldout, eval.json's "heldout": the scores
    "games.<opponent>.<win|draw|invalid|unmoved>" and "games.<opponent>.seat<i>.win" of
    flexmarl.envs.textarena), one per agent and opponent: ("p1 vs start", "win 0.250 -> 0.690
    ±0.031 (seat 0 0.700, seat 1 0.680), invalid moves 0.870 -> 0.100 (400 deals, each in
    every seat, sampled)"), the win rate seat-balanced (each deal played in every seat); []
    for a team without games."""
    def f(v: Any) -> str:
        return "-" if v is None else f"{v:.3f}"
    out = []
    for agent, modes in (heldout or {}).items():
        mode = next((m for m in ("sampled", "greedy")
                     if isinstance(modes.get(m), dict) and modes[m].get("scores")), None)
        if mode is None:
            continue
        scores = modes[mode]["scores"]
        for name in sorted(n for n in scores if n.startswith("games.") and n.endswith(".win")
                           and ".seat" not in n):
            opponent = name[len("games."):-len(".win")]
            win, bad = scores[name], scores.get(f"games.{opponent}.invalid") or {}
            se = win.get("se_change")
            seats = sorted((int(n[len(f"games.{opponent}.seat"):-len(".win")]), c)
                           for n, c in scores.items()
                           if re.fullmatch(rf"games\.{re.escape(opponent)}\.seat\d+\.win", n))
            by_seat = (" (" + ", ".join(f"seat {i} {f(c.get('after'))}" for i, c in seats)
                       + ")") if seats else ""
            unmoved = (scores.get(f"games.{opponent}.unmoved") or {}).get("after")
            text = (f"win {f(win.get('before'))} -> {f(win.get('after'))}"
                    + (f" ±{se:.3f}" if se is not None else "") + by_seat
                    + (f", invalid moves {f(bad.get('before'))} -> {f(bad.get('after'))}"
                       if bad else "")
                    + (f", {unmoved:.0%} of games ended before every seat moved (a forfeit: "
                       "a loss for the side that made it)" if unmoved else "")
                    + f" ({win.get('n')} deals" + (", each in every seat" if seats else "")
                    + f", {mode})")
            out.append((f"{agent} vs {opponent}", text))
    return out
