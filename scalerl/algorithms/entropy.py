"""Entropy of the policy's next-token distribution, and the entropy-bonus loss term."""

from __future__ import annotations

import torch
from torch import Tensor

from scalerl.algorithms._checks import as_bool_mask, check_float_tensor, check_number
from scalerl.algorithms.aggregation import weighted_token_sum


def entropy_from_logits(logits: Tensor, mask: Tensor | None = None) -> Tensor:
    """Shannon entropy `H = -sum_v p_v log p_v`, `p = softmax(logits)`, per position (nats).

    Logits of `-inf` (tokens excluded from the vocabulary) contribute 0, with a finite gradient.
    With `mask`, positions outside it are 0 and their logits (which may be garbage) get no
    gradient. Computed in the logits' dtype: pass float32 logits for a float32 entropy (ScaleRL
    finds an FP32 LM head matters, arXiv 2510.13786).

    Shapes: `logits [N, T, V]` (or `[..., V]`), `mask [N, T]` (the leading shape) -> `[N, T]`.
    """
    z = check_float_tensor("logits", logits)
    if z.dim() < 1 or z.shape[-1] == 0:
        raise ValueError(f"logits: expected a vocabulary dimension [..., V] with V > 0, got {tuple(z.shape)}")
    if mask is not None:
        lead = z.detach()[..., 0]
        m = as_bool_mask("mask", mask, "logits[..., 0]", lead, "[N, T]")
        z = torch.where(m[..., None], z, torch.zeros_like(z, requires_grad=False))
    logp = torch.log_softmax(z, dim=-1)
    p = logp.exp()
    # 0 * log 0 = 0; zeroing log p first keeps the backward of p * log p finite (no 0 * -inf).
    safe_logp = torch.where(p > 0, logp, torch.zeros_like(logp))
    h = -(p * safe_logp).sum(dim=-1)
    if mask is not None:
        h = torch.where(m, h, torch.zeros_like(h))
    return h


def entropy_bonus(entropy: Tensor, weights: Tensor, coef: float) -> Tensor:
    """Entropy-bonus loss term `-coef * sum_{i,t} w_{i,t} H_{i,t}` (add it to the loss to minimise).

    With `w = token_weights(...)` the entropy is aggregated exactly like the policy loss, so the
    term micro-batches the same way (PPO's entropy bonus, Schulman et al. 2017, arXiv 1707.06347,
    eq. 9: the objective adds `c2 * H`).

    Shapes: `entropy [N, T]`, `weights [N, T]` -> scalar.
    """
    check_float_tensor("entropy", entropy)
    check_number("coef", coef)
    return -coef * weighted_token_sum(entropy, weights)
