"""Next-token sampling with per-row temperature / top-k / top-p, its log-probs and its support.

The log-prob recorded for a sampled token is the log of the probability the sampler actually used:
`log softmax(z / T)` renormalised over the kept support when top-k/top-p truncate it (the behaviour
policy pi_gen of ScaleRL eq. 2). The support itself is returned so the trainer can apply the same
mask to pi_train (keep-sampling-mask, DeepSeek-V3.2, arXiv 2512.02556). Top-k/top-p keep a prefix of
the tokens sorted by logit, so the support is recorded by its size alone (`Completion.support`, one
int per token at any vocabulary) and rebuilt on the trainer's logits (`support_sizes`,
`support_mask`); the kept set is found with `topk` rather than a sort of the vocabulary.

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

#: A `Completion.support` entry for a forced token (interruption phrase, environment tokens): the
#: token itself is the only one "drawable".
SUPPORT_FORCED = 0


def prefix_size(scaled_logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """`[B]` long: how many tokens top-k then top-p keep per row (`truncation_mask`'s rule).

    top-k (Fan et al. 2018, arXiv 1805.04833): the k highest-scoring tokens; `k = 0` keeps all.
    top-p / nucleus (Holtzman et al. 2020, arXiv 1904.09751): over the top-k distribution
    `q_v = exp(z_v - logsumexp_{top-k} z)` sorted in decreasing order, keep rank i iff the mass
    strictly before it is < p (the smallest prefix whose mass reaches p; rank 0 always); `p >= 1`
    keeps all. Computed from the `K` largest logits (`topk`, O(V) per row), K growing x4 until every
    row's cut lies inside, instead of sorting the vocabulary: the kept set is a prefix of the sorted
    order, so its size is all a sampler or a trainer needs to know (`top_m_mask`).
    """
    vocab = scaled_logits.shape[-1]
    z = scaled_logits.float()
    k_lim = torch.where(top_k > 0, top_k, torch.full_like(top_k, vocab)).clamp(max=vocab).long()
    size = k_lim.clone()
    cut = (top_p < 1.0).nonzero().flatten()
    if cut.numel() == 0:
        return size
    z, k_lim, p = z[cut], k_lim[cut], top_p[cut].to(torch.float64).unsqueeze(1)
    k_max = int(k_lim.max())
    ranks = torch.arange(k_max, device=z.device).unsqueeze(0)
    if bool((k_lim == vocab).all()):
        log_norm = torch.logsumexp(z, dim=-1, keepdim=True)
    else:
        top = z.topk(k_max, dim=-1).values.masked_fill(ranks >= k_lim.unsqueeze(1), float("-inf"))
        log_norm = torch.logsumexp(top, dim=-1, keepdim=True)
    width = min(k_max, 64)
    while True:
        vals = z.topk(width, dim=-1).values
        inside = ranks[:, :width] < k_lim.unsqueeze(1)
        probs = torch.exp(vals - log_norm).double().masked_fill(~inside, 0.0)
        before = probs.cumsum(dim=-1) - probs
        count = ((before < p) & inside).sum(dim=-1)
        if width == k_max or not bool(((count == width) & (k_lim > width)).any()):
            break
        width = min(k_max, 4 * width)
    size[cut] = count
    return size


def top_m_mask(scaled_logits: torch.Tensor, size: torch.Tensor) -> torch.Tensor:
    """Bool `[B, V]`: the `size[b]` (>= 1) highest-scoring tokens of each row, ties at the cut broken
    by lower token id first (the order of a stable descending sort).

    The cut value `c` is the size-th largest logit; every token above `c` is kept and, of the tokens
    equal to `c`, the lowest ids that fill the count.
    """
    z = scaled_logits.float()
    size = size.long().clamp(min=1, max=z.shape[-1])
    vals = z.topk(int(size.max()), dim=-1).values
    cut = vals.gather(-1, (size - 1).unsqueeze(1))
    above = z > cut
    ties = z == cut
    room = size.unsqueeze(1) - above.sum(dim=-1, keepdim=True)
    return above | (ties & (ties.long().cumsum(dim=-1) <= room))


def truncation_mask(scaled_logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Bool mask `[B, V]` of the tokens kept by top-k then top-p, per row (`prefix_size`'s rule);
    ties at the boundary are broken by lower token id first."""
    return top_m_mask(scaled_logits, prefix_size(scaled_logits, top_k, top_p))


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
    truncates its support, the `[B, V]` bool support mask (all True for rows that do not) and its
    size per row `[B]` (what `Completion.support` records)."""

    token_ids: torch.Tensor
    logprobs: torch.Tensor
    support: torch.Tensor | None
    support_size: torch.Tensor | None = None


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
    size: torch.Tensor | None = None
    if bool(((k > 0) | (p < 1.0)).any()):
        size = prefix_size(scaled, k, p)
        support = top_m_mask(scaled, size)
        scaled = scaled.masked_fill(~support, float("-inf"))
    logp = torch.log_softmax(scaled, dim=-1)
    is_greedy = greedy.tolist()
    row_generators = [None if g_row else g for g, g_row in zip(generators, is_greedy, strict=True)]
    if all(g is None for g in row_generators):
        tokens = logp.argmax(dim=-1)
    else:
        noise = gumbel_noise(row_generators, logits.shape[-1], logits.device)
        tokens = torch.where(greedy, logp.argmax(dim=-1), (logp + noise).argmax(dim=-1))
    return SampledTokens(tokens, logp.gather(-1, tokens.unsqueeze(1)).squeeze(1), support, size)


def support_sizes(
    scaled_logits: torch.Tensor,
    recorded: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per position `[M]`: (the size to keep, mismatch, recomputed) for `support_mask`.

    `recorded` holds `Completion.support` codes: `> 0` the sampler kept exactly that many tokens (the
    trainer keeps its own top-`recorded`); `SUPPORT_FORCED` a forced token (size 1, the token itself,
    see `support_mask`); `< 0` the sampler kept at least `-recorded` (an engine that showed only that
    many), so the cut is recomputed with the request's `top_k` / `top_p` on these logits. Mismatch:
    the cut `prefix_size` puts on these logits differs from the recorded size (or falls below the
    recorded lower bound), i.e. the train/inference difference moved the cut.
    """
    own = prefix_size(scaled_logits, top_k, top_p)
    exact = recorded > 0
    lower = recorded < 0
    size = torch.where(exact, recorded, own)
    size = torch.where(recorded == SUPPORT_FORCED, torch.ones_like(size), size)
    mismatch = (exact & (own != recorded)) | (lower & (own < -recorded))
    return size, mismatch, lower


def support_mask(scaled_logits: torch.Tensor, token_ids: torch.Tensor, size: torch.Tensor,
                 recorded: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`([M, V] bool, [M] bool)`: the top-`size` tokens of each row (`top_m_mask`) and the drawn
    token (a forced position keeps its own token only); and whether the drawn token ranked outside
    the top-`size` on these logits.

    The drawn token was in the sampler's support by definition, so ranking it below the cut is a
    train/inference mismatch of the cut (counted beside `support_sizes`'s), and it is kept anyway,
    so that its log-prob stays finite.
    """
    top = top_m_mask(scaled_logits, size)
    drawn = torch.zeros_like(top).scatter(-1, token_ids.long().unsqueeze(1), True)
    forced = recorded == SUPPORT_FORCED
    outside = ~top.gather(-1, token_ids.long().unsqueeze(1)).squeeze(1) & ~forced
    return torch.where(forced.unsqueeze(1), drawn, top | drawn), outside
