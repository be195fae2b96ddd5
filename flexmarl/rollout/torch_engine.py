"""Plain-PyTorch rollout backend: batched sampling with a KV cache, for small models.

    generate() ─► queue ─► (the queue stops growing: BATCH_WINDOW_S) ─► one batch of every
    queued request's n rows, prompts left-padded ─► prefill ─► decode until every row stopped
    ─► each request's samples

Concurrent requests decode together: on a CPU a 135M-parameter model decodes 32 rows in about
3x the time of one (the weights are read once per step for all rows), so a workflow's many
trajectories cost little more than one. A request that arrives while a batch runs waits for
the next batch (static batching: simple, and a workflow's calls arrive in waves anyway).
Batches run one at a time on a single thread, so the event loop stays free and two batches
never fight for the same cores.

Log-probabilities follow vLLM's `processed_logprobs`: the sampled token's log-probability under
the distribution actually sampled from (temperature, then top-k and top-p with vLLM's rules:
flexmarl.sampling.truncate); greedy requests report the raw model distribution. Each request
samples from its own generator (its seed, or the engine's seed and its arrival number), so its
draws do not depend on what it was batched with; greedy and log-probabilities may differ from
an unbatched run in the last float bits (padding changes the order of the sums).

LoRA adapters (config.adapters, flexmarl.models.lora): the model is wrapped by PEFT once the
first adapter is loaded, and every forward names each row's adapter (PEFT's mixed-batch
`adapter_names`; "__base__" for the base and for an adapter not loaded yet, which is the base
because PEFT starts B at 0), so one batch mixes agents and each row computes exactly what its
adapter alone would. A batch shares its prompts' common prefix only among rows of one adapter
(the prefix's keys and values depend on it).

On a GPU (config.device "cuda": the placement gave the instance one, flexmarl.placement.layout)
the model, every tensor and each request's generator live on it, and the engine takes at most
config.gpu_memory_utilization of the GPU (torch's per-process memory fraction), so a GPU node
without vLLM runs the whole loop, staged weight sync included. Samples differ from a CPU run's
(another generator), but a request's draws still depend only on its seed.
"""
from __future__ import annotations

import asyncio
import gc
import os
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch

from flexmarl.protocol import Sample, SamplingParams
from flexmarl.rollout.engine import EngineConfig
from flexmarl.sampling import truncate

BATCH_WINDOW_S = 0.005
"""A batch starts once no request has arrived for this long (a workflow's calls of one wave
arrive within a few milliseconds of each other), or MAX_WAIT_S after its first request."""
MAX_WAIT_S = 0.05
MIN_SHARED_PREFIX = 8
"""A batch's prompts sharing at least this many leading tokens compute them once."""


def common_prefix(prompts: list[list[int]]) -> int:
    """Leading tokens every prompt shares, leaving each at least its last token (whose logits
    are the first sample's)."""
    limit = min(len(p) for p in prompts) - 1
    first = prompts[0]
    n = 0
    while n < limit and all(p[n] == first[n] for p in prompts):
        n += 1
    return n


@dataclass
class _Request:
    prompt_ids: list[int]
    params: SamplingParams
    seed: int
    done: asyncio.Future
    adapter: str = "__base__"

    @property
    def rows(self) -> int:
        """Rows it takes in a batch: one per sample."""
        return self.params.n


def _peft_name(agent: str) -> str:
    """The agent's adapter inside PEFT: prefixed, because PEFT mistakes a name that is part of
    "lora_" (an agent called "a" or "or") for its own parameter prefix."""
    return f"agent_{agent}"


def prompt_logprobs(logits: torch.Tensor, row: int, request: _Request,
                    longest: int) -> list[float] | None:
    """The log-probability of each prompt token after the first, if the request asks for them
    (row `row` of a batch whose prompts are left-padded to `longest`)."""
    if not request.params.prompt_logprobs:
        return None
    start = longest - len(request.prompt_ids)  # the prompt's first column
    lp = torch.log_softmax(logits[row, start:-1].float(), dim=-1)
    target = torch.tensor(request.prompt_ids[1:], device=logits.device)
    return lp.gather(1, target[:, None])[:, 0].tolist()


