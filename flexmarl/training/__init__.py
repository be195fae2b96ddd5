"""Training: trainer slots bound to agents on demand, FSDP2 trainers, GRPO maths.

    slots.py    SlotAllocator: which agent gets which trainer slot; TeamOrder: the order
                agents ask in (both pure); ParkedState: where a swapped-out agent's state is
    pool.py     TrainerPool: binds slots to agents, swaps idle agents' state to host memory
    recovery.py SlotRecovery: a dead slot's agents back to their snapshots, the slot replaced
    slot_connection.py  a slot's connection: busy time, deadlines, death
    worker.py   the trainer worker process: one rank of an agent's FSDP2 group, as an actor
    rank.py     what one rank does in its command thread: process group, swaps, pulls, sends
    parking.py  the swap path's data movement: shards to host memory and back, pulls
    saves.py    Saves: where each agent's recovery snapshot is, and its copies into the run's
                state dir (the checkpoints `--resume` takes)
    state_files.py  each agent's whole training state per step, on disk (snapshots, --resume)
    sharded_state.py  that state written and read by the ranks, each its own shards (DCP)
    safe_dcp.py SafeReader: torch DCP's FileSystemReader, reading `.metadata` without its pickle
    ordered.py  Turns: arrival order kept for commands that are served concurrently
    trainer.py  GRPOTrainer: forward, backward, accumulate, step (torch.distributed)
    sharding.py the policy's modules: built, frozen (train_layers), sharded with FSDP2
    prefix.py   the policy's forward over a micro-batch, computing what its rows share once
    logits.py   token log-probabilities from final hidden states, the LM head applied a chunk
                of positions at a time (never a whole micro-batch's logits)
    adapter.py  a LoRA trainer's policy (trainer.lora): PEFT's layers on the frozen base, the
                adapter's tensors under PEFT's names, the base alone (the KL reference)
    grpo.py     token log-probabilities and the clipped policy loss (pure torch)

Imports only the shared leaves (protocol, clock, models/, sampling/, weights/) and runtime/ (whose
Lifecycle replaces dead slots), never rollout/: the two are peers.
"""
