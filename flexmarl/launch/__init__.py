"""Starting runs: wiring the parts together, placing workers, the command lines, checkpoints.

    build.py       build_run(team, config): the one reader of the whole Config; each part's sections
    run.py         train(team, config): builds every component and hands each its collaborators
    model_dirs.py  which model directory each agent's workers load; weights saved as one
    lora_units.py  which agents share rollout instances: LoRA agents on one base model
    gguf.py        pretrained GGUF models converted once to cached float32 model directories
    placement.py   worker specs, CPU cores and GPUs of rollout instances and trainer ranks
    devices.py     the GPU placement planner (pure): which GPUs each worker owns, on which host
    layout.py      what goes where before any process starts: the trainer slots (sizes,
                   time-shared groups' own slots) and the GPU placement
    task_files.py  team.tasks: a data file's rows as the team's tasks and held-out tasks
    evaluation.py  `flexmarl eval RUN_DIR`: saved weights on the held-out tasks
    cli.py         `flexmarl run | plan | eval | report | keygen`
    summary.py     the closing lines of `flexmarl run`: what a person reads when the run ends
    nodes.py       `flexmarl-node`: a machine that hosts workers of a run elsewhere
    checkpoint.py  each agent's training state per step on disk (`flexmarl run --resume`)
"""
