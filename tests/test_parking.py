"""The swap path's data movement in one process (flexmarl.training.parking): a parked trainer
comes back bit for bit, holds no device memory while parked, parks into the same pooled host
buffer every swap; pull plans cover each rank's rows exactly once. Fixtures and helpers are
tests/test_trainer.py's (a 2-layer Qwen2 built here).
"""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from flexmarl.config.training import TrainerConfig
from flexmarl.training.parking import (HostPool, chunk_rows, fill, local_tensors, park,
                                       prepare_pull, pull_pieces, set_rng, sharded_here, slices,
                                       unpark)
from flexmarl.training.trainer import GRPOTrainer, export_state, load_state
from tests.helpers.trainers import (CONFIG, _weights_and_moments, batches,  # noqa: F401
                                    model_dir, rows, step_batch, tokens)


@pytest.mark.parametrize("train_layers", [0, 1])
def test_swapped_state_is_bit_exact_and_training_goes_on(model_dir, batches, train_layers):
    """Snapshots and checkpoints in one process: after a step, the whole state out
    (export_state) and into a fresh trainer (load_state); the fresh one holds the same tensors
    bit for bit and its next step equals that of a trainer that never left. In the middle of a
    global batch an export is refused (the half-built gradient is not in the state). With
    train_layers the state holds the trained part alone, its weights and optimizer moments
    (the frozen blocks come from the model directory the fresh trainer is built from)."""
    config = {**CONFIG, "train_layers": train_layers}
    trainer = GRPOTrainer(model_dir, TrainerConfig(**config))
    step_batch(trainer, batches[0])
    saved = _weights_and_moments(trainer)
    tensors, meta = export_state(trainer)
    fresh = GRPOTrainer(model_dir, TrainerConfig(**config))
    load_state(fresh, tensors, meta)
    restored = _weights_and_moments(fresh)
    assert fresh.version == trainer.version == 1
    assert len(saved) == len(restored) and all(map(torch.equal, saved, restored))
    num_params = sum(p.numel() for p in trainer.model.parameters())
    num_bytes = sum(t.numel() * t.element_size() for t in tensors.values())
    # Parameters and Adam's two moments in float32 (plus step counters and the RNG state).
    trained = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
    assert num_bytes >= 4 * (trained if train_layers else num_params) + 2 * 4 * trained
    if train_layers:  # no frozen weight in it
        names = {k.removeprefix("model/") for k in tensors if k.startswith("model/")}
        assert names == set(trainer.trained_names)
        assert num_bytes < 3 * 4 * trained + 10_000  # + step counters and the RNG state

    fresh.begin_batch(tokens(batches[1]))
    fresh.accumulate(rows(batches[1], 0, 2))
    with pytest.raises(RuntimeError, match=r"step\(\) first"):
        export_state(fresh)
    fresh.accumulate(rows(batches[1], 2, batches[1].input_ids.shape[0]))
    fresh.step()
    reference = GRPOTrainer(model_dir, TrainerConfig(**config))
    step_batch(reference, batches[0])
    reference.begin_batch(tokens(batches[1]))
    reference.accumulate(rows(batches[1], 0, 2))
    reference.accumulate(rows(batches[1], 2, batches[1].input_ids.shape[0]))
    reference.step()
    a, b = fresh.export_weights(), reference.export_weights()
    assert all(torch.equal(a[k], b[k]) for k in a)  # same process, same ops: bit for bit
    print(f"state {num_bytes} B for {num_params} parameters")


