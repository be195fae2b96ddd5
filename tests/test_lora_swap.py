"""LoRA swaps move the adapter, not the base: one trainer slot holds the frozen base once (a
rank's ResidentBase, flexmarl.training.parking) and an adapter and AdamW state per agent; an
agent's SwapOut parks its adapter state alone, its SwapIn sets that state on the resident base
(parked here, pulled, restored, or fresh as PEFT drew it from the seed) without building or
reading the base.

One process (fast): the parking functions and GRPOTrainer(base=...) on the 2-layer Qwen2 of
tests/test_trainer.py. Real trainer slots (slow): Rank's swaps over the runtime on 1 and 2
gloo ranks, the bytes they report, pulls between slots, a full agent in between and a saved
state restored (a dead slot's recovery).

Tolerance: none. Swaps copy float32 tensors as raw bytes and every comparison here is between
runs of the same ops on the same rank count, so states are compared bit for bit (torch.equal).
"""
from __future__ import annotations

import asyncio
import dataclasses
import os

import pytest
import pytest_asyncio
import torch
from safetensors.torch import load_file

from flexmarl.config.training import TrainerConfig
from flexmarl.training import parking, sharding
from flexmarl.training.parking import ResidentBase, base_key, park, restore_parked
from flexmarl.training.trainer import GRPOTrainer, export_state, load_state
from tests.helpers.lora import LORA, SPEC, checkpoint_name, lora_trainer, rows, step_batch
from tests.helpers.trainers import batches, model_dir  # noqa: F401


def adapter_state_bytes(trainer: GRPOTrainer) -> int:
    """Bytes of the adapter's parameters and their AdamW state (counted from the trainer's
    modules and optimizer, not from parking's own view of them)."""
    params = dict(trainer.model.named_parameters())
    n = sum(params[name].numel() * params[name].element_size() for name in trainer.trained_names)
    return n + sum(v.numel() * v.element_size() for state in trainer.optimizer.state.values()
                   for v in state.values() if isinstance(v, torch.Tensor))


def base_bytes(trainer: GRPOTrainer) -> int:
    trained = set(trainer.trained_names)
    return sum(p.numel() * p.element_size() for n, p in trainer.model.named_parameters()
               if n not in trained)


def assert_base_is_the_model_dir(trainer: GRPOTrainer, model_dir: str) -> None:
    """Every frozen weight bit-equal to the model directory's (and still allocated)."""
    saved = load_file(os.path.join(model_dir, "model.safetensors"))
    base = {checkpoint_name(n): p.detach() for n, p in trainer.model.named_parameters()
            if not p.requires_grad}
    assert base.keys() == saved.keys()
    assert all(torch.equal(base[k], saved[k]) for k in saved)


def state(trainer: GRPOTrainer) -> dict[str, torch.Tensor]:
    """The agent's whole state (export_state: adapter, AdamW, RNG) and its version."""
    tensors, meta = export_state(trainer)
    return {**tensors, "version": torch.tensor(meta["version"])}


def assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], *, rng: bool = True
                ) -> None:
    keys = [k for k in a if rng or k != "rng/cpu"]
    assert a.keys() == b.keys() and [k for k in keys if not torch.equal(a[k], b[k])] == []


@pytest.fixture
def counted_builds(monkeypatch) -> list[str]:
    """Every model built from here on (flexmarl.training.sharding.build_model: the only way a
    trainer builds or reads its modules), by model dir."""
    built: list[str] = []
    real = sharding.build_model

    def counting(model_dir: str, empty: bool):
        built.append(model_dir)
        return real(model_dir, empty)
    monkeypatch.setattr("flexmarl.training.trainer.build_model", counting)
    return built


# ----------------------------------------------------------------------------- one process

