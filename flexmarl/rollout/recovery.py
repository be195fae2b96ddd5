"""Dead rollout instances replaced, and new ones added: the InstancePool's recovery.

    died(name) ─► no request goes there any more; those in flight fail at once with PeerDied
        (the pool's generate re-sends them to another instance of the agent, or waits for a
        replacement when none is left) ─► Lifecycle.replace (runtime.lifecycle: up to
        supervisor.replace_attempts processes) ─► the agent's served version loaded
        ─► routed to; an agent left with no instance after every attempt fails its requests
    grow(agent) (a node joined) ─► one more instance, started and loaded the same way

Part of the InstancePool, built by it: it updates the pool's connections and the balancer's
instance table, and reads the served weights through the pool's WeightSync.
"""
from __future__ import annotations

import logging
from typing import Any

from flexmarl.clock import now
from flexmarl.protocol import LoadReport, SubscribeLoad
from runtime.errors import PeerDied
from runtime.lifecycle import ReplaceFailed
from runtime.transport import Connection

log = logging.getLogger(__name__)


class InstanceRecovery:
    """Replacements of dead instances and instances added mid-run (see the module docstring)."""

    def __init__(self, pool: Any) -> None:
        """`pool`: the InstancePool this is part of (it builds this; typed loosely: the pool
        module imports this one)."""
        self.pool = pool
        self.lifecycle = pool.lifecycle
        self.added: list[dict] = []
        """Instances started for a node that joined mid-run (`grow`)."""
        self.broken: dict[str, Exception] = {}
        """Agents left with no instance after every replacement failed."""

    def died(self, name: str, reason: str) -> None:
        """`name`'s process is gone: no request goes there any more, those in flight fail at
        once with PeerDied (generate() re-sends them), and a replacement is started."""
        pool = self.pool
        if name in pool.dead or name not in pool.conns:
            return
        agent = pool.balancer.loads.agent_of(name)
        self.lifecycle.died(name, reason)
        pool.balancer.remove(name)
        if not pool.balancer.loads.instances(agent):
            pool.serving[agent].clear()
        conn = pool.conns.pop(name)
        conn.fail_pending(PeerDied(f"rollout instance {name} of {agent} died ({reason})"))
        # Closed, so that anything still holding it (a move under way) fails at once too.
        pool.background(conn.aclose(), f"pool.close[{name}]")
        pool.stop_reports(name)
        log.warning("rollout instance %s of %s died (%s): %d of its instances left%s", name,
                    agent, reason, len(pool.balancer.loads.instances(agent)),
                    "; starting a replacement" if self.lifecycle.recoverable else "")
        if self.lifecycle.recoverable:
            pool.background(self._replace(name, agent), f"pool.replace[{name}]")

    async def _replace(self, dead: str, agent: str) -> None:
        """Start a new instance for `agent`, load the version the agent serves, route to it
        (Lifecycle.replace: up to supervisor.replace_attempts processes, as a replacement can
        die while it starts, too)."""
        pool = self.pool

        async def ready(names: list[str], conn: Connection) -> dict:
            name = await self._serve(agent, names[0], conn)
            return {"dead": dead, "new": name, "agent": agent,
                    "version": pool.versions[pool.members[agent][0]]}
        try:
            async with pool.devices(agent):  # a time-shared one starts with its engines awake
                await self.lifecycle.replace(dead, agent, [dead], ready)
        except ReplaceFailed as exc:
            if not pool.balancer.loads.instances(agent):  # nothing serves it: fail its requests
                self.broken[agent] = RuntimeError(
                    f"agent {agent} has no rollout instance left: {exc}")
                pool.serving[agent].set()

    def grow(self, agent: str) -> None:
        """Start one more instance for `agent` (a node joined) in the background: it loads the
        served version and takes requests as a replacement does; `added` records it."""
        agent = self.pool.unit[agent]

        async def add() -> None:
            started = now()
            try:
                new = await self.lifecycle.start("", agent, [], lambda names, conn: (
                    self._serve(agent, names[0], conn)))
            except Exception as exc:
                log.error("a new rollout instance for %s failed to start: %s: %s", agent,
                          type(exc).__name__, exc)
                return
            self.added.append({"new": new, "agent": agent, "seconds": now() - started})
            log.warning("new instance %s serves %s after %.1f s", new, agent, now() - started)
        self.pool.background(add(), f"pool.grow[{agent}]")

    async def _serve(self, agent: str, name: str, conn: Connection) -> str:
        """A new instance `name` (a replacement or a new one) takes the requests of unit `agent`
        (an agent, or a LoRA group: every member's served adapter is loaded)."""
        pool = self.pool
        members = pool.members[agent]
        try:
            async with pool.weights.locked(*members):  # no weight sync of them meanwhile
                for member in members:
                    if not pool.weights.fresh(member):
                        await pool.weights.load_into(conn, member)
                first: LoadReport = await conn.request(SubscribeLoad(), control=True,
                                                       timeout_s=pool.request_timeout_s)
                pool.conns[name] = conn
                pool.balancer.loads.add(agent, name)
                pool.listen(name, conn, first)
                pool.serving[agent].set()
        except BaseException:
            if name not in pool.conns:
                await conn.aclose()
            raise
        return name
