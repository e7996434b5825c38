"""Length shaping: DAPO overlong penalty (correct samples only by default) and Kimi length reward."""

from __future__ import annotations

import pytest
import torch

from scalerl.algorithms import (
    apply_kimi_length_reward,
    apply_overlong_penalty,
    kimi_length_reward,
    overlong_penalty,
)

F64 = torch.float64


def test_overlong_penalty_closed_form() -> None:
    # L_max = 20, L_cache = 5: 0 up to 15 tokens, linear to -1 at 20, -1 beyond.
    lengths = torch.tensor([0, 10, 15, 16, 18, 20, 25])
    out = overlong_penalty(lengths, max_length=20, cache_length=5, dtype=F64)
    torch.testing.assert_close(out, torch.tensor([0.0, 0.0, 0.0, -0.2, -0.6, -1.0, -1.0], dtype=F64))
    assert overlong_penalty(lengths, 20, 5).dtype == torch.float32
    assert overlong_penalty(lengths.double(), 20, 5).tolist() == pytest.approx(out.tolist())


def test_overlong_penalty_added_to_correct_samples_only() -> None:
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0], dtype=F64)
    lengths = torch.tensor([18, 18, 10, 25])
    out = apply_overlong_penalty(rewards, lengths, 20, 5)
    torch.testing.assert_close(out, torch.tensor([0.4, 0.0, 1.0, 0.0], dtype=F64))
    every = apply_overlong_penalty(rewards, lengths, 20, 5, only_correct=False)
    torch.testing.assert_close(every, torch.tensor([0.4, -0.6, 1.0, -1.0], dtype=F64))
    # "correct" means reward > correct_threshold: with threshold 1, nothing is correct.
    torch.testing.assert_close(
        apply_overlong_penalty(rewards, lengths, 20, 5, correct_threshold=1.0), rewards
    )


def test_kimi_length_reward_closed_form() -> None:
    lengths = torch.tensor([10, 20, 30, 10, 30, 7, 5, 5])
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0, 0.0, 1.0, 1.0, 0.0], dtype=F64)
    groups = torch.tensor([0, 0, 0, 1, 1, 2, 3, 3])
    out = kimi_length_reward(lengths, rewards, groups)
    # group 0: lambda = 0.5, 0, -0.5 -> correct keeps lambda, incorrect gets min(0, lambda);
    # group 1 (both wrong): lambda = 0.5, -0.5 -> 0, -0.5; group 2 single and group 3 equal lengths: 0.
    expected = torch.tensor([0.5, 0.0, -0.5, 0.0, -0.5, 0.0, 0.0, 0.0], dtype=F64)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(
        apply_kimi_length_reward(rewards, lengths, groups, coef=0.1), rewards + 0.1 * expected
    )


def test_length_validation() -> None:
    with pytest.raises(ValueError, match=r"^cache_length: expected <= max_length=20, got 30$"):
        overlong_penalty(torch.tensor([1]), 20, 30)
    with pytest.raises(ValueError, match=r"^lengths: expected non-negative lengths, got -1$"):
        overlong_penalty(torch.tensor([-1, 3]), 20, 5)
    with pytest.raises(
        ValueError, match=r"^lengths: expected shape \[N\] = \(2,\) matching rewards, got \(3,\)$"
    ):
        apply_overlong_penalty(torch.zeros(2), torch.tensor([1, 2, 3]), 20, 5)
    with pytest.raises(ValueError, match=r"^rewards: contains NaN at index 1$"):
        kimi_length_reward(torch.tensor([1, 2]), torch.tensor([0.0, float("nan")]), torch.tensor([0, 0]))
