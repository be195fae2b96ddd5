"use strict";
// FlexMARL live dashboard: polls /api/status once a second and redraws every panel from it.
// No framework, no build step, nothing fetched but this server's own files. Every piece of data
// reaches the DOM through textContent / createElement / setAttribute (agent and instance names
// come from user files), never through innerHTML.

const POLL_MS = 1000;
const WINDOW_S = 60;    // the timeline shows the last minute of the run
const MIN_SPAN_S = 10;  // ...and at least this much, so the first seconds are not stretched
const MAX_EVENTS = 30;
const SVG_NS = "http://www.w3.org/2000/svg";
const PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e",
                 "#17becf", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22"];
const KINDS = ["rollout", "train", "sync", "swap"];  // colours live in dashboard.css

// An agent keeps its colour for the page's lifetime, so it reads the same in every panel and
// does not shift when another agent appears or leaves.
const agentColors = new Map();
function agentColor(name) {
  if (!agentColors.has(name)) agentColors.set(name, PALETTE[agentColors.size % PALETTE.length]);
  return agentColors.get(name);
}

// ---- small DOM helpers ----------------------------------------------------------------------
function h(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v; else if (k === "style") e.style.cssText = v; else e.setAttribute(k, v);
  }
  for (const c of children) if (c != null) e.append(c instanceof Node ? c : String(c));  // strings become text
  return e;
}
function svg(tag, attrs, text) {
  const e = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text != null) e.textContent = String(text);
  return e;
}
function setText(id, text) { document.getElementById(id).textContent = text; }
function fill(id, node) { document.getElementById(id).replaceChildren(node); }

const isNum = (v) => typeof v === "number" && Number.isFinite(v);
const fmt = (v, digits = 2) => (isNum(v) ? v.toFixed(digits) : "–");
const fmtInt = (v) => (isNum(v) ? String(Math.round(v)) : "–");
const fmtPct = (v) => (isNum(v) ? `${Math.round(v * 100)}%` : "–");
const str = (v) => (v == null ? "–" : String(v));
function fmtDuration(sec) {
  if (!isNum(sec)) return "–";
  sec = Math.max(0, Math.floor(sec));
  const pad = (n) => String(n).padStart(2, "0");
  const hh = Math.floor(sec / 3600), mm = Math.floor(sec / 60) % 60, ss = sec % 60;
  return hh ? `${hh}:${pad(mm)}:${pad(ss)}` : `${mm}:${pad(ss)}`;
}

// A coloured dot plus the agent's name; "–" (or `none`) when nothing is bound.
function agentTag(name, none = "–") {
  if (name == null) return h("span", { class: "muted" }, none);
  return h("span", { class: "agent" }, h("i", { class: "dot", style: `background:${agentColor(String(name))}` }),
           String(name));
}
// A 0..1 fraction as a horizontal bar with its percentage.
function meter(frac) {
  const f = isNum(frac) ? Math.min(1, Math.max(0, frac)) : 0;
  return h("span", { class: "meter" }, h("span", { class: "meter-fill", style: `width:${(f * 100).toFixed(1)}%` }),
           h("span", { class: "meter-label" }, fmtPct(frac)));
}
// A count as a bar scaled against the largest count in its table, so queues compare at a glance.
function countBar(n, max, cls) {
  const f = isNum(n) && max > 0 ? Math.min(1, n / max) : 0;
  return h("span", { class: `count ${cls}` }, h("span", { class: "count-fill", style: `width:${(f * 100).toFixed(1)}%` }),
           h("span", { class: "count-label" }, fmtInt(n)));
}
function table(headers, rows, emptyText) {
  if (!rows.length) return h("p", { class: "empty" }, emptyText);
  return h("table", {}, h("thead", {}, h("tr", {}, ...headers.map((x) => h("th", {}, x)))),
           h("tbody", {}, ...rows.map((r) => h("tr", {}, ...r.map((c) => h("td", {}, c))))));
}

