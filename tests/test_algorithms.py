"""GRPO formulas on hand-made tensors: advantages, token log-probabilities, the clipped loss."""
from __future__ import annotations

import math

import pytest
import torch

from flexmarl.orchestrator.advantage import grpo_advantages
from flexmarl.sampling import truncate
from flexmarl.training.grpo import grpo_loss, token_entropy, token_logprobs


# ----------------------------------------------------------------------------- advantages

def test_advantages_known_values_population_std():
    adv = grpo_advantages(torch.tensor([1.0, 0.0, 3.0, 5.0]), ["a", "a", "b", "b"], eps=0.0)
    # Group a: mean 0.5, population std 0.5; group b: mean 4, std 1.
    assert torch.allclose(adv, torch.tensor([1.0, -1.0, -1.0, 1.0]))


def test_advantages_interleaved_groups_and_tensor_ids():
    rewards = torch.tensor([2.0, 10.0, 4.0, 10.0, 6.0])
    adv = grpo_advantages(rewards, torch.tensor([0, 1, 0, 1, 0]), eps=0.0, scale=False)
    assert torch.allclose(adv, torch.tensor([-2.0, 0.0, 0.0, 0.0, 2.0]))
    scaled = grpo_advantages(rewards, [0, 1, 0, 1, 0], eps=0.0)
    std = math.sqrt(8 / 3)
    assert torch.allclose(scaled, torch.tensor([-2 / std, 0.0, 0.0, 0.0, 2 / std]))


def test_size_one_groups_and_constant_rewards_get_zero():
    adv = grpo_advantages(torch.tensor([7.0, 1.0, 1.0, 1.0, -3.0]), ["x", "y", "y", "y", "z"])
    assert torch.equal(adv, torch.zeros(5))


def test_advantages_eps_and_shape_errors():
    adv = grpo_advantages(torch.tensor([0.0, 1.0]), [0, 0], eps=1e-6)
    assert torch.allclose(adv, torch.tensor([-0.5, 0.5]) / (0.5 + 1e-6))
    with pytest.raises(ValueError, match="group_ids"):
        grpo_advantages(torch.tensor([0.0, 1.0]), [0])
    with pytest.raises(ValueError, match="1-D"):
        grpo_advantages(torch.zeros(2, 2), [0, 0])


# ----------------------------------------------------------------------------- log-probs

def test_token_logprobs_against_hand_computation():
    torch.manual_seed(0)
    logits = torch.randn(2, 4, 5)
    ids = torch.tensor([[1, 4, 0, 2], [3, 3, 1, 0]])
    for temperature in (1.0, 0.7):
        out = token_logprobs(logits, ids, temperature)
        assert out.shape == (2, 4) and torch.equal(out[:, 0], torch.zeros(2))
        for b in range(2):
            for t in range(1, 4):
                z = logits[b, t - 1] / temperature
                expected = z[ids[b, t]] - torch.log(torch.exp(z).sum())
                assert abs(out[b, t].item() - expected.item()) < 1e-5


def test_truncate_by_hand():
    """logits 3, 2, 1, 0: probabilities 0.644, 0.237, 0.087, 0.032."""
    logits = torch.tensor([[3.0, 2.0, 1.0, 0.0]] * 4)
    out = truncate(logits, torch.tensor([2, 0, 0, 3]), torch.tensor([1.0, 0.8, 0.5, 0.9]))
    kept = ~torch.isinf(out)
    assert kept.tolist() == [[True, True, False, False],   # top-k 2
                             [True, True, False, False],   # top-p 0.8: 0.644 + 0.237 >= 0.8
                             [True, False, False, False],  # top-p 0.5: the first is enough
                             [True, True, False, False]]   # top-k 3, then p 0.9 of the rest
    assert torch.equal(out[kept], logits[kept])  # kept logits unchanged
    assert torch.equal(truncate(logits, torch.zeros(4), torch.ones(4)), logits)  # both off


@pytest.mark.vllm
def test_truncate_matches_vllms_sampler():
    """The trainer's truncation is vLLM's own (apply_top_k_top_p_pytorch), mask for mask."""
    from vllm.v1.sample.ops import topk_topp_sampler as ops
    torch.manual_seed(0)
    k = torch.tensor([0, 20, 5, 1, 300, 20, 0])
    p = torch.tensor([0.9, 1.0, 0.5, 0.9, 0.3, 0.9, 1.0])
    for _ in range(20):
        logits = torch.randn(7, 300) * 3
        ours = truncate(logits.clone(), k, p)
        theirs = ops.apply_top_k_top_p_pytorch(logits.clone(), torch.where(k > 0, k, 300), p)
        assert torch.equal(torch.isinf(ours), torch.isinf(theirs))
        assert torch.equal(ours[~torch.isinf(ours)], theirs[~torch.isinf(theirs)])


