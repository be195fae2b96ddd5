"""Training: trainer slots bound to agents on demand, FSDP2 trainers, GRPO maths.

    slots.py    SlotAllocator: which agent gets which trainer slot (pure)
    pool.py     TrainerPool: binds slots to agents, swaps idle agents' state to host memory
    worker.py   the trainer worker process: one rank of an agent's FSDP2 group, as an actor
    trainer.py  GRPOTrainer: forward, backward, accumulate, step (torch.distributed)
    grpo.py     group-relative advantages and the clipped policy loss (pure torch)

Imports only the shared leaves (protocol, clock) and runtime/.
"""
