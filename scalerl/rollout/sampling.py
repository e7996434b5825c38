"""Next-token sampling with per-row temperature / top-k / top-p, its log-probs and its support.

The log-prob recorded for a sampled token is the log of the probability the sampler actually used:
`log softmax(z / T)` renormalised over the kept support when top-k/top-p truncate it (the behaviour
policy pi_gen of ScaleRL eq. 2). The support S_old itself is recorded as token ids, so the trainer
renormalises pi_old and pi_theta over exactly that set (keep-sampling-mask, DeepSeek-V3.2, arXiv
2512.02556, Sec. 3.1): `recorded_ids` lists each row's kept tokens (at most a per-row bound, the
highest-scoring when the set is larger; `rollout.support.SupportIds` stores them), and
`support_from_record` rebuilds the mask on the trainer's logits from those ids, completing an
incomplete record with the trainer's own highest-scoring tokens. The kept set is found with `topk`
rather than a sort of the vocabulary.

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
#: token itself is the only one "drawable" (and no id is recorded for it).
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
    size per row `[B]` (what `Completion.support` records); with `record_ids`, each row's recorded
    ids (`recorded_ids`: counts `[B]` and the ids laid end to end, what `Completion.support_ids`
    records)."""

    token_ids: torch.Tensor
    logprobs: torch.Tensor
    support: torch.Tensor | None
    support_size: torch.Tensor | None = None
    support_counts: torch.Tensor | None = None
    support_ids: torch.Tensor | None = None


def sample_next_tokens(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    generators: Sequence[torch.Generator | None],
    record_ids: torch.Tensor | None = None,
) -> SampledTokens:
    """Sample one token per row of `logits [B, V]` under per-row `temperature`, `top_k`, `top_p`.

    Rows with temperature 0 are greedy (their generator is ignored and should be None). Sampled rows
    draw from `softmax(z / T)` restricted to the top-k/top-p support, via Gumbel-max with their own
    generator. Returns the log-prob of each drawn token under that (renormalised) distribution.
    `record_ids [B]` (long): how many ids of its support each row records (0: none; `recorded_ids`).
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
    unmasked = scaled
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
    counts = ids = None
    if size is not None and record_ids is not None:
        counts, ids = recorded_ids(unmasked, size, record_ids)
    return SampledTokens(tokens, logp.gather(-1, tokens.unsqueeze(1)).squeeze(1), support, size, counts, ids)


def recorded_ids(
    scaled_logits: torch.Tensor, size: torch.Tensor, cap: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """`(counts [B], ids [sum counts])`: the `min(size, cap)` highest-scoring tokens of each row
    (`top_m_mask`, ties: lower id first), row after row, ids ascending within a row.

    With `size` the kept prefix (`prefix_size`), these are the members of the sampler's set S_old,
    all of them when `size <= cap`, else its `cap` highest-scoring ones (the set is a prefix of the
    sorted order, so the top-`cap` of the vocabulary are its top-`cap`). `cap 0`: nothing recorded.
    """
    m = torch.minimum(size.long(), cap.long().to(size.device)).clamp(min=0)
    rows = (m > 0).nonzero().flatten()
    ids = torch.empty(0, dtype=torch.long, device=size.device)
    if rows.numel():
        picked = top_m_mask(scaled_logits[rows], m[rows])
        ids = picked.nonzero()[:, 1]
    return m, ids


def support_from_record(
    scaled_logits: torch.Tensor,
    token_ids: torch.Tensor,
    recorded: torch.Tensor,
    ids: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    size: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """`(mask [M, V], size [M], mismatch [M], incomplete [M])`: the sampler's set S_old at `M`
    positions, rebuilt from its recorded ids, on the trainer's `scaled_logits [M, V]`.

    `recorded [M]` holds `Completion.support` codes (`> 0` S_old has exactly that many members,
    `SUPPORT_FORCED` a forced token, `< 0` at least `-recorded`), `ids [M, W]` the recorded members
    (`Completion.support_ids`, -1 after each position's own). The mask is S_old = the recorded ids
    whenever they are all of it (DeepSeek-V3.2 Sec. 3.1: pi_old and pi_theta renormalised over the
    sampler's set, not over one rebuilt from the trainer's logits). Incomplete records (a set larger
    than the engine's id bound, or an engine that showed only a lower bound) keep every recorded id
    and fill up to the set's size (for a lower bound: the request's `top_k`/`top_p` cut on these
    logits, `prefix_size`, at least `-recorded`) with the trainer's highest-scoring other tokens:
    `top_m_mask` over the logits with the recorded ids raised to +inf. A forced position keeps its
    own token only; the drawn token is always kept (it was in S_old), so its log-prob is finite.

    `mismatch`: the set differs from the trainer's own top-`size` set (the train/inference
    difference reordered the tokens around the cut), or the drawn token was not in it; forced
    positions never mismatch. `size` (from an earlier call on the same logits) skips the search
    for a lower bound's cut, so a recomputation rebuilds exactly the same mask.
    """
    z = scaled_logits.float()
    m, vocab = z.shape
    recorded = recorded.long()
    forced = recorded == SUPPORT_FORCED
    ids = ids.long()
    have = (ids >= 0).sum(dim=-1)
    known = torch.zeros((m, vocab + 1), dtype=torch.bool, device=z.device)
    known.scatter_(-1, torch.where(ids >= 0, ids, vocab), True)
    known = known[:, :vocab]
    if size is None:
        lower = recorded < 0
        own = prefix_size(z[lower], top_k[lower], top_p[lower]) if bool(lower.any()) else None
        size = torch.where(recorded > 0, recorded, have)
        if own is not None:
            size[lower] = torch.maximum(own, -recorded[lower])
        size = torch.maximum(size, have).clamp(min=1, max=vocab)
    size = torch.where(forced, torch.ones_like(size), size)
    kept = known.clone()
    fill = ((have < size) & ~forced).nonzero().flatten()
    if fill.numel():
        kept[fill] = top_m_mask(z[fill].masked_fill(known[fill], float("inf")), size[fill])
    drawn = token_ids.long().unsqueeze(1)
    outside = ~kept.gather(-1, drawn).squeeze(1)
    mismatch = ((kept != top_m_mask(z, size)).any(dim=-1) | outside) & ~forced
    incomplete = (recorded < 0) | ((recorded > 0) & (have < recorded))
    # In place (the [M, V] blocks are the large ones): forced rows keep their own token only.
    rows = forced.nonzero().flatten()
    if rows.numel():
        kept[rows] = False
    mask = kept.scatter_(-1, drawn, True)
    return mask, size, mismatch, incomplete
