"""The swap path's data movement for one rank's trainer (what flexmarl.training.worker runs on
SwapOut / SwapIn / FetchShards): park a trainer's storages in host memory of its process and
bring them back in place, and choose and fill the row slices a trainer of another rank count
pulls from them (FSDP2 shards dim 0 with torch.chunk's rule). The trainer itself is
flexmarl.training.trainer.GRPOTrainer.

LoRA (trainer.lora): a trainer's swapped state is its adapter's parameters, their AdamW state,
the RNG and the version (local_tensors), never the frozen base. The base stays in the slot, a
rank's ResidentBase: one set of modules (PEFT's model over the base, sharded) that every LoRA
trainer of the same base and settings (base_key) takes in turn, each with its own AdamW; an
agent's SwapIn sets its adapter on them (restore_parked, a pull, a saved state, or the
adapter as a fresh trainer starts: ResidentBase.start).
"""
from __future__ import annotations

import ctypes
import functools
import json
import logging
import mmap
import os
import sys
import weakref
from dataclasses import dataclass
from typing import Callable, Iterable

import torch

from flexmarl.config.training import TrainerConfig
from flexmarl.training.trainer import MODULE_SETTINGS, GRPOTrainer, _local

log = logging.getLogger(__name__)

MADV_POPULATE_WRITE = 23
"""madvise(2) advice (Linux 5.14+): fault a range's pages in, writable."""
ALIGN_BYTES = 512
"""Each storage's copy starts at a multiple of this in its host buffer (cache lines, and DMA
from pinned memory, like aligned addresses)."""


class HostPool:
    """One rank's host buffers for parked states, reused across swaps (pinned on CUDA).

    A park takes one buffer for all of the rank's storages (the smallest free one that fits,
    else a new one); unpark and drop give it back. Allocating is the expensive part of a swap
    (fresh pages fault on first touch; pinning is a syscall per page), so a slot that parks the
    same agents again allocates nothing once warm. At most `keep` free buffers are kept (the
    most recently given): the pool holds the parked agents plus that much spare.

    Pinned buffers are ordinary host memory page-locked by the pool itself (cudaHostRegister,
    as torch.distributed.checkpoint's stager does), not torch's pinned allocator: that one
    rounds every block up to a power of two and never gives a freed block back to the system
    (torch.cuda.empty_cache does not touch it), so parked states of changing sizes would pin
    ever more host memory. A buffer the pool lets go of is unpinned at once and freed with its
    last reference. `register` / `unregister` (a pointer and a size; a pointer): how to pin,
    CUDA's by default."""

    def __init__(self, pin: bool = False, keep: int = 1,
                 register: Callable[[int, int], None] | None = None,
                 unregister: Callable[[int], None] | None = None) -> None:
        self.pin, self.keep = pin, keep
        self.free: list[torch.Tensor] = []
        self.num_allocations = 0
        """Buffers allocated so far (what reuse keeps at its first value)."""
        self.pinned: dict[int, int] = {}
        """Buffers this pool has page-locked and not let go of: address -> bytes."""
        self._register = register or _cuda_register
        self._unregister = unregister or _cuda_unregister

    @property
    def pinned_bytes(self) -> int:
        return sum(self.pinned.values())

    def take(self, nbytes: int) -> torch.Tensor:
        """A uint8 host buffer of at least `nbytes` bytes (its contents undefined)."""
        fits = [i for i, b in enumerate(self.free) if b.numel() >= nbytes]
        if fits:
            return self.free.pop(min(fits, key=lambda i: self.free[i].numel()))
        self.num_allocations += 1
        buffer = torch.empty(nbytes, dtype=torch.uint8)
        populate([buffer.untyped_storage()])  # faulted in once, in bulk, before pinning
        if self.pin and nbytes:
            self._register(buffer.data_ptr(), nbytes)
            self.pinned[buffer.data_ptr()] = nbytes
            # A buffer dropped without the pool letting it go (a park without a pool, a pool
            # dropped whole) is unpinned when it goes: freed memory left registered would make
            # a later registration of the same addresses fail.
            weakref.finalize(buffer, _forget, self.pinned, self._unregister, buffer.data_ptr())
        return buffer

    def give(self, buffer: torch.Tensor) -> None:
        self.free.append(buffer)
        while len(self.free) > self.keep:
            self._let_go(self.free.pop(0))

    def close(self) -> None:
        """Let go of every free buffer (the parked agents' stay until given back)."""
        while self.free:
            self._let_go(self.free.pop())

    def _let_go(self, buffer: torch.Tensor) -> None:
        _forget(self.pinned, self._unregister, buffer.data_ptr())


