"""Off-policy sequence masking and the keep-sampling mask (DeepSeek-V3.2)."""

from __future__ import annotations

import math

import pytest
import torch

from scalerl.algorithms import (
    keep_sampling_logprobs,
    off_policy_sequence_mask,
    policy_loss,
    support_mask_from_indices,
    top_k_top_p_support,
)

F64 = torch.float64


def test_off_policy_sequence_mask_closed_form() -> None:
    lp = torch.full((4, 3), -1.0, dtype=F64)
    # mean over response tokens of (log pi_old - log pi): 0.2, 0.2, 0.1, 0.2 (row 3 has padding).
    drift = torch.tensor([[0.3, 0.1, 0.2], [0.2, 0.2, 0.2], [0.1, 0.1, 0.1], [0.2, 0.2, -99.0]], dtype=F64)
    old = lp + drift
    old[3, 2] = math.nan  # padding may hold anything
    mask = torch.tensor([[True] * 3, [True] * 3, [True] * 3, [True, True, False]])
    adv = torch.tensor([-1.0, 1.0, -1.0, -0.5], dtype=F64)
    keep = off_policy_sequence_mask(lp, old, adv, mask, delta=0.15)
    # Dropped: negative advantage and drift > delta (rows 0 and 3); row 1 is positive, row 2 close.
    expected = torch.tensor([[False] * 3, [True] * 3, [True] * 3, [False, False, False]])
    assert torch.equal(keep, expected)
    assert torch.equal(off_policy_sequence_mask(lp, old, adv, mask, delta=0.25), mask)


def test_off_policy_sequence_mask_token_level_advantages() -> None:
    lp = torch.zeros(1, 3, dtype=F64)
    old = torch.full((1, 3), 0.5, dtype=F64)
    adv = torch.tensor([[1.0, -1.0, 0.0]], dtype=F64)
    keep = off_policy_sequence_mask(lp, old, adv, torch.ones(1, 3, dtype=torch.bool), delta=0.1)
    assert keep.tolist() == [[True, False, True]]


def test_off_policy_mask_in_loss_keeps_the_normalisation() -> None:
    lp = torch.full((2, 2), -1.0, dtype=F64, requires_grad=True)
    old = torch.tensor([[-0.5, -0.5], [-1.0, -1.0]], dtype=F64)
    adv = torch.tensor([-1.0, 1.0], dtype=F64)
    mask = torch.ones(2, 2, dtype=torch.bool)
    keep = off_policy_sequence_mask(lp, old, adv, mask, delta=0.3)
    assert keep.tolist() == [[False, False], [True, True]]
    loss, _ = policy_loss(lp, old, adv, mask, None, loss_type="cispo", aggregation="sample", keep_mask=keep)
    # Row 1 only (ratio 1): per-token -1 * 1 * (-1) = 1; sample mean still over both samples -> 1/2.
    assert loss.item() == pytest.approx(0.5)


def test_keep_sampling_logprobs_renormalise_over_the_support() -> None:
    logits = torch.tensor([[[0.0, math.log(2.0), math.log(3.0), 5.0]]], dtype=F64, requires_grad=True)
    support = torch.tensor([[[True, True, True, False]]])
    tokens = torch.tensor([[1]])
    lp = keep_sampling_logprobs(logits, tokens, support)
    assert lp.item() == pytest.approx(math.log(1 / 3), rel=1e-12)
    (g,) = torch.autograd.grad(lp.sum(), logits)
    # d logp_y / dz = onehot(y) - p over the support; no gradient to the excluded token.
    torch.testing.assert_close(g, torch.tensor([[[-1 / 6, 2 / 3, -1 / 2, 0.0]]], dtype=F64))


