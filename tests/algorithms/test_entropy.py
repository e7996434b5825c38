"""entropy_from_logits and entropy_bonus: closed forms, gradients, -inf logits, padding."""

from __future__ import annotations

import math

import pytest
import torch

from scalerl.algorithms import entropy_bonus, entropy_from_logits, token_weights

F64 = torch.float64


def test_closed_form_values() -> None:
    logits = torch.tensor([[[0.0, 0.0, 0.0, 0.0], [math.log(3.0), 0.0, -50.0, -50.0]]], dtype=F64)
    h = entropy_from_logits(logits)
    assert h.shape == (1, 2)
    assert h[0, 0].item() == pytest.approx(math.log(4.0), rel=1e-12)
    # p = (3/4, 1/4) up to e^-50 terms.
    assert h[0, 1].item() == pytest.approx(-(0.75 * math.log(0.75) + 0.25 * math.log(0.25)), rel=1e-9)


def test_gradient_matches_closed_form() -> None:
    z = torch.tensor([[[0.3, -1.2, 2.0, 0.1]]], dtype=F64, requires_grad=True)
    h = entropy_from_logits(z)
    (g,) = torch.autograd.grad(h.sum(), z)
    p = torch.softmax(z.detach(), -1)
    # dH/dz_v = -p_v (log p_v + H)
    torch.testing.assert_close(g, -p * (p.log() + h.detach()[..., None]))


def test_minus_inf_logits_contribute_zero_with_finite_gradient() -> None:
    z = torch.tensor([[[0.0, 0.0, -math.inf]]], dtype=F64, requires_grad=True)
    h = entropy_from_logits(z)
    assert h.item() == pytest.approx(math.log(2.0), rel=1e-12)
    (g,) = torch.autograd.grad(h.sum(), z)
    assert torch.isfinite(g).all() and g[0, 0, 2].item() == 0.0


def test_mask_zeroes_padding_with_garbage_logits() -> None:
    z = torch.tensor([[[1.0, 2.0], [math.nan, math.inf]]], dtype=F64, requires_grad=True)
    mask = torch.tensor([[True, False]])
    h = entropy_from_logits(z, mask)
    assert h[0, 1].item() == 0.0 and torch.isfinite(h).all()
    (g,) = torch.autograd.grad(h.sum(), z)
    assert torch.isfinite(g).all() and g[0, 1].abs().sum().item() == 0.0


def test_entropy_bonus_is_minus_coef_times_aggregated_entropy() -> None:
    entropy = torch.tensor([[1.0, 2.0, 9.0], [4.0, 9.0, 9.0]], dtype=F64, requires_grad=True)
    mask = torch.tensor([[True, True, False], [True, False, False]])
    w = token_weights(mask, None, "sample", dtype=F64)
    bonus = entropy_bonus(entropy, w, coef=0.01)
    # sample mean of entropies: ((1 + 2) / 2 + 4) / 2 = 2.75
    assert bonus.item() == pytest.approx(-0.01 * 2.75)
    (g,) = torch.autograd.grad(bonus, entropy)
    torch.testing.assert_close(g, -0.01 * w)
