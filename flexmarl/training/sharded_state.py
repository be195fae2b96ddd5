"""A trainer's whole state written and read by its ranks, each its own shards, with
torch.distributed.checkpoint (DCP): what snapshots, checkpoints and --resume move, so that no
tensor of it passes through the orchestrator.

    rank r: GRPOTrainer ─ get_state_dict (sharded DTensors) ─► flat names ─► dcp.async_save
              "model/<param>", "optim/<param>/<key>", "rng/cpu" (rank 0 only)
              staging: one copy of the rank's shards in host memory (the step goes on after it)
              then a background thread writes DIR/__r_0.distcp (rank 0 also DIR/.metadata)
    restore: a fresh trainer of any rank count ─ get_state_dict ─► dcp.load (each rank reads the
              rows it holds: resharding) ─► set_state_dict; version, AdamW's hyperparameters
              and the RNG from meta

The names are those of flexmarl.training.trainer.export_state, so a state written here reads
back in one process as the same TrainState (flexmarl.training.state_files). The directory
around the files (temp name, meta.json, the atomic rename) is flexmarl.training.state_files'.
"""
from __future__ import annotations

import shutil
import time
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from flexmarl.training.trainer import GRPOTrainer, model_state, state_options

if TYPE_CHECKING:
    from flexmarl.protocol import StateSaved


