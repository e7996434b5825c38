"""scalerl.rollout.sampling: truncation, sampling distribution, log-probs, support."""

from __future__ import annotations

import torch

from scalerl.rollout.sampling import (
    sample_next_tokens,
    support_ids,
    support_mask_from_ids,
    truncation_mask,
)


def _gens(n: int, seed: int = 0) -> list[torch.Generator]:
    return [torch.Generator().manual_seed(seed + i) for i in range(n)]


def test_truncation_mask_top_k_top_p() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.2, 0.15, 0.1, 0.05]] * 4))
    mask = truncation_mask(
        logits,
        top_k=torch.tensor([2, 0, 0, 3]),
        top_p=torch.tensor([1.0, 0.65, 0.75, 0.85]),
    )
    assert mask[0].tolist() == [True, True, False, False, False]  # top-2
    assert mask[1].tolist() == [True, True, False, False, False]  # 0.5 + 0.2 reaches 0.65
    assert mask[2].tolist() == [True, True, True, False, False]  # 0.75 needs the third token
    # top-3 renormalises to (0.588, 0.235, 0.176): mass before the third is 0.824 < 0.85.
    assert mask[3].tolist() == [True, True, True, False, False]
    mask = truncation_mask(logits[:1], torch.tensor([3]), torch.tensor([0.8]))
    assert mask[0].tolist() == [True, True, False, False, False]  # ... but >= 0.8: dropped
    keep_all = truncation_mask(logits[:1], torch.tensor([0]), torch.tensor([1.0]))
    assert keep_all.all()
    tiny_p = truncation_mask(logits[:1], torch.tensor([0]), torch.tensor([0.01]))
    assert tiny_p[0].tolist() == [True, False, False, False, False]


def test_greedy_rows_take_argmax_and_t1_logprob() -> None:
    logits = torch.randn(3, 10, generator=torch.Generator().manual_seed(1))
    out = sample_next_tokens(
        logits, torch.zeros(3), torch.tensor([0, 2, 0]), torch.tensor([1.0, 1.0, 0.5]), [None] * 3
    )
    assert out.token_ids.tolist() == logits.argmax(-1).tolist()
    expected = torch.log_softmax(logits, -1).gather(-1, out.token_ids.unsqueeze(1)).squeeze(1)
    torch.testing.assert_close(out.logprobs, expected)
    assert out.support is None


def test_sampled_logprob_is_renormalised_over_support() -> None:
    logits = torch.randn(64, 20, generator=torch.Generator().manual_seed(2))
    temp = torch.full((64,), 0.8)
    out = sample_next_tokens(logits, temp, torch.full((64,), 5), torch.full((64,), 0.9), _gens(64))
    assert out.support is not None
    assert out.support.gather(1, out.token_ids.unsqueeze(1)).all()
    scaled = (logits / 0.8).masked_fill(~out.support, float("-inf"))
    expected = torch.log_softmax(scaled, -1).gather(-1, out.token_ids.unsqueeze(1)).squeeze(1)
    torch.testing.assert_close(out.logprobs, expected)
    assert (out.support.sum(-1) <= 5).all()


def test_sampling_distribution_matches_probabilities() -> None:
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    n = 6000
    logits = torch.log(probs).expand(n, -1)
    out = sample_next_tokens(logits, torch.ones(n), torch.zeros(n, dtype=torch.long), torch.ones(n), _gens(n))
    freq = torch.bincount(out.token_ids, minlength=4).float() / n
    # 4 standard errors of a binomial proportion at n = 6000 is < 0.026.
    assert (freq - probs).abs().max() < 0.026
    # With top-k = 2 the draws follow the renormalised (0.625, 0.375).
    out = sample_next_tokens(logits, torch.ones(n), torch.full((n,), 2), torch.ones(n), _gens(n, 7))
    freq = torch.bincount(out.token_ids, minlength=4).float() / n
    assert freq[2:].sum() == 0
    assert abs(freq[0].item() - 0.625) < 0.026


def test_per_row_generators_make_draws_independent_of_the_batch() -> None:
    logits = torch.randn(4, 30, generator=torch.Generator().manual_seed(3))
    args = (torch.ones(4), torch.zeros(4, dtype=torch.long), torch.ones(4))
    full = sample_next_tokens(logits, *args, _gens(4, 100)).token_ids
    alone = sample_next_tokens(logits[2:3], args[0][:1], args[1][:1], args[2][:1], [_gens(4, 100)[2]])
    assert alone.token_ids.item() == full[2].item()


def test_support_id_round_trip() -> None:
    mask = torch.tensor([[False, True, True, False], [True, False, False, False]])
    lists = [support_ids(row) for row in mask]
    assert lists == [[1, 2], [0]]
    assert torch.equal(support_mask_from_ids(lists, 4), mask)