@pytest.mark.parametrize("kl_coef", [0.0, 0.05])
def test_a_parked_trainer_holds_no_device_memory_and_comes_back_bit_for_bit(model_dir,
                                                                          batches, kl_coef):
    """The swap path in one process: park() copies every storage (parameters, buffers, the KL
    reference, AdamW state) to host buffers and frees the device's (here: the CPU's own
    storages, resized to 0 bytes); unpark() copies them back in place. A trainer built empty
    (no weight file read) and filled from the parked copy by pull_pieces's slices equals it too.
    Both then train exactly like a trainer that never left."""
    config = TrainerConfig(**{**CONFIG, "kl_coef": kl_coef})
    trainer = GRPOTrainer(model_dir, config)
    step_batch(trainer, batches[0])
    before = {k: v.clone() for k, v in local_tensors(trainer).items()}
    assert any(k.startswith("ref/") for k in before) == (kl_coef > 0)
    host = park(trainer)
    assert all(t.untyped_storage().nbytes() == 0 for t in local_tensors(trainer).values())
    assert host.num_bytes >= sum(t.numel() * t.element_size() for t in before.values()) / 2

    empty = GRPOTrainer(model_dir, config, empty=True)
    tensors = prepare_pull(empty, host.layout, host.meta)
    [pieces] = pull_pieces(host.layout, sharded_here(empty), 1, 1, 0).values()
    fill(tensors, pieces, slices(host, pieces))
    set_rng(empty, host.rng)
    back = unpark(host)
    for other in (back, empty):
        assert other.version == 1
        now = local_tensors(other)
        assert now.keys() == before.keys() and all(torch.equal(before[k], now[k]) for k in now)
    step_batch(back, batches[1])
    step_batch(empty, batches[1])
    a, b = export_state(back)[0], export_state(empty)[0]
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_trainer_parked_mid_batch_keeps_its_accumulated_gradient(model_dir, batches):
    """devices.placement time_shared: a trainer gives its devices back to its engines between
    micro-batches. Parked after the first half of a batch and unparked, it steps to exactly
    the weights of a trainer that never left."""
    mb = batches[0]
    half = mb.input_ids.shape[0] // 2
    results = []
    for parked in (False, True):
        trainer = GRPOTrainer(model_dir, TrainerConfig(**CONFIG))
        trainer.begin_batch(tokens(mb))
        trainer.accumulate(rows(mb, 0, half))
        if parked:
            host = park(trainer)
            assert host.mid_batch
            assert all(p.grad.untyped_storage().nbytes() == 0
                       for p in trainer.model.parameters() if p.grad is not None)
            trainer = unpark(host)
        trainer.accumulate(rows(mb, half, mb.input_ids.shape[0]))
        trainer.step()
        results.append(export_state(trainer)[0])
    a, b = results
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_slot_parks_into_the_same_host_buffer_every_swap(model_dir, batches):
    """Swaps of one agent in one slot reuse the pool's host buffer (the same memory, no new
    allocation after the first park) and still come back bit for bit each time."""
    trainer = GRPOTrainer(model_dir, TrainerConfig(**CONFIG))
    step_batch(trainer, batches[0])
    before = {k: v.clone() for k, v in local_tensors(trainer).items()}
    pool = HostPool()
    host = park(trainer, pool)
    where = [copy.data_ptr() for _, copy in host.storages]
    assert host.buffer is not None and pool.num_allocations == 1
    for _ in range(2):
        unpark(host, pool)
        assert pool.free and all(torch.equal(before[k], v)
                                 for k, v in local_tensors(trainer).items())
        host = park(trainer, pool)
        assert [copy.data_ptr() for _, copy in host.storages] == where
        assert pool.num_allocations == 1 and not pool.free
    unpark(host, pool)
    step_batch(trainer, batches[1])  # trains on after its swaps like one that never left
    reference = GRPOTrainer(model_dir, TrainerConfig(**CONFIG))
    step_batch(reference, batches[0])
    step_batch(reference, batches[1])
    a, b = local_tensors(trainer), local_tensors(reference)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_pinning_pool_pins_each_buffer_once_at_its_size_and_unpins_what_it_lets_go():
    """Pinned host memory is what a GPU slot's parks fill. torch's pinned allocator would round
    each buffer up to a power of two and never give one back; the pool pins buffers of the
    exact size itself, once (reuse pins nothing), and unpins a buffer it lets go of, so what
    stays pinned is the parked agents plus `keep` spare. (`register` / `unregister` record
    here what cudaHostRegister / cudaHostUnregister get on a GPU: tests/test_cuda.py.)"""
    calls: list[tuple] = []
    pool = HostPool(pin=True, keep=1, register=lambda p, n: calls.append(("pin", p, n)),
                    unregister=lambda p: calls.append(("unpin", p)))
    a, b = pool.take(3000), pool.take(5000)
    assert calls == [("pin", a.data_ptr(), 3000), ("pin", b.data_ptr(), 5000)]
    assert pool.pinned_bytes == 8000
    pool.give(a)
    assert pool.take(2000).data_ptr() == a.data_ptr() and len(calls) == 2  # reused: no pin
    pool.give(a)
    pool.give(b)  # over `keep`: the older one goes, unpinned
    assert calls[-1] == ("unpin", a.data_ptr()) and pool.pinned_bytes == 5000
    pool.close()
    assert calls[-1] == ("unpin", b.data_ptr()) and pool.pinned_bytes == 0 and not pool.free
    assert HostPool().take(10).numel() == 10 and not HostPool().pinned  # CPU: nothing pinned
    dropped = pool.take(700)  # a buffer dropped without the pool letting it go: unpinned too
    where = dropped.data_ptr()
    del dropped
    assert calls[-1] == ("unpin", where) and pool.pinned_bytes == 0