// Round tick spacing (1, 2, 5 x 10^k) giving about `target` ticks over `range`.
function niceStep(range, target) {
  const raw = range / Math.max(1, target);
  if (!(raw > 0) || !Number.isFinite(raw)) return 1;
  const mag = 10 ** Math.floor(Math.log10(raw));
  for (const m of [1, 2, 5]) if (m * mag >= raw) return m * mag;
  return 10 * mag;
}
function ticks(lo, hi, step) {
  const out = [];
  for (let v = Math.ceil(lo / step - 1e-9) * step; v <= hi + 1e-9 && out.length < 50; v += step) out.push(v);
  return out;
}
const tickLabel = (v, step) => (step >= 1 ? String(Math.round(v)) : v.toFixed(Math.min(4, Math.ceil(-Math.log10(step)))));

// ---- panels ---------------------------------------------------------------------------------
function renderHeader(run) {
  const team = str(run.team), done = fmtInt(run.steps_done), total = fmtInt(run.steps);
  setText("team", team);
  setText("mode", str(run.mode));
  // The state becomes a CSS class only when it is one we know, never a name taken from data.
  const state = ["starting", "evaluating", "running", "finished", "failed"].includes(run.state) ? run.state : "unknown";
  const badge = document.getElementById("state");
  badge.textContent = str(run.state);
  badge.className = `state state-${state}`;
  setText("steps", `${done} / ${total}`);
  const frac = isNum(run.steps_done) && isNum(run.steps) && run.steps > 0 ? Math.min(1, run.steps_done / run.steps) : 0;
  document.getElementById("progress-fill").style.width = `${(frac * 100).toFixed(1)}%`;
  setText("elapsed", fmtDuration(run.elapsed_s));
  setText("run-dir", str(run.run_dir));
  // Where the workers run; a Ray cluster's own dashboard is linked when it has one (an
  // http(s) URL only: the link is data, never script).
  const cluster = run.cluster || {}, where = document.getElementById("cluster");
  const url = typeof cluster.dashboard === "string" && /^https?:\/\//.test(cluster.dashboard) ? cluster.dashboard : "";
  where.replaceChildren(str(cluster.launcher || "local"),
    ...(url ? [" ", h("a", {href: url, target: "_blank", rel: "noopener"}, "Ray dashboard")] : []));
  // A run that stored no sample and finished no step for observe.stall_warn_s: say so, and what
  // it waits for, instead of looking alive.
  const stall = document.getElementById("stall"), st = run.stalled;
  stall.hidden = !(st && isNum(st.for_s));
  if (!stall.hidden) stall.textContent = `No progress for ${fmtDuration(st.for_s)}: waiting for ${str(st.waiting_for)}`;
  document.title = `FlexMARL · ${team} · ${done}/${total}`;
}

