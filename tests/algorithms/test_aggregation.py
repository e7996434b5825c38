"""token_weights / weighted_token_sum / aggregate: closed forms, invariants, NaN safety."""

from __future__ import annotations

import pytest
import torch

from scalerl.algorithms import aggregate, token_weights, weighted_token_sum

# Lengths 4, 2, 1, 0 (the last row is empty); prompts {0, 1} and {2, 3}.
MASK = torch.tensor(
    [
        [1, 1, 1, 1],
        [1, 1, 0, 0],
        [1, 0, 0, 0],
        [0, 0, 0, 0],
    ],
    dtype=torch.bool,
)
GROUPS = torch.tensor([0, 0, 1, 1])


def _rows(*row_weights: float) -> torch.Tensor:
    return MASK.double() * torch.tensor(row_weights, dtype=torch.float64)[:, None]


def test_token_weights_closed_form() -> None:
    expected = {
        # 7 tokens in the batch.
        "token": _rows(1 / 7, 1 / 7, 1 / 7, 0),
        # 3 non-empty samples: 1 / (L_i * 3).
        "sample": _rows(1 / 12, 1 / 6, 1 / 3, 0),
        # prompt 0 has 6 tokens, prompt 1 has 1; 2 prompts: 1 / (C_g * 2).
        "prompt": _rows(1 / 12, 1 / 12, 1 / 2, 0),
        # N * max_tokens = 4 * 5.
        "constant": _rows(1 / 20, 1 / 20, 1 / 20, 0),
    }
    for aggregation, want in expected.items():
        got = token_weights(MASK, GROUPS, aggregation, max_tokens=5, dtype=torch.float64)
        torch.testing.assert_close(got, want, rtol=0, atol=1e-15, msg=aggregation)


def test_float_mask_is_accepted() -> None:
    a = token_weights(MASK.float(), GROUPS, "prompt")
    b = token_weights(MASK, GROUPS, "prompt")
    torch.testing.assert_close(a, b)
    assert a.dtype == torch.float32


def test_weights_sum_to_one_except_constant() -> None:
    gen = torch.Generator().manual_seed(1)
    mask = torch.rand(12, 9, generator=gen) < 0.6
    groups = torch.randint(0, 4, (12,), generator=gen)
    for aggregation in ("token", "sample", "prompt"):
        w = token_weights(mask, groups, aggregation, dtype=torch.float64)
        assert w.sum().item() == pytest.approx(1.0, abs=1e-12)
    w = token_weights(mask, groups, "constant", max_tokens=9, dtype=torch.float64)
    assert w.sum().item() == pytest.approx(mask.sum().item() / (12 * 9), abs=1e-12)


def test_prompt_aggregation_matches_explicit_loops() -> None:
    gen = torch.Generator().manual_seed(2)
    values = torch.randn(10, 6, generator=gen, dtype=torch.float64)
    mask = torch.rand(10, 6, generator=gen) < 0.7
    groups = torch.tensor([4, 4, 4, 1, 1, 8, 8, 8, 8, 2])
    per_prompt = []
    for gid in sorted(set(groups.tolist())):
        rows = [i for i in range(10) if groups[i] == gid]
        tokens = sum(int(mask[i].sum()) for i in rows)
        if tokens:
            total = sum(float(values[i, t]) for i in rows for t in range(6) if mask[i, t])
            per_prompt.append(total / tokens)
    expected = sum(per_prompt) / len(per_prompt)
    assert aggregate(values, mask, groups, "prompt").item() == pytest.approx(expected, rel=1e-12)

    per_sample = [
        sum(float(values[i, t]) for t in range(6) if mask[i, t]) / int(mask[i].sum())
        for i in range(10)
        if mask[i].any()
    ]
    assert aggregate(values, mask, None, "sample").item() == pytest.approx(
        sum(per_sample) / len(per_sample), rel=1e-12
    )


def test_modes_agree_with_equal_lengths_and_group_sizes() -> None:
    gen = torch.Generator().manual_seed(3)
    values = torch.randn(6, 5, generator=gen, dtype=torch.float64)
    mask = torch.zeros(6, 5, dtype=torch.bool)
    mask[:, :3] = True
    groups = torch.tensor([0, 0, 1, 1, 2, 2])
    results = [aggregate(values, mask, groups, a, max_tokens=3).item() for a in ("token", "sample", "prompt")]
    results.append(aggregate(values, mask, groups, "constant", max_tokens=3).item())
    assert results == pytest.approx([results[0]] * 4, rel=1e-12)


@pytest.mark.parametrize("aggregation", ["token", "sample", "prompt", "constant"])
def test_weights_are_invariant_to_padding_width(aggregation: str) -> None:
    wide = torch.cat([MASK, torch.zeros(4, 3, dtype=torch.bool)], dim=1)
    narrow_w = token_weights(MASK, GROUPS, aggregation, max_tokens=5)
    wide_w = token_weights(wide, GROUPS, aggregation, max_tokens=5)
    torch.testing.assert_close(wide_w[:, :4], narrow_w)
    assert wide_w[:, 4:].abs().sum().item() == 0.0


def test_weighted_token_sum_keeps_padding_nan_out_of_value_and_gradient() -> None:
    values = torch.tensor([[1.0, 2.0, float("nan")], [3.0, float("inf"), float("-inf")]], requires_grad=True)
    weights = torch.tensor([[0.5, 0.25, 0.0], [0.25, 0.0, 0.0]])
    out = weighted_token_sum(values, weights)
    assert out.item() == pytest.approx(0.5 + 0.5 + 0.75)
    out.backward()
    assert values.grad is not None
    torch.testing.assert_close(values.grad, weights)


def test_weights_are_cast_to_values_dtype() -> None:
    values = torch.ones(4, 4, dtype=torch.float64)
    w = token_weights(MASK, GROUPS, "token")
    out = weighted_token_sum(values, w)
    assert out.dtype == torch.float64
    assert out.item() == pytest.approx(1.0, rel=1e-6)


def test_constant_requires_max_tokens_covering_every_response() -> None:
    with pytest.raises(ValueError, match=r"^max_tokens: required for aggregation='constant'$"):
        token_weights(MASK, GROUPS, "constant")
    with pytest.raises(
        ValueError, match=r"^max_tokens: 3 is smaller than the longest response \(4 tokens\)$"
    ):
        token_weights(MASK, GROUPS, "constant", max_tokens=3)
    with pytest.raises(ValueError, match=r"^max_tokens: expected a positive integer, got 0$"):
        token_weights(MASK, GROUPS, "constant", max_tokens=0)


def test_prompt_requires_group_ids() -> None:
    with pytest.raises(ValueError, match=r"^group_ids: required for aggregation='prompt'$"):
        token_weights(MASK, None, "prompt")
