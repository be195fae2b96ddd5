"""Which agents share rollout instances: LoRA agents on one base model (flexmarl.models.lora).

    team + model dirs ─► every LoRA agent (AgentSpec.lora) grouped by its resolved base model
        ─► one unit per base, named by its agents joined with "+" ("solver+checker"): the
           pool's balancer sees the unit, its instances serve every member's adapter, sized
           by rollout.max_loras and rollout.max_lora_rank (0: to the unit)

Pure: checked before any process starts, so a wrong size is a ConfigError naming the setting.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from flexmarl import checks
from flexmarl.config.rollout import RolloutConfig
from flexmarl.team import VLLM_LORA_RANKS, Team, max_lora_rank


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
