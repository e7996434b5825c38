"""Advantage baselines: RLOO's leave-one-out identity, REINFORCE++'s global normalisation, whitening."""

from __future__ import annotations

import math

import pytest
import torch

from scalerl.algorithms import compute_advantages, masked_whiten

REWARDS = [1.0, 0.0, 1.0, 0.0, 1.0, 1.0, 0.0, 0.5, 0.3, 0.9]
GROUPS = [5, 5, 5, 5, 2, 2, 2, 9, 4, 4]


def _brute_force_loo(rewards: list[float], groups: list[int]) -> list[float]:
    out = []
    for i, (r, g) in enumerate(zip(rewards, groups, strict=True)):
        others = [rj for j, (rj, gj) in enumerate(zip(rewards, groups, strict=True)) if gj == g and j != i]
        out.append(r - sum(others) / len(others) if others else 0.0)
    return out


def test_leave_one_out_is_reward_minus_the_mean_of_the_others() -> None:
    r = torch.tensor(REWARDS, dtype=torch.float64)
    g = torch.tensor(GROUPS)
    got = compute_advantages(r, g, "none", baseline="leave_one_out")
    assert got.tolist() == pytest.approx(_brute_force_loo(REWARDS, GROUPS), rel=1e-12, abs=1e-15)


def test_rloo_identity_scaled_group_centering_and_zero_sum() -> None:
    # A_i = r_i - mean_{j != i} r_j = n / (n - 1) (r_i - mean_g), and every group sums to 0.
    gen = torch.Generator().manual_seed(0)
    r = torch.rand(40, generator=gen, dtype=torch.float64)
    g = torch.arange(40) // 5
    loo = compute_advantages(r, g, "none", baseline="leave_one_out")
    grpo = compute_advantages(r, g, "none", baseline="group_mean")
    torch.testing.assert_close(loo, grpo * 5 / 4)
    sums = torch.zeros(8, dtype=torch.float64).index_add(0, g, loo)
    torch.testing.assert_close(sums, torch.zeros(8, dtype=torch.float64), atol=1e-14, rtol=0)


def test_leave_one_out_group_norm_equals_grpo_without_eps() -> None:
    r = torch.tensor(REWARDS, dtype=torch.float64)
    g = torch.tensor(GROUPS)
    torch.testing.assert_close(
        compute_advantages(r, g, "group", eps=0.0, baseline="leave_one_out"),
        compute_advantages(r, g, "group", eps=0.0),
    )


def test_leave_one_out_batch_norm_divides_by_the_batch_std() -> None:
    r = torch.tensor(REWARDS, dtype=torch.float64)
    g = torch.tensor(GROUPS)
    loo = torch.tensor(_brute_force_loo(REWARDS, GROUPS), dtype=torch.float64)
    got = compute_advantages(r, g, "batch", eps=0.0, baseline="leave_one_out")
    torch.testing.assert_close(got, loo / loo.std())


def test_constant_and_single_groups_stay_exactly_zero_under_leave_one_out() -> None:
    r = torch.tensor([0.1, 0.1, 0.1, 0.7, 1.0, 0.0], dtype=torch.float32)
    g = torch.tensor([0, 0, 0, 1, 2, 2])
    for adv_norm in ("none", "group", "batch"):
        out = compute_advantages(r, g, adv_norm, eps=0.0, baseline="leave_one_out")
        assert out[:4].tolist() == [0.0] * 4
        assert out[4] > 0 > out[5]


def test_no_baseline_with_batch_norm_is_reinforce_pp_global_normalisation() -> None:
    # Hu 2025 (REINFORCE++) eq. 10 on outcome rewards: (r - mean_batch) / std_batch.
    r = torch.tensor(REWARDS, dtype=torch.float64)
    g = torch.tensor(GROUPS)
    got = compute_advantages(r, g, "batch", eps=0.0, baseline="none")
    torch.testing.assert_close(got, (r - r.mean()) / r.std())
    # Group ids play no part without a per-prompt baseline.
    ungrouped = compute_advantages(r, torch.arange(10), "batch", eps=0.0, baseline="none")
    torch.testing.assert_close(ungrouped, got)
    assert compute_advantages(r, g, "none", baseline="none").tolist() == REWARDS


def test_group_mean_baseline_with_batch_norm_is_unchanged_scalerl_batch() -> None:
    r = torch.tensor(REWARDS, dtype=torch.float64)
    g = torch.tensor(GROUPS)
    torch.testing.assert_close(
        compute_advantages(r, g, "batch", baseline="group_mean"), compute_advantages(r, g, "batch")
    )


def test_no_baseline_needs_no_group_norm() -> None:
    with pytest.raises(ValueError, match="adv_norm: 'group' divides group-centred advantages"):
        compute_advantages(torch.ones(4), torch.tensor([0, 0, 1, 1]), "group", baseline="none")
    with pytest.raises(ValueError, match="baseline: unknown 'critic'; expected one of"):
        compute_advantages(torch.ones(4), torch.tensor([0, 0, 1, 1]), "none", baseline="critic")


def test_masked_whiten_is_token_weighted_and_zero_at_padding() -> None:
    values = torch.tensor([[1.0, 1.0, 1.0, math.nan], [0.0, math.inf, 5.0, 5.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]], dtype=torch.bool)
    got = masked_whiten(values, mask, eps=0.0)
    picked = torch.tensor([1.0, 1.0, 1.0, 0.0], dtype=torch.float64)
    want = (picked - picked.mean()) / picked.std()
    assert got[mask].tolist() == pytest.approx(want.tolist(), rel=1e-12)
    assert got[~mask].tolist() == [0.0] * 4
    assert float(got[mask].mean()) == pytest.approx(0.0, abs=1e-15)


def test_masked_whiten_without_spread_is_zero() -> None:
    v = torch.full((2, 3), 0.7)
    assert masked_whiten(v, torch.ones(2, 3, dtype=torch.bool), eps=0.0).tolist() == [[0.0] * 3] * 2
    assert masked_whiten(v, torch.tensor([[1, 0, 0], [0, 0, 0]]), eps=0.0).tolist() == [[0.0] * 3] * 2
    with pytest.raises(ValueError, match="mask: expected shape"):
        masked_whiten(v, torch.ones(2, 2))
