"""Per-token rewards, reward-to-go and GAE against a plain reference loop; VAPO's length-adaptive lambda."""

from __future__ import annotations

import math

import pytest
import torch

from scalerl.algorithms import (
    discounted_returns,
    gae_advantages,
    last_step_index,
    length_adaptive_lambda,
    token_rewards,
)


def _reference_gae(rewards: list[float], values: list[float], gamma: float, lam: float) -> tuple[list, list]:
    """Textbook GAE over one trajectory's steps (Schulman et al. 2016, eq. 16), V = 0 after the end."""
    n = len(rewards)
    adv = [0.0] * n
    running = 0.0
    for t in reversed(range(n)):
        next_v = values[t + 1] if t + 1 < n else 0.0
        delta = rewards[t] + gamma * next_v - values[t]
        running = delta + gamma * lam * running
        adv[t] = running
    return adv, [a + v for a, v in zip(adv, values, strict=True)]


def _random_case(seed: int, n: int = 5, t: int = 9, holes: bool = True):
    gen = torch.Generator().manual_seed(seed)
    rewards = torch.randn(n, t, generator=gen, dtype=torch.float64)
    values = torch.randn(n, t, generator=gen, dtype=torch.float64)
    lengths = torch.randint(0, t + 1, (n,), generator=gen)
    mask = torch.arange(t)[None, :] < lengths[:, None]
    if holes:
        # Environment / forced tokens inside a response are not steps.
        mask &= torch.rand(n, t, generator=gen) > 0.25
    # Padding holds garbage: it must not leak into any step.
    rewards = torch.where(mask, rewards, torch.full_like(rewards, math.nan))
    values = torch.where(mask, values, torch.full_like(values, math.inf))
    return rewards, values, mask


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize(("gamma", "lam"), [(1.0, 1.0), (0.9, 0.95), (1.0, 0.0), (0.5, 0.7)])
def test_gae_matches_the_reference_loop_over_each_rows_steps(seed: int, gamma: float, lam: float) -> None:
    rewards, values, mask = _random_case(seed)
    adv, ret = gae_advantages(rewards, values, mask, gamma, lam)
    for i in range(rewards.shape[0]):
        steps = torch.nonzero(mask[i]).flatten().tolist()
        ref_adv, ref_ret = _reference_gae([float(rewards[i, s]) for s in steps],
                                          [float(values[i, s]) for s in steps], gamma, lam)
        assert adv[i, steps].tolist() == pytest.approx(ref_adv, rel=1e-12, abs=1e-12)
        assert ret[i, steps].tolist() == pytest.approx(ref_ret, rel=1e-12, abs=1e-12)
        off = ~mask[i]
        zeros = [0.0] * int(off.sum())
        assert adv[i, off].tolist() == zeros and ret[i, off].tolist() == zeros


def test_gae_with_gamma_and_lambda_one_is_return_minus_value() -> None:
    # Open-Reasoner-Zero's setting: A_t = sum_{s >= t} r_s - V_t.
    rewards = torch.tensor([[0.0, 0.0, 0.0, 1.0], [0.0, 2.0, 0.0, 0.0]], dtype=torch.float64)
    values = torch.tensor([[0.1, 0.2, 0.3, 0.4], [0.5, 0.6, 0.7, 0.8]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]], dtype=torch.bool)
    adv, ret = gae_advantages(rewards, values, mask, 1.0, 1.0)
    f64 = torch.float64
    torch.testing.assert_close(adv, torch.tensor([[0.9, 0.8, 0.7, 0.6], [1.5, 1.4, 0.0, 0.0]], dtype=f64))
    torch.testing.assert_close(ret, torch.tensor([[1.0, 1.0, 1.0, 1.0], [2.0, 2.0, 0.0, 0.0]], dtype=f64))


def test_gae_lambda_zero_is_one_step_td() -> None:
    rewards, values, mask = _random_case(7, holes=False)
    adv, _ = gae_advantages(rewards, values, mask, 0.9, 0.0)
    r = torch.where(mask, rewards, 0.0)
    v = torch.where(mask, values, 0.0)
    next_v = torch.cat([v[:, 1:], torch.zeros_like(v[:, :1])], dim=1) * torch.cat(
        [mask[:, 1:], torch.zeros_like(mask[:, :1])], dim=1)
    torch.testing.assert_close(adv, torch.where(mask, r + 0.9 * next_v - v, 0.0))


def test_per_sample_lambda_equals_running_each_row_with_its_own() -> None:
    rewards, values, mask = _random_case(11)
    lam = torch.tensor([0.0, 0.3, 0.9, 1.0, 0.5], dtype=torch.float64)
    adv, ret = gae_advantages(rewards, values, mask, 0.95, lam)
    for i in range(5):
        a_i, r_i = gae_advantages(rewards[i : i + 1], values[i : i + 1], mask[i : i + 1], 0.95, float(lam[i]))
        torch.testing.assert_close(adv[i : i + 1], a_i)
        torch.testing.assert_close(ret[i : i + 1], r_i)


