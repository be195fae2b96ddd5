"""The sandbox tests' isolations: `where`, each test once under bubblewrap (skipped where it
cannot run) and once on the unsafe audit-hook fallback (opted into for that test only)."""
from __future__ import annotations

import pytest

from flexmarl.rewards import confinement


@pytest.fixture(params=["bwrap", "fallback"])
def where(request, monkeypatch):
    """"bwrap" or "fallback", with the confinement's state fresh for the test (its probes,
    interpreter and the unsafe opt-in are undone after it)."""
    monkeypatch.setattr(confinement, "_state", {})
    if request.param == "fallback":
        monkeypatch.setattr(confinement, "_candidates", lambda: [])
        confinement.allow_unsafe_sandbox(True)  # in the fresh _state: undone with it
    elif confinement.isolation().mechanism != "bwrap":
        pytest.skip(f"bubblewrap is not in force here: {confinement.isolation().missing}")
    return request.param
