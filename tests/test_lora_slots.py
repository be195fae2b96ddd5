"""LoRA agents of one base share one trainer slot by default (trainer_pool.share_lora_base,
issue 54): the slot resolution (flexmarl.placement.lora_units.static_slots, slot_layout), the
GPU placement of that slot, and the TrainerPool binding them to it over fake slots. The same in
a whole run on real processes: tests/test_lora_run.py (its default-settings run)."""
from __future__ import annotations

import asyncio

import pytest

from flexmarl import AgentSpec, LoraSpec, Team
from flexmarl.checks import ConfigError
from flexmarl.config.sections import DevicesConfig
from flexmarl.config.training import TrainerPoolConfig
from flexmarl.placement.devices import Host
from flexmarl.placement.layout import _slot_sizes, place_gpus, slot_layout
from flexmarl.placement.lora_units import lora_base, static_slots
from flexmarl.protocol import Parked, SwapDone, SwapIn, SwapOut
from flexmarl.tasks import addition_tasks

SPEC = LoraSpec(rank=4, alpha=8, target_modules=("q_proj", "v_proj"))


async def _noop(ctx, task) -> None:
    pass


def team(*agents: AgentSpec) -> Team:
    return Team(name="t", workflow=_noop, tasks=addition_tasks(1), agents=list(agents))


def lora(name: str, model: str = "/bases/a", **kw) -> AgentSpec:
    return AgentSpec(name=name, model=model, lora=SPEC, **kw)


def full(name: str, model: str = "/bases/a", **kw) -> AgentSpec:
    return AgentSpec(name=name, model=model, **kw)


def layout(t: Team, **pool):
    return slot_layout(t, TrainerPoolConfig(**pool), DevicesConfig())


# ------------------------------------------------------------------------- static_slots (pure)

def test_static_slots_put_one_base_s_agents_in_one_slot_where_the_first_of_them_is():
    needs = {"full1": 1, "a": 1, "b": 1, "full2": 2, "c": 1, "d": 1}
    bases = {"a": "/x", "b": "/x", "c": "/y", "d": "/x"}
    assert static_slots(needs, bases) == [(("full1",), 1), (("a", "b", "d"), 1),
                                          (("full2",), 2), (("c",), 1)]
    assert static_slots(needs, {}) == [((a,), n) for a, n in needs.items()]  # the opt-out
    assert static_slots({}, {}) == []


def test_static_slots_refuse_one_base_s_agents_of_different_ranks_naming_the_fixes():
    with pytest.raises(ValueError) as err:
        static_slots({"a": 1, "b": 2}, {"a": "/x", "b": "/x"})
    message = str(err.value)
    for words in ("a, b", "/x", "a: 1, b: 2", "AgentSpec.train_ranks",
                  "trainer_pool.share_lora_base = false", "trainer_pool.slot_ranks"):
        assert words in message, (words, message)
    # Different bases (or a full agent) may differ.
    assert static_slots({"a": 1, "b": 2}, {"a": "/x", "b": "/y"}) == [(("a",), 1), (("b",), 2)]


def test_lora_base_names_the_model_as_it_resolves_without_building_it(monkeypatch):
    monkeypatch.setenv("HOME", "/home/u")
    assert lora_base(full("f")) is None
    assert lora_base(lora("a", "~/m")) == lora_base(lora("b", "/home/u/m/")) == "/home/u/m"
    assert lora_base(lora("a", "tiny")) != lora_base(lora("b", "tiny", warm_start_steps=0))


# ------------------------------------------------------------------------------ slot_layout

def test_by_default_one_base_s_lora_agents_get_one_slot_and_full_agents_their_own():
    t = team(lora("solver"), full("judge"), lora("checker"), lora("critic", "/bases/b"))
    out = layout(t)
    assert out.sizes == [1, 1, 1]
    assert out.slot_of == {"solver": "trainer-0", "checker": "trainer-0",
                           "judge": "trainer-1", "critic": "trainer-2"}
    assert out.lora_slots == {"trainer-0": ("solver", "checker")}
    assert out.pinned == {} and out.groups == []  # not time-shared: engines stay awake


