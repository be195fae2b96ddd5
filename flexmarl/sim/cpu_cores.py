"""devices.cores = "auto": rollout and training on a CPU machine's cores, split between the roles
or shared by both phases, priced for a team and the cheaper run chosen.

    per agent a and step, on one thread (CPU-seconds; prices: costs_cpu.toml [cores], per
    billion parameters P_a, from bench/peers/limit.py on this machine):
      G_a = P_a x (prompts x prompt_tokens x prefill_s + samples x response x decode_s)
      T_a = P_a x (prompts x prompt_tokens + samples x response) x train_s x (1/3 + 2/3 x trained)
    split   R = C/2 rollout cores, C - R trainer cores; at zero staleness an agent's next
            rollout waits for its update, so its cycle holds both phases:
      step = max(ΣG / g(R), ΣT / t(C-R), max_a(G_a / g(R) + T_a / t(C-R))) + overhead
    shared  every core for both phases: one single-threaded instance per core per agent, the
            trainer on all C cores; the phases take the cores in turn:
      step = max(ΣG / C + ΣT / t(C), max_a(G_a / min(C, calls_a) + T_a / t(C)))
             / efficiency + overhead + the new version loaded by every instance
    run   = start-up (every engine and trainer starting at once, over the C cores)
            + run.steps x step

g(n) = n^decode_thread_exponent, t(n) = n^train_thread_exponent. Frozen agents generate and
have engines but do not train. "shared" is refused (priced as split) where its engines (per
core and agent, frozen ones too: P_a x 4 bytes + engine_overhead_gb) pass memory_share of the
memory this run may use (the machine's, or its cgroup's limit). The prompts and calls per step are the [pipeline] batch (tasks_per_step,
trajectories_per_task: one call per trajectory per agent); the response is plan.response_tokens
or a quarter of the agent's sampling.max_tokens, as `flexmarl plan` assumes.

bench/simulate.py --cores prices the peers workloads' teams; bench/README.md sets the prices
beside the steps measured on this machine.
"""
from __future__ import annotations

import json
import math
import os
import struct
from dataclasses import dataclass
from pathlib import Path

from flexmarl.sim.costs import PROFILES, _read

DTYPE_BYTES = 4
"""The torch engine's weights on CPU are float32 (rollout.dtype "auto")."""


@dataclass(frozen=True)
class CorePrices:
    """costs_cpu.toml [cores]; see that file for what each one measured."""

    decode_s: float
    prefill_s: float
    train_s: float
    prompt_tokens: float
    decode_thread_exponent: float
    train_thread_exponent: float
    shared_efficiency: float
    step_overhead_s: float
    instance_sync_s: float
    engine_start_s: float
    engine_start_s_per_b: float
    memory_share: float
    engine_overhead_gb: float


def load_prices(path: str | Path = PROFILES["cpu-calibrated"]) -> CorePrices:
    return CorePrices(**_read(Path(path))["cores"])


@dataclass(frozen=True)
class AgentWork:
    """One agent's share of a step: its model's parameters (billions), the calls and distinct
    prompts it gets, its response tokens and the share of its parameters that train."""

    name: str
    params_b: float
    samples: int
    prompts: int
    response_tokens: float
    trained: float = 1.0
    trains: bool = True
    """False: a frozen agent, which generates (and has its engines) but never trains."""


@dataclass(frozen=True)
class Price:
    """One placement priced: a step, the start-up, the run (start-up + steps x step)."""

    placement: str
    step_s: float
    startup_s: float
    run_s: float
    refused: str = ""


def _gen(a: AgentWork, p: CorePrices) -> float:
    return a.params_b * (a.prompts * p.prompt_tokens * p.prefill_s
                         + a.samples * a.response_tokens * p.decode_s)


def _train(a: AgentWork, p: CorePrices) -> float:
    if not a.trains:
        return 0.0
    positions = a.prompts * p.prompt_tokens + a.samples * a.response_tokens
    return a.params_b * positions * p.train_s * (1 / 3 + 2 / 3 * a.trained)


def _startup(engines: int, agents: list[AgentWork], cores: int, p: CorePrices) -> float:
    """Every engine and trainer process starting at once (each about one engine's start on
    one core): no faster than one start, nor than all of them over the cores."""
    one = p.engine_start_s + p.engine_start_s_per_b * max(a.params_b for a in agents)
    return one * max(1.0, (engines + sum(a.trains for a in agents)) / cores)


