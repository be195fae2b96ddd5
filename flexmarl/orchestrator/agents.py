"""One agent's live state: the versions it serves and trains, its step gate, its busy clocks.

AgentRuntime is the one owner of an agent's versions and of the rule that no sample is newer
than its trainer (see its transitions); the loop (flexmarl.orchestrator.loop) calls them, nothing
else writes the versions. Which older samples may train is the pipeline policy's rule
(flexmarl.orchestrator.policy.PipelinePolicy.admit).
"""
from __future__ import annotations

import asyncio
import dataclasses
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from flexmarl.checks import RequestError
from flexmarl.clock import now
from flexmarl.orchestrator.prompts import PLAIN_STOP, encode_chat, resolve_format
from flexmarl.team import AgentSpec


class StepGate:
    """Which global steps an agent may generate for: every step <= `open_to`.

    Monotone; the pipeline policy opens it as the agent's updates land (step s + 1 + lag once
    step s is trained and synced), and workflows of later steps wait in `wait()`.
    """

    def __init__(self, open_to: int) -> None:
        self.open_to = open_to
        self._changed = asyncio.Event()
        self.waiting = 0
        """Calls waiting in wait() now (the trainer lane serves such an agent first)."""

    def open(self, step: int) -> None:
        if step > self.open_to:
            self.open_to = step
            self._changed.set()
            self._changed = asyncio.Event()  # later waiters wait for the next opening

    async def wait(self, step: int) -> None:
        if step <= self.open_to:
            return
        self.waiting += 1
        try:
            while step > self.open_to:
                await self._changed.wait()
        finally:
            self.waiting -= 1


class BusyClock:
    """Wall time during which at least one request was in flight (the union of intervals)."""

    def __init__(self) -> None:
        self.inflight = 0
        self._since = 0.0
        self._total = 0.0

    def enter(self) -> None:
        if self.inflight == 0:
            self._since = now()
        self.inflight += 1

    def exit(self) -> None:
        self.inflight -= 1
        if self.inflight == 0:
            self._total += now() - self._since

    @property
    def seconds(self) -> float:
        ongoing = now() - self._since if self.inflight else 0.0
        return self._total + ongoing


class StalenessError(RuntimeError):
    """A sample outside the pipeline's staleness guarantee reached the trainer (a bug)."""


