"""runtime.lifecycle: whose each worker process is, its death, its replacement, on fake respawn
callbacks (no process, no socket)."""
from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest

from runtime.config import SupervisorConfig
from runtime.lifecycle import Lifecycle, ReplaceFailed, watch


class FakeRespawn:
    """Fails its first `failures` calls, then starts processes named NEW-1, NEW-2, ..."""

    def __init__(self, failures: int = 0, ranks: int = 1) -> None:
        self.failures, self.ranks, self.calls = failures, ranks, []

    async def __call__(self, serves: str, old: list[str]):
        self.calls.append((serves, old))
        if len(self.calls) <= self.failures:
            raise RuntimeError(f"start {len(self.calls)} failed")
        n = len(self.calls)
        return [f"new-{n}-{r}" for r in range(self.ranks)], f"conn-{n}"


async def ready(names, conn) -> dict:
    return {"workers": names, "conn": conn}


async def test_a_dead_slot_is_replaced_on_the_first_try():
    respawn = FakeRespawn(ranks=2)
    life = Lifecycle(respawn, owners={"s0-0": "s0", "s0-1": "s0", "s1-0": "s1"}, groups=True)
    old = life.died("s0", "s0-0 exited")
    assert old == ["s0-0", "s0-1"] and life.owner("s0-1") is None  # their deaths are this one
    record = await life.replace("s0", "s0", old, ready)
    assert respawn.calls == [("s0", ["s0-0", "s0-1"])]
    assert record["workers"] == ["new-1-0", "new-1-1"] and record["seconds"] >= 0
    assert life.owners == {"s1-0": "s1", "new-1-0": "s0", "new-1-1": "s0"}
    assert (life.deaths, life.replacements, life.failed_replacements) == (1, [record], 0)
    assert life.dead == {"s0": "s0-0 exited"}


async def test_a_dead_instance_is_replaced_after_two_failed_starts():
    """An instance is its own owner: its replacement is a new instance, owning itself."""
    respawn = FakeRespawn(failures=2)
    life = Lifecycle(respawn, owners={"r0": "r0", "r1": "r1"})
    assert life.died("r0", "exited") == ["r0"]
    record = await life.replace("r0", "agent-a", ["r0"], ready)
    assert len(respawn.calls) == 3 and all(c == ("agent-a", ["r0"]) for c in respawn.calls)
    assert record["workers"] == ["new-3-0"] and life.owners == {"r1": "r1", "new-3-0": "new-3-0"}
    assert life.failed_replacements == 2 and len(life.replacements) == 1


async def test_a_failing_ready_is_a_failed_attempt_too():
    calls = []

    async def flaky(names, conn):
        calls.append(names)
        if len(calls) == 1:
            raise ConnectionError("weights did not load")
        return {}

    life = Lifecycle(FakeRespawn(), owners={"r0": "r0"})
    life.died("r0", "exited")
    await life.replace("r0", "a", ["r0"], flaky)
    assert calls == [["new-1-0"], ["new-2-0"]] and life.failed_replacements == 1
    assert "new-1-0" not in life.owners and "new-2-0" in life.owners


async def test_it_gives_up_after_the_attempts_naming_the_setting():
    assert SupervisorConfig().replace_attempts == Lifecycle().attempts == 3
    respawn = FakeRespawn(failures=10)
    life = Lifecycle(respawn, owners={"s0-0": "s0"}, groups=True, attempts=4, kind="trainer slot")
    life.died("s0", "exited")
    with pytest.raises(ReplaceFailed, match=r"trainer slot s0 died and no replacement started "
                       r"\(4 attempts; raise supervisor.replace_attempts .*start 4 failed"):
        await life.replace("s0", "s0", ["s0-0"], ready)
    assert len(respawn.calls) == 4 and life.failed_replacements == 4
    assert life.replacements == [] and life.owners == {}


def test_the_setting_is_validated():
    for bad in (0, -1, 1.5):
        with pytest.raises(ValueError, match="supervisor.replace_attempts"):
            SupervisorConfig(replace_attempts=bad)


@dataclass
class Died:
    name: str
    reason: str = "exited"
    returncode: int | None = -9


async def test_deaths_are_routed_to_the_owner_and_an_already_replaced_one_is_ignored():
    rollout = Lifecycle(FakeRespawn(), owners={"r0": "r0"})
    trainers = Lifecycle(FakeRespawn(), owners={"t0-0": "t0", "t0-1": "t0"}, groups=True)
    seen = []
    events: asyncio.Queue = asyncio.Queue()
    watcher = asyncio.create_task(watch(events, [
        (rollout, lambda name, reason: seen.append(("rollout", name, reason))),
        (trainers, lambda name, reason: seen.append(("trainer", name, reason)))]))
    trainers.died("t0", "t0-0 exited")  # the slot's death forgets both ranks
    for name in ("r0", "t0-1", "t0-0", "nobody"):
        events.put_nowait(Died(name))
    while not events.empty():
        await asyncio.sleep(0)
    await asyncio.sleep(0)
    watcher.cancel()
    assert seen == [("rollout", "r0", "exited (returncode -9)")]


def test_an_unresponsive_worker_is_killed_and_without_a_kill_callback_left_to_the_caller():
    killed = []
    life = Lifecycle(owners={"t0-0": "t0", "t0-1": "t0", "t1-0": "t1"}, groups=True,
                     kill=lambda name, reason: killed.append((name, reason)))
    assert life.kill("t0", "stopped answering")
    assert killed == [("t0-0", "stopped answering"), ("t0-1", "stopped answering")]
    life.died("t1", "exited")
    assert life.kill("t1", "again") and len(killed) == 2  # already dead: nothing to kill
    assert not Lifecycle(owners={"r0": "r0"}).kill("r0", "stopped answering")
    assert not Lifecycle().recoverable and Lifecycle(FakeRespawn()).recoverable
