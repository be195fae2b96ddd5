"""One agent's global batch on its way to the trainer: groups ─► micro-batches ─► one step.

`micro_batch` turns samples into a trainer micro-batch (right-padded token rows and masks);
`TrainSession` feeds a global batch to the agent's trainer group by group, within the pipeline
policy's staleness bound, steps once and exports the new weights; it binds a trainer slot of the
TrainerPool when its first micro-batch goes out and releases it when the session closes.
`trains` says which of the batch's groups go to the trainer, and so what one step optimises.
"""
from __future__ import annotations

import contextlib
import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Sequence

import torch

from flexmarl.clock import now
from flexmarl.protocol import ExportWeights, TrainBeginBatch, TrainMicroBatch, TrainStep, WeightUpdate
from flexmarl.orchestrator.store import Group

if TYPE_CHECKING:
    from flexmarl.activity import ActivityLog
    from flexmarl.orchestrator.lane import TrainerLane
    from flexmarl.orchestrator.agents import AgentRuntime
    from flexmarl.training.pool import TrainerPool
    from runtime.transport import Connection

log = logging.getLogger(__name__)


def micro_batch(rows: Sequence[tuple[list[int], list[int], list[float]]],
                advantages: Sequence[float], *, pad_id: int = 0,
                sampling: Sequence[tuple[float, int, float]] | None = None) -> TrainMicroBatch:
    """One row per (prompt_ids, response_ids, response_logprobs), with its advantage and, if
    given, the (temperature, top_k, top_p) it was sampled with (TrainMicroBatch.sampling).

    old_logprobs[b, t] is the behaviour log-probability of input_ids[b, t]; only response
    positions are trained (response_mask), prompt and padding positions hold 0.
    """
    if sampling is not None and len(sampling) != len(rows):
        raise ValueError(f"micro_batch needs one sampling setting per row, got {len(rows)} rows "
                         f"and {len(sampling)} settings")
    if len(rows) != len(advantages) or not rows:
        raise ValueError(f"micro_batch needs one advantage per row, got {len(rows)} rows and "
                         f"{len(advantages)} advantages")
    width = max(len(p) + len(r) for p, r, _ in rows)
    n = len(rows)
    input_ids = torch.full((n, width), pad_id, dtype=torch.long)
    attention = torch.zeros(n, width)
    response = torch.zeros(n, width)
    old = torch.zeros(n, width)
    for b, (prompt, resp, logprobs) in enumerate(rows):
        if len(resp) != len(logprobs):
            raise ValueError(f"row {b}: {len(resp)} response tokens but {len(logprobs)} logprobs")
        p, r = len(prompt), len(resp)
        input_ids[b, :p + r] = torch.tensor(prompt + resp, dtype=torch.long)
        attention[b, :p + r] = 1
        response[b, p:p + r] = 1
        old[b, p:p + r] = torch.tensor(logprobs)
    return TrainMicroBatch(input_ids, attention, response, old,
                           torch.tensor(list(advantages), dtype=torch.float32),
                           sampling=None if sampling is None else
                           torch.tensor([list(s) for s in sampling], dtype=torch.float32))


def trains(group: Group, kl_coef: float) -> bool:
    """Whether an admitted group (within the staleness bound) is sent to the trainer.

    With trainer.kl_coef > 0, always: a group whose advantages are all zero (equal rewards) has
    no GRPO signal but its tokens carry the KL term's gradient. With kl_coef = 0 only a group
    with a non-zero advantage: the others add exactly 0 to the loss and the gradient, so they
    are not computed. The step's normaliser is the response-token count of the groups sent, so
    one global batch optimises (flexmarl.training.grpo.grpo_loss)

        sum over the tokens of the admitted groups of the per-token loss (clipped GRPO term,
        plus kl_coef * KL) / the response tokens of the groups that train

    which with kl_coef > 0 is the token mean over the whole batch, and with kl_coef = 0 the
    token mean over its groups with a learning signal (their tokens alone count: DAPO's filter
    of groups with equal rewards). Full and LoRA trainers alike (a LoRA agent's KL reference is
    its base, the adapter disabled). Tested against grpo_loss on the whole batch:
    tests/test_batch_objective.py.
    """
    return kl_coef > 0 or any(t.advantage for t in group.turns)


