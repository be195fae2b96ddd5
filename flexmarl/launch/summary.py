"""The closing lines of `flexmarl run`: what a person reads when the run ends.

    flexmarl: done: 20 steps in 9 min 41 s (first step after 2 min 12 s)
      reward (first 3 -> last 3 steps)   team 0.21 -> 0.30   solver 0.31 -> 0.58
      held-out (100 tasks)   greedy                 sampled
        solver               0.410 -> 0.550 ±0.070   0.220 -> 0.480 ±0.070
      report: RUN_DIR/report/report.html   dashboard: http://127.0.0.1:PORT (closed)
      log: RUN_DIR/run.log

Pure formatting of a run's result (flexmarl.launch.run.RunResult), so it is tested without a
run: fields are read with getattr, and a result without some (a test's fake, a run without
held-out tasks) gets the lines it can. `heldout` is RunResult.heldout: {agent:
{"greedy"|"sampled": {"before", "after", "se_change"}}}; bench/learning.py prints its cells
with `change_cell` too.
"""
from __future__ import annotations

from typing import Any

from flexmarl.console import PREFIX, duration
from flexmarl.observe.rundir import eval_line, game_lines, policy_lines

EDGE_STEPS = 3
"""Steps averaged at each end of the run for the reward's "first -> last" (one step's mean
over a few tasks is noisy)."""
MODES = ("greedy", "sampled")


def summary(result: Any, *, log_path: Any = None) -> str:
    """The closing lines for `result` (a RunResult, or anything with its fields); `log_path`:
    the run's log file, named last."""
    metrics: list[dict] = list(getattr(result, "metrics", None) or [])
    lines = [PREFIX + _done(metrics, getattr(result, "wall_s", 0.0),
                            getattr(result, "time_to_first_step_s", None))]
    rewards = _rewards(metrics)
    if rewards:
        lines.append("  " + rewards)
    heldout = getattr(result, "heldout", None)
    final_eval = getattr(result, "final_eval", None)
    if heldout:
        lines.extend("  " + line for line in _heldout(heldout, final_eval))
        games = game_lines(heldout)
        if games:
            width = max(len(k) for k, _ in games)
            lines.append("  held-out games, before -> after training")
            lines.extend(f"    {k.ljust(width)}   {v}" for k, v in games)
        policies = policy_lines((final_eval or {}).get("policies"))
        if policies:
            width = max(len(k) for k, _ in policies)
            lines.append("  policies measured exactly (OpenSpiel NashConv: what best responses "
                         "gain against each player in every seat), before -> after training")
            lines.extend(f"    {k.ljust(width)}   {v}" for k, v in policies)
    elif final_eval is not None:  # no before/after pair: the final weights' scores alone
        lines.append(f"  held-out, final weights: {eval_line(final_eval)}")
    never = never_updated(metrics)
    if never:
        lines.append(f"{PREFIX}never updated: {', '.join(never)}: in every step every group's "
                     "rewards were equal, so GRPO had no learning signal (check the reward "
                     "function, or sample more varied answers: more trajectories per task, a "
                     "higher temperature)")
    where = []
    if getattr(result, "report", None) is not None:
        where.append(f"report: {result.report}")
    if getattr(result, "dashboard_url", None):
        where.append(f"dashboard: {result.dashboard_url} (closed)")
    if where:
        lines.append("  " + "   ".join(where))
    if log_path is not None:
        lines.append(f"  log: {log_path}   run dir: {getattr(result, 'run_dir', '')}")
    elif getattr(result, "run_dir", None) is not None:
        lines.append(f"  run dir: {result.run_dir}")
    return "\n".join(lines)


def _done(metrics: list[dict], wall_s: float, first_step_s: float | None) -> str:
    steps = len(metrics)
    first = f" (first step after {duration(first_step_s)})" if first_step_s is not None else ""
    return f"done: {steps} step{'s' * (steps != 1)} in {duration(wall_s)}{first}"


def _rewards(metrics: list[dict]) -> str:
    """"reward (first 3 -> last 3 steps)   team 0.21 -> 0.30   solver 0.31 -> 0.58", or one
    step's rewards; "" without any."""
    series: dict[str, list[float | None]] = {"team": [m.get("team_reward") for m in metrics]}
    for m in metrics:
        for name in m.get("agents", {}):
            series.setdefault(name, [])
    for name in list(series)[1:]:
        series[name] = [_reward(m, name) for m in metrics]
    n = min(EDGE_STEPS, len(metrics) // 2)
    parts = []
    for name, values in series.items():
        if n:
            first, last = _mean(values[:n]), _mean(values[-n:])
            if first is not None or last is not None:
                parts.append(f"{name} {_f(first)} -> {_f(last)}")
        elif values and values[-1] is not None:
            parts.append(f"{name} {values[-1]:.3f}")
    if not parts:
        return ""
    head = ("reward" if not n else "reward (first -> last step)" if n == 1 else
            f"reward (first {n} -> last {n} steps)")
    return "   ".join([head, *parts])


def _heldout(heldout: dict[str, dict[str, dict[str, float]]],
             final_eval: dict | None) -> list[str]:
    """The before -> after table: one row per agent, one column per decoding mode."""
    modes = [m for m in MODES if any(m in v for v in heldout.values())]
    modes += sorted({m for v in heldout.values() for m in v} - set(modes))
    tasks = final_eval.get("tasks") if isinstance(final_eval, dict) else None
    head = f"held-out ({tasks} tasks)" if tasks else "held-out"
    name_width = max(len(head) - 2, *(len(a) for a in heldout))
    cells = {agent: [change_cell(by_mode.get(mode)) for mode in modes]
             for agent, by_mode in heldout.items()}
    width = max([len(c) for row in cells.values() for c in row] + [len(m) for m in modes])
    lines = [head.ljust(name_width + 2) + "   " + "   ".join(m.ljust(width) for m in modes)]
    for agent, row in cells.items():
        lines.append("  " + agent.ljust(name_width) + "   " +
                     "   ".join(c.ljust(width) for c in row))
    return [line.rstrip() for line in lines]


def change_cell(cell: dict[str, float] | None) -> str:
    """"0.410 -> 0.550 ±0.070" (± the change's standard error)."""
    if not cell:
        return "-"
    se = cell.get("se_change")
    return (f"{_f(cell.get('before'))} -> {_f(cell.get('after'))}"
            + (f" ±{se:.3f}" if se is not None else ""))


def never_updated(metrics: list[dict]) -> list[str]:
    """Trainable agents that no step updated (no record with trained samples for them)."""
    last = metrics[-1] if metrics else {}
    return [name for name, a in last.get("agents", {}).items()
            if isinstance(a, dict) and a.get("trainable")
            and not any(m.get("agents", {}).get(name, {}).get("trained_samples")
                        for m in metrics)]


def _reward(record: dict, agent: str) -> float | None:
    a = record.get("agents", {}).get(agent)
    return a.get("reward") if isinstance(a, dict) else None


def _mean(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return sum(present) / len(present) if present else None


def _f(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"