def test_two_bases_make_two_slots_and_frozen_agents_none():
    t = team(lora("a1"), lora("b1", "/bases/b"), lora("a2"), lora("b2", "/bases/b"),
             full("frozen", trainable=False))
    out = layout(t)
    assert out.sizes == [1, 1]
    assert out.lora_slots == {"trainer-0": ("a1", "a2"), "trainer-1": ("b1", "b2")}


def test_share_lora_base_false_restores_one_slot_per_agent():
    t = team(lora("a"), lora("b"), full("f"))
    out = layout(t, share_lora_base=False)
    assert out.sizes == [1, 1, 1] and out.lora_slots == {}
    assert out.slot_of == {"a": "trainer-0", "b": "trainer-1", "f": "trainer-2"}


def test_the_shared_slot_has_its_agents_ranks_and_conflicting_ranks_are_a_config_error():
    out = layout(team(lora("a", train_ranks=2), lora("b", train_ranks=2), full("f")))
    assert out.sizes == [2, 1]
    assert layout(team(lora("a"), lora("b")), ranks_per_agent=3).sizes == [3]
    with pytest.raises(ConfigError, match="share_lora_base = false"):
        layout(team(lora("a", train_ranks=2), lora("b")))
    # The opt-out, and a shared pool, take them as they are.
    assert layout(team(lora("a", train_ranks=2), lora("b")), share_lora_base=False).sizes == [2, 1]
    assert layout(team(lora("a", train_ranks=2), lora("b")), slot_ranks="1,2").sizes == [1, 2]


@pytest.mark.parametrize("pool, sizes", [({"slots": 2}, [1, 1]), ({"slots": 1}, [1]),
                                         ({"slot_ranks": "1,2,2"}, [1, 2, 2]),
                                         ({"slots": "auto"}, [1, 1, 1])])
def test_a_shared_pool_keeps_its_meaning(pool, sizes):
    out = layout(team(lora("a"), lora("b"), full("f")), **pool)
    assert out.sizes == sizes and out.slot_of == {} and out.lora_slots == {}


def test_a_time_shared_full_agent_keeps_its_group_slot_after_the_lora_slot():
    t = team(lora("a"), full("f"), lora("b"))
    out = slot_layout(t, TrainerPoolConfig(), DevicesConfig(placement="f=time_shared"))
    assert out.sizes == [1, 1] and out.pinned == {"f": "trainer-1"}
    assert out.slot_of == {"a": "trainer-0", "b": "trainer-0"}


# --------------------------------------------------------------------------------- GPU seats

@pytest.mark.parametrize("share", [True, False])
def test_the_shared_slot_asks_for_one_group_of_gpus(share):
    """The trainer ranks on GPU: one group for the LoRA agents of one base (whatever sizes the
    caller hands in: the dry run hands one per agent), its instances near it with colocate."""
    from flexmarl.config.rollout import RolloutConfig
    t = team(lora("a"), lora("b"), full("f"))
    pool = TrainerPoolConfig(share_lora_base=share)
    per_agent = _slot_sizes(pool, {"a": 1, "b": 1, "f": 1})
    assert per_agent == [1, 1, 1]
    gpus = place_gpus(t, per_agent, [Host("local", tuple(range(8)))],
                      rollout=RolloutConfig(backend="vllm", gpu_memory_utilization=0.2),
                      trainer_device="cuda",
                      devices=DevicesConfig(colocate=True), trainer_pool=pool)
    trainers = sorted(w for w, s in gpus.devices.seats.items() if s.role == "trainer")
    if not share:
        assert trainers == ["trainer-0-0", "trainer-1-0", "trainer-2-0"]
        return
    assert trainers == ["trainer-0-0", "trainer-1-0"]
    seats = gpus.devices.seats
    near = {s.label: s.devices for s in seats.values() if s.role == "rollout"}
    assert near["a"] == near["b"] == seats["trainer-0-0"].devices  # the LoRA slot's GPU
    assert near["f"] == seats["trainer-1-0"].devices


