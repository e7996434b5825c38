"""Loss aggregation over response tokens, expressed as per-token weights.

Every aggregation mode is linear in the per-token losses, so it is exactly
`sum_{i,t} w_{i,t} * l_{i,t}` for weights `w` that depend only on the mask, the groups and the
mode. Computing `w` once on a training step's full batch and slicing it per micro-batch makes
gradient accumulation exact: the sum of `weighted_token_sum(l_mb, w_mb)` over micro-batches equals
the full-batch aggregate, whatever the micro-batch size (see ScaleRL, Khatri et al. 2025,
arXiv 2510.13786, "loss aggregation", for why the mode matters).
"""

from __future__ import annotations

import torch
from torch import Tensor

from scalerl.algorithms._checks import (
    check_choice,
    check_group_ids,
    check_positive_int,
    check_response_mask,
    check_same_shape,
    check_tensor,
)
from scalerl.algorithms._groups import group_index, group_sum

AGGREGATIONS: tuple[str, ...] = ("constant", "prompt", "sample", "token")


def token_weights(
    mask: Tensor,
    group_ids: Tensor | None = None,
    aggregation: str = "prompt",
    max_tokens: int | None = None,
    *,
    dtype: torch.dtype = torch.float32,
) -> Tensor:
    """Per-token weights `w` such that `sum_{i,t} w_{i,t} l_{i,t}` is the chosen aggregate.

    With `m_{i,t}` the response mask, `L_i = sum_t m_{i,t}` and `N` rows:

    - `"sample"` — GRPO (Shao et al. 2024, arXiv 2402.03300, eq. 3): mean over each sample's
      tokens, then mean over samples: `w_{i,t} = m_{i,t} / (L_i * N')`, `N'` the number of samples
      with at least one token (empty rows have no mean and are left out of the average).
    - `"prompt"` — the DAPO objective as written (Yu et al. 2025, arXiv 2503.14476, §3.3: the
      `1 / sum_i |o_i|` normaliser sits inside the expectation over prompts), ScaleRL's
      "prompt-level" average: `w_{i,t} = m_{i,t} / (C_g * P)`, `C_g` the total token count of
      sample `i`'s prompt `g` and `P` the number of prompts with at least one token.
    - `"token"` — token mean over the batch (DAPO as commonly implemented, e.g. verl's
      "token-mean"): `w_{i,t} = m_{i,t} / sum_{j,s} m_{j,s}`.
    - `"constant"` — Dr. GRPO (Liu et al. 2025, arXiv 2503.20783, §3.1):
      `w_{i,t} = m_{i,t} / (N * max_tokens)`, `max_tokens` the generation budget (a constant, so it
      is required: defaulting it to the padding width would make the loss depend on padding).

    Weights are 0 exactly where `mask` is 0. The weights are computed in float64 and cast to `dtype`.

    Shapes: `mask [N, T]` (bool or 0/1), `group_ids [N]` (int; required for `"prompt"`) -> `[N, T]`.
    """
    check_tensor("mask", mask)
    if mask.dim() != 2:
        raise ValueError(f"mask: expected a 2-D tensor [N, T], got shape {tuple(mask.shape)}")
    m = check_response_mask(mask, "mask", mask)
    check_choice("aggregation", aggregation, AGGREGATIONS)
    n = m.shape[0]
    if group_ids is not None:
        check_group_ids(group_ids, n, "mask")
    lengths = m.sum(dim=-1)
    mf = m.to(torch.float64)

    if aggregation == "token":
        w = mf / lengths.sum().to(torch.float64)
    elif aggregation == "sample":
        n_nonempty = (lengths > 0).sum().to(torch.float64)
        w = mf / (lengths.clamp(min=1).to(torch.float64) * n_nonempty)[:, None]
    elif aggregation == "prompt":
        if group_ids is None:
            raise ValueError("group_ids: required for aggregation='prompt'")
        inverse, n_groups = group_index(group_ids)
        group_tokens = group_sum(lengths, inverse, n_groups)
        n_prompts = (group_tokens > 0).sum().to(torch.float64)
        w = mf / (group_tokens.clamp(min=1).to(torch.float64)[inverse] * n_prompts)[:, None]
    else:
        if max_tokens is None:
            raise ValueError("max_tokens: required for aggregation='constant'")
        check_positive_int("max_tokens", max_tokens)
        longest = int(lengths.max())
        if longest > max_tokens:
            raise ValueError(
                f"max_tokens: {max_tokens} is smaller than the longest response ({longest} tokens)"
            )
        w = mf / float(n * max_tokens)
    return w.to(dtype)


def weighted_token_sum(values: Tensor, weights: Tensor) -> Tensor:
    """`sum_{i,t} w_{i,t} v_{i,t}`, with positions of zero weight contributing exactly 0.

    `torch.where` (not a product with the mask) keeps NaN/inf that padding may hold out of both the
    value and the gradient. `weights` is cast to `values`' dtype.

    Shapes: `values [N, T]`, `weights [N, T]` -> scalar.
    """
    check_tensor("values", values)
    check_tensor("weights", weights)
    check_same_shape("weights", weights, "values", values, "[N, T]")
    w = weights.to(values.dtype)
    return torch.where(w != 0, values * w, torch.zeros_like(values)).sum()


def aggregate(
    values: Tensor,
    mask: Tensor,
    group_ids: Tensor | None = None,
    aggregation: str = "prompt",
    max_tokens: int | None = None,
) -> Tensor:
    """Aggregate per-token `values` over a whole batch: `weighted_token_sum(values, token_weights(...))`.

    Shapes: `values [N, T]`, `mask [N, T]`, `group_ids [N]` -> scalar.
    """
    check_tensor("values", values)
    check_tensor("mask", mask)
    check_same_shape("mask", mask, "values", values, "[N, T]")
    w = token_weights(mask, group_ids, aggregation, max_tokens, dtype=values.dtype)
    return weighted_token_sum(values, w)