def _forget(pinned: dict[int, int], unregister: Callable[[int], None], ptr: int) -> None:
    """Unpin a buffer the pool pinned, once."""
    if pinned.pop(ptr, None) is not None:
        try:
            unregister(ptr)
        except Exception as exc:  # at interpreter exit CUDA may be gone already
            log.info("unpinning a parked-state buffer: %s: %s", type(exc).__name__, exc)


def _cuda_register(ptr: int, nbytes: int) -> None:
    from torch.cuda._pin_memory_utils import pin_memory
    pin_memory(ptr, nbytes)


def _cuda_unregister(ptr: int) -> None:
    from torch.cuda._pin_memory_utils import unpin_memory
    unpin_memory(ptr)


@dataclass
class HostState:
    """One rank's share of a parked agent: its trainer's module objects (every device storage
    freed) and host copies of those storages, in the rank's own process."""

    trainer: GRPOTrainer | None
    """The trainer parked (unpark puts it back in place); None once its rank let go of it: a
    LoRA trainer's adapter state outlives its trainer object and comes back onto whichever
    trainer holds the base then (restore_parked)."""
    storages: list[tuple[torch.UntypedStorage, torch.Tensor]]
    """(the freed device storage, its bytes in host memory: a view of `buffer`), each storage
    once (a LoRA adapter's parameters' storages are copied but not freed: see park)."""
    tensors: dict[str, torch.Tensor]
    """local_tensors() names -> views of the host copies (what another slot's ranks pull)."""
    layout: dict[str, list]
    """name -> [global shape, dtype, sharded on dim 0, on the device (not the CPU)]."""
    meta: dict
    """version and the optimizer's hyperparameters (JSON-able)."""
    rng: dict[str, torch.Tensor]
    """"rng/cpu" (and "rng/cuda"): this rank's generator states."""
    buffer: torch.Tensor | None = None
    """The HostPool buffer that holds every copy (None: nothing to copy)."""
    mid_batch: bool = False
    """Parked between micro-batches, its accumulated gradient with it (`storages` only)."""

    @property
    def num_bytes(self) -> int:
        return sum(host.numel() for _, host in self.storages)


def local_tensors(trainer: GRPOTrainer) -> dict[str, torch.Tensor]:
    """Every tensor of this rank's training state, by name, as the rank holds it (the local
    shard of a DTensor): "model/<param>", "buffer/<name>", "ref/<param>", "refbuffer/<name>"
    (the KL reference), "optim/<param>/<key>" (AdamW's exp_avg, exp_avg_sq, step).

    With trainer.lora: "model/<param>" of the adapter's parameters alone and their
    "optim/..." (it has no reference). The frozen base, parameters and buffers, is no part of
    a LoRA trainer's state: it stays in the slot (ResidentBase), equal to the model dir."""
    out: dict[str, torch.Tensor] = {}
    if trainer.config.lora is not None:
        trained = set(trainer.trained_names)
        out |= {f"model/{n}": _local(p.detach()) for n, p in trainer.model.named_parameters()
                if n in trained}
    for prefix, module in (("", trainer.model), ("ref", trainer.reference)):
        if module is None or trainer.config.lora is not None:
            continue
        out |= {f"{prefix or 'model'}/{n}": _local(p.detach())
                for n, p in module.named_parameters()}
        out |= {f"{prefix}buffer/{n}": b for n, b in module.named_buffers()}
    names = {p: n for n, p in trainer.model.named_parameters()}
    for p, state in trainer.optimizer.state.items():
        for key, value in state.items():
            if isinstance(value, torch.Tensor):
                out[f"optim/{names[p]}/{key}"] = _local(value.detach())
    return out


def state_layout(trainer: GRPOTrainer, tensors: dict[str, torch.Tensor] | None = None
                 ) -> dict[str, list]:
    """local_tensors' names -> [global shape, dtype, sharded on dim 0, on the device]
    (`tensors`: local_tensors(trainer), if the caller has them)."""
    out: dict[str, list] = {}
    params = dict(trainer.model.named_parameters())
    for name, t in (local_tensors(trainer) if tensors is None else tensors).items():
        full = _global(trainer, name, params)
        out[name] = [list(full.shape), str(t.dtype).removeprefix("torch."), _is_sharded(full),
                     t.device.type != "cpu"]
    return out