// One row per agent, two lanes per row: rollout above, trainer work (train/sync/swap) below,
// because in the overlapped pipeline modes an agent trains while its next rollout runs.
function renderTimeline(names, timeline, history) {
  const now = isNum(timeline.now) ? timeline.now : 0;
  const t0 = Math.max(0, now - WINDOW_S), t1 = Math.max(now, t0 + MIN_SPAN_S);
  setText("timeline-window", `${fmt(t0, 0)}–${fmt(now, 1)} s since start`);
  if (!names.length) return fill("timeline", h("p", { class: "empty" }, "no agents yet"));
  // The viewBox is the box's pixel width, so the labels keep their CSS size at any window width.
  const W = Math.max(500, document.getElementById("timeline").clientWidth || 1000);
  const LABEL = 130, RIGHT = 12, TOP = 16, ROW = 30, AXIS = 22;
  const H = TOP + names.length * ROW + AXIS, bottom = TOP + names.length * ROW;
  const x = (t) => LABEL + ((t - t0) / (t1 - t0)) * (W - LABEL - RIGHT);
  const root = svg("svg", { viewBox: `0 0 ${W} ${H}`, class: "timeline" });

  const byAgent = new Map(names.map((n) => [n, []]));
  for (const iv of timeline.intervals || []) {
    if (Array.isArray(iv) && byAgent.has(iv[0])) byAgent.get(iv[0]).push(iv);
  }
  names.forEach((name, i) => {
    const y = TOP + i * ROW;
    const row = svg("g", { class: "timeline-row", "data-agent": name });
    row.append(svg("rect", { x: 0, y, width: W, height: ROW, class: i % 2 ? "row-bg odd" : "row-bg" }));
    row.append(svg("circle", { cx: 8, cy: y + ROW / 2, r: 5, fill: agentColor(name) }));
    const label = svg("text", { x: 18, y: y + ROW / 2 + 4, class: "row-label" }, name.length > 16 ? `${name.slice(0, 15)}…` : name);
    label.append(svg("title", {}, name));
    row.append(label);
    for (const [, kind, start, end] of byAgent.get(name)) {
      const s = isNum(start) ? start : 0, e = isNum(end) ? end : now;  // null end: still going
      if (e < t0 || s > t1) continue;
      const xs = x(Math.max(s, t0)), xe = x(Math.min(e, t1));
      const lane = kind === "rollout" ? 0 : 1;
      const bar = svg("rect", { x: xs, y: y + 3 + lane * 13, width: Math.max(2, xe - xs), height: 11,
                                class: `bar bar-${KINDS.includes(kind) ? kind : "other"}${end == null ? " open" : ""}` });
      bar.append(svg("title", {}, `${name} ${str(kind)} ${fmt(s, 2)}–${end == null ? "now" : fmt(e, 2)} s`));
      row.append(bar);
    }
    root.append(row);
  });
  // Step boundaries: the moments a step finished, across all rows; a label only where it does
  // not collide with the previous one (short steps would otherwise print a smear of numbers).
  let lastLabel = -Infinity;
  for (const st of history) {
    if (!isNum(st.t_done) || st.t_done < t0 || st.t_done > t1) continue;
    const sx = x(st.t_done);
    root.append(svg("line", { x1: sx, x2: sx, y1: TOP - 4, y2: bottom, class: "step-line" }));
    if (sx - lastLabel < 28) continue;
    root.append(svg("text", { x: sx, y: TOP - 6, class: "step-label" }, fmtInt(st.step)));
    lastLabel = sx;
  }
  root.append(svg("line", { x1: x(now), x2: x(now), y1: TOP, y2: bottom, class: "now-line" }));
  const step = niceStep(t1 - t0, 10);
  root.append(svg("line", { x1: LABEL, x2: W - RIGHT, y1: bottom, y2: bottom, class: "axis" }));
  for (const t of ticks(t0, t1, step)) {
    root.append(svg("line", { x1: x(t), x2: x(t), y1: bottom, y2: bottom + 4, class: "axis" }));
    root.append(svg("text", { x: x(t), y: bottom + 16, class: "tick tick-x" }, `${tickLabel(t, step)}s`));
  }
  fill("timeline", root);
}

function renderAgents(agents) {
  const rows = Object.entries(agents).map(([name, a]) => [
    agentTag(name),
    a.trainable === false ? h("span", { class: "muted" }, "frozen") : "yes",
    // A rollout version behind the trainer's means a weight sync is still pending.
    h("span", { class: isNum(a.version) && isNum(a.trainer_version) && a.version < a.trainer_version ? "behind" : "" },
      fmtInt(a.version)),
    fmtInt(a.trainer_version), str(a.slot), fmtInt(a.inflight), fmtInt(a.samples),
    fmt(a.reward, 3), fmt(a.staleness, 2), isNum(a.train_s) ? `${fmt(a.train_s)} s` : "–", meter(a.rollout_util),
  ]);
  fill("agents", table(["agent", "trainable", "version", "trainer version", "slot", "inflight", "samples",
                        "reward", "staleness", "train", "rollout util"], rows, "no agents yet"));
}

function renderInstances(instances) {
  const list = Object.entries(instances);
  const max = Math.max(1, ...list.flatMap(([, i]) => [i.queued, i.running, i.inflight].filter(isNum)));
  const rows = list.map(([name, i]) => [
    h("span", {}, name, i.draining ? h("span", { class: "badge draining" }, "draining") : null),
    h("span", {}, agentTag(i.agent), i.adapters ? h("span", { class: "badge" }, "LoRA") : null),
    countBar(i.queued, max, "queued"), countBar(i.running, max, "running"),
    countBar(i.inflight, max, "inflight"), meter(i.util), i.gpus || "cpu",
  ]);
  fill("instances", table(["instance", "agent", "queued", "running", "inflight", "util", "gpus"], rows, "no rollout instances"));
}