def test_full_support_equals_log_softmax() -> None:
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 3, 5, generator=gen, dtype=F64)
    tokens = torch.randint(0, 5, (2, 3), generator=gen)
    full = torch.ones(2, 3, 5, dtype=torch.bool)
    expected = torch.log_softmax(logits, -1).gather(-1, tokens[..., None]).squeeze(-1)
    torch.testing.assert_close(keep_sampling_logprobs(logits, tokens, full), expected)


def test_keep_sampling_padding_may_hold_anything() -> None:
    logits = torch.tensor([[[1.0, 2.0], [math.nan, 0.0]]], dtype=F64, requires_grad=True)
    tokens = torch.tensor([[0, -7]])
    support = torch.tensor([[[True, True], [False, False]]])
    mask = torch.tensor([[True, False]])
    lp = keep_sampling_logprobs(logits, tokens, support, mask)
    assert lp[0, 1].item() == 0.0
    assert lp[0, 0].item() == pytest.approx(1.0 - math.log(math.e + math.e**2), rel=1e-12)
    (g,) = torch.autograd.grad(lp.sum(), logits)
    assert torch.isfinite(g).all() and g[0, 1].abs().sum().item() == 0.0


def test_sampled_token_outside_support_is_an_error() -> None:
    logits = torch.zeros(1, 2, 3)
    support = torch.tensor([[[True, False, True], [True, True, True]]])
    with pytest.raises(
        ValueError, match=r"^support: sampled token 1 at index \(0, 0\) is outside the recorded support$"
    ):
        keep_sampling_logprobs(logits, torch.tensor([[1, 1]]), support)
    with pytest.raises(ValueError, match=r"^tokens: id 3 at index \(0, 1\) is out of range for V=3$"):
        keep_sampling_logprobs(logits, torch.tensor([[0, 3]]), support)


def test_support_mask_from_indices() -> None:
    indices = torch.tensor([[[0, 2, -1], [3, -1, -1]]])
    support = support_mask_from_indices(indices, vocab_size=4)
    assert support.tolist() == [[[True, False, True, False], [False, False, False, True]]]
    with pytest.raises(ValueError, match=r"^indices: token id 4 is out of range for vocab_size=4$"):
        support_mask_from_indices(torch.tensor([[4]]), vocab_size=4)


PROBS = [0.5, 0.3, 0.15, 0.05]


@pytest.mark.parametrize(
    ("top_k", "top_p", "expected"),
    [
        (None, None, [True, True, True, True]),
        (2, None, [True, True, False, False]),
        (None, 0.7, [True, True, False, False]),
        (None, 0.85, [True, True, True, False]),
        (None, 0.4, [True, False, False, False]),
        (None, 1.0, [True, True, True, True]),
        # top-k first, then top-p on the renormalised (0.5, 0.3, 0.15) / 0.95: 0.526 >= 0.5 already.
        (3, 0.5, [True, False, False, False]),
        (2, 0.9, [True, True, False, False]),
    ],
)
def test_top_k_top_p_support(top_k: int | None, top_p: float | None, expected: list[bool]) -> None:
    logits = torch.tensor(PROBS, dtype=F64).log()
    assert top_k_top_p_support(logits, top_k, top_p).tolist() == expected
    perm = torch.tensor([2, 0, 3, 1])
    assert top_k_top_p_support(logits[perm], top_k, top_p).tolist() == [expected[i] for i in perm.tolist()]


def test_top_k_keeps_ties_at_the_boundary() -> None:
    assert top_k_top_p_support(torch.tensor([1.0, 1.0, 0.0]), top_k=1).tolist() == [True, True, False]


def test_top_p_keeps_the_smallest_prefix_reaching_the_mass() -> None:
    # Two tokens of probability exactly 1/2: the first alone reaches top_p = 0.5, so only one is kept.
    support = top_k_top_p_support(torch.zeros(3, 2), top_p=0.5)
    assert support.sum(-1).tolist() == [1, 1, 1]
    assert top_k_top_p_support(torch.zeros(2), top_p=0.51).tolist() == [True, True]
