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