def _flat(trainer: GRPOTrainer) -> tuple[dict[str, Any], dict, dict]:
    """The trainer's state as DCP saves it: flat names -> this rank's (sharded) tensors; and
    the two state dicts they came from (set_state_dict takes them back after a load). With
    trainer.lora the adapter's tensors and their AdamW state alone, not the frozen base."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_sd, optim_sd = get_state_dict(trainer.model, trainer.optimizer,
                                        options=state_options(trainer, full_state_dict=False))
    model_sd = model_state(trainer, model_sd)
    flat: dict[str, Any] = {f"model/{k}": v for k, v in model_sd.items()}
    for name, state in optim_sd["state"].items():
        for key, value in state.items():
            flat[f"optim/{name}/{key}"] = value
    return flat, model_sd, optim_sd


def write(trainer: GRPOTrainer, path: str, group: dist.ProcessGroup | None
          ) -> tuple[Future, dict, int]:
    """Start writing this rank's shards of the trainer's state into `path` (a collective: every
    rank of the group calls it, in the same order). Returns once the shards are staged (copied
    to host memory: training may go on); the future is done when every rank's file and DCP's
    index are written (on rank 0; elsewhere when this rank's part is). Also the state's JSON
    metadata (version, AdamW's param_groups) and the bytes this rank stages."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

    if trainer._normaliser is not None:
        raise RuntimeError("a state write in the middle of a global batch: step() first (the "
                           "accumulated gradient is not part of the saved state)")
    flat, _, optim_sd = _flat(trainer)
    if trainer.rank == 0:  # every rank restores rank 0's generator, as load_state does
        flat["rng/cpu"] = torch.get_rng_state()
    cuda = trainer.device.type == "cuda"
    stager = DefaultStager(StagingOptions(use_pinned_memory=cuda, use_shared_memory=False,
                                          use_async_staging=False, use_non_blocking_copy=cuda))
    out = dcp.async_save(flat, storage_writer=dcp.FileSystemWriter(path, sync_files=True),
                         process_group=group, async_stager=stager)
    done = getattr(out, "upload_completion", out)  # an AsyncSaveResponse or the Future itself
    meta = {"version": trainer.version, "param_groups": optim_sd["param_groups"]}
    return done, meta, sum(_bytes(t) for t in flat.values())


def read(trainer: GRPOTrainer, path: str, meta: dict, group: dist.ProcessGroup | None) -> int:
    """Fill a freshly built trainer (any rank count) with the state in `path` (a collective):
    each rank reads the rows of its own shards; AdamW's state is created first, as a resumed
    optimizer needs it. The bytes this rank read."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_state_dict

    from flexmarl.training.safe_dcp import SafeReader

    flat, model_sd, optim_sd = _flat(trainer)  # get_state_dict creates AdamW's state tensors
    flat["rng/cpu"] = torch.get_rng_state()
    # SafeReader: .metadata is a pickle, and the run dir may not be this machine's own.
    dcp.load(flat, storage_reader=SafeReader(path), process_group=group)
    for name, state in optim_sd["state"].items():  # plain tensors (AdamW's step) load into
        for key in state:                           # new objects: take those back
            state[key] = flat[f"optim/{name}/{key}"]
    model_sd.update({k.removeprefix("model/"): v for k, v in flat.items()
                     if k.startswith("model/")})
    if meta.get("param_groups"):
        optim_sd["param_groups"] = meta["param_groups"]
    with torch.no_grad():
        set_state_dict(trainer.model, trainer.optimizer, model_state_dict=model_sd,
                       optim_state_dict=optim_sd,
                       options=state_options(trainer, full_state_dict=False))
    torch.set_rng_state(flat["rng/cpu"])
    trainer.version = int(meta.get("version", 0))
    return sum(_bytes(t) for t in flat.values())


def write_model(trainer: GRPOTrainer, agent: str, spec: dict[str, Any]) -> "StateSaved":
    """The trainer's weights gathered on rank 0 (a collective) and written there as a loadable
    model directory spec["path"]/version-N beside the base model spec["model_dir"]'s files
    (flexmarl.models.build.write_model_dir), or with trainer.lora as an adapter directory in
    PEFT's format over that base (flexmarl.models.lora.write_adapter); the reply names it
    (rank 0)."""
    from pathlib import Path

    from flexmarl.models.build import write_model_dir
    from flexmarl.models.lora import LoraSpec, merged_weights, write_adapter
    from flexmarl.protocol import StateSaved, WeightUpdate

    started = time.perf_counter()
    tensors = trainer.export_weights()
    if trainer.rank != 0:
        return StateSaved(agent, -1, trainer.version, "", 0)
    if trainer.config.lora is not None:
        lora = LoraSpec.from_dict(trainer.config.lora)
        target = write_adapter(Path(spec["path"]) / f"version-{trainer.version}", lora, tensors,
                               spec["model_dir"])
        if spec.get("merged"):  # the base read afresh on rank 0: one more model, this once
            merged = merged_weights(spec["model_dir"], lora, tensors)
            write_model_dir(WeightUpdate(trainer.version, merged), spec["model_dir"], target,
                            name="merged")
    else:
        update = WeightUpdate(trainer.version, tensors,
                              complete=not trainer.config.train_layers)
        target = write_model_dir(update, spec["model_dir"], spec["path"])
    return StateSaved(agent, -1, trainer.version, str(target),
                      sum(t.numel() * t.element_size() for t in tensors.values()),
                      time.perf_counter() - started)


def _bytes(t: Any) -> int:
    if not isinstance(t, torch.Tensor):
        return 0
    local = t.to_local() if hasattr(t, "to_local") else t
    return local.numel() * local.element_size()


class StateWriter:
    """One rank's state writes (flexmarl.training.rank.Rank holds one): one at a time, in the
    order rank 0 replays them, each started in the command thread and finished in the
    background; rank 0 then moves the written dir into place (state_files.commit_step) on a
    thread of its own and keeps, per path, the future AwaitSaved waits on."""

    def __init__(self, rank: int, group: dist.ProcessGroup | None) -> None:
        self.rank, self.group = rank, group
        self._writing: Future | None = None
        self.pending: dict[str, Future] = {}
        """path -> done when that state is in place (rank 0): (agent, step, version, bytes)."""
        self._committer = None

    def save(self, trainer: GRPOTrainer, agent: str, spec: dict[str, Any]) -> "StateSaved":
        """Stage `trainer`'s state and start its write (spec: tmp, path, step, from SaveState);
        every rank calls it. The previous write ends first: two writes' collectives must not
        interleave, and a slot's writes then land in order."""
        from concurrent.futures import ThreadPoolExecutor

        from flexmarl.protocol import StateSaved
        from flexmarl.training.state_files import commit_step

        started = time.perf_counter()
        self.wait()
        done, meta, num_bytes = write(trainer, spec["tmp"], self.group)
        self._writing = done
        if self.rank == 0:
            if self._committer is None:
                self._committer = ThreadPoolExecutor(1, thread_name_prefix="state-commit")

            def commit() -> tuple[str, int, int, int]:
                try:
                    done.result()
                except BaseException:
                    shutil.rmtree(spec["tmp"], ignore_errors=True)
                    raise
                _, size = commit_step(spec["tmp"], spec["path"], agent, int(spec["step"]),
                                      meta["version"], meta)
                return agent, int(spec["step"]), meta["version"], size

            self.pending[spec["path"]] = self._committer.submit(commit)
        return StateSaved(agent, int(spec["step"]), meta["version"], "", num_bytes,
                          time.perf_counter() - started)

    def wait(self) -> None:
        """Until this rank's last write has ended (its error, if any, is AwaitSaved's)."""
        if self._writing is not None:
            try:
                self._writing.result()
            except Exception:  # noqa: BLE001 (reported by AwaitSaved on rank 0)
                pass
            self._writing = None
