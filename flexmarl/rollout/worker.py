"""RolloutWorker: serves one rollout instance of one agent over the runtime transport.

    Generate ─► queued ─► (gate open?) ─► running ─► engine.generate ─► GenerateReply(version)
    WeightUpdate ─► (a source: read the file its trainer published, or fetch it from there)
        ─► close gate ─► wait running == 0 ─► engine.load_weights ─► version ─► open gate
    Sleep / WakeUp ─► close gate ─► wait running == 0 ─► engine.sleep / wake_up ─► open gate
        (devices.placement time_shared: the agent's trainer runs on the same devices meanwhile)
    WeightTransfer start ─► close gate ─► wait running == 0 ─► (update: the trainer sends over
        NCCL/IPC) ─► finish ─► version ─► open gate          (GPU; flexmarl.weights.direct)
    every change of queued/running/outstanding ─► LoadReport to each subscriber (pushed)

The gate guarantees that no sample mixes two policy versions: a request either finishes before
an update starts loading or starts after it has finished. An instance serving LoRA adapters
(EngineConfig.adapters: one base, one adapter per agent) has a version and a gate per adapter:
an adapter's update (WeightUpdate.adapter) waits only for that adapter's requests, and the
other agents' requests go on meanwhile. Outstanding tokens are estimated as
n x max_tokens per unfinished request (an upper bound the balancer can trust).
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import torch

from flexmarl.checks import InvariantError
from flexmarl.clock import now
from flexmarl.protocol import (EngineMemory, FetchWeights, Generate, GenerateReply,
                               LoadReport, Sleep, SubscribeLoad, WakeUp, WeightTransfer,
                               WeightUpdate, WeightUpdateDone)
from flexmarl.rollout.backends import make_engine
from flexmarl.rollout.engine import EngineConfig, RolloutEngine
from flexmarl.weights import published
from flexmarl.weights.base import weights_nbytes
from runtime.actor import Actor, handler
from runtime.codec import Envelope
from runtime.config import TransportConfig
from runtime.errors import RuntimeErrorBase
from runtime.protocol import Ping
from runtime.transport import connect
from runtime.worker import WorkerContext

log = logging.getLogger(__name__)

PROBE_TIMEOUT_S = 10.0
"""How long a holder of a published version has to answer a Ping before the next is asked
(a dead trainer or instance: the version is fetched from another holder)."""
FETCH_TIMEOUT_S = 3600.0
"""A fetch of a published version from another host: bounded by the run's own timeout on the
update that asked for it (rollout.request_timeout_s); this only keeps a lost reply finite."""


class RolloutWorker(Actor):
    def __init__(self, name: str, address: str, engine: RolloutEngine, *,
                 transport: TransportConfig = TransportConfig(), version: int = 0,
                 max_concurrent: int = 256, report_interval_s: float = 0.1,
                 drain_timeout_s: float = 10.0) -> None:
        super().__init__(name, address, transport=transport, max_concurrent=max_concurrent,
                         drain_timeout_s=drain_timeout_s)
        self.engine = engine
        self.version = version
        self.queued = 0
        self.running = 0
        self.outstanding_tokens = 0
        self._gate = asyncio.Event()
        self._gate.set()
        self._idle = asyncio.Event()
        self._idle.set()
        self._update_lock = asyncio.Lock()
        self._transfer_deadline: asyncio.TimerHandle | None = None
        """A direct update's deadline, from "start" (its info's deadline_s) to "finish"."""
        self._subscribers: list[Any] = []
        self._load_changed = asyncio.Event()
        self.report_interval_s = report_interval_s
        self.asleep = False
        adapters = getattr(getattr(engine, "config", None), "adapters", ())
        self.adapter_versions = {a: version for a in adapters}
        """The version each LoRA adapter serves (its agent's; they count on their own)."""
        self._adapter_gates = {a: asyncio.Event() for a in adapters}
        self._adapter_idle = {a: asyncio.Event() for a in adapters}
        self._adapter_running = dict.fromkeys(adapters, 0)
        for event in (*self._adapter_gates.values(), *self._adapter_idle.values()):
            event.set()

    async def on_start(self) -> None:
        started = now()
        # Runs nobody holds on this machine (SIGKILLed): their versions or copies hold
        # /dev/shm (every machine of a run sweeps, not only the orchestrator's).
        await asyncio.to_thread(published.remove_orphans)
        await self.engine.start()
        log.info("%s: engine ready in %.1f s", self.name, now() - started)

    async def on_stop(self) -> None:
        await self.engine.close()

    @handler(Generate, concurrent=True)
    async def on_generate(self, msg: Generate, env: Envelope) -> GenerateReply:
        prompt_ids = msg.prompt_ids if msg.prompt_ids is not None else \
            self.engine.tokenize(msg.prompt or "")
        adapter = msg.adapter
        if adapter is not None and adapter not in self.adapter_versions:
            raise ValueError(f"{self.name} serves no LoRA adapter {adapter!r}; it serves "
                             f"{sorted(self.adapter_versions) or 'none'}")
        gate = self._adapter_gates[adapter] if adapter is not None else self._gate
        budget = msg.params.n * msg.params.max_tokens
        admitted = False
        self._account(queued=1, tokens=budget)
        try:
            # Re-check after waking: an update may have closed a gate again meanwhile.
            while not (self._gate.is_set() and gate.is_set()):
                await (self._gate if not self._gate.is_set() else gate).wait()
            self._account(queued=-1, running=1, adapter=adapter)
            admitted = True
            version = self._version_of(adapter)
            samples, prompt_lp = await self.engine.generate(
                prompt_ids, msg.params, *([adapter] if adapter is not None else []))
        finally:
            self._account(queued=0 if admitted else -1, running=-1 if admitted else 0,
                          tokens=-budget, adapter=adapter if admitted else None)
        if version != self._version_of(adapter):  # the gate makes this impossible; if not, refuse the sample
            raise InvariantError(
                f"{self.name}: request {msg.request_id} started under policy version {version} "
                f"and finished under {self.version}; a weight update overlapped it, so its "
                "samples would mix two versions (a FlexMARL bug: please report it)")
        return GenerateReply(msg.request_id, version, list(prompt_ids), samples, prompt_lp,
                             self.name)

    def _version_of(self, adapter: str | None) -> int:
        return self.version if adapter is None else self.adapter_versions[adapter]

    @handler(WeightUpdate, concurrent=True)
    async def on_weight_update(self, msg: WeightUpdate, env: Envelope) -> WeightUpdateDone:
        source = msg.source
        if source is None:
            return await self._apply(msg, None)
        own = getattr(self.engine, "read_published", None)
        if own is not None:  # an engine that reads sources its own way (the simulator's)
            msg.tensors = await own(source)
            return await self._apply(msg, None)
        path = self._file_to_load(msg)
        if path is not None:  # the engine reads the file itself, under its lock meanwhile
            async with contextlib.AsyncExitStack() as stack:
                try:
                    await stack.enter_async_context(published.held(path, source["version"]))
                except (OSError, ValueError):  # pruned meanwhile, or not weights: read it as
                    path = None  # any other source (the next holder, or a fetch)
                if path is not None:
                    done = await self._apply(msg, path)
                    done.held = {"host": published.host_id(), "path": path}
                    return done
        fetched: dict[str, torch.Tensor] = {}

        async def fetch(src: dict[str, Any]) -> dict[str, torch.Tensor]:
            fetched.update(await self._fetch(src))
            return fetched
        # Read before the gate closes: requests go on while the file is mapped (or fetched
        # from a holder on another host); a file here stays locked until it is loaded.
        async with published.opened(source, fetch) as got:
            msg.tensors = got.tensors
            done = await self._apply(msg, None)
        if got.path is not None:
            done.held = {"host": published.host_id(), "path": got.path}
        elif fetched and source.get("version") is not None:
            # Kept on this host: the others here read it, and this instance serves it (the
            # version outlives its trainer). A failure costs the copy, not the update.
            try:
                kept = await asyncio.to_thread(published.keep_copy, fetched, source)
                done.held = {"host": published.host_id(), "path": kept}
            except (OSError, ValueError) as exc:
                log.warning("%s: could not keep a copy of version %s on this host: %s",
                            self.name, source.get("version"), exc)
        return done

    async def _apply(self, msg: WeightUpdate, path: str | None) -> WeightUpdateDone:
        """Load `msg`'s tensors (or the file at `path`) into the engine, gate closed."""
        if msg.adapter is not None:
            return await self._update_adapter(msg)
        async with self._update_lock:
            if msg.version <= self.version and not msg.force:
                raise ValueError(f"stale weight update: version {msg.version}, instance "
                                 f"{self.name} already serves version {self.version}")
            self._gate.clear()
            try:
                await self._idle.wait()
                started = now()
                if path is not None:
                    await self.engine.load_weights_file(path, msg.source["version"])
                else:
                    await self.engine.load_weights(msg.tensors)
                self.version = msg.version
            finally:
                self._gate.set()
            self._load_changed.set()
            return WeightUpdateDone(self.version, msg.source["num_bytes"] if path is not None
                                    else weights_nbytes(msg.tensors), now() - started)

    def _file_to_load(self, msg: WeightUpdate) -> str | None:
        """The published file itself, for an engine that loads from files (vLLM: its engine
        core reads it, with no staging copy of its own): the model's weights (no adapter), on
        this host, whole in that one file (no base)."""
        source = msg.source
        if (source is None or msg.adapter is not None or source.get("base")
                or not hasattr(self.engine, "load_weights_file") or not source.get("path")):
            return None
        return published.local_path(source)

    @handler(FetchWeights, concurrent=True)
    async def on_fetch_weights(self, msg: FetchWeights, env: Envelope) -> WeightUpdate:
        """A version this instance holds on its host (a file it read or kept), for an
        instance on another host: only such a file, checked by identity, never any other
        path (flexmarl.weights.ownership)."""
        version, tensors = await asyncio.to_thread(published.serve, msg.path)
        return WeightUpdate(version, tensors)

    async def _fetch(self, source: dict[str, Any]) -> dict[str, torch.Tensor]:
        """A version published on another host, from its holders in turn: the trainer that
        published it, then the instances that hold it (each first asked for a Pong within
        PROBE_TIMEOUT_S: a dead holder costs that, not the fetch's whole deadline)."""
        started = now()
        want = source.get("version")
        errors = []
        for holder in published.holders(source):
            if not holder.get("address") or holder["address"] == self.address:
                continue
            conn = connect(holder["address"], self.transport)
            try:
                await conn.request(Ping(0), timeout_s=PROBE_TIMEOUT_S)
                reply = await conn.request(FetchWeights(holder["path"]),
                                           timeout_s=FETCH_TIMEOUT_S)
                if want is not None and reply.version != want:
                    raise RuntimeError(f"{holder['path']} holds version {reply.version} now, "
                                       f"not {want}")
            except (RuntimeErrorBase, RuntimeError, TimeoutError, OSError) as exc:
                errors.append(f"{holder['address']}: {type(exc).__name__}: {exc}")
                continue
            finally:
                await conn.aclose()
            log.info("%s fetched version %s (%.1f MB) from %s on host %s in %.2f s",
                     self.name, want, weights_nbytes(reply.tensors) / 2**20,
                     holder["address"], holder.get("host"), now() - started)
            return reply.tensors
        raise RuntimeError(f"{self.name}: no holder of version {want} ({source.get('path')}) "
                           "could send it: " + ("; ".join(errors) or "none named"))

    async def _update_adapter(self, msg: WeightUpdate) -> WeightUpdateDone:
        """One adapter's tensors, in place: only that adapter's requests wait (the engine's
        base and the other adapters are untouched)."""
        name = msg.adapter
        if name not in self.adapter_versions:
            raise ValueError(f"{self.name} serves no LoRA adapter {name!r}; it serves "
                             f"{sorted(self.adapter_versions) or 'none'}")
        if msg.lora is None:
            raise ValueError(f"a weight update of adapter {name} needs its LoraSpec (lora)")
        async with self._update_lock:  # no sleep, wake or full update meanwhile
            if msg.version <= self.adapter_versions[name] and not msg.force:
                raise ValueError(f"stale weight update: adapter {name} version {msg.version}, "
                                 f"instance {self.name} already serves version "
                                 f"{self.adapter_versions[name]}")
            gate = self._adapter_gates[name]
            gate.clear()
            try:
                await self._adapter_idle[name].wait()
                started = now()
                await self.engine.load_adapter(name, msg.tensors, msg.lora)
                self.adapter_versions[name] = msg.version
            finally:
                gate.set()
            self._load_changed.set()
            return WeightUpdateDone(msg.version, weights_nbytes(msg.tensors), now() - started)

    @handler(WeightTransfer, concurrent=True)
    async def on_weight_transfer(self, msg: WeightTransfer, env: Envelope) -> WeightUpdateDone:
        """A phase of a direct (GPU) update, the trainer sending (flexmarl.weights.direct):
        the gate closes at "start" and opens at "finish", as for a staged update. A failure
        after "start" (here, or the trainer's: "abort") leaves the engine's weights half
        loaded: the instance then stops, and the pool replaces it with one that loads the
        served version."""
        started = now()
        if not hasattr(self.engine, "transfer"):
            raise RuntimeError(f"{self.name}: its {type(self.engine).__name__} has no weight-"
                               'transfer engine (rollout.weight_transfer needs backend "vllm")')
        if msg.phase == "abort":  # the trainer's send failed
            if not self._gate.is_set():  # mid-update: these weights must not serve
                log.error("%s: the trainer aborted the weight transfer of version %d: "
                          "stopping (a replacement loads the served weights)", self.name,
                          msg.version)
                self._end_transfer()
                self.stop()
            return WeightUpdateDone(self.version, 0, 0.0)
        if msg.phase == "start":
            if msg.version <= self.version:
                raise ValueError(f"stale weight update: version {msg.version}, instance "
                                 f"{self.name} already serves version {self.version}")
            await self._update_lock.acquire()  # held until "finish" (or a failure)
            self._gate.clear()
            if msg.info.get("deadline_s"):  # the trainer may die before "finish" or "abort"
                self._transfer_deadline = asyncio.get_running_loop().call_later(
                    float(msg.info["deadline_s"]), self._transfer_expired, msg.version,
                    float(msg.info["deadline_s"]))
            await self._idle.wait()
        elif msg.phase in ("update", "finish") and self._gate.is_set():
            raise RuntimeError(f"{self.name}: weight-transfer phase {msg.phase!r} without "
                               "\"start\" first")
        try:
            await self.engine.transfer(msg.phase, msg.info)
        except BaseException:
            if msg.phase != "init":
                log.error("%s: weight transfer failed in phase %s: stopping (a replacement "
                          "loads the served weights)", self.name, msg.phase)
                self._end_transfer()
                self.stop()
            raise
        if msg.phase == "finish":
            self.version = msg.version
            self._end_transfer()
        return WeightUpdateDone(self.version, 0, now() - started)

    def _transfer_expired(self, version: int, deadline_s: float) -> None:
        """A direct update neither finished nor was aborted in time (its trainer died, or the
        run could not reach this instance): its weights may be half loaded, so the instance
        stops rather than keep its gate closed until the pool's request timeout."""
        if not self._gate.is_set():
            log.error("%s: the weight transfer of version %d neither finished nor was aborted "
                      "within %.0f s (its trainer died?): stopping (a replacement loads the "
                      "served weights)", self.name, version, deadline_s)
            self._end_transfer()
            self.stop()

    def _end_transfer(self) -> None:
        if self._transfer_deadline is not None:
            self._transfer_deadline.cancel()
            self._transfer_deadline = None
        if not self._gate.is_set():
            self._gate.set()
            self._load_changed.set()
        if self._update_lock.locked():
            self._update_lock.release()

    @handler(Sleep, concurrent=True)
    async def on_sleep(self, msg: Sleep, env: Envelope) -> EngineMemory:
        """Its agent's trainer takes the devices (devices.placement time_shared): requests
        running finish first; until WakeUp a request or an update is refused by the engine."""
        return await self._sleep_or_wake(True)

    @handler(WakeUp, concurrent=True)
    async def on_wake_up(self, msg: WakeUp, env: Envelope) -> EngineMemory:
        return await self._sleep_or_wake(False)

    async def _sleep_or_wake(self, sleep: bool) -> EngineMemory:
        async with self._update_lock:
            self._gate.clear()
            try:
                await self._idle.wait()
                before, started = resident_bytes(), now()
                await (self.engine.sleep() if sleep else self.engine.wake_up())
                self.asleep = sleep
            finally:
                self._gate.set()
            return EngineMemory(sleep, before, resident_bytes(), now() - started)

    @handler(SubscribeLoad)
    async def on_subscribe(self, msg: SubscribeLoad, env: Envelope) -> LoadReport:
        if env.peer not in self._subscribers:
            self._subscribers.append(env.peer)
        return self.report()

    def report(self) -> LoadReport:
        return LoadReport(self.name, self.version, self.queued, self.running,
                          self.outstanding_tokens)

    def _account(self, *, queued: int = 0, running: int = 0, tokens: int = 0,
                 adapter: str | None = None) -> None:
        self.queued += queued
        self.running += running
        self.outstanding_tokens += tokens
        if adapter is not None:
            self._adapter_running[adapter] += running
            if self._adapter_running[adapter]:
                self._adapter_idle[adapter].clear()
            else:
                self._adapter_idle[adapter].set()
        if self.running:
            self._idle.clear()
        else:
            self._idle.set()
        self._load_changed.set()

    async def load_report_loop(self) -> None:
        # Pushed on change, not polled: one report per burst of changes, and at most one per
        # report_interval_s (every request changes the load two or three times; the balancer
        # counts its own requests exactly and needs reports only for other clients' work).
        while True:
            await self._load_changed.wait()
            self._load_changed.clear()
            report = self.report()
            for peer in list(self._subscribers):
                if not await self.push(peer, report, control=True):
                    self._subscribers.remove(peer)
            await asyncio.sleep(self.report_interval_s)


def resident_bytes() -> int:
    """This process's resident memory (VmRSS), 0 where /proc has none."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def rollout_worker(ctx: WorkerContext) -> RolloutWorker:
    """Worker entry point: ctx.args are EngineConfig fields."""
    config = EngineConfig(**ctx.args)
    return RolloutWorker(ctx.name, ctx.bind, make_engine(config), transport=ctx.transport)
