"""The quick lane's marker: whether a test module starts processes, read from its source and
from the tests/ helper modules it imports (tests/conftest.py marks such a module's tests
`processes`; `make test-quick` leaves them out)."""
from __future__ import annotations

import ast
import os
import re

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
"""The suite's folder, tests/: `tests.x.y` names TESTS/x/y.py."""

# What starts a process (a worker, an engine, a sandboxed program, a CLI, a node) when a test
# module names it: such a module's tests are marked `processes`, and `make test-quick` leaves
# them out. Read from the module's source and from the tests/ helpers it imports.
PROCESS_APIS = re.compile(
    r"subprocess|create_subprocess|Popen|multiprocessing|\bspawn|run_python|code_reward|"
    r"vllm_instance|fault_free|Lifecycle|NodeRegistry|\bstart_worker\b|flexmarl\.launch|"
    r"import train\b|\bray\b|supervisor_host|from \.(helpers\.)?workers|"
    r"tests\.(helpers\.)?workers|torch\.distributed")
_STARTS_PROCESSES: dict[str, bool] = {}


def starts_processes(path: str) -> bool:
    """Whether the test module at `path` (or a tests/ helper module it imports, directly or
    through another helper) names a process API."""
    if path not in _STARTS_PROCESSES:
        text = ""
        for module in _with_helpers(os.path.abspath(path)):
            with open(module, encoding="utf-8") as f:
                text += f.read()
        _STARTS_PROCESSES[path] = PROCESS_APIS.search(text) is not None
    return _STARTS_PROCESSES[path]


def _with_helpers(path: str) -> list[str]:
    """`path` and every tests/ module it imports (relative `from .x import`, `from .helpers
    import x`, or absolute `tests.helpers.x`), transitively; modules only, not packages."""
    seen, todo = [], [path]
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.append(module)
        todo += [m for m in helper_imports(module) if m not in seen]
    return seen


def helper_imports(path: str) -> list[str]:
    """The files of the tests/ modules that the module at `path` imports: a relative import
    resolves beside it, an absolute `tests.` one under TESTS; each a module file that exists
    (a package, its __init__.py, is not followed)."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    here, out = os.path.dirname(path), []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            dotted = [(os.path.dirname(TESTS), a.name.split(".")) for a in node.names
                      if a.name.split(".")[0] == "tests"]
        elif isinstance(node, ast.ImportFrom):
            parts = node.module.split(".") if node.module else []
            if node.level:
                base = here
                for _ in range(node.level - 1):
                    base = os.path.dirname(base)
            elif parts[:1] == ["tests"]:
                base = os.path.dirname(TESTS)
            else:
                continue
            dotted = [(base, parts)] + [(base, [*parts, a.name]) for a in node.names]
        else:
            continue
        for base, names in dotted:
            file = os.path.join(base, *names) + ".py"
            if names and os.path.isfile(file) and file not in out:
                out.append(file)
    return out
