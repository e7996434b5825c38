"""Model-based difficulty through an engine: k samples of every prompt, verified, one pass rate each.

`score_chunk` is the engine-facing half of `scalerl data difficulty` (Kimi k1.5, arXiv 2501.12599,
Sec. 2.3): one `generate` call for a chunk of prompts, `n = k` samples each, seeded per prompt by
`scalerl.data.difficulty.prompt_seed` (so a prompt's rate does not depend on its chunk, batch or
session), scored by the verifiers. The bookkeeping around it (settings, the resumable work file,
the annotated output) is `scalerl.data.difficulty`'s.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from scalerl.data.difficulty import DifficultySettings, PassRate, prompt_seed
from scalerl.data.generate import PromptSamples, Sample
from scalerl.data.records import PromptRecord
from scalerl.rollout.protocol import GenerationRequest

Generate = Callable[[Sequence[Any]], list[Any]]
Encode = Callable[[PromptRecord], list[int]]


def _generate_scored(
    records: Sequence[PromptRecord],
    encode: Encode,
    generate: Generate,
    scorer: Any,
    params: Any,
    settings: DifficultySettings,
    tag: str,
) -> list[Any]:
    """k samples of every record in one engine call, scored: one `ScoredBatch` per record, in order."""
    requests = [
        GenerationRequest(
            request_id=f"{tag}/{i}",
            prompt_ids=encode(r),
            params=replace(params, n=settings.k, temperature=settings.temperature,
                           seed=prompt_seed(settings.seed, r.id)),
            metadata={"prompt_id": r.id},
        )
        for i, r in enumerate(records)
    ]
    by_request: dict[str, list[Any]] = {q.request_id: [] for q in requests}
    for c in generate(requests):
        if c.request_id not in by_request:
            raise RuntimeError(f"{tag}: a completion for unknown request {c.request_id!r}")
        by_request[c.request_id].append(c)
    groups = []
    for q, r in zip(requests, records, strict=True):
        samples = sorted(by_request[q.request_id], key=lambda c: c.sample_index)
        if [c.sample_index for c in samples] != list(range(settings.k)):
            raise RuntimeError(f"{tag}: prompt {r.id!r} got samples "
                               f"{[c.sample_index for c in samples]}, expected 0..{settings.k - 1}")
        groups.append((q.request_id, r, samples))
    return list(scorer.score_all(groups))


def score_chunk(
    records: Sequence[PromptRecord],
    encode: Encode,
    generate: Generate,
    scorer: Any,
    params: Any,
    settings: DifficultySettings,
) -> list[PassRate]:
    """k samples of every record in one engine call, verified; one `PassRate` per record, in order.

    `scorer` is a `scalerl.rewards.groups.GroupScorer` (a failed verification counts as incorrect
    and is counted); `params` the `SamplingParams` (`n`, temperature and seed are set here).
    """
    scored = _generate_scored(records, encode, generate, scorer, params, settings, "difficulty")
    return [
        PassRate(id=r.id, correct=int(sum(s.correct)), k=settings.k,
                 mean_length=sum(c.num_tokens for c in s.completions) / settings.k,
                 truncated=sum(c.finish_reason == "length" for c in s.completions),
                 verifier_failures=int(s.failures))
        for r, s in zip(records, scored, strict=True)
    ]


def sample_chunk(
    records: Sequence[PromptRecord],
    encode: Encode,
    generate: Generate,
    scorer: Any,
    params: Any,
    settings: DifficultySettings,
    decode: Callable[[Sequence[int]], str],
) -> list[PromptSamples]:
    """`score_chunk`'s samples kept whole (`scalerl data generate`): each sample's text (`decode`d
    as the verifier read it), verdict, generated tokens and whether the length budget cut it."""
    scored = _generate_scored(records, encode, generate, scorer, params, settings, "generate")
    return [
        PromptSamples(
            id=r.id,
            samples=tuple(Sample(index=c.sample_index, text=decode(c.token_ids), correct=bool(ok),
                                 tokens=int(c.num_tokens), truncated=c.finish_reason == "length")
                          for c, ok in zip(s.completions, s.correct, strict=True)),
            verifier_failures=int(s.failures))
        for r, s in zip(records, scored, strict=True)
    ]


__all__ = ["Encode", "Generate", "sample_chunk", "score_chunk"]
