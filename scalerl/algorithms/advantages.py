"""Outcome-reward advantages for group-sampled responses (GRPO family).

Each prompt is sampled several times; `group_ids[i]` names sample `i`'s prompt. Advantages are
per sample (`[N]`) and are broadcast over a response's tokens by the objectives.
"""

from __future__ import annotations

import torch
from torch import Tensor

from scalerl.algorithms._checks import (
    check_choice,
    check_finite,
    check_float_tensor,
    check_group_ids,
    check_number,
)
from scalerl.algorithms._groups import group_count, group_index, group_min_max, group_sum

ADV_NORMS: tuple[str, ...] = ("batch", "group", "none")


def compute_advantages(
    rewards: Tensor,
    group_ids: Tensor,
    adv_norm: str = "group",
    eps: float = 1e-6,
) -> Tensor:
    """Group-baselined advantages with the chosen normalisation.

    With `mean_g` and `std_g` the mean and unbiased sample standard deviation (Bessel, `n - 1`,
    as `torch.std`, TRL and verl) of the rewards of sample `i`'s group `g`:

    - `"group"` — GRPO (Shao et al. 2024, DeepSeekMath, arXiv 2402.03300, §4.1.2 outcome
      supervision): `A_i = (r_i - mean_g) / (std_g + eps)`.
    - `"batch"` — ScaleRL (Khatri et al. 2025, arXiv 2510.13786, "advantage normalization")
      and REINFORCE++ (Hu 2025, arXiv 2501.03262): `A_i = r_i - mean_g`, then
      `A_i / (std(A_1..A_N) + eps)` with the unbiased std over the whole batch.
    - `"none"` — Dr. GRPO (Liu et al. 2025, arXiv 2503.20783, §3.1): `A_i = r_i - mean_g`.

    A group whose rewards are all equal — in particular a prompt with a single sample — gets
    exactly 0 (the formula's value, without floating-point residue from `mean_g`). A batch with one
    sample has no batch std and gets 0 in `"batch"` mode.

    Shapes: `rewards [N]` (float), `group_ids [N]` (int) -> `[N]` in `rewards`' dtype.
    """
    r = check_float_tensor("rewards", rewards, ndim=1, dims="[N]")
    check_finite("rewards", r)
    g = check_group_ids(group_ids, r.shape[0], "rewards")
    check_choice("adv_norm", adv_norm, ADV_NORMS)
    check_number("eps", eps, low=0.0)
    if r.numel() == 0:
        return r.detach().clone()

    r = r.detach()
    inverse, n_groups = group_index(g)
    count = group_count(inverse, n_groups)
    mean = group_sum(r, inverse, n_groups) / count.to(r.dtype)
    lo, hi = group_min_max(r, inverse, n_groups)
    constant = (lo == hi)[inverse]
    centered = torch.where(constant, torch.zeros_like(r), r - mean[inverse])

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
