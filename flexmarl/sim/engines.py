"""Simulated engines behind the real interfaces: service times from the cost model.

    SimRolloutEngine  the RolloutEngine protocol (flexmarl.rollout.engine), served by the real
                      RolloutWorker actor: continuous batching, one decode step at a time for
                      every running sequence, advanced event to event (arrival, completion,
                      every `segment_tokens`) instead of token by token
    SimTrainer        an actor that answers the trainer-slot protocol (SwapIn/SwapOut,
                      TrainBeginBatch, TrainMicroBatch, TrainStep, ExportWeights,
                      ExportState) as flexmarl.training.worker does, waiting the modelled
                      compute and transfer times
    DeviceGroup       the devices under them (flexmarl.sim.devices)

A LoRA unit's instance (flexmarl.sim.presets.Preset.lora) serves one base and each member's
adapter: its `config.adapters` names them (the real RolloutWorker then keeps a version and a
gate per adapter), a request names its adapter (Generate.adapter), and a sync of one agent is
`load_adapter` of its adapter's bytes. A trainer slot keeps the frozen base of the LoRA agent
it last held on its devices: a LoRA agent's swap moves its adapter's training state only (as
the product's: flexmarl.training.parking.ResidentBase), plus the base from host memory when
the slot's devices hold another model.

Simulated prompts carry the simulated policy's behaviour: token 0 of a prompt is the median
response length (tokens) the policy gives it (a user team's run has a median per agent
instead); lengths are lognormal around it (sigma from the cost model), capped by max_tokens.
Every draw is seeded by the request's seed.
"""
from __future__ import annotations

import asyncio
import math
import random
from collections import deque
from dataclasses import dataclass
from typing import Any

import torch

from flexmarl.clock import now
from flexmarl.training.state_files import commit_step, read_record
from flexmarl.protocol import (AwaitSaved, DropParked, ExportWeights, FetchShards, Parked,
                               SaveState, StateSaved,
                               Sample, SamplingParams, ShardData, SwapDone, SwapIn, SwapOut,
                               TrainBeginBatch, TrainMicroBatch, TrainStats,
                               TrainStep, TrainStepDone, WeightUpdate)
from flexmarl.sim.costs import Costs, Model
from flexmarl.sim.devices import DeviceGroup
from runtime.actor import Actor, handler
from runtime.codec import Envelope

TOKEN = 7  # the token id of every simulated token (content does not matter, counts do)
FOREVER_S = 1e9  # request timeouts: simulated waits can be long; a hang raises SimulationStalled