@dataclass
class AgentRuntime:
    """One agent's live state: its versions, gate and clocks (its rollout instances are in the
    InstancePool, which may move them between agents; its trainer slot in the TrainerPool).

    The only writer of the versions, through explicit transitions:

        start(first_step, lag, steps)  a run begins: the gate opens to its first steps
        trained(v)    the trainer stepped to version v (v > trainer_version)
        synced(v)     every instance serves v (v == trainer_version: nothing newer is served)
        restored(v)   the trainer was rebuilt from a snapshot or a saved state at version v
        staleness(pv) trainer_version - pv for a sample generated at policy version pv; a
                      negative one is a bookkeeping bug and raises StalenessError
    """

    spec: AgentSpec
    model_dir: str
    tokenizer: Any
    version: int = 0
    """The version the rollout instances serve (last weight sync)."""
    trainer_version: int = 0
    """The trainer's version (ahead of `version` between an optimizer step and its sync)."""
    gate: StepGate = field(default_factory=lambda: StepGate(0))
    rollout_busy: dict[int, BusyClock] = field(default_factory=lambda: defaultdict(BusyClock))
    """Per global step: time the agent's rollout instances had work of that step."""
    first_call: dict[int, float] = field(default_factory=dict)
    """Per global step: perf_counter() when its first request passed the gate."""
    max_model_len: int | None = None
    """The context its instances hold (rollout.max_model_len); None: not checked here."""
    prompt_format: str = field(init=False)
    """How chat messages reach the model: "chat" (its template) or "plain"
    (flexmarl.orchestrator.prompts), from AgentSpec.prompt_format and the tokenizer."""

    def __post_init__(self) -> None:
        self.prompt_format = resolve_format(self.spec.prompt_format, self.tokenizer,
                                            self.spec.name)

    def start(self, first_step: int, lag: int, steps: int) -> None:
        """A run of `steps` steps starts at `first_step`: a trainable agent may generate up to
        `lag` steps ahead of its last update, a frozen one for every step at once."""
        self.gate = StepGate(first_step + lag if self.spec.trainable else steps)

    def trained(self, version: int) -> None:
        if version <= self.trainer_version:
            raise StalenessError(f"agent {self.spec.name}: trainer stepped to version {version} "
                                 f"but it was at {self.trainer_version} already")
        self.trainer_version = version

    def synced(self, version: int) -> None:
        if version != self.trainer_version:
            raise StalenessError(f"agent {self.spec.name}: instances got version {version} but "
                                 f"the trainer is at {self.trainer_version}")
        self.version = version

    def restored(self, version: int) -> None:
        self.trainer_version = version

    def staleness(self, policy_version: int) -> int:
        age = self.trainer_version - policy_version
        if age < 0:  # newer than the trainer: the version bookkeeping is broken
            raise StalenessError(f"agent {self.spec.name}: a sample of version "
                                 f"{policy_version} but the trainer is at version "
                                 f"{self.trainer_version}")
        return age

    def encode(self, prompt: str | list[dict] | list[int]) -> list[int]:
        if isinstance(prompt, str):
            prompt = [{"role": "user", "content": prompt}]
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], dict):
            return encode_chat(self.tokenizer, prompt, self.prompt_format, self.spec.name)
        if isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool)
                                            for t in prompt):
            if not prompt:
                raise RequestError(f"agent {self.spec.name}: the prompt is empty; a prompt "
                                   "needs at least one token", param="prompt")
            # A tokenizer without a length (tests', the simulator's) leaves the upper bound out.
            vocab = len(self.tokenizer) if hasattr(self.tokenizer, "__len__") else None
            bad = [t for t in prompt if t < 0 or (vocab is not None and t >= vocab)]
            if bad:  # the client's mistake: refused here, before any engine sees it
                raise RequestError(f"agent {self.spec.name}: prompt token ids must be in [0, "
                                   f"{vocab}) (the tokenizer's vocabulary), got {bad[:5]}",
                                   param="prompt")
            return list(prompt)
        raise TypeError(f"agent {self.spec.name}: a prompt is a str, a list of chat messages "
                        f"or a list of token ids, got {type(prompt).__name__}")

    def call_params(self, prompt: Any, params: Any) -> Any:
        """A call's SamplingParams with what its prompt's rendering needs: the plain
        rendering's stop (a base model would go on to the next question) for chat prompts."""
        token_ids = isinstance(prompt, list) and bool(prompt) and isinstance(prompt[0], int)
        if self.prompt_format != "plain" or token_ids or PLAIN_STOP in params.stop:
            return params
        return dataclasses.replace(params, stop=[*params.stop, PLAIN_STOP])

    def check_room(self, prompt_ids: list[int], max_tokens: int) -> None:
        """A call must fit the context: prompt + max_tokens <= max_model_len. Refused, as
        OpenAI and vLLM's server refuse it, rather than cut short: a completion that stops at
        the context end would look like one that chose to stop there."""
        limit = self.max_model_len
        if limit is None or len(prompt_ids) + max_tokens <= limit:
            return
        where = "rollout.max_model_len sets the context"
        if len(prompt_ids) >= limit:
            raise RequestError(f"agent {self.spec.name}: the prompt has {len(prompt_ids)} "
                               f"tokens, the model's context holds {limit} ({where}): shorten "
                               "the prompt", param="prompt")
        raise RequestError(f"agent {self.spec.name}: the prompt has {len(prompt_ids)} tokens "
                           f"and max_tokens asks for {max_tokens} more, past the model's context "
                           f"of {limit} ({where}): set max_tokens to at most "
                           f"{limit - len(prompt_ids)}", param="max_tokens")
