"""What a run looks like right now: the data behind /api/status, /metrics and the dashboard.

    Orchestrator.status() (agents, versions, samples) ──┐
    InstancePool.status() (instances, loads, moves) ────┤
    TrainerPool.status() (slots, swaps, busy seconds) ──┼─► RunMonitor.status() ─► JSON
    ActivityLog (busy intervals) ───────────────────────┤                      └► /metrics
    PipelineRun records (on_record, one per step) ──────┘    (prometheus_client collector)

Each part is read through its one status() method (the `StatusSource` protocol), never
through its attributes: a part's internals can change without the monitor knowing.

A sample_loop() takes every busy counter once a second, so utilisation is "busy fraction over
the last `window_s`" for each agent's rollout, each rollout instance and each trainer slot.
The status schema (tests/data/status_sample.json is an example):

    run        team, mode, state (starting|evaluating|running|finished|failed), steps, steps_done,
               rollout_step, started_at (unix), elapsed_s, run_dir, stalled (null, or
               {for_s, waiting_for}: no sample stored and no step finished for stall_after_s)
    agents     name -> trainable, version, trainer_version, instances, slot, inflight, samples,
               reward, staleness, train_s (last finished step), rollout_util
    instances  name -> agent, queued, running (its last load report), inflight (ours),
               draining, util
    slots      name -> ranks, agent (bound now), resident (state held), util
    history    the finished steps: step, step_s, t_done, team_reward, eval (held-out, when
               the step was evaluated),
               agents.name.{reward, staleness, version, train_s, sync_s}
    totals     moves, swaps (since the run started)
    timeline   now, intervals [[agent, rollout|train|sync|swap, start, end|null], ...]
    events     [{t, kind: move|swap, text}]
Times in history, timeline and events are seconds since the run started.

The same once-a-second sampling watches for a run that has stopped moving: no sample stored,
no step finished and no agent updated for `stall_after_s` (observe.stall_warn_s). That is
logged, again every stall_after_s while it lasts, naming what the run waits for (requests in
flight per instance, trainer work under way, or nothing FlexMARL holds: then the workflow awaits
something of its own), and shown on the dashboard, so a hung run does not look alive.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from typing import Any, Iterator, Protocol

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from flexmarl.activity import ActivityLog
from flexmarl.clock import now

log = logging.getLogger(__name__)


class StatusSource(Protocol):
    """A part of the run that says how it is: Orchestrator, InstancePool, TrainerPool."""

    def status(self) -> dict[str, Any]: ...


class StallWatch:
    """Pure: is the run still moving? `observe(progress, t)` with any value that changes
    whenever the run makes progress; `stalled_s(t)` is how long it has not (0 while it moves)
    once that exceeds `after_s` (0: never)."""

    def __init__(self, after_s: float) -> None:
        self.after_s = after_s
        self._progress: Any = None
        self._since = 0.0
        self._warned_at: float | None = None

    def observe(self, progress: Any, t: float) -> None:
        if progress != self._progress:
            self._progress, self._since, self._warned_at = progress, t, None

    def stalled_s(self, t: float) -> float:
        quiet = t - self._since
        return quiet if self.after_s > 0 and quiet >= self.after_s else 0.0

    def due(self, t: float) -> bool:
        """Stalled and not said in the last `after_s`: time to say it (again)."""
        if not self.stalled_s(t) or (self._warned_at is not None
                                     and t - self._warned_at < self.after_s):
            return False
        self._warned_at = t
        return True


def waiting_for(status: dict[str, Any]) -> str:
    """What a run whose status is `status` (RunMonitor.status()) is waiting for, in words."""
    parts = []
    for agent, a in status["agents"].items():
        if a.get("inflight"):
            where = ", ".join(f"{name}: {i['inflight']}"
                              for name, i in sorted(status["instances"].items())
                              if i["agent"] == agent and i["inflight"])
            parts.append(f"{a['inflight']} requests of {agent} in flight ({where or 'none'})")
    for who, kind, start, end in status["timeline"]["intervals"]:
        if end is None and kind in ("train", "sync"):
            parts.append(f"{who} {kind} under way for {status['timeline']['now'] - start:.0f} s")
    if not parts:
        return ("nothing FlexMARL holds: no request in flight, no trainer work under way; the "
                "workflow awaits something of its own (a reward function, a tool, a service)")
    return "; ".join(parts)


class RunMonitor:
    def __init__(self, orch: StatusSource, pool: StatusSource | None,
                 trainers: StatusSource | None, activity: ActivityLog, *, mode: str,
                 steps: int, run_dir: str = "", window_s: float = 30.0,
                 timeline_s: float = 120.0, history: int = 500,
                 stall_after_s: float = 0.0, cluster: dict[str, str] | None = None) -> None:
        """`cluster`: where the workers run, {"launcher": ..., "dashboard": URL or ""} (the
        page links a Ray dashboard)."""
        self.orch, self.pool, self.trainers = orch, pool, trainers
        self.cluster = cluster or {"launcher": "local", "dashboard": ""}
        self.activity = activity
        self.mode = mode
        self.steps = steps
        self.run_dir = run_dir
        self.window_s = window_s
        self.timeline_s = timeline_s
        self.state = "starting"
        self.rollout_step = -1
        self.history: deque[dict] = deque(maxlen=history)
        self.last: dict[str, dict] = {}
        """agent -> its entry in the last finished step's record."""
        self.started_at = time.time()
        self.t0 = now()
        self._samples: deque[tuple[float, dict]] = deque()
        self.stall = StallWatch(stall_after_s)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Collector(self))

    # ------------------------------------------------------------------ inputs

    def start_step(self, step: int) -> None:
        self.state = "running"
        self.rollout_step = step

    def on_record(self, record: dict) -> None:
        """A finished step's record (what goes to metrics.jsonl)."""
        agents = record.get("agents", {})
        self.last = agents
        self.history.append({
            "step": record["step"], "step_s": record.get("step_s"),
            "t_done": now() - self.t0, "team_reward": record.get("team_reward"),
            "agents": {name: {k: a.get(k) for k in ("reward", "staleness", "version",
                                                    "train_s", "sync_s")}
                       for name, a in agents.items()}})
        if isinstance(record.get("eval"), dict):  # a held-out evaluation after this step
            ev = record["eval"]
            self.history[-1]["eval"] = {"team_reward": ev.get("team_reward"), "agents": {
                name: a.get("reward") for name, a in ev.get("agents", {}).items()}}

    async def sample_loop(self, interval_s: float = 1.0) -> None:
        while True:
            self.sample()
            await asyncio.sleep(interval_s)

    def sample(self) -> None:
        t = now()
        parts = self._parts()
        self._samples.append((t, self._busy(parts)))
        while len(self._samples) > 2 and self._samples[1][0] <= t - self.window_s:
            self._samples.popleft()
        # Progress: a sample stored, a step finished, an agent updated, or a new state (the
        # held-out measurement before step 1 stores no sample: its minutes are no stall).
        agents = parts[0]["agents"]
        self.stall.observe((self.state, len(self.history),
                            sum(a["samples"] for a in agents.values()),
                            tuple(a["trainer_version"] for a in agents.values())), t)
        if self._live and self.stall.due(t):
            log.warning("no progress for %.0f s (no sample stored, no step finished, no agent "
                        "updated; observe.stall_warn_s = %g): waiting for %s",
                        self.stall.stalled_s(t), self.stall.after_s, waiting_for(self.status()))

    def _parts(self) -> tuple[dict, dict, dict]:
        """The status of the orchestrator, the rollout pool and the trainer pool, now."""
        empty_pool = {"instances": {}, "agents": {}, "moves": [], "moves_total": 0}
        empty_slots = {"slots": {}, "bound": {}, "swaps": [], "swaps_total": 0}
        return (self.orch.status(), self.pool.status() if self.pool else empty_pool,
                self.trainers.status() if self.trainers else empty_slots)

    def _busy(self, parts: tuple[dict, dict, dict] | None = None
              ) -> dict[tuple[str, str], float]:
        orch, pool, trainers = parts or self._parts()
        act = self.activity
        busy = {("agent", a): act.busy_s(a, "rollout") for a in orch["agents"]}
        busy.update({("instance", i): act.busy_s(i, "instance") for i in pool["instances"]})
        busy.update({("slot", s): v["busy_s"] for s, v in trainers["slots"].items()})
        return busy

    def _utilisation(self, parts: tuple[dict, dict, dict]) -> dict[tuple[str, str], float]:
        t, busy = now(), self._busy(parts)
        if not self._samples:
            return dict.fromkeys(busy, 0.0)
        t_then, then = self._samples[0]
        span = t - t_then
        return {k: (min(1.0, max(0.0, (v - then.get(k, 0.0)) / span)) if span > 0 else 0.0)
                for k, v in busy.items()}

    # ------------------------------------------------------------------ outputs

    def status(self) -> dict[str, Any]:
        t = now()
        parts = self._parts()
        orch, pool, trainers = parts
        util = self._utilisation(parts)
        agents = {}
        for name, a in orch["agents"].items():
            served = pool["agents"].get(name, {"instances": [], "inflight": 0})
            last = self.last.get(name, {})
            agents[name] = {
                "trainable": a["trainable"], "version": a["version"],
                "trainer_version": a["trainer_version"], "instances": served["instances"],
                "slot": trainers["bound"].get(name), "inflight": served["inflight"],
                "samples": a["samples"], "reward": last.get("reward"),
                "staleness": last.get("staleness"), "train_s": last.get("train_s"),
                "rollout_util": util.get(("agent", name), 0.0)}
        gpus = _gpus(pool.get("devices", []))
        instances = {name: {**i, "util": util.get(("instance", name), 0.0),
                            "gpus": gpus.get(name, "")}
                     for name, i in pool["instances"].items()}
        slots = {name: {"ranks": s["ranks"], "agent": s["agent"], "resident": s["resident"],
                        "util": util.get(("slot", name), 0.0),
                        "gpus": " ".join(g for w, g in gpus.items()
                                         if w.startswith(name + "-"))}
                 for name, s in trainers["slots"].items()}
        return self._with_stall({
            "run": {"team": orch["team"], "mode": self.mode, "state": self.state,
                    "steps": self.steps, "steps_done": len(self.history) and
                    self.history[-1]["step"] + 1, "rollout_step": self.rollout_step,
                    "started_at": self.started_at, "elapsed_s": t - self.t0,
                    "run_dir": self.run_dir, "cluster": self.cluster, "stalled": None},
            "agents": agents, "instances": instances, "slots": slots,
            "history": list(self.history),
            "timeline": {"now": t - self.t0, "intervals": self._intervals(t, trainers)},
            "events": self._events(pool, trainers),
            "devices": pool.get("devices", []),
            "time_shares": pool.get("time_shares", {}),
            "totals": {"moves": pool["moves_total"], "swaps": trainers["swaps_total"]}}, t)

    @property
    def _live(self) -> bool:
        """Still running (a finished or failed run is not stalled)."""
        return self.state in ("starting", "running")

    def _with_stall(self, status: dict[str, Any], t: float) -> dict[str, Any]:
        stalled = self.stall.stalled_s(t)
        if stalled and self._live:
            status["run"]["stalled"] = {"for_s": stalled, "waiting_for": waiting_for(status)}
        return status

    def _intervals(self, t: float, trainers: dict) -> list[list]:
        since = t - self.timeline_s
        out = [[who, kind, start - self.t0, None if end is None else end - self.t0]
               for who, kind, start, end in self.activity.recent(since)
               if kind in ("rollout", "train", "sync")]
        out += [[sw.agent, "swap", sw.at - sw.seconds - self.t0, sw.at - self.t0]
                for sw in trainers["swaps"] if sw.at >= since]
        return out

    def _events(self, pool: dict, trainers: dict, limit: int = 100) -> list[dict]:
        events = []
        for m in pool["moves"][-limit:]:
            events.append({"t": m.at - self.t0, "kind": "move", "text":
                           f"{m.instance}: {m.src} -> {m.dst} (load {m.src_load:.0f} vs "
                           f"{m.dst_load:.0f} tokens per instance; drained "
                           f"{m.drain_s:.2f} s, loaded {m.load_s:.2f} s)"})
        for sw in trainers["swaps"][-limit:]:
            where = "into" if sw.direction == "in" else "out of"
            events.append({"t": sw.at - self.t0, "kind": "swap", "text":
                           f"{sw.agent} {where} {sw.slot} ({sw.num_bytes / 1e6:.1f} MB, "
                           f"{sw.seconds:.2f} s)"})
        return sorted(events, key=lambda e: e["t"])[-limit:]

    def metrics(self) -> bytes:
        return generate_latest(self.registry)