function renderSlots(slots) {
  const rows = Object.entries(slots).map(([name, s]) => [
    name, fmtInt(s.ranks), agentTag(s.agent, "idle"), agentTag(s.resident, "empty"), meter(s.util),
    s.gpus || "cpu",
  ]);
  fill("slots", table(["slot", "ranks", "bound", "resident", "util", "gpus"], rows, "no trainer slots"));
}

// devices.placement time_shared: each group's devices, its engines' or one trainer's now.
function renderTimeShares(groups) {
  const rows = Object.entries(groups).map(([name, g]) => [
    name, str(g.mode || null), fmtInt(g.switches), `${fmt(g.switch_s)} s`,
  ]);
  document.getElementById("time-shares-box").hidden = !rows.length;
  fill("time-shares", table(["group", "holding", "switches", "switching"], rows, "none"));
}

// A small line chart of `series` ([{name, color, dash, points: [[x, y|null], ...]}]); a null y
// breaks the line rather than dropping to zero.
function lineChart(title, yLabel, series, { zeroBased = false } = {}) {
  const box = h("div", { class: "chart" }, h("h3", {}, title));
  const pts = series.flatMap((s) => s.points.filter(([px, py]) => isNum(px) && isNum(py)));
  if (!pts.length) {
    box.append(h("p", { class: "empty" }, "no finished steps yet"));
    return box;
  }
  box.append(h("div", { class: "legend small" }, ...series.map((s) =>
    h("span", {}, h("i", { class: "sw", style: `background:${s.color}` }), s.name))));
  const W = 360, H = 200, L = 46, R = 10, T = 10, B = 34;
  let [xlo, xhi] = [Math.min(...pts.map((p) => p[0])), Math.max(...pts.map((p) => p[0]))];
  let [ylo, yhi] = [Math.min(...pts.map((p) => p[1])), Math.max(...pts.map((p) => p[1]))];
  if (xhi === xlo) xhi = xlo + 1;
  if (zeroBased) ylo = Math.min(0, ylo);
  const pad = (yhi - ylo) * 0.08 || Math.abs(yhi) * 0.1 || 1;  // a flat line sits mid-chart
  if (!zeroBased || ylo < 0) ylo -= pad;
  yhi += pad;
  const x = (v) => L + ((v - xlo) / (xhi - xlo)) * (W - L - R);
  const y = (v) => T + (1 - (v - ylo) / (yhi - ylo)) * (H - T - B);
  const root = svg("svg", { viewBox: `0 0 ${W} ${H}`, class: "linechart" });
  const ys = niceStep(yhi - ylo, 5), xs = Math.max(1, niceStep(xhi - xlo, 6));
  for (const v of ticks(ylo, yhi, ys)) {
    root.append(svg("line", { x1: L, x2: W - R, y1: y(v), y2: y(v), class: "grid" }));
    root.append(svg("text", { x: L - 4, y: y(v) + 3, class: "tick tick-y" }, tickLabel(v, ys)));
  }
  for (const v of ticks(xlo, xhi, xs)) {
    root.append(svg("text", { x: x(v), y: H - B + 14, class: "tick tick-x" }, tickLabel(v, xs)));
  }
  root.append(svg("path", { d: `M${L},${T}V${H - B}H${W - R}`, class: "axis" }));
  root.append(svg("text", { x: (L + W - R) / 2, y: H - 4, class: "axis-label" }, "step"));
  root.append(svg("text", { x: 12, y: (T + H - B) / 2, class: "axis-label",
                            transform: `rotate(-90 12 ${(T + H - B) / 2})` }, yLabel));
  for (const s of series) {
    let d = "", pen = false;
    for (const [px, py] of s.points) {
      if (!isNum(px) || !isNum(py)) { pen = false; continue; }
      d += `${pen ? "L" : "M"}${x(px).toFixed(1)},${y(py).toFixed(1)}`;
      pen = true;
      if (s.points.length <= 40) root.append(svg("circle", { cx: x(px), cy: y(py), r: 2.2, fill: s.color }));
    }
    if (d) root.append(svg("path", { d, class: "series", stroke: s.color, "stroke-dasharray": s.dash || "none" }));
  }
  box.append(root);
  return box;
}

