"""Code the tests share, by job: a test module imports what it needs from here
(`from tests.helpers.teams import duo`), never from another test module or from tests/conftest.py,
and nothing in the suite edits sys.path (tests/test_suite_rules.py checks both).

    teams.py           the test team "duo" (a solver and a checker), its workflow and reward;
                       write_team, a loadable team file of one tiny agent
    numerics.py        tolerances with what they bound (GRAD_ATOL, WEIGHT_ATOL, MIXED_REL_TOL,
                       SYNC_WEIGHT_ATOL, RATIO_ATOL, ...) and weight comparisons (max_diff,
                       relative_distance)
    trainers.py        the trainer tests' tiny Qwen2 (fixtures model_dir, batches), splitting and
                       stepping batches, a trainer slot's step and state comparison
    lora.py            LoRA adapters: the trainer's (SPEC, LORA, lora_trainer) and the rollout
                       engine's (ENGINE_SPEC, random_adapter)
    runs.py            whole train() runs of the pipeline tests: config by mode, run, hist
    gateway_runs.py    a one-step gateway run driven by an OpenAI-client app, its stored rows
    faults.py          the fault tests' runs: a fault injected into a run, the fault-free run,
                       and what a run with a fault must keep
    workers.py         worker entry points the supervisor tests start (`tests.helpers.workers:
                       echo`), and finding, recording and killing a run's workers
    supervisor_host.py a process hosting a Supervisor, run as `python -m
                       tests.helpers.supervisor_host` by tests/test_supervisor.py
    fake_orch.py       an orchestrator on a fake instance pool (no worker process)
    fake_backend.py    the OpenAI gateway's fake backend and a chat request
    fake_instances.py  a rollout instance's connection faked for WeightSync, small weights,
                       and `publish` (weights published as a trainer's rank 0 does)
    balancing.py       the balancer tests' two agents, loaded by hand
    deploy.py          the deployment examples' checks: command options, a batch script run
                       with stub commands
    vllm.py            require_vllm and the vLLM timeouts (tests/conftest.py's `vllm` marker)
    lanes.py           the quick lane's marker: whether a test module starts processes
    games.py           GameCtx: a game workflow's ctx whose agents answer from a Python policy
    sandbox.py         the sandbox tests' `where` fixture: under bubblewrap, and on the unsafe
                       fallback
"""