# ------------------------------------------------------------------------ the pool binds them

class FakeSlot:
    """A trainer slot's connection: answers SwapIn and SwapOut like the worker, logging them."""

    def __init__(self, name: str, log: list) -> None:
        self.name, self.log, self.agent = name, log, ""

    async def request(self, msg, timeout_s=None):
        await asyncio.sleep(0)
        if isinstance(msg, SwapIn):
            assert not self.agent, "SwapIn into a busy slot"
            self.agent = msg.agent
            self.log.append((self.name, "in", msg.agent))
            return SwapDone(8, 0.0)
        if isinstance(msg, SwapOut):
            agent, self.agent = self.agent, ""
            self.log.append((self.name, "out", agent))
            return Parked(agent, 1, 8, 0.0, [f"ipc://{self.name}"])
        return None

    async def aclose(self) -> None:
        pass


def _pool(share: bool, n_slots: int, log: list):
    from flexmarl.training.pool import AgentTrainer, TrainerPool
    lora_cfg = {"lora": SPEC.as_dict()}
    agents = {"a": AgentTrainer("/bases/a", lora_cfg), "f": AgentTrainer("/bases/a", {}),
              "b": AgentTrainer("/bases/a", lora_cfg), "c": AgentTrainer("/bases/c", lora_cfg)}
    slots = {f"trainer-{k}": FakeSlot(f"trainer-{k}", log) for k in range(n_slots)}
    return TrainerPool(slots, dict.fromkeys(slots, 1), agents,
                       TrainerPoolConfig(snapshots=False, share_lora_base=share), prefetch=False)


async def test_the_pool_binds_one_base_s_lora_agents_to_one_slot_and_swaps_them_there():
    log: list = []
    pool = _pool(True, 3, log)  # as slot_layout sized it: a+b, f, c
    assert pool.allocator.pinned == {"a": "trainer-0", "b": "trainer-0", "f": "trainer-1",
                                     "c": "trainer-2"}
    for agent in ("a", "b", "f", "c", "a"):
        async with pool.bind(agent):
            pass
    assert log == [("trainer-0", "in", "a"), ("trainer-0", "out", "a"), ("trainer-0", "in", "b"),
                   ("trainer-1", "in", "f"), ("trainer-2", "in", "c"),
                   ("trainer-0", "out", "b"), ("trainer-0", "in", "a")]
    assert {(sw.agent, sw.slot) for sw in pool.swaps} == {("a", "trainer-0"), ("b", "trainer-0")}
    await pool.close()


async def test_the_pool_s_opt_out_and_its_error_when_the_slots_are_too_few():
    log: list = []
    pool = _pool(False, 4, log)
    assert pool.allocator.pinned == {"a": "trainer-0", "f": "trainer-1", "b": "trainer-2",
                                     "c": "trainer-3"}
    await pool.close()
    with pytest.raises(ValueError, match="3 needed, 2 slots"):
        _pool(True, 2, log)


async def test_a_prefetch_looks_only_at_the_slot_its_agent_may_take():
    """Another agent's slot (empty, or the full agent's) falling idle does not prefetch a
    parked LoRA agent: it could only go to its base's slot, evicting the adapter expected
    sooner there."""
    log: list = []
    pool = _pool(True, 3, log)
    pool.prefetch = True
    for agent in ("a", "b"):
        async with pool.bind(agent):
            pass
    await asyncio.gather(*pool._prefetches)  # b's release brought a back: it asks next
    assert log[-1] == ("trainer-0", "in", "a")
    seen = len(log)
    for agent in ("c", "f"):  # b parked; a (expected sooner) resident in the LoRA slot
        async with pool.bind(agent):
            pass
        await asyncio.sleep(0.01)
        assert not pool._prefetches
    assert log[seen:] == [("trainer-2", "in", "c"), ("trainer-1", "in", "f")]
    await pool.close()
