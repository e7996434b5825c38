"""EmbeddedEngine continuation (multi-turn): held samples, `extend` keeps the KV cache, eviction."""

from __future__ import annotations

import pytest
import torch

from scalerl.rollout import EmbeddedEngine, GenerationRequest, SamplingParams
from scalerl.rollout.protocol import Completion, ContinuableEngine
from tests.rollout.test_embedded import greedy_reference, recomputed_logprobs

ENV = [40, 41, 42, 43]  # an "environment segment": tokens the policy did not choose


def held(i: int, prompt: list[int], **params: object) -> GenerationRequest:
    return GenerationRequest(f"r{i}", prompt, SamplingParams(**params), hold=True)


def drain(engine: EmbeddedEngine) -> list[Completion]:
    out: list[Completion] = []
    while engine.num_unfinished():
        out.extend(engine.step())
    return out


def test_engine_is_continuable(make_model) -> None:
    assert isinstance(EmbeddedEngine(make_model()), ContinuableEngine)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_extend_continues_like_a_fresh_prompt_without_recomputing_the_prefix(make_model, attn: str) -> None:
    model = make_model(attn_implementation=attn)
    engine = EmbeddedEngine(model, max_batch_size=2, eos_token_ids=())
    prompt = [5, 6, 7, 8]
    engine.submit([held(0, prompt, temperature=0.0, max_new_tokens=6)])
    (first,) = drain(engine)
    assert first.token_ids == greedy_reference(model, prompt, 6, set())
    assert engine.num_unfinished() == 0  # a held sample is not work
    prefill_before = engine.stats.prefill_tokens
    engine.extend("r0", 0, ENV, SamplingParams(temperature=0.0, max_new_tokens=7), hold=False)
    (second,) = drain(engine)
    # Only the last sampled token and the environment segment were fed: the prefix stayed cached.
    assert engine.stats.prefill_tokens - prefill_before == 1 + len(ENV)
    assert engine.stats.appended_tokens == len(ENV) and engine.stats.evictions == 0
    seg1, env, seg2 = second.token_ids[:6], second.token_ids[6:10], second.token_ids[10:]
    assert seg1 == first.token_ids and env == ENV
    assert seg2 == greedy_reference(model, prompt + seg1 + ENV, 7, set())
    assert second.loss_mask == [True] * 6 + [False] * 4 + [True] * 7
    assert second.logprobs[6:10] == [0.0] * 4  # no behaviour log-probs for environment tokens


def test_sampled_continuation_logprobs_match_full_recomputation(make_model) -> None:
    model = make_model()
    engine = EmbeddedEngine(model, max_batch_size=3, seed=4)
    params = SamplingParams(temperature=0.8, max_new_tokens=5, n=2)
    engine.submit([held(0, [5, 6, 7], temperature=0.8, max_new_tokens=5, n=2)])
    firsts = drain(engine)
    for c in firsts:
        engine.extend(c.request_id, c.sample_index, ENV, params, hold=False)
    for c in drain(engine):
        ref = recomputed_logprobs(model, c, 0.8, False)
        mask = torch.tensor(c.loss_mask)
        torch.testing.assert_close(torch.tensor(c.logprobs)[mask], ref[mask], rtol=0, atol=1e-5)


def test_a_held_sample_is_evicted_for_a_waiting_one_and_recomputed_when_extended(make_model) -> None:
    model = make_model()
    engine = EmbeddedEngine(model, max_batch_size=1, eos_token_ids=())
    engine.submit([held(0, [5, 6, 7], temperature=0.0, max_new_tokens=4)])
    (first,) = drain(engine)
    engine.submit([GenerationRequest("other", [9, 10], SamplingParams(temperature=0.0, max_new_tokens=3))])
    (other,) = drain(engine)  # the only slot was held: the held sample gave it up
    assert engine.stats.evictions == 1
    assert other.token_ids == greedy_reference(model, [9, 10], 3, set())
    engine.extend("r0", 0, ENV, SamplingParams(temperature=0.0, max_new_tokens=5), hold=False)
    (second,) = drain(engine)
    assert engine.stats.recomputed_tokens == 3 + 4  # prompt + first segment, fed again
    assert second.token_ids[8:] == greedy_reference(model, [5, 6, 7, *first.token_ids, *ENV], 5, set())


def test_segments_have_their_own_budget_stop_sequences_and_versions(make_model) -> None:
    model = make_model()
    engine = EmbeddedEngine(model, max_batch_size=2, eos_token_ids=())
    free = greedy_reference(model, [5, 6], 12, set())
    stop = tuple(free[3:5])
    engine.submit([held(0, [5, 6], temperature=0.0, max_new_tokens=12, stop_sequences=(stop,))])
    (first,) = drain(engine)
    assert first.finish_reason == "stop" and first.token_ids == free[:5]  # the sequence included
    engine.update_weights(make_model(seed=9).state_dict(), version=3)  # between two turns
    engine.extend("r0", 0, ENV, SamplingParams(temperature=0.0, max_new_tokens=2), hold=True)
    (second,) = drain(engine)
    assert second.num_tokens == 5 + 4 + 2 and second.finish_reason == "length"
    assert second.versions[:5] == [0] * 5 and second.versions[9:] == [3, 3]
    assert second.start_version == 0  # a trajectory counts from its first token's version
    engine.release("r0", 0)
    with pytest.raises(KeyError, match="no held sample"):
        engine.extend("r0", 0, ENV, SamplingParams(), hold=False)
    with pytest.raises(KeyError):
        engine.release("r0", 0)
    assert all(s is None for s in engine._slots)
