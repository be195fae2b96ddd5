"""`flexmarl` command line: `flexmarl run [CONFIG] [--team PATH] [--set section.key=value ...]`,
`flexmarl run --resume RUN_DIR [--set ...]`, `flexmarl run ... --listen tcp://ADDR:PORT`,
`flexmarl plan [CONFIG] [--team PATH] [--nodes N] [--set ...] [--write FILE] [--json]`,
`flexmarl report RUN_DIR [--out DIR]`, `flexmarl keygen [--dir DIR] [--name NAME]`,
`flexmarl --version`.

A thin entry point: resolve the config, load the team, make the run directory, then hand over to
`flexmarl.launch.run.train` on uvloop. Exit codes: 0 done, 2 config (or team, or report input) error,
130 interrupted.
"""
from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
from typing import Any, NoReturn, Sequence

from flexmarl.checks import ConfigError
from flexmarl.config.load import load_config
from flexmarl.launch.logs import configure_logging, log_to_file, show_warnings

log = logging.getLogger("flexmarl")

EXIT_OK, EXIT_CONFIG, EXIT_INTERRUPTED = 0, 2, 130


def main(argv: Sequence[str] | None = None) -> NoReturn:
    """Parse `argv` (default sys.argv[1:]), run the command, exit with its status."""
    args = _parser().parse_args(argv)
    show_warnings()  # before the config is read: a renamed key in it warns
    raise SystemExit(args.command(args))


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="flexmarl", description=(
        "Train a team of LLM agents with RL, one policy model per agent."))
    parser.add_argument("--version", action="version", version=f"flexmarl {_version()}")
    commands = parser.add_subparsers(title="commands", required=True, metavar="COMMAND")
    run = commands.add_parser("run", help="train a team", description=(
        "Train a team. The config is the built-in default, merged with CONFIG if given, then "
        "with each --set in order, then --team."))
    run.add_argument("config", nargs="?", metavar="CONFIG", help="a TOML config file")
    run.add_argument("--team", metavar="PATH", help="team file (sets team.path)")
    run.add_argument("--set", dest="overrides", action="append", default=[],
                     metavar="SECTION.KEY=VALUE",
                     help="override one setting; VALUE is a TOML literal or a bare string, "
                          "e.g. --set pipeline.tasks_per_step=16 --set trainer.betas=[0.9,0.95]")
    run.add_argument("-v", "--verbose", action="store_true",
                     help="also show third-party warnings and the workers' logs (engines, "
                          "trainers) on the console; they always go to RUN_DIR/run.log")
    run.add_argument("--dry-run", action="store_true",
                     help="print the resolved config as TOML and exit")
    run.add_argument("--listen", metavar="tcp://ADDR:PORT",
                     help="run the workers on `flexmarl-node`s that join here (sets "
                          "cluster.listen; see docs/multinode.md)")
    run.add_argument("--resume", metavar="RUN_DIR",
                     help="go on with a run that stopped or was killed, from its config and its "
                          "last recorded step (--set run.steps=N trains it further)")
    run.set_defaults(command=_run)
    plan = commands.add_parser("plan", help="plan trainer slots on a cluster (simulated)",
                               description=(
        "Simulate the team's own workflow on N nodes of the cost model's devices "
        "(flexmarl/sim/costs.toml) with the product's scheduling code, for every number of "
        "shared trainer slots worth trying and each balancing strategy; print the placements "
        "best first, and with --write the best one as config. Section [plan] says how big "
        "each agent's model is and how long its answers are. Only placements this run's "
        "product runs are chosen (time-shared on GPU with devices.allow_unverified = true; "
        "never under the Ray launcher); the table says what it would have picked."))
    plan.add_argument("config", nargs="?", metavar="CONFIG", help="a TOML config file")
    plan.add_argument("--team", metavar="PATH", help="team file (sets team.path)")
    plan.add_argument("--nodes", type=int, metavar="N", help="cluster nodes (sets plan.nodes)")
    plan.add_argument("--set", dest="overrides", action="append", default=[],
                      metavar="SECTION.KEY=VALUE", help="override one setting, as in run")
    plan.add_argument("--write", metavar="FILE",
                      help="write the best placement as a config file to merge into yours")
    plan.add_argument("--json", action="store_true",
                      help="also print the placements as one JSON object (last line)")
    plan.set_defaults(command=_plan)
    report = commands.add_parser("report", help="write the HTML report of a run", description=(
        "Write report.html and its PNG plots for a run directory (from its metrics.jsonl; a "
        "run still going is reported as far as it got) and print the report's path."))
    report.add_argument("run_dir", metavar="RUN_DIR", help="the run directory")
    report.add_argument("--out", metavar="DIR", help="where to write (default RUN_DIR/report)")
    report.set_defaults(command=_report)
    ev = commands.add_parser("eval", help="evaluate a run's weights on its held-out tasks",
                             description=(
        "Run the team's workflow with training off on the run's held-out tasks (its [eval] "
        "section: greedy or n sampled per task) with the run's final checkpoints, or with "
        "--step N its training state saved after step N; print per-agent and team rewards and "
        "write RUN_DIR/eval-final.json (eval-step-N.json)."))
    ev.add_argument("run_dir", metavar="RUN_DIR", help="the run directory")
    ev.add_argument("--step", type=int, metavar="N",
                    help="the state saved after step N instead of the final checkpoints")
    ev.add_argument("--set", dest="overrides", action="append", default=[],
                    metavar="SECTION.KEY=VALUE",
                    help="override one setting of the run's config, e.g. --set eval.tasks=50 "
                         "--set eval.greedy=false --set eval.n=4")
    ev.add_argument("--json", action="store_true", help="also print the result as JSON")
    ev.add_argument("--cross-play", action="store_true",
                    help="instead: the run's policies (start, saved versions, final, random, "
                         "Nash) against each other, seat-balanced, with ratings; an OpenSpiel "
                         "team of a small game (RUN_DIR/crossplay.json)")
    ev.add_argument("--deals", type=int, default=200, metavar="N",
                    help="with --cross-play: duplicate matches per pair for the ratings (200)")
    ev.add_argument("--versions", type=int, default=1, metavar="K",
                    help="with --cross-play: saved versions between start and final (1)")
    ev.set_defaults(command=_eval)
    keygen = commands.add_parser("keygen", help="make a CURVE key pair for encrypted tcp://",
                                 description=(
        "Write NAME.key (public) and NAME.key_secret (mode 0600) into DIR for "
        "transport.curve_secret_key_file, and print the public key. Never overwrites a secret."))
    keygen.add_argument("--dir", default="~/.flexmarl/keys", help="where (default %(default)s)")
    keygen.add_argument("--name", default="node", help="file name stem (default %(default)s)")
    keygen.set_defaults(command=_keygen)
    return parser


