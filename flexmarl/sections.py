"""Config sections of the optional features: `cluster` (flexmarl.nodes: workers on other
machines) and `gateway` (flexmarl.gateway: an OpenAI-compatible endpoint). Kept here, free of
heavy imports, so flexmarl.config stays light; validated like every section (errors name the key).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(kw_only=True, frozen=True)
class ClusterConfig:
    """Workers on other machines (section `cluster`); see flexmarl/nodes.py."""

    listen: str = ""
    """tcp://ADDR:PORT where `flexmarl-node`s join (`flexmarl run --listen`); empty: every
    worker is a local process."""
    rollout_nodes: int = 1
    """Nodes with role rollout (or any) the run waits for before it starts."""
    trainer_nodes: int = 1
    """Nodes with role trainer (or any) the run waits for."""
    join_timeout_s: float = 600.0
    """How long the run waits for them; then it stops, naming what is missing."""
    node_timeout_s: float = 30.0
    """A node silent this long is lost: its workers are handled as dead. A node whose process
    ended is lost at once (its connection closes); this is for one that hangs or is cut off, and
    is sized so that a busy node on a loaded machine is not taken for dead (heartbeats come
    from a thread, and the run's own stalls are not counted against the node)."""
    store_port: int = 0
    """Port of the TCPStore trainer ranks rendezvous at (on the listen host); 0: a free one."""
    instances_per_node: int = 1
    """Rollout instances a rollout node that joins mid-run gets (each for the agent with the
    fewest instances then)."""

    def __post_init__(self) -> None:
        from flexmarl.config import _require
        _require(not self.listen or self.listen.startswith("tcp://"), "cluster.listen",
                 self.listen, "must be tcp://ADDR:PORT (or empty for one machine)")
        for name in ("rollout_nodes", "trainer_nodes", "instances_per_node"):
            _require(getattr(self, name) >= 0, f"cluster.{name}", getattr(self, name),
                     "must be >= 0")
        for name in ("join_timeout_s", "node_timeout_s"):
            _require(getattr(self, name) > 0, f"cluster.{name}", getattr(self, name),
                     "must be > 0")
        _require(0 <= self.store_port <= 65535, "cluster.store_port", self.store_port,
                 "must be in 0..65535")


@dataclass(kw_only=True, frozen=True)
class GatewayConfig:
    """Training an existing app through an OpenAI-compatible endpoint (section `gateway`)."""

    enabled: bool = False
    """Serve /v1/chat/completions etc.; the team's tasks and workflow are the app's episodes."""
    host: str = "127.0.0.1"
    port: int = 0
    """0: a free port (the address is printed)."""
    token: str = ""
    """API key the app must send (Bearer); required when `host` is not loopback."""
    app: str = ""
    """A shell command the run starts once the gateway is up (with OPENAI_BASE_URL and
    OPENAI_API_KEY set) and stops at the end; its early exit fails the run."""
    episode_timeout_s: float = 300.0
    """An episode idle this long is expired: dropped from training as a failed trajectory."""
    seat_timeout_s: float = 600.0
    """A trajectory seat no episode took within this fails (the app stopped sending)."""

    def __post_init__(self) -> None:
        from flexmarl.config import _require
        _require(0 <= self.port <= 65535, "gateway.port", self.port, "must be in 0..65535")
        for name in ("episode_timeout_s", "seat_timeout_s"):
            _require(getattr(self, name) > 0, f"gateway.{name}", getattr(self, name),
                     "must be > 0")