def test_token_logprobs_per_row_settings_and_gradient():
    torch.manual_seed(1)
    logits = torch.randn(3, 5, 40, requires_grad=True)
    ids = torch.randint(0, 40, (3, 5))
    temps, ks = torch.tensor([0.7, 1.0, 1.3]), torch.tensor([20, 0, 5])
    ps = torch.tensor([0.9, 0.8, 1.0])
    out = token_logprobs(logits, ids, temps, top_k=ks, top_p=ps)
    for b in range(3):
        alone = token_logprobs(logits[b:b + 1], ids[b:b + 1], float(temps[b]),
                               top_k=ks[b:b + 1], top_p=ps[b:b + 1])
        assert torch.allclose(out[b:b + 1], alone)
        z = truncate((logits[b].detach() / temps[b]), ks[b].repeat(5), ps[b].repeat(5))
        direct = torch.log_softmax(z, -1)[:-1].gather(1, ids[b, 1:, None])[:, 0]
        assert torch.allclose(out[b, 1:], direct)
    finite = torch.isfinite(out)
    out[finite].sum().backward()  # a token outside the set has -inf; gradients stay finite
    assert torch.isfinite(logits.grad).all()
    ent = token_entropy(logits, temps)
    assert ent.shape == (3, 5) and (ent[:, 1:] > 0).all()
    assert (ent[:, 1:] <= math.log(40) + 1e-5).all()


def test_token_logprobs_computes_in_float32_for_bf16_logits():
    logits = torch.randn(1, 3, 7).to(torch.bfloat16)
    out = token_logprobs(logits, torch.tensor([[0, 1, 2]]))
    assert out.dtype == torch.float32


# ----------------------------------------------------------------------------- loss

def _inputs(seed: int = 0, rows: int = 4, width: int = 6):
    g = torch.Generator().manual_seed(seed)
    logprobs = -torch.rand(rows, width, generator=g) * 2 - 0.1
    mask = (torch.rand(rows, width, generator=g) > 0.3).float()
    adv = torch.randn(rows, generator=g)
    return logprobs, mask, adv


def test_ratio_one_gives_minus_mean_advantage():
    logprobs, mask, adv = _inputs()
    lp = logprobs.clone().requires_grad_()
    loss, m = grpo_loss(lp, logprobs, adv, mask, normaliser=17.0)
    expected = -(adv[:, None] * mask).sum() / 17.0
    assert torch.allclose(loss, expected, atol=1e-6)
    assert m["ratio_mean"] == pytest.approx(1.0) and m["clip_frac"] == 0.0 and m["kl"] == 0.0
    assert m["num_tokens"] == mask.sum().item()
    loss.backward()  # d loss / d logprob = -A / normaliser on response tokens, 0 elsewhere
    assert torch.allclose(lp.grad, -adv[:, None] * mask / 17.0, atol=1e-7)


def test_clipping_engages_past_clip_eps():
    old = torch.zeros(2, 3)
    mask = torch.ones(2, 3)
    adv = torch.tensor([1.0, -1.0])
    # ratio e^0.5 ~ 1.65 on row 0 (A > 0: clipped at 1.2), e^-0.5 ~ 0.61 on row 1 (A < 0:
    # clipped at 0.8); and a ratio inside the band is never clipped.
    new = torch.tensor([[0.5, 0.5, 0.1], [-0.5, -0.5, -0.1]]).requires_grad_()
    loss, m = grpo_loss(new, old, adv, mask, normaliser=6.0, clip_eps=0.2)
    r = torch.exp(new.detach())
    expected = (-1.2 * 2 - r[0, 2] + 0.8 * 2 + r[1, 2]) / 6.0
    assert torch.allclose(loss, expected, atol=1e-6)
    assert m["clip_frac"] == pytest.approx(4 / 6)
    loss.backward()  # clipped tokens pass no gradient
    assert torch.equal(new.grad[:, :2], torch.zeros(2, 2))
    assert (new.grad[:, 2] != 0).all()
    # Clip higher: a wider upper band releases row 0.
    _, wide = grpo_loss(new.detach(), old, adv, mask, normaliser=6.0, clip_eps=0.2,
                        clip_eps_high=1.0)
    assert wide["clip_frac"] == pytest.approx(2 / 6)