class _Collector:
    """Prometheus view of RunMonitor.status(), built at scrape time."""

    def __init__(self, monitor: RunMonitor) -> None:
        self.monitor = monitor

    def collect(self) -> Iterator[Any]:
        st = self.monitor.status()
        run = st["run"]

        def gauge(name: str, doc: str, labels: list[str] = ()) -> GaugeMetricFamily:
            return GaugeMetricFamily(f"flexmarl_{name}", doc, labels=list(labels))

        g = gauge("steps_done", "Global steps finished")
        g.add_metric([], run["steps_done"])
        yield g
        g = gauge("steps", "Global steps this run will train")
        g.add_metric([], run["steps"])
        yield g
        g = gauge("elapsed_seconds", "Seconds since the run started")
        g.add_metric([], run["elapsed_s"])
        yield g
        g = gauge("stalled_seconds", "Seconds without progress, once past observe.stall_warn_s "
                  "(0 while the run moves)")
        g.add_metric([], (run["stalled"] or {}).get("for_s", 0.0))
        yield g
        last = st["history"][-1] if st["history"] else {}
        for key, doc in (("team_reward", "Mean team reward of the last finished step"),
                         ("step_s", "Duration of the last finished step, seconds")):
            if last.get(key) is not None:
                g = gauge("last_" + key.replace("_s", "_seconds"), doc)
                g.add_metric([], last[key])
                yield g
        per_agent = {
            "version": "Policy version the agent's rollout instances serve",
            "trainer_version": "Policy version of the agent's trainer",
            "inflight": "Requests of the agent in flight",
            "reward": "Mean reward of the agent's turns in the last finished step",
            "staleness": "Mean staleness of the agent's trained samples, last step",
            "rollout_util": "Fraction of the last window with a request of the agent in flight"}
        for key, doc in per_agent.items():
            g = gauge(f"agent_{key}", doc, ["agent"])
            for name, a in st["agents"].items():
                if a[key] is not None:
                    g.add_metric([name], float(a[key]))
            yield g
        c = CounterMetricFamily("flexmarl_agent_samples", "Samples generated", labels=["agent"])
        for name, a in st["agents"].items():
            c.add_metric([name], a["samples"])
        yield c
        for key, doc in (("queued", "Requests queued at the instance (its last load report)"),
                         ("running", "Requests running at the instance (its last load report)"),
                         ("inflight", "This orchestrator's requests in flight at the instance"),
                         ("util", "Fraction of the last window the instance had a request")):
            g = gauge(f"instance_{key}", doc, ["instance", "agent"])
            for name, i in st["instances"].items():
                g.add_metric([name, i["agent"]], float(i[key]))
            yield g
        g = gauge("slot_util", "Fraction of the last window the trainer slot was busy",
                  ["slot"])
        for name, s in st["slots"].items():
            g.add_metric([name], s["util"])
        yield g
        g = gauge("slot_bound", "1 while the slot is bound to the agent", ["slot", "agent"])
        for name, s in st["slots"].items():
            if s["agent"]:
                g.add_metric([name, s["agent"]], 1.0)
        yield g
        c = CounterMetricFamily("flexmarl_moves", "Rollout instances moved between agents")
        c.add_metric([], st["totals"]["moves"])
        yield c
        c = CounterMetricFamily("flexmarl_swaps", "Training states swapped in or out of slots")
        c.add_metric([], st["totals"]["swaps"])
        yield c


def _gpus(rows: list[dict]) -> dict[str, str]:
    """worker -> "HOST:GPUS" (the GPU placement's rows; flexmarl.placement.devices)."""
    return {r["worker"]: f"{r['host']}:{','.join(map(str, r['gpus']))}" for r in rows}
