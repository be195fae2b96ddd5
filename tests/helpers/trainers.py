"""Trainer fixtures and helpers shared by the trainer tests (tests/test_trainer.py and the tests
built on its model: LoRA, precision, parking, swaps; trainer slots: tests/test_trainer_pool.py
and tests/test_slot_busy.py).

The model is a 2-layer Qwen2 (78k parameters) built here, never downloaded; `model_dir` and
`batches` are module-scoped fixtures: a test module imports them to use them.
"""
from __future__ import annotations

import pytest
import torch

from flexmarl.orchestrator.batch import micro_batch
from flexmarl.protocol import TrainBeginBatch, TrainMicroBatch, TrainState, TrainStep
from flexmarl.training.grpo import token_logprobs
from flexmarl.training.trainer import GRPOTrainer
from runtime.config import SupervisorConfig

VOCAB = 64
LR = 1e-3
CONFIG = dict(lr=LR, grad_clip=1.0, kl_coef=0.05, seed=0)
FAST = SupervisorConfig(heartbeat_interval_s=0.2, heartbeat_timeout_s=5.0, stop_timeout_s=10.0)
FIELDS = ("input_ids", "attention_mask", "response_mask", "old_logprobs", "advantages",
          "ref_logprobs")


# ----------------------------------------------------------------------------- fixtures

@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    import transformers

    cfg = transformers.Qwen2Config(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2,
                                   num_attention_heads=2, num_key_value_heads=1,
                                   intermediate_size=128, max_position_embeddings=128,
                                   tie_word_embeddings=True)
    torch.manual_seed(1234)
    path = tmp_path_factory.mktemp("tiny-qwen2")
    transformers.Qwen2ForCausalLM(cfg).save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def batches(model_dir) -> list[TrainMicroBatch]:
    """Two global batches of 8 rows; old and ref log-probs near the model's own (so ratios
    spread around 1 and some, not all, tokens clip), right padding with id 0."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    out = []
    for seed in range(2):
        g = torch.Generator().manual_seed(seed)
        rows, width, prompt = 8, 12, 4
        lens = torch.randint(prompt + 2, width + 1, (rows,), generator=g)
        pos = torch.arange(width)
        attn = (pos < lens[:, None]).long()
        ids = torch.randint(1, VOCAB, (rows, width), generator=g) * attn
        resp = ((pos >= prompt) & (pos < lens[:, None])).long()
        with torch.no_grad():
            cur = token_logprobs(model(input_ids=ids, attention_mask=attn).logits, ids)
        noise = lambda: 0.2 * torch.randn(rows, width, generator=g)  # noqa: E731
        out.append(TrainMicroBatch(ids, attn, resp, cur + noise(), torch.randn(rows, generator=g),
                                   ref_logprobs=cur + noise()))
    return out


# ----------------------------------------------------------------------------- in one process

def rows(mb: TrainMicroBatch, lo: int, hi: int) -> TrainMicroBatch:
    return TrainMicroBatch(mb.input_ids[lo:hi], mb.attention_mask[lo:hi],
                           mb.response_mask[lo:hi], mb.old_logprobs[lo:hi],
                           mb.advantages[lo:hi], mb.ref_logprobs[lo:hi])


def tokens(mb: TrainMicroBatch) -> int:
    return int(mb.response_mask.sum())


def _weights_and_moments(trainer: GRPOTrainer) -> list[torch.Tensor]:
    """Parameters and optimizer state (copies): what a swap must carry (gradients are zero
    between global batches)."""
    tensors = [_local(p.detach()).clone() for p in trainer.model.parameters()]
    for st in trainer.optimizer.state.values():
        tensors += [_local(torch.as_tensor(v)).clone() for v in st.values()]
    return tensors


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def step_batch(trainer: GRPOTrainer, mb: TrainMicroBatch, num_micro: int = 2) -> float:
    """One global batch in `num_micro` micro-batches, stepped; its loss (as tests/test_trainer.py's
    `train` does)."""
    trainer.begin_batch(tokens(mb))
    size = mb.input_ids.shape[0] // num_micro
    loss = sum(trainer.accumulate(rows(mb, j, j + size)).loss
               for j in range(0, mb.input_ids.shape[0], size))
    trainer.step()
    return loss


# ----------------------------------------------------------------------------- trainer slots

def batch(seed: int):
    g = torch.Generator().manual_seed(seed)
    rows = [([1, 2, 3], torch.randint(3, 60, (5,), generator=g).tolist(),
             (-torch.rand(5, generator=g)).tolist()) for _ in range(4)]
    return micro_batch(rows, torch.randn(4, generator=g).tolist())


async def train_step(conn, seed: int) -> None:
    mb = batch(seed)
    await conn.request(TrainBeginBatch(0))
    await conn.request(mb)
    await conn.request(TrainStep(int(mb.response_mask.sum())))


def assert_same(a: TrainState, b: TrainState) -> None:
    """Bit for bit: parameters, AdamW state, RNG, version."""
    assert a.version == b.version and a.tensors.keys() == b.tensors.keys()
    assert [k for k in a.tensors if not torch.equal(a.tensors[k], b.tensors[k])] == []


def moved_off_start(trainer: GRPOTrainer) -> GRPOTrainer:
    """`trainer` with its trained parameters moved off the initial weights, the same way every
    call (a LoRA adapter off zero): the KL term to the reference then has a gradient."""
    g = torch.Generator().manual_seed(11)
    with torch.no_grad():
        for _, p in sorted(trainer.model.named_parameters()):
            if p.requires_grad:
                p.add_(0.05 * torch.randn(p.shape, generator=g))
    return trainer
