"""Config loading and errors, run directories and metrics, progress lines, and `flexmarl run`'s
argument handling (--dry-run and config errors: nothing is trained here)."""
from __future__ import annotations

import dataclasses
import sys
import tomllib
import types
from pathlib import Path

import pytest

from flexmarl.config.load import Config, DEFAULT_TOML, SECTIONS, dump_toml, load_config
from flexmarl.config.pipeline import PIPELINE_MODES
from flexmarl.config.sections import TeamRef
from flexmarl.config.training import TrainerConfig
from flexmarl.launch.cli import main
from flexmarl.checks import ConfigError
from flexmarl.observe.rundir import MetricsWriter, Progress, RunDir, read_metrics

from tests.helpers.teams import write_team


@pytest.fixture
def team_file(tmp_path) -> str:
    path = tmp_path / "duo.py"
    path.write_text("# a team file; its contents are load_team's business\n")
    return str(path)


@pytest.fixture
def in_tmp(tmp_path, monkeypatch) -> Path:
    """Work in tmp_path, with the default team file present there (resolved cwd-first)."""
    (tmp_path / "agents").mkdir()
    (tmp_path / "agents" / "smol_duo.py").write_text("")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def error(*args, **kwargs) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(*args, **kwargs)
    return str(info.value)


# ------------------------------------------------------------------------------ loading

def test_default_config_loads_and_matches_the_dataclass_defaults(in_tmp):
    config = load_config()
    team = str(in_tmp / "agents" / "smol_duo.py")
    assert config == Config(team=TeamRef(path=team))
    assert isinstance(config.trainer, TrainerConfig)  # the trainer's own config, reused
    assert config.pipeline.mode in PIPELINE_MODES
    assert config.rollout.kv_cache_bytes == 256 << 20


def test_default_toml_lists_every_key_with_its_default():
    """DEFAULT_TOML is the reference users copy from: no key missing, none drifting."""
    data = tomllib.loads(DEFAULT_TOML)
    defaults = Config().to_dict()
    for section, table in defaults.items():
        for key, value in table.items():
            if value is None:  # TOML has no null: unset keys mean None
                assert key not in data[section]
            else:
                assert data[section][key] == value, f"{section}.{key}"


def test_file_then_set_then_team_merge_in_order(tmp_path, team_file):
    path = tmp_path / "exp.toml"
    path.write_text('[run]\nname = "exp"\nsteps = 5\n[pipeline]\ntasks_per_step = 2\n'
                    '[team]\npath = "elsewhere.py"\n')
    config = load_config(str(path), ["run.steps=7", "rollout.backend=torch",
                                     "trainer.betas=[0.9,0.95]", "run.steps=9"], team=team_file)
    assert config.run.name == "exp"                 # file over default
    assert config.pipeline.tasks_per_step == 2
    assert config.run.steps == 9                    # --set over file, the last --set wins
    assert config.rollout.backend == "torch"        # a bare word is a string
    assert config.trainer.betas == (0.9, 0.95)      # a TOML array, as the annotated tuple
    assert config.team.path == str(Path(team_file).resolve())  # --team over everything
    assert config.run.seed == 0                     # untouched keys keep the default


def test_set_values_are_toml_literals_or_bare_strings(team_file):
    config = load_config(overrides=["trainer.lr=3e-5", "rollout.ready_timeout_s=5",
                                    "trainer.reshard_after_forward=false", "run.name=2024",
                                    'run.dir="a b"', "run.log_level=info"], team=team_file)
    assert config.trainer.lr == 3e-5
    assert config.rollout.ready_timeout_s == 5.0 and isinstance(config.rollout.ready_timeout_s,
                                                                 float)
    assert config.trainer.reshard_after_forward is False
    assert config.run.name == "2024"  # a string field takes the text as written
    assert config.run.dir == "a b"
    assert config.run.log_level == "INFO"


def test_to_toml_round_trips(tmp_path, team_file):
    config = load_config(overrides=['run.name=we"ird\\name', "trainer.clip_eps_high=0.28"],
                         team=team_file)
    path = tmp_path / "again.toml"
    path.write_text(config.to_toml())
    assert load_config(str(path)) == config
    assert tomllib.loads(dump_toml({"s": {"x": "tab\there\x7f", "n": None}})) == {
        "s": {"x": "tab\there\x7f"}}


