"""Next-token sampling with per-row temperature / top-k / top-p, its log-probs and its support.

The log-prob recorded for a sampled token is the log of the probability the sampler actually used:
`log softmax(z / T)` renormalised over the kept support when top-k/top-p truncate it (the behaviour
policy pi_gen of ScaleRL eq. 2). The support itself is returned so the trainer can apply the same
mask to pi_train (keep-sampling-mask, DeepSeek-V3.2, arXiv 2512.02556).

Temperature 0 is greedy decoding: the argmax token, scored under the untruncated T = 1 distribution
(there is no sampled support to renormalise over). This matches vLLM's processed log-probs for
greedy requests.

Order of the transforms follows Hugging Face `generate` and vLLM: temperature, then top-k, then
top-p on the renormalised top-k distribution.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


def truncation_mask(scaled_logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Bool mask `[B, V]` of the tokens kept by top-k then top-p, per row.

    top-k (Fan et al. 2018, arXiv 1805.04833): keep the k highest-scoring tokens; `k = 0` keeps all.
    top-p / nucleus (Holtzman et al. 2020, arXiv 1904.09751): over the top-k distribution sorted in
    decreasing probability, keep token i iff the mass strictly before it is < p, i.e. the smallest
    prefix whose mass reaches p; the most likely token is always kept; `p >= 1` keeps all.
    Ties at the boundary are broken by a stable sort (lower token id first).
    """
    vocab = scaled_logits.shape[-1]
    sorted_logits, order = scaled_logits.sort(dim=-1, descending=True, stable=True)
    ranks = torch.arange(vocab, device=scaled_logits.device)
    k = torch.where(top_k > 0, top_k, torch.full_like(top_k, vocab)).clamp(max=vocab)
    keep_sorted = ranks.unsqueeze(0) < k.unsqueeze(1)
    probs = torch.softmax(sorted_logits.masked_fill(~keep_sorted, float("-inf")), dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs
    p = top_p.unsqueeze(1)
    keep_sorted &= (mass_before < p) | (p >= 1.0)
    return torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)


def gumbel_noise(
    generators: Sequence[torch.Generator | None], vocab: int, device: torch.device
) -> torch.Tensor:
    """Standard Gumbel noise `-log(-log U)`, `U ~ Uniform[0, 1)`, one row per generator (0 where None).

    Each row comes from its sequence's own generator, so a sequence's draws do not depend on which
    other sequences share the batch. `argmax(log p + G)` is a sample from p (the Gumbel-max trick,
    Gumbel 1954; Maddison et al. 2014, arXiv 1411.0030).
    """
    half = torch.full((vocab,), 0.5, device=device)
    rows = [torch.rand(vocab, generator=g, device=device) if g is not None else half for g in generators]
    u = torch.stack(rows)
    noise = -torch.log(-torch.log(u))
    greedy = torch.tensor([g is None for g in generators], device=device)
    return noise.masked_fill(greedy.unsqueeze(1), 0.0)


@dataclass
class SampledTokens:
    """One sampling step: the drawn tokens `[B]`, their log-probs `[B]` (float32) and, when any row
    truncates its support, the `[B, V]` bool support mask (all True for rows that do not)."""

    token_ids: torch.Tensor
    logprobs: torch.Tensor
    support: torch.Tensor | None


def sample_next_tokens(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    generators: Sequence[torch.Generator | None],
) -> SampledTokens:
    """Sample one token per row of `logits [B, V]` under per-row `temperature`, `top_k`, `top_p`.

    Rows with temperature 0 are greedy (their generator is ignored and should be None). Sampled rows
    draw from `softmax(z / T)` restricted to the top-k/top-p support, via Gumbel-max with their own
    generator. Returns the log-prob of each drawn token under that (renormalised) distribution.
    """
    logits = logits.float()
    greedy = temperature <= 0
    scale = torch.where(greedy, torch.ones_like(temperature), temperature).unsqueeze(1)
    scaled = logits / scale
    # Greedy rows never truncate: their log-prob is the plain T = 1 one.
    k = torch.where(greedy, torch.zeros_like(top_k), top_k)
    p = torch.where(greedy, torch.ones_like(top_p), top_p)
    support: torch.Tensor | None = None
    if bool(((k > 0) | (p < 1.0)).any()):
        support = truncation_mask(scaled, k, p)
        scaled = scaled.masked_fill(~support, float("-inf"))
    logp = torch.log_softmax(scaled, dim=-1)
    is_greedy = greedy.tolist()
    row_generators = [None if g_row else g for g, g_row in zip(generators, is_greedy, strict=True)]
    if all(g is None for g in row_generators):
        tokens = logp.argmax(dim=-1)
    else:
        noise = gumbel_noise(row_generators, logits.shape[-1], logits.device)
        tokens = torch.where(greedy, logp.argmax(dim=-1), (logp + noise).argmax(dim=-1))
    return SampledTokens(tokens, logp.gather(-1, tokens.unsqueeze(1)).squeeze(1), support)


def support_ids(mask_row: torch.Tensor) -> list[int]:
    """Token ids of a `[V]` bool support row."""
    return mask_row.nonzero().flatten().tolist()


def support_mask_from_ids(
    support: Sequence[Sequence[int]], vocab_size: int, device: torch.device | None = None
) -> torch.Tensor:
    """`[T, V]` bool mask from per-token support lists (`Completion.support`), for the trainer's
    keep-sampling-mask."""
    mask = torch.zeros(len(support), vocab_size, dtype=torch.bool, device=device)
    for t, ids in enumerate(support):
        mask[t, list(ids)] = True
    return mask