def test_kl_is_zero_when_reference_equals_policy_and_positive_otherwise():
    logprobs, mask, adv = _inputs(1)
    base, _ = grpo_loss(logprobs, logprobs, adv, mask, normaliser=10.0)
    same, m = grpo_loss(logprobs, logprobs, adv, mask, normaliser=10.0, ref_logprobs=logprobs,
                        kl_coef=0.5)
    assert m["kl"] == 0.0 and torch.allclose(same, base)
    ref = logprobs + 0.3
    other, m2 = grpo_loss(logprobs, logprobs, adv, mask, normaliser=10.0, ref_logprobs=ref,
                          kl_coef=0.5)
    k3 = math.exp(0.3) - 0.3 - 1
    assert m2["kl"] == pytest.approx(k3, rel=1e-5)
    assert other.item() == pytest.approx(base.item() + 0.5 * k3 * mask.sum().item() / 10.0,
                                         rel=1e-5)
    with pytest.raises(ValueError, match="ref_logprobs"):
        grpo_loss(logprobs, logprobs, adv, mask, normaliser=10.0, kl_coef=0.1)


def test_micro_batch_losses_sum_to_full_batch_loss():
    logprobs, mask, adv = _inputs(2, rows=8)
    old = logprobs + 0.2 * torch.randn(8, 6, generator=torch.Generator().manual_seed(3))
    ref = logprobs - 0.1
    n = float(mask.sum())
    kw = dict(normaliser=n, ref_logprobs=ref, kl_coef=0.1)
    full, _ = grpo_loss(logprobs, old, adv, mask, **{**kw, "ref_logprobs": ref})
    parts = sum(grpo_loss(logprobs[i:i + 2], old[i:i + 2], adv[i:i + 2], mask[i:i + 2],
                          **{**kw, "ref_logprobs": ref[i:i + 2]})[0] for i in range(0, 8, 2))
    assert torch.allclose(parts, full, atol=1e-6)


def test_masked_garbage_contributes_nothing():
    logprobs, mask, adv = _inputs(4)
    mask[:, -1] = 0
    old = logprobs.clone()
    old[:, -1] = float("-inf")  # padding positions may hold anything
    ref = logprobs.clone()
    ref[:, -1] = float("nan")
    lp = logprobs.clone().requires_grad_()
    loss, m = grpo_loss(lp, old, adv, mask, normaliser=5.0, ref_logprobs=ref, kl_coef=0.1)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(lp.grad).all()
    assert torch.equal(lp.grad[:, -1], torch.zeros(4)) and math.isfinite(m["kl"])


def test_loss_argument_errors():
    logprobs, mask, adv = _inputs()
    with pytest.raises(ValueError, match="normaliser"):
        grpo_loss(logprobs, logprobs, adv, mask, normaliser=0.0)
    with pytest.raises(ValueError, match="advantages"):
        grpo_loss(logprobs, logprobs, adv[:2], mask, normaliser=1.0)


def test_truncated_importance_weight_on_policy_equals_plain_loss():
    """Samples from the current policy (behaviour == current): weight 1, same loss and gradient."""
    logprobs, mask, adv = _inputs(seed=3)
    a = logprobs.clone().requires_grad_()
    b = logprobs.clone().requires_grad_()
    plain, _ = grpo_loss(a, logprobs, adv, mask, normaliser=9.0)
    tis, m = grpo_loss(b, logprobs, adv, mask, normaliser=9.0, is_cap=2.0)
    assert torch.allclose(plain, tis, atol=1e-7)
    plain.backward()
    tis.backward()
    assert torch.allclose(a.grad, b.grad, atol=1e-7)
    assert m["is_weight_mean"] == pytest.approx(1.0) and m["is_truncated_frac"] == 0.0


def test_truncated_importance_weight_scales_stale_tokens_and_caps():
    """Stale behaviour log-probs: the gradient is -A * min(pi/mu, cap) * dlogpi / normaliser,
    never clipped to zero the way the plain PPO ratio to mu would be."""
    current = torch.tensor([[-1.0, -1.0, -1.0]]).requires_grad_()
    behaviour = torch.tensor([[-1.0, -1.5, -3.0]])  # pi/mu = 1, e^0.5 ~ 1.65, e^2 ~ 7.4
    mask = torch.ones(1, 3)
    adv = torch.tensor([1.0])
    loss, m = grpo_loss(current, behaviour, adv, mask, normaliser=3.0, is_cap=2.0)
    loss.backward()
    weights = torch.tensor([1.0, math.exp(0.5), 2.0])
    assert torch.allclose(current.grad, -weights[None] / 3.0, atol=1e-6)
    assert m["is_truncated_frac"] == pytest.approx(1 / 3)
    assert m["is_weight_mean"] == pytest.approx(weights.mean().item(), rel=1e-6)
    plain = current.detach().clone().requires_grad_()
    grpo_loss(plain, behaviour, adv, mask, normaliser=3.0)[0].backward()
    assert plain.grad[0, 2] == 0.0  # the plain ratio e^2 is clipped: that token taught nothing
    with pytest.raises(ValueError, match="is_cap must be > 0"):
        grpo_loss(current, behaviour, adv, mask, normaliser=3.0, is_cap=0.0)
