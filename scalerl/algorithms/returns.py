"""Per-token rewards, returns and advantages along a response: reward-to-go, GAE, VAPO's lambda.

A response is a trajectory whose steps are its loss tokens (`mask` True). Tokens the policy did
not choose (padding; environment or forced tokens, `mask` False) are not steps: a step's successor
is the next masked position, so a multi-turn trajectory's observation tokens are skipped rather
than treated as actions. Rewards are per step (`[N, T]`): the outcome reward on the last step,
optionally minus a per-token penalty (REINFORCE++'s KL in the reward).

Shapes: `[N, T]` per token, `[N]` per sample; everything returned is detached and exactly 0 at
positions where `mask` is False.
"""

from __future__ import annotations

import torch
from torch import Tensor

from scalerl.algorithms._checks import (
    as_bool_mask,
    check_finite,
    check_float_tensor,
    check_number,
    check_same_shape,
    check_tensor,
)


def _check_mask_2d(mask: object, ref: Tensor, ref_name: str) -> Tensor:
    return as_bool_mask("mask", mask, ref_name, ref)


def last_step_index(mask: Tensor) -> Tensor:
    """Index of each row's last True position, -1 for a row without any.

    Shapes: `mask [N, T]` (bool) -> `[N]` (int64).
    """
    m = check_tensor("mask", mask)
    if m.dim() != 2:
        raise ValueError(f"mask: expected a 2-D tensor [N, T], got shape {tuple(m.shape)}")
    m = m.bool()
    if m.shape[1] == 0:
        return torch.full((m.shape[0],), -1, dtype=torch.long, device=m.device)
    positions = torch.arange(m.shape[1], device=m.device).expand_as(m)
    return torch.where(m, positions, torch.full_like(positions, -1)).max(dim=1).values


def token_rewards(outcome: Tensor, mask: Tensor, penalty: Tensor | None = None) -> Tensor:
    """Per-step rewards: the outcome reward on the last step, minus a per-token penalty.

    `r_{i,t} = [t = last_i] * R_i - p_{i,t}` on steps (`mask` True), 0 elsewhere. With
    `p = beta * KL_t`, the KL estimate of each token, this is REINFORCE++'s token-level reward
    (Hu 2025, arXiv 2501.03262, §3 eq. 8-9; PPO-RLHF, Ouyang et al. 2022, arXiv 2203.02155) and
    Open-Reasoner-Zero's `[0, ..., 0, r]` score tensor without one. A row without steps gets nothing.

    Shapes: `outcome [N]` (float), `mask [N, T]`, `penalty [N, T]` (float) -> `[N, T]` in
    `outcome`'s dtype.
    """
    r = check_float_tensor("outcome", outcome, ndim=1, dims="[N]")
    check_finite("outcome", r)
    m = check_tensor("mask", mask)
    if m.dim() != 2 or m.shape[0] != r.shape[0]:
        raise ValueError(
            f"mask: expected shape [N, T] with N = {r.shape[0]} matching outcome, got {tuple(m.shape)}"
        )
    m = as_bool_mask("mask", m, "mask", m)
    out = torch.zeros(m.shape, dtype=r.dtype, device=r.device)
    last = last_step_index(m)
    rows = torch.nonzero(last >= 0).flatten()
    out[rows, last[rows]] = r.detach()[rows]
    if penalty is not None:
        p = check_float_tensor("penalty", penalty)
        check_same_shape("penalty", p, "mask", m, "[N, T]")
        check_finite("penalty", p.detach(), m)
        out = out - torch.where(m, p.detach().to(r.dtype), torch.zeros_like(out))
    return out


