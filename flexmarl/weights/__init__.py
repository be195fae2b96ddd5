"""Weight sync: one interface, one module per transport holding both of its ends (a shared
leaf: the run's end, the rollout instance's and the trainer's all import it).

    base.py     Transport / Transfer (begin, send, finish, abort), SyncReport, weights_nbytes
    sync.py     WeightSync: the one call the loop makes, sync(agent, version, update), and what
                every agent serves (versions, where each served version is, a lock per agent)
                for the pool's moves and new instances; it never holds a tensor
    published.py a version written once by its trainer on its host (/dev/shm), read there by
                the instances under its lock or fetched by those on other hosts from a holder
                (the trainer, or an instance that holds it)
    ownership.py who owns published files (a run's lease, held by its live processes), and
                what a process may serve (only files it wrote or read, by identity)
    stage.py    staged: the published version's name to every instance (push_weights,
                WeightUpdate.source), CPU and any engine, LoRA adapters, time-shared agents
    direct.py   direct (GPU): vLLM's weight-transfer engines, NCCL or CUDA IPC; the run's end
                (DirectTransport), the trainer's (Sender, FanOut, cast_source) and the
                instance's (engine_phase), and the choice of transport (resolve_transfer)
    codec.py    CUDA IPC handles as plain data: encoded by the trainer, decoded by the instance
"""