function renderCurves(names, history) {
  // Agents that left the team still have their history; list them after the current ones.
  const all = [...names];
  for (const st of history) for (const n of Object.keys(st.agents || {})) if (!all.includes(n)) all.push(n);
  const perAgent = (field) => all.map((n) => ({
    name: n, color: agentColor(n), points: history.map((st) => [st.step, ((st.agents || {})[n] || {})[field]]),
  }));
  const team = { name: "team", color: "#333", dash: "5 3", points: history.map((st) => [st.step, st.team_reward]) };
  // Held-out evaluations (eval.every_steps): the team reward on tasks never trained on.
  const held = history.filter((st) => st.eval && isNum(st.eval.team_reward));
  const heldout = held.length ? [{ name: "team, held-out", color: "#000", dash: "2 2",
                                   points: held.map((st) => [st.step, st.eval.team_reward]) }] : [];
  document.getElementById("curves").replaceChildren(
    lineChart("Reward", "mean reward", [team, ...heldout, ...perAgent("reward")]),
    lineChart("Staleness", "versions behind", perAgent("staleness"), { zeroBased: true }),
    lineChart("Step time", "seconds", [{ name: "step", color: "#555", points: history.map((st) => [st.step, st.step_s]) }],
              { zeroBased: true }),
  );
}

function renderEvents(events) {
  const recent = events.filter((e) => e && typeof e === "object")
    .sort((a, b) => (isNum(b.t) ? b.t : 0) - (isNum(a.t) ? a.t : 0)).slice(0, MAX_EVENTS);
  if (!recent.length) return fill("events", h("p", { class: "empty" }, "no moves or swaps yet"));
  fill("events", h("ol", { class: "events" }, ...recent.map((e) => h("li", {},
    h("span", { class: "t" }, `${fmt(e.t, 1)} s`),
    h("span", { class: `badge kind-${["move", "swap"].includes(e.kind) ? e.kind : "other"}` }, str(e.kind)),
    h("span", {}, str(e.text))))));
}

function render(d) {
  const obj = (v) => (v && typeof v === "object" && !Array.isArray(v) ? v : {});
  const arr = (v) => (Array.isArray(v) ? v : []);
  const agents = obj(d.agents), names = Object.keys(agents), history = arr(d.history).filter((s) => s && typeof s === "object");
  renderHeader(obj(d.run));
  renderTimeline(names, obj(d.timeline), history);
  renderAgents(agents);
  renderInstances(obj(d.instances));
  renderSlots(obj(d.slots));
  renderTimeShares(obj(d.time_shares));
  renderCurves(names, history);
  renderEvents(arr(d.events));
}

// ---- polling --------------------------------------------------------------------------------
// The next poll is scheduled only after this one settled, so a slow server never piles up
// requests. A failed fetch keeps the last data on screen: after a run ends, its server goes
// away, and the final picture is what the user wants to see.
let updates = 0;
async function poll() {
  const conn = document.getElementById("conn");
  try {
    const resp = await fetch("/api/status" + location.search, { cache: "no-store" });  // ?token=
    if (!resp.ok) throw new Error(`HTTP ${resp.status}`);
    const data = await resp.json();
    conn.hidden = true;
    try {
      render(data);
      document.body.dataset.updates = String(++updates);  // lets tests wait for a fresh render
    } catch (err) {
      console.error("dashboard: render failed", err);
    }
  } catch (err) {
    conn.textContent = `Disconnected (${err.message || err}): the run has finished or its server stopped. `
      + (updates ? "Showing the last data received; retrying." : "Retrying.");
    conn.hidden = false;
  }
  setTimeout(poll, POLL_MS);
}
poll();
