"""Shared helpers of the peers' runners (run_trl.py, run_comlrl.py): the command line, the
Setting, loading a policy with FlexMARL's trainable parameters, seeding, and result.json.

Runs in `.venv-peers` (FlexMARL is not installed there): standard library, torch and
transformers only. Importing it sets the offline/no-telemetry environment before transformers
is imported, so import it before anything that pulls transformers in.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import time
from importlib import metadata
from pathlib import Path

# Before transformers/datasets/wandb are imported: never touch the network.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("WANDB_SILENT", "true")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")   # rollout_func's warning
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

import torch  # noqa: E402

import workloads  # noqa: E402  (bench/peers/ is on sys.path: the runners are run as scripts)


def parse_args(description: str) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--workload", required=True, choices=workloads.WORKLOADS)
    p.add_argument("--model", required=True, help="the converted SmolLM2-135M-Instruct HF directory")
    p.add_argument("--model-dir", action="append", default=[], metavar="FAMILY=DIR",
                   help="another family's converted HF directory (mixed: gemma3-270m=DIR)")
    p.add_argument("--out", required=True, help="where result.json and the agents' weights go")
    p.add_argument("--steps", type=int, default=workloads.Setting.steps)
    p.add_argument("--seed", type=int, default=workloads.Setting.seed)
    p.add_argument("--variant", default="default", help="a label recorded in result.json")
    return p.parse_args()


def setting(args: argparse.Namespace) -> workloads.Setting:
    """The shared Setting; only the model directories, steps and seed come from the command
    line (each agent's own: workloads.agent_setting)."""
    models = tuple(tuple(x.split("=", 1)) for x in args.model_dir)
    s = workloads.Setting(model=args.model, models=models, steps=args.steps, seed=args.seed)
    missing = [workloads.agent_family(args.workload, a) for a in workloads.AGENTS[args.workload]
               if not workloads.agent_setting(s, args.workload, a).model]
    if missing:
        raise SystemExit(f"workload {args.workload} needs --model-dir FAMILY=DIR for "
                         f"{', '.join(dict.fromkeys(missing))}")
    return s


def seed_all(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy as np
        np.random.seed(seed)
    except ImportError:
        pass


def load_policy(model_dir: str, s: workloads.Setting):
    """The model in float32 with FlexMARL's trainable parameters (training/sharding.py's
    freeze_all_but): the last `train_layers` decoder blocks and the final norm; the rest,
    the tied embeddings/lm_head included, frozen."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.requires_grad_(False)
    for module in list(model.model.layers[-s.train_layers:]) + [model.model.norm]:
        module.requires_grad_(True)
    # The tied lm_head/embedding must stay frozen: if it were one of the trained tensors the
    # counts below would include it.
    assert not model.get_input_embeddings().weight.requires_grad
    model.train()
    return model


def trainable(model) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


PACKAGES = ("trl", "comlrl", "transformers", "torch", "accelerate", "datasets")


def remove_empty_dirs(root: Path) -> None:
    for d in sorted(Path(root).glob("**/"), key=lambda p: -len(p.parts)):
        try:
            d.rmdir()
        except OSError:
            pass


def versions(*names: str) -> dict:
    out = {}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


class Result:
    """OUT/result.json, rewritten after every step and at the end (a killed run leaves the
    steps it finished)."""

    def __init__(self, system: str, args: argparse.Namespace, t_process_start: float,
                 versions_: dict):
        self.out = Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.data = {
            "system": system, "workload": args.workload, "variant": args.variant,
            "versions": versions_, "t_process_start": t_process_start, "t_train_start": None,
            "steps": [], "agents": {}, "unsupported": None, "notes": [],
        }

    def note(self, text: str) -> None:
        self.data["notes"].append(text)

    def train_start(self) -> None:
        self.data["t_train_start"] = time.time()
        self.write()

    def step(self, samples: int, reward: dict) -> None:
        steps = self.data["steps"]
        before = steps[-1]["end"] if steps else self.data["t_train_start"]
        steps.append({"end": time.time(), "samples": samples, "reward": reward})
        print(f"[peers] step {len(steps)}: {samples} samples, reward {reward}, "
              f"{steps[-1]['end'] - before:.1f} s", flush=True)
        self.write()

    def unsupported(self, reason: str) -> None:
        self.data["unsupported"] = reason
        self.write()

    def save_agent(self, name: str, model, model_dir: str) -> None:
        """A full HF directory: the trained weights and the input model's own tokenizer (not a
        copy a library may have changed, e.g. its pad token)."""
        from transformers import AutoTokenizer

        path = self.out / name
        model.save_pretrained(path)
        AutoTokenizer.from_pretrained(model_dir).save_pretrained(path)
        self.data["agents"][name] = str(path)
        self.write()

    def write(self) -> None:
        tmp = self.out / "result.json.tmp"
        tmp.write_text(json.dumps(self.data, indent=1))
        tmp.replace(self.out / "result.json")


def mean(xs) -> float | None:
    xs = list(xs)
    return sum(xs) / len(xs) if xs else None


def plain_format(tokenizer) -> bool:
    """FlexMARL's AgentSpec.prompt_format "auto": the plain rendering where the tokenizer has
    no chat template (Gemma 3 270M base), the chat template where it has one."""
    return not getattr(tokenizer, "chat_template", None)


def check_plain_encoding(tokenizer) -> None:
    """The plain rendering must be tokenized as FlexMARL encodes it (flexmarl.orchestrator.
    prompts.encode_chat: tokenizer.encode(text, add_special_tokens=True)), BOS first and once.
    TRL tokenizes a plain-text prompt with processing_class(text=prompts) (add_special_tokens
    left at its default, True): that call is the one checked here."""
    text = workloads.render_plain(workloads.solver_prompt(workloads.Sum(1, 2)))
    ours = tokenizer.encode(text, add_special_tokens=True)
    theirs = tokenizer(text=[text])["input_ids"][0]
    if list(theirs) != list(ours):
        raise RuntimeError(f"tokenizing the plain prompt differs from FlexMARL's encoding: "
                           f"{list(theirs)[:5]}... vs {ours[:5]}...")
    bos = tokenizer.bos_token_id
    if bos is not None and (ours[0] != bos or ours[1] == bos):
        raise RuntimeError(f"the plain prompt should open with one {tokenizer.bos_token}: "
                           f"{ours[:5]}")


def chat_text(tokenizer, messages: list[dict]) -> str:
    """The prompt as the model's own chat template renders it, ready for the assistant's turn.
    The template already starts with <|im_start|> (SmolLM2's bos): tokenizing this text adds no
    second one (checked in check_no_double_special)."""
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def check_no_double_special(tokenizer) -> None:
    """Tokenizing the rendered prompt must give exactly the template's tokens (no extra BOS)."""
    msgs = workloads.solver_prompt(workloads.Sum(1, 2))
    by_template = tokenizer.apply_chat_template(msgs, tokenize=True, add_generation_prompt=True,
                                                return_dict=True)["input_ids"]
    by_text = tokenizer(chat_text(tokenizer, msgs))["input_ids"]
    if by_template[0] != tokenizer.bos_token_id or by_template[1] == tokenizer.bos_token_id:
        raise RuntimeError(f"the prompt should open with one {tokenizer.bos_token}: "
                           f"{by_template[:5]}")
    if list(by_template) != list(by_text):
        raise RuntimeError(f"tokenizing the rendered prompt differs from the template's tokens: "
                           f"{by_text[:5]}... vs {by_template[:5]}...")