# ------------------------------------------------------------------------------ old names

def test_old_train_section_is_read_with_a_warning_naming_the_new_key(tmp_path, team_file):
    """[train] was renamed [trainer_pool]: a file or --set with the old name still works for
    one release, and each old key's warning names its new one (never silently ignored)."""
    path = tmp_path / "old.toml"
    path.write_text("[train]\nslots = 2\n")
    with pytest.warns(FutureWarning) as warned:
        config = load_config(str(path), ["train.snapshots=false"], team=team_file)
    messages = sorted(str(w.message) for w in warned)
    assert len(messages) == 2, messages
    assert f"train.slots (in {path}) is now trainer_pool.slots" in messages[0]
    assert "train.snapshots (from --set) is now trainer_pool.snapshots" in messages[1]
    assert (config.trainer_pool.slots, config.trainer_pool.snapshots) == (2, False)
    assert "train" not in config.to_dict() and "[trainer_pool]" in config.to_toml()


def test_old_and_new_name_of_one_key_is_an_error(tmp_path, team_file):
    """In one layer (one file, one team file's config); across layers the later one wins,
    whichever name each uses (issue 65: --set refused as "the same setting" before)."""
    path = tmp_path / "both.toml"
    path.write_text("[train]\nslots = 2\n")
    with pytest.warns(FutureWarning):
        assert load_config(str(path), ["trainer_pool.slots=3"],
                           team=team_file).trainer_pool.slots == 3
    path.write_text("[train]\nslots = 2\n[trainer_pool]\nslots = 3\n")
    with pytest.raises(ConfigError) as info:  # refused before any warning
        load_config(str(path), team=team_file)
    msg = str(info.value)
    assert "train.slots" in msg and "trainer_pool.slots" in msg and str(path) in msg
    assert "keep only trainer_pool.slots" in msg


def test_old_section_errors_name_the_new_key(team_file):
    with pytest.warns(FutureWarning):
        msg = error(overrides=["train.slots=-1"], team=team_file)
    assert "trainer_pool.slots" in msg


# ------------------------------------------------------------------------------ errors

def test_unknown_section_names_it_and_suggests(team_file):
    msg = error(overrides=["pipline.tasks_per_step=2"], team=team_file)
    assert "unknown section [pipline]" in msg and "'pipeline'" in msg and "--set" in msg


def test_unknown_key_suggests_the_closest_and_lists_the_valid_ones(tmp_path, team_file):
    path = tmp_path / "exp.toml"
    path.write_text("[pipeline]\ntask_per_step = 2\n")
    msg = error(str(path), team=team_file)
    assert "unknown key pipeline.task_per_step" in msg
    assert "Did you mean 'tasks_per_step'?" in msg
    assert "micro_batch_groups" in msg  # the valid keys of the section
    assert str(path) in msg             # where it came from


def test_top_level_key_points_at_its_section(tmp_path, team_file):
    path = tmp_path / "exp.toml"
    path.write_text("steps = 3\n")
    assert "run.steps" in error(str(path), team=team_file)


@pytest.mark.parametrize("override, expected", [
    ("pipeline.tasks_per_step=abc", "expects an int, got 'abc'"),
    ("pipeline.tasks_per_step=true", "expects an int, got True"),
    ("pipeline.tasks_per_step=2.5", "expects an int, got 2.5"),
    ("trainer.lr=fast", "expects a number, got 'fast'"),
    ("trainer.reshard_after_forward=1", "expects a bool"),
    ("trainer.betas=[0.9]", "expects a list of 2"),
    ("run.seed=[1]", "expects an int"),
])
def test_wrong_type_names_the_key_and_the_expected_type(team_file, override, expected):
    msg = error(overrides=[override], team=team_file)
    assert msg.startswith(override.split("=")[0] + " ") and expected in msg


@pytest.mark.parametrize("override", ["pipeline", "pipeline.tasks_per_step", "tasks_per_step=3",
                                      "=3", "pipeline.=3", "a.b.c=1"])
def test_bad_set_syntax(team_file, override):
    assert error(overrides=[override], team=team_file) == (
        f"--set expects section.key=value, got {override!r}")


