"""Masks that keep the trainer consistent with the sampler (DeepSeek-V3.2, arXiv 2512.02556, §3.1).

- Off-policy sequence masking: drop negative-advantage samples that drifted too far from the
  policy that generated them.
- Keep sampling mask: compute the trainer's log-probs over the same truncated (top-k / top-p)
  token support the sampler drew from, so `pi` and `pi_old` share one action space.
"""

from __future__ import annotations

import torch
from torch import Tensor

from scalerl.algorithms._checks import (
    as_bool_mask,
    check_advantages,
    check_finite,
    check_float_tensor,
    check_number,
    check_positive_int,
    check_same_shape,
    check_tensor,
)


def off_policy_sequence_mask(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    delta: float,
) -> Tensor:
    """DeepSeek-V3.2 off-policy sequence masking: which response tokens to keep.

    `M_{i,t} = 0` if `A_{i,t} < 0` and `(1/|o_i|) sum_t (log pi_old(o_{i,t}) - log pi(o_{i,t})) > delta`,
    else 1 (DeepSeek-V3.2, arXiv 2512.02556, §3.1 "Off-Policy Sequence Masking"). `pi_old` is the
    policy that sampled the data (the inference engine's log-probs), `pi` the current policy; both
    enter detached. Pass the result as `keep_mask` to the policy loss: it multiplies the token terms
    and leaves the `1/|o_i|` normalisation unchanged, as in the paper.

    Shapes: `logprobs, old_logprobs [N, T]`, `advantages [N]` or `[N, T]`, `mask [N, T]` ->
    bool `[N, T]`, True where a response token is kept (always False at padding).
    """
    lp = check_float_tensor("logprobs", logprobs, ndim=2, dims="[N, T]")
    old = check_float_tensor("old_logprobs", old_logprobs)
    check_same_shape("old_logprobs", old, "logprobs", lp, "[N, T]")
    adv = check_advantages(advantages, lp)
    m = as_bool_mask("mask", mask, "logprobs", lp)
    check_number("delta", delta)
    check_finite("logprobs", lp.detach(), m)
    check_finite("old_logprobs", old.detach(), m)

    zero = torch.zeros_like(lp, requires_grad=False)
    diff = torch.where(m, old.detach().to(lp.dtype) - lp.detach(), zero)
    lengths = m.sum(dim=-1, keepdim=True).clamp(min=1).to(lp.dtype)
    drifted = diff.sum(dim=-1, keepdim=True) / lengths > delta
    a = adv.detach()
    negative = (a < 0)[:, None] if a.dim() == 1 else (a < 0)
    return m & ~(negative & drifted)


def support_mask_from_indices(indices: Tensor, vocab_size: int) -> Tensor:
    """Boolean support over the vocabulary from recorded token ids, e.g. a sampler's kept top-k/top-p set.

    `support[..., v] = True` iff `v` is among `indices[..., :]`; negative entries are empty slots
    (supports of different sizes padded to one width `K`).

    Shapes: `indices [N, T, K]` (int) -> bool `[N, T, V]`.
    """
    idx = check_tensor("indices", indices)
    if idx.dtype == torch.bool or idx.is_floating_point() or idx.is_complex():
        raise ValueError(f"indices: expected an integer tensor, got {idx.dtype}")
    if idx.dim() < 1:
        raise ValueError(f"indices: expected a tensor [..., K], got shape {tuple(idx.shape)}")
    check_positive_int("vocab_size", vocab_size)
    if bool((idx >= vocab_size).any()):
        raise ValueError(f"indices: token id {int(idx.max())} is out of range for vocab_size={vocab_size}")
    valid = idx >= 0
    # Empty slots scatter into an extra trailing column that is then dropped.
    target = torch.where(valid, idx, torch.full_like(idx, vocab_size))
    support = torch.zeros((*idx.shape[:-1], vocab_size + 1), dtype=torch.bool, device=idx.device)
    support.scatter_(-1, target, True)
    return support[..., :vocab_size]


