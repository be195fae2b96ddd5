"""The public surface, pinned: what users import keeps working when the code moves.

- Each package face (`flexmarl`, `flexmarl.config`, `flexmarl.gateway`, `flexmarl.rewards`)
  exports exactly the names listed here, and each of them imports. Changing a face is a
  decision: update the list here and say so in the change.
- What the README, docs/ and the example teams import (besides the faces) still imports.
- Old paths (before the restructuring into folders) still import, with a FutureWarning, and
  give the very same objects as the new ones, until FlexMARL 0.2.
"""
from __future__ import annotations

import importlib
import sys
import warnings

import pytest

FACES = {
    "flexmarl": {
        "AgentSpec", "Completion", "Config", "ConfigError", "LoraSpec", "RunResult", "SamplingParams",
        "Team", "load_config", "load_team", "train"},
    "flexmarl.config": {
        "BalancerConfig", "ClusterConfig", "Config", "ConfigError", "DevicesConfig",
        "EvalConfig", "GatewayConfig", "ObserveConfig", "PipelineConfig", "PlanConfig",
        "RolloutConfig", "RunConfig", "SECTIONS", "SupervisorConfig", "TeamRef",
        "TrainerConfig", "TrainerPoolConfig", "TransportConfig", "dump_toml", "load_config"},
    "flexmarl.gateway": {
        "ApiError", "EpisodeExpired", "Gateway", "GatewayConfig", "Slot", "gateway_team"},
    "flexmarl.rewards": {
        "CAUSES", "HOW", "MATH_TAIL_CHARS", "MAX_BOX_BYTES", "MAX_REPLY_BYTES", "CallCase",
        "ExecResult", "IOCase", "Isolation", "LoopBound", "SandboxUnavailable",
        "allow_unsafe_sandbox", "bounded", "code_reward", "exact_match", "extract_answer",
        "extract_code", "format_reward", "isolation", "math_equal", "max_concurrent",
        "network_isolated", "numeric_match", "run_python", "score_all", "set_interpreter",
        "set_max_concurrent"},
}

DOCUMENTED = {  # module -> names the README, agents/ and docs/ import from it
    "flexmarl.tasks": {"addition_tasks", "exact_match", "load_tasks"},
    "flexmarl.models": {"ensure_model", "load_tokenizer", "chat_prompt"},
    "flexmarl.protocol": {"Generate", "SamplingParams"},
    "flexmarl.team": {"load_team"},
    "flexmarl.sim.cluster": {"compare", "simulate"},
    "flexmarl.sim.team_plan": set(),
    "runtime.actor": {"Actor", "handler"},
    "runtime.protocol": {"Tensors"},
    "runtime.transport": {"connect"},
    "runtime.supervisor": {"Supervisor", "WorkerSpec"},
}

ENTRY_POINTS = [  # pyproject's console scripts, and the worker entries the docs name
    "flexmarl.launch.cli:main", "flexmarl.launch.nodes:main",
    "flexmarl.rollout.worker:rollout_worker", "flexmarl.training.worker:trainer_worker"]

OLD_MODULES = {  # old path -> new path, and a name users took from it
    "flexmarl.run": ("flexmarl.launch.run", "train"),
    "flexmarl.sections": ("flexmarl.config.sections", "GatewayConfig"),
    "flexmarl.rundir": ("flexmarl.observe.rundir", "RunDir"),
    "flexmarl.openai_api": ("flexmarl.gateway.api", "ApiError"),
    "flexmarl.cli": ("flexmarl.launch.cli", "main"),
    "flexmarl.nodes": ("flexmarl.launch.nodes", "main"),
    "flexmarl.training.trainer_config": ("flexmarl.config.training", "TrainerConfig"),
    "flexmarl.training.pool_config": ("flexmarl.config.training", "TrainerPoolConfig"),
    "flexmarl.rollout.balance.config": ("flexmarl.config.balance", "BalancerConfig"),
    "flexmarl.launch.devices": ("flexmarl.placement.devices", "Host"),
    "flexmarl.launch.layout": ("flexmarl.placement.layout", "slot_layout"),
    "flexmarl.launch.lora_units": ("flexmarl.placement.lora_units", "lora_units"),
    "flexmarl.orchestrator.timeshare": ("flexmarl.placement.timeshare", "TimeShare"),
    "flexmarl.rollout.balance.planner": ("flexmarl.rollout.balance.moves", "Move"),
}


@pytest.mark.parametrize("face", sorted(FACES))
def test_each_face_exports_exactly_its_public_names(face):
    module = importlib.import_module(face)
    assert set(module.__all__) == FACES[face]
    assert len(module.__all__) == len(set(module.__all__))  # no name listed twice
    for name in module.__all__:
        assert getattr(module, name) is not None, name


@pytest.mark.parametrize("face", sorted(FACES))
def test_star_import_of_each_face_gives_its_names(face):
    namespace: dict = {}
    exec(f"from {face} import *", namespace)
    assert FACES[face] <= set(namespace)


