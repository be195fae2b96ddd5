"""`flexmarl eval RUN_DIR --cross-play`: a run's policies against each other, exactly.

    the team's Team.analysis (an OpenSpiel team of a small game: flexmarl.envs.openspiel)
    policies: "start" (each starting model), "<agent>@<step>" (states saved in RUN_DIR/state,
      up to `versions` of them spread over the run, the last one left to the final weights),
      "<agent>" (its final checkpoint), "random" (uniform) and, for a two-player zero-sum
      game, "nash" (CFR+, its NashConv reported beside it)
      ─► each model's policy table (a torch engine in this process, one at a time: its
         likelihood of each legal action at each information state, policy_tables.Analysis)
    ─► policy_tables.cross_play: the seat-balanced exact payoff matrix, duplicate matches
       sampled from the tables (win shares) and openskill ratings from them, each table's
       NashConv ─► RUN_DIR/crossplay.json (the run report draws its heat-map)
"""
from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path
from typing import Any, Sequence

import orjson

from flexmarl.checks import ConfigError
from flexmarl.launch.checkpoint import STATE_DIR, StateCheckpoints
from flexmarl.launch.evaluation import engines_generate, model_dirs, open_engine, run_config
from flexmarl.launch.model_dirs import resolve_model
from flexmarl.orchestrator.agents import AgentRuntime
from flexmarl.team import load_team

CROSSPLAY_FILE = "crossplay.json"


def middle_steps(saved: list[int], versions: int) -> list[int]:
    """Up to `versions` of the saved steps, spread evenly over the run (one: the middle one),
    never the last (the final checkpoint stands for it)."""
    saved = sorted(saved)
    n = len(saved)
    if versions <= 0 or n < 2:
        return []
    picks = {min(max(round((i + 1) * n / (versions + 1)) - 1, 0), n - 2)
             for i in range(versions)}
    return [saved[i] for i in sorted(picks)]


async def _table(analysis: Any, spec: Any, model_dir: str, adapter: Any, config: Any,
                 tag: str) -> Any:
    engine = await open_engine(spec.name, model_dir, adapter, config)
    try:
        runtime = AgentRuntime(spec, model_dir, engine.tokenizer,
                               max_model_len=config.rollout.max_model_len)

        generate = engines_generate({spec.name: engine},
                                    {spec.name} if adapter is not None else set())
        _, played, _ = await analysis.table(runtime, generate, tag)
        return played
    finally:
        await engine.close()


async def cross_play_run(run_dir: str | Path, *, overrides: Sequence[str] = (),
                         deals: int = 200, versions: int = 1) -> dict[str, Any]:
    """The run's policies played against each other (module doc); the result, also written to
    RUN_DIR/crossplay.json."""
    from flexmarl.envs.policy_tables import cross_play, nash, uniform
    from flexmarl.launch.evaluation import final_checkpoint
    from flexmarl.launch.task_files import team_with_task_file

    run_dir = Path(run_dir)
    config = run_config(run_dir, overrides)
    team = team_with_task_file(load_team(config.team.path), config.team, config.run.seed)
    analysis = team.analysis
    if analysis is None:
        raise ConfigError(f"team {team.name} has no exact policy measures (Team.analysis): "
                          "cross-play compares policy tables, which an OpenSpiel team of a small "
                          "game has (flexmarl.envs.openspiel.openspiel_team); evaluate this run "
                          "with `flexmarl eval RUN_DIR` instead")
    specs = {s.name: s for s in team.agents}
    trainable = [specs[n] for n in dict.fromkeys(analysis.seats)
                 if n in specs and specs[n].trainable]
    states = StateCheckpoints(run_dir / STATE_DIR)
    saved = sorted(set.intersection(*(set(states.steps(s.name)) for s in trainable))) \
        if trainable else []
    tables: dict[str, Any] = {}
    sources: dict[str, str] = {}
    starts: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="flexmarl-crossplay-") as scratch:
        for spec in trainable:  # each starting model once
            base = resolve_model(spec)
            if base not in starts.values():
                name = "start" if not starts else f"start_{len(starts) + 1}"
                starts[name] = base
                tables[name] = await _table(analysis, spec, base, None, config, f"{name}/")
                sources[name] = base
        for step in middle_steps(saved, versions):
            dirs, adapters = await asyncio.to_thread(model_dirs, run_dir, team, step,
                                                     Path(scratch) / f"step-{step}")
            for spec in trainable:
                name = f"{spec.name}@{step}"
                tables[name] = await _table(analysis, spec, dirs[spec.name],
                                            adapters.get(spec.name), config, f"{name}/")
                sources[name] = f"state after step {step}"
        if all(final_checkpoint(run_dir, s.name) is not None for s in trainable):
            dirs, adapters = await asyncio.to_thread(model_dirs, run_dir, team, None,
                                                     Path(scratch))
            for spec in trainable:
                tables[spec.name] = await _table(analysis, spec, dirs[spec.name],
                                                 adapters.get(spec.name), config, "final/")
                sources[spec.name] = "final checkpoint"
    game = analysis.game
    tables["random"], sources["random"] = uniform(game), "uniform over the legal actions"
    kind = game.get_type()
    if game.num_players() == 2 and kind.utility.name == "ZERO_SUM":
        tables["nash"], value = nash(game)
        sources["nash"] = f"CFR+ (NashConv {value:.2g})"
    result = cross_play(game, tables, deals=deals) | {"sources": sources,
                                                      "game": analysis.rules.game}
    (run_dir / CROSSPLAY_FILE).write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2))
    return result


def crossplay_lines(result: dict[str, Any]) -> list[str]:
    """The matrix (row's seat-balanced expected return against the column) and the ratings,
    as text."""
    names = result["policies"]
    width = max(8, *(len(n) for n in names))
    lines = [" " * width + "".join(f"{n[:9]:>10}" for n in names) + "   rating (mu-3s)  NashConv"]
    order = sorted(names, key=lambda n: -result["ratings"][n]["ordinal"])
    for a in order:
        cells = "".join(f"{'-':>10}" if a == b else f"{result['payoff'][a][b]:>+10.3f}"
                        for b in names)
        lines.append(f"{a:<{width}}{cells}   {result['ratings'][a]['ordinal']:>14.2f}"
                     f"  {result['nash_conv'][a]:>8.3f}")
    return lines


__all__ = ["CROSSPLAY_FILE", "cross_play_run", "crossplay_lines", "middle_steps"]
