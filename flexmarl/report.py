"""A finished (or running) run, as a self-contained HTML page with plots.

    write_report(RUN_DIR) -> RUN_DIR/report/report.html, beside it:
      reward.png       team reward and each agent's mean reward per step
      step_time.png    step time and rollout time per step
      utilisation.png  per agent rollout and trainer busy fractions; trainer slots busy fractions
      timeline.png     the last steps as a Gantt chart: per agent rollout spans, training and
                       weight sync, instance moves and trainer swaps
      staleness.png    mean staleness of the trained samples per agent per step

The page embeds the PNGs as data URIs and carries its own CSS, so it can be mailed or opened
anywhere. Plots are drawn on `matplotlib.figure.Figure` objects with the Agg canvas, never through
pyplot, so writing a report changes no global matplotlib state of the process.

Records from older runs may lack fields, a frozen agent has no training fields, and values may be
null: whatever is missing is left out of the plots and shown as "–" in the tables.
"""
from __future__ import annotations

import base64
import html
import math
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flexmarl.rundir import METRICS_FILE, read_metrics

REPORT_DIR = "report"
REPORT_FILE = "report.html"
TIMELINE_STEPS = 10  # the timeline shows this many last steps

PLOTS = (  # file, title in the page
    ("reward.png", "Reward"),
    ("step_time.png", "Step time"),
    ("utilisation.png", "Utilisation"),
    ("timeline.png", "Pipeline timeline"),
    ("staleness.png", "Staleness"),
)

_DPI = 100
_WIDTH = 10.0  # inches


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
    drawers = {"reward.png": _plot_reward, "step_time.png": _plot_step_time,
               "utilisation.png": _plot_utilisation, "timeline.png": _plot_timeline,
               "staleness.png": _plot_staleness}
    images: dict[str, bytes] = {}
    for name, _ in PLOTS:
        fig = drawers[name](run)
        path = out / name
        _save(fig, path)
        images[name] = path.read_bytes()
    page = out / REPORT_FILE
    page.write_text(_html(run, run_dir, images), encoding="utf-8")
    return page


# ----------------------------------------------------------------------------- reading records


