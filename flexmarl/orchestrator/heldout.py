"""Held-out accuracy before and after training: the same measurement of the run's starting
weights and of its final ones, and each agent's change with its standard error.

    eval.before (a fresh run; a resumed one skips it) ─► measure(): evaluate() on the first
      eval.final_tasks held-out tasks, greedy and sampled (one trajectory per task at the
      agents' own settings, seeded per request: the same draws before and after), both modes
      at once through the run's rollout instances, sharing eval.max_concurrent_tasks
    ... training ...
    eval.final ─► measure() on the final weights
    ─► changes(): {agent: {"greedy"|"sampled": {before, after, se_change, tasks}}}

The reward measured is each agent's turn reward in the team's workflow (its own, else the
team's), so "accuracy" is whatever that reward is; se_change holds for any reward:
sqrt(var_before / turns_before + var_after / turns_after).
"""
from __future__ import annotations

import asyncio
import dataclasses
import math
import time
from typing import Any, Iterable

from flexmarl.config.pipeline import EvalConfig
from flexmarl.orchestrator.agents import AgentRuntime
from flexmarl.orchestrator.evaluate import Generator, evaluate, heldout_tasks
from flexmarl.team import Team

MODES = ("greedy", "sampled")


def mode_configs(settings: EvalConfig) -> dict[str, EvalConfig]:
    """Each measured mode's evaluation settings (eval.modes): greedy once per task, and one
    seeded sample per task."""
    every = {"greedy": dataclasses.replace(settings, greedy=True, n=1),
             "sampled": dataclasses.replace(settings, greedy=False, n=1)}
    return {mode: every[mode] for mode in MODES if mode in settings.modes}


async def measure(team: Team, agents: dict[str, AgentRuntime], generate: Generator,
                  settings: EvalConfig, *, seed: int, max_concurrent_calls: int,
                  before: bool = False) -> dict[str, Any]:
    """The weights `generate` serves now on the measurement's held-out tasks (`before`: the
    before measurement's, eval.before_tasks): {"greedy": evaluate()'s result, "sampled": ...
    (those of eval.modes), "seconds": all together}."""
    tasks = heldout_tasks(team, settings, final=True, before=before)
    started = time.perf_counter()
    # One limit for both modes: the engines see up to eval.max_concurrent_tasks tasks at once.
    # The greedy requests get their own ids (both modes are in flight together); the sampled
    # ones keep those of any sampled evaluation, hence its seeds (`flexmarl eval` agrees).
    slots = asyncio.Semaphore(settings.max_concurrent_tasks)
    tags = {"greedy": "greedy-", "sampled": ""}
    async with asyncio.TaskGroup() as tg:
        runs = {mode: tg.create_task(evaluate(team, agents, generate, tasks, config, seed=seed,
                                              max_concurrent_calls=max_concurrent_calls,
                                              slots=slots, tag=tags[mode]),
                                     name=f"heldout.{mode}")
                for mode, config in mode_configs(settings).items()}
    return {mode: run.result() for mode, run in runs.items()} | {
        "seconds": time.perf_counter() - started}


def se_change(before: dict | None, after: dict | None) -> float | None:
    """The standard error of after - before, each an agent's {reward, var, turns} in one
    measurement (independent draws): sqrt(var_b / n_b + var_a / n_a); None if either end has
    under two turns."""
    if not before or not after or before.get("var") is None or after.get("var") is None:
        return None
    return math.sqrt(before["var"] / before["turns"] + after["var"] / after["turns"])


def changes(before: dict | None, after: dict | None, trainable: Iterable[str]
            ) -> dict[str, dict] | None:
    """{agent: {mode: {"before", "after", "se_change", "tasks"[, "scores": {name: {"before",
    "after", "se_change", "n"}}]}}} for the `trainable` agents that took turns or were scored
    in either measurement (`before`, `after`: measure()'s results; either may be None: not
    measured, its values None), in the modes measured; None when neither was measured.
    `scores` are ctx.score's (a game's win rate against an opponent, say); `n` counts the
    after measurement's values (else the before's)."""
    if before is None and after is None:
        return None
    modes = [m for m in MODES if m in (after or before)]

    def agent(result: dict | None, mode: str, name: str) -> dict | None:
        return (result or {}).get(mode, {}).get("agents", {}).get(name)

    out: dict[str, dict] = {}
    for name in trainable:
        if not any(agent(r, m, name) for r in (before, after) for m in modes):
            continue  # took no turns: nothing measured of it
        out[name] = {}
        for mode in modes:
            b, a = agent(before, mode, name), agent(after, mode, name)
            tasks = (after or before)[mode]["tasks"]
            cell = {"before": b and b["reward"], "after": a and a["reward"],
                    "se_change": se_change(b, a), "tasks": tasks}
            names = sorted({*((b or {}).get("scores") or {}), *((a or {}).get("scores") or {})})
            if names:
                cell["scores"] = {n: _score_change((b or {}).get("scores", {}).get(n),
                                                   (a or {}).get("scores", {}).get(n))
                                  for n in names}
            out[name][mode] = cell
    return out


def _score_change(before: dict | None, after: dict | None) -> dict:
    """One score's {before, after, se_change, n} from evaluate()'s {mean, var, n} at each end."""
    as_reward = [None if s is None else {"var": s["var"], "turns": s["n"]}
                 for s in (before, after)]
    return {"before": before and before["mean"], "after": after and after["mean"],
            "se_change": se_change(*as_reward), "n": (after or before)["n"]}


def summary_line(result: dict, agents: Iterable[str]) -> str:
    """measure()'s `result` in one line: "solver greedy 0.120 sampled 0.100; checker ... on
    200 tasks, 35 s"; with failed trajectories, their count and the first error (why no agent
    took a turn, say)."""
    def f(v: float | None) -> str:
        return "-" if v is None else f"{v:.3f}"
    modes = [m for m in MODES if m in result]
    cells = []
    for name in agents:
        got = {m: result[m]["agents"].get(name) for m in modes}
        if any(got.values()):
            cells.append(f"{name} " + " ".join(f"{m} {f(got[m] and got[m]['reward'])}"
                                               for m in modes))
    failed = sum(result[m]["failed"] for m in modes)
    errors = [e for m in modes for e in result[m].get("errors") or ()]
    return (f"{'; '.join(cells) or 'no trainable agent took a turn'} on "
            f"{result[modes[0]]['tasks']} tasks" + (f", {failed} failed" if failed else "") +
            f", {result['seconds']:.0f} s" + (f" (first error: {errors[0]})" if errors else ""))


__all__ = ["MODES", "changes", "measure", "mode_configs", "se_change", "summary_line"]