def _lambda_per_row(lam: float | Tensor, n: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    if isinstance(lam, Tensor):
        t = check_float_tensor("lam", lam, ndim=1, dims="[N]")
        if t.shape[0] != n:
            raise ValueError(f"lam: expected shape [N] = ({n},) matching rewards, got {tuple(t.shape)}")
        check_finite("lam", t)
        if bool(((t < 0) | (t > 1)).any()):
            raise ValueError("lam: expected values in [0, 1]")
        return t.detach().to(dtype=dtype, device=device)
    check_number("lam", lam, low=0.0, high=1.0)
    return torch.full((n,), float(lam), dtype=dtype, device=device)


def gae_advantages(
    rewards: Tensor,
    values: Tensor,
    mask: Tensor,
    gamma: float = 1.0,
    lam: float | Tensor = 1.0,
) -> tuple[Tensor, Tensor]:
    """Generalized advantage estimation and the value targets, over each response's steps.

    With `t'` the step after `t` (the next masked position) and `V_{t'} = 0` after the last step
    (the episode ends there): `delta_t = r_t + gamma V_{t'} - V_t`,
    `A_t = delta_t + gamma lambda A_{t'}`, and the return (value target) `R_t = A_t + V_t`
    (Schulman et al. 2016, arXiv 1506.02438, eq. 16; PPO, arXiv 1707.06347, eq. 11-12).
    With `gamma = lambda = 1` (Open-Reasoner-Zero, Hu et al. 2025, arXiv 2503.24290, §2.2)
    `A_t = sum_{s >= t} r_s - V_t`: the Monte-Carlo return minus the critic's baseline.

    `lam` is a number or one value per sample (`[N]`, e.g. `length_adaptive_lambda`), in [0, 1].

    Shapes: `rewards, values [N, T]` (float), `mask [N, T]`, `lam` number or `[N]` ->
    (`advantages [N, T]`, `returns [N, T]`), both in `rewards`' dtype.
    """
    r = check_float_tensor("rewards", rewards, ndim=2, dims="[N, T]")
    v = check_float_tensor("values", values)
    check_same_shape("values", v, "rewards", r, "[N, T]")
    m = _check_mask_2d(mask, r, "rewards")
    check_finite("rewards", r.detach(), m)
    check_finite("values", v.detach(), m)
    check_number("gamma", gamma, low=0.0, high=1.0)
    n, length = r.shape
    lam_row = _lambda_per_row(lam, n, r.dtype, r.device)
    zero = torch.zeros_like(r)
    r = torch.where(m, r.detach(), zero)
    v = torch.where(m, v.detach().to(r.dtype), zero)

    adv = torch.zeros_like(r)
    next_value = torch.zeros(n, dtype=r.dtype, device=r.device)
    next_adv = torch.zeros(n, dtype=r.dtype, device=r.device)
    for t in range(length - 1, -1, -1):
        step = m[:, t]
        delta = r[:, t] + gamma * next_value - v[:, t]
        a = delta + gamma * lam_row * next_adv
        adv[:, t] = torch.where(step, a, zero[:, t])
        next_value = torch.where(step, v[:, t], next_value)
        next_adv = torch.where(step, a, next_adv)
    returns = torch.where(m, adv + v, zero)
    return adv, returns


def discounted_returns(rewards: Tensor, mask: Tensor, gamma: float = 1.0) -> Tensor:
    """Reward-to-go `G_t = r_t + gamma G_{t'}` over each response's steps (`G = 0` after the last).

    REINFORCE++'s per-token return (Hu 2025, arXiv 2501.03262, §3 eq. 8: with `gamma = 1` and
    token rewards `[t = T] r - beta KL_t`, `G_t = r - beta sum_{s >= t} KL_s`). Equal to
    `gae_advantages` with zero values and `lambda = 1`.

    Shapes: `rewards [N, T]` (float), `mask [N, T]` -> `[N, T]` in `rewards`' dtype.
    """
    r = check_float_tensor("rewards", rewards, ndim=2, dims="[N, T]")
    adv, _ = gae_advantages(r, torch.zeros_like(r), mask, gamma, 1.0)
    return adv


def length_adaptive_lambda(lengths: Tensor, alpha: float) -> Tensor:
    """VAPO's length-adaptive GAE lambda for the policy: `lambda_i = 1 - 1 / (alpha * l_i)`.

    Chosen so that the sum of the GAE weights, `1 / (1 - lambda)`, grows with the response length
    `l_i` as `alpha * l_i` (VAPO, Yue et al. 2025, arXiv 2504.05118, §4.2 eq. 8; alpha = 0.05
    there). Clamped to [0, 1]: a response shorter than `1 / alpha` tokens gets `lambda = 0`
    (one-step TD), an empty one 0.

    Shapes: `lengths [N]` (int or float) -> `[N]` float64.
    """
    t = check_tensor("lengths", lengths)
    if t.dtype == torch.bool or t.is_complex() or t.dim() != 1:
        raise ValueError(
            f"lengths: expected a 1-D integer or float tensor [N], got {t.dtype} {tuple(t.shape)}"
        )
    if bool((t < 0).any()):
        raise ValueError(f"lengths: expected non-negative lengths, got {float(t.min()):g}")
    check_number("alpha", alpha, low=0.0, low_inclusive=False)
    lens = t.to(torch.float64)
    lam = 1.0 - 1.0 / (alpha * lens.clamp(min=1e-12))
    return torch.where(lens > 0, lam, torch.zeros_like(lam)).clamp(min=0.0, max=1.0)
