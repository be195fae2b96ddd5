"""The suite's own rules and helpers.

- vLLM (tests/helpers/vllm.py, used by tests/conftest.py): a test marked `vllm` is skipped only
  where vLLM is not installed; where it is installed but does not import (a missing
  dependency), the test fails instead of being skipped.
- The quick lane's marker (tests/helpers/lanes.py): a module that names a process API, itself
  or through a tests/ helper module it imports, is marked `processes`.
- Shared code lives in tests/helpers/ (its __init__ docstring names each module): no module of
  the suite imports a test module (test_*.py) or conftest.py, and none edits sys.path directly
  (sys.path.insert/append/..., an assignment to sys.path or to an item of it, `del`). A test
  that needs a module importable from a folder of its own uses pytest's
  `monkeypatch.syspath_prepend`, which the rule allows: scoped to the test and undone after it.
  A Python process a test starts gets the repository on its path from its working directory
  (`python -m ...` run from the repository root) or from PYTHONPATH in its environment, not
  from a sys.path edit in its script.
"""
from __future__ import annotations

import ast
import importlib.util
import re
import sys
from pathlib import Path

import pytest

from tests.helpers.lanes import starts_processes
from tests.helpers.vllm import VLLM_READY_TIMEOUT_S, VLLM_TEST_TIMEOUT_S, require_vllm

TESTS = Path(__file__).resolve().parent
SYS_PATH_EDITS = {"insert", "append", "extend", "remove", "pop", "clear", "reverse", "sort",
                  "__setitem__", "__delitem__", "__iadd__"}
"""Methods of sys.path that change it in place."""


def test_a_missing_vllm_is_a_skip(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "vllm" else real(name, *a))
    with pytest.raises(pytest.skip.Exception, match="vLLM is not installed"):
        require_vllm()