def _global(trainer: GRPOTrainer, name: str, params: dict) -> torch.Tensor:
    """The (possibly DTensor) tensor behind a local_tensors name."""
    kind, _, rest = name.partition("/")
    if kind == "optim":
        param, _, key = rest.rpartition("/")
        return trainer.optimizer.state[params[param]][key]
    module = trainer.reference if kind.startswith("ref") else trainer.model
    return (module.get_parameter(rest) if kind in ("model", "ref")
            else module.get_buffer(rest))


def _is_sharded(t: torch.Tensor) -> bool:
    """A DTensor sharded on dim 0 (what fully_shard makes of every parameter)."""
    placements = getattr(t, "placements", ())
    return any(getattr(p, "dim", None) == 0 for p in placements)


def park(trainer: GRPOTrainer, pool: HostPool | None = None, *,
         release: bool = True) -> HostState:
    """This rank's whole share of the training state to host memory of this process (one
    buffer of `pool`, default: a new one), device storages freed (no collective). The module
    objects stay, so unpark is a copy back in place.

    Whole storages are copied, not tensor views: FSDP keeps each shard in a padded buffer, and
    tied or viewed tensors share one storage, which is then copied once. On CPU the host copy
    is a separate buffer all the same, so what the slot's "device" held is freed.

    With trainer.lora only the adapter's state moves (local_tensors); the frozen base is not
    touched. The adapter's parameters are copied but keep their storages: they belong to the
    slot's resident modules, which the next LoRA agent's adapter is set into (one adapter's
    worth of device memory stays); its AdamW state is freed.

    `release` (on CUDA): hand the freed memory back to the driver (torch.cuda.empty_cache).
    A rank under a memory fraction beside an engine (devices.colocate) keeps it cached: the
    engine sized itself at its start and cannot use it, the next agent's trainer reuses it,
    and memory handed back while an engine (re)starts on that GPU trips vLLM's memory
    profiling ("Error in memory profiling ... release GPU memory while vLLM is profiling")."""
    mid_batch = trainer._normaliser is not None
    if not mid_batch and any(p.grad is not None for p in trainer.model.parameters()):
        raise RuntimeError("park(): gradients are set; they are zeroed (None) after step()")
    tensors = local_tensors(trainer)
    layout = state_layout(trainer, tensors)
    # Mid-batch (a time-shared agent's trainer giving its devices back to its engines between
    # micro-batches): the accumulated gradient goes with it, copied back in place; the batch's
    # counters stay on the trainer object. Such a state is only unparked here, never pulled.
    grads = [_local(p.grad) for p in trainer.model.parameters()
             if mid_batch and p.grad is not None]
    pin = trainer.device.type == "cuda"
    storages: dict[int, torch.UntypedStorage] = {}
    for t in [*tensors.values(), *grads]:
        storage = t.untyped_storage()
        if storage.nbytes():
            storages.setdefault(storage.data_ptr(), storage)
    offsets, total = {}, 0
    for ptr, storage in storages.items():
        offsets[ptr] = total
        total += -(-storage.nbytes() // ALIGN_BYTES) * ALIGN_BYTES
    pool = pool or HostPool(pin=pin)
    buffer = pool.take(total) if storages else None
    copies: dict[int, tuple[torch.UntypedStorage, torch.Tensor]] = {}
    for ptr, storage in storages.items():
        host = buffer[offsets[ptr]:offsets[ptr] + storage.nbytes()]
        _copy(host, _bytes_of(storage))
        copies[ptr] = (storage, host)
    if pin:
        torch.cuda.synchronize(trainer.device)
    views = {}
    for name, t in tensors.items():
        storage = t.untyped_storage()
        if storage.nbytes() == 0:  # an empty shard (more ranks than rows)
            views[name] = torch.empty(t.shape, dtype=t.dtype)
            continue
        host = copies[storage.data_ptr()][1]
        views[name] = torch.empty(0, dtype=t.dtype).set_(
            host.untyped_storage(), host.storage_offset() // t.element_size()
            + t.storage_offset(), t.shape, t.stride())
    resident = set()
    if trainer.config.lora is not None:
        resident = {t.untyped_storage().data_ptr() for name, t in tensors.items()
                    if name.startswith("model/")}
    for ptr, storage in storages.items():
        if ptr not in resident:
            storage.resize_(0)
    if pin and release:
        torch.cuda.empty_cache()  # hand the memory back (a time-shared engine wakes into it)
    rng = {"rng/cpu": torch.get_rng_state()}
    if trainer.device.type == "cuda":
        rng["rng/cuda"] = torch.cuda.get_rng_state(trainer.device)
    meta = {"version": trainer.version, "param_groups": [
        {k: v for k, v in g.items() if k != "params"} for g in trainer.optimizer.param_groups]}
    return HostState(trainer, list(copies.values()), views, layout, meta, rng, buffer,
                     mid_batch)


def unpark(host: HostState, pool: HostPool | None = None) -> GRPOTrainer:
    """Bring back what park() saved, bit for bit, into the same storages; the trainer. The
    host buffer goes back to `pool` (if given) for the next park."""
    for storage, copy in host.storages:
        storage.resize_(copy.numel())
    populate(storage for storage, _ in host.storages)
    for storage, copy in host.storages:
        _copy(_bytes_of(storage), copy)
    trainer = host.trainer
    if trainer.device.type == "cuda":
        torch.cuda.synchronize(trainer.device)
    set_rng(trainer, host.rng)
    if pool is not None and host.buffer is not None:
        pool.give(host.buffer)
    host.storages, host.tensors, host.buffer = [], {}, None
    return trainer


def restore_parked(trainer: GRPOTrainer, host: HostState) -> int:
    """A state this rank parked into `trainer`, another trainer of the same modules' layout and
    sharding (with trainer.lora: a trainer on the resident base, now or rebuilt since):
    AdamW's state created, each tensor filled from its host copy (a pull from this rank's own
    shards), the version and the RNG; the bytes copied. `host` stays as it is: the caller
    frees it once every rank of the group has its state back."""
    if host.mid_batch:
        raise RuntimeError("a state parked in the middle of a global batch only comes back in "
                           "place (unpark): its accumulated gradient is not part of it")
    tensors = prepare_pull(trainer, host.layout, host.meta)
    by_rank = pull_pieces(host.layout, sharded_here(trainer), trainer.world_size,
                     trainer.world_size, trainer.rank)
    num_bytes = sum(fill(tensors, pieces, slices(host, pieces)) for pieces in by_rank.values())
    if trainer.device.type == "cuda":  # fill's copies are asynchronous: done before reuse
        torch.cuda.synchronize(trainer.device)
    set_rng(trainer, host.rng)
    return num_bytes


def base_key(model_dir: str, config: TrainerConfig, world_size: int) -> tuple:
    """What a rank's resident LoRA base is for: the model directory, the group's world size,
    the settings its modules were built with (trainer.MODULE_SETTINGS: the adapter's spec,
    precision, resharding, checkpointing, compile, device) and the seed (a fresh adapter on
    it is the one PEFT drew from that seed when the base was built: ResidentBase.start)."""
    settings = [json.dumps(getattr(config, k), sort_keys=True) for k in MODULE_SETTINGS]
    return (os.path.realpath(model_dir), world_size, config.seed, *settings)


@dataclass
class ResidentBase:
    """One rank's frozen LoRA base, kept in the slot while its LoRA agents swap: the modules of
    `trainer` (PEFT's model over the base, FSDP-sharded), which every LoRA trainer of the same
    `key` (base_key) takes (GRPOTrainer(base=...)) instead of building and reading its own.
    An agent's adapter and AdamW state move (park / restore_parked / a pull); the base never
    does. Built once by a fresh LoRA trainer (`of`); freed by `release`."""

    key: tuple
    trainer: GRPOTrainer
    """The trainer that built the modules (its own AdamW state is freed when it parks)."""
    fresh: dict[str, torch.Tensor]
    """This rank's adapter shards as the build left them (host copies): PEFT's init from the
    seed, what a fresh trainer of this key starts from."""
    rng: dict[str, torch.Tensor]
    """The RNG state right after the build (a fresh trainer's)."""

    @classmethod
    def of(cls, trainer: GRPOTrainer, key: tuple) -> ResidentBase:
        """The resident base of a LoRA trainer just built from its model directory (fresh: its
        adapter as PEFT initialised it, its AdamW state empty)."""
        fresh = {name: t.to("cpu", copy=True) for name, t in local_tensors(trainer).items()}
        rng = {"rng/cpu": torch.get_rng_state()}
        if trainer.device.type == "cuda":
            rng["rng/cuda"] = torch.cuda.get_rng_state(trainer.device)
        return cls(key, trainer, fresh, rng)

    def start(self, trainer: GRPOTrainer) -> None:
        """Make `trainer` (on these modules, its AdamW state empty) a fresh trainer: the adapter
        and RNG a fresh GRPOTrainer of this key builds, bit for bit, without its base."""
        tensors = local_tensors(trainer)
        if tensors.keys() != self.fresh.keys():
            raise RuntimeError("ResidentBase.start: the trainer's adapter is not this base's "
                               "(or its AdamW state is not empty)")
        with torch.no_grad():
            for name, t in self.fresh.items():
                tensors[name].copy_(t)
        set_rng(trainer, self.rng)

    def release(self, empty_cache: bool = True) -> None:
        """Free the base's device memory (a SwapIn that needs another base, or a full model):
        every storage of the modules, and the building trainer's AdamW state, resized to 0.
        Explicitly, not by dropping references: FSDP's modules and hooks hold reference cycles,
        which only the cycle collector would free. `empty_cache`: as park's `release`."""
        tensors = [_local(t.detach()) for t in [*self.trainer.model.parameters(),
                                                *self.trainer.model.buffers()]]
        tensors += [_local(v) for state in self.trainer.optimizer.state.values()
                    for v in state.values() if isinstance(v, torch.Tensor)]
        for t in tensors:
            t.untyped_storage().resize_(0)
        if self.trainer.device.type == "cuda" and empty_cache:
            torch.cuda.empty_cache()


def set_rng(trainer: GRPOTrainer, rng: dict[str, torch.Tensor]) -> None:
    torch.set_rng_state(rng["rng/cpu"])
    if "rng/cuda" in rng and trainer.device.type == "cuda":
        torch.cuda.set_rng_state(rng["rng/cuda"], trainer.device)


def populate(storages: Iterable[torch.UntypedStorage]) -> None:
    """Fault in the pages of newly allocated host storages, one madvise(MADV_POPULATE_WRITE)
    each (Linux 5.14+; elsewhere a no-op: the copy faults them in). A fresh page costs the
    kernel a fault and zeroing it either way, but in bulk about half as much as page by page
    during a copy (here: 0.25 s against 0.75 s for SmolLM2's 1.6 GB state). Pages already
    present are left as they are, so this may run beside copies into the same storages."""
    if sys.platform != "linux":
        return
    libc, page = _libc(), mmap.PAGESIZE
    seen = set()
    for storage in storages:
        ptr, nbytes = storage.data_ptr(), storage.nbytes()
        if storage.device.type != "cpu" or not nbytes or ptr in seen:
            continue
        seen.add(ptr)
        start = ptr - ptr % page
        if libc.madvise(start, ptr + nbytes - start, MADV_POPULATE_WRITE):
            return  # an older kernel (EINVAL): page faults will do it


@functools.cache
def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return libc


def _copy(dst: torch.Tensor, src: torch.Tensor) -> None:
    """dst[:] = src. Between host tensors of one dtype and shape, both contiguous: one libc
    memmove (torch's copy_ wakes its OpenMP team on every call, which on a busy 2-core machine
    costs more than copying a storage of a few MB: parking SmolLM2's 1,090 storages took 4-8x
    longer). Otherwise copy_, asynchronous between pinned memory and a GPU (the caller
    synchronizes)."""
    if (dst.device.type == src.device.type == "cpu" and dst.dtype == src.dtype
            and dst.shape == src.shape and dst.is_contiguous() and src.is_contiguous()):
        ctypes.memmove(dst.data_ptr(), src.data_ptr(), src.numel() * src.element_size())
    else:
        dst.copy_(src, non_blocking=True)


def _bytes_of(storage: torch.UntypedStorage) -> torch.Tensor:
    """A uint8 tensor over all of `storage` (whatever the dtypes of the tensors on it)."""
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)


