"""A team file's own config (issue 65): `config` in the file or Team(config=...), laid under
--config and --set (flexmarl.config.load), checked by the config's rules; where each value came
from (--dry-run), what the dry run refuses, old section names per layer, resume and eval
without the team file's current config, load_team's copies, and the shipped teams' settings."""
from __future__ import annotations

import tomllib
from pathlib import Path
from re import escape as re_escape

import pytest

from flexmarl.checks import ConfigError
from flexmarl.config.load import Config, load_config
from flexmarl.launch.cli import main
from tests.helpers.teams import write_team

CARRIED = 'config = {"run": {"steps": 7, "seed": 3}, "pipeline": {"tasks_per_step": 3}}'


def test_a_team_files_config_applies_over_the_defaults(tmp_path):
    config = load_config(team=write_team(tmp_path, CARRIED))
    assert (config.run.steps, config.run.seed, config.pipeline.tasks_per_step) == (7, 3, 3)
    assert config.sources["run.steps"].startswith("in team file ")
    assert config.sources["run.name"] == "default"


def test_precedence_defaults_team_file_config_file_set(tmp_path):
    """built-in defaults < the team file's config < --config FILE < --set (each key from the
    highest layer that sets it)."""
    team = write_team(tmp_path, CARRIED)
    exp = tmp_path / "exp.toml"
    exp.write_text("[run]\nseed = 11\nsteps = 9\n")
    config = load_config(str(exp), ["run.steps=5"], team=team)
    assert config.run.steps == 5 and config.sources["run.steps"] == "from --set"
    assert config.run.seed == 11 and config.sources["run.seed"] == f"in {exp}"
    assert config.pipeline.tasks_per_step == 3  # only the team file sets it
    assert config.pipeline.trajectories_per_task == Config().pipeline.trajectories_per_task
    # The team file named by team.path in the config file counts too (not only --team).
    exp.write_text(f"[team]\npath = {str(team)!r}\n")
    assert load_config(str(exp)).run.steps == 7
    assert load_config(team=team, team_config=False).run.steps == Config().run.steps


@pytest.mark.parametrize("form", [
    'config = """\n[run]\nsteps = 7\n[eval]\nmodes = ["sampled"]\n"""',   # TOML text
    '',                                                                     # Team(config=...)
])
def test_team_config_as_toml_text_or_a_team_argument(tmp_path, form):
    kwargs = "" if form else ', config={"run": {"steps": 7}, "eval": {"modes": ["sampled"]}}'
    config = load_config(team=write_team(tmp_path, form, kwargs))
    assert config.run.steps == 7 and config.eval.modes == ("sampled",)


@pytest.mark.parametrize("carried, expected", [
    ('config = {"run": {"stepz": 7}}', "run.stepz (in team file"),
    ('config = {"pipeline": {"tasks_per_step": 0}}', "pipeline.tasks_per_step must be >= 1"),
    ('config = {"run": {"steps": "many"}}', "run.steps expects an int, got 'many' (str) (in "
     "team file"),
])
def test_a_bad_team_config_is_a_config_error_naming_the_team_file(tmp_path, carried, expected):
    with pytest.raises(ConfigError, match=re_escape(expected)):
        load_config(team=write_team(tmp_path, carried))


@pytest.mark.parametrize("carried, kwargs, expected", [
    ('config = {"team": {"path": "other.py"}}', "", "cannot set team.path"),
    ('config = "[run"', "", "not valid TOML"),
    ('config = {"run": 7}', "", "must be a table of keys"),
    ('config = [1]', "", "must be a dict of sections"),
    ('config = {"run": {"steps": 2}}', ', config={"run": {"steps": 3}}', "gives its config twice"),
])
def test_a_malformed_team_config_fails_the_team_file_with_its_reason(tmp_path, capsys,
                                                                      carried, kwargs, expected):
    """The team file does not load: load_config adds nothing from it, and the run (here the
    dry run, which loads the team as the run does) refuses it in one line."""
    team = write_team(tmp_path, carried, kwargs)
    assert load_config(team=team).run.steps == Config().run.steps
    with pytest.raises(SystemExit) as info:
        main(["run", "--team", team, "--dry-run"])
    assert info.value.code == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"flexmarl: team error ({Path(team).resolve()}): ") and expected in line


