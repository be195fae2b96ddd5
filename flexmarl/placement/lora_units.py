"""Which agents share rollout instances and trainer slots: LoRA agents on one base model
(flexmarl.models.lora).

    team + model dirs ─► every LoRA agent (AgentSpec.lora) grouped by its resolved base model
        ─► one unit per base, named by its agents joined with "+" ("solver+checker"): the
           pool's balancer sees the unit, its instances serve every member's adapter, sized
           by rollout.max_loras and rollout.max_lora_rank (0: to the unit)
    needs + LoRA bases ─► static_slots: the static reservation's trainer slots (one per
           agent, trainer_pool.slots = 0), the LoRA agents of one base in one slot
           (trainer_pool.share_lora_base): its processes keep that base once and swap the
           adapters (flexmarl.training.parking.ResidentBase)

Pure: checked before any process starts, so a wrong size is a ConfigError naming the setting.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from flexmarl import checks
from flexmarl.config.rollout import RolloutConfig
from flexmarl.team import VLLM_LORA_RANKS, AgentSpec, Team, max_lora_rank


@dataclass(frozen=True)
class LoraUnits:
    """The LoRA units of a run (none: every agent serves its own model)."""

    members: dict[str, list[str]] = field(default_factory=dict)
    """unit -> its agents, in team order."""
    max_lora_rank: dict[str, int] = field(default_factory=dict)
    max_loras: dict[str, int] = field(default_factory=dict)
    lora: dict[str, dict] = field(default_factory=dict)
    """agent -> its LoraSpec.as_dict()."""

    def unit(self, agent: str) -> str:
        """The unit that serves `agent`: its LoRA group, or itself."""
        return next((u for u, ms in self.members.items() if agent in ms), agent)

    def adapters(self) -> dict[str, tuple[str, dict]]:
        """agent -> (its unit, its LoraSpec.as_dict()): InstancePool's `adapters`."""
        return {a: (u, self.lora[a]) for u, ms in self.members.items() for a in ms}

    def instances(self, team: Team, per_agent: int) -> dict[str, int]:
        """unit -> its rollout instances: AgentSpec.instances or `per_agent`
        (rollout.instances_per_agent); a LoRA unit as many as its most demanding member."""
        count: dict[str, int] = {}
        for spec in team.agents:
            unit = self.unit(spec.name)
            count[unit] = max(count.get(unit, 0), spec.instances or per_agent)
        return count

    def describe(self) -> str:
        """One console line per unit ("" without LoRA agents)."""
        return "; ".join(f"LoRA adapters {', '.join(ms)} share one set of rollout instances"
                         for ms in self.members.values() if len(ms) > 1)


def lora_units(team: Team, model_dirs: dict[str, str], rollout: RolloutConfig, *,
               time_shared: frozenset[str] = frozenset()) -> LoraUnits:
    """The team's LoRA units; a ConfigError for a unit its instances cannot serve."""
    by_base: dict[str, list[str]] = {}
    specs = {s.name: s for s in team.agents}
    for spec in team.agents:
        if spec.lora is not None:
            by_base.setdefault(model_dirs[spec.name], []).append(spec.name)
    if not by_base:
        return LoraUnits()
    if lost := sorted(a for ms in by_base.values() for a in ms if a in time_shared):
        raise checks.ConfigError(
            f"LoRA agents {lost} cannot be time-shared (devices.placement): their instances "
            "already serve every adapter on their base; drop them from devices.placement")
    units = {"+".join(ms): ms for ms in by_base.values()}
    ranks, loras = {}, {}
    for unit, members in units.items():
        need = max(specs[a].lora.rank for a in members)
        if rollout.max_lora_rank and need > rollout.max_lora_rank:
            wide = [a for a in members if specs[a].lora.rank > rollout.max_lora_rank]
            raise checks.ConfigError(
                f"LoRA agents {wide} have rank above rollout.max_lora_rank = "
                f"{rollout.max_lora_rank}: raise it (to one of {list(VLLM_LORA_RANKS)}) or "
                "lower their LoraSpec.rank")
        if rollout.max_lora_rank and rollout.max_lora_rank not in VLLM_LORA_RANKS:
            raise checks.ConfigError(f"rollout.max_lora_rank must be one of "
                                     f"{list(VLLM_LORA_RANKS)} (vLLM's), got "
                                     f"{rollout.max_lora_rank}")
        if rollout.max_loras and len(members) > rollout.max_loras:
            raise checks.ConfigError(
                f"{len(members)} LoRA agents share the base model {model_dirs[members[0]]} "
                f"({', '.join(members)}) but rollout.max_loras = {rollout.max_loras}: raise it "
                f"to {len(members)} (or 0: sized to the team)")
        ranks[unit] = rollout.max_lora_rank or max_lora_rank([specs[a].lora.rank
                                                              for a in members])
        loras[unit] = rollout.max_loras or len(members)
    return LoraUnits(units, ranks, loras,
                     {a: specs[a].lora.as_dict() for ms in units.values() for a in ms})


def lora_base(spec: AgentSpec) -> str | None:
    """The base model a LoRA agent's adapter sits on, named without resolving it (no model is
    built or read): its AgentSpec.model as a path (~ expanded, as flexmarl.launch.model_dirs
    resolves a model directory) and, when set, its warm_start_steps (a built-in size's build).
    None for a full agent. Agents with the same name resolve to the same model directory."""
    if getattr(spec, "lora", None) is None:  # (stand-ins of an AgentSpec may lack it)
        return None
    model = str(Path(spec.model).expanduser())
    steps = spec.warm_start_steps
    return model if steps is None else f"{model} (warm start {steps})"


def static_slots(needs: dict[str, int], bases: dict[str, str]
                 ) -> list[tuple[tuple[str, ...], int]]:
    """The trainer slots of a static reservation (trainer_pool.slots = 0), in order: one per
    agent of `needs` (agent -> the ranks it needs, in team order), except that the agents of
    `bases` (agent -> its LoRA base: the LoRA agents trainer_pool.share_lora_base groups) on
    one base share one slot, placed where the first of them is. Each slot as (its agents, its
    ranks). A ValueError names the agents and the fixes when one base's agents need different
    ranks (a slot has one size; which of them would get more or fewer ranks than it asked
    for is the user's choice, not ours)."""
    slots: list[tuple[list[str], int]] = []
    by_base: dict[str, int] = {}
    for agent, ranks in needs.items():
        base = bases.get(agent)
        if base is None:
            slots.append(([agent], ranks))
        elif base not in by_base:
            by_base[base] = len(slots)
            slots.append(([agent], ranks))
        else:
            slots[by_base[base]][0].append(agent)
    for base, k in by_base.items():
        members = slots[k][0]
        if len({needs[a] for a in members}) > 1:
            asked = ", ".join(f"{a}: {needs[a]}" for a in members)
            raise ValueError(
                f"LoRA agents {', '.join(members)} on the base {base} share one trainer slot "
                f"(trainer_pool.share_lora_base = true) but need different ranks ({asked}; "
                "AgentSpec.train_ranks, else trainer_pool.ranks_per_agent): give them the "
                "same AgentSpec.train_ranks, or set trainer_pool.share_lora_base = false (a "
                "slot per agent), or share a pool of slots of those sizes "
                "(trainer_pool.slot_ranks)")
    return [(tuple(members), ranks) for members, ranks in slots]
