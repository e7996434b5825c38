"""Kimi k1.5's online-mirror-descent surrogate (Kimi Team 2025, arXiv 2501.12599, §2.3.2).

Iteration `i` samples `k` responses per prompt from the reference policy `pi_i` (here `pi_old`,
the policy that generated the data) and minimises, per prompt,

    L(theta) = (1/k) sum_j (r_j - tau log Z - tau log(pi_theta(y_j) / pi_i(y_j)))^2

— the sample form of a relative-entropy-regularised policy improvement step whose optimum is
`pi* = pi_i exp(r / tau) / Z`. `tau log Z` is estimated by the mean reward of the prompt's samples,
so `r_j - tau log Z` is the group-mean advantage `A_j` (`compute_advantages(baseline="group_mean",
adv_norm="none")`). Its gradient, the report's eq. (3),

    (1/k) sum_j [ (r_j - mean r) grad log pi_theta(y_j) - (tau / 2) grad (log pi_theta(y_j) / pi_i(y_j))^2 ]

is a policy gradient with the mean-reward baseline plus an L2 penalty on the sequence log-ratio.
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


def kimi_sequence_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    tau: float,
) -> tuple[Tensor, Tensor]:
    """Per-sample Kimi k1.5 surrogate `l_i = (A_i - tau rho_i)^2 / (2 tau)` and its log-ratio `rho_i`.

    `rho_i = sum_t m_{i,t} (logp_{i,t} - logp_old_{i,t}) = log pi_theta(y_i) / pi_old(y_i)` is the
    sequence log-ratio (not length-normalised). The `1 / (2 tau)` scale makes the gradient exactly
    minus the report's eq. (3) per sample: `d l_i / d logp_{i,t} = -(A_i - tau rho_i)`, so the
    mean over a prompt's samples is `-(1/k) sum_j [A_j grad log pi(y_j) - (tau/2) grad rho_j^2]`
    (Kimi Team 2025, arXiv 2501.12599, §2.3.2, eq. 2-3). The loss is 0 at the reference policy only
    when `A_i = 0`; its value at `pi_old` is `A_i^2 / (2 tau)`, a constant of the batch.

    Shapes: `logprobs, old_logprobs [N, T]` (float; `logprobs` differentiable), `advantages [N]`,
    `mask [N, T]` -> (loss `[N]`, `rho [N]` detached).
    """
    lp_in = check_float_tensor("logprobs", logprobs, ndim=2, dims="[N, T]")
    old_in = check_float_tensor("old_logprobs", old_logprobs)
    check_same_shape("old_logprobs", old_in, "logprobs", lp_in, "[N, T]")
    m = as_bool_mask("mask", mask, "logprobs", lp_in)
    adv_in = check_float_tensor("advantages", advantages)
    if adv_in.shape != torch.Size([lp_in.shape[0]]):
        raise ValueError(
            f"advantages: the Kimi surrogate needs one advantage per sample, shape [N] = "
            f"({lp_in.shape[0]},), got {tuple(adv_in.shape)}"
        )
    check_number("tau", tau, low=0.0, low_inclusive=False)
    check_finite("logprobs", lp_in.detach(), m)
    check_finite("old_logprobs", old_in.detach(), m)
    check_finite("advantages", adv_in.detach(), m.any(dim=-1))

    zero = torch.zeros_like(lp_in, requires_grad=False)
    lp = torch.where(m, lp_in, zero)
    old = torch.where(m, old_in.detach().to(lp.dtype), zero)
    rho = (lp - old).sum(dim=-1)
    has_tokens = m.any(dim=-1)
    adv = torch.where(has_tokens, adv_in.detach().to(lp.dtype), torch.zeros_like(rho))
    loss = (adv - tau * rho) ** 2 / (2.0 * tau)
    return loss, rho.detach()