def _version() -> str:
    import flexmarl
    return flexmarl.__version__


def _run(args: argparse.Namespace) -> int:
    try:
        config = _run_config(args)
    except ConfigError as e:
        return _config_error(e)
    configure_logging(config.run.log_level, verbose=args.verbose)

    from flexmarl.launch.checkpoint import CheckpointError
    from flexmarl.orchestrator.orchestrator import WorkflowError
    from flexmarl.observe.rundir import RunDir
    from flexmarl.launch.model_dirs import check_model, install_line
    from flexmarl.launch.summary import summary
    from flexmarl.console import phase
    from flexmarl.launch.build import resolve_backend
    from flexmarl.placement.layout import check_devices
    from flexmarl.launch.workers import check_backend, check_ray
    from flexmarl.launch.evaluation import check_eval
    from flexmarl.gateway.api import TOKEN_FILE as GATEWAY_TOKEN_FILE
    from flexmarl.launch.task_files import team_with_task_file
    from flexmarl.team import load_team

    # The dry run goes through every check the run makes before it creates its run directory:
    # what it accepts, the run accepts (short of planning trainer_pool.slots = "auto").
    try:
        team = team_with_task_file(load_team(config.team.path), config.team, config.run.seed)
    except ConfigError as e:
        return _config_error(e)
    except Exception as e:  # anything the team file raises: no team, NameError, SyntaxError...
        return _team_error(config.team.path, e)
    if not args.dry_run:
        phase(install_line(team.agents))
    try:
        for spec in team.agents:  # a missing model directory: say so before making a run dir
            check_model(spec)
        config = resolve_backend(config)  # rollout.backend "auto": what the GPUs here allow
        check_backend(config.rollout.backend, config.cluster.remote)
        if config.cluster.engine == "ray":  # Ray missing: one error, before a run dir exists
            check_ray()
        if config.trainer_pool.slots == "auto" and not args.dry_run:
            # planned now: the run dir records the plan
            from flexmarl.sim.team_plan import resolve_auto
            phase('planning trainer_pool.slots = "auto" with the cluster simulator')
            config = resolve_auto(config, team)
        # The GPUs fit, before a run dir or a process exists.
        check_devices(team, config.cluster.remote, rollout=config.rollout,
                      trainer_device=config.trainer.device, devices=config.devices,
                      trainer_pool=config.trainer_pool)
        check_eval(team, config.eval, config.gateway.enabled)
    except ConfigError as e:
        return _config_error(e)
    if args.dry_run:
        note = ""
        if config.trainer_pool.slots == "auto":
            note = ('# trainer_pool.slots = "auto": planned at start by the cluster simulator; '
                    "`flexmarl plan` with the same config shows the placements\n")
        sys.stdout.write(
            "# the run's config; a value that is not the default says where it came from\n" +
            config.to_toml(annotate=True) + note +
            _per_agent_settings(config.team.path, config.trainer, config.pipeline,
                                config.run.seed) +
            _gpu_placement(config.team.path, config.cluster,
                           rollout=config.rollout, trainer_device=config.trainer.device,
                           devices=config.devices, trainer_pool=config.trainer_pool))
        return EXIT_OK

    import uvloop  # entry point only: nothing else installs an event loop policy

    from flexmarl.launch.run import train

    try:
        run_dir = RunDir.create(config, resume=bool(args.resume), verbose=args.verbose)
    except ConfigError as e:
        return _config_error(e)
    log_to_file(run_dir.log_path, config.run.log_level)
    # Where the run is and its addresses go to stdout, as the summary does: a script reads
    # them there; the phase lines of the work itself go to stderr.
    phase(f"team {team.name!r} ({', '.join(a.name for a in team.agents)}); run dir "
          f"{run_dir.path}{' (resuming)' if args.resume else ''}; log {run_dir.log_path}",
          file=sys.stdout)

    def announce(url: str) -> None:
        phase(f"dashboard at {url} (live while the run goes; /metrics for Prometheus)",
              file=sys.stdout)

    def announce_gateway(url: str) -> None:
        phase(f"gateway at {url}v1 (OpenAI-compatible: set OPENAI_BASE_URL to it, and "
              f"OPENAI_API_KEY to the token in {run_dir.path / GATEWAY_TOKEN_FILE})",
              file=sys.stdout)

    try:
        with run_dir:
            result = uvloop.run(train(team, config, run_dir=run_dir, on_dashboard=announce,
                                      resume=bool(args.resume), on_gateway=announce_gateway))
    except KeyboardInterrupt:
        print(f"\nflexmarl: interrupted; what was written so far is in {run_dir.path}",
              file=sys.stderr)
        return EXIT_INTERRUPTED
    except ConfigError as e:  # found once the run starts, e.g. an agent's missing model directory
        return _config_error(e)
    except CheckpointError as e:  # --resume of a run whose saved states are missing or broken
        print(f"flexmarl: resume error: {e}", file=sys.stderr)
        return EXIT_CONFIG
    except WorkflowError as broken:  # PipelineRun raises it bare: one line, not a traceback
        print(f"flexmarl: workflow error: {broken} (what was written so far is in "
              f"{run_dir.path})", file=sys.stderr)
        return 1  # the run failed, as an uncaught error would exit
    print(summary(result, log_path=run_dir.log_path), flush=True)
    return EXIT_OK


