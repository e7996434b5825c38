"""scalerl.rollout.sampling: truncation, sampling distribution, log-probs, support."""

from __future__ import annotations

import math

import pytest
import torch

from scalerl.rollout.sampling import (
    SUPPORT_FORCED,
    prefix_size,
    sample_next_tokens,
    support_from_record,
    top_m_mask,
    truncation_mask,
)
from scalerl.rollout.support import SupportIds


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


def _ids(out) -> torch.Tensor:
    """`[B, S]` recorded ids of a `SampledTokens`, -1 padded."""
    return SupportIds(out.support_counts.tolist(), out.support_ids.tolist()).padded()


def test_recorded_ids_are_the_samplers_set_and_the_trainer_keeps_it_on_moved_logits() -> None:
    """The engine records S_old as ids; the trainer's mask is that set on any logits (including rows
    whose cut falls inside a run of near-equal logits), and a reordering is counted, not followed."""
    g = torch.Generator().manual_seed(5)
    rows, vocab = 256, 300
    logits = torch.randn(rows, vocab, generator=g) * 3
    logits[:, 5:15] = logits[:, 5:6] + torch.arange(10) * 1e-6  # near-ties at the cut
    temp = torch.full((rows,), 0.7)
    top_k = torch.where(torch.arange(rows) % 2 == 0, 8, 0)
    top_p = torch.full((rows,), 0.9)
    everything = torch.full((rows,), vocab)
    out = sample_next_tokens(logits, temp, top_k, top_p, _gens(rows), record_ids=everything)
    assert out.support is not None and out.support_size is not None
    assert torch.equal(out.support_counts, out.support_size)  # every set recorded whole
    ids = _ids(out)
    slots = torch.where(ids >= 0, ids, vocab).long()
    recorded = torch.zeros(rows, vocab + 1, dtype=torch.bool).scatter(1, slots, True)[:, :vocab]
    assert torch.equal(recorded, out.support)
    scaled = logits.float() / 0.7
    mask, size, mismatch, incomplete = support_from_record(scaled, out.token_ids, out.support_size, ids,
                                                           top_k, top_p)
    assert torch.equal(mask, out.support) and torch.equal(size, out.support_size)
    assert not bool(mismatch.any()) and not bool(incomplete.any())

    # The trainer's logits differ: the mask is still the sampler's set; where the trainer's own
    # top-|S| differs from it, the token is counted.
    moved = scaled.clone()
    moved[:, 5:15] += torch.randn(rows, 10, generator=g) * 0.5
    mask, size, mismatch, incomplete = support_from_record(moved, out.token_ids, out.support_size, ids, top_k,
                                                           top_p)
    assert torch.equal(mask, out.support) and not bool(incomplete.any())
    own = top_m_mask(moved, out.support_size)
    assert torch.equal(mismatch, (own != out.support).any(dim=1)) and 0 < int(mismatch.sum()) < rows

    # At most 4 ids per token: larger sets are incomplete, completed by the trainer's own ranking
    # (on the sampler's logits that is the sampler's set again).
    few = sample_next_tokens(logits, temp, top_k, top_p, _gens(rows), record_ids=torch.full((rows,), 4))
    assert torch.equal(few.support_counts, few.support_size.clamp(max=4))
    mask, size, mismatch, incomplete = support_from_record(scaled, few.token_ids, few.support_size, _ids(few),
                                                           top_k, top_p)
    assert torch.equal(mask, few.support) and torch.equal(incomplete, few.support_size > 4)
    assert 0 < int(incomplete.sum()) < rows and not bool(mismatch.any())

    # Lower bounds (an engine that showed 4 log-probs, all finite) complete the set with the
    # request's cut on these logits; forced tokens keep themselves.
    bound = torch.full((rows,), -4)
    mask, size, mismatch, incomplete = support_from_record(scaled, few.token_ids, bound, _ids(few), top_k,
                                                           top_p)
    own = prefix_size(scaled, top_k, top_p)
    assert torch.equal(size, own.clamp(min=4)) and bool(incomplete.all())
    assert torch.equal(mask, top_m_mask(scaled, own.clamp(min=4)))
    forced = torch.full((rows,), SUPPORT_FORCED)
    mask, _, mismatch, incomplete = support_from_record(scaled, out.token_ids, forced,
                                                        torch.full((rows, 0), -1), top_k, top_p)
    assert torch.equal(mask, torch.nn.functional.one_hot(out.token_ids, vocab).bool())
    assert not bool(mismatch.any()) and not bool(incomplete.any())


@pytest.mark.parametrize("cut", [(2, 1.0), (0, 0.85)], ids=["top_k_2", "top_p_0.85"])
def test_keep_sampling_mask_renormalises_over_the_samplers_set_not_the_trainers(cut) -> None:
    """Issue 37's counter-example. Sampler logits [3, 2, 1, 0, -5, -5]: top-k 2 (or top-p 0.85
    alone: p = 0.644, 0.237, 0.087, ...; the mass before rank 2 is 0.881 >= 0.85) keeps
    S_old = {0, 1}. After an update the trainer's logits are [3, 1, 2, 0, -5, -5] and token 0 was
    drawn: over S_old, log pi(0) = 3 - log(e^3 + e^1) = -0.127; the trainer's own top-2 set {0, 2}
    would give 3 - log(e^3 + e^2) = -0.313."""
    top_k, top_p = torch.tensor([cut[0]]), torch.tensor([cut[1]])
    sampler = torch.tensor([[3.0, 2.0, 1.0, 0.0, -5.0, -5.0]])
    out = sample_next_tokens(sampler, torch.tensor([1.0]), top_k, top_p, _gens(1),
                             record_ids=torch.tensor([64]))
    assert out.support_size.tolist() == [2] and _ids(out).tolist() == [[0, 1]]

    trainer = torch.tensor([[3.0, 1.0, 2.0, 0.0, -5.0, -5.0]])
    drawn = torch.tensor([0])
    mask, size, mismatch, incomplete = support_from_record(trainer, drawn, out.support_size, _ids(out), top_k,
                                                           top_p)
    assert mask.tolist() == [[True, True, False, False, False, False]] and size.tolist() == [2]
    logp = float(torch.log_softmax(trainer.masked_fill(~mask, float("-inf")), dim=-1)[0, 0])
    s_old = 3.0 - math.log(math.exp(3.0) + math.exp(1.0))
    rebuilt = 3.0 - math.log(math.exp(3.0) + math.exp(2.0))
    assert logp == pytest.approx(s_old, abs=1e-6) and round(s_old, 3) == -0.127
    assert round(rebuilt, 3) == -0.313 and abs(logp - rebuilt) > 0.18
    # The diagnostic: the recorded set differs from the trainer's own top-2 set.
    assert mismatch.tolist() == [True] and incomplete.tolist() == [False]
