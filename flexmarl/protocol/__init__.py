"""FlexMARL's message kinds (100 and up) and their typed dataclasses, in one place.

    kinds.py     FlexKind: one number per message of flexmarl.protocol (100 and up)
    rollout.py   the rollout layer's messages: generate calls, load reports, weight updates
    training.py  the training layer's messages: micro-batches, steps, swaps and saves of the
                 trainer slots

Built on the runtime's codec (`runtime.protocol.message`: msgpack, tensors as zero-copy frames,
no pickle; its own kinds are 1-99). Who sends each request, who handles it, and its reply:

    request          sent by                                   handled by         reply
    Generate         InstancePool.generate (rollout/pool.py),  RolloutWorker      GenerateReply
                     for every ctx.generate of a workflow      (rollout/worker.py)
    SubscribeLoad    InstancePool.start / a replacement        RolloutWorker      LoadReport,
                                                                                   then pushed
                                                                                   on change
    WeightUpdate     push_weights (weights/stage.py):          RolloutWorker      WeightUpdate-
                     the loop's sync, a moved or replacement                      Done
                     instance loading its agent's weights
                     (a source: the file the trainer published)
    FetchWeights     a RolloutWorker on another host than the  TrainerWorker      WeightUpdate
                     version's file (its source's holders)     (rank 0), or a
                                                               RolloutWorker that
                                                               holds the version
    TrainBeginBatch  TrainSession (orchestrator/batch.py)      TrainerWorker,     None
    TrainMicroBatch  TrainSession                              rank 0 of          TrainStats
    TrainStep        TrainSession                              training/worker.py TrainStepDone
    ExportWeights    TrainSession.export, TrainerPool.export   which runs the     WeightUpdate
                     (publish: a file on the trainer's host)                      (its source)
    SwapIn           TrainerPool (binding an agent to a slot)  call on every      SwapDone
    SwapOut          TrainerPool (evicting an idle agent)      rank; followers    Parked
    DropParked       TrainerPool (the agent moved elsewhere)   refuse requests    None
    SaveState        TrainerPool.save (snapshots, checkpoints) (rank 0)           StateSaved
    AwaitSaved       TrainerPool.save, after the binding       rank 0 (concurrent) StateSaved
    ExportState      tests and tools (the whole state here)    (rank 0)           TrainState
    FetchShards      a trainer rank pulling a parked agent     every rank, its    ShardData
                     (SwapIn with a source)                    own shards
    SlotStatus       anyone asking what a slot is doing        TrainerWorker      SlotStatus-
                     (answered at once, even mid-step)         (rank 0)           Reply

No tensor of a swap, a snapshot or a checkpoint passes through the process that sends these
messages, nor the weights of a sync (ExportWeights.publish: rank 0 writes them on its host, and
the instances read that file or fetch it from rank 0 or an instance that holds it, FetchWeights). SwapOut parks each rank's
shards in its own process (Parked.ranks says where), a SwapIn puts them back or pulls them rank
to rank (FetchShards, resharded); SaveState has the ranks write their shards into a dir
(flexmarl.training.state_files) that SwapIn.state_dir restores from. Only ExportState and SwapIn.tensors carry a whole TrainState: for tests and tools on small models.
Kinds 116 and 117 (the retired Offload/Onload) are not reused.
"""
from __future__ import annotations

from flexmarl.protocol.kinds import FlexKind
from flexmarl.protocol.rollout import (SamplingParams, Sample, Generate, GenerateReply,
    SubscribeLoad, LoadReport, WeightUpdate, WeightUpdateDone, WeightTransfer, Sleep, WakeUp, EngineMemory)
from flexmarl.protocol.training import (TrainBeginBatch, TrainMicroBatch, TrainStats, TrainStep,
    TrainStepDone, ExportWeights, FetchWeights, SwapDone, SendWeights, SwapIn, SwapOut, Parked, FetchShards,
    ShardData, DropParked, SaveState, AwaitSaved, StateSaved, ExportState, TrainState, SlotStatus,
    SlotStatusReply)

__all__ = ["FlexKind", "SamplingParams", "Sample", "Generate", "GenerateReply", "SubscribeLoad",
           "LoadReport", "WeightUpdate", "WeightUpdateDone", "WeightTransfer", "Sleep", "WakeUp",
           "EngineMemory", "TrainBeginBatch", "TrainMicroBatch", "TrainStats", "TrainStep",
           "TrainStepDone", "ExportWeights", "FetchWeights", "SwapDone", "SendWeights", "SwapIn", "SwapOut",
           "Parked", "FetchShards", "ShardData", "DropParked", "SaveState", "AwaitSaved",
           "StateSaved", "ExportState", "TrainState", "SlotStatus", "SlotStatusReply"]
