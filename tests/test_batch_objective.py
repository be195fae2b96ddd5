"""The objective a TrainSession's step optimises, against grpo_loss computed directly.

A global batch of one agent is its admitted groups (within the staleness bound). The trainer
minimises grpo_loss summed over the response tokens of the groups the session trains
(flexmarl.orchestrator.batch.trains), divided by those groups' response-token count:

- trainer.kl_coef > 0: every admitted group trains, a group whose advantages are all zero too
  (its tokens still carry the KL term's gradient), so the step's gradient is that of the
  documented objective over the whole batch;
- trainer.kl_coef = 0: a group whose advantages are all zero adds exactly 0 to the loss and the
  gradient, so the session does not compute it, and its tokens do not count in the normaliser:
  the mean is over the tokens of the groups with a learning signal.

The session drives a GRPOTrainer in this process through a connection double that calls it as
the trainer worker does; the documented objective is computed with grpo_loss on the whole
batch in one full forward (the policy perturbed first, so the KL term has a gradient: at the
initial weights the policy is its own reference). Both a full trainer and a LoRA one (its
reference is the base, the adapter disabled) follow the rule. Gradients compare within
GRAD_ATOL (tests/helpers/numerics.py: the same float32 terms summed in another order).
"""
from __future__ import annotations

import contextlib

import pytest
import torch

from flexmarl import AgentSpec
from flexmarl.config.training import TrainerConfig
from flexmarl.orchestrator.agents import AgentRuntime
from flexmarl.orchestrator.batch import TrainSession, micro_batch
from flexmarl.orchestrator.store import Group, Turn
from flexmarl.protocol import TrainBeginBatch, TrainMicroBatch, TrainStep
from flexmarl.training.adapter import base_only
from flexmarl.training.grpo import grpo_loss, token_logprobs
from flexmarl.training.pool import AgentTrainer
from flexmarl.training.trainer import GRPOTrainer
from tests.helpers.lora import LORA
from tests.helpers.numerics import GRAD_ATOL, max_diff
from tests.helpers.trainers import CONFIG, VOCAB, model_dir, moved_off_start  # noqa: F401  (fixture)

AGENT = "a"
ADVANTAGES = ([1.0, -1.0, 0.5, -0.5], [0.0, 0.0, 0.0, 0.0], [-0.8, 0.2, 0.9, -0.3])
"""Three groups of four samples; the second has no GRPO signal (equal rewards)."""


class InProcess:
    """A trainer connection answered by `trainer` in this process, as the trainer worker runs
    each request (flexmarl.training.rank); at TrainStep it keeps the gradient the step applies
    (the accumulated sum over the declared token count) before stepping."""

    def __init__(self, trainer: GRPOTrainer) -> None:
        self.trainer = trainer
        self.rows = 0
        self.grad: dict[str, torch.Tensor] = {}

    async def request(self, msg, timeout_s=None):
        if isinstance(msg, TrainBeginBatch):
            return self.trainer.begin_batch(msg.num_tokens)
        if isinstance(msg, TrainMicroBatch):
            self.rows += int(msg.input_ids.shape[0])
            return self.trainer.accumulate(msg)
        if isinstance(msg, TrainStep):
            self.grad = {n: p.grad / msg.num_tokens
                         for n, p in self.trainer.model.named_parameters() if p.requires_grad}
            return self.trainer.step(msg.num_tokens or None)
        raise AssertionError(f"unexpected request {msg!r}")


class Pool:
    """Stands in for the TrainerPool: its agent's trainer config (AgentTrainer, what a slot
    builds the trainer from) and one slot."""

    def __init__(self, conn: InProcess, model_dir: str, config: dict) -> None:
        self.agents = {AGENT: AgentTrainer(model_dir, config)}
        self.conn = conn

    @contextlib.asynccontextmanager
    async def bind(self, agent: str):
        yield self.conn


class _Tok:
    pad_token_id = 0


def _config(kind: str, kl_coef: float) -> dict:
    return {**(LORA if kind == "lora" else CONFIG), "kl_coef": kl_coef}


def _trainer(model_dir: str, config: dict) -> GRPOTrainer:
    """The trainer with its trained parameters moved off the initial weights (the same way
    every call), so the KL term to the reference has a gradient."""
    return moved_off_start(GRPOTrainer(model_dir, TrainerConfig(**config)))


