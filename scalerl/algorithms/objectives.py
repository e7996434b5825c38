"""Per-token policy-gradient objectives: GRPO (PPO clip, DAPO clip-higher, dual-clip), GSPO, CISPO, Kimi.

`per_token_policy_loss` returns the loss of every response token (`[N, T]`, exactly 0 at padding)
plus per-token diagnostics; aggregating it with `aggregation.token_weights` gives the scalar loss.
Keeping the two apart is what lets a trainer accumulate gradients over micro-batches exactly.

Conventions: `logprobs` are the current policy's log-probabilities of the sampled tokens (the only
differentiable input), `old_logprobs` the policy that the importance ratio is taken against
(`pi_old`), `behavior_logprobs` the generator's (inference engine's) log-probabilities for
truncated importance sampling. Every other input is detached. Padding may hold any value, NaN
included: inputs are replaced by 0 outside `mask` with `torch.where` before any arithmetic, so
nothing from padding reaches the loss or the gradient.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from scalerl.algorithms._checks import (
    as_bool_mask,
    as_row_or_token_mask,
    check_advantages,
    check_choice,
    check_finite,
    check_float_tensor,
    check_number,
    check_same_shape,
)
from scalerl.algorithms.mirror_descent import kimi_sequence_loss

LOSS_TYPES: tuple[str, ...] = ("cispo", "grpo", "gspo", "kimi")
TIS_LEVELS: tuple[str, ...] = ("sequence", "token")


@dataclass(frozen=True)
class TokenStats:
    """Per-token diagnostics of a policy objective; every field is detached and shaped `[N, T]`.

    `mask` marks response tokens; statistics are taken over those only
    (`stats.reduce_token_stats`). The boolean fields are False at padding.
    """

    mask: Tensor
    """Response tokens (bool)."""
    ratio: Tensor
    """Policy ratio the objective used: `pi / pi_old` per token (GRPO, CISPO) or the sequence
    ratio `s_i` on each of the sample's tokens (GSPO); 1 at padding."""
    clipped_low: Tensor
    """GRPO/GSPO: lower clip active (`A < 0`, ratio `< 1 - eps_low`, zero gradient).
    CISPO: importance weight raised to `cispo_eps_min`."""
    clipped_high: Tensor
    """GRPO/GSPO: upper clip active (`A > 0`, ratio `> 1 + eps_high`, zero gradient).
    CISPO: importance weight truncated to `eps_max`."""
    dual_clipped: Tensor
    """Dual-clip bound active (`A < 0`, ratio `> dual_clip_c`)."""
    eps_max_truncated: Tensor
    """CISPO importance weight truncated by `eps_max`."""
    tis_truncated: Tensor
    """Truncated-IS weight capped at `tis_cap`."""
    tis_weight: Tensor
    """Truncated-IS weight multiplied into the token's loss (1 without TIS and at padding)."""
    dropped: Tensor
    """Response tokens zeroed by `keep_mask` (e.g. off-policy sequence masking)."""


