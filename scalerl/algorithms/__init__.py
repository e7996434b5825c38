"""RL objectives for LLM post-training on verifiable rewards: pure tensor functions.

No model, no engine, no I/O. Shapes: `[N]` per sample, `[N, T]` per response token, `mask [N, T]`
(bool or 0/1) marks response tokens, `group_ids [N]` (int) names each sample's prompt. Every
function documents its formula and source; see docs/algorithms.md for the overview.

    from scalerl.algorithms import compute_advantages, policy_loss, kl_penalty

    adv = compute_advantages(rewards, group_ids, adv_norm="group", eps=1e-6)
    loss, stats = policy_loss(logprobs, old_logprobs, adv, mask, group_ids,
                              loss_type="cispo", aggregation="prompt", eps_max=4.0)
    kl = kl_penalty(logprobs, ref_logprobs, estimator="k3", mask=mask)
"""

from scalerl.algorithms.advantages import ADV_NORMS, BASELINES, compute_advantages, masked_whiten
from scalerl.algorithms.aggregation import AGGREGATIONS, aggregate, token_weights, weighted_token_sum
from scalerl.algorithms.distill import distillation_advantages, full_reverse_kl, reverse_kl_advantages
from scalerl.algorithms.entropy import entropy_bonus, entropy_from_logits
from scalerl.algorithms.filters import (
    PassRateEntry,
    PassRateHistory,
    ZeroVarianceCounts,
    is_informative_group,
    no_positive_resampling,
    zero_variance_filter,
    zero_variance_mask,
)
from scalerl.algorithms.kl import KL_ESTIMATORS, kl_penalty, kl_shaped_rewards
from scalerl.algorithms.length import (
    apply_kimi_length_reward,
    apply_overlong_penalty,
    kimi_length_coef,
    kimi_length_reward,
    overlong_penalty,
)
from scalerl.algorithms.loss import policy_loss
from scalerl.algorithms.masks import (
    keep_sampling_logprobs,
    off_policy_sequence_mask,
    support_mask_from_indices,
    top_k_top_p_support,
)
from scalerl.algorithms.mirror_descent import kimi_sequence_loss
from scalerl.algorithms.objectives import LOSS_TYPES, TIS_LEVELS, TokenStats, per_token_policy_loss
from scalerl.algorithms.returns import (
    discounted_returns,
    gae_advantages,
    last_step_index,
    length_adaptive_lambda,
    token_rewards,
)
from scalerl.algorithms.stats import STAT_KEYS, merge_policy_stats, reduce_token_stats
from scalerl.algorithms.value import explained_variance, value_loss

__all__ = [
    "ADV_NORMS",
    "AGGREGATIONS",
    "BASELINES",
    "KL_ESTIMATORS",
    "LOSS_TYPES",
    "STAT_KEYS",
    "TIS_LEVELS",
    "PassRateEntry",
    "PassRateHistory",
    "TokenStats",
    "ZeroVarianceCounts",
    "aggregate",
    "apply_kimi_length_reward",
    "apply_overlong_penalty",
    "compute_advantages",
    "discounted_returns",
    "distillation_advantages",
    "entropy_bonus",
    "entropy_from_logits",
    "explained_variance",
    "full_reverse_kl",
    "gae_advantages",
    "is_informative_group",
    "keep_sampling_logprobs",
    "kimi_length_coef",
    "kimi_length_reward",
    "kimi_sequence_loss",
    "kl_penalty",
    "kl_shaped_rewards",
    "last_step_index",
    "length_adaptive_lambda",
    "masked_whiten",
    "merge_policy_stats",
    "no_positive_resampling",
    "off_policy_sequence_mask",
    "overlong_penalty",
    "per_token_policy_loss",
    "policy_loss",
    "reduce_token_stats",
    "reverse_kl_advantages",
    "support_mask_from_indices",
    "token_rewards",
    "token_weights",
    "top_k_top_p_support",
    "value_loss",
    "weighted_token_sum",
    "zero_variance_filter",
    "zero_variance_mask",
]
