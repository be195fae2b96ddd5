"""Plain-PyTorch rollout backend: batched sampling with a KV cache, for small models.

The `n` samples of a request decode together as one batch over a shared prompt (no padding is
needed); requests run one at a time on a single thread, so the event loop stays free and two
requests never fight for the same cores. Log-probabilities follow vLLM's `processed_logprobs`:
the sampled token's log-probability under the distribution actually sampled from (temperature,
then top-k and top-p with vLLM's rules: flexmarl.sampling.truncate); greedy requests report
the raw model distribution.
"""
from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import torch

from flexmarl.protocol import Sample, SamplingParams
from flexmarl.rollout.engine import EngineConfig
from flexmarl.sampling import truncate


class TorchEngine:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="torch-engine")
        self.model = None
        self.tokenizer = None
        self._eos: set[int] = set()
        self._requests = 0

    async def start(self) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

        dtype = getattr(torch, "float32" if self.config.dtype == "auto" else self.config.dtype)
        self.model = AutoModelForCausalLM.from_pretrained(self.config.model_dir, dtype=dtype)
        self.model.eval()
        self.tokenizer = AutoTokenizer.from_pretrained(self.config.model_dir)
        eos = GenerationConfig.from_pretrained(self.config.model_dir).eos_token_id
        eos = eos if isinstance(eos, list) else [eos]
        self._eos = {e for e in eos if e is not None} | {self.tokenizer.eos_token_id}

    def tokenize(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    async def generate(self, prompt_ids: list[int],
                       params: SamplingParams) -> tuple[list[Sample], list[float] | None]:
        if len(prompt_ids) + params.max_tokens > self.config.max_model_len:
            raise ValueError(f"prompt ({len(prompt_ids)} tokens) + max_tokens "
                             f"({params.max_tokens}) exceeds rollout.max_model_len="
                             f"{self.config.max_model_len}")
        self._requests += 1
        seed = params.seed if params.seed is not None else self.config.seed * 1_000_003 + self._requests
        return await asyncio.get_running_loop().run_in_executor(
            self._executor, self._generate, prompt_ids, params, seed)

    @torch.inference_mode()
    def _generate(self, prompt_ids: list[int], params: SamplingParams,
                  seed: int) -> tuple[list[Sample], list[float] | None]:
        n = params.n
        gen = torch.Generator().manual_seed(seed)
        prompt = torch.tensor([prompt_ids], dtype=torch.long)
        out = self.model(input_ids=prompt, use_cache=True)
        prompt_lp = None
        if params.prompt_logprobs:
            lp = torch.log_softmax(out.logits[0, :-1].float(), dim=-1)
            prompt_lp = lp.gather(1, prompt[0, 1:, None])[:, 0].tolist()
        cache = out.past_key_values
        cache.batch_repeat_interleave(n)  # the n samples share the prompt's KV
        logits = out.logits[:, -1].float().expand(n, -1)
        tokens: list[list[int]] = [[] for _ in range(n)]
        logprobs: list[list[float]] = [[] for _ in range(n)]
        finish = [""] * n
        texts: list[str | None] = [None] * n  # set when a stop string cuts the text
        for step in range(params.max_tokens):
            token, logprob = self._sample(logits, params, gen)
            for i in range(n):
                if finish[i]:
                    continue
                tokens[i].append(int(token[i]))
                logprobs[i].append(float(logprob[i]))
                if tokens[i][-1] in self._eos:
                    finish[i] = "stop"
                elif params.stop:
                    text = self.tokenizer.decode(tokens[i], skip_special_tokens=True)
                    cut = min((text.find(s) for s in params.stop if s in text), default=-1)
                    if cut >= 0:
                        finish[i], texts[i] = "stop", text[:cut]
            if all(finish):
                break
            out = self.model(input_ids=token[:, None], past_key_values=cache, use_cache=True)
            cache = out.past_key_values
            logits = out.logits[:, -1].float()
        samples = []
        for i in range(n):
            text = texts[i]
            if text is None:
                text = self.tokenizer.decode(tokens[i], skip_special_tokens=True)
            samples.append(Sample(tokens[i], logprobs[i], finish[i] or "length", text))
        return samples, prompt_lp

    @staticmethod
    def _sample(logits: torch.Tensor, params: SamplingParams,
                gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        if params.temperature == 0:
            lp = torch.log_softmax(logits, dim=-1)
            token = lp.argmax(dim=-1)
            return token, lp.gather(1, token[:, None])[:, 0]
        scaled = logits / params.temperature
        rows = scaled.shape[0]
        scaled = truncate(scaled, torch.full((rows,), params.top_k),
                          torch.full((rows,), params.top_p))
        lp = torch.log_softmax(scaled, dim=-1)
        token = torch.multinomial(lp.exp(), 1, generator=gen)[:, 0]
        return token, lp.gather(1, token[:, None])[:, 0]

    async def load_weights(self, tensors: dict[str, torch.Tensor]) -> None:
        await asyncio.get_running_loop().run_in_executor(self._executor, self._load, tensors)

    @torch.inference_mode()
    def _load(self, tensors: dict[str, torch.Tensor]) -> None:
        _, unexpected = self.model.load_state_dict(tensors, strict=False)
        # A partial update (trainer.train_layers) names only the trained tensors; the rest stay.
        # Tied embeddings: a checkpoint may carry embed_tokens only, and lm_head follows it.
        if unexpected or not tensors:
            raise ValueError(f"weight update does not match the model: unexpected "
                             f"{unexpected[:5]} of {len(tensors)} tensors")

    async def close(self) -> None:
        self._executor.shutdown(wait=True)
