"""On-policy distillation's advantage (scalerl.algorithms.distill): closed forms and shape rules."""

from __future__ import annotations

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