def _run_config(args: argparse.Namespace) -> Any:
    """The run's config: CONFIG, or with --resume the run directory's own config.toml (then
    --set may change it, e.g. run.steps; other changes void the same-weights guarantee)."""
    overrides = [*args.overrides, *([f"cluster.listen={args.listen}"] if args.listen else [])]
    if not args.resume:
        return load_config(args.config, overrides, team=args.team)
    from pathlib import Path

    from flexmarl.observe.rundir import CONFIG_FILE

    if args.config:
        raise ConfigError(f"give either CONFIG ({args.config}) or --resume RUN_DIR: a resumed "
                          "run uses the config in its run directory")
    path = Path(args.resume)
    if not (path / CONFIG_FILE).is_file():
        raise ConfigError(f"--resume {args.resume}: no {CONFIG_FILE} there; it must be the run "
                          "directory of an earlier `flexmarl run`")
    # The run's config.toml holds what it ran with: the team file's config (as it may read
    # now) is not laid under it again.
    return load_config(str(path / CONFIG_FILE), [*overrides, f"run.dir={path}"],
                       team=args.team, team_config=False)


def _plan(args: argparse.Namespace) -> int:
    import json
    import time

    from flexmarl.orchestrator.orchestrator import WorkflowError
    from flexmarl.sim import plan
    from flexmarl.sim.team_plan import NOTE, costs_of, plan_team, planned_config, slot_ranks
    from flexmarl.team import load_team

    overrides = [*args.overrides, *([f"plan.nodes={args.nodes}"] if args.nodes else [])]
    try:
        config = load_config(args.config, overrides, team=args.team)
        team = load_team(config.team.path)
    except ConfigError as e:
        return _config_error(e)
    except Exception as e:  # anything the team file raises
        return _team_error(config.team.path, e)
    started = time.perf_counter()

    costs = None

    def progress(p: Any) -> None:
        where = plan.label(costs, p) if costs else "?"
        split = "by demand" if p.instances or p.timeshare_devices else "equal"
        print(f"  {where} ({plan.placement_key(p)}), {split}, {p.pipeline}, {p.balance}: "
              f"{p.step_s:.1f} s per step ({time.perf_counter() - started:.0f} s so far)",
              file=sys.stderr, flush=True)

    try:
        costs = costs_of(config)
        preset, costs, placements = plan_team(team, config, progress=progress)
    except ConfigError as e:
        return _config_error(e)
    except WorkflowError as e:
        print(f"flexmarl: plan error: the team's workflow failed in the simulator: {e} "
              f"({NOTE})", file=sys.stderr)
        return 1
    sizes = ", ".join(f"{a} {m} ({preset.medians[a]:.0f} tokens)"
                      for a, m in preset.models.items())
    print(f"agents (cost-model size, median answer): {sizes}\n"
          f"batch: {preset.tasks_per_step} tasks x {preset.trajectories_per_task} "
          f"trajectories, {config.pipeline.mode}; note: {NOTE}\n")
    print(plan.table(preset, costs, placements))
    best = placements[0]
    text = plan.placement_toml(preset, costs, best, slot_ranks(team, config, best))
    print(f"\nbest ({time.perf_counter() - started:.0f} s to simulate):\n{text}")
    if args.write:
        planned = planned_config(config, team, preset, costs, best, instances=True)
        try:
            with open(args.write, "w") as f:
                f.write(f"# flexmarl plan: your config with the best placement (simulated step "
                        f"{best.step_s:.1f} s on {preset.nodes} node(s))\n{planned.to_toml()}")
        except OSError as e:
            print(f"flexmarl: cannot write {args.write}: {e}", file=sys.stderr)
            return EXIT_CONFIG
        print(f"wrote {args.write}: your config with this placement; flexmarl run "
              f"{args.write} trains with it")
    if args.json:
        print(json.dumps({"team": team.name, "nodes": preset.nodes, "models": preset.models,
                          "medians": preset.medians, "placements": [
                              {"slots": len(p.slots), "slot_models": list(p.slots),
                               "slot_devices": plan.slot_devices(costs, p),
                               "instances": plan.instances(preset, costs, p),
                               "rollout_devices": p.rollout_devices, "balance": p.balance,
                               "placement": plan.placement_key(p), "pipeline": p.pipeline,
                               "groups": [list(g) for g in p.timeshare],
                               "step_s": p.step_s, "expressible": plan.expressible(p),
                               "refused": p.refused} for p in placements]}))
    return EXIT_OK


