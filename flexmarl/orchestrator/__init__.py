"""The joint orchestrator: the team's workflows, the experience store and the one training loop.

    orchestrator.py  Orchestrator: runs the workflow on many tasks at once (ctx.generate),
                     turns into the store, exports and pushes weights
    agents.py        one agent's state: versions, step gate, busy clocks (AgentRuntime)
    prompts.py       how chat messages reach each agent's model: its chat template, or the
                     plain question/answer rendering for a base model (pure)
    store.py         ExperienceStore: one table per agent, GRPO groups as they complete
    advantage.py     grpo_advantages: group-relative advantages, per completed group (pure)
    policy.py        PipelinePolicy: sync, micro_batch, one_step_off, bounded (pure)
    batch.py         TrainSession: an agent's global batch, micro-batch by micro-batch, one step
    loop.py          PipelineRun: the rollout producer and one loop per agent, step records
    lane.py          TrainerLane: one lane for the trainer requests of agents whose slots share
                     CPU cores (pure asyncio)
    records.py       StepRecorder: what the pools did since the last step record (moves, swaps,
                     faults, loads)
    evaluate.py      the workflow on held-out tasks with training off (section `eval`)
    heldout.py       held-out accuracy before and after training, each agent's change with its
                     standard error

Imports only rollout/, training/ and the shared leaves below it; nothing here knows the
launcher, the gateway or the observers.
"""
