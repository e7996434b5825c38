"""scalerl.rollout.sampling: truncation, sampling distribution, log-probs, support."""

from __future__ import annotations

import torch

from scalerl.rollout.sampling import (
    SUPPORT_FORCED,
    prefix_size,
    sample_next_tokens,
    support_mask,
    support_sizes,
    top_m_mask,
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


def sorted_truncation_mask(scaled: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """The rule written out with a full stable sort (the definition `prefix_size` must equal)."""
    vocab = scaled.shape[-1]
    sorted_logits, order = scaled.sort(dim=-1, descending=True, stable=True)
    ranks = torch.arange(vocab)
    k = torch.where(top_k > 0, top_k, torch.full_like(top_k, vocab)).clamp(max=vocab)
    keep = ranks.unsqueeze(0) < k.unsqueeze(1)
    probs = torch.softmax(sorted_logits.masked_fill(~keep, float("-inf")), dim=-1)
    before = probs.cumsum(dim=-1) - probs
    keep &= (before < top_p.unsqueeze(1)) | (top_p.unsqueeze(1) >= 1.0)
    return torch.zeros_like(keep).scatter(-1, order, keep)


def test_prefix_size_equals_the_sorted_definition_with_ties_and_wide_cuts() -> None:
    g = torch.Generator().manual_seed(4)
    rows = 200
    # Rounded logits: many exact ties, some at the cut; a flat row needs a cut far beyond 64 tokens.
    scaled = (torch.randn(rows, 500, generator=g) * 2).round(decimals=1)
    scaled[0] = 0.0
    top_k = torch.randint(0, 40, (rows,), generator=g) * (torch.rand(rows, generator=g) < 0.5)
    top_p = torch.where(torch.rand(rows, generator=g) < 0.7, torch.rand(rows, generator=g) * 0.99 + 0.01,
                        torch.ones(rows))
    top_p[0], top_k[0] = 0.9013, 0  # mass before rank 450 is 0.900, before rank 451 0.902
    reference = sorted_truncation_mask(scaled, top_k, top_p)
    assert int(reference[0].sum()) == 451  # the flat row: a cut far past the first topk window
    assert torch.equal(prefix_size(scaled, top_k, top_p), reference.sum(-1))
    assert torch.equal(truncation_mask(scaled, top_k, top_p), reference)


def test_top_m_mask_breaks_ties_by_lower_id() -> None:
    z = torch.tensor([[1.0, 3.0, 2.0, 2.0, 2.0, 0.0]])
    assert top_m_mask(z, torch.tensor([3])).tolist() == [[False, True, True, True, False, False]]
    assert top_m_mask(z, torch.tensor([1])).tolist() == [[False, True, False, False, False, False]]
    assert top_m_mask(z, torch.tensor([6])).all()


def test_recorded_sizes_rebuild_the_samplers_support_on_tokens_near_the_cut() -> None:
    """The engine records only `support_size`; on the same logits the trainer rebuilds the exact set
    the sampler drew from, including rows whose cut falls inside a run of near-equal logits."""
    g = torch.Generator().manual_seed(5)
    rows, vocab = 256, 300
    logits = torch.randn(rows, vocab, generator=g) * 3
    # Near-ties at the cut: a block of logits within 1e-6 of each other around the top.
    logits[:, 5:15] = logits[:, 5:6] + torch.arange(10) * 1e-6
    temp = torch.full((rows,), 0.7)
    top_k = torch.where(torch.arange(rows) % 2 == 0, 8, 0)
    top_p = torch.full((rows,), 0.9)
    out = sample_next_tokens(logits, temp, top_k, top_p, _gens(rows))
    assert out.support is not None and out.support_size is not None
    assert torch.equal(out.support.sum(-1), out.support_size)
    scaled = logits.float() / 0.7
    size, mismatch, recomputed = support_sizes(scaled, out.support_size, top_k, top_p)
    assert not bool(mismatch.any()) and not bool(recomputed.any())
    mask, outside = support_mask(scaled, out.token_ids, size, out.support_size)
    assert torch.equal(mask, out.support) and not bool(outside.any())

    # The trainer's logits differ: the cut moves where a token crossed it, and that is counted.
    moved = scaled.clone()
    moved[:, 5:15] += torch.randn(rows, 10, generator=g) * 0.5
    size, mismatch, _ = support_sizes(moved, out.support_size, top_k, top_p)
    own = prefix_size(moved, top_k, top_p)
    assert torch.equal(mismatch, own != out.support_size) and 0 < int(mismatch.sum()) < rows
    assert torch.equal(size, out.support_size)  # the sampler's size is kept, on the trainer's ranking
    mask, outside = support_mask(moved, out.token_ids, size, out.support_size)
    assert bool(mask.gather(1, out.token_ids.unsqueeze(1)).all())  # the drawn token is always kept
    ranked_out = ~top_m_mask(moved, size).gather(1, out.token_ids.unsqueeze(1)).squeeze(1)
    assert torch.equal(outside, ranked_out) and bool(outside.any())

    # Lower bounds (an engine that showed 4 log-probs) recompute the cut; forced tokens keep themselves.
    bound = torch.full((rows,), -4)
    size, mismatch, recomputed = support_sizes(scaled, bound, top_k, top_p)
    own = prefix_size(scaled, top_k, top_p)
    assert torch.equal(size, own) and bool(recomputed.all()) and torch.equal(mismatch, own < 4)
    forced = torch.full((rows,), SUPPORT_FORCED)
    size, _, _ = support_sizes(scaled, forced, top_k, top_p)
    mask, outside = support_mask(scaled, out.token_ids, size, forced)
    assert torch.equal(mask, torch.nn.functional.one_hot(out.token_ids, vocab).bool())
    assert not bool(outside.any())
