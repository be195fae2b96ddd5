"""Shared test setup: every async test runs on uvloop, as the entry points do.

Tests that need vLLM are marked `vllm` (and so is every user of the `vllm_instance` fixture):
they are skipped where vLLM is not installed, fail where it is installed but does not import,
and get a timeout past an engine's cold start (VLLM_TEST_TIMEOUT_S).
"""
from __future__ import annotations

import os

# Ray reads its authentication mode once, when it is first imported (by whichever module does):
# token authentication, Ray's default for the clusters it starts itself, for the Ray cluster of
# tests/test_ray.py and for this process as the driver of its runs.
os.environ.setdefault("RAY_AUTH_MODE", "token")

import pytest
import pytest_asyncio
import uvloop

from runtime.supervisor import pid_alive

# The shared helpers' asserts (tests/helpers/) explain a failure as a test module's do: rewritten
# by pytest, which must hear of them before they are first imported.
pytest.register_assert_rewrite("tests.helpers")

from tests.helpers.lanes import starts_processes  # noqa: E402
from tests.helpers.vllm import VLLM_READY_TIMEOUT_S, VLLM_TEST_TIMEOUT_S, require_vllm  # noqa: E402


def pytest_asyncio_loop_factories(config, item):
    return {"uvloop": uvloop.new_event_loop}


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


@pytest.fixture(scope="session", autouse=True)
def sandbox_on_this_machine():
    """Code rewards refuse to run without bubblewrap unless the unsafe fallback is chosen: where
    bwrap cannot run here, the suite's own programs (and the processes it starts) run on the
    fallback, said once. tests/test_isolation.py checks the refusal with the choice undone."""
    from flexmarl.rewards import confinement

    found = confinement.isolation()
    if found.mechanism != "bwrap" and confinement.UNSAFE_ENV not in os.environ:
        print(f"\nbubblewrap is not in force here ({found.missing}); the suite's programs run "
              f"on the unsafe fallback ({confinement.UNSAFE_ENV}=1)")
        os.environ[confinement.UNSAFE_ENV] = "1"
    yield


def pytest_runtest_setup(item):
    # A plain hook: after pytest's skip marks (a `cuda` test on a CPU machine stays a skip),
    # before the test's fixtures start anything.
    if item.get_closest_marker("vllm"):
        require_vllm()


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

@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> str:
    """A randomly initialised "tiny" model directory, built once per session."""
    from flexmarl.models import build_model_dir
    return str(build_model_dir("tiny", tmp_path_factory.mktemp("models") / "tiny", seed=0))


@pytest.fixture(scope="session")
def fault_free(tiny_model_dir, tmp_path_factory):
    """tests/test_faults.py's run without a fault (tests/helpers/faults.py), once per session:
    its fault tests and tests/test_ray.py's compare with it."""
    from tests.helpers.faults import fault_free_run
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
