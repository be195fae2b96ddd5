"""Starting runs: wiring the parts together, the worker processes, the command lines, checkpoints.

    build.py       build_run(team, config): the one reader of the whole Config; each part's sections
    run.py         train(team, config): build_run, compose, the loop, evaluations, checkpoints
    compose.py     the composition root: every component built once, handed its collaborators
    workers.py     the worker processes: specs on their cores and GPU seats, respawns, launcher
    model_dirs.py  which model directory each agent's workers load; weights saved as one
    gguf.py        pretrained GGUF models converted once to cached float32 model directories
    task_files.py  team.tasks: a data file's rows as the team's tasks and held-out tasks
    evaluation.py  `flexmarl eval RUN_DIR`: saved weights on the held-out tasks
    crossplay.py   `flexmarl eval RUN_DIR --cross-play`: a game run's policies against each other
    cli.py         `flexmarl run | plan | eval | report | keygen`
    logs.py        the CLI's logging: the console's lines, the run's log file, warnings
    summary.py     the closing lines of `flexmarl run`: what a person reads when the run ends
    nodes.py       `flexmarl-node`: a machine that hosts workers of a run elsewhere
    checkpoint.py  each agent's training state per step on disk (`flexmarl run --resume`)
"""
