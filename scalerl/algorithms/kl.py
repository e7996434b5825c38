"""KL(pi || pi_ref) regularisation: per-token estimators and the KL-shaped reward.

Samples come from the policy, so each estimator is a per-token function of the log-ratio
`d = logp_ref - logp` (Schulman 2020, "Approximating KL Divergence", joschu.net/blog/kl-approx.html).
In the loss, weight the per-token KL with the same aggregation as the policy loss:
`loss = policy + beta * weighted_token_sum(kl_penalty(...), token_weights(...))`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

from scalerl.algorithms._checks import (
    as_bool_mask,
    check_choice,
    check_finite,
    check_float_tensor,
    check_number,
    check_same_shape,
)

KL_ESTIMATORS: tuple[str, ...] = ("k1", "k2", "k3", "unbiased_k3")


def kl_penalty(
    logprobs: Tensor,
    ref_logprobs: Tensor,
    estimator: str = "k3",
    old_logprobs: Tensor | None = None,
    *,
    mask: Tensor | None = None,
) -> Tensor:
    """Per-token estimate of KL(pi || pi_ref), with `d = logp_ref - logp` and `r = exp(d)`.

    - `"k1"`: `-d` (unbiased, high variance). Gradient w.r.t. `logp`: 1.
    - `"k2"`: `d^2 / 2` (biased, low variance). Gradient: `logp - logp_ref`.
    - `"k3"`: `(r - 1) - d` (unbiased, low variance, >= 0; GRPO's estimator, DeepSeekMath
      arXiv 2402.03300 eq. 4). Gradient: `1 - r`.
    - `"unbiased_k3"`: `(pi / pi_old) * ((r - 1) - d)` with the ratio *not* detached
      (DeepSeek-V3.2, arXiv 2512.02556, §3.1 eq. 7). Its gradient
      `(pi / pi_old) (logp - logp_ref) grad(logp)` is the importance-weighted, unbiased gradient of
      KL(pi || pi_ref) for tokens sampled from `pi_old`. Needs `old_logprobs`.

    `ref_logprobs` and `old_logprobs` are detached. No clamping is applied. With `mask`, padding
    positions (which may hold anything, NaN included) are 0 in the output and get no gradient;
    without it every position is checked for NaN/inf.

    Shapes: `logprobs, ref_logprobs, old_logprobs [N, T]` (or any common shape),
    `mask` same shape (bool or 0/1) -> same shape.
    """
    lp_in = check_float_tensor("logprobs", logprobs)
    ref_in = check_float_tensor("ref_logprobs", ref_logprobs)
    check_same_shape("ref_logprobs", ref_in, "logprobs", lp_in, "[N, T]")
    check_choice("estimator", estimator, KL_ESTIMATORS)
    if estimator == "unbiased_k3":
        if old_logprobs is None:
            raise ValueError("old_logprobs: required for estimator='unbiased_k3'")
        old_in = check_float_tensor("old_logprobs", old_logprobs)
        check_same_shape("old_logprobs", old_in, "logprobs", lp_in, "[N, T]")
    elif old_logprobs is not None:
        raise ValueError(f"old_logprobs: only used by estimator='unbiased_k3', got estimator={estimator!r}")

    m = None if mask is None else as_bool_mask("mask", mask, "logprobs", lp_in)
    check_finite("logprobs", lp_in.detach(), m)
    check_finite("ref_logprobs", ref_in.detach(), m)
    zero = torch.zeros_like(lp_in, requires_grad=False)
    lp = lp_in if m is None else torch.where(m, lp_in, zero)
    ref = ref_in.detach().to(lp.dtype)
    ref = ref if m is None else torch.where(m, ref, zero)

    d = ref - lp
    if estimator == "k1":
        kl = -d
    elif estimator == "k2":
        kl = 0.5 * d * d
    else:
        # expm1 keeps (r - 1) accurate when pi and pi_ref are close, where k3 is ~ d^2 / 2.
        kl = torch.expm1(d) - d
        if estimator == "unbiased_k3":
            old = old_in.detach().to(lp.dtype)
            check_finite("old_logprobs", old, m)
            old = old if m is None else torch.where(m, old, zero)
            kl = torch.exp(lp - old) * kl
    return kl if m is None else torch.where(m, kl, zero)


def kl_shaped_rewards(
    rewards: Tensor,
    logprobs: Tensor,
    ref_logprobs: Tensor,
    mask: Tensor,
    beta: float,
) -> Tensor:
    """Rewards with the sequence KL subtracted: `r_i - beta * sum_t m_{i,t} (logp - logp_ref)`.

    The summed k1 estimator is the sample's log-ratio `log pi(y_i) / pi_ref(y_i)`, i.e. the
    KL-in-reward form of RLHF (Ziegler et al. 2019, arXiv 1909.08593, eq. 2; Ouyang et al. 2022,
    arXiv 2203.02155, eq. 2) for an outcome reward. The result is detached (a reward).

    Shapes: `rewards [N]`, `logprobs, ref_logprobs, mask [N, T]` -> `[N]` in `rewards`' dtype.
    """
    r = check_float_tensor("rewards", rewards, ndim=1, dims="[N]")
    check_finite("rewards", r)
    lp = check_float_tensor("logprobs", logprobs, ndim=2, dims="[N, T]")
    if r.shape[0] != lp.shape[0]:
        raise ValueError(
            f"rewards: expected shape [N] = ({lp.shape[0]},) matching logprobs, got {tuple(r.shape)}"
        )
    check_number("beta", beta, low=0.0)
    k1 = kl_penalty(lp.detach(), ref_logprobs, "k1", mask=mask)
    return r.detach() - beta * k1.sum(dim=-1).to(r.dtype)


def sample_kl_coefs(tasks: Sequence[str] | None, n: int, default: float,
                    by_task: Mapping[str, float]) -> Tensor:
    """Each sample's KL weight beta_i: `by_task[task_i]` where its task is listed, else `default`.

    The KL loss term is then `sum_{i,t} w_{i,t} beta_i kl_{i,t}` (one beta for all samples when
    `by_task` is empty). DeepSeek-V3.2 (arXiv 2512.02556, §3.1) sets the KL strength per domain:
    "for certain domains, such as mathematics, applying a weak KL penalty or even omitting it
    entirely can yield improved performance". `tasks` None (no task per row) gives `default` to all.

    Shapes: `tasks [N]` -> `[N]` float32.
    """
    check_number("default", default, low=0.0)
    if tasks is None:
        return torch.full((n,), float(default), dtype=torch.float32)
    if len(tasks) != n:
        raise ValueError(f"tasks: {len(tasks)} task names for {n} samples")
    return torch.tensor([float(by_task.get(t, default)) for t in tasks], dtype=torch.float32)