@pytest.mark.parametrize("override, expected", [
    ("pipeline.tasks_per_step=0", "pipeline.tasks_per_step must be >= 1, got 0"),
    ("pipeline.trajectories_per_task=1", "pipeline.trajectories_per_task must be >= 2"),
    ("rollout.backend=tgi", "rollout.backend must be one of vllm, torch or auto, got 'tgi'"),
    ("pipeline.mode=async", "pipeline.mode must be one of sync, micro_batch, one_step_off, bounded, got 'async'"),
    ("pipeline.max_staleness=0", "pipeline.max_staleness must be >= 1"),
    ("rollout.cpus=0-x", "rollout.cpus must list CPU cores"),
    ("rollout.max_num_seqs=0", "rollout.max_num_seqs must be >= 1, got 0"),
    ("trainer.lora=1", "trainer.lora (from --set) cannot be set in a config: a LoRA adapter"),
    ("rollout.max_loras=-1", "rollout.max_loras must be >= 0"),
    ("trainer_pool.cpus=999", "names cores [999]"),
    ("run.log_level=loud", "run.log_level must be one of"),
    ("run.name=a/b", "run.name must be"),
    ("trainer.lr=0", "trainer.lr must be > 0"),          # TrainerConfig's own check
    ("trainer.device=tpu", "trainer.device must be one of"),
])
def test_invalid_values_name_the_key(team_file, override, expected):
    assert expected in error(overrides=[override], team=team_file)


def test_missing_team_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    msg = error(team="no/such_team.py")
    assert msg.startswith("team.path 'no/such_team.py' does not exist")
    assert msg.endswith("pass --team PATH or set team.path")


def test_missing_or_broken_config_file(tmp_path, team_file):
    assert "does not exist" in error(str(tmp_path / "none.toml"), team=team_file)
    bad = tmp_path / "bad.toml"
    bad.write_text("[run\n")
    assert "is not valid TOML" in error(str(bad), team=team_file)


def test_every_section_is_a_keyword_only_dataclass():
    for cls in SECTIONS.values():
        assert dataclasses.is_dataclass(cls)
        with pytest.raises(TypeError):
            cls(1)


# ------------------------------------------------------------------------------ run dirs

def test_run_dir_writes_the_resolved_config_and_metrics(tmp_path, team_file):
    config = load_config(overrides=[f"run.out_dir={tmp_path / 'runs'}", "run.name=t",
                                    "run.steps=3"], team=team_file)
    with RunDir.create(config) as run_dir:
        assert run_dir.path.parent == tmp_path / "runs" and run_dir.path.name.startswith("t-")
        assert load_config(str(run_dir.path / "config.toml")) == config
        ckpt = run_dir.checkpoint_dir("solver")
        assert ckpt == run_dir.path / "checkpoints" / "solver" and ckpt.is_dir()
        written = [run_dir.metrics.write({"step": 0, "reward": {"solver": 0.5}}),
                   run_dir.metrics.write({"step": 1, "time": 12.0})]
        # Flushed per line: readable while the writer is still open.
        records = read_metrics(run_dir.path / "metrics.jsonl")
    assert records == written  # `time` was added to the caller's record too
    assert [r["step"] for r in records] == [0, 1]
    assert records[0]["reward"] == {"solver": 0.5} and records[0]["time"] > 0
    assert records[1]["time"] == 12.0
    second = RunDir.create(config)  # same name, same second: a distinct directory
    assert second.path != run_dir.path
    second.close()


def test_explicit_run_dir_must_be_new_or_empty(tmp_path, team_file):
    target = tmp_path / "mine"
    config = load_config(overrides=[f"run.dir={target}"], team=team_file)
    RunDir.create(config).close()
    assert (target / "config.toml").is_file()
    with pytest.raises(ConfigError, match="run.dir .* is not empty"):
        RunDir.create(config)
    RunDir.create(config, resume=True).close()