def _clipped_surrogate(
    log_ratio: Tensor,
    ratio: Tensor,
    adv: Tensor,
    eps_low: float,
    eps_high: float,
    dual_clip_c: float | None,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """PPO clipped surrogate (with DAPO's asymmetric range and optional dual clip), as a loss.

    `l = -min(r A, clip(r, 1 - eps_low, 1 + eps_high) A)` (Schulman et al. 2017, arXiv 1707.06347,
    eq. 7; asymmetric range: DAPO "clip-higher", Yu et al. 2025, arXiv 2503.14476, §3.1), and for
    `A < 0` with dual clip `l = min(l, -c A)` (dual-clip PPO, Ye et al. 2020, arXiv 1912.09729).

    Evaluated in the equivalent form `l = -A * r_eff`, where `r_eff` is the constant bound on the
    tokens where a bound is active (`A > 0, r > 1 + eps_high`; `A < 0, r < 1 - eps_low`;
    `A < 0, r > c`) and `r` elsewhere — the min/max form selects exactly these branches. The ratio
    is exponentiated only on the unclipped tokens, so an overflowing ratio on a clipped token
    cannot turn its zero gradient into NaN (`0 * inf`).

    Shapes: `log_ratio [N, T]` (differentiable; `exp(log_ratio)` has the value of `ratio`),
    `ratio [N, T]` (detached), `adv [N, T]` -> loss `[N, T]` and bool `[N, T]` flags
    (clipped_low, clipped_high, dual_clipped).
    """
    clipped_high = (adv > 0) & (ratio > 1.0 + eps_high)
    clipped_low = (adv < 0) & (ratio < 1.0 - eps_low)
    dual = torch.zeros_like(clipped_low) if dual_clip_c is None else (adv < 0) & (ratio > dual_clip_c)
    frozen = clipped_high | clipped_low | dual
    low_or_dual = torch.where(
        clipped_low, torch.full_like(ratio, 1.0 - eps_low), torch.full_like(ratio, dual_clip_c or 0.0)
    )
    bound = torch.where(clipped_high, torch.full_like(ratio, 1.0 + eps_high), low_or_dual)
    live = torch.exp(torch.where(frozen, torch.zeros_like(log_ratio), log_ratio))
    r_eff = torch.where(frozen, bound, live)
    return -adv * r_eff, clipped_low, clipped_high, dual


def _grpo_loss(
    lp: Tensor, old: Tensor, adv: Tensor, eps_low: float, eps_high: float, dual_clip_c: float | None
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """GRPO / DAPO token loss on the token ratio `r_{i,t} = exp(logp_{i,t} - logp_old_{i,t})`.

    `l_{i,t} = -min(r A, clip(r, 1 - eps_low, 1 + eps_high) A)` (GRPO: Shao et al. 2024,
    arXiv 2402.03300, eq. 3 without its KL term; clip-higher: DAPO, arXiv 2503.14476, §3.1).
    Gradient `-A r grad(logp)` on unclipped tokens, exactly 0 on clipped ones.

    Shapes: `lp, old, adv [N, T]` (padding already zeroed) -> (loss, ratio, clipped_low,
    clipped_high, dual_clipped), all `[N, T]`.
    """
    log_ratio = lp - old
    ratio = torch.exp(log_ratio.detach())
    loss, low, high, dual = _clipped_surrogate(log_ratio, ratio, adv, eps_low, eps_high, dual_clip_c)
    return loss, ratio, low, high, dual


def _gspo_loss(
    lp: Tensor,
    old: Tensor,
    adv: Tensor,
    m: Tensor,
    eps_low: float,
    eps_high: float,
    dual_clip_c: float | None,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """GSPO-token loss (Zheng et al. 2025, arXiv 2507.18071, §4.1 and §4.3 "GSPO-token").

    Sequence ratio `s_i = (pi(y_i) / pi_old(y_i))^(1/|y_i|) = exp(mean_t (logp - logp_old))` over
    the sample's response tokens, and per token `s_{i,t} = sg(s_i) * pi(y_{i,t}) / sg(pi(y_{i,t}))`
    (value `s_i`, gradient `s_i grad(logp_{i,t})`), clipped like PPO:
    `l_{i,t} = -min(s_{i,t} A_{i,t}, clip(s_{i,t}, 1 - eps_low, 1 + eps_high) A_{i,t})`.
    With a per-sample advantage every token of a sequence gets the same gradient `-A s_i` (times
    its aggregation weight), and with GRPO's sample-mean aggregation this is exactly GSPO's
    sequence-level gradient. Clipping is decided per sequence.

    Shapes: `lp, old, adv [N, T]`, `m [N, T]` (bool) -> (loss, ratio `s_i` per token,
    clipped_low, clipped_high, dual_clipped), all `[N, T]`.
    """
    lengths = m.sum(dim=-1, keepdim=True).clamp(min=1).to(lp.dtype)
    seq_log_ratio = (lp.detach() - old).sum(dim=-1, keepdim=True) / lengths
    # (lp - sg(lp)) is exactly 0, so the value is exactly the sequence log-ratio; only the gradient
    # (d/dlp = 1) is per token.
    log_ratio = (lp - lp.detach()) + seq_log_ratio
    ratio = torch.exp(seq_log_ratio).expand_as(lp)
    loss, low, high, dual = _clipped_surrogate(log_ratio, ratio, adv, eps_low, eps_high, dual_clip_c)
    return loss, ratio, low, high, dual


def _cispo_loss(
    lp: Tensor, old: Tensor, adv: Tensor, eps_max: float, eps_min: float | None
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """CISPO token loss: `l_{i,t} = -sg(min(r_{i,t}, eps_max)) * A_{i,t} * logp_{i,t}`.

    ScaleRL (Khatri et al. 2025, arXiv 2510.13786, eq. 4); CISPO (MiniMax-M1, arXiv 2506.13585,
    §3.1), which clips the detached weight to `[1 - eps_low_IS, 1 + eps_high_IS]` and sets no lower
    bound in practice. The optional `eps_min` floor is that lower bound: the weight becomes
    `sg(clip(r, eps_min, eps_max))`. The weight is detached, so the gradient `-w A grad(logp)`
    flows only through the trailing `logp` and no token is ever dropped.

    Shapes: `lp, old, adv [N, T]` -> (loss, ratio, weight raised to eps_min, weight truncated at
    eps_max), all `[N, T]`.
    """
    ratio = torch.exp(lp.detach() - old)
    weight = ratio.clamp(min=eps_min, max=eps_max)
    truncated_high = ratio > eps_max
    raised_low = ratio < eps_min if eps_min is not None else torch.zeros_like(truncated_high)
    return -weight * adv * lp, ratio, raised_low, truncated_high


def _kimi_loss(lp: Tensor, old: Tensor, adv: Tensor, m: Tensor, tau: float) -> tuple[Tensor, Tensor]:
    """Kimi k1.5 surrogate as a per-token loss: the sample's `l_i` on each of its response tokens.

    `l_i = (A_i - tau rho_i)^2 / (2 tau)` (see `mirror_descent.kimi_sequence_loss`). Any
    aggregation weights of one sample sum to its share of the batch, so aggregating this per-token
    loss gives `sum_i (sum_t w_{i,t}) l_i`; with `"sample"` aggregation `(1/N) sum_i l_i`, the
    report's `1/k` mean over a prompt's samples averaged over prompts of equal group size.

    Shapes: `lp, old [N, T]` (padding zeroed), `adv [N]`, `m [N, T]` -> (loss, token ratio), `[N, T]`.
    """
    per_sample, _ = kimi_sequence_loss(lp, old, adv, m, tau)
    loss = torch.where(m, per_sample[:, None].expand_as(lp), torch.zeros_like(lp))
    return loss, torch.exp(lp.detach() - old)


def _tis_weight(old: Tensor, behavior: Tensor, m: Tensor, cap: float, level: str) -> tuple[Tensor, Tensor]:
    """Truncated importance-sampling weight against the generator's (behaviour) policy.

    Token level: `w_{i,t} = min(pi_old(y_{i,t}) / pi_gen(y_{i,t}), C)`; sequence level:
    `w_i = min(prod_t pi_old(y_{i,t}) / pi_gen(y_{i,t}), C)` on every token of the sample
    (Yao et al. 2025, "Your Efficient RL Framework Secretly Brings You Off-Policy RL Training",
    fengyao.notion.site; TIS). The weight is detached and multiplies the token loss. The cap is
    applied in log space so a long sequence's product cannot overflow.

    Shapes: `old, behavior [N, T]` (padding zeroed), `m [N, T]` -> (weight, truncated), `[N, T]`.
    """
    log_w = torch.where(m, old - behavior, torch.zeros_like(old))
    if level == "sequence":
        log_w = log_w.sum(dim=-1, keepdim=True).expand_as(old)
    log_cap = math.log(cap)
    truncated = m & (log_w > log_cap)
    return torch.exp(log_w.clamp(max=log_cap)), truncated


def per_token_policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    loss_type: str = "cispo",
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    eps_max: float = 4.0,
    dual_clip_c: float | None = None,
    cispo_eps_min: float | None = None,
    behavior_logprobs: Tensor | None = None,
    tis_cap: float | None = None,
    tis_level: str = "token",
    keep_mask: Tensor | None = None,
    kimi_tau: float | None = None,
) -> tuple[Tensor, TokenStats]:
    """Loss of every response token for `loss_type` `"grpo"`, `"gspo"`, `"cispo"` or `"kimi"`.

    - `"grpo"`: PPO clipped surrogate on the token ratio with range
      `[1 - eps_low, 1 + eps_high]` (DAPO clip-higher when `eps_high > eps_low`) and optional
      dual clip `dual_clip_c > 1` for negative advantages (see `_grpo_loss`).
    - `"gspo"`: sequence ratio `exp(mean_t log r_{i,t})`, clipped, in GSPO-token gradient form
      (see `_gspo_loss`); `dual_clip_c` applies as for GRPO.
    - `"cispo"`: `-sg(clip(r, cispo_eps_min, eps_max)) A logp` (ScaleRL eq. 4; the lower bound is
      off by default). `eps_low`/`eps_high` are unused.
    - `"kimi"`: Kimi k1.5's online-mirror-descent surrogate `(A_i - tau rho_i)^2 / (2 tau)` with
      the sequence log-ratio `rho_i` against `old_logprobs` (Kimi k1.5, arXiv 2501.12599,
      §2.3.2; see `_kimi_loss`), on each of the sample's tokens. Needs `kimi_tau` and per-sample
      advantages `[N]` (the group-mean advantage `r_i - mean_g` is the report's estimate of
      `r - tau log Z`); no clipping.

    With `behavior_logprobs` (generator log-probs) and `tis_cap`, each token loss is multiplied by
    the truncated IS weight `sg(min(pi_old / pi_gen, tis_cap))`, per token or per sequence
    (`tis_level`). `keep_mask` (`[N]` or `[N, T]`, True = keep) zeroes the loss of dropped tokens
    without changing anything else — in particular not the aggregation's token counts, matching
    DeepSeek-V3.2's off-policy sequence masking where `M_{i,t}` multiplies the token term inside
    the `1/|o_i|` average.

    A sample's advantage is broadcast over its tokens when `advantages` is `[N]`. A micro-batch
    with no response token is allowed (its loss is all zeros).

    Shapes: `logprobs, old_logprobs [N, T]` (float), `advantages [N]` or `[N, T]`,
    `mask [N, T]` (bool or 0/1), `behavior_logprobs [N, T]` -> (loss `[N, T]`, `TokenStats`).
    """
    lp_in = check_float_tensor("logprobs", logprobs, ndim=2, dims="[N, T]")
    old_in = check_float_tensor("old_logprobs", old_logprobs)
    check_same_shape("old_logprobs", old_in, "logprobs", lp_in, "[N, T]")
    m = as_bool_mask("mask", mask, "logprobs", lp_in)
    adv_in = check_advantages(advantages, lp_in)
    check_choice("loss_type", loss_type, LOSS_TYPES)
    check_number("eps_low", eps_low, low=0.0, high=1.0)
    check_number("eps_high", eps_high, low=0.0)
    check_number("eps_max", eps_max, low=0.0, low_inclusive=False)
    if dual_clip_c is not None:
        if loss_type in ("cispo", "kimi"):
            raise ValueError("dual_clip_c: only used by loss_type 'grpo' or 'gspo'")
        check_number("dual_clip_c", dual_clip_c, low=1.0, low_inclusive=False)
    if cispo_eps_min is not None:
        if loss_type != "cispo":
            raise ValueError("cispo_eps_min: only used by loss_type 'cispo'")
        check_number("cispo_eps_min", cispo_eps_min, low=0.0, high=eps_max)
    if loss_type == "kimi":
        if kimi_tau is None:
            raise ValueError("kimi_tau: required for loss_type 'kimi'")
        check_number("kimi_tau", kimi_tau, low=0.0, low_inclusive=False)
        if dual_clip_c is not None:
            raise ValueError("dual_clip_c: only used by loss_type 'grpo' or 'gspo'")
        if adv_in.dim() != 1:
            raise ValueError(
                f"advantages: loss_type 'kimi' needs one advantage per sample, shape [N] = "
                f"({lp_in.shape[0]},), got {tuple(adv_in.shape)}"
            )
    elif kimi_tau is not None:
        raise ValueError(f"kimi_tau: only used by loss_type 'kimi', got loss_type={loss_type!r}")
    check_choice("tis_level", tis_level, TIS_LEVELS)
    if behavior_logprobs is not None and tis_cap is None:
        raise ValueError("tis_cap: required when behavior_logprobs is given")
    if tis_cap is not None:
        if behavior_logprobs is None:
            raise ValueError("behavior_logprobs: required when tis_cap is given")
        check_number("tis_cap", tis_cap, low=0.0, low_inclusive=False)
        beh_in = check_float_tensor("behavior_logprobs", behavior_logprobs)
        check_same_shape("behavior_logprobs", beh_in, "logprobs", lp_in, "[N, T]")
        check_finite("behavior_logprobs", beh_in.detach(), m)
    keep = m if keep_mask is None else m & as_row_or_token_mask("keep_mask", keep_mask, lp_in)

    check_finite("logprobs", lp_in.detach(), m)
    check_finite("old_logprobs", old_in.detach(), m)
    if adv_in.dim() == 1:
        check_finite("advantages", adv_in.detach(), m.any(dim=-1))
    else:
        check_finite("advantages", adv_in.detach(), m)

    # A constant (grad-free) zero: `where` routes no gradient to the unselected padding entries.
    zero = torch.zeros_like(lp_in, requires_grad=False)
    lp = torch.where(m, lp_in, zero)
    old = torch.where(m, old_in.detach().to(lp.dtype), zero)
    adv_d = adv_in.detach().to(lp.dtype)
    # Advantages are sanitised like the log-probs, so padded positions (e.g. the rows of empty
    # samples, whose advantage may be NaN) only ever compute on finite numbers.
    adv = torch.where(m, adv_d[:, None] if adv_d.dim() == 1 else adv_d, zero)
    no_flags = torch.zeros_like(m)

    if loss_type == "grpo":
        loss, ratio, low, high, dual = _grpo_loss(lp, old, adv, eps_low, eps_high, dual_clip_c)
        eps_trunc = no_flags
    elif loss_type == "gspo":
        loss, ratio, low, high, dual = _gspo_loss(lp, old, adv, m, eps_low, eps_high, dual_clip_c)
        eps_trunc = no_flags
    elif loss_type == "kimi":
        loss, ratio = _kimi_loss(lp, old, torch.where(m.any(dim=-1), adv_d, torch.zeros_like(adv_d)), m,
                                 float(kimi_tau))  # type: ignore[arg-type]
        low = high = dual = eps_trunc = no_flags
    else:
        loss, ratio, low, high = _cispo_loss(lp, old, adv, eps_max, cispo_eps_min)
        dual = no_flags
        eps_trunc = high

    if behavior_logprobs is not None and tis_cap is not None:
        behavior = torch.where(m, behavior_logprobs.detach().to(lp.dtype), zero)
        tis_w, tis_trunc = _tis_weight(old, behavior, m, tis_cap, tis_level)
        loss = loss * tis_w
    else:
        tis_w = torch.ones_like(zero)
        tis_trunc = no_flags

    loss = torch.where(keep, loss, zero)
    stats = TokenStats(
        mask=m,
        ratio=torch.where(m, ratio.detach(), torch.ones_like(zero)),
        clipped_low=low & m,
        clipped_high=high & m,
        dual_clipped=dual & m,
        eps_max_truncated=eps_trunc & m,
        tis_truncated=tis_trunc & m,
        tis_weight=torch.where(m, tis_w, torch.ones_like(tis_w)),
        dropped=m & ~keep,
    )
    return loss, stats