def _report(args: argparse.Namespace) -> int:
    from pathlib import Path

    from flexmarl.observe.report import ReportError, write_report

    try:
        path = write_report(args.run_dir, out_dir=Path(args.out) if args.out else None)
    except (ReportError, OSError) as e:
        print(f"flexmarl: report error: {e}", file=sys.stderr)
        return EXIT_CONFIG
    print(path)
    return EXIT_OK


def _cross_play(args: argparse.Namespace) -> int:
    import json

    import uvloop

    from flexmarl.launch.checkpoint import CheckpointError
    from flexmarl.launch.crossplay import cross_play_run, crossplay_lines

    if args.step is not None:
        return _config_error(ConfigError("--cross-play plays every saved version (--versions "
                                         "K); leave --step out"))
    try:
        result = uvloop.run(cross_play_run(args.run_dir, overrides=args.overrides,
                                           deals=args.deals, versions=args.versions))
    except (ConfigError, CheckpointError) as e:
        return _config_error(e)
    print(f"flexmarl: cross-play of {result['game']}: each row's seat-balanced expected return "
          f"against each column; ratings from {result['deals']} duplicate matches per pair")
    print("\n".join(crossplay_lines(result)))
    if args.json:
        print(json.dumps(result))
    return EXIT_OK


def _eval(args: argparse.Namespace) -> int:
    import json

    import uvloop

    from flexmarl.launch.checkpoint import CheckpointError
    from flexmarl.launch.evaluation import evaluate_run
    from flexmarl.observe.rundir import eval_line, game_lines

    configure_logging("WARNING")
    if args.cross_play:
        return _cross_play(args)
    try:
        result = uvloop.run(evaluate_run(args.run_dir, step=args.step, overrides=args.overrides))
    except (ConfigError, CheckpointError) as e:
        return _config_error(e)
    except ValueError as e:  # no held-out tasks, a team file that does not load
        print(f"flexmarl: eval error: {e}", file=sys.stderr)
        return EXIT_CONFIG
    print(f"flexmarl: {result['weights']} weights: {eval_line(result)}")
    for who, line in game_lines(result.get("heldout")):  # a game team: before (the run's) -> now
        print(f"flexmarl: {who}: {line}")
    if result.get("errors"):
        print("flexmarl: failed trajectories: " + "; ".join(result["errors"]))
    if args.json:
        print(json.dumps(result))
    return EXIT_OK