def _groups(model_dir: str) -> list[Group]:
    """ADVANTAGES' groups: one prompt each (4-6 tokens), responses of 2-6 tokens, behaviour
    log-probabilities near the initial model's own."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    g = torch.Generator().manual_seed(3)
    groups = []
    for i, advantages in enumerate(ADVANTAGES):
        prompt = torch.randint(1, VOCAB, (int(torch.randint(4, 7, (1,), generator=g)),),
                               generator=g).tolist()
        turns = []
        for j, adv in enumerate(advantages):
            n = int(torch.randint(2, 7, (1,), generator=g))
            ids = torch.tensor([prompt + torch.randint(1, VOCAB, (n,), generator=g).tolist()])
            with torch.no_grad():
                lp = token_logprobs(model(input_ids=ids).logits, ids)[0, len(prompt):]
            lp = lp + 0.2 * torch.randn(n, generator=g)
            turns.append(Turn(AGENT, f"t{i}", 0, str(j), 0, prompt, ids[0, len(prompt):].tolist(),
                              lp.tolist(), reward=adv, advantage=adv))
        groups.append(Group(AGENT, f"t{i}", 0, turns))
    return groups


def _counted(groups: list[Group], kl_coef: float) -> int:
    """The documented normaliser: the response tokens of the groups that train (every group
    with kl_coef > 0; with kl_coef = 0 those with a non-zero advantage)."""
    return sum(len(t.response_ids) for grp in groups for t in grp.turns
               if kl_coef > 0 or any(u.advantage for u in grp.turns))


def _documented_gradient(trainer: GRPOTrainer, groups: list[Group], kl_coef: float,
                         normaliser: int) -> dict[str, torch.Tensor]:
    """The gradient of grpo_loss over `groups` in one full forward (every row, padded as
    micro_batch pads), summed over the response tokens and divided by `normaliser`."""
    turns = [t for grp in groups for t in grp.turns]
    mb = micro_batch([(t.prompt_ids, t.response_ids, t.logprobs) for t in turns],
                     [t.advantage for t in turns])
    model, c = trainer.model, trainer.config
    forward = {"input_ids": mb.input_ids, "attention_mask": mb.attention_mask}
    logprobs = token_logprobs(model(**forward).logits, mb.input_ids)
    ref = None
    if kl_coef > 0 and c.lora is not None:  # the reference: the base, the adapter disabled
        with torch.no_grad(), base_only(model):
            ref = token_logprobs(model(**forward).logits, mb.input_ids)
    elif kl_coef > 0:  # the frozen initial weights
        with torch.no_grad():
            ref = token_logprobs(trainer.reference(**forward).logits, mb.input_ids)
    loss, _ = grpo_loss(logprobs, mb.old_logprobs, mb.advantages, mb.response_mask,
                        normaliser=float(normaliser), clip_eps=c.clip_eps,
                        clip_eps_high=c.clip_eps_high, ref_logprobs=ref, kl_coef=kl_coef)
    loss.backward()
    return {n: p.grad for n, p in model.named_parameters() if p.requires_grad}


@pytest.mark.parametrize("kind", ["full", "lora"])
@pytest.mark.parametrize("kl_coef", [0.0, 0.05])
async def test_the_step_optimises_the_documented_objective_over_the_whole_batch(
        model_dir, kind, kl_coef):
    """One global batch of three groups, the second with all advantages zero, through a
    TrainSession (one group per micro-batch) into a trainer: the step's gradient is the
    gradient of grpo_loss over the whole batch normalised by the trained groups' tokens
    (GRAD_ATOL). With kl_coef > 0 the zero-advantage group trains (its KL term), so the
    normaliser is every token of the batch; with kl_coef = 0 it is left out, exactly. The
    control (kl_coef > 0): leaving that group's KL term out moves the gradient by far more."""
    config = _config(kind, kl_coef)
    groups = _groups(model_dir)
    conn = InProcess(_trainer(model_dir, config))
    rt = AgentRuntime(AgentSpec(name=AGENT, model="tiny"), model_dir, _Tok())
    async with TrainSession(rt, Pool(conn, model_dir, config), 1, lambda age: True) as session:
        await session.add(groups)
        result = await session.finish()
    counted = _counted(groups, kl_coef)
    expected = _documented_gradient(_trainer(model_dir, config), groups, kl_coef, counted)
    diff = max_diff(conn.grad, expected)
    print(f"{kind}, kl_coef {kl_coef}: max abs gradient diff {diff:.3g} "
          f"(largest component {max(g.abs().max().item() for g in expected.values()):.3g})")
    assert diff <= GRAD_ATOL
    assert max(g.abs().max().item() for g in expected.values()) > 1e-3  # not a zero gradient
    trained_groups = 3 if kl_coef > 0 else 2
    assert (result.groups, result.samples, conn.rows) == (trained_groups, 4 * trained_groups,
                                                         4 * trained_groups)
    assert result.tokens == counted
    if kl_coef > 0:  # the zero-advantage group's KL term is not negligible
        without = _documented_gradient(_trainer(model_dir, config), [groups[0], groups[2]],
                                       kl_coef, counted)
        control = max_diff(without, expected)
        print(f"  without the zero-advantage group's KL term: {control:.3g}")
        assert control > 100 * GRAD_ATOL
