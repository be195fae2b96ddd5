"""A finished (or running) run, as a self-contained HTML page with plots.

    write_report(RUN_DIR) -> RUN_DIR/report/report.html, beside it:
      reward.png       team reward and each agent's mean reward per step
      step_time.png    step time and rollout time per step
      utilisation.png  per agent rollout and trainer busy fractions; trainer slots busy fractions
      timeline.png     the last steps as a Gantt chart: per agent rollout spans, training and
                       weight sync, instance moves and trainer swaps
      staleness.png    mean staleness of the trained samples per agent per step

The page embeds the PNGs as data URIs and carries its own CSS, so it can be mailed or opened
anywhere. The plots (flexmarl.observe.plots) are drawn on `matplotlib.figure.Figure` objects with
the Agg canvas, never through pyplot, so writing a report changes no global matplotlib state.

Records from older runs may lack fields, a frozen agent has no training fields, and values may be
null: whatever is missing is left out of the plots and shown as "–" in the tables.
"""
from __future__ import annotations

import base64
import html
import math
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from flexmarl.observe.plots import DRAWERS, TIMELINE_STEPS, _list, _mean, _num, _Run, _save
from flexmarl.observe.rundir import METRICS_FILE, game_lines, policy_lines, read_metrics

REPORT_DIR = "report"
REPORT_FILE = "report.html"

PLOTS = (  # file, title in the page
    ("reward.png", "Reward"),
    ("step_time.png", "Step time"),
    ("utilisation.png", "Utilisation"),
    ("timeline.png", "Pipeline timeline"),
    ("staleness.png", "Staleness"),
)


class ReportError(ValueError):
    """The run directory cannot be reported on (no metrics file, no records, a bad line)."""


def write_report(run_dir: str | Path, *, out_dir: Path | None = None) -> Path:
    """Write the plots and report.html for `run_dir` into `out_dir` (default RUN_DIR/report).

    Returns the path of report.html. Raises ReportError (a ValueError) naming the path when the
    run directory or its metrics file is missing, empty, or has a malformed line.
    """
    run_dir = Path(run_dir)
    metrics = run_dir / METRICS_FILE
    if not run_dir.is_dir():
        raise ReportError(f"run directory {str(run_dir)!r} does not exist")
    if not metrics.is_file():
        raise ReportError(f"no metrics file {str(metrics)!r}: is {str(run_dir)!r} a run "
                          "directory?")
    try:
        records = [r for r in read_metrics(metrics) if isinstance(r, dict)]
    except ValueError as e:
        raise ReportError(str(e)) from None
    if not records:
        raise ReportError(f"metrics file {str(metrics)!r} holds no records yet")
    records.sort(key=lambda r: _num(r.get("step")) or 0)

    out = Path(out_dir) if out_dir is not None else run_dir / REPORT_DIR
    out.mkdir(parents=True, exist_ok=True)
    run = _Run(records)
    images: dict[str, bytes] = {}
    for name, _ in PLOTS:
        fig = DRAWERS[name](run)
        path = out / name
        _save(fig, path)
        images[name] = path.read_bytes()
    page = out / REPORT_FILE
    page.write_text(_html(run, run_dir, images), encoding="utf-8")
    return page


# ----------------------------------------------------------------------------- HTML


def _fmt(value: Any, digits: int = 4, unit: str = "") -> str:
    v = _num(value)
    if v is None or math.isnan(v):
        return "–"
    if v == int(v) and abs(v) < 1e15 and not unit:
        return f"{int(v):,}"
    return f"{v:.{digits}g}{unit}"


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "–"
    if seconds < 120:
        return f"{seconds:.3g} s"
    minutes, s = divmod(seconds, 60)
    hours, minutes = divmod(int(minutes), 60)
    return (f"{hours} h {minutes:02d} min" if hours else f"{minutes} min {s:02.0f} s")


