"""Shared test setup: every async test runs on uvloop, as the entry points do."""
from __future__ import annotations

import os

import pytest
import uvloop

from runtime.supervisor import pid_alive


def pytest_asyncio_loop_factories(config, item):
    return {"uvloop": uvloop.new_event_loop}


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
