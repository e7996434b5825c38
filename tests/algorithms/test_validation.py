"""Bad input raises ValueError naming the argument (mismatched shapes, empty masks, NaN, unknown names)."""

from __future__ import annotations

import re
from typing import Any

import pytest
import torch

from scalerl.algorithms import (
    compute_advantages,
    entropy_from_logits,
    kl_penalty,
    per_token_policy_loss,
    policy_loss,
    token_weights,
)

N, T = 4, 7


def _args(**override: Any) -> dict[str, Any]:
    args: dict[str, Any] = {
        "logprobs": -torch.rand(N, T),
        "old_logprobs": -torch.rand(N, T),
        "advantages": torch.randn(N),
        "mask": torch.ones(N, T, dtype=torch.bool),
        "group_ids": torch.tensor([0, 0, 1, 1]),
    }
    args.update(override)
    return args


def _raises(message: str, **override: Any) -> None:
    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        policy_loss(**_args(**override))


def test_documented_messages() -> None:
    _raises("mask: expected shape [N, T] = (4, 7) matching logprobs, got (4, 6)", mask=torch.ones(N, 6))
    _raises("loss_type: unknown 'foo'; expected one of cispo, grpo, gspo, kimi", loss_type="foo")
    _raises("mask: no response tokens (empty mask)", mask=torch.zeros(N, T))
    with pytest.raises(ValueError, match=r"^rewards: contains NaN at index 3$"):
        compute_advantages(torch.tensor([0.0, 1.0, 0.0, float("nan")]), torch.tensor([0, 0, 1, 1]))


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (
            {"old_logprobs": torch.zeros(N, T + 1)},
            "old_logprobs: expected shape [N, T] = (4, 7) matching logprobs",
        ),
        ({"advantages": torch.zeros(N + 1)}, "advantages: expected shape [N] = (4,) or [N, T] = (4, 7)"),
        ({"group_ids": torch.tensor([0, 1])}, "group_ids: expected shape [N] = (4,) matching mask, got (2,)"),
        (
            {"group_ids": torch.tensor([0.0, 0, 1, 1])},
            "group_ids: expected an integer tensor, got torch.float32",
        ),
        ({"group_ids": None}, "group_ids: required for aggregation='prompt'"),
        (
            {"aggregation": "mean"},
            "aggregation: unknown 'mean'; expected one of constant, prompt, sample, token",
        ),
        ({"logprobs": torch.zeros(N, T, dtype=torch.long)}, "logprobs: expected a floating-point tensor"),
        ({"logprobs": torch.zeros(N * T)}, "logprobs: expected a 2-D tensor [N, T], got shape (28,)"),
        ({"mask": torch.full((N, T), 2.0)}, "mask: expected only 0/1 values (or a bool tensor)"),
        ({"eps_low": -0.1}, "eps_low: expected a number >= 0, got -0.1"),
        ({"eps_max": 0.0}, "eps_max: expected a number > 0, got 0.0"),
        ({"eps_high": float("nan")}, "eps_high: expected a finite number, got nan"),
        ({"loss_type": "grpo", "dual_clip_c": 1.0}, "dual_clip_c: expected a number > 1, got 1.0"),
        ({"dual_clip_c": 3.0}, "dual_clip_c: only used by loss_type 'grpo' or 'gspo'"),
        ({"loss_type": "grpo", "cispo_eps_min": 0.5}, "cispo_eps_min: only used by loss_type 'cispo'"),
        ({"behavior_logprobs": torch.zeros(N, T)}, "tis_cap: required when behavior_logprobs is given"),
        ({"tis_cap": 2.0}, "behavior_logprobs: required when tis_cap is given"),
        (
            {"behavior_logprobs": torch.zeros(N, T), "tis_cap": 2.0, "tis_level": "prompt"},
            "tis_level: unknown 'prompt'; expected one of sequence, token",
        ),
        (
            {"keep_mask": torch.ones(3, dtype=torch.bool)},
            "keep_mask: expected shape [N] = (4,) or [N, T] = (4, 7)",
        ),
        ({"aggregation": "constant"}, "max_tokens: required for aggregation='constant'"),
    ],
)
def test_policy_loss_argument_errors(override: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match="^" + re.escape(message)):
        policy_loss(**_args(**override))


def test_non_finite_inputs_on_response_tokens_are_errors_but_padding_is_free() -> None:
    old = -torch.rand(N, T)
    old[1, 4] = float("nan")
    with pytest.raises(ValueError, match=r"^old_logprobs: contains NaN at index \(1, 4\)$"):
        policy_loss(**_args(old_logprobs=old))
    lp = -torch.rand(N, T)
    lp[2, 0] = float("-inf")
    with pytest.raises(ValueError, match=r"^logprobs: contains inf at index \(2, 0\)$"):
        policy_loss(**_args(logprobs=lp))
    adv = torch.randn(N)
    adv[0] = float("nan")
    with pytest.raises(ValueError, match=r"^advantages: contains NaN at index 0$"):
        policy_loss(**_args(advantages=adv))
    mask = torch.ones(N, T, dtype=torch.bool)
    mask[1, 4:] = False
    mask[0] = False  # an empty row may carry a NaN advantage
    loss, _ = policy_loss(**_args(old_logprobs=old, advantages=adv, mask=mask))
    assert torch.isfinite(loss)


def test_per_token_policy_loss_validates_too() -> None:
    with pytest.raises(
        ValueError, match=r"^mask: expected shape \[N, T\] = \(4, 7\) matching logprobs, got \(7, 4\)$"
    ):
        per_token_policy_loss(-torch.rand(N, T), -torch.rand(N, T), torch.zeros(N), torch.ones(T, N))


def test_other_entry_points_name_their_arguments() -> None:
    with pytest.raises(ValueError, match=r"^adv_norm: unknown 'std'; expected one of batch, group, none$"):
        compute_advantages(torch.zeros(2), torch.tensor([0, 0]), adv_norm="std")
    with pytest.raises(
        ValueError, match=r"^group_ids: expected shape \[N\] = \(2,\) matching rewards, got \(3,\)$"
    ):
        compute_advantages(torch.zeros(2), torch.tensor([0, 0, 1]))
    with pytest.raises(ValueError, match=r"^rewards: expected a floating-point tensor, got torch.int64$"):
        compute_advantages(torch.tensor([1, 0]), torch.tensor([0, 0]))
    with pytest.raises(ValueError, match=r"^rewards: contains inf at index 0$"):
        compute_advantages(torch.tensor([float("inf"), 0.0]), torch.tensor([0, 0]))
    with pytest.raises(
        ValueError, match=r"^estimator: unknown 'k4'; expected one of k1, k2, k3, unbiased_k3$"
    ):
        kl_penalty(torch.zeros(2, 2), torch.zeros(2, 2), "k4")
    with pytest.raises(
        ValueError, match=r"^ref_logprobs: expected shape \[N, T\] = \(2, 2\) matching logprobs"
    ):
        kl_penalty(torch.zeros(2, 2), torch.zeros(2, 3))
    with pytest.raises(ValueError, match=r"^mask: no response tokens \(empty mask\)$"):
        token_weights(torch.zeros(2, 3, dtype=torch.bool), None, "token")
    with pytest.raises(
        ValueError, match=r"^mask: expected shape \[N, T\] = \(2, 3\) matching logits\[\.\.\., 0\]"
    ):
        entropy_from_logits(torch.zeros(2, 3, 5), torch.ones(3, 2, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"^rewards: expected a torch.Tensor, got list$"):
        compute_advantages([1.0, 0.0], torch.tensor([0, 0]))  # type: ignore[arg-type]