def test_a_lora_park_moves_the_adapter_state_alone_and_leaves_the_base(model_dir, batches):
    """park() of a LoRA trainer: the host copy is the adapter's parameters and their AdamW
    state (its bytes exactly those), the base's storages untouched and still the model dir's;
    AdamW's device state freed. restore_parked onto another trainer on the same modules gives
    the state back bit for bit, and it trains on like a trainer that never left."""
    trainer = lora_trainer(model_dir)
    step_batch(trainer, batches[0])
    twin = lora_trainer(model_dir)
    load_state(twin, *export_state(trainer))
    before = state(trainer)
    adapter = adapter_state_bytes(trainer)
    base = {n: p.untyped_storage().data_ptr() for n, p in trainer.model.named_parameters()
            if not p.requires_grad}
    host = park(trainer)
    trained = set(trainer.trained_names)
    assert set(host.layout) == {f"model/{n}" for n in trained} | {
        f"optim/{n}/{k}" for n in trained for k in ("exp_avg", "exp_avg_sq", "step")}
    assert host.num_bytes == adapter < base_bytes(trainer)
    print(f"parked LoRA state {host.num_bytes} B, base {base_bytes(trainer)} B")
    assert all(v.untyped_storage().nbytes() == 0 for st in trainer.optimizer.state.values()
               for v in st.values())
    assert {n: p.untyped_storage().data_ptr() for n, p in trainer.model.named_parameters()
            if not p.requires_grad} == base
    assert_base_is_the_model_dir(trainer, model_dir)

    on_base = GRPOTrainer(model_dir, TrainerConfig(**LORA), base=trainer)
    assert on_base.model is trainer.model and not on_base.optimizer.state
    assert restore_parked(on_base, host) == adapter
    assert_same(state(on_base), before)
    step_batch(on_base, batches[1])
    step_batch(twin, batches[1])
    assert_same(state(on_base), state(twin), rng=False)


def test_a_fresh_adapter_on_a_resident_base_is_a_fresh_trainer_s(model_dir, batches,
                                                                counted_builds):
    """A LoRA agent's first SwapIn into a slot holding its base: no model built or read, and
    its adapter, AdamW state (none), RNG and version those of a fresh GRPOTrainer, bit for bit
    (PEFT's init from the seed, kept from the base's build), although the trainer that built
    the base has trained since. Another lr is the agent's own; another adapter spec or
    precision is another base, refused."""
    first = lora_trainer(model_dir)
    resident = ResidentBase.of(first, base_key(model_dir, first.config, 1))
    step_batch(first, batches[0])
    park(first)
    built = len(counted_builds)
    config = TrainerConfig(**{**LORA, "lr": 3e-3})
    second = GRPOTrainer(model_dir, config, base=resident.trainer)
    resident.start(second)
    assert len(counted_builds) == built  # nothing built, nothing read
    got = state(second)
    expected = state(GRPOTrainer(model_dir, config))
    assert_same(got, expected)
    assert second.optimizer.param_groups[0]["lr"] == 3e-3
    step_batch(second, batches[1])  # and it trains on its own

    for other in ({**LORA, "lora": dataclasses.replace(SPEC, rank=8).as_dict()},
                  {**LORA, "param_dtype": "bfloat16"}, {**LORA, "lora": None}):
        with pytest.raises(ValueError, match="takes the modules of another"):
            GRPOTrainer(model_dir, TrainerConfig(**other), base=resident.trainer)
    keys = {base_key(model_dir, TrainerConfig(**c), 1) for c in (
        LORA, {**LORA, "lr": 3e-3, "kl_coef": 0.5},
        {**LORA, "seed": 1}, {**LORA, "reshard_after_forward": False})}
    assert len(keys) == 3  # lr and kl_coef do not shape the modules; the seed does (fresh)
    assert base_key(model_dir, first.config, 1) != base_key(model_dir, first.config, 2)