def _num(value: Any) -> float | None:
    """`value` as a float if it is a real number (not a bool), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _dict(value: Any) -> dict:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def _nan(value: Any) -> float:
    v = _num(value)
    return math.nan if v is None else v


def _ratio(num: Any, den: Any) -> float:
    n, d = _num(num), _num(den)
    return n / d if n is not None and d is not None and d > 0 else math.nan


def _mean(values: Iterable[float | None]) -> float | None:
    vs = [v for v in values if v is not None and not math.isnan(v)]
    return sum(vs) / len(vs) if vs else None


@dataclass
class _Run:
    records: list[dict]

    def __post_init__(self) -> None:
        self.steps = [_num(r.get("step")) for r in self.records]
        self.steps = [i if s is None else s for i, s in enumerate(self.steps)]
        names: dict[str, None] = {}
        for r in self.records:
            for name in _dict(r.get("agents")):
                names.setdefault(str(name), None)
        self.agents = list(names)
        slots: dict[str, None] = {}
        for r in self.records:
            for slot in _dict(r.get("trainer_slots_busy_s")):
                slots.setdefault(str(slot), None)
        self.slots = list(slots)

    def agent(self, record: dict, name: str) -> dict:
        return _dict(_dict(record.get("agents")).get(name))

    def series(self, name: str, key: str) -> list[float]:
        return [_nan(self.agent(r, name).get(key)) for r in self.records]

    def team(self, key: str) -> list[float]:
        return [_nan(r.get(key)) for r in self.records]

    def trainable(self, name: str) -> bool:
        """Whether the agent was ever trained (or marked trainable) in these records."""
        for r in self.records:
            a = self.agent(r, name)
            if a.get("trainable") or _num(a.get("train_s")) or _num(a.get("staleness")) is not None:
                return True
        return False


# ----------------------------------------------------------------------------- plots


def _figure(height: float, rows: int = 1, *, sharex: bool = True) -> tuple[Any, list]:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(_WIDTH, height), dpi=_DPI, layout="constrained")
    axes = fig.subplots(rows, 1, sharex=sharex, squeeze=False)[:, 0]
    return fig, list(axes)


def _save(fig: Any, path: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)
    fig.savefig(path, format="png", dpi=_DPI)


def _colours(names: Sequence[str]) -> dict[str, Any]:
    from matplotlib import colormaps

    cmap = colormaps["tab10"]
    return {n: cmap(i % 10) for i, n in enumerate(names)}


def _steps_axis(ax: Any, steps: Sequence[float]) -> None:
    from matplotlib.ticker import MaxNLocator

    ax.set_xlabel("global step")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if steps:
        lo, hi = min(steps), max(steps)
        pad = 0.5 if hi == lo else 0.02 * (hi - lo)
        ax.set_xlim(lo - pad, hi + pad)
    ax.grid(True, alpha=0.3)


def _no_data(ax: Any, what: str) -> None:
    ax.text(0.5, 0.5, f"no {what} in the records", transform=ax.transAxes,
            ha="center", va="center", color="0.4")


def _has_data(values: Sequence[float]) -> bool:
    return any(not math.isnan(v) for v in values)


def _marker(steps: Sequence[float]) -> str | None:
    return "o" if len(steps) <= 60 else None


_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")


def _agent_style(i: int, colour: Any, steps: Sequence[float]) -> dict[str, Any]:
    """Line style of the i-th agent: its colour, and a hollow marker that shrinks with i, so
    agents with equal values (lines on top of each other) still show as nested markers."""
    style: dict[str, Any] = dict(color=colour, linewidth=1.4, alpha=0.9)
    if _marker(steps):
        style.update(marker=_MARKERS[i % len(_MARKERS)], markersize=max(3.0, 10.0 - 1.5 * i),
                     markerfacecolor="none", markeredgewidth=1.4)
    return style


def _label(name: str) -> str:
    """`name` as matplotlib text shows it verbatim: `$` would start mathtext (and fail to draw
    on an odd expression), a leading `_` would hide it from the legend."""
    name = name.replace("$", r"\$")
    return " " + name if name.startswith("_") else name


def _legend(ax: Any, **kw: Any) -> None:
    handles, _ = ax.get_legend_handles_labels()
    if handles:
        ax.legend(fontsize="small", **kw)


def _plot_reward(run: _Run) -> Any:
    fig, (ax,) = _figure(4.5)
    colours = _colours(run.agents)
    any_data = False
    team = run.team("team_reward")
    if _has_data(team):
        ax.plot(run.steps, team, color="black", linewidth=5, alpha=0.25, label="team",
                solid_capstyle="round", zorder=1)
        any_data = True
    for i, name in enumerate(run.agents):
        values = run.series(name, "reward")
        if _has_data(values):
            ax.plot(run.steps, values, label=_label(name), zorder=2,
                    **_agent_style(i, colours[name], run.steps))
            any_data = True
    if not any_data:
        _no_data(ax, "rewards")
    ax.set_title("Mean reward per step")
    ax.set_ylabel("mean reward")
    _steps_axis(ax, run.steps)
    _legend(ax, loc="best", ncols=min(4, 1 + len(run.agents)))
    return fig


def _plot_step_time(run: _Run) -> Any:
    fig, (ax,) = _figure(4.5)
    m = _marker(run.steps)
    step_s, rollout_s = run.team("step_s"), run.team("rollout_s")
    if _has_data(step_s):
        ax.plot(run.steps, step_s, color="tab:blue", marker=m, linewidth=2, label="step time")
        later = [v for v in step_s[1:] if not math.isnan(v)]
        if later:
            mean = sum(later) / len(later)
            ax.axhline(mean, color="tab:blue", linestyle=":", linewidth=1,
                       label=f"mean after step {run.steps[0]:g}: {mean:.3g} s")
    if _has_data(rollout_s):
        ax.plot(run.steps, rollout_s, color="tab:orange", marker=m, linewidth=1.5,
                label="rollout time")
    if not (_has_data(step_s) or _has_data(rollout_s)):
        _no_data(ax, "step times")
    ax.set_title("Time per global step")
    ax.set_ylabel("seconds")
    ax.set_ylim(bottom=0)
    _steps_axis(ax, run.steps)
    _legend(ax, loc="best")
    return fig


_UTIL_CAP = 1.5


def _plot_utilisation(run: _Run) -> Any:
    fig, axes = _figure(8.0, 3)
    colours = _colours(run.agents)
    m = _marker(run.steps)
    team_step = run.team("step_s")
    top = 1.0

    def agent_step(r: dict, a: dict) -> Any:
        own = _num(a.get("step_s"))
        return own if own is not None and own > 0 else r.get("step_s")

    panels = (
        (axes[0], "rollout_busy_s", "Rollout busy fraction per agent (rollout_busy_s / step_s)"),
        (axes[1], "train_s", "Trainer busy fraction per agent (train_s / step_s)"),
    )
    for ax, key, title in panels:
        drawn = False
        for i, name in enumerate(run.agents):
            values = [_ratio(run.agent(r, name).get(key), agent_step(r, run.agent(r, name)))
                      for r in run.records]
            if _has_data(values):
                ax.plot(run.steps, values, label=_label(name),
                        **_agent_style(i, colours[name], run.steps))
                top = max(top, max(v for v in values if not math.isnan(v)))
                drawn = True
        if not drawn:
            _no_data(ax, key)
        ax.set_title(title, fontsize="medium")
        ax.set_ylabel("busy fraction")
        _legend(ax, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax = axes[2]
    slot_cmap = _colours(run.slots)
    drawn = False
    for slot in run.slots:
        values = [_ratio(_dict(r.get("trainer_slots_busy_s")).get(slot), s)
                  for r, s in zip(run.records, team_step)]
        if _has_data(values):
            ax.plot(run.steps, values, color=slot_cmap[slot], marker=m, markersize=4,
                    linestyle="--", label=_label(slot))
            top = max(top, max(v for v in values if not math.isnan(v)))
            drawn = True
    if not drawn:
        _no_data(ax, "trainer slot times")
    ax.set_title("Trainer slots busy fraction (trainer_slots_busy_s / step_s)",
                 fontsize="medium")
    ax.set_ylabel("busy fraction")
    _legend(ax, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    # A pipelined run's last step can be far shorter than the rollout work recorded for it
    # (fractions of 10 and more); the axis stops at _UTIL_CAP and says what it leaves out.
    for ax in axes:
        ax.set_ylim(0, min(top, _UTIL_CAP) * 1.05)
        over = sum(1 for line in ax.lines for v in line.get_ydata()
                   if not math.isnan(v) and v > _UTIL_CAP)
        if over:
            ax.text(0.99, 0.97, f"{over} value{'s' if over > 1 else ''} above {_UTIL_CAP:g} "
                    "off scale", transform=ax.transAxes, ha="right", va="top",
                    fontsize="x-small", color="0.35")
        _steps_axis(ax, run.steps)
        if ax is not axes[-1]:
            ax.set_xlabel("")
    return fig


def _plot_staleness(run: _Run) -> Any:
    fig, (ax,) = _figure(4.0)
    colours = _colours(run.agents)
    top = 0.0
    for i, name in enumerate(run.agents):
        values = run.series(name, "staleness")
        if _has_data(values):
            ax.plot(run.steps, values, label=_label(name),
                    **_agent_style(i, colours[name], run.steps))
            top = max(top, max(v for v in values if not math.isnan(v)))
    if not ax.lines:
        _no_data(ax, "staleness values (no agent trained)")
    ax.set_title("Mean staleness of the trained samples (policy versions behind)")
    ax.set_ylabel("mean staleness")
    ax.set_ylim(-0.05 * max(top, 1.0), max(top, 1.0) * 1.1)
    _steps_axis(ax, run.steps)
    _legend(ax, loc="best")
    return fig


# Timeline colours: one per kind of span, so the picture reads the same for any team.
_ROLLOUT, _TRAIN, _SYNC = "tab:blue", "tab:orange", "tab:green"


def _plot_timeline(run: _Run) -> Any:
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    records = run.records[-TIMELINE_STEPS:]
    rows = len(run.agents)
    fig, (ax,) = _figure(max(3.0, 1.8 + 0.9 * rows))
    first_step = _num(records[0].get("step"))
    last_step = _num(records[-1].get("step"))
    ax.set_title(f"Pipeline timeline, steps {first_step or 0:g}–{last_step or 0:g} "
                 "(rollout spans above the row line, training + weight sync below)")
    lo, hi = math.inf, -math.inf
    y_of = {name: rows - 1 - i for i, name in enumerate(run.agents)}  # first agent on top
    for r in records:
        step = _num(r.get("step"))
        r_start, r_end = _num(r.get("t_rollout_start")), _num(r.get("t_rollout_end"))
        for name in run.agents:
            a = run.agent(r, name)
            if not a:
                continue
            y = y_of[name]
            start = _num(a.get("t_first_call"))
            start = r_start if start is None else start
            if start is not None and r_end is not None and r_end >= start:
                ax.broken_barh([(start, max(r_end - start, 1e-9))], (y + 0.02, 0.36),
                               facecolors=_ROLLOUT, edgecolors="white", linewidth=0.5,
                               alpha=0.85)
                if step is not None:
                    ax.text(start, y + 0.2, f" {step:g}", va="center", ha="left",
                            fontsize="x-small", color="white", clip_on=True)
                lo, hi = min(lo, start), max(hi, r_end)
            done = _num(a.get("t_done"))
            if done is None:
                continue
            sync_s = max(_num(a.get("sync_s")) or 0.0, 0.0)
            train_s = max(_num(a.get("train_s")) or 0.0, 0.0)
            train_end = done - sync_s
            if train_s > 0:
                ax.broken_barh([(train_end - train_s, train_s)], (y - 0.38, 0.36),
                               facecolors=_TRAIN, edgecolors="white", linewidth=0.5)
            if sync_s > 0:
                ax.broken_barh([(train_end, sync_s)], (y - 0.38, 0.36), facecolors=_SYNC,
                               edgecolors="white", linewidth=0.5)
            ax.plot([done, done], [y - 0.42, y + 0.42], color="black", linewidth=1)
            lo, hi = min(lo, train_end - train_s), max(hi, done)
    # Instance moves (triangle up on the agent that gained it, down on the one that lost it) and
    # trainer swaps (diamonds: filled in, hollow out), near the top and bottom of the row.
    move_in = dict(marker="^", color="tab:purple", linestyle="none", markersize=7)
    move_out = dict(marker="v", color="tab:red", linestyle="none", markersize=7)
    swap_in = dict(marker="D", color="0.2", linestyle="none", markersize=5)
    swap_out = dict(marker="D", markerfacecolor="none", markeredgecolor="0.2",
                    linestyle="none", markersize=5)
    for r in records:
        for mv in _list(r.get("moves")):
            at = _num(mv.get("at"))
            if at is None:
                continue
            for key, y_off, style in (("dst", 0.45, move_in), ("src", 0.45, move_out)):
                name = mv.get(key)
                if isinstance(name, str) and name in y_of:
                    ax.plot([at], [y_of[name] + y_off], **style)
                    lo, hi = min(lo, at), max(hi, at)
        for sw in _list(r.get("swaps")):
            at, name = _num(sw.get("at")), sw.get("agent")
            if at is None or not isinstance(name, str) or name not in y_of:
                continue
            ax.plot([at], [y_of[name] - 0.45], **(swap_in if sw.get("direction") == "in"
                                                  else swap_out))
            lo, hi = min(lo, at), max(hi, at)
    ax.set_yticks(range(rows), [_label(run.agents[rows - 1 - i]) for i in range(rows)])
    ax.set_ylim(-0.6, rows - 0.4)
    for y in range(rows):
        ax.axhline(y, color="0.85", linewidth=0.5, zorder=0)
    ax.set_xlabel("seconds since the run started")
    ax.grid(True, axis="x", alpha=0.3)
    if lo > hi:
        _no_data(ax, "timeline fields (t_rollout_start, t_rollout_end, t_done)")
    else:
        pad = 0.01 * max(hi - lo, 1e-6)
        ax.set_xlim(lo - pad, hi + pad)
    fig.legend(handles=[
        Patch(color=_ROLLOUT, label="rollout (first call → rollout end)"),
        Patch(color=_TRAIN, label="training (busy time)"),
        Patch(color=_SYNC, label="weight sync"),
        Line2D([], [], color="black", linewidth=1, label="step done"),
        Line2D([], [], label="instance moved in", **move_in),
        Line2D([], [], label="instance moved out", **move_out),
        Line2D([], [], label="trainer swap in", **swap_in),
        Line2D([], [], label="trainer swap out", **swap_out),
    ], fontsize="x-small", loc="outside lower center", ncols=4, frameon=False)
    return fig


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
    ]


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
            _fmt(instances),
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
    summary = "\n".join(f"<tr><th>{e(k)}</th><td>{e(v)}</td></tr>" for k, v in _summary(run))
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
</body>
</html>
"""
