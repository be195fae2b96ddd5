"""Weight sync: one interface, one module per transport holding both of its ends (a shared
leaf: the run's end, the rollout instance's and the trainer's all import it).

    base.py     Transport / Transfer (begin, send, finish, abort), SyncReport, weights_nbytes
    sync.py     WeightSync: the one call the loop makes, sync(agent, version, update), and what
                every agent serves (versions, served weights, partial updates merged, a lock
                per agent) for the pool's moves and new instances
    stage.py    staged: the tensors through the run (push_weights, WeightUpdate), CPU and any engine
    direct.py   direct (GPU): vLLM's weight-transfer engines, NCCL or CUDA IPC; the run's end
                (DirectTransport), the trainer's (Sender, FanOut, cast_source) and the
                instance's (engine_phase), and the choice of transport (resolve_transfer)
    codec.py    CUDA IPC handles as plain data: encoded by the trainer, decoded by the instance
"""