def test_read_metrics_skips_a_torn_last_line_and_the_writer_cuts_it(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b'{"step": 0}\n{"step": 1}\n{"step": 2, "rew')
    assert read_metrics(path) == [{"step": 0}, {"step": 1}]
    with MetricsWriter(path) as writer:  # a resumed run appends after the last whole line
        writer.write({"step": 2, "time": 1.0})
    assert read_metrics(path) == [{"step": 0}, {"step": 1}, {"step": 2, "time": 1.0}]
    path.write_bytes(b'{"step": 0}\nnot json\n{"step": 1}\n')
    with pytest.raises(ValueError, match="line 2"):
        read_metrics(path)


def test_progress_without_a_terminal_writes_one_line_per_step(capsys):
    with Progress(2, enabled=False) as progress:
        progress.start_step(1, total_samples=8)
        progress.add_samples(5)
        progress.add_samples(3)
        progress.end_step(1, {"solver": 0.25, "verifier": 1.0}, 12.44, team=0.5)
    err = capsys.readouterr().err
    assert err == "step 1/2  12.4 s  team 0.500  solver 0.250  verifier 1.000\n"


def test_progress_names_the_agents_without_a_learning_signal(capsys):
    """A step in which an agent did not update says so, naming the agent and why; the run's
    summary names the agents that never updated at all."""
    from flexmarl.launch.summary import summary

    def _summary(metrics, run_dir):
        return summary(types.SimpleNamespace(metrics=metrics, run_dir=run_dir))

    with Progress(1, enabled=False) as progress:
        progress.start_step(0, total_samples=2)
        progress.end_step(0, {"solver": 1.0}, 0.5, ["solver"])
    assert "no learning signal: solver (equal rewards in every group)" in capsys.readouterr().err
    agents = lambda n: {"solver": {"trainable": True, "trained_samples": n},  # noqa: E731
                        "judge": {"trainable": False}}
    quiet = _summary([{"step": 0, "agents": agents(0)}, {"step": 1, "agents": agents(0)}], "R")
    assert "never updated: solver" in quiet and "judge" not in quiet.split("never updated")[1]
    assert "never updated" not in _summary([{"step": 0, "agents": agents(0)},
                                            {"step": 1, "agents": agents(4)}], "R")


def test_progress_bars(capsys):
    with Progress(1, enabled=True) as progress:
        progress.start_step(0, total_samples=4)
        progress.add_samples(4)
        progress.end_step(0, {"ordered_dict": 0.5})  # an agent named like a tqdm keyword
    err = capsys.readouterr().err
    assert "step 0/1" in err and "ordered_dict 0.500" in err


# ------------------------------------------------------------------------------ CLI