def _summary(run: _Run) -> list[tuple[str, str]]:
    records = run.records
    modes = list(dict.fromkeys(str(r["mode"]) for r in records if r.get("mode") is not None))
    step_s = [_num(r.get("step_s")) for r in records]
    known = [s for s in step_s if s is not None]
    total = sum(known) if known else None
    if total is None:
        times = [_num(r.get("time")) for r in records]
        times = [t for t in times if t is not None]
        total = times[-1] - times[0] if len(times) > 1 else None
    later = _mean(step_s[1:])
    team = [_num(r.get("team_reward")) for r in records]
    team = [t for t in team if t is not None]
    steps = f"{len(records)}"
    if run.steps and (run.steps[0] != 0 or run.steps[-1] != len(records) - 1):
        steps += f" (steps {run.steps[0]:g}–{run.steps[-1]:g})"
    return [
        ("steps", steps),
        ("mode", ", ".join(modes) or "–"),
        ("agents", str(len(run.agents))),
        ("total time", _duration(total)),
        ("mean step time (after the first)", _duration(later)),
        ("first team reward", _fmt(team[0] if team else None)),
        ("last team reward", _fmt(team[-1] if team else None)),
        ("instance moves", str(sum(len(_list(r.get("moves"))) for r in records))),
        ("trainer swaps", str(sum(len(_list(r.get("swaps"))) for r in records))),
        *_time_share_rows(records),
        *_eval_rows(records),
    ]


def _games(run_dir: Path) -> list[tuple[str, str]]:
    """A game team's win rates before and after training, and its policies' NashConv, from
    RUN_DIR/eval.json."""
    import orjson
    try:
        document = orjson.loads((run_dir / "eval.json").read_bytes())
        heldout, policies = document.get("heldout"), document.get("policies")
    except (OSError, ValueError, AttributeError):
        return []
    return [*((f"held-out games: {k}", v) for k, v in game_lines(heldout)),
            *((f"policies: {k}", v) for k, v in policy_lines(policies))]


def _cross_play(run_dir: Path) -> str:
    """RUN_DIR/crossplay.json (flexmarl eval --cross-play) as a heat-map of the seat-balanced
    expected returns and a table of ratings; "" without it."""
    import orjson
    try:
        result = orjson.loads((run_dir / "crossplay.json").read_bytes())
        names = list(result["policies"])
        payoff = [[0.0 if a == b else float(result["payoff"][a][b]) for b in names]
                  for a in names]
    except (OSError, ValueError, KeyError, TypeError):
        return ""
    import io

    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(1.2 + 0.75 * len(names), 0.9 + 0.6 * len(names)))
    top = max((abs(v) for row in payoff for v in row), default=1.0) or 1.0
    im = ax.imshow(payoff, cmap="RdBu", vmin=-top, vmax=top)
    ax.set_xticks(range(len(names)), names, rotation=45, ha="right")
    ax.set_yticks(range(len(names)), names)
    for i, row in enumerate(payoff):
        for j, v in enumerate(row):
            if i != j:
                ax.text(j, i, f"{v:+.2f}", ha="center", va="center", fontsize=8)
    ax.set_xlabel("opponent")
    fig.colorbar(im, ax=ax, label="expected return (seat-balanced)")
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", bbox_inches="tight", dpi=100)
    plt.close(fig)
    data = base64.b64encode(buffer.getvalue()).decode("ascii")
    e = html.escape
    rows = [[n, f"{result['ratings'][n]['mu']:.2f}", f"{result['ratings'][n]['sigma']:.2f}",
             f"{result['ratings'][n]['ordinal']:.2f}", f"{result['nash_conv'][n]:.3f}",
             result.get("sources", {}).get(n, "")]
            for n in sorted(names, key=lambda n: -result["ratings"][n]["ordinal"])]
    return (f'<h2 id="cross-play">Cross-play: {e(str(result.get("game", "")))}</h2>\n'
            f'<figure><img alt="cross-play" src="data:image/png;base64,{data}">'
            "<figcaption>Each row's exact expected return against each column, averaged over "
            "the row's seats (policy tables from each model's likelihood of each legal action); "
            f"ratings: openskill from {result.get('deals')} duplicate matches per pair, sampled "
            "from the same tables.</figcaption></figure>\n"
            + _table(["policy", "mu", "sigma", "mu - 3 sigma", "NashConv", "weights"], rows))


