"""The suite's own helpers (tests/conftest.py): a test marked `vllm` is skipped only where vLLM
is not installed; where it is installed but does not import (a missing dependency), the test
fails instead of being skipped."""
from __future__ import annotations

import importlib.util
import sys

import pytest

from tests.conftest import VLLM_READY_TIMEOUT_S, VLLM_TEST_TIMEOUT_S, require_vllm


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
    """The quick lane's marker (tests/conftest.py starts_processes): a module that names a process
    API, directly or through a tests/ helper it imports, is marked; a pure one is not."""
    from tests.conftest import starts_processes

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
