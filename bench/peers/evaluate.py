"""One evaluator for every system of bench/peers.py: saved weights on the 100 held-out sums.

Each system saves its agents' final weights as Hugging Face model directories; this loads them
into the same code (transformers, float32, batched `generate` with left padding) and runs the
workload's workflow on the held-out sums (bench/peers/workloads.py), greedy and sampled
(temperature 0.7, top-k and top-p off as in training, one sample per task from a fixed seed):

    sums   the solver's accuracy
    joint  each agent's accuracy and the joint reward (right(a) + right(b)) / 2
    duo    the solver's accuracy; the checker's given this system's solver's claims
    mixed  as the duo (a Gemma 3 270M base solver, a SmolLM2 checker)

Each model gets its prompts as FlexMARL's "auto" prompt format gives them: a tokenizer with a
chat template (SmolLM2) its template, one without (Gemma 3 270M base) the plain rendering
(workloads.render_plain, tokenized with the tokenizer's special tokens: Gemma's BOS first),
stopped at workloads.PLAIN_STOP and the text cut there, as FlexMARL's engines cut it. Each
agent generates up to its own new tokens (workloads.agent_setting).

    python bench/peers/evaluate.py --workload duo --agent solver=DIR --agent checker=DIR --out F

Writes F: {"greedy"|"sampled": {name: {"mean", "se", "n"}}}, where se = sqrt(p (1 - p) / n)
for 0/1 rewards (and the sample standard error for the joint reward).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import workloads as w  # noqa: E402

SAMPLE_SEED = 1234


def plain_format(tokenizer) -> bool:
    """FlexMARL's prompt_format "auto": the plain rendering where there is no chat template."""
    return not getattr(tokenizer, "chat_template", None)


def encode_batch(tokenizer, prompts: list[list[dict]]) -> dict:
    """Chat prompts as a left-padded batch, each as FlexMARL encodes it for this model
    (flexmarl.orchestrator.prompts.encode_chat, "auto"): the chat template, which writes its own
    special tokens (add none), or the plain rendering with the tokenizer's (Gemma's BOS)."""
    plain = plain_format(tokenizer)
    texts = [w.render_plain(p) if plain else
             tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True)
             for p in prompts]
    return tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=plain)


class Policy:
    """One agent's model, generating a batch of chat prompts at once."""

    def __init__(self, model_dir: str) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.plain = plain_format(self.tokenizer)
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()

    @torch.inference_mode()
    def answer(self, prompts: list[list[dict]], sampled: bool, setting: w.Setting) -> list[str]:
        batch = encode_batch(self.tokenizer, prompts)
        kwargs = dict(do_sample=True, temperature=setting.temperature, top_k=0, top_p=1.0) \
            if sampled else dict(do_sample=False, temperature=None, top_k=None, top_p=None)
        if self.plain:  # rows stop at the stop string (the batch ends when all have)
            kwargs.update(stop_strings=[w.PLAIN_STOP], tokenizer=self.tokenizer)
        if sampled:
            torch.manual_seed(SAMPLE_SEED)
        out = self.model.generate(**batch, max_new_tokens=setting.max_new_tokens,
                                  pad_token_id=self.tokenizer.pad_token_id, **kwargs)
        new = out[:, batch["input_ids"].shape[1]:]
        texts = self.tokenizer.batch_decode(new, skip_special_tokens=True)
        return [w.cut_at_stop(t) for t in texts] if self.plain else texts


def stats(values: list[float]) -> dict:
    n = len(values)
    mean = sum(values) / n
    var = sum((v - mean) ** 2 for v in values) / max(n - 1, 1)
    return {"mean": mean, "se": math.sqrt(var / n), "n": n}


def evaluate(workload: str, dirs: dict[str, str], heldout: int,
             setting: w.Setting = w.Setting()) -> dict:
    if set(dirs) != set(w.AGENTS[workload]):
        raise SystemExit(f"workload {workload} has agents {w.AGENTS[workload]}, got {sorted(dirs)}")
    tasks = w.split()[1][:heldout]
    policies: dict[str, Policy] = {}
    for name, path in dirs.items():  # agents on one directory (the base model) share a Policy
        same = next((p for n, p in policies.items() if dirs[n] == path), None)
        policies[name] = same or Policy(path)
    settings = {name: w.agent_setting(setting, workload, name) for name in dirs}
    flow = w.WORKFLOW[workload]
    result = {}
    for mode in ("greedy", "sampled"):
        sampled = mode == "sampled"
        first = w.AGENTS[workload][0]
        answers = policies[first].answer([w.solver_prompt(t) for t in tasks], sampled,
                                         settings[first])
        scores = {first: [w.right(a, t) for a, t in zip(answers, tasks)]}
        if flow == "joint":
            other = policies["b"].answer([w.solver_prompt(t) for t in tasks], sampled,
                                         settings["b"])
            scores["b"] = [w.right(a, t) for a, t in zip(other, tasks)]
            scores["joint"] = [w.joint_reward(x, y, t) for x, y, t in zip(answers, other, tasks)]
        elif flow == "duo":
            claims = [w.last_number(a) for a in answers]
            checks = policies["checker"].answer([w.checker_prompt(t, c) for t, c in
                                                 zip(tasks, claims)], sampled,
                                                settings["checker"])
            scores["checker"] = [w.right(a, t) for a, t in zip(checks, tasks)]
        result[mode] = {name: stats(v) for name, v in scores.items()}
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", choices=w.WORKLOADS, required=True)
    ap.add_argument("--agent", action="append", default=[], metavar="NAME=DIR", required=True)
    ap.add_argument("--heldout", type=int, default=w.HELDOUT_SUMS)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    dirs = dict(a.split("=", 1) for a in args.agent)
    result = evaluate(args.workload, dirs, args.heldout)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
