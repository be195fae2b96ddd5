"""Training: trainer slots bound to agents on demand, FSDP2 trainers, GRPO maths.

    slots.py    SlotAllocator: which agent gets which trainer slot; TeamOrder: the order
                agents ask in (both pure)
    pool.py     TrainerPool: binds slots to agents, swaps idle agents' state to host memory
    slot_connection.py  a slot's connection: busy time, deadlines, death
    worker.py   the trainer worker process: one rank of an agent's FSDP2 group, as an actor
    rank.py     what one rank does in its command thread: process group, swaps, pulls, sends
    parking.py  the swap path's data movement: shards to host memory and back, pulls
    transfer.py the trainer's side of GPU weight sync (vLLM's trainer engine)
    trainer.py  GRPOTrainer: forward, backward, accumulate, step (torch.distributed)
    sharding.py the policy's modules: built, frozen (train_layers), sharded with FSDP2
    adapter.py  a LoRA trainer's policy (trainer.lora): PEFT's layers on the frozen base, the
                adapter's tensors under PEFT's names, the base alone (the KL reference)
    grpo.py     token log-probabilities and the clipped policy loss (pure torch)

Imports only the shared leaves (protocol, clock, models/, sampling/, weights/) and runtime/ (whose
Lifecycle replaces dead slots), never rollout/: the two are peers.
"""