def sample_rows(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor,
                top_p: torch.Tensor, owner: list[int],
                gens: list[torch.Generator]) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's next token and its log-probability; rows of temperature 0 take the argmax
    of the raw distribution, the others sample from their request's generator."""
    raw = torch.log_softmax(logits, dim=-1)
    token = raw.argmax(dim=-1)
    logprob = raw.gather(1, token[:, None])[:, 0]
    hot = temperature > 0
    if hot.any():
        scaled = logits[hot] / temperature[hot, None]
        scaled = truncate(scaled, top_k[hot], top_p[hot])
        lp = torch.log_softmax(scaled, dim=-1)
        probs = lp.exp()
        rows = hot.nonzero()[:, 0].tolist()
        picked = torch.empty(len(rows), dtype=torch.long, device=logits.device)
        # A request's rows draw together from its own generator, as they would alone.
        start = 0
        while start < len(rows):
            end = start
            while end < len(rows) and owner[rows[end]] == owner[rows[start]]:
                end += 1
            picked[start:end] = torch.multinomial(probs[start:end], 1,
                                                  generator=gens[owner[rows[start]]])[:, 0]
            start = end
        token[hot] = picked
        logprob[hot] = lp.gather(1, picked[:, None])[:, 0]
    return token, logprob


class TorchEngine:
    """One rollout instance's plain-PyTorch engine; see the module docstring."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.device = torch.device("cpu")
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="torch-engine")
        self.model = None
        self.tokenizer = None
        self._eos: set[int] = set()
        self._requests = 0
        self._queue: list[_Request] = []
        self._arrived = asyncio.Event()
        self._batcher: asyncio.Task | None = None
        self.batches = 0
        """Batches run so far (tests and the benchmark read it)."""
        self.asleep: str | None = None
        """While asleep: the file its weights were offloaded to (sleep)."""
        self.loaded: dict[str, dict] = {}
        """Adapters loaded so far: name -> its LoraSpec.as_dict()."""

    async def start(self) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

        if self.config.device == "cuda":
            if not torch.cuda.is_available():
                raise RuntimeError(
                    "the torch rollout engine was placed on a GPU (rollout.backend = \"torch\" "
                    "with trainer.device = \"cuda\") but this process sees no CUDA device "
                    f"(torch {torch.__version__}, CUDA_VISIBLE_DEVICES="
                    f"{os.environ.get('CUDA_VISIBLE_DEVICES', '<unset>')})")
            self.device = torch.device("cuda", torch.cuda.current_device())
            torch.cuda.set_per_process_memory_fraction(self.config.gpu_memory_utilization,
                                                       self.device)
        auto = "bfloat16" if self.device.type == "cuda" else "float32"
        dtype = getattr(torch, auto if self.config.dtype == "auto" else self.config.dtype)
        self.model = AutoModelForCausalLM.from_pretrained(self.config.model_dir,
                                                          dtype=dtype).to(self.device)
        self.model.eval()
        self.tokenizer = AutoTokenizer.from_pretrained(self.config.model_dir)
        eos = GenerationConfig.from_pretrained(self.config.model_dir).eos_token_id
        eos = eos if isinstance(eos, list) else [eos]
        self._eos = {e for e in eos if e is not None} | {self.tokenizer.eos_token_id}

    def tokenize(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    async def generate(self, prompt_ids: list[int], params: SamplingParams,
                       adapter: str | None = None) -> tuple[list[Sample], list[float] | None]:
        if len(prompt_ids) + params.max_tokens > self.config.max_model_len:
            raise ValueError(f"prompt ({len(prompt_ids)} tokens) + max_tokens "
                             f"({params.max_tokens}) exceeds rollout.max_model_len="
                             f"{self.config.max_model_len}")
        if not prompt_ids:
            raise ValueError("empty prompt: give at least one token")
        if adapter is not None and adapter not in self.config.adapters:
            raise ValueError(f"no LoRA adapter {adapter!r} on this instance; it serves "
                             f"{list(self.config.adapters) or 'none'}")
        self._awake("generate")
        self._requests += 1
        seed = params.seed if params.seed is not None else self.config.seed * 1_000_003 + self._requests
        request = _Request(list(prompt_ids), params, seed,
                           asyncio.get_running_loop().create_future(),
                           _peft_name(adapter) if adapter in self.loaded else "__base__")
        self._queue.append(request)
        self._arrived.set()
        if self._batcher is None or self._batcher.done():
            self._batcher = asyncio.create_task(self._batch_loop(), name="torch-engine-batcher")
        return await request.done

    async def _batch_loop(self) -> None:
        """Run the queue in batches until it is empty."""
        loop = asyncio.get_running_loop()
        while self._queue:
            started = loop.time()
            while loop.time() - started < MAX_WAIT_S:  # let the wave's requests arrive
                self._arrived.clear()
                try:
                    await asyncio.wait_for(self._arrived.wait(), BATCH_WINDOW_S)
                except TimeoutError:
                    break
            batch = self._take()
            batch = [r for r in batch if not r.done.cancelled()]
            if not batch:
                continue
            try:
                results = await loop.run_in_executor(self._executor, self._generate, batch)
            except Exception as exc:  # the whole batch fails alike; the engine goes on
                for r in batch:
                    if not r.done.done():
                        r.done.set_exception(exc)
                continue
            self.batches += 1
            for r, result in zip(batch, results):
                if not r.done.done():
                    r.done.set_result(result)

    def _take(self) -> list[_Request]:
        """The queued requests up to engine.max_num_seqs rows (at least one request)."""
        batch, rows = [], 0
        while self._queue and (not batch or rows + self._queue[0].rows <= self.config.max_num_seqs):
            rows += self._queue[0].rows
            batch.append(self._queue.pop(0))
        return batch

    def _forward(self, adapters: list[str], **kwargs: Any) -> Any:
        """The model's forward, each row through its adapter where adapters are loaded."""
        if hasattr(self.model, "peft_config"):
            kwargs["adapter_names"] = adapters
        return self.model(**kwargs)

    @torch.inference_mode()
    def _generate(self, batch: list[_Request]) -> list[tuple[list[Sample], list[float] | None]]:
        logits, cache, mask, position, prompt_lps = self._prefill(batch)
        owner = [i for i, r in enumerate(batch) for _ in range(r.rows)]
        rows = len(owner)
        index = torch.tensor(owner, device=self.device)
        if rows != len(batch):  # a request's n samples share its prompt's KV
            cache.batch_select_indices(index)
        logits, mask, position = logits[index], mask[index], position[index]
        gens = [torch.Generator(self.device).manual_seed(r.seed) for r in batch]
        temperature = torch.tensor([batch[i].params.temperature for i in owner],
                                   device=self.device)
        top_k = torch.tensor([batch[i].params.top_k for i in owner], device=self.device)
        top_p = torch.tensor([batch[i].params.top_p for i in owner], device=self.device)
        budget = [batch[i].params.max_tokens for i in owner]
        adapters = [batch[i].adapter for i in owner]
        tokens: list[list[int]] = [[] for _ in range(rows)]
        logprobs: list[list[float]] = [[] for _ in range(rows)]
        finish = [""] * rows
        texts: list[str | None] = [None] * rows  # set when a stop string cuts the text
        for step in range(max(budget)):
            token, logprob = sample_rows(logits, temperature, top_k, top_p, owner, gens)
            picked, picked_lp = token.tolist(), logprob.tolist()  # one device sync a step
            for row in range(rows):
                if finish[row]:
                    continue
                tokens[row].append(picked[row])
                logprobs[row].append(picked_lp[row])
                stop = batch[owner[row]].params.stop
                if tokens[row][-1] in self._eos:
                    finish[row] = "stop"
                elif stop:
                    text = self.tokenizer.decode(tokens[row], skip_special_tokens=True)
                    cut = min((text.find(s) for s in stop if s in text), default=-1)
                    if cut >= 0:
                        finish[row], texts[row] = "stop", text[:cut]
                if not finish[row] and len(tokens[row]) >= budget[row]:
                    finish[row] = "length"
            if all(finish):
                break
            mask = torch.cat([mask, torch.ones(rows, 1, dtype=torch.long, device=self.device)],
                             dim=1)
            position = position + 1
            out = self._forward(adapters, input_ids=token[:, None], attention_mask=mask,
                                position_ids=position, past_key_values=cache, use_cache=True)
            cache = out.past_key_values
            logits = out.logits[:, -1].float()
        results: list[tuple[list[Sample], list[float] | None]] = [([], lp) for lp in prompt_lps]
        for row, i in enumerate(owner):
            text = texts[row]
            if text is None:
                text = self.tokenizer.decode(tokens[row], skip_special_tokens=True)
            results[i][0].append(Sample(tokens[row], logprobs[row], finish[row], text))
        return results

    def _prefill(self, batch: list[_Request]) -> tuple[torch.Tensor, Any, torch.Tensor,
                                                       torch.Tensor, list[list[float] | None]]:
        """One row per request: the next-token logits after its prompt, the KV cache, the
        attention mask, each row's last position, and the prompt log-probabilities asked for.

        Prompts are left-padded so every row's next token is the last column. The prefix all
        of them share (a workflow's system message and instructions: often half the tokens) is
        computed once and its KV repeated for every row, unless prompt log-probabilities are
        asked for (they need every position's logits, which the shortcut skips)."""
        want_prompt_lps = any(r.params.prompt_logprobs for r in batch)
        # Requests with the same prompt and adapter (a workflow's trajectories of one task) are
        # prefilled once and their rows' KV repeated: the prefill is a prompt's tokens per
        # distinct prompt, not per request. Prompt log-probabilities are per request: no merge.
        inverse = list(range(len(batch)))
        if not want_prompt_lps:
            keys: dict[tuple, int] = {}
            inverse = [keys.setdefault((r.adapter, tuple(r.prompt_ids)), len(keys)) for r in batch]
        first: dict[int, int] = {}
        for i, k in enumerate(inverse):
            first.setdefault(k, i)
        work = [batch[i] for i in first.values()]  # one request per distinct prompt, in order
        shared = 0
        adapters = [r.adapter for r in work]
        if len(work) > 1 and not want_prompt_lps and len(set(adapters)) == 1:
            shared = common_prefix([r.prompt_ids for r in work])
            shared = shared if shared >= MIN_SHARED_PREFIX else 0
        cache = None
        if shared:
            out = self._forward(adapters[:1], input_ids=torch.tensor(
                [work[0].prompt_ids[:shared]], device=self.device), use_cache=True,
                logits_to_keep=1)
            cache = out.past_key_values
            cache.batch_select_indices(torch.zeros(len(work), dtype=torch.long,
                                                   device=self.device))
        longest = max(len(r.prompt_ids) for r in work) - shared
        ids = torch.zeros(len(work), longest, dtype=torch.long)
        mask = torch.zeros(len(work), longest, dtype=torch.long)
        for i, r in enumerate(work):
            rest = r.prompt_ids[shared:]
            ids[i, longest - len(rest):] = torch.tensor(rest)
            mask[i, longest - len(rest):] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        positions = shared + (mask.cumsum(1) - 1).clamp(min=0)
        full_mask = torch.cat([torch.ones(len(work), shared, dtype=torch.long,
                                          device=self.device), mask], dim=1)
        # Only the last column's logits are sampled from: the LM head (a 49k x 576 matmul per
        # position for SmolLM2) runs on every position only when prompt log-probabilities are
        # asked for (logits_to_keep 0: all).
        out = self._forward(adapters, input_ids=ids, attention_mask=full_mask,
                            position_ids=positions, past_key_values=cache, use_cache=True,
                            logits_to_keep=0 if want_prompt_lps else 1)
        prompt_lps = [prompt_logprobs(out.logits, i, r, longest)
                      for i, r in enumerate(work)]
        logits, cache = out.logits[:, -1].float(), out.past_key_values
        if len(work) != len(batch):
            index = torch.tensor(inverse, device=self.device)
            cache.batch_select_indices(index)
            logits, full_mask, positions = logits[index], full_mask[index], positions[index]
            prompt_lps = [prompt_lps[k] for k in inverse]
        return logits, cache, full_mask, positions[:, -1:], prompt_lps

    async def load_weights(self, tensors: dict[str, torch.Tensor]) -> None:
        self._awake("load weights")
        await asyncio.get_running_loop().run_in_executor(self._executor, self._load, tensors)

    async def load_adapter(self, name: str, tensors: dict[str, torch.Tensor],
                           lora: dict) -> None:
        self._awake("load an adapter")
        if name not in self.config.adapters:
            raise ValueError(f"no LoRA adapter {name!r} on this instance; it serves "
                             f"{list(self.config.adapters) or 'none'}")
        await asyncio.get_running_loop().run_in_executor(
            self._executor, self._load_adapter, name, tensors, lora)

    @torch.inference_mode()
    def _load_adapter(self, name: str, tensors: dict[str, torch.Tensor], lora: dict) -> None:
        from flexmarl.models import lora as adapters

        spec = adapters.LoraSpec.from_dict(lora)
        if spec.rank > self.config.max_lora_rank:
            raise ValueError(f"adapter {name}: rank {spec.rank} is above the instance's "
                             f"max_lora_rank {self.config.max_lora_rank} (rollout.max_lora_rank)")
        if self.loaded.get(name) not in (None, spec.as_dict()):
            self.model.delete_adapter(_peft_name(name))  # another shape: built anew
            del self.loaded[name]
        wrapped = hasattr(self.model, "peft_config")
        adapters.check_targets(self.model.base_model.model if wrapped else self.model, spec, name)
        if not wrapped:  # the first adapter: PEFT wraps the model
            self.model = adapters.wrap(self.model, spec, _peft_name(name))
        elif _peft_name(name) not in self.model.peft_config:
            self.model.add_adapter(_peft_name(name), adapters.peft_config(spec))
        self.model.eval()
        self.loaded[name] = spec.as_dict()
        dtype = next(self.model.parameters()).dtype
        adapters.load_adapter_tensors(self.model, _peft_name(name),
                                      {k: v.to(dtype) for k, v in tensors.items()})

    def _awake(self, what: str) -> None:
        if self.asleep is not None:
            raise RuntimeError(f"cannot {what}: the engine is asleep (its agent's trainer holds "
                               "the devices, devices.placement time_shared); wake it first")

    async def sleep(self) -> None:
        """Offload the weights to a file (the CPU's stand-in for vLLM's offload to host memory:
        the process's memory is what the trainer gets) and free them."""
        if self.asleep is None:
            await asyncio.get_running_loop().run_in_executor(self._executor, self._sleep)

    async def wake_up(self) -> None:
        if self.asleep is not None:
            await asyncio.get_running_loop().run_in_executor(self._executor, self._wake)

    def _sleep(self) -> None:
        from safetensors.torch import save_file

        params = dict(self.model.named_parameters())  # a tied tensor once
        fd, path = tempfile.mkstemp(prefix="flexmarl-asleep-", suffix=".safetensors")
        os.close(fd)
        try:
            save_file({k: p.detach().to("cpu").contiguous() for k, p in params.items()}, path)
        except BaseException:
            os.unlink(path)
            raise
        for p in params.values():  # the Parameter objects stay (and with them any tying)
            p.data = torch.empty(0, dtype=p.dtype, device=self.device)
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()  # the trainer taking the GPU gets it
        self.asleep = path

    def _wake(self) -> None:
        from safetensors.torch import load_file

        tensors = load_file(self.asleep)
        for name, p in self.model.named_parameters():
            p.data = tensors[name].to(self.device)
        os.unlink(self.asleep)
        self.asleep = None

    @torch.inference_mode()
    def _load(self, tensors: dict[str, torch.Tensor]) -> None:
        model = self.model.base_model.model if hasattr(self.model, "peft_config") else self.model
        _, unexpected = model.load_state_dict(tensors, strict=False)
        # A partial update (trainer.train_layers) names only the trained tensors; the rest stay.
        # Tied embeddings: a checkpoint may carry embed_tokens only, and lm_head follows it.
        if unexpected or not tensors:
            raise ValueError(f"weight update does not match the model: unexpected "
                             f"{unexpected[:5]} of {len(tensors)} tensors")

    async def close(self) -> None:
        if self._batcher is not None and not self._batcher.done():
            self._batcher.cancel()
        for r in self._queue:
            if not r.done.done():
                r.done.set_exception(RuntimeError("the rollout engine was closed"))
        self._queue.clear()
        self._executor.shutdown(wait=True)
        if self.asleep is not None:
            os.unlink(self.asleep)
            self.asleep = None
