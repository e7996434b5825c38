"""The batch policy loss: per-token objective composed with the chosen aggregation."""

from __future__ import annotations

from torch import Tensor

from scalerl.algorithms._checks import check_choice, check_response_mask, check_tensor
from scalerl.algorithms.aggregation import AGGREGATIONS, token_weights, weighted_token_sum
from scalerl.algorithms.objectives import per_token_policy_loss
from scalerl.algorithms.stats import reduce_token_stats


def policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    group_ids: Tensor | None = None,
    loss_type: str = "cispo",
    aggregation: str = "prompt",
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    eps_max: float = 4.0,
    max_tokens: int | None = None,
    *,
    dual_clip_c: float | None = None,
    cispo_eps_min: float | None = None,
    behavior_logprobs: Tensor | None = None,
    tis_cap: float | None = None,
    tis_level: str = "token",
    keep_mask: Tensor | None = None,
    kimi_tau: float | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """Scalar policy loss to minimise over the batch given, and its statistics.

    `loss = sum_{i,t} w_{i,t} l_{i,t}` with `l = per_token_policy_loss(...)` (GRPO / GSPO / CISPO / Kimi,
    optional dual clip, TIS and keep mask; see there for formulas and sources) and
    `w = token_weights(mask, group_ids, aggregation, max_tokens)` (sample / prompt / token /
    constant; see there). The defaults are ScaleRL's choices (CISPO, prompt-level aggregation).

    This aggregates over exactly the batch passed in. For gradient accumulation over micro-batches,
    compute `token_weights` once on the full step batch and sum
    `weighted_token_sum(per_token_policy_loss(mb)[0], w[mb])` — the same value and gradient as
    calling this on the full batch.

    Statistics (python floats over response tokens, see `stats.reduce_token_stats`):
    `clip_frac_low`, `clip_frac_high`, `ratio_mean`, `ratio_max`, `is_truncated_frac`, and more.

    Shapes: `logprobs, old_logprobs, behavior_logprobs [N, T]`, `advantages [N]` or `[N, T]`,
    `mask [N, T]` (bool or 0/1, at least one token), `group_ids [N]` (int; required for
    `aggregation="prompt"`), `keep_mask [N]` or `[N, T]` -> (scalar, dict).
    """
    # Cheap checks first, so a config typo fails before any loss is computed.
    check_choice("aggregation", aggregation, AGGREGATIONS)
    check_tensor("logprobs", logprobs)
    check_tensor("mask", mask)
    if logprobs.dim() == 2:
        check_response_mask(mask, "logprobs", logprobs)
    loss_tokens, token_stats = per_token_policy_loss(
        logprobs,
        old_logprobs,
        advantages,
        mask,
        loss_type=loss_type,
        eps_low=eps_low,
        eps_high=eps_high,
        eps_max=eps_max,
        dual_clip_c=dual_clip_c,
        cispo_eps_min=cispo_eps_min,
        behavior_logprobs=behavior_logprobs,
        tis_cap=tis_cap,
        tis_level=tis_level,
        keep_mask=keep_mask,
        kimi_tau=kimi_tau,
    )
    weights = token_weights(mask, group_ids, aggregation, max_tokens, dtype=loss_tokens.dtype)
    return weighted_token_sum(loss_tokens, weights), reduce_token_stats(token_stats)