def test_cli_dry_run_prints_the_merged_config(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("FLEXMARL_LOG", raising=False)  # main sets it for worker processes
    team_file = write_team(tmp_path)  # the dry run loads the team, as the run does
    path = tmp_path / "exp.toml"
    path.write_text("[pipeline]\ntasks_per_step = 2\n")
    with pytest.raises(SystemExit) as info:
        main(["run", str(path), "--team", team_file, "--set", "rollout.backend=torch",
              "--set", "trainer.betas=[0.9,0.95]", "--dry-run"])
    assert info.value.code == 0
    printed = tomllib.loads(capsys.readouterr().out)
    assert printed["pipeline"]["tasks_per_step"] == 2
    assert printed["rollout"]["backend"] == "torch"
    assert printed["trainer"]["betas"] == [0.9, 0.95]
    assert printed["team"]["path"] == str(Path(team_file).resolve())
    assert not (tmp_path / "runs").exists()  # a dry run makes no run directory


def test_cli_dry_run_shows_what_each_agent_trainer_really_gets(capsys, monkeypatch):
    """trainer.lr is the default for agents without AgentSpec.lr; trainer.seed and
    trainer.temperature are replaced by run.seed and each agent's sampling temperature: the dry
    run says so per agent (as TOML comments, so it still reads back)."""
    monkeypatch.delenv("FLEXMARL_LOG", raising=False)
    with pytest.raises(SystemExit) as info:
        main(["run", "--team", "agents/math_duo.py", "--set", "trainer.lr=3e-4",
              "--set", "run.seed=7", "--dry-run"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert tomllib.loads(out)["trainer"]["lr"] == 3e-4
    solver = next(line for line in out.splitlines() if line.startswith("# solver: "))
    assert "lr = 1e-05 (AgentSpec.lr; [trainer] says 0.0003)" in solver
    assert "seed = 7 (run.seed; [trainer] says 0)" in solver
    assert "temperature = 1.0 (AgentSpec.sampling.temperature" in solver


@pytest.mark.parametrize("argv, expected", [
    (["--set", "pipeline.tasks_per_step=0"], "pipeline.tasks_per_step must be >= 1"),
    (["--set", "pipeline.task_per_step=1"], "Did you mean 'tasks_per_step'?"),
    (["--set", "oops"], "--set expects section.key=value, got 'oops'"),
    (["--team", "missing.py"], "team.path 'missing.py' does not exist"),
])
def test_cli_config_error_exits_2_with_one_message(tmp_path, team_file, capsys, monkeypatch,
                                                   argv, expected):
    monkeypatch.chdir(tmp_path)
    if "--team" not in argv:
        argv = [*argv, "--team", team_file]
    with pytest.raises(SystemExit) as info:
        main(["run", *argv, "--dry-run"])
    assert info.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("flexmarl: config error: ")
    assert expected in lines[0]


def fake_train_modules(monkeypatch, train) -> None:
    """Stand-ins for flexmarl.team, flexmarl.launch.run, flexmarl.launch.task_files and
    flexmarl.launch.model_dirs, which `main` imports when it runs."""
    import flexmarl.launch.checkpoint  # noqa: F401  (what main also imports: loaded with the real
    import flexmarl.orchestrator.orchestrator  # noqa: F401  flexmarl.team, before it is replaced below)
    import flexmarl.launch.workers  # noqa: F401
    import flexmarl.launch.evaluation  # noqa: F401
    import flexmarl.launch.build  # noqa: F401
    import flexmarl.placement.layout  # noqa: F401
    import flexmarl.gateway.api  # noqa: F401
    team = types.SimpleNamespace(name="duo", agents=[types.SimpleNamespace(
        name="solver", trainable=True, train_ranks=None, instances=None)])
    monkeypatch.setitem(sys.modules, "flexmarl.team",
                        types.SimpleNamespace(load_team=lambda path: team))
    monkeypatch.setitem(sys.modules, "flexmarl.launch.run",
                        types.SimpleNamespace(train=train))
    monkeypatch.setitem(sys.modules, "flexmarl.launch.task_files",
                        types.SimpleNamespace(team_with_task_file=lambda team, ref, seed: team))
    monkeypatch.setitem(sys.modules, "flexmarl.launch.model_dirs",
                        types.SimpleNamespace(check_model=lambda spec: spec,
                                              install_line=lambda agents: "install check: -"))
    monkeypatch.delenv("FLEXMARL_LOG", raising=False)


def test_cli_run_makes_the_run_dir_and_prints_a_summary(tmp_path, team_file, capsys,
                                                        monkeypatch):
    async def train(team, config, *, run_dir, on_dashboard=None, **_):
        run_dir.metrics.write({"step": 0, "team_reward": 0.75, "agents": {"solver": 1}})
        return types.SimpleNamespace(metrics=read_metrics(run_dir.path / "metrics.jsonl"),
                                     run_dir=run_dir.path, report=None, final_eval=None)

    fake_train_modules(monkeypatch, train)
    with pytest.raises(SystemExit) as info:
        main(["run", "--team", team_file, "--set", f"run.dir={tmp_path / 'run'}"])
    assert info.value.code == 0
    captured = capsys.readouterr()
    out = captured.out
    assert "flexmarl: done: 1 step in 0 s" in out and "reward   team 0.750" in out
    assert str(tmp_path / "run" / "run.log") in out
    assert "install check" in captured.err and f"run dir {tmp_path / 'run'}" in out
    assert (tmp_path / "run" / "config.toml").is_file()


def test_cli_interrupt_exits_130(tmp_path, team_file, capsys, monkeypatch):
    async def train(team, config, *, run_dir, on_dashboard=None, **_):
        raise KeyboardInterrupt

    fake_train_modules(monkeypatch, train)
    with pytest.raises(SystemExit) as info:
        main(["run", "--team", team_file, "--set", f"run.dir={tmp_path / 'run'}"])
    assert info.value.code == 130
    assert "interrupted" in capsys.readouterr().err


@pytest.mark.parametrize("rollout, train, device, expected", [
    ("auto", "auto", "cpu", ((0, 1), (2, 3))),       # split the cores between the roles
    ("auto", "3", "cpu", ((0, 1, 2), (3,))),         # auto takes what the other leaves
    ("0", "auto", "cpu", ((0,), (1, 2, 3))),
    ("", "auto", "cpu", ((), (2, 3))),               # "" pins nothing
    ("auto", "auto", "cuda", ((), ())),              # trainers on GPU: nothing to split
    ("1,3", "0-2", "cpu", ((1, 3), (0, 1, 2))),      # explicit lists are kept as given
])
def test_role_cpus(monkeypatch, rollout, train, device, expected):
    import flexmarl.checks as config_module
    from flexmarl.placement.cores import role_cpus
    monkeypatch.setattr(config_module, "available_cpus", lambda: [0, 1, 2, 3])
    config = load_config(overrides=[f"rollout.cpus={rollout}", f"trainer_pool.cpus={train}",
                                    f"trainer.device={device}"])
    assert role_cpus(config.rollout.cpus, config.trainer_pool.cpus,
                     config.trainer.device) == expected


def test_role_cpus_single_core_pins_nothing(monkeypatch):
    import flexmarl.checks as config_module
    from flexmarl.placement.cores import role_cpus
    monkeypatch.setattr(config_module, "available_cpus", lambda: [0])
    config = load_config()
    assert role_cpus(config.rollout.cpus, config.trainer_pool.cpus,
                     config.trainer.device) == ((), ())


@pytest.mark.parametrize("overrides, nice, serial", [
    ([], 10, True),                                    # CPU, this machine: both on
    (["trainer.device=cuda"], 0, False),               # GPU trainers share no cores with us
    (["cluster.listen=tcp://127.0.0.1:0"], 0, False),  # trainers on nodes
    (["trainer_pool.nice=3", "trainer_pool.serial=false"], 3, False),
    (["trainer.device=cuda", "trainer_pool.serial=true"], 0, True),
])
def test_trainer_nice_and_serial_resolve(overrides, nice, serial):
    from flexmarl.placement.cores import serial_trainers, trainer_nice, trainers_on_local_cpu
    config = load_config(overrides=overrides)
    local = trainers_on_local_cpu(config.trainer.device, config.cluster.remote)
    assert trainer_nice(config.trainer_pool, local) == nice
    assert serial_trainers(config.trainer_pool, local) is serial


@pytest.mark.parametrize("override, message", [
    ("trainer_pool.nice=20", "trainer_pool.nice must be an int in 0..19"),
    ("trainer_pool.nice=low", "trainer_pool.nice must be an int in 0..19"),
    ("trainer_pool.serial=sometimes", "trainer_pool.serial must be true, false"),
])
def test_trainer_nice_and_serial_refuse_bad_values(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(overrides=[override])


def test_the_auto_rollout_backend_is_vllm_with_gpus_or_nodes_else_torch(monkeypatch, team_file):
    """rollout.backend = "auto" (the default) picks vLLM where rollout gets GPUs, the torch
    engine on a CPU-only machine; a backend named in the config is kept as it is."""
    import torch

    from flexmarl.launch.build import resolve_backend

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    assert load_config(team=team_file).rollout.backend == "auto"
    assert resolve_backend(load_config(team=team_file)).rollout.backend == "torch"
    listen = load_config(overrides=["cluster.listen=tcp://127.0.0.1:5555"], team=team_file)
    assert resolve_backend(listen).rollout.backend == "vllm"
    named = load_config(overrides=["rollout.backend=vllm"], team=team_file)
    assert resolve_backend(named).rollout.backend == "vllm"
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert resolve_backend(load_config(team=team_file)).rollout.backend == "vllm"
    no_gpus = load_config(overrides=["devices.gpus=none"], team=team_file)
    assert resolve_backend(no_gpus).rollout.backend == "torch"


def test_every_pipeline_mode_has_its_policy():
    """pipeline.mode is checked on the config's ground floor; each value must name a policy."""
    from flexmarl.orchestrator.policy import PIPELINES
    assert tuple(PIPELINES) == PIPELINE_MODES