def price(agents: list[AgentWork], cores: int, steps: int, p: CorePrices,
          memory_bytes: int | None = None) -> dict[str, Price]:
    """Both placements of `agents` on `cores` cores for `steps` steps (see the module
    docstring); "shared" carries `refused` when its engines would not fit in memory."""
    if cores < 2 or not agents:
        raise ValueError(f"pricing split against shared needs 2+ cores and an agent, got "
                         f"{cores} cores and {len(agents)} agents")
    g = lambda n: n ** p.decode_thread_exponent  # noqa: E731
    t = lambda n: n ** p.train_thread_exponent  # noqa: E731
    gen = {a.name: _gen(a, p) for a in agents}
    train = {a.name: _train(a, p) for a in agents}
    r = cores // 2
    split = max(sum(gen.values()) / g(r), sum(train.values()) / t(cores - r),
                max(gen[a] / g(r) + train[a] / t(cores - r) for a in gen)) + p.step_overhead_s
    # Shared: an agent's calls spread over at most as many cores as it has calls, and its
    # trainer (one at a time) runs at t(C) on C threads, not C times one.
    spread = {a.name: min(cores, max(1, a.samples)) for a in agents}
    shared = (max(sum(gen.values()) + sum(train.values()) * cores / t(cores),
                  max(gen[a] * cores / spread[a] + train[a] * cores / t(cores) for a in gen))
              / cores / p.shared_efficiency + p.step_overhead_s
              + sum(a.params_b * cores * p.instance_sync_s for a in agents if a.trains) / cores)
    out = {}
    for name, step, engines in (("split", split, len(agents)),
                                ("shared", shared, len(agents) * cores)):
        start = _startup(engines, agents, cores, p)
        out[name] = Price(name, step, start, start + steps * step)
    # Every agent's engines, frozen ones too: its weights and a process's own memory each.
    engines_bytes = sum((a.params_b * 1e9 * DTYPE_BYTES + p.engine_overhead_gb * 2**30) * cores
                        for a in agents)
    if memory_bytes and engines_bytes > p.memory_share * memory_bytes:
        s = out["shared"]
        out["shared"] = Price(s.placement, s.step_s, s.startup_s, s.run_s, refused=(
            f"its engines ({engines_bytes / 2**30:.1f} GiB: one per core per agent, weights "
            f"and process) pass {p.memory_share:.0%} of the {memory_bytes / 2**30:.0f} GiB "
            "this run may use"))
    return out


def pick(prices: dict[str, Price]) -> tuple[str, str]:
    """The cheaper run that is not refused, and why, in words."""
    split, shared = prices["split"], prices["shared"]
    if shared.refused:
        return "split", f"shared refused: {shared.refused}"
    best = "shared" if shared.run_s < split.run_s else "split"
    return best, (f"priced run {shared.run_s:.0f} s shared against {split.run_s:.0f} s split "
                  f"(step {shared.step_s:.2f} s against {split.step_s:.2f} s; start-up "
                  f"{shared.startup_s:.0f} s against {split.startup_s:.0f} s)")


# ----------------------------------------------------------------------------- a team's work

def params_b(model_dir: str) -> float:
    """Billions of parameters in a model directory's safetensors files (their headers only)."""
    total = 0
    for f in sorted(Path(model_dir).glob("*.safetensors")):
        with open(f, "rb") as fh:
            size = struct.unpack("<Q", fh.read(8))[0]
            header = json.loads(fh.read(size))
        total += sum(math.prod(v["shape"]) for k, v in header.items() if k != "__metadata__")
    if not total:
        raise ValueError(f"no safetensors weights in {model_dir}: cannot price its agent")
    return total / 1e9


def trained_share(model_dir: str, train_layers: int) -> float:
    if not train_layers:
        return 1.0
    layers = json.loads((Path(model_dir) / "config.json").read_text()).get("num_hidden_layers")
    return min(1.0, train_layers / layers) if layers else 1.0


def team_work(team, config, model_dirs: dict[str, str]) -> list[AgentWork]:
    """Each trainable agent's share of a step of `team` under `config` (the [pipeline] batch,
    plan.response_tokens), from its model directory."""
    from flexmarl.sim.team_plan import medians

    p = config.pipeline
    lengths = medians(team, config.plan.response_tokens)
    return [AgentWork(s.name, params_b(model_dirs[s.name]),
                      p.tasks_per_step * p.trajectories_per_task, p.tasks_per_step,
                      lengths[s.name], trained_share(model_dirs[s.name], s.train_layers),
                      trains=s.trainable)
            for s in team.agents]


def memory_bytes() -> int | None:
    """The memory this run may use: the machine's, or its cgroup's limit where lower."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return None
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(path).read_text().strip()
        except OSError:
            continue
        if text.isdigit():
            total = min(total, int(text))
    return total


def choose(team, config, model_dirs: dict[str, str], cores: int) -> tuple[str, str]:
    """devices.cores = "auto" resolved for this team and config: ("split" | "shared", why)."""
    work = team_work(team, config, model_dirs)
    if not any(a.trains for a in work):
        return "split", "no trainable agent"
    prices = price(work, cores, config.run.steps, load_prices(), memory_bytes())
    return pick(prices)
