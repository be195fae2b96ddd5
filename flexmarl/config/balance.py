"""The balancer's policy (section `balance`): one frozen dataclass, validated on construction.

Ground floor: imports nothing of FlexMARL; every part of the balancer
(flexmarl.rollout.balance), the rollout pool and the simulator take it from here.
"""
from __future__ import annotations

from dataclasses import dataclass

STRATEGIES = ("round_robin", "least_loaded", "hierarchical")


@dataclass(frozen=True, kw_only=True)
class BalancerConfig:
    """Routing and rebalancing policy (section `balance`)."""

    strategy: str = "hierarchical"
    """`round_robin`, `least_loaded` (intra-agent only) or `hierarchical` (intra + inter)."""
    sticky_slack_tokens: float = 64.0
    """Keep an episode on its instance unless that has this many more outstanding tokens than
    the least loaded instance of the agent (0: no stickiness)."""
    ratio: float = 5.0
    """Inter-agent: move an instance when the hot agent's load per instance exceeds this many
    times the cold agent's (the paper's threshold)."""
    min_load_tokens: float = 64.0
    """Inter-agent: ignore imbalance while the hot agent's load per instance is below this."""
    patience: int = 3
    """Inter-agent: consecutive choose_move() checks the imbalance must hold (hysteresis)."""
    cooldown_s: float = 10.0
    """Inter-agent: no new move this long after the last one finished."""
    min_instances: int = 1
    """Inter-agent: an agent never drops below this many instances."""
    length_smoothing: float = 0.2
    """Weight of each finished request in the per-agent expected response length (EWMA)."""
    check_interval_s: float = 1.0
    """Inter-agent: how often the caller runs choose_move() (the orchestrator, the simulator)."""
    demand_window_s: float = 10.0
    """Inter-agent: loads are averaged over about this long (exponentially) before comparing
    agents, so the phases of a step (one agent's turn, then the other's) do not look like
    shifts of demand. Several steps long is right."""
    cost_aware: bool = True
    """Inter-agent: move only when the move saves the hot agent more than it costs the donor
    (see flexmarl.rollout.balancer); False: the ratio test alone decides."""
    move_cost_s: float = 2.0
    """Inter-agent: the assumed seconds a move takes (weight load, beyond draining) until
    the first move has been timed."""
    ahead: bool = True
    """Inter-agent: also move an instance ahead of a stage, when the previous step's demand
    at the same phase says an agent is about to get busy while another stays idle (needs
    cost_aware: the same test of what it saves against what it costs)."""

    def __post_init__(self) -> None:
        def require(ok: bool, name: str, rule: str) -> None:
            if not ok:
                raise ValueError(f"balance.{name} {rule}, got {getattr(self, name)!r}")
        require(self.strategy in STRATEGIES, "strategy", f"must be one of {', '.join(STRATEGIES)}")
        require(self.sticky_slack_tokens >= 0, "sticky_slack_tokens", "must be >= 0")
        require(self.ratio > 1, "ratio", "must be > 1")
        require(self.min_load_tokens >= 0, "min_load_tokens", "must be >= 0")
        require(self.patience >= 1, "patience", "must be >= 1")
        require(self.cooldown_s >= 0, "cooldown_s", "must be >= 0")
        require(self.min_instances >= 1, "min_instances", "must be >= 1")
        require(0 < self.length_smoothing <= 1, "length_smoothing", "must be in (0, 1]")
        require(self.check_interval_s > 0, "check_interval_s", "must be > 0")
        require(self.demand_window_s > 0, "demand_window_s", "must be > 0")
        require(self.move_cost_s >= 0, "move_cost_s", "must be >= 0")