@dataclass
class TrainResult:
    version: int
    """The trainer's version after this update."""
    groups: int
    samples: int
    tokens: int
    loss: float
    """Mean loss per response token of the global batch."""
    seconds: float
    """Trainer busy time of this update: every trainer request's round trip, summed."""
    staleness: float
    """Mean of (version trained from - policy_version) over the trained samples."""
    staleness_hist: dict[int, int]
    """staleness -> number of trained samples."""
    dropped_stale: int = 0
    """Samples refused by the staleness bound (whole groups are dropped)."""
    skipped: bool = False
    """The optimizer step was skipped (non-finite gradient); the version still advanced."""
    metrics: dict[str, float] = field(default_factory=dict)
    """The trainer's per-token metrics over the batch (clip_frac, ratio_mean, kl, and with
    trainer.is_cap is_weight_mean, is_truncated_frac), token-weighted; and grad_norm."""


class TrainSession:
    """One global batch of one agent, fed group by group, stepped once.

        add(groups)* ─► keep groups within the staleness bound that train (`trains`: with a
                        learning signal, or every one with trainer.kl_coef > 0)
                    ─► every `micro_batch_groups` of them: one micro-batch to the trainer
                        (eager: also the rest of what this add() brought, at once)
        finish()     ─► last partial micro-batch ─► TrainStep(num_tokens of the groups sent)

Eager is for streaming: the caller adds whatever groups are ready whenever the trainer is free,
so the trainer never waits for a micro-batch to fill while groups are ready, and a backlog goes
out as larger (more efficient) micro-batches of up to `micro_batch_groups`.

    The loss normaliser (the response-token count of the groups that train, `trains`) is only
    known at the end, so the trainer accumulates un-normalised and divides once at the step
    (TrainBeginBatch(0)): the accumulated gradient is the full-batch gradient however the groups
    were split and ordered.
    """

    def __init__(self, rt: "AgentRuntime", trainers: "TrainerPool", micro_batch_groups: int,
                 admit: Callable[[int], bool], *, eager: bool = False,
                 activity: "ActivityLog | None" = None,
                 lane: "TrainerLane | None" = None, kl_coef: float | None = None) -> None:
        """`lane`: trainer requests of agents sharing cores go one at a time through it
        (flexmarl.orchestrator.lane). `kl_coef`: the agent's trainer.kl_coef, which decides
        which groups train (`trains`); None: the one in the agent's trainer config as the pool
        holds it (TrainerPool.agents[agent].config: what its trainer slot builds it from)."""
        self.rt = rt
        self.lane = lane
        self.trainers = trainers
        self.activity = activity
        self.micro_batch_groups = micro_batch_groups
        self.admit = admit
        self.eager = eager
        self.kl_coef = (float(kl_coef) if kl_coef is not None else
                        float(trainers.agents[rt.spec.name].config.get("kl_coef", 0.0)))
        """trainer.kl_coef of this agent's trainer: > 0, zero-advantage groups train too."""
        self.version = rt.trainer_version
        """The version this batch updates: each sample's staleness is version - policy_version."""
        shares = getattr(trainers, "shares", None)
        self.time_shared = shares is not None and shares.of(rt.spec.name) is not None
        """Its devices alternate with its engines: each request binds the slot on its own."""
        self._binding = contextlib.AsyncExitStack()
        self._trainer: "Connection | None" = None
        self._buffer: list[Group] = []
        self._begun = False
        self.groups = self.samples = self.tokens = self.dropped_stale = 0
        self.loss_sum = 0.0
        self.busy_s = 0.0
        self.hist: Counter[int] = Counter()
        self._metric_sums: Counter[str] = Counter()

    async def __aenter__(self) -> "TrainSession":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._binding.aclose()  # the trainer slot goes back to the pool

    async def _request(self, msg: Any) -> Any:
        async with self.turn():
            if self._trainer is not None:
                return await self._timed_request(self._trainer, msg)
            # Time-shared: bound for this request only (the binding waits for the agent's
            # devices), so its engines can take them back between micro-batches.
            async with self.trainers.bind(self.rt.spec.name) as trainer:
                return await self._timed_request(trainer, msg)

    def turn(self) -> contextlib.AbstractAsyncContextManager:
        """This agent's turn in the trainer lane (at once without one); taken before a binding
        waits for time-shared devices (the one order of the two, so they cannot deadlock)."""
        return (self.lane.turn(self.rt.spec.name) if self.lane is not None
                else contextlib.nullcontext())

    async def _timed_request(self, trainer: "Connection", msg: Any) -> Any:
        started = now()
        if self.activity is not None:
            self.activity.enter(self.rt.spec.name, "train")
        try:
            return await trainer.request(msg)  # the pool's trainer_pool.request_timeout_s
        finally:
            self.busy_s += now() - started
            if self.activity is not None:
                self.activity.exit(self.rt.spec.name, "train")

    async def add(self, groups: list[Group]) -> None:
        if groups and self._trainer is None and not self.time_shared:
            # a trainer slot is bound once there is work, for the session
            self._trainer = await self._binding.enter_async_context(
                self.trainers.bind(self.rt.spec.name))
        for g in groups:
            ages = [self.rt.staleness(t.policy_version) for t in g.turns]
            if not all(self.admit(a) for a in ages):  # the policy raises or drops
                self.dropped_stale += len(g.turns)
                continue
            # All advantages zero and kl_coef = 0: it adds exactly 0, so it is not computed
            # (nor counted in the normaliser); with kl_coef > 0 its KL term trains (`trains`).
            if trains(g, self.kl_coef):
                self._buffer.append(g)
                self.hist.update(ages)
        while len(self._buffer) >= self.micro_batch_groups or (self.eager and self._buffer):
            chunk, self._buffer = (self._buffer[:self.micro_batch_groups],
                                   self._buffer[self.micro_batch_groups:])
            await self._send(chunk)

    async def _send(self, groups: list[Group]) -> None:
        turns = [t for g in groups for t in g.turns]
        pad = self.rt.tokenizer.pad_token_id or 0
        mb = micro_batch([(t.prompt_ids, t.response_ids, t.logprobs) for t in turns],
                         [t.advantage for t in turns], pad_id=pad,
                         sampling=[t.sampling for t in turns])
        if not self._begun:
            await self._request(TrainBeginBatch(0))  # token count declared at the step
            self._begun = True
        stats = await self._request(mb)
        self.loss_sum += stats.loss
        for k, v in stats.metrics.items():
            self._metric_sums[k] += v * stats.num_tokens
        self.groups += len(groups)
        self.samples += len(turns)
        self.tokens += sum(len(t.response_ids) for t in turns)

    async def finish(self) -> TrainResult | None:
        """Train what is buffered and step; None (no step, no new version) if no group trained
        (none admitted, or with kl_coef = 0 none with a learning signal)."""
        if self._buffer:
            await self._send(self._buffer)
            self._buffer = []
        if not self._begun:
            # debug: the step's console line says it already ("no learning signal: ...").
            log.debug("agent %s: no group to train this step (kl_coef %g); not stepping",
                      self.rt.spec.name, self.kl_coef)
            return None
        done = await self._request(TrainStep(self.tokens))
        staleness = sum(a * n for a, n in self.hist.items()) / max(self.samples, 1)
        if done.samples != self.samples:  # a micro-batch lost on the way, or counted twice
            log.error("agent %s: the trainer stepped on %d samples, %d were sent to it",
                      self.rt.spec.name, done.samples, self.samples)
        # The trainer's count: what the step's gradient summed (checked by the fault tests).
        return TrainResult(done.version, self.groups, done.samples, self.tokens,
                           self.loss_sum / self.tokens, self.busy_s, staleness,
                           dict(sorted(self.hist.items())), self.dropped_stale, done.skipped,
                           {**{k: v / self.tokens for k, v in self._metric_sums.items()},
                            "grad_norm": done.grad_norm})

    async def export(self) -> tuple[WeightUpdate, float]:
        """The trainer's weights after `finish` stepped, published on its host where the pool
        publishes (the slot still bound: this binding nests in the session's); seconds."""
        agent = self.rt.spec.name
        started = now()
        async with self.turn(), self.trainers.bind(agent) as trainer:
            if self.activity is not None:
                self.activity.enter(agent, "sync")
            try:
                weights: WeightUpdate = await trainer.request(
                    ExportWeights(self.trainers.publish))
            finally:
                if self.activity is not None:
                    self.activity.exit(agent, "sync")
        return weights, now() - started