def test_an_installed_vllm_that_does_not_import_is_a_failure(tmp_path, monkeypatch):
    broken = tmp_path / "vllm"
    broken.mkdir()
    (broken / "__init__.py").write_text('raise ImportError("No module named a_dependency")\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "vllm", raising=False)  # restored afterwards
    with pytest.raises(ImportError, match="a_dependency"):
        require_vllm()


def test_a_vllm_test_outlasts_an_engines_start():
    assert VLLM_TEST_TIMEOUT_S > VLLM_READY_TIMEOUT_S


def test_modules_that_start_processes_are_marked_and_pure_ones_are_not(tmp_path):
    """The quick lane's marker (tests/helpers/lanes.py starts_processes, which tests/conftest.py
    applies): a module that names a process API, directly or through a tests/ helper it
    imports, is marked; a pure one is not."""
    (tmp_path / "helper.py").write_text("import subprocess\n")
    cases = {"test_pure.py": "def test_x():\n    assert 1 + 1 == 2\n",
             "test_direct.py": "import subprocess\n",
             "test_sandboxed.py": "from flexmarl.rewards import run_python\n",
             "test_through_helper.py": "from .helper import thing\n"}
    for name, text in cases.items():
        (tmp_path / name).write_text(text)
    marked = {name: starts_processes(str(tmp_path / name)) for name in cases}
    assert marked == {"test_pure.py": False, "test_direct.py": True, "test_sandboxed.py": True,
                      "test_through_helper.py": True}
    here = __import__("pathlib").Path(__file__).parent
    assert starts_processes(str(here / "test_sandbox.py"))
    assert not starts_processes(str(here / "test_slot_allocator.py"))


def test_the_marker_follows_the_helper_modules_a_test_imports(tmp_path):
    """tests/helpers/ modules, imported relatively (`from .helpers.x import`, `from .helpers
    import x`) or absolutely (`tests.helpers.x`), and the helpers they import in turn; a helper
    package's __init__ is not read, and a pure helper leaves its importer unmarked."""
    helpers = tmp_path / "helpers"
    helpers.mkdir()
    (helpers / "__init__.py").write_text('"""import subprocess: a docstring, not read"""\n')
    (helpers / "runner.py").write_text("import subprocess\n")
    (helpers / "wrapper.py").write_text("from .runner import go\n")
    (helpers / "pure.py").write_text("X = 1\n")
    cases = {"test_module.py": "from .helpers.runner import go\n",
             "test_names.py": "from .helpers import pure, runner\n",
             "test_in_a_function.py": "def test_x():\n    from .helpers.runner import go\n",
             "test_transitive.py": "from .helpers.wrapper import go\n",
             "test_pure_helper.py": "from .helpers.pure import X\nfrom .helpers import pure\n",
             "test_package.py": "from . import helpers\n",
             "test_workers.py": "from tests.helpers.workers import Echo\n",
             "test_faults.py": "from tests.helpers import faults\n",
             "test_numerics.py": "import tests.helpers.numerics\n",
             "test_balancing.py": "from tests.helpers.balancing import checks\n"}
    for name, text in cases.items():
        (tmp_path / name).write_text(text)
    marked = {name: starts_processes(str(tmp_path / name)) for name in cases}
    assert marked == {"test_module.py": True, "test_names.py": True, "test_in_a_function.py": True,
                      "test_transitive.py": True, "test_pure_helper.py": False,
                      "test_package.py": False, "test_workers.py": True, "test_faults.py": True,
                      "test_numerics.py": False, "test_balancing.py": False}


# ----------------------------------------------------------------------------- shared code

def _names_a_test_module(name: str) -> bool:
    """Whether the module name is a test module (test_*) or conftest of the suite: under
    `tests.` or relative, any part; otherwise (found through a sys.path entry) its first."""
    parts = name.lstrip(".").split(".")
    if not name.startswith(".") and parts[0] != "tests":
        parts = parts[:1]
    return any(p.startswith("test_") or p == "conftest" for p in parts)


def _imported_modules(node: ast.AST) -> list[str]:
    """The module each import statement names, relative ones with their dots (.x, ..x.y)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    dots = "." * node.level
    if node.module is None:  # from . import x, y
        return [dots + a.name for a in node.names]
    if node.module == "tests" and not node.level:  # from tests import x
        return [f"tests.{a.name}" for a in node.names]
    return [dots + node.module]


def _sys_path_aliases(tree: ast.AST) -> tuple[set[str], set[str]]:
    """Names bound to the sys module (`import sys as s`) and to sys.path (`from sys import
    path`) anywhere in the module."""
    modules, paths = {"sys"}, set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules |= {a.asname for a in node.names if a.name == "sys" and a.asname}
        elif isinstance(node, ast.ImportFrom) and node.module == "sys" and not node.level:
            paths |= {a.asname or a.name for a in node.names if a.name == "path"}
    return modules, paths


def _sys_path_edit(node: ast.AST, modules: set[str], paths: set[str]) -> str | None:
    """How `node` edits sys.path in place or rebinds it, else None."""
    def is_sys_path(expr: ast.AST) -> bool:
        if isinstance(expr, ast.Name):
            return expr.id in paths
        return (isinstance(expr, ast.Attribute) and expr.attr == "path"
                and isinstance(expr.value, ast.Name) and expr.value.id in modules)

    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
            and node.func.attr in SYS_PATH_EDITS and is_sys_path(node.func.value):
        return f"sys.path.{node.func.attr}()"
    if isinstance(node, (ast.Assign, ast.Delete)):
        targets = node.targets
    elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
        targets = [node.target]
    else:
        return None
    for target in targets:
        if is_sys_path(target) or (isinstance(target, ast.Subscript)
                                   and is_sys_path(target.value)):
            return f"{type(node).__name__} to sys.path"
    return None


def suite_problems(tests: Path) -> list[str]:
    """What breaks the shared-code rule in the .py files under `tests` (the suite's folder), one
    line each, "FILE:LINE: what": an import of a test module or of conftest (tests.test_x,
    tests.conftest, .test_x, `from . import test_x`, or test_x found through a sys.path entry),
    and any direct edit of sys.path (a string that a subprocess runs is not code here)."""
    problems = []
    for path in sorted(tests.rglob("*.py")):
        where = path.relative_to(tests.parent).as_posix()
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        modules, paths = _sys_path_aliases(tree)
        found = []
        for node in ast.walk(tree):
            for name in _imported_modules(node):
                if _names_a_test_module(name):
                    found.append((node.lineno, f"imports the test module {name}: move what "
                                               "it shares to tests/helpers/"))
            edit = _sys_path_edit(node, modules, paths)
            if edit:
                found.append((node.lineno, f"edits sys.path ({edit}): import from "
                                           "tests.helpers, use monkeypatch.syspath_prepend in "
                                           "a test, or the working directory / PYTHONPATH of a "
                                           "subprocess"))
        problems += [f"{where}:{line}: {what}" for line, what in sorted(found, key=lambda f: f[0])]
    return problems


def test_no_test_module_imports_another_or_edits_sys_path():
    problems = suite_problems(TESTS)
    assert not problems, "\n".join(problems)


def test_the_shared_code_rule_can_fail(tmp_path):
    """The same checker on a synthetic suite: each way of importing a test module or of
    editing sys.path is named with its file and line; helpers, monkeypatch.syspath_prepend,
    reading sys.path and a sys.path edit inside a script string are not."""
    tests = tmp_path / "tests"
    (tests / "helpers").mkdir(parents=True)
    files = {
        "conftest.py": "from tests.helpers.vllm import require_vllm\n",
        "helpers/__init__.py": "",
        "helpers/teams.py": "import sys\nfound = [p for p in sys.path if p]\n",
        "helpers/bad.py": "from tests.test_a import duo\n",
        "test_a.py": ("import sys\n"
                      "from tests.helpers.teams import found\n"
                      "from .helpers import teams\n"
                      "SCRIPT = 'import sys\\nsys.path.insert(0, \"x\")'\n"
                      "def test_ok(monkeypatch):\n"
                      "    monkeypatch.syspath_prepend('x')\n"
                      "    assert sys.path\n"),
        "test_b.py": ("from tests.test_a import found\n"
                      "from tests.conftest import require_vllm\n"
                      "from .test_a import SCRIPT\n"
                      "from . import test_a, conftest\n"
                      "import tests.test_a\n"
                      "from tests import test_a as a\n"
                      "from test_a import SCRIPT as again\n"),
        "test_c.py": ("import sys\n"
                      "import sys as _sys\n"
                      "from sys import path\n"
                      "sys.path.insert(0, 'x')\n"
                      "def test_x():\n"
                      "    _sys.path.append('y')\n"
                      "    path.extend(['z'])\n"
                      "    sys.path[:0] = ['w']\n"
                      "    sys.path = ['v']\n"
                      "    sys.path += ['u']\n"
                      "    del sys.path[0]\n"),
    }
    for name, text in files.items():
        (tests / name).write_text(text)
    problems = [re.match(r"\S+?:\d+: (imports the test module [\w.]+|edits sys\.path)", p)[0]
                for p in suite_problems(tests)]
    assert problems == [
        "tests/helpers/bad.py:1: imports the test module tests.test_a",
        "tests/test_b.py:1: imports the test module tests.test_a",
        "tests/test_b.py:2: imports the test module tests.conftest",
        "tests/test_b.py:3: imports the test module .test_a",
        "tests/test_b.py:4: imports the test module .test_a",
        "tests/test_b.py:4: imports the test module .conftest",
        "tests/test_b.py:5: imports the test module tests.test_a",
        "tests/test_b.py:6: imports the test module tests.test_a",
        "tests/test_b.py:7: imports the test module test_a",
        "tests/test_c.py:4: edits sys.path",
        "tests/test_c.py:6: edits sys.path",
        "tests/test_c.py:7: edits sys.path",
        "tests/test_c.py:8: edits sys.path",
        "tests/test_c.py:9: edits sys.path",
        "tests/test_c.py:10: edits sys.path",
        "tests/test_c.py:11: edits sys.path"]


def test_the_helpers_package_names_each_of_its_modules():
    """tests/helpers/__init__.py's docstring is the map of the shared code: every module of the
    folder is named there, and every name there is a module of it."""
    helpers = TESTS / "helpers"
    doc = ast.get_docstring(ast.parse((helpers / "__init__.py").read_text(encoding="utf-8")))
    modules = {p.name for p in helpers.glob("*.py") if p.name != "__init__.py"}
    named = set(re.findall(r"(?<![\w/.])(\w+\.py)\b", doc or ""))
    assert modules - named == set(), "add a line for each to tests/helpers/__init__.py"
    assert named - modules == set(), "tests/helpers/__init__.py names modules that are gone"