def test_three_lora_agents_take_turns_on_one_base_as_if_each_had_its_own(model_dir, batches):
    """Three LoRA agents on one set of modules, swapped as a slot's rank swaps them (park;
    a trainer on the resident base; restore_parked or a fresh start), step in turns; each ends
    bit-equal to a trainer of its own that never left. A step of one never changes another's
    parked adapter; the base stays the model dir's; the parked states together are 3 x one
    adapter state (one base, held once)."""
    mb = {a: batches[i % 2] for i, a in enumerate("abc")}
    lrs = {"a": 1e-3, "b": 2e-3, "c": 5e-4}
    configs = {a: TrainerConfig(**{**LORA, "lr": lrs[a]}) for a in "abc"}
    own = {a: GRPOTrainer(model_dir, configs[a]) for a in "abc"}
    first = GRPOTrainer(model_dir, configs["a"])
    resident = ResidentBase.of(first, base_key(model_dir, first.config, 1))
    bound, parked = ("a", first), {}
    for agent in "abcacbba":
        if bound[0] != agent:
            parked[bound[0]] = park(bound[1])  # SwapOut
            trainer = GRPOTrainer(model_dir, configs[agent], base=resident.trainer)
            resident.start(trainer)
            if agent in parked:  # SwapIn: its adapter state, parked here
                restore_parked(trainer, parked.pop(agent))
            bound = (agent, trainer)
        copies = {a: {k: v.clone() for k, v in h.tensors.items()} for a, h in parked.items()}
        step_batch(bound[1], mb[agent])
        step_batch(own[agent], mb[agent])
        assert_same(state(bound[1]), state(own[agent]), rng=False)
        for a, host in parked.items():  # the others' adapters untouched by this step
            assert all(torch.equal(copies[a][k], host.tensors[k]) for k in host.tensors)
    parked[bound[0]] = park(bound[1])
    assert len(parked) == 3
    adapter = adapter_state_bytes(own["a"])
    assert [h.num_bytes for h in parked.values()] == [adapter] * 3
    assert all(h.trainer.model is resident.trainer.model for h in parked.values())
    assert_base_is_the_model_dir(resident.trainer, model_dir)
    for agent in "abc":  # each comes back once more: its own trainer's state
        trainer = GRPOTrainer(model_dir, configs[agent], base=resident.trainer)
        restore_parked(trainer, parked[agent])
        assert_same(state(trainer), state(own[agent]), rng=False)
        park(trainer)


def test_releasing_the_base_frees_its_storages_and_a_parked_adapter_comes_back_on_a_new_one(
        model_dir, batches):
    """A SwapIn of a full agent (or another base) frees the resident base: every storage of
    its modules resized to 0. A LoRA agent parked meanwhile comes back onto a base built anew
    from the model dir, bit for bit."""
    first = lora_trainer(model_dir)
    resident = ResidentBase.of(first, base_key(model_dir, first.config, 1))
    step_batch(first, batches[0])
    before = state(first)
    host = park(first)
    host.trainer = None  # as the rank lets go of it
    resident.release()
    assert all(p.untyped_storage().nbytes() == 0 for p in first.model.parameters())
    assert all(b.untyped_storage().nbytes() == 0 for b in first.model.buffers())
    again = lora_trainer(model_dir)
    restore_parked(again, host)
    assert_same(state(again), before)
    assert_base_is_the_model_dir(again, model_dir)


def test_a_state_parked_mid_batch_is_not_restored_onto_another_trainer(model_dir, batches):
    """Its accumulated gradient is not in the state: only unpark (in place) brings it back
    (a LoRA agent is never time-shared, and its slot refuses such a SwapOut)."""
    trainer = lora_trainer(model_dir)
    trainer.begin_batch(int(batches[0].response_mask.sum()))
    trainer.accumulate(rows(batches[0], 0, 4))
    host = park(trainer)
    assert host.mid_batch
    with pytest.raises(RuntimeError, match="only comes back in place"):
        restore_parked(GRPOTrainer(model_dir, TrainerConfig(**LORA), base=trainer), host)
    parking.unpark(host)


# ----------------------------------------------------------------------------- real slots

MODULE_LOOP = pytest.mark.asyncio(loop_scope="module")
SLOT_SPEC = dataclasses.replace(SPEC, target_modules=("q_proj", "v_proj", "down_proj"))


def lora_cfg(**overrides) -> dict:
    return dataclasses.asdict(TrainerConfig(**{"lr": 1e-3, "lora": SLOT_SPEC.as_dict(),
                                               **overrides}))


@pytest.fixture(scope="module")
def base_dir(tiny_model_dir, tmp_path_factory) -> str:
    """A copy of the tiny model dir, which the tests below hide (rename) while no base may be
    read: a trainer that built or read its modules from it then would fail."""
    import shutil
    path = tmp_path_factory.mktemp("base") / "tiny"
    shutil.copytree(tiny_model_dir, path)
    return str(path)


