"""The `trainer_pool` section: where each agent trains (slot sizes, sharing, snapshots, cores).

Read by flexmarl.config (section `trainer_pool`) and by TrainerPool (flexmarl.training.pool,
which re-exports it).
"""
from __future__ import annotations

from dataclasses import dataclass

from flexmarl.checks import parse_cpus, require


@dataclass(kw_only=True, frozen=True)
class TrainerPoolConfig:
    """Where each agent trains (section `trainer_pool`, flexmarl.training.pool.TrainerPool): slot
    sizes, sharing, snapshots and cores. The optimizer and loss are section `trainer`.
    Until FlexMARL 0.2 the old section name `[train]` is read too, with a warning."""

    ranks_per_agent: int = 1
    """FSDP ranks (processes) of each agent's trainer group."""
    cpus: str = "auto"
    """CPU cores of every trainer process, as in rollout.cpus; "auto": the other half."""
    slots: int | str = 0
    """0: static reservation, one trainer slot (a group of ranks_per_agent processes) per
    trainable agent. N >= 1: a pool of N slots shared by all trainable agents, bound to an agent
    while it trains, idle agents' training state swapped out to host memory. "auto": the
    number the cluster simulator finds fastest for this team (section `plan`; resolved by
    `flexmarl run` at start, flexmarl.sim.team_plan.resolve_auto)."""
    slot_ranks: str = ""
    """A shared pool of slots of different sizes, e.g. "1,2": one slot of 1 rank and one of 2
    (overrides `slots`); an agent needs AgentSpec.train_ranks (default ranks_per_agent)."""
    ready_timeout_s: float = 600.0
    """How long a trainer rank may take to start (its process, torch, the process group)."""
    collective_timeout_s: float = 1800.0
    """How long one torch.distributed collective of a trainer group may wait for a peer
    (torch's own default for gloo); idle followers hear from rank 0 well within it."""
    request_timeout_s: float = 300.0
    """Longest wait for one request to a trainer slot (a micro-batch, a step, a swap, an export);
    past it the slot is taken for hung and replaced (with snapshots) or the run stops."""
    snapshots: bool = True
    """The ranks save each agent's training state after each step (training/saves.py: on
    /dev/shm when every rank is on this machine): a dead trainer slot is replaced and its
    agent's batch re-accumulated from it (off: the run stops)."""
    nice: int | str = "auto"
    """Trainer processes' niceness (0..19); "auto": flexmarl.launch.placement.trainer_nice."""
    serial: bool | str = "auto"
    """Trainer requests one at a time, urgent agents first (flexmarl.orchestrator.lane);
    "auto": flexmarl.launch.placement.serial_trainers."""

    def __post_init__(self) -> None:
        require(self.ranks_per_agent >= 1, "trainer_pool.ranks_per_agent", self.ranks_per_agent,
                 "must be >= 1")
        require(self.slots == "auto" if isinstance(self.slots, str) else self.slots >= 0,
                "trainer_pool.slots", self.slots,
                'must be >= 0 (0: one slot per trainable agent) or "auto"')
        try:
            sizes = [int(x) for x in self.slot_ranks.split(",")] if self.slot_ranks else []
        except ValueError:
            sizes = [0]
        require(all(n >= 1 for n in sizes), "trainer_pool.slot_ranks", self.slot_ranks,
                 'must list the ranks of each shared slot, like "1,2" (or be empty)')
        for name in ("ready_timeout_s", "request_timeout_s", "collective_timeout_s"):
            require(getattr(self, name) > 0, f"trainer_pool.{name}", getattr(self, name),
                    "must be > 0")
        parse_cpus(self.cpus, "trainer_pool.cpus")
        require(self.nice == "auto" if isinstance(self.nice, str) else
                (not isinstance(self.nice, bool) and 0 <= self.nice <= 19),
                "trainer_pool.nice", self.nice, 'must be an int in 0..19 or "auto"')
        require(isinstance(self.serial, bool) or self.serial == "auto", "trainer_pool.serial",
                self.serial, 'must be true, false or "auto"')

    @property
    def static(self) -> bool:
        """One slot per trainable agent for the whole run (no sharing, no swaps)."""
        if self.slots == "auto":
            raise ValueError('trainer_pool.slots = "auto" is resolved before the pool starts '
                             "(flexmarl.sim.team_plan.resolve_auto)")
        return not (self.slots or self.slot_ranks)
