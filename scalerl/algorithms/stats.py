"""Scalar statistics of a policy objective, over response tokens only, and their exact merge.

`reduce_token_stats` turns the per-token `TokenStats` of one (micro-)batch into python floats;
`merge_policy_stats` combines the dicts of several micro-batches into the dict the full batch would
have given (means weighted by token count, max of maxima, min of minima).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from scalerl.algorithms.objectives import TokenStats

_FRACTIONS: tuple[tuple[str, str], ...] = (
    ("clip_frac_low", "clipped_low"),
    ("clip_frac_high", "clipped_high"),
    ("dual_clip_frac", "dual_clipped"),
    ("eps_max_truncated_frac", "eps_max_truncated"),
    ("tis_truncated_frac", "tis_truncated"),
    ("dropped_frac", "dropped"),
)

STAT_KEYS: tuple[str, ...] = (
    "n_tokens",
    *(key for key, _ in _FRACTIONS),
    "is_truncated_frac",
    "ratio_mean",
    "ratio_max",
    "ratio_min",
    "tis_weight_mean",
)


def reduce_token_stats(stats: TokenStats) -> dict[str, float]:
    """Token-level statistics as python floats, over the response tokens `stats.mask` only.

    - `n_tokens`: number of response tokens.
    - `clip_frac_low` / `clip_frac_high`: fraction of tokens whose lower / upper clip bound is
      active (GRPO, GSPO: the clipped branch is selected, zero gradient; CISPO: the importance
      weight is raised to `cispo_eps_min` / truncated at `eps_max`).
    - `dual_clip_frac`: fraction under the dual-clip bound.
    - `is_truncated_frac`: fraction whose importance weight was truncated, by CISPO's `eps_max` or
      by the TIS cap; `eps_max_truncated_frac` and `tis_truncated_frac` give the two parts.
    - `dropped_frac`: fraction zeroed by `keep_mask`.
    - `ratio_mean` / `ratio_max` / `ratio_min`: token-weighted policy ratio (the sequence ratio for
      GSPO); `tis_weight_mean`: mean truncated-IS weight (1 without TIS).

    A batch without response tokens gives `n_tokens = 0` and NaN elsewhere. All values are read
    from the device in a single transfer.
    """
    m = stats.mask
    n = m.sum().to(stats.ratio.dtype)
    ratio = stats.ratio
    values = [
        n,
        *((getattr(stats, field) & m).sum().to(ratio.dtype) / n for _, field in _FRACTIONS),
        ((stats.eps_max_truncated | stats.tis_truncated) & m).sum().to(ratio.dtype) / n,
        torch.where(m, ratio, torch.zeros_like(ratio)).sum() / n,
        torch.where(m, ratio, torch.full_like(ratio, -math.inf)).max(),
        torch.where(m, ratio, torch.full_like(ratio, math.inf)).min(),
        torch.where(m, stats.tis_weight, torch.zeros_like(ratio)).sum() / n,
    ]
    out = dict(zip(STAT_KEYS, torch.stack(values).tolist(), strict=True))
    if out["n_tokens"] == 0:
        return {key: (0.0 if key == "n_tokens" else math.nan) for key in STAT_KEYS}
    return out


def merge_policy_stats(parts: Sequence[dict[str, float]]) -> dict[str, float]:
    """Combine `reduce_token_stats` dicts of disjoint micro-batches into the full batch's dict.

    `*_frac` and `*_mean` keys: means weighted by `n_tokens`; `*_max`: maximum; `*_min`: minimum;
    `n_tokens`: sum. Parts without tokens are skipped. Keys must be exactly `STAT_KEYS`.
    """
    if not parts:
        raise ValueError("parts: expected at least one statistics dict")
    for i, part in enumerate(parts):
        if set(part) != set(STAT_KEYS):
            raise ValueError(f"parts: dict {i} has keys {sorted(part)}; expected {sorted(STAT_KEYS)}")
    live = [p for p in parts if p["n_tokens"] > 0]
    total = sum(p["n_tokens"] for p in live)
    if total == 0:
        return {key: (0.0 if key == "n_tokens" else math.nan) for key in STAT_KEYS}
    merged: dict[str, float] = {"n_tokens": float(total)}
    for key in STAT_KEYS[1:]:
        if key.endswith("_max"):
            merged[key] = max(p[key] for p in live)
        elif key.endswith("_min"):
            merged[key] = min(p[key] for p in live)
        else:
            merged[key] = sum(p[key] * p["n_tokens"] for p in live) / total
    return merged
