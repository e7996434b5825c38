"""compute_advantages: closed-form values for every normalisation, edge cases, dtypes."""

from __future__ import annotations

import math

import pytest
import torch

from scalerl.algorithms import compute_advantages

# Group 5: [1, 0, 1, 0] (mean 1/2, unbiased std sqrt(1/3)); group 2: [1, 1, 0] (mean 2/3, unbiased
# std sqrt(1/3)); group 9: a single sample.
REWARDS = [1.0, 0.0, 1.0, 0.0, 1.0, 1.0, 0.0, 0.5]
GROUPS = [5, 5, 5, 5, 2, 2, 2, 9]
CENTERED = [0.5, -0.5, 0.5, -0.5, 1 / 3, 1 / 3, -2 / 3, 0.0]


def _inputs(dtype: torch.dtype = torch.float64) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.tensor(REWARDS, dtype=dtype), torch.tensor(GROUPS)


def test_group_norm_closed_form() -> None:
    r, g = _inputs()
    s3 = math.sqrt(3.0)
    expected = [0.5 * s3, -0.5 * s3, 0.5 * s3, -0.5 * s3, s3 / 3, s3 / 3, -2 * s3 / 3, 0.0]
    torch.testing.assert_close(
        compute_advantages(r, g, "group", eps=0.0), torch.tensor(expected, dtype=r.dtype)
    )


def test_group_norm_eps_in_denominator() -> None:
    r, g = _inputs()
    eps = 0.1
    std = math.sqrt(1 / 3)
    out = compute_advantages(r, g, adv_norm="group", eps=eps)
    assert out[0].item() == pytest.approx(0.5 / (std + eps), rel=1e-12)
    assert out[6].item() == pytest.approx((-2 / 3) / (std + eps), rel=1e-12)


def test_none_norm_is_dr_grpo_centering() -> None:
    r, g = _inputs()
    torch.testing.assert_close(compute_advantages(r, g, "none"), torch.tensor(CENTERED, dtype=r.dtype))


def test_batch_norm_closed_form() -> None:
    r, g = _inputs()
    # Unbiased std of CENTERED (whose mean is 0): sqrt((4 * 1/4 + 1/9 + 1/9 + 4/9) / 7) = sqrt(5/21).
    std = math.sqrt(5 / 21)
    expected = torch.tensor([c / std for c in CENTERED], dtype=r.dtype)
    torch.testing.assert_close(compute_advantages(r, g, "batch", eps=0.0), expected)
    eps = 0.25
    torch.testing.assert_close(
        compute_advantages(r, g, "batch", eps=eps),
        torch.tensor([c / (std + eps) for c in CENTERED], dtype=r.dtype),
    )


@pytest.mark.parametrize("adv_norm", ["group", "batch", "none"])
def test_singleton_and_constant_groups_get_exact_zero(adv_norm: str) -> None:
    # 0.1 * 3 / 3 != 0.1 in floating point: the constant group must still come out exactly 0.
    r = torch.tensor([0.1, 0.1, 0.1, 0.7, 1.0, 0.0], dtype=torch.float32)
    g = torch.tensor([0, 0, 0, 1, 2, 2])
    out = compute_advantages(r, g, adv_norm, eps=0.0)
    assert out[:4].tolist() == [0.0, 0.0, 0.0, 0.0]
    assert out[4] > 0 > out[5]


def test_group_ids_need_not_be_sorted_or_contiguous() -> None:
    r, g = _inputs()
    perm = torch.tensor([7, 2, 5, 0, 3, 6, 1, 4])
    for adv_norm in ("group", "batch", "none"):
        full = compute_advantages(r, g, adv_norm)
        shuffled = compute_advantages(r[perm], g[perm] * 1000 - 3, adv_norm)
        torch.testing.assert_close(shuffled, full[perm])


def test_float32_and_float64_agree() -> None:
    gen = torch.Generator().manual_seed(3)
    r = torch.rand(64, generator=gen, dtype=torch.float64)
    g = torch.randint(0, 9, (64,), generator=gen)
    for adv_norm in ("group", "batch", "none"):
        a64 = compute_advantages(r, g, adv_norm)
        a32 = compute_advantages(r.float(), g, adv_norm)
        assert a32.dtype == torch.float32
        torch.testing.assert_close(a32.double(), a64, rtol=1e-5, atol=1e-5)


def test_single_sample_batch_and_empty_batch() -> None:
    one = compute_advantages(torch.tensor([3.0]), torch.tensor([0]), "batch")
    assert one.tolist() == [0.0]
    empty = compute_advantages(torch.zeros(0), torch.zeros(0, dtype=torch.long), "group")
    assert empty.shape == (0,)


def test_rewards_are_not_differentiated_through() -> None:
    r = torch.tensor([1.0, 0.0], requires_grad=True)
    assert not compute_advantages(r, torch.tensor([0, 0])).requires_grad
