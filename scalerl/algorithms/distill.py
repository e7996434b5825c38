"""On-policy distillation: the teacher's per-token reverse KL as a token-level advantage.

The student samples; the teacher scores the student's own tokens. Per response token `t` of
sample `i`, the single-sample estimate of the reverse KL `KL(pi_s || pi_t)` at that position is

    d_{i,t} = log pi_s(y_t | x, y_<t) - log pi_t(y_t | x, y_<t)

and the distillation advantage is `-coef * d_{i,t}`: tokens the student likes more than the teacher
are pushed down, tokens the teacher likes more are pushed up. It is used as an advantage, with no
discounting across tokens (each token's own term, not a return), exactly as in Thinking Machines'
"On-Policy Distillation" (Lu & Thinking Machines Lab, 2025: "advantage = -reverse_kl", with the
sampler's log-probs for pi_s), the on-policy, reverse-KL case of GKD (Agarwal et al. 2024, ICLR,
arXiv 2306.13649, student-generated data with lambda = 1 and the reverse KL as divergence) taken
as a REINFORCE reward rather than a differentiated loss. Because the policy-gradient estimator
of `E_{y~pi_s}[-sum_t d_t]` is `E[sum_t grad log pi_s(y_t) * (-sum_{s>=t} d_s)]`, using `-d_t` per
token keeps only the immediate term (the blog's choice, discount 0), which lowers variance.

The `full` estimator (`algorithm.distill.estimator: full`) replaces the single sampled token by the
whole next-token distribution at each of the student's positions and differentiates it as a loss,
GKD's on-policy reverse KL (Agarwal et al. 2024, eq. 1 with D = KL(pi_s || pi_t) over the
vocabulary at every student-generated prefix):

    KL_{i,t} = sum_v pi_s(v | x, y_<t) * (log pi_s(v | x, y_<t) - log pi_t(v | x, y_<t))

    loss += coef * sum_{i,t} w_{i,t} KL_{i,t}

(`w` the policy loss's aggregation weights). Its gradient reaches every token's probability,
also those the student never sampled (the teacher's preferred token, the end of sequence), where
the sampled estimator only moves the token drawn; the prefixes stay the student's own, so the
gradient does not flow through the sampling (as in GKD).

Beside an outcome reward the two add: `A_{i,t} = w * A_i + (-coef * d_{i,t})`, `A_i` the usual
outcome advantage (broadcast over the response, or already per token) and `w` its weight; `w = 0`
is pure distillation.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from scalerl.algorithms._checks import (
    as_bool_mask,
    check_finite,
    check_float_tensor,
    check_number,
    check_same_shape,
)


def reverse_kl_advantages(student_logprobs: Tensor, teacher_logprobs: Tensor, mask: Tensor,
                          coef: float = 1.0) -> Tensor:
    """`-coef * (log pi_s(y_t) - log pi_t(y_t))` per response token, 0 at padding (module
    docstring; Thinking Machines 2025, Agarwal et al. 2024). Shapes: `[N, T]` log-probs of the
    sampled tokens and `mask [N, T]` -> `[N, T]` float."""
    s = check_float_tensor("student_logprobs", student_logprobs, ndim=2, dims="[N, T]")
    t = check_float_tensor("teacher_logprobs", teacher_logprobs, ndim=2, dims="[N, T]")
    check_same_shape("teacher_logprobs", t, "student_logprobs", s, "[N, T]")
    m = as_bool_mask("mask", mask, "student_logprobs", s)
    check_number("coef", coef, low=0.0)
    check_finite("student_logprobs", s, m)
    check_finite("teacher_logprobs", t, m)
    return torch.where(m, -coef * (s - t), torch.zeros_like(s))


def distillation_advantages(outcome: Tensor, student_logprobs: Tensor, teacher_logprobs: Tensor,
                            mask: Tensor, coef: float = 1.0, outcome_weight: float = 1.0) -> Tensor:
    """`A_{i,t} = outcome_weight * A_i + reverse_kl_advantages(...)_{i,t}` (module docstring), `[N, T]`,
    0 at padding. `outcome` is `[N]` (broadcast over each response) or `[N, T]`."""
    kl_adv = reverse_kl_advantages(student_logprobs, teacher_logprobs, mask, coef)
    check_number("outcome_weight", outcome_weight, low=0.0)
    a = check_float_tensor("outcome", outcome)
    if a.dim() == 1 and a.shape[0] == kl_adv.shape[0]:
        a = a[:, None].expand_as(kl_adv)
    if a.shape != kl_adv.shape:
        raise ValueError(f"outcome: shape {tuple(outcome.shape)} != log-probs {tuple(kl_adv.shape)}")
    m = as_bool_mask("mask", mask, "student_logprobs", kl_adv)
    return torch.where(m, outcome_weight * a.to(kl_adv.dtype) + kl_adv, torch.zeros_like(kl_adv))


def full_reverse_kl(student_logits: Tensor, teacher_logits: Tensor) -> Tensor:
    """`KL(pi_s || pi_t) = sum_v p_s,v (log p_s,v - log p_t,v)` per position over the last (vocabulary)
    dimension, from logits already divided by the sampling temperature (GKD's reverse KL, Agarwal
    et al. 2024; module docstring). `[..., V]` and `[..., V]` -> `[...]` float32, >= 0;
    differentiable in `student_logits`. A student logit of -inf (probability 0) contributes 0; a
    position with a NaN on either side is NaN (not hidden). Positions whose student logits are all
    -inf are not allowed."""
    s = check_float_tensor("student_logits", student_logits)
    t = check_float_tensor("teacher_logits", teacher_logits)
    check_same_shape("teacher_logits", t, "student_logits", s, "[..., V]")
    log_s = torch.log_softmax(s.float(), dim=-1)
    log_t = torch.log_softmax(t.float(), dim=-1)
    # 0 * log 0 is 0: a token the student gives probability 0 contributes nothing (its NaN is the
    # only one nan_to_num may clear: a NaN input is put back per position, without a host sync)
    kl = (log_s.exp() * (log_s - log_t)).nan_to_num(nan=0.0, posinf=math.inf).sum(-1).clamp_min(0.0)
    bad = torch.isnan(s).any(-1) | torch.isnan(t).any(-1)
    return torch.where(bad, math.nan, kl)
