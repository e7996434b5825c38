"""On-policy distillation's advantage (scalerl.algorithms.distill): closed forms and shape rules."""

from __future__ import annotations

import math

import pytest
import torch

from scalerl.algorithms import distillation_advantages, reverse_kl_advantages


def test_reverse_kl_advantage_closed_form() -> None:
    s = torch.tensor([[-1.0, -2.0, -0.5], [-3.0, -0.1, 9.0]])
    t = torch.tensor([[-2.0, -1.0, -0.5], [-1.0, -0.2, 5.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    adv = reverse_kl_advantages(s, t, mask, coef=0.5)
    # -0.5 * (log pi_s - log pi_t); padding (the 9 vs 5) is 0
    expected = torch.tensor([[-0.5, 0.5, 0.0], [1.0, -0.05, 0.0]])
    assert torch.allclose(adv, expected)
    # The student liking a token more than the teacher is pushed down; less, pushed up.
    assert adv[0, 0] < 0 < adv[0, 1]


def test_outcome_advantage_is_broadcast_and_weighted() -> None:
    s = torch.zeros(2, 3)
    t = torch.full((2, 3), -1.0)  # the student likes every token 1 nat more than the teacher
    mask = torch.tensor([[True, True, False], [True, True, True]])
    adv = distillation_advantages(torch.tensor([2.0, -1.0]), s, t, mask, coef=1.0, outcome_weight=0.5)
    assert torch.allclose(adv, torch.tensor([[0.0, 0.0, 0.0], [-1.5, -1.5, -1.5]]))
    per_token = torch.arange(6.0).reshape(2, 3)
    pure = distillation_advantages(per_token, s, t, mask, coef=2.0, outcome_weight=0.0)
    assert torch.allclose(pure, torch.where(mask, -2.0, 0.0))


def test_bad_inputs_name_the_argument() -> None:
    with pytest.raises(ValueError, match="teacher_logprobs"):
        reverse_kl_advantages(torch.zeros(2, 3), torch.zeros(2, 4), torch.ones(2, 3))
    with pytest.raises(ValueError, match="coef"):
        reverse_kl_advantages(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1), coef=-1.0)
    with pytest.raises(ValueError, match="teacher_logprobs"):
        reverse_kl_advantages(torch.zeros(1, 2), torch.tensor([[0.0, float("nan")]]), torch.ones(1, 2))
    # Non-finite values at padding are not looked at.
    out = reverse_kl_advantages(torch.zeros(1, 2), torch.tensor([[0.0, float("nan")]]),
                                torch.tensor([[1, 0]]))
    assert out.tolist() == [[0.0, 0.0]]
    with pytest.raises(ValueError, match="outcome"):
        distillation_advantages(torch.zeros(3), torch.zeros(2, 2), torch.zeros(2, 2), torch.ones(2, 2))


def test_full_reverse_kl_closed_form() -> None:
    from scalerl.algorithms.distill import full_reverse_kl

    # two tokens: student (0.75, 0.25), teacher (0.5, 0.5): KL = 0.75 ln 1.5 + 0.25 ln 0.5
    s = torch.log(torch.tensor([[0.75, 0.25]])) + 3.0  # logits: any shift is the same distribution
    t = torch.log(torch.tensor([[0.5, 0.5]]))
    kl = full_reverse_kl(s, t)
    assert kl.shape == (1,)
    assert kl.item() == pytest.approx(0.75 * math.log(1.5) + 0.25 * math.log(0.5), abs=1e-6)
    # zero for equal distributions, not symmetric, a -inf student logit contributes nothing
    assert full_reverse_kl(t, t).item() == pytest.approx(0.0, abs=1e-7)
    assert full_reverse_kl(t, s).item() != pytest.approx(kl.item(), abs=1e-3)
    masked = torch.tensor([[0.0, float("-inf")]])
    assert full_reverse_kl(masked, t).item() == pytest.approx(math.log(2.0), abs=1e-6)
    # a NaN on either side is NaN at its own position only, never cleared to 0
    nan_rows = full_reverse_kl(torch.tensor([[0.0, math.nan], [0.0, 1.0]]), torch.zeros(2, 2))
    assert math.isnan(nan_rows[0].item()) and math.isfinite(nan_rows[1].item())
    assert math.isnan(full_reverse_kl(torch.zeros(1, 2), torch.tensor([[math.nan, 0.0]])).item())
    # its gradient is the closed form: dKL/ds_v = p_v (log p_v - log q_v - KL)
    s = torch.randn(3, 5, requires_grad=True)
    t = torch.randn(3, 5)
    full_reverse_kl(s, t).sum().backward()
    p, log_p, log_q = s.softmax(-1), s.log_softmax(-1), t.log_softmax(-1)
    kl = (p * (log_p - log_q)).sum(-1, keepdim=True)
    assert torch.allclose(s.grad, (p * (log_p - log_q - kl)).detach(), atol=1e-6)
    with pytest.raises(ValueError, match="teacher_logits"):
        full_reverse_kl(torch.zeros(2, 3), torch.zeros(2, 4))
