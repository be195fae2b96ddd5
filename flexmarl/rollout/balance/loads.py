"""The rollout instances' outstanding work as the balancer counts it: a pure ledger.

Per instance: the requests the balancer sent there and their estimated tokens (n x the agent's
expected length, learnt from finished requests as an EWMA), the requests its last load report
showed beyond ours (other clients'), and whether it is draining (being moved or gone: no new
requests). Per agent: its instances, in placement order. Both levels of the balancer read loads
here; flexmarl.rollout.balancer.Balancer is this ledger plus the routing and moving.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class _Inflight:
    instance: str
    agent: str
    cost: float


@dataclass
class _Instance:
    agent: str
    own_requests: int = 0
    own_tokens: float = 0.0
    reported_requests: int = 0
    foreign_requests: int = 0
    """Requests of other clients at the last report: its count beyond ours then."""
    draining: bool = False


class InstanceLoads:
    """Instance and agent names are plain strings; `placement` is agent -> its instances."""

    def __init__(self, placement: dict[str, list[str]], length_smoothing: float) -> None:
        self._instances: dict[str, _Instance] = {}
        self._agents: dict[str, list[str]] = {}
        for agent, names in placement.items():
            if not names:
                raise ValueError(f"agent {agent!r} has no rollout instance")
            self._agents[agent] = list(names)
            for name in names:
                if name in self._instances:
                    raise ValueError(f"instance {name!r} is placed twice")
                self._instances[name] = _Instance(agent)
        self._length_smoothing = length_smoothing
        self.requests: dict[str, _Inflight] = {}
        """Requests in flight (counted in, not yet out), by request id."""
        self._expected_len: dict[str, float] = {}

    @property
    def agents(self) -> list[str]:
        return list(self._agents)

    def instances(self, agent: str) -> list[str]:
        """The agent's instances, including one being drained away from it."""
        return list(self._agents[agent])

    def serving(self, agent: str) -> list[str]:
        """The agent's instances that take new requests (not draining)."""
        return [i for i in self._agents[agent] if not self._instances[i].draining]

    def agent_of(self, instance: str) -> str:
        return self._instances[instance].agent

    def add(self, agent: str, instance: str) -> None:
        """A new instance of `agent` (e.g. the replacement of a dead one), routed at once."""
        if instance in self._instances:
            raise ValueError(f"instance {instance!r} is already known; give a new one a new name")
        self._instances[instance] = _Instance(agent)
        self._agents[agent].append(instance)

    def retire(self, instance: str) -> None:
        """The instance is gone (its process died): never routed to again; its requests in
        flight still end through count_out."""
        inst = self._instances[instance]
        if instance in self._agents[inst.agent]:
            self._agents[inst.agent].remove(instance)
        inst.draining = True

    def drain(self, instance: str, agent: str) -> None:
        """Stop routing to `agent`'s instance (a move away from it begins)."""
        inst = self._instances[instance]
        if inst.agent != agent:
            raise ValueError(f"instance {instance} serves {inst.agent}, not {agent}")
        inst.draining = True

    def undrain(self, instance: str, to: str | None = None) -> None:
        """Route to the drained instance again: for agent `to` (the move is done: its own
        requests have all finished, the reports of the old agent's load are forgotten), or for
        the agent it served (None: the move failed)."""
        inst = self._instances[instance]
        if to is not None:
            if inst.own_requests:
                raise RuntimeError(f"instance {instance} still has {inst.own_requests} "
                                   "requests in flight; wait for them before finishing the move")
            self._agents[inst.agent].remove(instance)
            self._agents[to].append(instance)
            inst.agent = to
            inst.reported_requests = inst.foreign_requests = 0
        inst.draining = False

    def is_draining(self, instance: str) -> bool:
        """Being moved to another agent: no new requests go to it."""
        return self._instances[instance].draining

    def inflight(self, instance: str) -> int:
        """Requests this balancer routed to `instance` that have not finished."""
        return self._instances[instance].own_requests

    def learnt_len(self, agent: str) -> float | None:
        """The agent's expected response tokens per sample, None until one request finished."""
        return self._expected_len.get(agent)

    def expected_len(self, agent: str, max_tokens: int) -> float:
        """Expected response tokens of one sample: learned, at most max_tokens; max_tokens
        until the agent has finished a request."""
        return min(float(max_tokens), self._expected_len.get(agent, float(max_tokens)))

    def estimate(self, agent: str, *, n: int, max_tokens: int) -> float:
        """Estimated tokens a request will generate (its cost for routing)."""
        return n * self.expected_len(agent, max_tokens)

    def load(self, instance: str) -> float:
        """Outstanding work: our in-flight estimate, plus the requests the last report showed
        beyond ours then (other clients', each at our mean cost). Ours are counted exactly:
        a report older than our latest dispatches adds nothing for them, and one older than
        our latest finishes does not turn them into other clients' requests."""
        inst = self._instances[instance]
        mean = inst.own_tokens / inst.own_requests if inst.own_requests else \
            self._expected_len.get(inst.agent, 1.0)
        return inst.own_tokens + inst.foreign_requests * mean

    def agent_load(self, agent: str) -> float:
        """Load per serving (non-draining) instance of the agent."""
        return self.total(agent) / max(len(self.serving(agent)), 1)

    def total(self, agent: str) -> float:
        """The agent's outstanding work over all its instances (draining ones included)."""
        return sum(self.load(i) for i in self._agents[agent])

    def report(self, instance: str, requests: int) -> None:
        """An instance's pushed load: requests queued or running there (from all clients)."""
        inst = self._instances.get(instance)
        if inst is not None:
            inst.reported_requests = requests
            inst.foreign_requests = max(0, requests - inst.own_requests)

    def count_in(self, request_id: str, agent: str, instance: str, cost: float) -> None:
        """A request of `cost` estimated tokens was routed to `instance`."""
        inst = self._instances[instance]
        inst.own_requests += 1
        inst.own_tokens += cost
        self.requests[request_id] = _Inflight(instance, agent, cost)

    def count_out(self, request_id: str, samples: int, tokens: int | None) -> str:
        """A request ended (tokens None: it failed); its agent. `tokens` generated over
        `samples` samples teach the agent's expected length."""
        req = self.requests.pop(request_id, None)
        if req is None:
            raise ValueError(f"request {request_id!r} is not in flight")
        inst = self._instances[req.instance]
        inst.own_requests -= 1
        inst.own_tokens = max(0.0, inst.own_tokens - req.cost) if inst.own_requests else 0.0
        if tokens is not None and samples > 0:
            mean = tokens / samples
            old = self._expected_len.get(req.agent)
            a = self._length_smoothing
            self._expected_len[req.agent] = mean if old is None else (1 - a) * old + a * mean
        return req.agent