class SimTokenizer:
    pad_token_id = 0
    chat_template = "sim"  # chat prompts take apply_chat_template below (prompt_format "auto")

    def encode(self, text: str, **_: Any) -> list[int]:
        return [TOKEN] * max(1, len(text) // 4)  # ~4 characters a token, as BPE on English

    def apply_chat_template(self, messages: list[dict], **_: Any) -> str:
        """A user team's chat prompt (flexmarl.sim.team_plan): its text, plus ~8 tokens of
        framing per message, as real chat templates add."""
        return "".join(" " * 32 + str(m.get("content", "")) for m in messages)


class _Seq:
    __slots__ = ("remaining", "context", "prompt", "done", "seed")

    def __init__(self, prompt: int, length: int, done: asyncio.Future,
                 seed: int | None = None) -> None:
        self.prompt = prompt
        self.remaining = float(length)
        self.context = float(prompt)
        self.done = done
        self.seed = seed
        """Its request's SamplingParams.seed: the one request identity an engine is given."""


@dataclass(frozen=True)
class SimEngineConfig:
    """The part of flexmarl.rollout.engine.EngineConfig the rollout worker reads."""

    adapters: tuple[str, ...] = ()
    """LoRA adapters the instance serves (their agents' names); (): its model only."""


class SimRolloutEngine:
    """One rollout instance of model `model` on `devices` of `group` (continuous batching)."""

    def __init__(self, costs: Costs, model: Model, group: DeviceGroup, *,
                 agent_of: Any = None, on_admit: Any = None,
                 medians: dict[str, float] | None = None,
                 adapters: dict[str, Model] | None = None) -> None:
        self.costs = costs
        self.adapters = dict(adapters or {})
        """A LoRA unit's instance: each adapter it serves (agent) -> that agent's model (its
        base and adapter: what a sync of it loads)."""
        self.config = SimEngineConfig(tuple(self.adapters))
        self.adapter_requests: dict[str, int] = dict.fromkeys(self.adapters, 0)
        """Requests served per adapter."""
        self.adapter_loads: dict[str, int] = dict.fromkeys(self.adapters, 0)
        """Adapter loads (syncs, and the served adapters of a replacement) per adapter."""
        self.medians = medians
        """agent -> median response tokens (a user team's, flexmarl.sim.team_plan); None: a
        prompt's token 0 is its median (the presets' workflows)."""
        self.model = model
        self.group = group
        self.agent_of = agent_of
        """() -> the agent this instance serves now (colocated groups keep one agent resident)."""
        self.devices = model.rollout_devices
        self.kv_capacity = costs.kv_capacity_tokens(model)
        self.running: list[_Seq] = []
        self.waiting: deque[_Seq] = deque()
        self.generated_tokens = 0
        self._last = 0.0
        self._stall_until = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._step_s = 0.0
        self.on_admit = on_admit
        """(seed) -> None, called when a sequence of the request with that SamplingParams.seed
        joins the batch (its prefill starts): how long it queued, for routing measurements
        (flexmarl.sim.routing). None: not observed (the cluster simulator)."""
        self.broadcasts: DeviceGroup | None = None
        """A colocated group the weight loads pass through as mode ("sync", agent): one agent's
        instances load together, agents one after another (a driver that broadcasts to each
        agent's engines in turn, as MARTI's does). None: every load is independent."""
        self.broadcast_extra_s = 0.0
        """Added to each such broadcast (MARTI wakes its engines for it, then re-sleeps them)."""
        self.rollout_key = ""
        """This engine's rollout mode is ("rollout", key) ("": its agent's)."""
        self.time_shared = False
        """A time-shared group's engine: a load needs the engines awake (the group's rollout
        mode); pricing "old": over NVLink from the trainer on these devices."""
        self.sync_path = "direct"
        """How a sync reaches this instance (flexmarl.sim.layouts sets it): "direct" (the
        trainer's NCCL broadcast, flexmarl.weights.direct) or "published" (the file its trainer
        published, flexmarl.weights.published.read)."""
        self.remote_receivers = 0
        """"published": this agent's instances on other hosts than the trainer's rank 0, which
        share its host's link (0: this instance is on that host and maps the file)."""
        self.trainer_devices = model.train_devices
        """Ranks of the agent's trainer (its gather, for a version published on demand)."""
        self.serving = ""
        """The agent whose versions this instance loads ("": its unit's, agent_of()); a
        published read of another agent's version is a move (flexmarl.weights.sync.load_into)."""
        self._from_host = False
        """The pending load's bytes are in host memory (a move's copy, a model directory)."""
        self.sequence_tokens = 0
        """Prompt + response tokens of every sample generated (MARTI's experience pass)."""

    async def start(self) -> None:
        self._last = now()

    def tokenize(self, text: str) -> list[int]:
        return SimTokenizer().encode(text)

    async def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()

    def _rollout_mode(self) -> tuple:
        return ("rollout", self.rollout_key or (self.agent_of() if self.agent_of else ""))

    async def read_published(self, source: dict) -> dict[str, torch.Tensor]:
        """A published version (flexmarl.rollout.worker's read, before its gate closes): one
        meta tensor (no memory) of its bytes, after the read's time (pricing "new"; "old" paid
        everything in the load). A sync of a "published" agent: nothing on the trainer's host
        (the file is mapped), else its share of the trainer host's link (Costs.fetch_s). A
        version of another agent than the one this instance serves is a move (WeightSync.
        load_into): fetched alone from the trainer's host, which first publishes it if its
        agent syncs directly (flexmarl.weights.direct's fetch: TrainerPool.export)."""
        num_bytes = int(source.get("num_bytes", self.model.sync_bytes))
        agent = source.get("agent")
        serving = self.serving or (self.agent_of() if self.agent_of else "")
        move = agent is not None and agent != serving and agent not in self.adapters
        if move:
            self.serving = agent
        # A move's copy, or a model directory's weights (no agent's version: never synced),
        # is in this host's memory when the gate closes: the load is host -> device.
        self._from_host = move or agent is None
        if self.costs.pricing != "old" and agent is not None:
            model = self.adapters.get(agent, self.model)
            if move:
                publish = (self.costs.publish_s(model, self.trainer_devices)
                           if self.sync_path == "direct" else 0.0)
                await asyncio.sleep(publish + self.costs.fetch_s(model, 1))
            elif self.sync_path == "published" and self.remote_receivers:
                await asyncio.sleep(self.costs.fetch_s(model, self.remote_receivers))
        return {"weights": torch.empty(num_bytes, dtype=torch.uint8, device="meta")}

    async def load_weights(self, tensors: dict[str, torch.Tensor]) -> None:
        await self._load(self.model)

    async def load_adapter(self, name: str, tensors: dict[str, torch.Tensor],
                           lora: dict) -> None:
        """One adapter's tensors in place (the engine protocol's): its bytes over the link."""
        if name not in self.adapters:
            raise ValueError(f"this instance serves no adapter {name!r}: "
                             f"{sorted(self.adapters)}")
        self.adapter_loads[name] += 1
        await self._load(self.adapters[name])

    async def _load(self, model: Model) -> None:
        """`model`'s sync bytes (its weights, or its adapter) onto this instance, its gate
        closed: MARTI's broadcast (its driver's, agent after agent), else this instance's part
        of its path (sync_path, Costs): a published version's (or a move's) host -> device
        load, or the direct broadcast's receive; a time-shared engine's with the engines
        awake."""
        new = self.costs.pricing != "old"
        from_host, self._from_host = self._from_host, False
        if self.broadcasts is not None:  # MARTI's: a ZeRO-3 gather, then CUDA IPC
            mode = ("sync", self.agent_of() if self.agent_of else "")
            gather = self.costs.gather_s(model, self.trainer_devices) if new else 0.0
            await self.broadcasts.acquire(mode)
            try:
                await asyncio.sleep(gather + self.costs.local_weight_load_s(model)
                                    + self.broadcast_extra_s)
            finally:
                self.broadcasts.release(mode)
            return
        if not new:
            seconds = (self.costs.local_weight_load_s(model) if self.time_shared
                       else self.costs.weight_load_s(model))
        elif from_host or self.sync_path == "published":
            seconds = self.costs.host_load_s(model)
        else:
            seconds = self.costs.broadcast_s(model)
        if not self.time_shared:
            await asyncio.sleep(seconds)
            return
        mode = self._rollout_mode()  # the engines must be awake to take them
        await self.group.acquire(mode)
        try:
            await asyncio.sleep(seconds)
        finally:
            self.group.release(mode)

    def lengths(self, prompt_ids: list[int], params: SamplingParams,
                adapter: str | None = None) -> list[int]:
        if self.medians is not None:
            median = self.medians[adapter or self.agent_of()]
        else:
            median = max(1, prompt_ids[0]) if prompt_ids else 1
        cap = min(params.max_tokens, self.costs.rollout.max_response_tokens)
        rng = random.Random(params.seed)
        sigma = self.costs.rollout.length_sigma
        return [min(cap, max(1, round(rng.lognormvariate(math.log(median), sigma))))
                for _ in range(params.n)]

    async def generate(self, prompt_ids: list[int], params: SamplingParams,
                       adapter: str | None = None) -> tuple[list[Sample], list[float] | None]:
        """`adapter`: the LoRA adapter to answer with (one this instance serves; a unit's
        instance takes requests of its adapters only)."""
        if adapter is not None:
            if adapter not in self.adapters:
                raise ValueError(f"this instance serves no adapter {adapter!r}: "
                                 f"{sorted(self.adapters)}")
            self.adapter_requests[adapter] += 1
        elif self.adapters:
            raise ValueError("a request to a LoRA unit's instance must name its adapter")
        lengths = self.lengths(prompt_ids, params, adapter)
        self.sequence_tokens += len(prompt_ids) * len(lengths) + sum(lengths)
        mode = self._rollout_mode()
        await self.group.acquire(mode)
        try:
            loop = asyncio.get_running_loop()
            seqs = [_Seq(len(prompt_ids), n, loop.create_future(), params.seed)
                    for n in lengths]
            self._advance()
            self.waiting.extend(seqs)
            self._admit()
            self._schedule()
            await asyncio.gather(*(s.done for s in seqs))
        finally:
            self.group.release(mode)
        cap = min(params.max_tokens, self.costs.rollout.max_response_tokens)
        return [Sample([TOKEN] * n, [-1.0] * n, "length" if n >= cap else "stop", "")
                for n in lengths], None

    # ------------------------------------------------------------------ the batch

    def _advance(self) -> None:
        """Bring every running sequence up to now (the step time is constant in between)."""
        t = now()
        if self.running or self._stall_until > self._last:
            self.group.busy(self.devices, t - self._last)
        if self.running:
            decode_s = t - max(self._last, self._stall_until)
            if decode_s > 0:
                tokens = decode_s / self._step_s
                for s in self.running:
                    s.remaining -= tokens
                    s.context += tokens
                self.generated_tokens += tokens * len(self.running)
        self._last = t
        finished = [s for s in self.running if s.remaining <= 1e-6]
        if finished:
            self.running = [s for s in self.running if s.remaining > 1e-6]
            for s in finished:
                s.done.set_result(None)
            self._admit()

    def _admit(self) -> None:
        """Start waiting sequences while the KV cache has room (their prefill stalls decoding)."""
        used = sum(s.context + s.remaining for s in self.running)
        while self.waiting and len(self.running) < self.costs.rollout.max_num_seqs:
            s = self.waiting[0]
            if self.running and used + s.context + s.remaining > self.kv_capacity:
                break
            self.waiting.popleft()
            used += s.context + s.remaining
            self.running.append(s)
            if self.on_admit is not None:
                self.on_admit(s.seed)
            self._stall_until = max(self._stall_until, self._last) + \
                self.costs.prefill_s(self.model, s.prompt)

    def _schedule(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self.running:
            return
        context = sum(s.context for s in self.running)
        self._step_s = self.costs.decode_step_s(self.model, len(self.running), context)
        tokens = min(min(s.remaining for s in self.running), self.costs.rollout.segment_tokens)
        at = max(self._last, self._stall_until) + max(tokens, 1e-6) * self._step_s
        self._timer = asyncio.get_running_loop().call_at(at, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._advance()
        self._schedule()


class SimTrainer(Actor):
    """A simulated trainer slot of `devices` devices (the protocol of flexmarl.training.worker)."""

    def __init__(self, name: str, costs: Costs, models: dict[str, Model], group: DeviceGroup,
                 devices: int, address: str, *, sync: dict[str, str] | None = None,
                 reference: bool = False) -> None:
        super().__init__(name, address)
        self.costs = costs
        self.models = models
        """agent -> its model."""
        self.sync = dict(sync or {})
        """Agent -> how its versions leave this slot (flexmarl.sim.layouts.Layout.sync):
        "published", "marti" (its engines pay the broadcast), else "direct"."""
        self.reference = reference
        """Every micro-batch runs the reference model's forward too (kl_coef > 0)."""
        self.sync_s = 0.0
        """Seconds this slot spent gathering or publishing weights (held, not training)."""
        self.group = group
        self.devices = devices
        self.agent = ""
        self.version = 0
        self.parked: dict[str, int] = {}
        """Agents parked in this slot's host memory -> their version."""
        self._sources: dict[str, Any] = {}
        self.compute_s = 0.0
        self.micro_batches: list[tuple[float, str, int, int]] = []
        """(time, agent, rows, tokens) of every micro-batch received: what the bounds of
        flexmarl.sim.bounds price with the real cost model after a run with free training."""
        self.snapshot_s = 0.0
        self.rows = 0
        """Rows accumulated since the batch began (the step's reply says them)."""
        self._writes: dict[str, asyncio.Future] = {}
        """SaveState's path -> its write (AwaitSaved waits for it)."""
        self.gate: Any = None
        """An object whose `wait()` every training computation awaits first (MARTI's
        experience pass, flexmarl.sim.layouts); None: none."""
        self.base = ""
        """The frozen base a LoRA agent left on the devices ("": none): the next LoRA agent
        on it swaps in its adapter state only."""

    async def _compute(self, seconds: float, active: int) -> None:
        if self.gate is not None:
            await self.gate.wait()
        mode = ("train", self.agent)
        await self.group.acquire(mode)
        try:
            await asyncio.sleep(seconds)
            self.group.busy(active, seconds)
            self.compute_s += seconds
        finally:
            self.group.release(mode)

    def _model(self) -> Model:
        if not self.agent:
            raise RuntimeError(f"{self.name}: a training request reached an empty trainer slot; "
                               "SwapIn an agent first")
        return self.models[self.agent]

    # Concurrent, as in the trainer worker: two slots may pull from each other at once.
    @handler(SwapIn, concurrent=True)
    async def on_swap_in(self, msg: SwapIn, env: Envelope) -> SwapDone:
        """As the trainer worker: the agent's shards parked here back onto the devices (each
        node's host link, nodes in parallel), or pulled from another slot's ranks (the network,
        rank to rank; then onto the devices), or a whole state restored / a fresh trainer
        (onto the devices from host memory)."""
        if self.agent:
            raise RuntimeError(f"slot holds agent {self.agent!r}; SwapOut before SwapIn")
        model = self.models[msg.agent]
        num_bytes = self.costs.swap_bytes(model)
        # A LoRA agent whose base is not on the devices: the base too, from host memory.
        base = model.weight_bytes if model.is_adapter and self.base != model.base else 0.0
        if msg.agent in self.parked:
            version, how = self.parked.pop(msg.agent), "here"
            seconds = self.costs.onload_s(num_bytes + base, self.devices)
        elif msg.source:
            if msg.source[0] not in self._sources:
                self._sources[msg.source[0]] = self.connect(msg.source[0])
            # As a real rank, ask the source for the state's layout (here: its version).
            # As in the product, the source's mailbox answers after the command it is serving
            # (a SwapOut of 237 GB can take a simulated minute), so no 30 s default deadline.
            head: ShardData = await self._sources[msg.source[0]].request(
                FetchShards(msg.agent), timeout_s=FOREVER_S)
            version, how = int(head.meta["version"]), "pulled"
            seconds = (self.costs.move_s(num_bytes, len(msg.source), self.devices)
                       + self.costs.onload_s(num_bytes + base, self.devices))
        elif msg.state_dir:  # a saved state: its ranks read it back from storage
            version = int(read_record(msg.state_dir)[0]["version"])
            how = "restored"
            seconds = self.costs.host_transfer_s(num_bytes + base, self.devices)
        else:
            version = int(msg.meta.get("version", 0))
            how = "restored" if msg.meta else "fresh"
            # A fresh trainer's first load is the run's start-up (every system pays it once,
            # before its first step), not part of a step: free, so that it never lands in the
            # measured steps of the modes that train after their first rollout.
            seconds = self.costs.onload_s(num_bytes + base, self.devices) if msg.meta else 0.0
            base = base if msg.meta else 0.0
        await asyncio.sleep(seconds)
        self.agent, self.version = msg.agent, version
        self.base = model.base if model.is_adapter else ""  # a full state replaced any base
        return SwapDone(int(num_bytes + base), seconds, how)

    @handler(SwapOut)
    async def on_swap_out(self, msg: SwapOut, env: Envelope) -> Parked:
        """The agent parked here: its shards to host memory over each node's host link (a
        LoRA agent: its adapter's state; the frozen base stays on the devices)."""
        num_bytes = self.costs.swap_bytes(self._model())
        seconds = self.costs.offload_s(num_bytes, self.devices)
        await asyncio.sleep(seconds)
        self.parked[self.agent] = self.version
        agent, self.agent = self.agent, ""
        # One rank per device, each at this actor's address (a real slot lists its ranks').
        return Parked(agent, self.version, int(num_bytes), seconds, [self.address] * self.devices)

    @handler(FetchShards, concurrent=True)
    async def on_fetch_shards(self, msg: FetchShards, env: Envelope) -> ShardData:
        """The parked agent's version (the transfer itself is priced by the puller)."""
        if msg.agent not in self.parked:
            raise ValueError(f"agent {msg.agent!r} is not parked in {self.name}")
        return ShardData({}, meta={"version": self.parked[msg.agent]})

    @handler(DropParked)
    async def on_drop_parked(self, msg: DropParked, env: Envelope) -> None:
        self.parked.pop(msg.agent, None)

    @handler(TrainBeginBatch)
    async def on_begin_batch(self, msg: TrainBeginBatch, env: Envelope) -> None:
        self._model()
        self.rows = 0

    @handler(TrainMicroBatch)
    async def on_micro_batch(self, msg: TrainMicroBatch, env: Envelope) -> TrainStats:
        model = self._model()
        rows = int(msg.input_ids.shape[0])
        tokens = int(msg.attention_mask.sum().item())
        self.micro_batches.append((now(), self.agent, rows, tokens))
        self.rows += rows
        await self._compute(self.costs.train_s(model, self.devices, rows, tokens,
                                               reference=self.reference),
                            self.costs.active_train_devices(self.devices, rows))
        return TrainStats(loss=0.0, num_tokens=int(msg.response_mask.sum().item()))

    @handler(TrainStep)
    async def on_step(self, msg: TrainStep, env: Envelope) -> TrainStepDone:
        seconds = self.costs.optimizer_s(self._model(), self.devices)
        await self._compute(seconds, self.devices)
        self.version += 1
        return TrainStepDone(self.version, grad_norm=1.0, step_s=seconds, samples=self.rows)

    @handler(ExportWeights)
    async def on_export(self, msg: ExportWeights, env: Envelope) -> WeightUpdate:
        """Published, as the product's trainer does (flexmarl.weights.published): the reply
        names the agent, the version and its bytes (a LoRA agent's: its adapter's), so the
        run's records count them (sync_bytes). The slot's part, its devices held (pricing
        "new"): for a published agent the publish (Costs.publish_s: gather, copy to host, the
        file's write), else the gather before the direct broadcast (Costs.gather_s; MARTI's
        is in its broadcast); each instance's part is paid by its read and load
        (SimRolloutEngine)."""
        model = self._model()
        how = self.sync.get(self.agent, "direct")
        if self.costs.pricing != "old" and how != "marti":
            seconds = (self.costs.publish_s(model, self.devices) if how == "published"
                       else self.costs.gather_s(model, self.devices))
            mode = ("train", self.agent)
            await self.group.acquire(mode)
            try:
                await asyncio.sleep(seconds)
            finally:
                self.group.release(mode)
            self.sync_s += seconds
        return WeightUpdate(self.version, {}, source={
            "path": f"sim://{self.agent}/{self.version}", "agent": self.agent,
            "num_bytes": int(model.sync_bytes)})

    @handler(SaveState, concurrent=True)
    async def on_save_state(self, msg: SaveState, env: Envelope) -> StateSaved:
        """The state save as the product makes it (flexmarl.training.saves): each rank stages
        its shards in host memory of its node (the slot waits for that), then writes them to
        the scratch dir in memory (AwaitSaved waits for that: the agent's next batch does)."""
        model = self._model()
        seconds = self.costs.host_transfer_s(self.costs.swap_bytes(model), self.devices)
        await asyncio.sleep(seconds)
        self.snapshot_s += seconds
        agent, version = self.agent, self.version
        # The write goes to the scratch dir in memory (/dev/shm; training/saves.py): another
        # host-memory copy. The durable copies (every save_every) are off the critical path.
        written = asyncio.ensure_future(asyncio.sleep(seconds))
        self._writes[msg.path] = asyncio.ensure_future(self._commit(written, msg, agent, version))
        return StateSaved(agent, msg.step, version, "", int(self.costs.swap_bytes(model)),
                          seconds)

    async def _commit(self, written: asyncio.Future, msg: SaveState, agent: str,
                      version: int) -> StateSaved:
        await written  # a step dir (meta.json only) in place, as the product's rank 0 makes it
        commit_step(msg.tmp, msg.path, agent, msg.step, version, {"version": version})
        return StateSaved(agent, msg.step, version, msg.path, 0)

    @handler(AwaitSaved, concurrent=True)
    async def on_await_saved(self, msg: AwaitSaved, env: Envelope) -> StateSaved:
        return await self._writes.pop(msg.path)