def test_the_host_pool_hands_out_the_smallest_free_buffer_that_fits_and_keeps_few():
    pool = HostPool(keep=2)
    small, large = pool.take(100), pool.take(1000)
    assert pool.num_allocations == 2 and small.numel() == 100 and large.numel() == 1000
    pool.give(large)
    pool.give(small)
    assert pool.take(50).data_ptr() == small.data_ptr()  # the smallest that fits
    assert pool.take(50).data_ptr() == large.data_ptr()  # the only one left
    assert pool.take(2000).numel() == 2000 and pool.num_allocations == 3  # none fits: new
    for n in (10, 20, 30):
        pool.give(torch.empty(n, dtype=torch.uint8))
    assert [b.numel() for b in pool.free] == [20, 30]  # only the `keep` most recent stay


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 40), st.integers(1, 5), st.integers(1, 5), st.booleans(), st.booleans())
def test_pull_plans_cover_each_rank_s_rows_exactly_once(rows, src_world, world_size,
                                                        src_sharded, sharded):
    """Resharding: for any dim-0 size and rank counts, the slices each rank pulls tile its own
    rows (FSDP2's torch.chunk shards) exactly, and each lies within its source rank's shard."""
    layout = {"t": [[rows, 3], "float32", src_sharded, False], "s": [[], "float32", False, False]}
    for rank in range(world_size):
        plan = pull_pieces(layout, {"t": sharded, "s": False}, src_world, world_size, rank)
        lo, hi = chunk_rows(rows, world_size, rank) if sharded else (0, rows)
        covered = []
        for w, pieces in plan.items():
            src = chunk_rows(rows, src_world, w) if src_sharded else (0, rows)
            for name, a, b, mine in pieces:
                if name == "s" or b == -1:  # replicated on both sides (or 0-dim): all of it
                    assert (a, b) == (0, -1) and (name == "s" or not (sharded or src_sharded))
                    covered += range(lo, hi) if name == "t" else []
                    continue
                assert 0 <= a < b <= src[1] - src[0]
                covered += range(lo + mine, lo + mine + b - a)
                assert list(range(src[0] + a, src[0] + b)) == list(range(lo + mine,
                                                                         lo + mine + b - a))
        assert sorted(covered) == list(range(lo, hi))
        assert sum(p[0] == "s" for ps in plan.values() for p in ps) == 1
    assert [len(c) for c in torch.arange(rows).chunk(world_size)] == [
        hi - lo for lo, hi in (chunk_rows(rows, world_size, r) for r in range(world_size))
        if hi > lo]
