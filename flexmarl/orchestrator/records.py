"""What happened in the machinery since the last step record: moves, swaps, faults, loads.

The loop writes one record per finished global step (flexmarl.orchestrator.loop); the parts of
it that come from the pools are counters and lists that only grow, so `StepRecorder` remembers
how much of each it has reported and adds the new part to each record:

    moves        instances the balancer moved between agents (cause and cost)
    swaps        training states swapped between trainer slots and host memory
    state_writes the agents' state saves that landed since (staging, the write after it)
    trainer_slots_busy_s   per slot, busy time since the last record
    faults       rollout instances that died, requests re-sent, replacements; trainer slots
                 that died, their replacements, agent steps restarted from a snapshot
    instance_tokens, agents.*.instances / latency / duplicates
"""
from __future__ import annotations

import dataclasses
from typing import Any

from flexmarl.orchestrator.store import ExperienceStore
from flexmarl.rollout.pool import InstancePool
from flexmarl.training.pool import TrainerPool


class StepRecorder:
    """The pools' news for each step record; `started` is the run's start (perf_counter)."""

    def __init__(self, store: ExperienceStore, pool: InstancePool,
                 trainers: TrainerPool, started: float) -> None:
        self.store, self.pool, self.trainers, self.started = store, pool, trainers, started
        self._moves_seen = 0
        self._swaps_seen = self._saves_seen = 0
        self._dead_seen = self._redispatched_seen = self._replaced_seen = 0
        self._trainer_seen = (0, 0, 0)

    def machinery(self, record: dict[str, Any], trainer_restarts: int) -> None:
        """Moves, swaps, slot busy time and faults since the last call, into `record`."""
        pool, trainers = self.pool, self.trainers
        record["moves"] = pool.mover.take(self._moves_seen, self.started)
        self._moves_seen += len(record["moves"])
        record["swaps"] = [{**dataclasses.asdict(sw), "at": sw.at - self.started}
                           for sw in trainers.swaps[self._swaps_seen:]]
        self._swaps_seen += len(record["swaps"])
        record["state_writes"] = trainers.saving.log[self._saves_seen:]
        self._saves_seen += len(record["state_writes"])
        record["trainer_slots_busy_s"] = trainers.busy.take()
        # Rollout instances that died, requests re-sent because of them, and their
        # replacements (seconds from the death to serving).
        record["faults"] = {"dead": list(pool.dead)[self._dead_seen:],
                            "redispatched": pool.redispatched - self._redispatched_seen,
                            "replacements": pool.replacements[self._replaced_seen:]}
        self._dead_seen, self._redispatched_seen = len(pool.dead), pool.redispatched
        self._replaced_seen = len(pool.replacements)
        # Trainer slots that died and were replaced, agent steps restarted from a snapshot.
        record["faults"]["trainer"] = {
            "dead": trainers.deaths - self._trainer_seen[0],
            "replacements": trainers.replacements[self._trainer_seen[1]:],
            "restarted_steps": trainer_restarts - self._trainer_seen[2]}
        self._trainer_seen = (trainers.deaths, len(trainers.replacements), trainer_restarts)

    def loads(self, record: dict[str, Any]) -> dict[str, dict[str, Any]]:
        """Tokens served per instance into `record`; per agent: instances, latency and the
        samples the store refused as duplicates (a re-sent request is never trained twice)."""
        stats = self.pool.take_stats()
        record["instance_tokens"] = stats["instance_tokens"]
        if getattr(self.pool, "shares", None):  # devices.placement time_shared: totals so far
            record["time_shares"] = {name: {k: g[k] for k in (
                "agents", "switches", "switch_s", "sleeps", "released_bytes")}
                for name, g in self.pool.shares.status().items()}
        adapters = getattr(self.pool, "adapters", {})  # LoRA agents: the unit they share
        return {agent: {"instances": len(self.pool.instances(agent)),
                        "latency": stats["latency"][agent],
                        "duplicates": self.store.duplicates(agent),
                        **({"lora_group": adapters[agent][0]} if agent in adapters else {})}
                for agent in stats["latency"]}