class hidden:
    """The model dir renamed away for the block: nothing can read it."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __enter__(self) -> None:
        os.rename(self.path, self.path + ".hidden")

    def __exit__(self, *exc) -> None:
        os.rename(self.path + ".hidden", self.path)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def slots(tmp_path_factory):
    """Two real, empty trainer slots (3 processes, started once): "one" of 1 rank and "two" of
    2 gloo ranks. Each test leaves them empty (no agent bound, none parked)."""
    from runtime.supervisor import Supervisor, WorkerSpec
    from runtime.transport import connect

    work = tmp_path_factory.mktemp("lora-slots")
    specs = [WorkerSpec(name=f"two{r}", entry="flexmarl.training.worker:trainer_worker",
                        args={"rank": r, "world_size": 2, "init_method": f"file://{work}/two",
                              "num_threads": 1}) for r in range(2)]
    specs.append(WorkerSpec(name="one", entry="flexmarl.training.worker:trainer_worker",
                            args={"rank": 0, "world_size": 1, "num_threads": 1,
                                  "init_method": f"file://{work}/one"}))
    sup = Supervisor()
    async with sup.serving():
        handles = {h.name: h for h in await asyncio.gather(*(sup.start_worker(w)
                                                               for w in specs))}
        conns = {"one": connect(handles["one"].address), "two": connect(handles["two0"].address)}
        try:
            yield conns
        finally:
            for conn in conns.values():
                await conn.aclose()
            await sup.stop_workers()


def parked_bytes(state, world_size: int) -> int:
    """What a SwapOut of this state parks over `world_size` ranks: the adapter's parameters
    and AdamW moments (sharded: once in all) and AdamW's step counters (on every rank)."""
    total = sum(t.numel() * t.element_size() for k, t in state.tensors.items()
                if k.startswith(("model/", "optim/")))
    steps = sum(t.numel() * t.element_size() for k, t in state.tensors.items()
                if k.startswith("optim/") and k.endswith("/step"))
    return total + (world_size - 1) * steps


async def drop(conn, *agents: str) -> None:
    """Free the slot's parked copies of `agents` (the slot left empty)."""
    from flexmarl.protocol import DropParked
    for agent in agents:
        await conn.request(DropParked(agent))


@pytest.mark.slow
@MODULE_LOOP
async def test_three_lora_agents_swap_in_one_2_rank_slot_moving_their_adapters_alone(
        slots, base_dir):
    """Three LoRA agents take turns in a 2-rank slot. After the first one's SwapIn the model dir
    is hidden: every later SwapIn (fresh, here) sets an adapter on the resident base, never
    reading it. Each SwapOut parks the adapter state alone (Parked.num_bytes: its bytes, not
    the base's), each SwapIn gives it back bit for bit (SwapDone.num_bytes the same), a fresh
    one is the first agent's fresh state; an agent swapped between the others' steps ends
    bit-equal to one trained with no swap at all."""
    from flexmarl.protocol import ExportState, SwapIn, SwapOut
    from tests.helpers.trainers import assert_same as same_state, train_step

    two = slots["two"]
    cfg = {a: lora_cfg(lr=lr) for a, lr in (("a", 1e-3), ("b", 2e-3), ("c", 5e-4), ("z", 1e-3))}
    done = await two.request(SwapIn("a", base_dir, cfg["a"]))
    assert done.how == "fresh"
    fresh = await two.request(ExportState())
    states, parked = {}, {}
    with hidden(base_dir):
        bound = "a"
        for step, agent in enumerate("abcacbba"):
            if agent != bound:
                out = await two.request(SwapOut())
                assert out.agent == bound and out.num_bytes == parked_bytes(states[bound], 2)
                parked[bound] = out.num_bytes
                done = await two.request(SwapIn(agent, base_dir, cfg[agent]))
                now = await two.request(ExportState())
                if agent in states:  # the others' steps since did not touch it
                    assert (done.how, done.num_bytes) == ("here", parked[agent])
                    same_state(states[agent], now)
                else:  # a fresh adapter on the resident base: the first agent's fresh state
                    assert (done.how, done.num_bytes) == ("fresh", 0)
                    same_state(fresh, now)
                bound = agent
            await train_step(two, 10 + step)
            states[agent] = await two.request(ExportState())
        # "a" trained at steps 0, 3 and 7, the others in between: "z" (fresh, a's config)
        # trains the same batches with no swap, and ends where "a" did.
        await two.request(SwapOut())
        assert (await two.request(SwapIn("z", base_dir, cfg["z"]))).how == "fresh"
        # Exported once before its first step, as "a" was (torch's state dicts of an AdamW
        # with no state yet create it, step 1: the next step differs without this).
        same_state(fresh, await two.request(ExportState()))
        for step in (0, 3, 7):
            await train_step(two, 10 + step)
        same_state(states["a"], await two.request(ExportState()))
        assert (await two.request(SwapOut())).num_bytes == parked["a"]
    print(f"2 ranks: a LoRA agent's swap parks {parked['a']} B")
    await drop(two, "a", "b", "c", "z")


