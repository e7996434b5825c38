"""Outcome-reward advantages for group-sampled responses (GRPO family, RLOO, REINFORCE++).

Each prompt is sampled several times; `group_ids[i]` names sample `i`'s prompt. Outcome advantages
are per sample (`[N]`) and are broadcast over a response's tokens by the objectives; advantages
that vary along a response (a per-token KL in the reward, a critic) are `[N, T]` and are
normalised over the batch's tokens by `masked_whiten`.

Two named choices compose: the `baseline` subtracted from a sample's reward, and the `adv_norm`
scaling applied after it.
"""

from __future__ import annotations

import torch
from torch import Tensor

from scalerl.algorithms._checks import (
    as_bool_mask,
    check_choice,
    check_finite,
    check_float_tensor,
    check_group_ids,
    check_number,
)
from scalerl.algorithms._groups import group_count, group_index, group_min_max, group_sum

ADV_NORMS: tuple[str, ...] = ("batch", "group", "none")
BASELINES: tuple[str, ...] = ("group_mean", "leave_one_out", "none")


def compute_advantages(
    rewards: Tensor,
    group_ids: Tensor,
    adv_norm: str = "group",
    eps: float = 1e-6,
    *,
    baseline: str = "group_mean",
) -> Tensor:
    """Baselined advantages with the chosen normalisation.

    `baseline` (with `n_g` the size of sample `i`'s group `g` and `mean_g` its mean reward):

    - `"group_mean"` (default; GRPO, Dr. GRPO, ScaleRL, REINFORCE++-baseline):
      `c_i = r_i - mean_g`.
    - `"leave_one_out"` — RLOO (Ahmadian et al. 2024, "Back to Basics", arXiv 2402.14740, §3.2;
      Kool et al. 2019): `c_i = r_i - (1 / (n_g - 1)) sum_{j in g, j != i} r_j`, which is exactly
      `n_g / (n_g - 1) * (r_i - mean_g)`; a single-sample group has no other sample and gets 0.
    - `"none"` — no per-prompt baseline: `c_i = r_i` (REINFORCE; with `adv_norm="batch"`,
      REINFORCE++ without baseline, Hu 2025, arXiv 2501.03262, whose global normalisation
      subtracts the batch mean).

    Both group baselines make every group's advantages sum to 0. Then `adv_norm`, with `std_g`
    the unbiased sample standard deviation (Bessel, `n - 1`, as `torch.std`, TRL and verl) of
    group `g`'s `c` (for `"group_mean"`, of its rewards):

    - `"group"` — GRPO (Shao et al. 2024, DeepSeekMath, arXiv 2402.03300, §4.1.2 outcome
      supervision): `A_i = c_i / (std_g + eps)`, i.e. `(r_i - mean_g) / (std_g + eps)`; leave-one-out scales
      `c` and `std_g` alike, so only `eps` tells the two apart. Needs a group baseline.
    - `"batch"` — ScaleRL (Khatri et al. 2025, arXiv 2510.13786, "advantage normalization")
      and REINFORCE++ (Hu 2025, arXiv 2501.03262, "global advantage normalization"):
      `A_i = (c_i - mean(c)) / (std(c_1..c_N) + eps)` with the unbiased std over the whole batch.
      With a group baseline `mean(c)` is exactly 0 (every group sums to 0) and is not subtracted,
      so that constant groups stay exactly 0; with `baseline="none"` the batch mean is the only
      baseline.
    - `"none"` — `A_i = c_i` (Dr. GRPO, Liu et al. 2025, arXiv 2503.20783, §3.1, with the group
      mean; RLOO with leave-one-out).

    A group whose rewards are all equal — in particular a prompt with a single sample — gets
    exactly 0 under a group baseline (the formula's value, without floating-point residue from
    `mean_g`). A batch with one sample has no batch std and gets 0 in `"batch"` mode.

    Shapes: `rewards [N]` (float), `group_ids [N]` (int) -> `[N]` in `rewards`' dtype.
    """
    r = check_float_tensor("rewards", rewards, ndim=1, dims="[N]")
    check_finite("rewards", r)
    g = check_group_ids(group_ids, r.shape[0], "rewards")
    check_choice("adv_norm", adv_norm, ADV_NORMS)
    check_choice("baseline", baseline, BASELINES)
    check_number("eps", eps, low=0.0)
    if baseline == "none" and adv_norm == "group":
        raise ValueError(
            "adv_norm: 'group' divides group-centred advantages by the group std; with baseline "
            "'none' there is no group centring (use baseline 'group_mean', or adv_norm 'batch' / 'none')"
        )
    if r.numel() == 0:
        return r.detach().clone()
    if baseline == "none":
        return _unbaselined(r.detach(), adv_norm, eps)

    r = r.detach()
    inverse, n_groups = group_index(g)
    count = group_count(inverse, n_groups)
    mean = group_sum(r, inverse, n_groups) / count.to(r.dtype)
    lo, hi = group_min_max(r, inverse, n_groups)
    constant = (lo == hi)[inverse]
    centered = torch.where(constant, torch.zeros_like(r), r - mean[inverse])
    if baseline == "leave_one_out":
        # r_i - (S_g - r_i) / (n_g - 1) = n_g / (n_g - 1) * (r_i - mean_g); singletons are constant.
        n = count[inverse].to(r.dtype)
        centered = torch.where(constant, torch.zeros_like(r), centered * n / (n - 1).clamp(min=1))

    if adv_norm == "none":
        return centered
    if adv_norm == "group":
        dof = (count - 1).clamp(min=1).to(r.dtype)
        std = (group_sum(centered * centered, inverse, n_groups) / dof).sqrt()
        scaled = centered / (std[inverse] + eps)
        # eps = 0 would give 0/0 on constant groups.
        return torch.where(constant, torch.zeros_like(r), scaled)
    if r.shape[0] < 2:
        return torch.zeros_like(r)
    denom = centered.std() + eps
    if bool(denom == 0):
        # Only reachable with eps = 0 when every advantage is already exactly 0.
        return centered
    return centered / denom


