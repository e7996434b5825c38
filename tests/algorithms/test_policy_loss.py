"""policy_loss as a whole: the contract call, exact micro-batching, padding, dtypes, statistics."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
import torch

from scalerl.algorithms import (
    STAT_KEYS,
    compute_advantages,
    kl_penalty,
    merge_policy_stats,
    per_token_policy_loss,
    policy_loss,
    reduce_token_stats,
    token_weights,
    weighted_token_sum,
)

from .conftest import MAX_TOKENS, Batch

LOSS_TYPES = ["grpo", "gspo", "cispo"]
AGGREGATIONS = ["sample", "prompt", "token", "constant"]
# Options that exercise every branch: clip-higher and dual clip, CISPO's floor, TIS, a keep mask.
EXTRAS: dict[str, dict[str, Any]] = {
    "grpo": {"eps_low": 0.2, "eps_high": 0.28, "dual_clip_c": 1.5},
    "gspo": {"eps_low": 0.05, "eps_high": 0.08},
    "cispo": {"eps_max": 1.3, "cispo_eps_min": 0.7},
}
KEEP = torch.tensor([True, True, False, True, True, True, False, True])


def _full(batch: Batch, loss_type: str, aggregation: str, **kw: Any) -> tuple[torch.Tensor, dict[str, float]]:
    return policy_loss(
        batch.logprobs,
        batch.old_logprobs,
        batch.advantages,
        batch.mask,
        batch.group_ids,
        loss_type=loss_type,
        aggregation=aggregation,
        max_tokens=MAX_TOKENS,
        **kw,
    )


def test_contract_call_runs_and_returns_floats(make_batch: Callable[..., Batch]) -> None:
    b = make_batch().leaf()
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 1.0], dtype=torch.float64)
    adv = compute_advantages(rewards, b.group_ids, adv_norm="group", eps=1e-6)
    loss, stats = policy_loss(
        b.logprobs,
        b.old_logprobs,
        adv,
        b.mask,
        b.group_ids,
        loss_type="cispo",
        aggregation="prompt",
        eps_low=0.2,
        eps_high=0.2,
        eps_max=4.0,
        max_tokens=None,
    )
    assert loss.dim() == 0 and loss.requires_grad
    for key in ("clip_frac_low", "clip_frac_high", "ratio_mean", "ratio_max", "is_truncated_frac"):
        assert isinstance(stats[key], float)
    assert set(stats) == set(STAT_KEYS)
    kl = kl_penalty(b.logprobs, b.old_logprobs, estimator="k3", old_logprobs=None)
    assert kl.shape == b.logprobs.shape


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
@pytest.mark.parametrize("aggregation", AGGREGATIONS)
@pytest.mark.parametrize("variant", ["plain", "tis_keep"])
def test_micro_batching_is_exact(
    make_batch: Callable[..., Batch], loss_type: str, aggregation: str, variant: str
) -> None:
    """Weights from the full batch, sliced per micro-batch (each trimmed to its own padding width)."""
    b = make_batch(seed=7).leaf()
    kw: dict[str, Any] = dict(EXTRAS[loss_type])
    if variant == "tis_keep":
        kw |= {"behavior_logprobs": b.behavior_logprobs, "tis_cap": 1.5, "keep_mask": KEEP}
    full_loss, full_stats = _full(b, loss_type, aggregation, **kw)
    (full_grad,) = torch.autograd.grad(full_loss, b.logprobs)

    weights = token_weights(b.mask, b.group_ids, aggregation, MAX_TOKENS, dtype=torch.float64)
    lp = b.logprobs.detach().clone().requires_grad_(True)
    total = torch.zeros((), dtype=torch.float64)
    parts = []
    for rows in (slice(0, 3), slice(3, 6), slice(6, 8)):
        width = max(int(b.mask[rows].sum(-1).max()), 1)
        cols = slice(0, width)
        mb_kw = dict(kw)
        if variant == "tis_keep":
            mb_kw |= {"behavior_logprobs": b.behavior_logprobs[rows, cols], "keep_mask": KEEP[rows]}
        loss_tok, token_stats = per_token_policy_loss(
            lp[rows, cols],
            b.old_logprobs[rows, cols],
            b.advantages[rows],
            b.mask[rows, cols],
            loss_type=loss_type,
            **mb_kw,
        )
        mb_loss = weighted_token_sum(loss_tok, weights[rows, cols])
        mb_loss.backward()  # accumulate, as a trainer does
        total = total + mb_loss.detach()
        parts.append(reduce_token_stats(token_stats))

    assert total.item() == pytest.approx(full_loss.item(), rel=1e-12, abs=1e-14)
    torch.testing.assert_close(lp.grad, full_grad, rtol=1e-12, atol=1e-14)
    merged = merge_policy_stats(parts)
    assert merged == pytest.approx(full_stats, rel=1e-12)


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_padding_width_and_garbage_do_not_matter(
    make_batch: Callable[..., Batch], loss_type: str, aggregation: str
) -> None:
    b = make_batch(seed=3).leaf()
    kw = dict(EXTRAS[loss_type]) | {"behavior_logprobs": b.behavior_logprobs, "tis_cap": 2.0}
    loss, stats = _full(b, loss_type, aggregation, **kw)
    (grad,) = torch.autograd.grad(loss, b.logprobs)

    extra = 4
    pad = torch.zeros(8, extra, dtype=torch.bool)
    wide_mask = torch.cat([b.mask, pad], dim=1)

    # Garbage everywhere outside the mask, including the original batch's own padding.
    def garbage(x: torch.Tensor, value: float) -> torch.Tensor:
        wide = torch.cat([x.detach(), torch.zeros(8, extra, dtype=x.dtype)], dim=1)
        return torch.where(wide_mask, wide, torch.full_like(wide, value))

    lp_wide = garbage(b.logprobs, math.nan).requires_grad_(True)
    adv_tok = torch.where(wide_mask, b.advantages[:, None].expand(8, 7 + extra), torch.tensor(math.nan))
    wide_loss, wide_stats = policy_loss(
        lp_wide,
        garbage(b.old_logprobs, math.inf),
        adv_tok,
        wide_mask,
        b.group_ids,
        loss_type=loss_type,
        aggregation=aggregation,
        max_tokens=MAX_TOKENS,
        **(kw | {"behavior_logprobs": garbage(b.behavior_logprobs, -math.inf)}),
    )
    (wide_grad,) = torch.autograd.grad(wide_loss, lp_wide)
    assert wide_loss.item() == pytest.approx(loss.item(), rel=1e-12, abs=1e-14)
    torch.testing.assert_close(wide_grad[:, :7], torch.where(b.mask, grad, torch.zeros_like(grad)))
    assert torch.isfinite(wide_grad).all()
    assert wide_grad[~wide_mask].abs().sum().item() == 0.0
    assert wide_stats == pytest.approx(stats, rel=1e-12)


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_float32_and_float64_agree(
    make_batch: Callable[..., Batch], loss_type: str, aggregation: str
) -> None:
    b64 = make_batch(seed=5).leaf()
    b32 = b64.to(torch.float32).leaf()
    results = []
    for b in (b64, b32):
        loss, stats = _full(b, loss_type, aggregation, **EXTRAS[loss_type])
        (grad,) = torch.autograd.grad(loss, b.logprobs)
        assert loss.dtype == b.logprobs.dtype and grad.dtype == b.logprobs.dtype
        results.append((loss.item(), grad.double(), stats))
    (l64, g64, s64), (l32, g32, s32) = results
    assert l32 == pytest.approx(l64, rel=1e-5, abs=1e-6)
    torch.testing.assert_close(g32, g64, rtol=1e-4, atol=1e-6)
    assert s32 == pytest.approx(s64, rel=1e-5, abs=1e-6)


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_policy_loss_is_weighted_sum_of_per_token_losses(
    make_batch: Callable[..., Batch], loss_type: str
) -> None:
    b = make_batch(seed=11)
    loss, _ = _full(b, loss_type, "prompt")
    tok, _ = per_token_policy_loss(b.logprobs, b.old_logprobs, b.advantages, b.mask, loss_type=loss_type)
    # Prompt-level mean written out: each prompt's token sum over its token count, averaged over prompts.
    per_prompt = []
    for gid in sorted(set(b.group_ids.tolist())):
        rows = b.group_ids == gid
        per_prompt.append(tok[rows][b.mask[rows]].sum() / b.mask[rows].sum())
    assert loss.item() == pytest.approx(torch.stack(per_prompt).mean().item(), rel=1e-12)


def test_equal_lengths_make_all_aggregations_agree() -> None:
    gen = torch.Generator().manual_seed(4)
    lp = -torch.rand(6, 5, generator=gen, dtype=torch.float64)
    old = lp + 0.2 * torch.randn(6, 5, generator=gen, dtype=torch.float64)
    adv = torch.randn(6, generator=gen, dtype=torch.float64)
    mask = torch.zeros(6, 5, dtype=torch.bool)
    mask[:, :4] = True
    groups = torch.tensor([0, 0, 0, 1, 1, 1])
    for loss_type in LOSS_TYPES:
        values = [
            policy_loss(lp, old, adv, mask, groups, loss_type=loss_type, aggregation=a, max_tokens=4)[
                0
            ].item()
            for a in AGGREGATIONS
        ]
        assert values == pytest.approx([values[0]] * 4, rel=1e-12)


def test_merge_policy_stats_rejects_foreign_keys() -> None:
    with pytest.raises(ValueError, match=r"^parts: dict 0 has keys"):
        merge_policy_stats([{"loss": 1.0}])
    with pytest.raises(ValueError, match=r"^parts: expected at least one"):
        merge_policy_stats([])


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_nan_advantage_of_an_empty_sample_does_not_reach_the_gradient(
    make_batch: Callable[..., Batch], loss_type: str
) -> None:
    b = make_batch(seed=2).leaf()
    assert not b.mask[3].any()  # row 3 is the empty response
    adv = b.advantages.clone()
    loss, _ = _full(b, loss_type, "token")
    (grad,) = torch.autograd.grad(loss, b.logprobs)
    adv[3] = math.nan
    lp = b.logprobs.detach().clone().requires_grad_(True)
    nan_loss, _ = policy_loss(
        lp, b.old_logprobs, adv, b.mask, b.group_ids, loss_type=loss_type, aggregation="token"
    )
    (nan_grad,) = torch.autograd.grad(nan_loss, lp)
    assert nan_loss.item() == loss.item()
    assert torch.isfinite(nan_grad).all()
    torch.testing.assert_close(nan_grad, grad, rtol=0, atol=0)
