"""Response-length reward shaping: DAPO's soft overlong penalty and Kimi k1.5's length reward.

Both act on per-sample response lengths `[N]` (token counts) and rewards `[N]`. A sample is
*correct* when its reward is strictly greater than `correct_threshold` (default 0.0: with 0/1 or
-1/+1 verifier rewards, exactly the verified-correct samples). Pass the verifier's reward, before
any other shaping, so the threshold means what it says.
"""

from __future__ import annotations

import torch
from torch import Tensor

from scalerl.algorithms._checks import (
    check_finite,
    check_float_tensor,
    check_group_ids,
    check_number,
    check_positive_int,
    check_tensor,
)
from scalerl.algorithms._groups import group_index, group_min_max


def _check_lengths(lengths: object, n: int | None = None, ref_name: str = "rewards") -> Tensor:
    t = check_tensor("lengths", lengths)
    if t.dtype == torch.bool or t.is_complex():
        raise ValueError(f"lengths: expected an integer or floating-point tensor, got {t.dtype}")
    if t.dim() != 1:
        raise ValueError(f"lengths: expected a 1-D tensor [N], got shape {tuple(t.shape)}")
    if n is not None and t.shape[0] != n:
        raise ValueError(f"lengths: expected shape [N] = ({n},) matching {ref_name}, got {tuple(t.shape)}")
    if t.is_floating_point():
        check_finite("lengths", t)
    if bool((t < 0).any()):
        raise ValueError(f"lengths: expected non-negative lengths, got {float(t.min()):g}")
    return t


def _check_rewards(rewards: object) -> Tensor:
    r = check_float_tensor("rewards", rewards, ndim=1, dims="[N]")
    check_finite("rewards", r)
    return r


def overlong_penalty(
    lengths: Tensor,
    max_length: int,
    cache_length: int,
    *,
    dtype: torch.dtype = torch.float32,
) -> Tensor:
    """DAPO soft overlong punishment `R(y) = clip((L_max - |y|) / L_cache - 1, -1, 0)`.

    0 up to `L_max - L_cache` tokens, then linear down to -1 at `L_max`, and -1 beyond (DAPO, Yu et
    al. 2025, arXiv 2503.14476, §3.4 "Overlong Reward Shaping"). `max_length` is `L_max`, the
    generation budget; `cache_length` is `L_cache`, the punishment interval (`0 < L_cache <= L_max`).

    Shapes: `lengths [N]` (int or float) -> `[N]` in `dtype`.
    """
    lens = _check_lengths(lengths)
    check_positive_int("max_length", max_length)
    check_positive_int("cache_length", cache_length)
    if cache_length > max_length:
        raise ValueError(f"cache_length: expected <= max_length={max_length}, got {cache_length}")
    lens = lens.to(torch.float64)
    penalty = ((max_length - lens) / cache_length - 1.0).clamp(min=-1.0, max=0.0)
    return penalty.to(dtype)


def apply_overlong_penalty(
    rewards: Tensor,
    lengths: Tensor,
    max_length: int,
    cache_length: int,
    *,
    correct_threshold: float = 0.0,
    only_correct: bool = True,
) -> Tensor:
    """Rewards plus the DAPO overlong penalty, on correct samples only by default.

    `r'_i = r_i + [r_i > correct_threshold] * R(y_i)` with `R` from `overlong_penalty` — ScaleRL
    (Khatri et al. 2025, arXiv 2510.13786, App. A.10) adds the length penalty to correct samples
    only. With `only_correct=False` every sample is penalised, as in DAPO.

    Shapes: `rewards [N]` (float), `lengths [N]` -> `[N]` in `rewards`' dtype.
    """
    r = _check_rewards(rewards)
    lens = _check_lengths(lengths, r.shape[0])
    check_number("correct_threshold", correct_threshold)
    penalty = overlong_penalty(lens, max_length, cache_length, dtype=r.dtype)
    if only_correct:
        penalty = torch.where(r > correct_threshold, penalty, torch.zeros_like(penalty))
    return r.detach() + penalty


def kimi_length_reward(
    lengths: Tensor,
    rewards: Tensor,
    group_ids: Tensor,
    *,
    correct_threshold: float = 0.0,
) -> Tensor:
    """Kimi k1.5 length reward, relative to the other samples of the same prompt.

    `lambda_i = 0.5 - (len_i - min_len) / (max_len - min_len)` with the min/max over the sample's
    group; the reward is `lambda_i` for a correct sample and `min(0, lambda_i)` for an incorrect
    one (Kimi Team 2025, arXiv 2501.12599, §2.3.3 "Length Penalty"). A group whose lengths are
    all equal has no length signal: its `lambda` is defined as 0 (the formula is 0/0 there).

    Shapes: `lengths [N]`, `rewards [N]` (float), `group_ids [N]` (int) -> `[N]` in `rewards`' dtype.
    """
    r = _check_rewards(rewards)
    lens = _check_lengths(lengths, r.shape[0]).to(torch.float64)
    g = check_group_ids(group_ids, r.shape[0], "rewards")
    check_number("correct_threshold", correct_threshold)
    if r.numel() == 0:
        return r.detach().clone()
    inverse, n_groups = group_index(g)
    lo, hi = group_min_max(lens, inverse, n_groups)
    span = (hi - lo)[inverse]
    lam = torch.where(span > 0, 0.5 - (lens - lo[inverse]) / span, torch.zeros_like(lens))
    correct = r > correct_threshold
    out = torch.where(correct, lam, lam.clamp(max=0.0))
    return out.to(r.dtype)


def apply_kimi_length_reward(
    rewards: Tensor,
    lengths: Tensor,
    group_ids: Tensor,
    *,
    coef: float,
    correct_threshold: float = 0.0,
) -> Tensor:
    """Rewards plus the weighted Kimi k1.5 length reward: `r'_i = r_i + coef * len_reward_i`.

    Kimi k1.5 (arXiv 2501.12599, §2.3.3) adds the length reward with a weight and warms it up over
    training; schedule `coef` in the caller.

    Shapes: `rewards [N]` (float), `lengths [N]`, `group_ids [N]` -> `[N]` in `rewards`' dtype.
    """
    check_number("coef", coef)
    bonus = kimi_length_reward(lengths, rewards, group_ids, correct_threshold=correct_threshold)
    return rewards.detach() + coef * bonus


def kimi_length_coef(step: int, coef: float, warmup_steps: int = 0, ramp_steps: int = 0) -> float:
    """Weight of the Kimi k1.5 length reward at optimizer step `step` (0-based), with its warm-up.

    The report found the length penalty slows the start of training and warms it up: "standard
    policy optimization without length penalty, followed by a constant length penalty for the rest
    of training" (Kimi Team 2025, arXiv 2501.12599, §2.3.3). So `0` for `step < warmup_steps`,
    then `coef`; `ramp_steps > 0` replaces the step by a linear rise over that many steps:
    `coef * min(1, (step - warmup_steps + 1) / ramp_steps)`.
    """
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step: expected an integer >= 0, got {step!r}")
    check_number("coef", coef)
    for name, value in (("warmup_steps", warmup_steps), ("ramp_steps", ramp_steps)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name}: expected an integer >= 0, got {value!r}")
    if step < warmup_steps:
        return 0.0
    if ramp_steps == 0:
        return float(coef)
    return float(coef) * min(1.0, (step - warmup_steps + 1) / ramp_steps)
