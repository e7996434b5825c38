"""The critic's clipped value loss, and Kimi k1.5's mirror-descent surrogate: closed forms and gradients."""

from __future__ import annotations

import math

import pytest
import torch

from scalerl.algorithms import (
    compute_advantages,
    explained_variance,
    kimi_length_coef,
    kimi_sequence_loss,
    per_token_policy_loss,
    policy_loss,
    value_loss,
)

# --- value loss ----------------------------------------------------------------------------------


def test_unclipped_value_loss_is_half_squared_error_with_its_gradient() -> None:
    v = torch.tensor([[0.5, 2.0, math.nan]], dtype=torch.float64, requires_grad=True)
    ret = torch.tensor([[1.0, 1.0, 7.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0]], dtype=torch.bool)
    loss, clipped = value_loss(v, v.detach(), ret, mask)
    assert loss.tolist() == [[0.125, 0.5, 0.0]]
    assert not clipped.any()
    loss.sum().backward()
    assert v.grad.tolist() == [[-0.5, 1.0, 0.0]]


def test_clipped_value_loss_takes_the_larger_branch() -> None:
    old = torch.tensor([[0.0, 0.0, 0.0, 0.0]], dtype=torch.float64)
    v = torch.tensor([[0.5, -0.5, 0.1, 0.5]], dtype=torch.float64, requires_grad=True)
    ret = torch.tensor([[1.0, 1.0, 1.0, -1.0]], dtype=torch.float64)
    loss, clipped = value_loss(v, old, ret, torch.ones(1, 4, dtype=torch.bool), clip=0.2)
    # Token 0: moved toward R past the clip: clipped branch (0.2 - 1)^2 > (0.5 - 1)^2, no gradient.
    # Token 1: moved away from R: unclipped branch is larger. Token 2: inside the range, equal.
    # Token 3: moved away from R = -1 past the clip: unclipped is larger.
    want = [0.5 * 0.8**2, 0.5 * 1.5**2, 0.5 * 0.9**2, 0.5 * 1.5**2]
    assert loss.tolist()[0] == pytest.approx(want, rel=1e-12)
    assert clipped.tolist() == [[True, False, False, False]]
    loss.sum().backward()
    assert v.grad.tolist()[0] == pytest.approx([0.0, -1.5, -0.9, 1.5], rel=1e-12)


def test_explained_variance() -> None:
    ret = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    mask = torch.ones(1, 4, dtype=torch.bool)
    assert explained_variance(ret, ret, mask) == pytest.approx(1.0)
    assert explained_variance(torch.full((1, 4), 2.5), ret, mask) == pytest.approx(0.0)
    assert math.isnan(explained_variance(ret, torch.ones(1, 4), mask))


def test_value_loss_bad_input() -> None:
    with pytest.raises(ValueError, match="returns: expected shape"):
        value_loss(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2, 2), torch.ones(2, 3))
    with pytest.raises(ValueError, match="clip: expected a number > 0"):
        value_loss(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2, 3), torch.ones(2, 3), clip=0.0)


# --- Kimi k1.5 ----------------------------------------------------------------------------------


def test_kimi_loss_is_zero_at_the_closed_form_optimum() -> None:
    """With the exact `tau log Z`, pi* = pi_old exp(r / tau) / Z makes every term of the surrogate 0
    (Kimi k1.5 §2.3.2): r - tau log Z - tau log(pi* / pi_old) = 0 for every response."""
    tau = 0.3
    old = torch.log_softmax(torch.tensor([0.2, -1.0, 0.5, 0.0], dtype=torch.float64), dim=0)
    r = torch.tensor([1.0, 0.0, 0.0, 1.0], dtype=torch.float64)
    log_z = torch.logsumexp(old + r / tau, dim=0)
    best = old + r / tau - log_z
    lp = best[:, None].clone().requires_grad_(True)  # four one-token responses
    loss, rho = kimi_sequence_loss(lp, old[:, None], r - tau * log_z, torch.ones(4, 1, dtype=torch.bool), tau)
    torch.testing.assert_close(loss, torch.zeros(4, dtype=torch.float64), atol=1e-24, rtol=0)
    torch.testing.assert_close(rho, best - old)
    loss.sum().backward()
    torch.testing.assert_close(lp.grad, torch.zeros(4, 1, dtype=torch.float64), atol=1e-12, rtol=0)