def _time_share_rows(records: list[dict]) -> list[tuple[str, str]]:
    """devices.placement time_shared: each group's switches between its engines and its
    trainer (the last record's totals)."""
    last = next((r["time_shares"] for r in reversed(records)
                 if isinstance(r.get("time_shares"), dict)), {})
    return [(f"time-shared {name}", f"{g.get('switches', 0)} switches, "
             f"{_duration(_num(g.get('switch_s')))} switching")
            for name, g in last.items() if isinstance(g, dict)]


def _eval_rows(records: list[dict]) -> list[tuple[str, str]]:
    """The held-out evaluations' team reward, first and last (eval.every_steps)."""
    evals = [(r["eval"].get("after_step"), _num(r["eval"].get("team_reward")))
             for r in records if isinstance(r.get("eval"), dict)]
    if not evals:
        return []
    (s0, first), (s1, last) = evals[0], evals[-1]
    return [(f"held-out team reward after step {s0}", _fmt(first)),
            (f"held-out team reward after step {s1}", _fmt(last))]


_AGENT_COLUMNS = ("agent", "trainable", "final version", "final reward", "mean staleness",
                  "samples", "tokens", "instances (last)", "moves in / out", "swaps in / out")


def _total(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def _in_out(n_in: int, n_out: int) -> str:
    return f"{n_in} / {n_out}"


def _agent_rows(run: _Run) -> list[list[str]]:
    rows = []
    for name in run.agents:
        entries = [run.agent(r, name) for r in run.records]
        present = [a for a in entries if a]
        version = next((a.get("version") for a in reversed(present)
                        if _num(a.get("version")) is not None), None)
        reward = next((a.get("reward") for a in reversed(present)
                       if _num(a.get("reward")) is not None), None)
        instances = next((a.get("instances") for a in reversed(present)
                          if _num(a.get("instances")) is not None), None)
        group = next((a.get("lora_group") for a in reversed(present) if a.get("lora_group")),
                     None)
        staleness = _mean(_num(a.get("staleness")) for a in present)
        samples = [_num(a.get("samples")) for a in present]
        tokens = [_num(a.get("tokens")) for a in present]
        moves = [mv for r in run.records for mv in _list(r.get("moves"))]
        swaps = [sw for r in run.records for sw in _list(r.get("swaps"))
                 if sw.get("agent") == name]
        rows.append([
            name,
            "yes" if run.trainable(name) else "no (frozen)",
            _fmt(version),
            _fmt(reward),
            _fmt(staleness, 3),
            _fmt(_total(samples)),
            _fmt(_total(tokens)),
            _fmt(instances) + (f" (shared: LoRA {group})" if group else ""),
            _in_out(sum(mv.get("dst") == name for mv in moves),
                    sum(mv.get("src") == name for mv in moves)),
            _in_out(sum(sw.get("direction") == "in" for sw in swaps),
                    sum(sw.get("direction") == "out" for sw in swaps)),
        ])
    return rows


_STEP_COLUMNS = ("step", "step time", "rollout time", "team reward", "tasks", "moves", "swaps")


def _step_rows(run: _Run) -> list[list[str]]:
    return [[_fmt(s), _fmt(r.get("step_s"), 4, " s"), _fmt(r.get("rollout_s"), 4, " s"),
             _fmt(r.get("team_reward")), _fmt(r.get("tasks")),
             str(len(_list(r.get("moves")))), str(len(_list(r.get("swaps"))))]
            for s, r in zip(run.steps, run.records)]


def _table(columns: Sequence[str], rows: Iterable[Sequence[str]], *, cls: str = "") -> str:
    e = html.escape
    head = "".join(f"<th>{e(c)}</th>" for c in columns)
    body = "\n".join("<tr>" + "".join(f"<td>{e(v)}</td>" for v in row) + "</tr>" for row in rows)
    return (f'<table class="{e(cls)}"><thead><tr>{head}</tr></thead>\n'
            f"<tbody>\n{body}\n</tbody></table>")


_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 2em auto;
       max-width: 1060px; padding: 0 1em; color: #222; background: #fff; }
h1 { font-size: 1.5em; margin-bottom: 0.2em; }
h2 { font-size: 1.2em; margin-top: 1.8em; border-bottom: 1px solid #ddd; padding-bottom: 0.2em; }
.meta { color: #666; font-size: 0.9em; }
table { border-collapse: collapse; margin: 0.8em 0; font-size: 0.92em; }
th, td { border: 1px solid #ddd; padding: 0.3em 0.7em; text-align: right; }
th { background: #f4f4f4; font-weight: 600; }
td:first-child, th:first-child { text-align: left; }
table.summary th { text-align: left; }
tbody tr:nth-child(even) { background: #fafafa; }
figure { margin: 1em 0; }
figure img { max-width: 100%; height: auto; border: 1px solid #eee; }
figcaption { color: #555; font-size: 0.9em; }
details summary { cursor: pointer; color: #333; }
"""

_CAPTIONS = {
    "reward.png": "Team reward (thick grey) and each agent's mean reward per global step; "
                  "gaps are steps without a reward (no samples).",
    "step_time.png": "Wall time of each global step and of its rollout; the dotted line is "
                     "the mean step time after the first step.",
    "utilisation.png": "Fraction of each step an agent's rollout instances were busy and its "
                       "trainer was training; below, each trainer slot's busy fraction. In "
                       "pipelined modes a step's rollout overlaps the step before it, so a "
                       "fraction can exceed 1.",
    "timeline.png": f"The last {TIMELINE_STEPS} steps: for each agent, the rollout span of "
                    "each step (numbered) from its first call to the end of the step's rollout, "
                    "then its training busy time and weight sync ending when the agent finished "
                    "the step; markers show instance moves and trainer swaps.",
    "staleness.png": "Mean staleness of the samples each agent trained on (policy versions "
                     "between generating and training on a sample).",
}


def _html(run: _Run, run_dir: Path, images: dict[str, bytes]) -> str:
    e = html.escape
    summary = "\n".join(f"<tr><th>{e(k)}</th><td>{e(v)}</td></tr>"
                        for k, v in [*_summary(run), *_games(run_dir)])
    figures = []
    for name, title in PLOTS:
        data = base64.b64encode(images[name]).decode("ascii")
        figures.append(
            f'<h2 id="{e(name[:-4])}">{e(title)}</h2>\n<figure><img alt="{e(title)}" '
            f'src="data:image/png;base64,{data}">\n'
            f"<figcaption>{e(_CAPTIONS[name])}</figcaption></figure>")
    fig_html = "\n".join(figures)
    generated = time.strftime("%Y-%m-%d %H:%M:%S")
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>FlexMARL report: {e(run_dir.name or str(run_dir))}</title>
<style>{_CSS}</style>
</head>
<body>
<h1>FlexMARL run report</h1>
<p class="meta">Run directory <code>{e(str(run_dir))}</code> · {len(run.records)} metric records ·
generated {e(generated)}</p>
<h2 id="summary">Summary</h2>
<table class="summary">
{summary}
</table>
<h2 id="agents">Agents</h2>
{_table(_AGENT_COLUMNS, _agent_rows(run), cls="agents")}
<details><summary>Per step</summary>
{_table(_STEP_COLUMNS, _step_rows(run), cls="steps")}
</details>
{fig_html}
{_cross_play(run_dir)}
</body>
</html>
"""