def _keygen(args: argparse.Namespace) -> int:
    from runtime.keys import write_keys

    try:
        public_path, secret_path, public = write_keys(args.dir, args.name)
    except (OSError, ValueError) as e:
        print(f"flexmarl: keygen error: {e}", file=sys.stderr)
        return EXIT_CONFIG
    print(f"public key {public}\nwritten to {public_path} (share it) and {secret_path} (keep it "
          "private; give its path as transport.curve_secret_key_file)")
    return EXIT_OK


def _team_error(path: Any, e: BaseException) -> int:
    log.debug("loading team %s failed", path, exc_info=e)
    print(f"flexmarl: team error ({path}): {type(e).__name__}: {e} "
          "(--set run.log_level=DEBUG shows the traceback)", file=sys.stderr)
    return EXIT_CONFIG


def _config_error(e: ConfigError) -> int:
    print(f"flexmarl: config error: {e}", file=sys.stderr)
    return EXIT_CONFIG


def _per_agent_settings(team_path: str, trainer: Any, pipeline: Any, seed: int) -> str:
    """TOML comments: per agent of the team at `team_path`, the trainer settings that differ
    from [trainer] (`trainer`), and why."""
    from flexmarl.launch.workers import trainer_settings
    from flexmarl.team import load_team

    try:
        team = load_team(team_path)
    except Exception as e:  # the dry run still shows the config
        why = " ".join(str(e).split())
        return f"# (per-agent settings not shown: team {team_path} did not load: {why})\n"
    section = dataclasses.asdict(trainer)
    lines = ["# Per agent, the trainer settings taken from elsewhere than the [trainer] section:"]
    for spec in team.agents:
        if not spec.trainable:
            lines.append(f"# {spec.name}: frozen (no trainer)")
            continue
        changed = [f"{k} = {v!r} ({src}; [trainer] says {section[k]!r})"
                   for k, (v, src) in trainer_settings(trainer, pipeline, seed, spec).items()
                   if src != "[trainer]"]
        lines.append(f"# {spec.name}: " + (", ".join(changed) or "as [trainer]"))
    return "\n".join(lines) + "\n"


