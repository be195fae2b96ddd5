"""The run report's data and figures: records read defensively (_Run) and one matplotlib
figure per plot (flexmarl.observe.report writes them and the HTML around them).

Plots are drawn on `matplotlib.figure.Figure` objects with the Agg canvas, never through pyplot,
so drawing changes no global matplotlib state of the process. Missing or null fields are left
out of the plots.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TIMELINE_STEPS = 10  # the timeline shows this many last steps
_DPI = 100
_WIDTH = 10.0  # inches


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
    # Held-out evaluations (eval.every_steps): the team reward on tasks never trained on.
    evals = [(r["eval"].get("after_step", step), _num(r["eval"].get("team_reward")))
             for r, step in zip(run.records, run.steps) if isinstance(r.get("eval"), dict)]
    evals = [(x, y) for x, y in evals if y is not None]
    if evals:
        ax.plot(*zip(*evals), color="black", linestyle="--", marker="s", markersize=5,
                label="team, held-out (eval)", zorder=3)
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


DRAWERS = {"reward.png": _plot_reward, "step_time.png": _plot_step_time,
           "utilisation.png": _plot_utilisation, "timeline.png": _plot_timeline,
           "staleness.png": _plot_staleness}
"""Plot file name -> the function drawing it from a _Run."""