def top_k_top_p_support(logits: Tensor, top_k: int | None = None, top_p: float | None = None) -> Tensor:
    """The token support of top-k then top-p (nucleus) sampling from `softmax(logits)`.

    Top-k keeps tokens whose logit is >= the k-th largest (ties at the boundary are kept). Top-p
    (Holtzman et al. 2020, arXiv 1904.09751, §3.1) then keeps, in decreasing probability under the
    top-k-renormalised distribution, each token whose preceding cumulative mass is `< top_p` — the
    smallest prefix with mass >= `top_p`, the most likely token always kept — which is the
    Hugging Face / vLLM convention. Apply the sampling temperature to `logits` first.

    Shapes: `logits [..., V]` -> bool `[..., V]`.
    """
    z = check_float_tensor("logits", logits).detach()
    if z.dim() < 1 or z.shape[-1] == 0:
        raise ValueError(f"logits: expected a vocabulary dimension [..., V] with V > 0, got {tuple(z.shape)}")
    support = torch.ones_like(z, dtype=torch.bool)
    if top_k is not None:
        check_positive_int("top_k", top_k)
        if top_k < z.shape[-1]:
            kth = torch.topk(z, top_k, dim=-1).values[..., -1:]
            support = z >= kth
    if top_p is not None:
        check_number("top_p", top_p, low=0.0, high=1.0, low_inclusive=False)
    # top_p = 1 keeps everything; the cumulative sum's rounding must not drop the tail.
    if top_p is not None and top_p < 1.0:
        probs = torch.softmax(torch.where(support, z, torch.full_like(z, -torch.inf)), dim=-1)
        sorted_p, order = torch.sort(probs, dim=-1, descending=True)
        mass_before = torch.cumsum(sorted_p, dim=-1) - sorted_p
        keep_sorted = mass_before < top_p
        keep = torch.zeros_like(support).scatter(-1, order, keep_sorted)
        support = support & keep
    return support


def keep_sampling_logprobs(
    logits: Tensor,
    tokens: Tensor,
    support: Tensor,
    mask: Tensor | None = None,
) -> Tensor:
    """Log-probs of the sampled tokens renormalised over the support recorded at sampling time.

    `logp_{i,t} = z_{i,t,y} - logsumexp_{v in S_{i,t}} z_{i,t,v}` with `S_{i,t}` the top-k / top-p
    support the sampler used (DeepSeek-V3.2, arXiv 2512.02556, §3.1 "Keep Sampling Mask": the
    truncation mask from sampling with `pi_old` is applied to `pi` in training so both share the
    same action subspace). Tokens outside the support get no probability and no gradient.

    With `mask`, padding positions are 0, and their tokens and supports may be anything. Every
    response position must have its sampled token inside its support.

    Shapes: `logits [N, T, V]` (float), `tokens [N, T]` (int), `support [N, T, V]` (bool),
    `mask [N, T]` -> `[N, T]` in the logits' dtype.
    """
    z = check_float_tensor("logits", logits, ndim=3, dims="[N, T, V]")
    tok = check_tensor("tokens", tokens)
    if tok.dtype == torch.bool or tok.is_floating_point() or tok.is_complex():
        raise ValueError(f"tokens: expected an integer tensor, got {tok.dtype}")
    if tok.shape != z.shape[:2]:
        raise ValueError(
            f"tokens: expected shape [N, T] = {tuple(z.shape[:2])} matching logits, got {tuple(tok.shape)}"
        )
    sup = as_bool_mask("support", support, "logits", z.detach(), "[N, T, V]")
    vocab = z.shape[-1]
    m = torch.ones_like(tok, dtype=torch.bool) if mask is None else as_bool_mask("mask", mask, "tokens", tok)
    bad = m & ((tok < 0) | (tok >= vocab))
    if bool(bad.any()):
        i = tuple(torch.nonzero(bad)[0].tolist())
        raise ValueError(f"tokens: id {int(tok[i])} at index {i} is out of range for V={vocab}")

    safe_tok = torch.where(m, tok, torch.zeros_like(tok))
    sup = torch.where(m[..., None], sup, torch.ones_like(sup))
    outside = m & ~sup.gather(-1, safe_tok[..., None]).squeeze(-1)
    if bool(outside.any()):
        i = tuple(torch.nonzero(outside)[0].tolist())
        raise ValueError(f"support: sampled token {int(tok[i])} at index {i} is outside the recorded support")

    z = torch.where(m[..., None], z, torch.zeros_like(z, requires_grad=False))
    restricted = torch.where(sup, z, torch.full_like(z, -torch.inf, requires_grad=False))
    logp = torch.log_softmax(restricted, dim=-1).gather(-1, safe_tok[..., None]).squeeze(-1)
    return torch.where(m, logp, torch.zeros_like(logp))