def _gpu_placement(team_path: str, cluster: Any, *, rollout: Any, trainer_device: str,
                   devices: Any, trainer_pool: Any) -> str:
    """TOML comments: which GPUs each worker of the team at `team_path` would get on this
    machine (flexmarl.placement.devices; none are placed on nodes), the Ray placement groups it
    would ask for (cluster.launcher = "ray"), or why none."""
    from flexmarl.placement.layout import _slot_sizes, local_hosts, place_gpus
    from flexmarl.team import load_team

    if cluster.engine == "nodes":
        return ("# GPU placement: made when the nodes have joined, on the GPUs each reports "
                "(flexmarl-node --devices)\n")
    try:
        team = load_team(team_path)
        needs = {a.name: a.train_ranks or trainer_pool.ranks_per_agent
                 for a in team.agents if a.trainable}
        sizes = (_slot_sizes(trainer_pool, needs) if trainer_pool.slots != "auto"
                 else list(needs.values()))
        if cluster.engine == "ray":
            return _ray_groups(team, sizes, cluster, rollout=rollout,
                               trainer_device=trainer_device)
        machine = local_hosts(devices.gpus)
        gpus = place_gpus(team, sizes, machine, rollout=rollout, trainer_device=trainer_device,
                         devices=devices, trainer_pool=trainer_pool)
    except Exception as e:  # a placement that does not fit: the dry run says why
        return f"# GPU placement: {' '.join(str(e).split())}\n"
    return _placement_line(team, trainer_pool, devices) + _gpu_table(gpus, machine, devices,
                                                                     trainer_device)


def _ray_groups(team: Any, sizes: list[int], cluster: Any, *, rollout: Any,
                trainer_device: str) -> str:
    """The placement groups a Ray run asks for (runtime.ray_cluster.placement_groups), as if
    its cluster has GPUs wherever the config would use them."""
    from runtime.ray_cluster import ROLE_RESOURCE, ROLE_SLIVER, placement_groups
    from runtime.supervisor import WorkerSpec

    entry = "flexmarl.rollout.worker:rollout_worker"
    names = iter(range(10**6))
    specs = [WorkerSpec(name=f"rollout-{next(names)}", entry=entry, role="rollout",
                        gpus=rollout.tensor_parallel_size if rollout.backend == "vllm" else 0)
             for spec in team.agents for _ in range(spec.instances or rollout.instances_per_agent)]
    specs += [WorkerSpec(name=f"trainer-{k}-{r}", entry=entry, role="trainer",
                         group=f"trainer-{k}", group_size=n, group_index=r,
                         gpus=1 if trainer_device == "cuda" else 0)
              for k, n in enumerate(sizes) for r in range(n)]
    where = cluster.ray_address or "a Ray of the run's own on this machine"
    lines = [f"Ray placement groups (cluster.launcher = \"ray\", {where}; STRICT_PACK each):"]
    lines += [f"  {g.name}: " + " + ".join(
        "{" + ", ".join(f"{k}: {v:g}" for k, v in b.items()) + "}" for b in g.bundles)
        for g in placement_groups(specs, cluster.ray_worker_cpus)]
    lines.append(f"  (a worker also asks {ROLE_RESOURCE.format(role='ROLE')}: {ROLE_SLIVER} "
                 "when some node offers that resource: it then lands only on such nodes)")
    return "".join(f"# {line}\n" for line in lines)


def _placement_line(team: Any, trainer_pool: Any, devices: Any) -> str:
    """devices.placement as the run makes it: each agent's slot, time-shared or not."""
    from flexmarl.placement.layout import slot_layout

    layout = slot_layout(team, trainer_pool, devices)
    if not layout.groups:
        return "# placement: disaggregated (rollout instances and trainer slots apart)\n"
    shared = ", ".join(f"{'+'.join(g)} on {layout.pinned[g[0]]}" for g in layout.groups)
    rest = [s.name for s in team.agents if s.name not in layout.pinned]
    return (f"# placement: time-shared {shared} (engines asleep while their trainer runs)"
            + (f"; disaggregated {', '.join(rest)}" if rest else "") + "\n")


def _gpu_table(gpus: Any, machine: Any, devices: Any, trainer_device: str) -> str:
    if gpus.devices is None:
        seen = len(machine[0].gpus)
        return (f"# GPU placement: none (GPUs used here: {seen}; devices.gpus = "
                f"{devices.gpus!r}, trainer.device = {trainer_device!r}): every "
                "worker runs on CPU\n")
    lines = [f"GPU placement ({gpus.transfer} weight sync):", *gpus.devices.table().splitlines()]
    return "".join(f"# {line}\n" for line in lines)


if __name__ == "__main__":
    main()