def test_kimi_gradient_is_the_reports_equation_3() -> None:
    """d/dlogp_{i,t} of the sample-aggregated loss = -(1/N) [(r_i - mean_g r) - tau rho_i]: minus
    the report's gradient (1/k) sum_j [(r_j - r_bar) grad log pi(y_j) - tau/2 grad rho_j^2]."""
    gen = torch.Generator().manual_seed(0)
    n, t, tau = 6, 5, 0.2
    lp = (-torch.rand(n, t, generator=gen, dtype=torch.float64)).requires_grad_(True)
    old = lp.detach() + 0.1 * torch.randn(n, t, generator=gen, dtype=torch.float64)
    mask = torch.arange(t)[None, :] < torch.tensor([5, 3, 4, 1, 5, 2])[:, None]
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.0], dtype=torch.float64)
    groups = torch.tensor([0, 0, 0, 1, 1, 1])
    adv = compute_advantages(rewards, groups, "none")
    loss, _ = policy_loss(lp, old, adv, mask, groups, loss_type="kimi", aggregation="sample", kimi_tau=tau)
    loss.backward()

    rho = torch.where(mask, lp.detach() - old, 0.0).sum(dim=1)
    r_bar = torch.tensor([2 / 3] * 3 + [1 / 3] * 3, dtype=torch.float64)
    want = -((rewards - r_bar) - tau * rho)[:, None].expand(n, t) / n
    torch.testing.assert_close(lp.grad, torch.where(mask, want, 0.0))
    # The loss value: mean_i (A_i - tau rho_i)^2 / (2 tau).
    want_loss = float(((adv - tau * rho) ** 2 / (2 * tau)).mean())
    assert float(loss.detach()) == pytest.approx(want_loss, rel=1e-12)


def test_kimi_per_token_loss_broadcasts_the_sample_loss() -> None:
    lp = torch.tensor([[-0.5, -0.2, 0.0], [-1.0, 0.0, 0.0]], dtype=torch.float64)
    old = torch.tensor([[-0.4, -0.4, 9.0], [-1.5, 0.0, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]], dtype=torch.bool)
    adv = torch.tensor([1.0, -0.5], dtype=torch.float64)
    per_token, stats = per_token_policy_loss(lp, old, adv, mask, loss_type="kimi", kimi_tau=0.5)
    rho = [(-0.5 + 0.4) + (-0.2 + 0.4), 0.5]
    l0, l1 = ((1.0 - 0.5 * rho[0]) ** 2) / 1.0, ((-0.5 - 0.5 * rho[1]) ** 2) / 1.0
    torch.testing.assert_close(per_token, torch.tensor([[l0, l0, 0.0], [l1, 0.0, 0.0]], dtype=torch.float64))
    assert stats.ratio[0, 0].item() == pytest.approx(math.exp(-0.1))
    assert not stats.clipped_high.any() and not stats.clipped_low.any()


def test_kimi_needs_tau_and_per_sample_advantages() -> None:
    lp, mask = torch.zeros(2, 3), torch.ones(2, 3, dtype=torch.bool)
    with pytest.raises(ValueError, match="kimi_tau: required for loss_type 'kimi'"):
        per_token_policy_loss(lp, lp, torch.ones(2), mask, loss_type="kimi")
    with pytest.raises(ValueError, match="advantages: loss_type 'kimi' needs one advantage per sample"):
        per_token_policy_loss(lp, lp, torch.ones(2, 3), mask, loss_type="kimi", kimi_tau=0.1)
    with pytest.raises(ValueError, match="kimi_tau: only used by loss_type 'kimi'"):
        per_token_policy_loss(lp, lp, torch.ones(2), mask, loss_type="grpo", kimi_tau=0.1)
    with pytest.raises(ValueError, match="tau: expected a number > 0"):
        kimi_sequence_loss(lp, lp, torch.ones(2), mask, 0.0)


def test_kimi_length_coef_warm_up() -> None:
    # The report: no length penalty first, then a constant one.
    assert [kimi_length_coef(s, 0.2, warmup_steps=3) for s in range(5)] == [0.0, 0.0, 0.0, 0.2, 0.2]
    ramped = [kimi_length_coef(s, 0.2, warmup_steps=2, ramp_steps=4) for s in range(8)]
    assert ramped == pytest.approx([0.0, 0.0, 0.05, 0.1, 0.15, 0.2, 0.2, 0.2])
    assert kimi_length_coef(0, 0.2) == 0.2
    with pytest.raises(ValueError, match="warmup_steps: expected an integer >= 0"):
        kimi_length_coef(0, 0.2, warmup_steps=-1)