def _unbaselined(r: Tensor, adv_norm: str, eps: float) -> Tensor:
    """`baseline="none"`: raw rewards, or REINFORCE++'s global normalisation `(r - mean) / (std + eps)`."""
    if adv_norm == "none":
        return r.clone()
    if r.shape[0] < 2:
        return torch.zeros_like(r)
    centered = r - r.mean()
    denom = centered.std() + eps
    if bool(denom == 0):
        return torch.zeros_like(r)
    return centered / denom


def masked_whiten(values: Tensor, mask: Tensor, eps: float = 1e-6) -> Tensor:
    """Global batch normalisation of per-token advantages: `(v - mean) / (std + eps)` over response tokens.

    `mean` and `std` (unbiased, `n - 1`) are taken over every position where `mask` is True, so a
    long response weighs by its token count — REINFORCE++'s "global advantage normalization"
    (Hu 2025, arXiv 2501.03262, §3, eq. 10) and PPO's advantage whitening (as in OpenRLHF and
    Open-Reasoner-Zero, `advantage_normalize`). Padding comes out exactly 0. Fewer than two
    tokens, or all-equal values, have no spread: the result is then all 0.

    Shapes: `values [N, T]` (float), `mask [N, T]` (bool or 0/1) -> `[N, T]` in `values`' dtype.
    """
    v = check_float_tensor("values", values, ndim=2, dims="[N, T]")
    m = as_bool_mask("mask", mask, "values", v)
    check_finite("values", v.detach(), m)
    check_number("eps", eps, low=0.0)
    v = v.detach()
    zero = torch.zeros_like(v)
    n = int(m.sum())
    if n < 2:
        return zero
    picked = v[m]
    centered = picked - picked.mean()
    denom = centered.std() + eps
    if bool(denom == 0):
        return zero
    out = zero.clone()
    out[m] = centered / denom
    return out
