"""The critic's objective: the clipped value loss, and how well the values explain the returns.

`values` are the critic's current predictions `V(s_t)` (the only differentiable input),
`old_values` its predictions when the batch's advantages were computed, `returns` the value
targets (`gae_advantages`' second output). Aggregate the per-token loss like a policy loss:
`weighted_token_sum(loss, token_weights(mask, aggregation="token"))` for the token mean.
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
)


def value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    mask: Tensor,
    clip: float | None = None,
) -> tuple[Tensor, Tensor]:
    """Per-token squared value error, optionally clipped around the values it was computed from.

    Unclipped: `l_t = 0.5 (V_t - R_t)^2`. With `clip = eps`:
    `l_t = 0.5 max((V_t - R_t)^2, (V_old_t + clip(V_t - V_old_t, -eps, eps) - R_t)^2)` — PPO's
    value clipping (OpenAI Baselines `ppo2`; studied in Engstrom et al. 2020, arXiv 2005.12729,
    §3 "value function clipping"; used by OpenRLHF and Open-Reasoner-Zero): a value that moved more
    than `eps` from `V_old` gets no gradient when moving it further would lower the loss.
    Gradient on unclipped tokens: `V_t - R_t`.

    Padding may hold anything (NaN included): it is replaced by 0 before any arithmetic.

    Shapes: `values, old_values, returns [N, T]` (float), `mask [N, T]` (bool or 0/1) ->
    (loss `[N, T]`, 0 at padding; `clipped [N, T]` bool, True where the clipped branch is active).
    """
    v_in = check_float_tensor("values", values, ndim=2, dims="[N, T]")
    old_in = check_float_tensor("old_values", old_values)
    ret_in = check_float_tensor("returns", returns)
    check_same_shape("old_values", old_in, "values", v_in, "[N, T]")
    check_same_shape("returns", ret_in, "values", v_in, "[N, T]")
    m = as_bool_mask("mask", mask, "values", v_in)
    if clip is not None:
        check_number("clip", clip, low=0.0, low_inclusive=False)
    check_finite("values", v_in.detach(), m)
    check_finite("old_values", old_in.detach(), m)
    check_finite("returns", ret_in.detach(), m)

    zero = torch.zeros_like(v_in, requires_grad=False)
    v = torch.where(m, v_in, zero)
    ret = torch.where(m, ret_in.detach().to(v.dtype), zero)
    unclipped = (v - ret) ** 2
    if clip is None:
        return torch.where(m, 0.5 * unclipped, zero), torch.zeros_like(m)
    old = torch.where(m, old_in.detach().to(v.dtype), zero)
    v_clipped = old + (v - old).clamp(min=-clip, max=clip)
    clipped_sq = (v_clipped - ret) ** 2
    active = m & (clipped_sq > unclipped)
    loss = 0.5 * torch.maximum(unclipped, clipped_sq)
    return torch.where(m, loss, zero), active


def explained_variance(values: Tensor, returns: Tensor, mask: Tensor) -> float:
    """`1 - Var(R - V) / Var(R)` over response tokens: 1 for a perfect critic, 0 for a constant one.

    A standard critic diagnostic (e.g. OpenAI Baselines' `explained_variance`). NaN when the
    returns do not vary (or there are fewer than two tokens). Biased variances (`/ n`).

    Shapes: `values, returns [N, T]` (float), `mask [N, T]` -> python float.
    """
    v = check_float_tensor("values", values, ndim=2, dims="[N, T]")
    r = check_float_tensor("returns", returns)
    check_same_shape("returns", r, "values", v, "[N, T]")
    m = as_bool_mask("mask", mask, "values", v)
    check_finite("values", v.detach(), m)
    check_finite("returns", r.detach(), m)
    if int(m.sum()) < 2:
        return float("nan")
    rv = r.detach()[m].double()
    resid = rv - v.detach()[m].double()
    var = float(rv.var(unbiased=False))
    if var == 0:
        return float("nan")
    return 1.0 - float(resid.var(unbiased=False)) / var
