"""vLLM prefix caching, scoped per request by `cache_salt`: the turns of one agentic episode (one
`cache_key`) read the context already computed instead of prefilling it again, and nothing else
ever reads another request's blocks, so a request admitted after a weight update is computed
entirely under the new weights. One vLLM engine at a time (vLLM allows one in-process engine)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (make test-vllm)")

import torch
from test_vllm_agentic import EOS, trajectories
from transformers import AutoModelForCausalLM
from vllm_helpers import vllm_device

from scalerl.rollout import GenerationRequest, SamplingParams
from scalerl.rollout.embedded import EmbeddedEngine
from scalerl.rollout.vllm_engine import VLLMEngine

BLOCK = 32  # tokens per KV block (the CPU backend needs a multiple of 32): small enough to fill
PROMPT = [10 + i % 90 for i in range(3 * BLOCK + 5)]  # three full blocks and a partial one
GREEDY = SamplingParams(temperature=0.0, max_new_tokens=6)


@contextmanager
def vllm(path: Path, **kwargs: Any) -> Iterator[VLLMEngine]:
    eng = VLLMEngine(str(path), fp32_lm_head=True, seed=0, max_batch_size=8, max_model_len=512,
                     eos_token_ids=(EOS,), block_size=BLOCK, **kwargs)
    try:
        yield eng
    finally:
        eng.close()


def cached_tokens(engine: VLLMEngine, request: GenerationRequest) -> tuple[int, Any]:
    before = engine.stats.cached_prompt_tokens
    (c,) = engine.generate([request])
    return engine.stats.cached_prompt_tokens - before, c


def test_an_episodes_later_turns_read_its_context_from_the_cache(tiny_dirs: tuple[Path, Path]) -> None:
    with vllm(tiny_dirs[0]) as engine:
        cached = trajectories(engine)
        stats = engine.stats
    with vllm(tiny_dirs[0], prefix_caching=False) as engine:
        plain = trajectories(engine)
        assert engine.stats.cached_prompt_tokens == 0
    model = AutoModelForCausalLM.from_pretrained(tiny_dirs[0], dtype=torch.float32).to(vllm_device()).eval()
    embedded = trajectories(EmbeddedEngine(model, max_batch_size=8, fp32_lm_head=True, eos_token_ids=(EOS,)))
    assert max(c.metadata["agentic"]["turns"] for c in cached) >= 2
    # Later turns found their episode's earlier context in the cache (its full blocks: with these
    # ~50-token contexts and 32-token blocks, measured 128 of 595 prompt tokens over 11 requests).
    assert stats.requests > len(cached)
    assert stats.cached_prompt_tokens >= 0.15 * stats.prompt_tokens
    for other in (plain, embedded):
        assert [c.token_ids for c in cached] == [c.token_ids for c in other]
        assert [c.loss_mask for c in cached] == [c.loss_mask for c in other]
        for x, y in zip(cached, other, strict=True):
            assert torch.allclose(torch.tensor(x.logprobs), torch.tensor(y.logprobs), atol=1e-4)


def test_only_requests_with_one_cache_key_share_cached_blocks(tiny_dirs: tuple[Path, Path]) -> None:
    with vllm(tiny_dirs[0]) as engine:
        hits, _ = cached_tokens(engine, GenerationRequest("a", PROMPT, GREEDY))
        assert hits == 0
        hits, _ = cached_tokens(engine, GenerationRequest("b", PROMPT, GREEDY))
        assert hits == 0  # same prompt, no key: computed again
        hits, _ = cached_tokens(engine, GenerationRequest("c", PROMPT, GREEDY, cache_key="episode"))
        assert hits == 0  # a key's first request finds nothing of the keyless ones
        hits, _ = cached_tokens(engine, GenerationRequest("d", PROMPT, GREEDY, cache_key="episode"))
        assert hits == 3 * BLOCK  # the full blocks of its earlier request
        hits, _ = cached_tokens(engine, GenerationRequest("e", PROMPT, GREEDY, cache_key="other"))
        assert hits == 0


def test_a_request_after_a_weight_update_reads_no_older_blocks(tiny_dirs: tuple[Path, Path]) -> None:
    """Same prompt before and after an update to other weights: the later request computes its
    prompt under the new weights (its log-probs are those of a fresh engine on them)."""
    with vllm(tiny_dirs[1]) as fresh:
        (expected,) = fresh.generate([GenerationRequest("x", PROMPT, GREEDY)])
    new = AutoModelForCausalLM.from_pretrained(tiny_dirs[1], dtype=torch.float32).state_dict()
    with vllm(tiny_dirs[0]) as engine:
        (old,) = engine.generate([GenerationRequest("a", PROMPT, GREEDY)])
        engine.update_weights(new, 1)
        hits, after = cached_tokens(engine, GenerationRequest("b", PROMPT, GREEDY))
    assert hits == 0
    assert after.token_ids == expected.token_ids and set(after.versions) == {1}
    assert torch.allclose(torch.tensor(after.logprobs), torch.tensor(expected.logprobs), atol=1e-4)
    assert not torch.allclose(torch.tensor(old.logprobs), torch.tensor(expected.logprobs), atol=1e-2)