@pytest.mark.filterwarnings("ignore:config key train:FutureWarning")
@pytest.mark.parametrize("carried, later", [
    ('config = {"train": {"slots": 2}}', "trainer_pool.slots=4"),     # old name, then new
    ('config = {"trainer_pool": {"slots": 2}}', "train.slots=4"),     # new name, then old
])
def test_old_section_names_are_renamed_within_each_layer(tmp_path, carried, later):
    """A later layer overrides an earlier one whichever name of a renamed section each uses
    (the review found `--set` refused as "the same setting")."""
    team = write_team(tmp_path, carried)
    assert load_config(team=team).trainer_pool.slots == 2
    assert load_config(None, [later], team=team).trainer_pool.slots == 4
    exp = tmp_path / "exp.toml"
    exp.write_text("[trainer_pool]\nslots = 3\n")
    assert load_config(str(exp), team=team).trainer_pool.slots == 3
    exp.write_text("[train]\nslots = 3\n[trainer_pool]\nslots = 5\n")  # one layer: both
    with pytest.raises(ConfigError, match="are the same setting"):
        load_config(str(exp), team=team)


def test_a_relative_task_file_in_a_team_files_config_is_found_beside_it(tmp_path, monkeypatch):
    """The team file and its data travel together: team.tasks it names is looked up beside it,
    from whatever directory the run starts in."""
    folder = tmp_path / "experiment"
    folder.mkdir()
    (folder / "rows.jsonl").write_text('{"prompt": "1+1", "answer": "2"}\n')
    team = write_team(folder, 'config = {"team": {"tasks": "rows.jsonl"}}')
    monkeypatch.chdir(tmp_path)
    assert load_config(team=team).team.tasks == str(folder / "rows.jsonl")


def test_resume_and_eval_read_the_run_config_without_the_team_files_current_one(tmp_path):
    """A run's config.toml holds what it ran with; its None values are left out of the file, so
    a team file's config (changed since) laid under it would fill them: it is not."""
    from flexmarl.launch.evaluation import run_config
    team = write_team(tmp_path, 'config = {"trainer": {"clip_eps_high": 0.3}}')
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.toml").write_text(load_config(team=team, team_config=False).to_toml())
    assert load_config(team=team).trainer.clip_eps_high == 0.3
    assert run_config(run).trainer.clip_eps_high is None


def test_load_team_gives_each_caller_its_own_team(tmp_path):
    from flexmarl.team import load_team
    path = write_team(tmp_path, CARRIED)
    first = load_team(path)
    first.config["run"]["steps"] = 999
    first.tasks = first.tasks[:1]
    again = load_team(path)
    assert again.config["run"]["steps"] == 7 and len(again.tasks) == 8
    assert load_config(team=path).run.steps == 7


@pytest.mark.parametrize("carried, expected", [
    ('config = {"run": {1: 2}}', "names must be str"),
    ('import types\nconfig = types.SimpleNamespace(seed=1)', "rename it"),
])
def test_a_config_that_is_not_run_settings_says_what_it_must_be(tmp_path, capsys, carried,
                                                                 expected):
    with pytest.raises(SystemExit) as info:
        main(["run", "--team", write_team(tmp_path, carried), "--dry-run"])
    assert info.value.code == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("flexmarl: team error (") and expected in line


def test_dry_run_marks_where_each_value_came_from(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("FLEXMARL_LOG", raising=False)
    team = write_team(tmp_path, CARRIED)
    with pytest.raises(SystemExit) as info:
        main(["run", "--team", team, "--set", "run.seed=5", "--dry-run"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    lines, section = {}, ""
    for line in out.splitlines():
        if line.startswith("["):
            section = line.strip("[]")
        elif " = " in line:
            lines[f"{section}.{line.split(' = ')[0]}"] = line
    assert lines["run.steps"] == f"steps = 7  # in team file {team}"
    assert lines["run.seed"] == "seed = 5  # from --set"
    assert lines["pipeline.tasks_per_step"].endswith(f"# in team file {team}")
    assert "#" not in lines["run.name"]  # a default says nothing
    assert tomllib.loads(out)["run"]["steps"] == 7  # the comments keep it valid TOML


@pytest.mark.parametrize("argv, expected", [
    (["--set", "team.tasks=missing.jsonl"], "task file"),
    (["--set", "devices.placement=ghost=time_shared"], "names agent 'ghost'"),
])
def test_dry_run_refuses_what_the_run_refuses(tmp_path, capsys, monkeypatch, argv, expected):
    """Issue 65: a missing task file and an unknown agent in devices.placement (the team file
    that does not load: above) exit 2 in the dry run as in the run."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as info:
        main(["run", "--team", write_team(tmp_path), *argv, "--dry-run"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("flexmarl: config error: ") and expected in err


def test_the_shipped_kuhn_poker_team_carries_its_run(monkeypatch, tmp_path):
    """`flexmarl run --team agents/kuhn_poker.py` runs the file's settings; --set still wins."""
    pytest.importorskip("textarena")
    monkeypatch.chdir(tmp_path)  # found in the package root, as the docs run it
    config = load_config(team="agents/kuhn_poker.py")
    assert (config.run.steps, config.eval.modes, config.eval.final_tasks) == (20, ("sampled",),
                                                                               100)
    assert load_config(None, ["run.steps=2"], team="agents/kuhn_poker.py").run.steps == 2