def chunk_rows(rows: int, world_size: int, rank: int) -> tuple[int, int]:
    """Rows [lo, hi) of dim 0 that `rank` holds: FSDP2 shards with torch.chunk (chunks of
    ceil(rows / world_size); the last ranks may hold fewer rows, or none)."""
    size = -(-rows // world_size)
    lo = min(rank * size, rows)
    return lo, min(lo + size, rows)


def pull_pieces(layout: dict[str, list], mine: dict[str, bool], src_world: int,
              world_size: int, rank: int) -> dict[int, list[list]]:
    """Which slices of a group of `src_world` ranks (its `layout`: state_layout of its rank
    0) this rank of `world_size` needs for its own tensors (`mine`: name -> sharded here):
    source rank -> [[name, src_lo, src_hi, my_lo], ...], rows of dim 0 in each side's local
    tensor; src_hi -1: the whole tensor (not sharded on either side, or 0-dim). A name
    replicated at the source comes from source rank (rank % src_world), spreading the load."""
    by_rank: dict[int, list[list]] = {}
    for name, (shape, _, src_sharded, _) in layout.items():
        sharded = mine[name]
        if not shape or (not sharded and not src_sharded):
            by_rank.setdefault(rank % src_world, []).append([name, 0, -1, 0])
            continue
        lo, hi = chunk_rows(shape[0], world_size, rank) if sharded else (0, shape[0])
        sources = ([(w, *chunk_rows(shape[0], src_world, w)) for w in range(src_world)]
                   if src_sharded else [(rank % src_world, 0, shape[0])])
        for w, src_lo, src_hi in sources:
            a, b = max(lo, src_lo), min(hi, src_hi)
            if a < b:
                by_rank.setdefault(w, []).append([name, a - src_lo, b - src_lo, a - lo])
    return by_rank


def prepare_pull(trainer: GRPOTrainer, layout: dict[str, list], meta: dict
                 ) -> dict[str, torch.Tensor]:
    """Make an empty-built trainer ready to take another group's state of `layout`: AdamW's
    state tensors created (uninitialised) where the source has them, its hyperparameters and
    version set; this rank's tensors to fill, by name (each must be filled completely)."""
    params = dict(trainer.model.named_parameters())
    for name, (shape, dtype, _, on_device) in layout.items():
        kind, _, rest = name.partition("/")
        if kind != "optim":
            continue
        param, _, key = rest.rpartition("/")
        p = params[param]
        if list(shape) == list(p.shape):  # a moment: sharded like its parameter
            value = torch.empty_like(p.detach(), dtype=getattr(torch, dtype))
        else:  # AdamW's step counter (on the CPU unless the source kept it on the device)
            value = torch.empty(shape, dtype=getattr(torch, dtype),
                                device=trainer.device if on_device else "cpu")
        trainer.optimizer.state[p][key] = value
    for group, saved in zip(trainer.optimizer.param_groups, meta.get("param_groups", [])):
        group.update(saved)
    trainer.version = int(meta.get("version", 0))
    tensors = local_tensors(trainer)
    missing, extra = set(layout) - set(tensors), set(tensors) - set(layout)
    if missing or extra:
        raise ValueError(f"the source's training state does not fit this trainer (another model "
                         f"or train_layers?): it has {sorted(missing)[:3]} this one lacks, "
                         f"lacks {sorted(extra)[:3]}")
    return tensors


def sharded_here(trainer: GRPOTrainer) -> dict[str, bool]:
    """local_tensors' names -> sharded on dim 0 on this rank's group."""
    return {name: spec[2] for name, spec in state_layout(trainer).items()}


def slices(host: HostState, pieces: list[list]) -> dict[str, torch.Tensor]:
    """What a source rank serves: its parked tensors' rows [src_lo, src_hi) (-1: whole) per
    piece of a pull_pieces, as views of its host memory (no copy)."""
    return {name: host.tensors[name] if hi < 0 else host.tensors[name][lo:hi]
            for name, lo, hi, _ in pieces}


def fill(tensors: dict[str, torch.Tensor], pieces: list[list],
         got: dict[str, torch.Tensor]) -> int:
    """Copy pulled slices into this rank's tensors at their rows; the bytes copied."""
    num_bytes = 0
    with torch.no_grad():
        for name, lo, hi, mine in pieces:
            src, dst = got[name], tensors[name]
            _copy(dst if hi < 0 else dst[mine:mine + hi - lo], src)
            num_bytes += src.numel() * src.element_size()
    return num_bytes