@pytest.mark.slow
@MODULE_LOOP
async def test_lora_agents_pull_restore_and_give_way_to_a_full_one_on_resident_bases(
        slots, base_dir, tmp_path):
    """Between a 1-rank and a 2-rank slot, each holding the base (model dir hidden): a pull
    moves the adapter state alone (SwapDone.num_bytes its bytes at the puller's rank count),
    bit for bit. Three LoRA agents parked in one slot park 3 x one adapter state, not 3
    bases. A full agent's SwapIn frees the base (a LoRA agent coming back then needs the model
    dir: refused while it is hidden, its parked copy kept; rebuilt once it is back). A saved
    state (a dead slot's recovery: SwapIn.state_dir) and a whole TrainState restore onto a
    resident base without reading it."""
    from flexmarl.protocol import AwaitSaved, ExportState, SaveState, SwapIn, SwapOut
    from flexmarl.training.state_files import StateCheckpoints
    from runtime.errors import RemoteError
    from tests.helpers.trainers import assert_same as same_state, train_step

    one, two = slots["one"], slots["two"]
    cfg = lora_cfg()
    for conn in (one, two):  # each slot builds its base (the model dir read, once per slot)
        assert (await conn.request(SwapIn("w", base_dir, cfg))).how == "fresh"
        await conn.request(SwapOut())
    with hidden(base_dir):
        assert (await one.request(SwapIn("a", base_dir, cfg))).how == "fresh"
        await train_step(one, 1)
        state = await one.request(ExportState())
        out = await one.request(SwapOut())
        assert out.num_bytes == parked_bytes(state, 1)
        done = await two.request(SwapIn("a", base_dir, cfg, source=out.ranks))
        assert (done.how, done.num_bytes) == ("pulled", parked_bytes(state, 2))
        same_state(state, await two.request(ExportState()))
        await drop(one, "a")
        await train_step(two, 2)
        state = await two.request(ExportState())
        out = await two.request(SwapOut())
        done = await one.request(SwapIn("a", base_dir, cfg, source=out.ranks))
        assert (done.how, done.num_bytes) == ("pulled", parked_bytes(state, 1))
        same_state(state, await one.request(ExportState()))
        await drop(two, "a")

        states, parked = {"a": state}, {}
        for agent in "abc":  # three agents parked in one slot: three adapter states
            if agent != "a":
                assert (await one.request(SwapIn(agent, base_dir, cfg))).how == "fresh"
                await train_step(one, ord(agent))
                states[agent] = await one.request(ExportState())
            parked[agent] = (await one.request(SwapOut())).num_bytes
        adapter = parked_bytes(states["b"], 1)
        assert sum(parked.values()) == 3 * adapter

    full = dataclasses.asdict(TrainerConfig(lr=1e-3))
    assert (await one.request(SwapIn("f", base_dir, full))).how == "fresh"
    await train_step(one, 5)
    whole = (await one.request(SwapOut())).num_bytes
    print(f"1 rank, tiny model: a LoRA agent's swap parks {adapter} B, a full agent's {whole} B")
    assert whole > 10 * adapter
    with hidden(base_dir), pytest.raises(RemoteError):  # its base went with "f"'s SwapIn
        await one.request(SwapIn("b", base_dir, cfg))
    done = await one.request(SwapIn("b", base_dir, cfg))  # its parked copy was kept
    assert (done.how, done.num_bytes) == ("here", parked["b"])
    same_state(states["b"], await one.request(ExportState()))

    saves = StateCheckpoints(tmp_path / "state")
    tmp, path = saves.begin("b", 0)
    await one.request(SaveState(str(tmp), str(path), 0))
    await one.request(AwaitSaved(str(path)))
    await one.request(SwapOut())
    with hidden(base_dir):
        done = await two.request(SwapIn("b", base_dir, cfg, state_dir=str(path)))
        assert done.how == "restored"
        same_state(states["b"], await two.request(ExportState()))
        await two.request(SwapOut())
        c = states["c"]
        done = await two.request(SwapIn("c", base_dir, cfg, tensors=c.tensors, meta=c.meta))
        assert done.how == "restored"
        same_state(c, await two.request(ExportState()))
        await two.request(SwapOut())
    await drop(one, "w", "a", "b", "c", "f")
    await drop(two, "w", "b", "c")