def test_the_faces_give_the_objects_of_the_modules_that_define_them():
    import flexmarl
    import flexmarl.config
    import flexmarl.gateway
    from flexmarl.config import load, sections
    from flexmarl.gateway import backend
    from flexmarl.launch import run

    assert flexmarl.train is run.train and flexmarl.Config is load.Config
    assert flexmarl.config.RunConfig is sections.RunConfig
    assert flexmarl.config.SECTIONS["trainer_pool"] is flexmarl.config.TrainerPoolConfig
    assert flexmarl.gateway.gateway_team is backend.gateway_team
    assert flexmarl.gateway.GatewayConfig is flexmarl.config.GatewayConfig


@pytest.mark.parametrize("module", sorted(DOCUMENTED))
def test_what_the_readme_imports_imports(module):
    imported = importlib.import_module(module)
    for name in DOCUMENTED[module]:
        assert hasattr(imported, name), f"{module}.{name}"


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_entry_points_resolve(entry):
    module, _, function = entry.partition(":")
    assert callable(getattr(importlib.import_module(module), function))


def test_a_team_file_of_the_first_gateway_release_still_loads():
    """agents/openai_duo.py as it was written then: `from flexmarl.gateway import gateway_team`
    (flexmarl/gateway.py was one module; it is a package now, and this is its face)."""
    importlib.import_module("flexmarl.gateway")  # its dependencies' own first-import warnings
    namespace: dict = {}
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)  # the face is the public path: no warning
        exec("from flexmarl import AgentSpec\n"
             "from flexmarl.gateway import gateway_team\n"
             "team = gateway_team('t', [AgentSpec(name='a', model='tiny')])\n", namespace)
    assert namespace["team"].name == "t" and [a.name for a in namespace["team"].agents] == ["a"]


@pytest.mark.parametrize("old", sorted(OLD_MODULES))
def test_an_old_module_path_imports_the_new_module_with_a_future_warning(old, monkeypatch):
    new, name = OLD_MODULES[old]
    monkeypatch.delitem(sys.modules, old, raising=False)  # as in a fresh process
    with pytest.warns(FutureWarning, match=rf"{old} moved to {new}.*removed in FlexMARL 0\.2"):
        module = importlib.import_module(old)
    assert module is importlib.import_module(new)
    monkeypatch.delitem(sys.modules, old)
    with pytest.warns(FutureWarning):
        namespace: dict = {}
        exec(f"from {old} import {name}", namespace)
    assert namespace[name] is getattr(importlib.import_module(new), name)


def test_the_moved_table_is_the_one_pinned_here():
    import flexmarl
    assert flexmarl.MOVED == {old: new for old, (new, _) in OLD_MODULES.items()}


@pytest.mark.parametrize("module, old, new", [
    ("flexmarl.placement.devices", "DevicePlan", "DevicePlacement"),
    ("flexmarl.placement.layout", "GpuPlan", "GpuPlacement"),
    ("flexmarl.rollout.balance.moves", "MovePlanner", "MoveChooser")])
def test_a_class_renamed_off_the_word_plan_still_resolves_with_a_future_warning(module, old, new):
    """"plan" is the simulator's word only (flexmarl.placement's docstring): the old names
    resolve until REMOVED_IN."""
    imported = importlib.import_module(module)
    with pytest.warns(FutureWarning, match=rf"{old} is now .*{new}.*0\.2"):
        assert getattr(imported, old) is getattr(imported, new)


def test_a_renamed_config_class_is_read_with_a_future_warning():
    import flexmarl.config
    with pytest.warns(FutureWarning, match=r"TrainPlacement is now .*TrainerPoolConfig.*0\.2"):
        old = flexmarl.config.TrainPlacement
    assert old is flexmarl.config.TrainerPoolConfig
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        flexmarl.config.Nope  # noqa: B018


def test_a_module_that_never_existed_is_still_an_import_error():
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("flexmarl.no_such_module")


def test_the_cli_config_and_planner_import_without_transformers():
    """`flexmarl report`, `plan`, `sim` and `--help` answer without importing transformers
    (about 3 s of every command here): the config, the CLI and the planner reach the model code
    only when a run needs it. Checked in a fresh interpreter, since this one has it loaded."""
    import subprocess
    code = ("import sys, flexmarl.launch.cli, flexmarl.config, flexmarl.sim.team_plan, "
            "flexmarl.observe.report\nprint(sorted(m for m in sys.modules "
            "if m.split('.')[0] in ('transformers', 'vllm')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=True)
    assert done.stdout.strip() == "[]", done.stdout


def test_compatibility_aliases_are_removed_in_their_version():
    """flexmarl/_compat.py holds every alias (old module paths, class and section names), each
    to be removed in REMOVED_IN: once the version gets there, this fails until they are."""
    import flexmarl
    from flexmarl import _compat

    def version(text: str) -> tuple[int, ...]:
        return tuple(int(part) for part in text.split(".")[:2])

    assert version(flexmarl.__version__) < version(_compat.REMOVED_IN), (
        f"FlexMARL {flexmarl.__version__} reached {_compat.REMOVED_IN}: remove the aliases of "
        "flexmarl/_compat.py (and their mentions in the docs)")
    assert _compat.MOVED is flexmarl.MOVED

