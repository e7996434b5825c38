"""kl_penalty and kl_shaped_rewards: closed-form values and gradients, padding, options."""

from __future__ import annotations

import math

import pytest
import torch

from scalerl.algorithms import kl_penalty, kl_shaped_rewards, token_weights, weighted_token_sum

F64 = torch.float64
LN2 = math.log(2.0)


def _one_token() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    # pi = 1/4, pi_ref = 1/2, pi_old = 1/2: d = log(pi_ref / pi) = ln 2, r = 2, pi / pi_old = 1/2.
    lp = torch.tensor([[math.log(0.25)]], dtype=F64, requires_grad=True)
    ref = torch.tensor([[math.log(0.5)]], dtype=F64)
    old = torch.tensor([[math.log(0.5)]], dtype=F64)
    return lp, ref, old


@pytest.mark.parametrize(
    ("estimator", "value", "grad"),
    [
        ("k1", -LN2, 1.0),  # -d ; d/dlogp = 1
        ("k2", LN2**2 / 2, -LN2),  # d^2 / 2 ; logp - logp_ref
        ("k3", 1.0 - LN2, -1.0),  # (r - 1) - d ; 1 - r
        ("unbiased_k3", 0.5 * (1.0 - LN2), 0.5 * -LN2),  # (pi/pi_old) k3 ; (pi/pi_old)(logp - logp_ref)
    ],
)
def test_estimators_closed_form(estimator: str, value: float, grad: float) -> None:
    lp, ref, old = _one_token()
    kl = kl_penalty(lp, ref, estimator, old_logprobs=old if estimator == "unbiased_k3" else None)
    assert kl.item() == pytest.approx(value, rel=1e-12)
    (g,) = torch.autograd.grad(kl.sum(), lp)
    assert g.item() == pytest.approx(grad, rel=1e-12)


def test_k3_is_nonnegative_and_accurate_near_zero() -> None:
    lp = torch.tensor([[-1.0, -1.0, -1.0]], dtype=torch.float32)
    ref = lp + torch.tensor([[1e-4, -1e-4, 0.0]])
    kl = kl_penalty(lp, ref, "k3")
    assert (kl >= 0).all()
    # k3 ~ d^2/2 for small d; a naive exp(d) - 1 - d in float32 would lose every digit here.
    assert kl[0, 0].item() == pytest.approx(0.5e-8, rel=1e-2)
    assert kl[0, 2].item() == 0.0


def test_reference_and_old_policies_are_detached() -> None:
    lp, ref, old = _one_token()
    ref.requires_grad_(True)
    old.requires_grad_(True)
    kl_penalty(lp, ref, "unbiased_k3", old_logprobs=old).sum().backward()
    assert ref.grad is None and old.grad is None and lp.grad is not None


def test_mask_zeroes_padding_and_blocks_nan_gradients() -> None:
    lp = torch.tensor([[-1.0, float("nan")], [-0.5, -0.2]], dtype=F64, requires_grad=True)
    ref = torch.tensor([[-1.2, float("inf")], [-0.5, float("nan")]], dtype=F64)
    old = torch.tensor([[-1.1, float("nan")], [-0.4, 0.0]], dtype=F64)
    mask = torch.tensor([[True, False], [True, False]])
    for estimator in ("k1", "k2", "k3", "unbiased_k3"):
        kl = kl_penalty(lp, ref, estimator, old if estimator == "unbiased_k3" else None, mask=mask)
        assert kl[~mask].abs().sum().item() == 0.0 and torch.isfinite(kl).all()
        (g,) = torch.autograd.grad(kl.sum(), lp)
        assert torch.isfinite(g).all() and g[~mask].abs().sum().item() == 0.0


def test_kl_in_the_loss_uses_the_policy_aggregation_weights() -> None:
    lp = torch.tensor([[-1.0, -2.0, 0.0], [-0.5, 0.0, 0.0]], dtype=F64)
    ref = torch.tensor([[-1.5, -1.0, 0.0], [-0.25, 0.0, 0.0]], dtype=F64)
    mask = torch.tensor([[True, True, False], [True, False, False]])
    w = token_weights(mask, torch.tensor([0, 1]), "sample", dtype=F64)
    k1 = kl_penalty(lp, ref, "k1", mask=mask)
    # sample mean: ((0.5 + -1.0) / 2 + (-0.25) / 1) / 2
    assert weighted_token_sum(k1, w).item() == pytest.approx(((0.5 - 1.0) / 2 - 0.25) / 2)


def test_kl_shaped_rewards_subtract_the_sequence_log_ratio() -> None:
    rewards = torch.tensor([1.0, 0.0], dtype=F64)
    lp = torch.tensor([[-1.0, -2.0, 7.0], [-0.5, 9.0, 9.0]], dtype=F64, requires_grad=True)
    ref = torch.tensor([[-1.5, -1.0, 0.0], [-0.25, 0.0, 0.0]], dtype=F64)
    mask = torch.tensor([[True, True, False], [True, False, False]])
    out = kl_shaped_rewards(rewards, lp, ref, mask, beta=0.1)
    # log-ratios summed over response tokens: 0.5 - 1.0 = -0.5 and -0.25.
    torch.testing.assert_close(out, torch.tensor([1.0 + 0.05, 0.0 + 0.025], dtype=F64))
    assert not out.requires_grad


def test_unbiased_k3_needs_old_logprobs_and_others_reject_them() -> None:
    lp, ref, old = _one_token()
    with pytest.raises(ValueError, match=r"^old_logprobs: required for estimator='unbiased_k3'$"):
        kl_penalty(lp, ref, "unbiased_k3")
    with pytest.raises(ValueError, match=r"^old_logprobs: only used by estimator='unbiased_k3'"):
        kl_penalty(lp, ref, "k3", old_logprobs=old)


def test_without_mask_nan_anywhere_is_an_error() -> None:
    lp = torch.tensor([[-1.0, float("nan")]])
    with pytest.raises(ValueError, match=r"^logprobs: contains NaN at index \(0, 1\)$"):
        kl_penalty(lp, torch.zeros(1, 2))


def test_sample_kl_coefs_per_task_and_config_rules() -> None:
    from scalerl.algorithms.kl import sample_kl_coefs
    from scalerl.config import AlgorithmConfig, ConfigError, RunConfig

    got = sample_kl_coefs(["math", "code", "chat"], 3, 0.1, {"math": 0.0, "code": 0.02})
    assert got.tolist() == pytest.approx([0.0, 0.02, 0.1])
    assert sample_kl_coefs(None, 2, 0.1, {"math": 0.0}).tolist() == pytest.approx([0.1, 0.1])
    with pytest.raises(ValueError, match="2 task names for 3 samples"):
        sample_kl_coefs(["a", "b"], 3, 0.1, {})
    assert AlgorithmConfig(kl_coef_by_task={"math": 0.0}).kl_coef_by_task == {"math": 0.0}
    for bad, message in [({"kl_coef_by_task": {"code": -0.1}}, "must be >= 0"),
                         ({"kl_coef_by_task": {"code": 0.1}, "kl_coef": 0.1, "kl_in_reward": True},
                          "with kl_in_reward use kl_coef")]:
        with pytest.raises((ConfigError, ValueError), match=message):
            RunConfig.model_validate({"algorithm": bad})
