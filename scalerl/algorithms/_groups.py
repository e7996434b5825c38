"""Per-prompt (group) reductions over `[N]` tensors keyed by integer `group_ids`.

Group ids are arbitrary integers (not necessarily contiguous or sorted); they are mapped to dense
indices `0..G-1` once, and every reduction is a scatter over those indices.
"""

from __future__ import annotations

import torch
from torch import Tensor


def group_index(group_ids: Tensor) -> tuple[Tensor, int]:
    """Dense group index of each sample and the number of groups.

    Shapes: `group_ids [N]` (int) -> `inverse [N]` (int64, values in `0..G-1`), `G`.
    """
    _, inverse = torch.unique(group_ids, sorted=True, return_inverse=True)
    n_groups = int(inverse.max()) + 1 if inverse.numel() else 0
    return inverse, n_groups


def group_sum(values: Tensor, inverse: Tensor, n_groups: int) -> Tensor:
    """`out[g] = sum_{i: inverse[i] = g} values[i]`. Shapes: `[N]` -> `[G]`."""
    out = torch.zeros(n_groups, dtype=values.dtype, device=values.device)
    return out.index_add(0, inverse, values)


def group_count(inverse: Tensor, n_groups: int) -> Tensor:
    """Number of samples in each group. Shapes: `[N]` -> `[G]` (int64)."""
    return torch.bincount(inverse, minlength=n_groups)


def group_min_max(values: Tensor, inverse: Tensor, n_groups: int) -> tuple[Tensor, Tensor]:
    """Per-group minimum and maximum. Shapes: `[N]` -> (`[G]`, `[G]`)."""
    lo = torch.zeros(n_groups, dtype=values.dtype, device=values.device)
    hi = torch.zeros(n_groups, dtype=values.dtype, device=values.device)
    lo = lo.scatter_reduce(0, inverse, values, reduce="amin", include_self=False)
    hi = hi.scatter_reduce(0, inverse, values, reduce="amax", include_self=False)
    return lo, hi
