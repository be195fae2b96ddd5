"""Weight sync on GPU through vLLM's own weight-transfer engines (vllm.distributed.weight_transfer):
which way a run syncs, and the instance's side.

    pool.push_direct(agent, version) ─► SendWeights(version, instances) ─► trainer rank 0
      every rank of the slot: vLLM's trainer engine over the bound model (flexmarl.training.transfer)
        ("nccl": rank 0 broadcasts to every instance's GPUs; "ipc": CUDA IPC handles of each
         rank's GPU, for instances colocated on their trainer's GPUs)
      rank 0's FanOut client ─► WeightTransfer phases to every instance at once (runtime transport)
      each instance (RolloutWorker ─► engine_phase on its AsyncLLM):
        init (once per group) ─► start (gate closed, running requests done) ─► update (receive,
        concurrently with the broadcast) ─► finish (serves `version`, gate open)

The staged path (flexmarl.rollout.weight_sync: tensors through the run, loaded from a file)
stays the CPU path and the fallback; this one moves the bytes GPU to GPU and never through the
run. The zero-staleness gate is the rollout worker's, as for a staged update: an instance takes
no request between "start" and "finish", so no sample mixes two versions.
"""
from __future__ import annotations

from typing import Any

from flexmarl.checks import ConfigError

DIRECT = ("nccl", "ipc")


def resolve_transfer(setting: str, *, vllm_on_gpu: bool, trainer_on_gpu: bool,
                     colocate: bool) -> str:
    """rollout.weight_transfer for this run: "auto" is nccl (ipc when colocated) where vLLM and
    the trainers are on GPU, else stage; an explicit direct mode without GPUs is an error."""
    gpu = vllm_on_gpu and trainer_on_gpu
    if setting == "auto":
        return ("ipc" if colocate else "nccl") if gpu else "stage"
    if setting in DIRECT and not gpu:
        raise ConfigError(
            f'rollout.weight_transfer = "{setting}" needs vLLM and the trainers on GPU (a CUDA '
            f"build of vllm, trainer.device = \"cuda\", GPUs placed by [devices]); here vLLM is "
            f"{'on GPU' if vllm_on_gpu else 'not on GPU'} and the trainers "
            f"{'are' if trainer_on_gpu else 'are not'}: use \"stage\" or \"auto\"")
    if setting == "ipc" and not colocate:
        raise ConfigError('rollout.weight_transfer = "ipc" needs each instance on its trainer\'s '
                          "GPUs: set devices.colocate = true, or use \"nccl\"")
    return setting


async def engine_phase(llm: Any, phase: str, info: dict, state: dict) -> None:
    """One WeightTransfer phase on an AsyncLLM (`state` remembers whether it has a group)."""
    from vllm.distributed.weight_transfer.base import (WeightTransferInitRequest,
                                                       WeightTransferUpdateRequest)
    if phase == "init":
        if state.get("joined"):  # a new group (another trainer, new members): leave the old
            await llm.shutdown_weight_transfer_engine()
        await llm.init_weight_transfer_engine(WeightTransferInitRequest(init_info=info))
        state["joined"] = True
    elif phase == "start":
        await llm.start_weight_update()
    elif phase == "update":
        if "ipc_handles_plain" in info:  # CUDA IPC: the handles back as torch objects
            from flexmarl.weights.codec import plain_handles
            info = dict(info)
            info["ipc_handles"] = plain_handles(info.pop("ipc_handles_plain"))
        await llm.update_weights(WeightTransferUpdateRequest(update_info=info))
    elif phase == "finish":
        await llm.finish_weight_update()
        await llm.reset_prefix_cache()  # no KV entry computed with the old weights is reused
    else:
        raise ValueError(f"unknown weight-transfer phase {phase!r}")
