"""Per-token objectives: closed-form values and autograd gradients against the formulas."""

from __future__ import annotations

import math

import pytest
import torch

from scalerl.algorithms import per_token_policy_loss, policy_loss, reduce_token_stats

F64 = torch.float64


def _leaf(values: list[list[float]]) -> torch.Tensor:
    return torch.tensor(values, dtype=F64, requires_grad=True)


def _grad(loss: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    (g,) = torch.autograd.grad(loss, x)
    return g


# Token ratios r = exp(logp - logp_old) chosen so each PPO branch is hit:
# 0.5 (below 1 - eps_low), 1.0, 1.1 (inside), 1.5 (above 1 + eps_high and above the dual clip c = 1.3).
RATIOS = [0.5, 1.0, 1.1, 1.5]
OLD = [[-1.0, -2.0, -0.5, -3.0], [-1.5, -0.7, -2.2, -0.9]]


def _grpo_inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    old = torch.tensor(OLD, dtype=F64)
    lp = (old + torch.tensor([RATIOS, RATIOS], dtype=F64).log()).requires_grad_(True)
    adv = torch.tensor([1.0, -1.0], dtype=F64)
    mask = torch.ones(2, 4, dtype=torch.bool)
    return lp, old, adv, mask


def test_grpo_clip_higher_closed_form_and_gradient() -> None:
    lp, old, adv, mask = _grpo_inputs()
    loss, stats = per_token_policy_loss(lp, old, adv, mask, loss_type="grpo", eps_low=0.2, eps_high=0.28)
    # A = +1: -min(r, clip(r)) -> r = 1.5 is clipped to 1.28.  A = -1: +max(r, clip(r)) -> 0.5 -> 0.8.
    expected = torch.tensor([[-0.5, -1.0, -1.1, -1.28], [0.8, 1.0, 1.1, 1.5]], dtype=F64)
    torch.testing.assert_close(loss.detach(), expected)
    # d(-A r)/dlogp = -A r on unclipped tokens; clipped tokens get exactly zero gradient.
    grad = _grad(loss.sum(), lp)
    torch.testing.assert_close(grad, torch.tensor([[-0.5, -1.0, -1.1, 0.0], [0.0, 1.0, 1.1, 1.5]], dtype=F64))
    assert grad[0, 3].item() == 0.0 and grad[1, 0].item() == 0.0
    s = reduce_token_stats(stats)
    assert s["clip_frac_high"] == pytest.approx(1 / 8)
    assert s["clip_frac_low"] == pytest.approx(1 / 8)
    assert s["ratio_mean"] == pytest.approx(sum(RATIOS) / 4)
    assert s["ratio_max"] == pytest.approx(1.5)
    assert s["is_truncated_frac"] == 0.0


def test_grpo_matches_textbook_min_form_on_random_tokens() -> None:
    gen = torch.Generator().manual_seed(0)
    lp = -torch.rand(16, 12, generator=gen, dtype=F64)
    old = lp + 0.5 * torch.randn(16, 12, generator=gen, dtype=F64)
    adv = torch.randn(16, 12, generator=gen, dtype=F64)
    mask = torch.ones(16, 12, dtype=torch.bool)
    loss, _ = per_token_policy_loss(lp, old, adv, mask, loss_type="grpo", eps_low=0.2, eps_high=0.28)
    r = (lp - old).exp()
    textbook = -torch.minimum(r * adv, r.clamp(0.8, 1.28) * adv)
    torch.testing.assert_close(loss, textbook)
    dual, _ = per_token_policy_loss(
        lp, old, adv, mask, loss_type="grpo", eps_low=0.2, eps_high=0.28, dual_clip_c=1.5
    )
    textbook_dual = torch.where(adv < 0, torch.minimum(textbook, -1.5 * adv), textbook)
    torch.testing.assert_close(dual, textbook_dual)


def test_grpo_dual_clip_bounds_negative_advantage_tokens() -> None:
    lp, old, adv, mask = _grpo_inputs()
    loss, stats = per_token_policy_loss(
        lp, old, adv, mask, loss_type="grpo", eps_low=0.2, eps_high=0.28, dual_clip_c=1.3
    )
    # A = -1, r = 1.5 > c = 1.3: loss is -c A = 1.3 with zero gradient.
    assert loss[1, 3].item() == pytest.approx(1.3)
    grad = _grad(loss.sum(), lp)
    assert grad[1, 3].item() == 0.0
    assert grad[1, 2].item() == pytest.approx(1.1)
    assert reduce_token_stats(stats)["dual_clip_frac"] == pytest.approx(1 / 8)


def test_gspo_sequence_ratio_equal_per_token_gradient() -> None:
    # Row 0: token log-ratios 0.1, -0.3, 0.5 (mean 0.1, inside the clip range); row 1: mean 0.5
    # (s = e^0.5 > 1.2 with A > 0: clipped as a whole sequence); row 2: mean 0.05, A < 0.
    old = torch.tensor([[-1.0, -2.0, -0.5], [-1.0, -1.0, -1.0], [-0.3, -0.6, -0.9]], dtype=F64)
    log_ratio = torch.tensor([[0.1, -0.3, 0.5], [0.2, 0.8, 0.5], [0.15, -0.05, 0.05]], dtype=F64)
    lp = (old + log_ratio).requires_grad_(True)
    adv = torch.tensor([2.0, 1.0, -0.5], dtype=F64)
    mask = torch.ones(3, 3, dtype=torch.bool)
    loss_tok, stats = per_token_policy_loss(lp, old, adv, mask, loss_type="gspo", eps_low=0.2, eps_high=0.2)
    s0, s2 = math.exp(0.1), math.exp(0.05)
    expected = torch.tensor([[-2 * s0] * 3, [-1.2] * 3, [0.5 * s2] * 3], dtype=F64)
    torch.testing.assert_close(loss_tok.detach(), expected)

    # GRPO sample-mean aggregation: every token of row i gets -A_i s_i / (|y_i| N).
    loss, _ = policy_loss(
        lp, old, adv, mask, None, loss_type="gspo", aggregation="sample", eps_low=0.2, eps_high=0.2
    )
    grad = _grad(loss, lp)
    want = torch.tensor([[-2 * s0 / 9] * 3, [0.0] * 3, [0.5 * s2 / 9] * 3], dtype=F64)
    torch.testing.assert_close(grad, want)
    # Same gradient on each token of a sequence even though the token ratios differ.
    for row in grad:
        assert torch.allclose(row, row[0].expand(3), rtol=0, atol=1e-15)
    assert reduce_token_stats(stats)["clip_frac_high"] == pytest.approx(3 / 9)
    assert reduce_token_stats(stats)["ratio_max"] == pytest.approx(math.exp(0.5))


def test_gspo_uses_only_response_tokens_of_the_sample() -> None:
    old = torch.tensor([[-1.0, -1.0, -1.0, 0.0]], dtype=F64)
    lp = torch.tensor([[-0.9, -1.2, -0.8, 5.0]], dtype=F64, requires_grad=True)
    mask = torch.tensor([[True, True, True, False]])
    loss, stats = per_token_policy_loss(lp, old, torch.tensor([1.0], dtype=F64), mask, loss_type="gspo")
    s = math.exp((0.1 - 0.2 + 0.2) / 3)
    torch.testing.assert_close(loss.detach(), torch.tensor([[-s, -s, -s, 0.0]], dtype=F64))
    assert stats.ratio[0, 3].item() == 1.0


def test_cispo_closed_form_gradient_only_through_logprobs() -> None:
    old = torch.tensor([[-1.0, -2.0, -3.0]], dtype=F64, requires_grad=True)
    ratios = torch.tensor([[0.5, 2.0, 5.0]], dtype=F64)
    lp = (old.detach() + ratios.log()).requires_grad_(True)
    adv = torch.tensor([1.5], dtype=F64)
    mask = torch.ones(1, 3, dtype=torch.bool)
    loss, stats = per_token_policy_loss(lp, old, adv, mask, loss_type="cispo", eps_max=4.0)
    w = torch.tensor([[0.5, 2.0, 4.0]], dtype=F64)  # min(r, eps_max)
    torch.testing.assert_close(loss.detach(), -w * 1.5 * lp.detach())
    loss.sum().backward()
    # d/dlogp of -sg(w) A logp is -w A: no term from differentiating the ratio.
    torch.testing.assert_close(lp.grad, -w * 1.5)
    assert old.grad is None
    s = reduce_token_stats(stats)
    assert s["is_truncated_frac"] == pytest.approx(1 / 3)
    assert s["eps_max_truncated_frac"] == pytest.approx(1 / 3)
    assert s["clip_frac_high"] == pytest.approx(1 / 3)
    assert s["ratio_max"] == pytest.approx(5.0)


def test_cispo_optional_lower_bound() -> None:
    old = torch.tensor([[-1.0, -2.0]], dtype=F64)
    lp = (old + torch.tensor([[0.5, 2.0]], dtype=F64).log()).requires_grad_(True)
    loss, stats = per_token_policy_loss(
        lp, old, torch.tensor([-1.0], dtype=F64), torch.ones(1, 2, dtype=torch.bool), cispo_eps_min=0.8
    )
    grad = _grad(loss.sum(), lp)
    torch.testing.assert_close(grad, torch.tensor([[0.8, 2.0]], dtype=F64))
    assert reduce_token_stats(stats)["clip_frac_low"] == pytest.approx(0.5)


@pytest.mark.parametrize("loss_type", ["grpo", "gspo", "cispo"])
def test_token_tis_multiplies_the_truncated_weight(loss_type: str) -> None:
    old = torch.tensor([[-1.0, -1.0, -1.0]], dtype=F64)
    lp = (old + 0.05).requires_grad_(True)
    # pi_old / pi_gen = 3 (capped at 2), 0.5, 1.
    behavior = old - torch.tensor([[math.log(3.0), math.log(0.5), 0.0]], dtype=F64)
    adv = torch.tensor([1.0], dtype=F64)
    mask = torch.ones(1, 3, dtype=torch.bool)
    plain, _ = per_token_policy_loss(lp, old, adv, mask, loss_type=loss_type)
    tis, stats = per_token_policy_loss(
        lp, old, adv, mask, loss_type=loss_type, behavior_logprobs=behavior, tis_cap=2.0
    )
    w = torch.tensor([[2.0, 0.5, 1.0]], dtype=F64)
    torch.testing.assert_close(tis, plain * w)
    torch.testing.assert_close(_grad(tis.sum(), lp), _grad(plain.sum(), lp) * w)
    s = reduce_token_stats(stats)
    assert s["tis_truncated_frac"] == pytest.approx(1 / 3)
    assert s["is_truncated_frac"] == pytest.approx(1 / 3)
    assert s["tis_weight_mean"] == pytest.approx(3.5 / 3)


def test_sequence_tis_uses_the_product_of_token_ratios() -> None:
    old = torch.tensor([[-1.0, -1.0, 0.0], [-1.0, -1.0, -1.0]], dtype=F64)
    lp = old.clone().requires_grad_(True)
    # Row 0 ratios 1.5 * 1.2 = 1.8 (padding excluded); row 1: 2 * 2 * 2 = 8 -> capped at 3.
    behavior = old - torch.tensor([[math.log(1.5), math.log(1.2), 9.0], [math.log(2.0)] * 3], dtype=F64)
    mask = torch.tensor([[True, True, False], [True, True, True]])
    adv = torch.tensor([1.0, 1.0], dtype=F64)
    loss, stats = per_token_policy_loss(
        lp, old, adv, mask, loss_type="cispo", behavior_logprobs=behavior, tis_cap=3.0, tis_level="sequence"
    )
    torch.testing.assert_close(stats.tis_weight, torch.tensor([[1.8, 1.8, 1.0], [3.0, 3.0, 3.0]], dtype=F64))
    torch.testing.assert_close(loss.detach(), torch.tensor([[1.8, 1.8, 0.0], [3.0, 3.0, 3.0]], dtype=F64))
    assert reduce_token_stats(stats)["tis_truncated_frac"] == pytest.approx(3 / 5)


def test_keep_mask_zeroes_tokens_without_changing_normalisation() -> None:
    old = torch.zeros(2, 2, dtype=F64)
    lp = torch.full((2, 2), -1.0, dtype=F64, requires_grad=True)
    mask = torch.ones(2, 2, dtype=torch.bool)
    adv = torch.tensor([1.0, -1.0], dtype=F64)
    keep = torch.tensor([True, False])
    loss, stats = policy_loss(
        lp,
        old,
        adv,
        mask,
        torch.tensor([0, 0]),
        loss_type="grpo",
        aggregation="token",
        keep_mask=keep,
        eps_low=1.0,
        eps_high=10.0,
    )
    r = math.exp(-1.0)
    # Row 1 dropped; the token mean still divides by all 4 tokens.
    assert loss.item() == pytest.approx(-2 * r / 4)
    assert reduce_token_stats(per_token_policy_loss(lp, old, adv, mask, loss_type="grpo", keep_mask=keep)[1])[
        "dropped_frac"
    ] == pytest.approx(0.5)
    assert stats["dropped_frac"] == pytest.approx(0.5)


def test_per_token_loss_allows_an_all_padding_micro_batch() -> None:
    lp = torch.zeros(2, 3, dtype=F64, requires_grad=True)
    loss, stats = per_token_policy_loss(
        lp, lp.detach(), torch.ones(2, dtype=F64), torch.zeros(2, 3, dtype=torch.bool)
    )
    assert loss.abs().sum().item() == 0.0
    s = reduce_token_stats(stats)
    assert s["n_tokens"] == 0.0 and math.isnan(s["ratio_mean"])


@pytest.mark.parametrize("loss_type", ["grpo", "gspo"])
def test_overflowing_ratio_on_a_clipped_token_keeps_a_zero_gradient(loss_type: str) -> None:
    # log-ratio 1000 overflows exp() even in float64; the token is clipped (A > 0), so its gradient
    # must be exactly 0, not 0 * inf = NaN.
    old = torch.tensor([[-1000.0, -1.0]], dtype=F64)
    lp = torch.tensor([[0.0, -1.0]], dtype=F64, requires_grad=True)
    mask = torch.tensor([[True, loss_type == "grpo"]])
    loss, stats = per_token_policy_loss(lp, old, torch.tensor([1.0], dtype=F64), mask, loss_type=loss_type)
    assert loss[0, 0].item() == pytest.approx(-1.2)
    (g,) = torch.autograd.grad(loss.sum(), lp)
    assert torch.isfinite(g).all() and g[0, 0].item() == 0.0
    assert reduce_token_stats(stats)["ratio_max"] == math.inf
