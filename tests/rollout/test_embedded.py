"""EmbeddedEngine: continuous batching, sampling log-probs, stops, in-flight updates, interruption."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from scalerl.models.lm_head import decoder_of, lm_head_logits, sequence_logprobs, token_logprobs
from scalerl.rollout import EmbeddedEngine, GenerationRequest, InterruptionSpec, SamplingParams
from scalerl.rollout.protocol import Completion, Engine
from scalerl.rollout.sampling import support_from_record

PROMPTS = [
    [5, 6, 7],
    [8, 9, 10, 11, 12],
    [13],
    [14, 15, 16, 17],
    [20, 21],
    [30, 31, 32, 33, 34, 35, 36],
    [40],
]


def request(i: int, prompt: list[int], **params: object) -> GenerationRequest:
    return GenerationRequest(request_id=f"r{i}", prompt_ids=prompt, params=SamplingParams(**params))


@torch.no_grad()
def greedy_reference(model: torch.nn.Module, prompt: list[int], max_new: int, stop: set[int]) -> list[int]:
    """Greedy decoding by full recomputation of every prefix (no cache)."""
    ids, out = list(prompt), []
    for _ in range(max_new):
        tok = int(model(torch.tensor([ids])).logits[0, -1].argmax())
        out.append(tok)
        ids.append(tok)
        if tok in stop:
            break
    return out


@torch.no_grad()
def recomputed_logprobs(
    model: torch.nn.Module, c: Completion, temperature: float, fp32: bool
) -> torch.Tensor:
    device = model.lm_head.weight.device
    ids = torch.tensor([c.prompt_ids + c.token_ids], device=device)
    if c.support is None:
        out = sequence_logprobs(model, ids, fp32_lm_head=fp32, temperature=temperature,
                                response_start=len(c.prompt_ids))
        return out[0]
    # Keep-sampling-mask: the recorded sets (ids) on the recomputed logits; with the same weights
    # each recorded set is the top-|S| of these logits, and every set was recorded whole.
    start = len(c.prompt_ids)
    hidden = decoder_of(model)(input_ids=ids, use_cache=False).last_hidden_state[0, start - 1 : -1]
    logits = lm_head_logits(model, hidden, fp32)
    targets = torch.tensor(c.token_ids, device=device)
    codes = torch.tensor(c.support, device=device)
    top_k, top_p = c.support_cut
    n = len(c.token_ids)
    scaled = logits.float() / temperature
    assert c.support_ids is not None
    recorded = c.support_ids.padded().to(device)
    mask, _, mismatch, incomplete = support_from_record(
        scaled, targets, codes, recorded, torch.full((n,), top_k, device=device),
        torch.full((n,), top_p, device=device))
    assert not bool(mismatch.any()), "the recomputed logits rank the sampler's set differently"
    assert not bool(incomplete.any())
    return token_logprobs(logits, targets, temperature, mask)


def test_engine_satisfies_the_protocol(make_model) -> None:
    assert isinstance(EmbeddedEngine(make_model()), Engine)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_greedy_continuous_batching_equals_reference(make_model, attn: str) -> None:
    model = make_model(attn_implementation=attn)
    engine = EmbeddedEngine(model, max_batch_size=3, eos_token_ids=())
    outs = engine.generate([request(i, p, temperature=0.0, max_new_tokens=14) for i, p in enumerate(PROMPTS)])
    assert [c.request_id for c in outs] == [f"r{i}" for i in range(len(PROMPTS))]
    for prompt, c in zip(PROMPTS, outs, strict=True):
        assert c.token_ids == greedy_reference(model, prompt, 14, set())
        assert c.finish_reason == "length"
        assert c.loss_mask == [True] * 14 and c.versions == [0] * 14
    # And equal to Hugging Face generate() for one prompt.
    hf = model.generate(torch.tensor([PROMPTS[1]]), max_new_tokens=14, do_sample=False, eos_token_id=None)
    assert outs[1].token_ids == hf[0, len(PROMPTS[1]) :].tolist()


def test_sliding_window_model_equals_reference(make_model) -> None:
    model = make_model(sliding_window=3)  # layer 0 full attention, layer 1 sliding (window 3)
    assert set(model.config.layer_types) == {"full_attention", "sliding_attention"}
    engine = EmbeddedEngine(model, max_batch_size=2, eos_token_ids=())
    outs = engine.generate(
        [request(i, p, temperature=0.0, max_new_tokens=10) for i, p in enumerate(PROMPTS[:4])]
    )
    for prompt, c in zip(PROMPTS[:4], outs, strict=True):
        assert c.token_ids == greedy_reference(model, prompt, 10, set())


def test_slots_are_refilled_as_soon_as_they_free(make_model) -> None:
    lengths = [3, 9, 4, 7, 2, 5, 8, 6, 3, 4]
    slots = 3
    engine = EmbeddedEngine(make_model(), max_batch_size=slots, eos_token_ids=())
    reqs = [request(i, [5 + i], max_new_tokens=n) for i, n in enumerate(lengths)]
    outs = engine.generate(reqs)
    assert [len(c.token_ids) for c in outs] == lengths
    # FIFO list scheduling: each sequence takes the slot that frees first and holds it for its length.
    free_at = [0] * slots
    for n in lengths:
        s = min(range(slots), key=lambda i: free_at[i])
        free_at[s] += n
    assert engine.stats.steps == max(free_at)
    assert engine.stats.occupancy == pytest.approx(sum(lengths) / (max(free_at) * slots))


@pytest.mark.parametrize("fp32", [False, True])
def test_sampled_logprobs_and_support_match_full_recomputation(make_model, fp32: bool) -> None:
    model = make_model()
    engine = EmbeddedEngine(model, max_batch_size=2, fp32_lm_head=fp32, seed=3)
    params = {
        "temperature": 0.7,
        "top_k": 8,
        "top_p": 0.9,
        "max_new_tokens": 12,
        "n": 3,
        "return_support": True,
    }
    outs = engine.generate([request(i, p, **params) for i, p in enumerate(PROMPTS[:3])])
    assert len(outs) == 9
    assert [c.sample_index for c in outs] == [0, 1, 2] * 3
    for c in outs:
        assert c.support is not None and len(c.support) == c.num_tokens
        assert all(1 <= size <= 8 for size in c.support) and c.support_cut == (8, 0.9)
        ref = recomputed_logprobs(model, c, 0.7, fp32)
        torch.testing.assert_close(torch.tensor(c.logprobs), ref, rtol=0, atol=1e-5)


def test_freshly_updated_engine_agrees_with_trainer_within_1e5(make_model) -> None:
    trainer = make_model(seed=11)
    engine = EmbeddedEngine(make_model(seed=12), max_batch_size=3, fp32_lm_head=True, seed=0)
    engine.update_weights(trainer.state_dict(), version=1)
    params = {"temperature": 1.0, "max_new_tokens": 16, "n": 2}
    outs = engine.generate([request(i, p, **params) for i, p in enumerate(PROMPTS)])
    worst = 0.0
    for c in outs:
        assert c.versions == [1] * c.num_tokens and c.start_version == 1
        ref = recomputed_logprobs(trainer, c, 1.0, fp32=True)
        worst = max(worst, (torch.tensor(c.logprobs) - ref).abs().max().item())
    assert worst < 1e-5


def test_stop_tokens_are_kept_and_finish_as_stop(make_model) -> None:
    model = make_model()
    prompt = PROMPTS[3]
    greedy = greedy_reference(model, prompt, 12, set())
    stop = greedy[4]
    cut = greedy.index(stop) + 1
    engine = EmbeddedEngine(model, max_batch_size=2, eos_token_ids=())
    (c,) = engine.generate([request(0, prompt, temperature=0.0, max_new_tokens=12, stop_token_ids=(stop,))])
    assert c.token_ids == greedy[:cut] and c.finish_reason == "stop"
    # The model's eos (from its config) stops too.
    engine = EmbeddedEngine(model, max_batch_size=2)
    assert engine.eos_token_ids == (1,)
    engine_eos = EmbeddedEngine(model, max_batch_size=2, eos_token_ids=(stop,))
    (c,) = engine_eos.generate([request(0, prompt, temperature=0.0, max_new_tokens=12)])
    assert c.token_ids == greedy[:cut] and c.finish_reason == "stop"


def test_seeded_requests_do_not_depend_on_the_batch(make_model) -> None:
    model = make_model()
    params = {"temperature": 1.0, "max_new_tokens": 10, "seed": 42}
    alone = EmbeddedEngine(model, max_batch_size=1).generate([request(0, PROMPTS[1], **params)])
    others = [request(i, p, temperature=1.0, max_new_tokens=10) for i, p in enumerate(PROMPTS)]
    mixed = EmbeddedEngine(model, max_batch_size=4, seed=9).generate(
        [*others[:3], request(0, PROMPTS[1], **params)]
    )
    assert mixed[-1].token_ids == alone[0].token_ids
    # Unseeded requests follow the engine seed; samples of one request differ from each other.
    a = EmbeddedEngine(model, max_batch_size=3, seed=5).generate(others[:2])
    b = EmbeddedEngine(model, max_batch_size=3, seed=5).generate(others[:2])
    assert [c.token_ids for c in a] == [c.token_ids for c in b]
    n3 = EmbeddedEngine(model, seed=5).generate(
        [request(0, PROMPTS[0], temperature=1.0, max_new_tokens=10, n=3)]
    )
    assert len({tuple(c.token_ids) for c in n3}) == 3


def test_step_api_and_num_unfinished(make_model) -> None:
    engine = EmbeddedEngine(make_model(), max_batch_size=2, eos_token_ids=())
    engine.submit([request(i, p, max_new_tokens=3 + i) for i, p in enumerate(PROMPTS[:4])])
    assert engine.num_unfinished() == 4
    done: list[Completion] = []
    while engine.num_unfinished():
        done += engine.step()
    assert sorted(c.request_id for c in done) == ["r0", "r1", "r2", "r3"]
    assert engine.step() == []


@torch.no_grad()
def _stale_cache_reference(
    model_a: torch.nn.Module, model_b: torch.nn.Module, prompt: list[int], tokens: list[int], m: int
) -> torch.Tensor:
    """Log-probs (T = 1) of tokens[m:] when prompt + tokens[:m-1] was cached by A and B continues."""
    prefix = torch.tensor([prompt + tokens[: m - 1]])
    cache = model_a(input_ids=prefix, use_cache=True).cache
    rest = torch.tensor([tokens[m - 1 : -1]])
    logits = model_b(input_ids=rest, cache=cache, use_cache=True).logits[0]
    return (
        torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(tokens[m:]).unsqueeze(-1)).squeeze(-1)
    )


def test_in_flight_update_keeps_sequences_and_stale_cache(make_model) -> None:
    model_a, model_b = make_model(seed=1), make_model(seed=2)
    engine = EmbeddedEngine(make_model(seed=1), max_batch_size=2, eos_token_ids=(), seed=4)
    engine.submit([request(i, p, temperature=1.0, max_new_tokens=10) for i, p in enumerate(PROMPTS[:3])])
    done: list[Completion] = []
    for _ in range(4):
        done += engine.step()
    engine.update_weights(model_b.state_dict(), version=1)
    assert engine.version == 1
    while engine.num_unfinished():
        done += engine.step()
    done.sort(key=lambda c: c.request_id)
    assert [c.request_id for c in done] == ["r0", "r1", "r2"]  # nothing dropped
    spans = []
    for c in done:
        assert c.num_tokens == 10  # nothing restarted
        m = c.versions.count(0)
        assert c.versions == [0] * m + [1] * (10 - m)
        spans.append(m)
        logprobs = torch.tensor(c.logprobs)
        if m == 0:  # admitted after the update
            assert c.start_version == 1
            ref = recomputed_logprobs(model_b, c, 1.0, fp32=False)
            torch.testing.assert_close(logprobs, ref, rtol=0, atol=1e-5)
            continue
        assert c.start_version == 0
        torch.testing.assert_close(
            logprobs[:m], recomputed_logprobs(model_a, c, 1.0, False)[:m], rtol=0, atol=1e-5
        )
        stale = _stale_cache_reference(model_a, model_b, c.prompt_ids, c.token_ids, m)
        torch.testing.assert_close(logprobs[m:], stale, rtol=0, atol=1e-5)
        # The stale prefix matters: recomputing everything under B gives different numbers.
        fresh = recomputed_logprobs(model_b, c, 1.0, False)[m + 1 :]
        assert (logprobs[m + 1 :] - fresh).abs().max() > 1e-3
    assert spans == [4, 4, 0]


def test_update_from_another_thread_while_generating(make_model) -> None:
    model_a = make_model(seed=1)
    engine = EmbeddedEngine(model_a, max_batch_size=3, eos_token_ids=())
    new_weights = [make_model(seed=2).state_dict(), make_model(seed=3).state_dict()]
    engine.submit([request(i, p, temperature=1.0, max_new_tokens=24) for i, p in enumerate(PROMPTS[:6])])
    done: list[Completion] = []

    def generator_loop() -> None:
        while engine.num_unfinished():
            done.extend(engine.step())
            time.sleep(0.001)  # stands in for the pipeline's own work between steps

    thread = threading.Thread(target=generator_loop)
    thread.start()
    for version, state in enumerate(new_weights, start=1):
        while engine.stats.steps < 5 * version:
            time.sleep(0.001)
        engine.update_weights(state, version)
    thread.join(timeout=60)
    assert not thread.is_alive()
    assert sorted(c.request_id for c in done) == [f"r{i}" for i in range(6)]
    assert all(c.num_tokens == 24 for c in done)
    for c in done:
        assert c.versions == sorted(c.versions) and set(c.versions) <= {0, 1, 2}
    assert any(c.versions[0] == 0 and c.versions[-1] >= 1 for c in done)


SPEC = InterruptionSpec(
    think_budget_lo=3, think_budget_hi=6, answer_budget=4, phrase_ids=(40, 41, 42), think_end_ids=(60, 61)
)


def test_forced_interruption_invariants_and_phrase_logprobs(make_model) -> None:
    model = make_model()
    engine = EmbeddedEngine(model, max_batch_size=4, seed=1)
    outs = engine.generate(
        [request(0, PROMPTS[1], temperature=1.0, max_new_tokens=40, n=12, interruption=SPEC)]
    )
    interrupted = [c for c in outs if c.finish_reason == "interrupted"]
    assert interrupted
    for c in outs:
        info = c.metadata["interruption"]
        assert 3 <= info["think_budget"] <= 6
        start = info["phrase_start"]
        if start is None:
            assert c.finish_reason == "stop" and c.num_tokens <= info["think_budget"]
            assert all(c.loss_mask)
            continue
        assert c.finish_reason == "interrupted" and start == info["think_budget"]
        assert c.token_ids[start : start + 3] == [40, 41, 42]
        assert c.loss_mask == [True] * start + [False] * 3 + [True] * (c.num_tokens - start - 3)
        assert c.num_tokens <= start + 3 + 4
        # Every token, forced ones included, is scored by the current policy.
        torch.testing.assert_close(
            torch.tensor(c.logprobs), recomputed_logprobs(model, c, 1.0, False), rtol=0, atol=1e-5
        )


def test_interruption_greedy_answer_budget_and_limits(make_model) -> None:
    model = make_model()
    prompt = PROMPTS[0]
    spec = InterruptionSpec(
        think_budget_lo=4, think_budget_hi=4, answer_budget=3, phrase_ids=(40, 41, 42), think_end_ids=(60, 61)
    )
    engine = EmbeddedEngine(model, max_batch_size=2, eos_token_ids=())
    (c,) = engine.generate([request(0, prompt, temperature=0.0, max_new_tokens=30, interruption=spec)])
    think = greedy_reference(model, prompt, 4, set())
    answer = greedy_reference(model, prompt + think + [40, 41, 42], 3, set())
    assert c.token_ids == [*think, 40, 41, 42, *answer]
    assert c.finish_reason == "interrupted"
    # No room for the phrase plus an answer token within max_new_tokens: a truncation.
    (c,) = engine.generate([request(0, prompt, temperature=0.0, max_new_tokens=7, interruption=spec)])
    assert c.token_ids == think and c.finish_reason == "length"
    # The overall limit wins over the answer budget.
    (c,) = engine.generate([request(0, prompt, temperature=0.0, max_new_tokens=9, interruption=spec)])
    assert c.num_tokens == 9 and c.finish_reason == "length"


def test_closing_think_in_time_is_never_interrupted(make_model) -> None:
    model = make_model()
    prompt = PROMPTS[2]
    greedy = greedy_reference(model, prompt, 12, set())
    spec = InterruptionSpec(
        think_budget_lo=5,
        think_budget_hi=5,
        answer_budget=2,
        phrase_ids=(40, 41),
        think_end_ids=tuple(greedy[1:3]),
    )
    engine = EmbeddedEngine(model, max_batch_size=2, eos_token_ids=())
    (c,) = engine.generate([request(0, prompt, temperature=0.0, max_new_tokens=12, interruption=spec)])
    assert c.token_ids == greedy and c.finish_reason == "length"
    assert c.metadata["interruption"]["phrase_start"] is None


def test_invalid_requests_and_updates_are_rejected(make_model) -> None:
    model = make_model()
    engine = EmbeddedEngine(model)
    with pytest.raises(ValueError, match="empty prompt"):
        engine.submit([request(0, [])])
    with pytest.raises(ValueError, match="outside"):
        engine.submit([request(0, [5, 999])])
    assert engine.num_unfinished() == 0
    before = model.lm_head.weight.detach().clone()
    state = {"lm_head.weight": torch.zeros_like(before), "no.such.weight": torch.zeros(1)}
    with pytest.raises(KeyError):
        engine.update_weights(state, 3)
    with pytest.raises(ValueError, match="shape"):
        engine.update_weights({"lm_head.weight": torch.zeros(2, 2)}, 3)
    assert torch.equal(model.lm_head.weight, before) and engine.version == 0


def test_unsupported_attention_implementation_is_refused(make_model) -> None:
    model = make_model()
    model.config._attn_implementation = "flex_attention"
    with pytest.raises(ValueError, match="attention implementation"):
        EmbeddedEngine(model)


@pytest.mark.gpu
def test_embedded_engine_on_cuda(make_model) -> None:
    model = make_model().to("cuda")
    engine = EmbeddedEngine(model, max_batch_size=3, fp32_lm_head=True, eos_token_ids=())
    reqs = [request(i, p, temperature=0.0, max_new_tokens=10) for i, p in enumerate(PROMPTS)]
    cpu_model = make_model()
    for prompt, c in zip(PROMPTS, engine.generate(reqs), strict=True):
        assert c.token_ids == greedy_reference(cpu_model, prompt, 10, set())
    params = {"temperature": 0.9, "top_k": 10, "max_new_tokens": 16, "n": 4, "return_support": True}
    for c in engine.generate([request(0, PROMPTS[1], **params)]):
        ref = recomputed_logprobs(model, c, 0.9, fp32=True).cpu()
        torch.testing.assert_close(torch.tensor(c.logprobs), ref, rtol=0, atol=1e-4)