def test_gae_is_detached_and_keeps_the_dtype() -> None:
    rewards = torch.zeros(2, 3, requires_grad=True)
    values = torch.ones(2, 3, requires_grad=True)
    adv, ret = gae_advantages(rewards, values, torch.ones(2, 3, dtype=torch.bool))
    assert not adv.requires_grad and not ret.requires_grad and adv.dtype == torch.float32


def test_token_rewards_put_the_outcome_on_the_last_step_and_subtract_the_penalty() -> None:
    mask = torch.tensor([[1, 1, 0, 1, 0], [1, 0, 0, 0, 0], [0, 0, 0, 0, 0]], dtype=torch.bool)
    outcome = torch.tensor([1.0, -2.0, 5.0], dtype=torch.float64)
    assert last_step_index(mask).tolist() == [3, 0, -1]
    out = token_rewards(outcome, mask)
    assert out.tolist() == [[0, 0, 0, 1, 0], [-2, 0, 0, 0, 0], [0, 0, 0, 0, 0]]
    penalty = torch.full((3, 5), 0.25, dtype=torch.float64)
    penalty[0, 2] = math.nan  # not a step: ignored
    out = token_rewards(outcome, mask, penalty)
    assert out.tolist() == [[-0.25, -0.25, 0, 0.75, 0], [-2.25, 0, 0, 0, 0], [0, 0, 0, 0, 0]]


def test_reinforce_pp_return_is_reward_minus_kl_to_go() -> None:
    # Hu 2025 eq. 8 with gamma = 1: G_t = r - beta * sum_{s >= t} KL_s.
    gen = torch.Generator().manual_seed(0)
    kl = torch.rand(3, 6, generator=gen, dtype=torch.float64)
    mask = torch.tensor([[1] * 6, [1, 1, 1, 0, 0, 0], [1, 0, 1, 1, 0, 0]], dtype=torch.bool)
    r = torch.tensor([1.0, 0.0, 1.0], dtype=torch.float64)
    beta = 0.1
    got = discounted_returns(token_rewards(r, mask, beta * kl), mask, gamma=1.0)
    for i in range(3):
        steps = torch.nonzero(mask[i]).flatten().tolist()
        for k, s in enumerate(steps):
            want = float(r[i]) - beta * sum(float(kl[i, u]) for u in steps[k:])
            assert float(got[i, s]) == pytest.approx(want, rel=1e-12)


def test_discounted_returns_with_gamma() -> None:
    rewards = torch.tensor([[1.0, 0.0, 2.0]], dtype=torch.float64)
    got = discounted_returns(rewards, torch.ones(1, 3, dtype=torch.bool), gamma=0.5)
    assert got.tolist() == [[1.0 + 0.25 * 2.0, 1.0, 2.0]]


def test_length_adaptive_lambda_closed_form() -> None:
    lens = torch.tensor([0, 10, 20, 40, 200, 1000])
    got = length_adaptive_lambda(lens, alpha=0.05)
    # 1 - 1 / (0.05 l): l = 20 -> 0, l = 40 -> 0.5, l = 200 -> 0.9, l = 1000 -> 0.98; clamped at 0.
    assert got.tolist() == pytest.approx([0.0, 0.0, 0.0, 0.5, 0.9, 0.98], abs=1e-12)
    # The effective horizon 1 / (1 - lambda) grows as alpha * l.
    assert 1 / (1 - float(got[4])) == pytest.approx(0.05 * 200)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: gae_advantages(torch.zeros(2, 3), torch.zeros(2, 4), torch.ones(2, 3)),
         "values: expected shape"),
        (lambda: gae_advantages(torch.zeros(2, 3), torch.zeros(2, 3), torch.ones(2, 2)),
         "mask: expected shape"),
        (lambda: gae_advantages(torch.zeros(2, 3), torch.zeros(2, 3), torch.ones(2, 3), gamma=1.5), "gamma:"),
        (lambda: gae_advantages(torch.zeros(2, 3), torch.zeros(2, 3), torch.ones(2, 3), lam=-0.1), "lam:"),
        (lambda: gae_advantages(torch.zeros(2, 3), torch.zeros(2, 3), torch.ones(2, 3), lam=torch.ones(3)),
         r"lam: expected shape \[N\] = \(2,\)"),
        (lambda: gae_advantages(torch.tensor([[math.nan]]), torch.zeros(1, 1), torch.ones(1, 1)),
         "rewards: contains NaN at index"),
        (lambda: token_rewards(torch.zeros(2), torch.ones(3, 4)), "mask: expected shape"),
        (lambda: token_rewards(torch.zeros(2), torch.ones(2, 4), torch.zeros(2, 3)),
         "penalty: expected shape"),
        (lambda: length_adaptive_lambda(torch.tensor([1, -1]), 0.05), "lengths: expected non-negative"),
        (lambda: length_adaptive_lambda(torch.tensor([10]), 0.0), "alpha:"),
    ],
)
def test_bad_input_names_the_argument(call, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        call()
