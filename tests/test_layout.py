"""The house's rules, checked on the source: every module imports, no import cycles, and each
folder of `flexmarl` imports only the folders below it (docs/architecture.md, "The layers").

Imports are read from the source (every `import` statement, also those inside functions and
under TYPE_CHECKING), so a cycle that only a late import hides still counts.
"""
from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("runtime", "flexmarl")
LAYERS = {  # folder (or "leaves": flexmarl's top-level modules) -> rank; higher imports lower
    # (two folders of one rank are peers: neither imports the other)
    "runtime": 0, "protocol": 0.5, "leaves": 1, "config": 1.1, "models": 1.2, "rewards": 1.5,
    "sampling": 1.5, "weights": 1.5, "placement": 1.6, "envs": 1.7, "training": 2,
    "rollout": 2,
    "orchestrator": 4, "observe": 6, "sim": 6, "gateway": 7, "launch": 8}
# config is the ground floor: every section's class, importing only flexmarl.checks and
# runtime.config, so that any part can take its section without pulling the others in.
# What both engines share lives in these leaf folders, not in either side.
SHARED_LEAVES = ("models", "sampling", "weights")
MAX_TOP_LEVEL_MODULES = 8


def _modules() -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            out[name] = path
    return out


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """The project modules `name` imports anywhere in its source."""
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = name.split(".") if is_package else name.split(".")[:-1]
                parent = parent[:len(parent) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            # `from package import module` imports the module; `from module import name`
            # depends on the module.
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base
                       for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in MODULES:  # `import a.b.c` names a.b.c's module
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def _layer(module: str) -> str:
    parts = module.split(".")
    if parts[0] == "runtime":
        return "runtime"
    if len(parts) >= 2 and (ROOT / "flexmarl" / parts[1]).is_dir():
        return parts[1]
    return "leaves"


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_cycle_finder_finds_a_cycle():
    """The check below can fail: a made-up graph with a cycle is reported."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles():
    assert _cycles(GRAPH) == []


def test_folders_import_only_folders_below_them():
    wrong = [f"{m} ({_layer(m)}) imports {t} ({_layer(t)})"
             for m, targets in GRAPH.items() for t in sorted(targets)
             if _layer(m) != _layer(t) and LAYERS[_layer(t)] >= LAYERS[_layer(m)]]
    assert wrong == [], "\n".join(wrong)


@pytest.mark.parametrize("side, other", [("rollout", "training"), ("training", "rollout")])
def test_rollout_and_training_are_peers(side, other):
    """Neither side imports the other; both may import the shared leaves and runtime."""
    assert LAYERS[side] == LAYERS[other]
    wrong = [f"{m} imports {t}" for m, targets in GRAPH.items() if _layer(m) == side
             for t in sorted(targets) if _layer(t) == other]
    assert wrong == [], "\n".join(wrong)
    # placement: the time-share arbiter both pools are handed (a leaf of pure asyncio).
    allowed = {"runtime", "protocol", "leaves", "config", "placement", *SHARED_LEAVES, side}
    outside = [f"{m} imports {t}" for m, targets in GRAPH.items() if _layer(m) == side
               for t in sorted(targets) if _layer(t) not in allowed]
    assert outside == [], "\n".join(outside)


def test_config_imports_only_the_checks_and_the_runtimes_config():
    """In the source: flexmarl.config's modules import each other, flexmarl.checks and
    runtime.config, flexmarl.team's LoraSpec (trainer.lora is checked as AgentSpec.lora is)
    and flexmarl._compat (old names), nothing else of the project."""
    allowed = {"flexmarl.checks", "runtime.config", "flexmarl.team", "flexmarl._compat",
               "flexmarl"}
    wrong = [f"{m} imports {t}" for m, targets in GRAPH.items() if _layer(m) == "config"
             for t in sorted(targets) if _layer(t) != "config" and t not in allowed]
    assert wrong == [], "\n".join(wrong)


def test_importing_the_config_loads_no_engine():
    """At run time: `import flexmarl.config` loads no ZeroMQ, no pool, no orchestrator, no
    transformers (in a fresh interpreter; flexmarl's own face brings torch for its protocol)."""
    import subprocess
    import sys
    code = ("import sys, flexmarl.config\nprint(' '.join(sorted(m for m in sys.modules if "
            "m.split('.')[0] in ('zmq', 'transformers', 'vllm') or m.startswith(("
            "'flexmarl.orchestrator', 'flexmarl.rollout', 'flexmarl.training', "
            "'runtime.transport')))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, check=True).stdout.strip()
    assert out == "", out


def test_placement_is_a_leaf():
    """flexmarl.placement decides where things run and starts nothing: it imports the config,
    flexmarl.checks, flexmarl.team, flexmarl.clock and the compatibility aliases, no process,
    pool, engine or weight code (and runtime/ not at all)."""
    allowed = {"config", "placement"}
    allowed_leaves = {"flexmarl.checks", "flexmarl.team", "flexmarl.clock", "flexmarl._compat",
                      "flexmarl"}
    wrong = [f"{m} imports {t}" for m, targets in GRAPH.items() if _layer(m) == "placement"
             for t in sorted(targets) if _layer(t) not in allowed and t not in allowed_leaves]
    assert wrong == [], "\n".join(wrong)


def test_every_folder_is_a_known_layer():
    folders = {p.name for p in (ROOT / "flexmarl").iterdir()
               if p.is_dir() and (p / "__init__.py").exists()}
    assert folders == set(LAYERS) - {"runtime", "leaves"}


def test_few_modules_at_the_top_level():
    top = sorted(p.name for p in (ROOT / "flexmarl").glob("*.py"))
    assert len(top) <= MAX_TOP_LEVEL_MODULES, top


@pytest.mark.parametrize("module", sorted(MODULES))
def test_every_module_imports(module):
    importlib.import_module(module)
