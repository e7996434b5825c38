"""EmulatedEngine: the Engine contract, deterministic lengths and tokens, versions, the timing model."""

from __future__ import annotations

import concurrent.futures
import math
import multiprocessing
import threading
import time

import pytest

from scalerl.rollout.emulated import EmulatedEngine, LengthModel
from scalerl.rollout.factory import EngineSpec, build_engine
from scalerl.rollout.protocol import Completion, Engine, GenerationRequest, InterruptionSpec, SamplingParams

EOS = 99


def req(i: int, n: int = 1, seed: int | None = None, prompt: list[int] | None = None, **params: object):
    return GenerationRequest(
        request_id=f"r{i}",
        prompt_ids=prompt if prompt is not None else [1, 2, 3],
        params=SamplingParams(n=n, seed=seed if seed is not None else 1000 + i, **params),
    )


def engine(**kwargs: object) -> EmulatedEngine:
    options: dict = {"vocab_size": 100, "eos_token_ids": (EOS,), "step_s": 0.0, "sleep": False}
    options.update(kwargs)
    return EmulatedEngine(**options)


def tokens(completions: list[Completion]) -> dict[tuple[str, int], list[int]]:
    return {(c.request_id, c.sample_index): c.token_ids for c in completions}


def test_is_an_engine() -> None:
    assert isinstance(engine(), Engine)


def test_generate_orders_by_request_then_sample_and_tokens_are_valid() -> None:
    e = engine(max_batch_size=3, length_median=12, length_sample_sigma=0.8)
    requests = [req(i, n=4, max_new_tokens=20) for i in range(5)]
    out = e.generate(requests)
    assert [(c.request_id, c.sample_index) for c in out] == [(f"r{i}", j) for i in range(5) for j in range(4)]
    assert {c.finish_reason for c in out} == {"stop", "length"}  # median 12, sigma 0.8: both occur
    for c in out:
        assert c.prompt_ids == [1, 2, 3]
        assert all(0 <= t < 100 for t in c.token_ids)
        assert all(math.isfinite(lp) and lp <= 0 for lp in c.logprobs)
        assert c.loss_mask == [True] * c.num_tokens and c.versions == [0] * c.num_tokens
        if c.finish_reason == "stop":
            assert c.token_ids[-1] == EOS and EOS not in c.token_ids[:-1]
        else:
            assert c.num_tokens == 20 and EOS not in c.token_ids
    assert e.num_unfinished() == 0


def test_lengths_follow_the_length_model_whatever_the_batching() -> None:
    model = LengthModel(median=10, prompt_sigma=0.7, sample_sigma=0.4)
    opts = {"length_median": 10, "length_prompt_sigma": 0.7, "length_sample_sigma": 0.4}
    requests = [req(i, n=3, max_new_tokens=25) for i in range(6)]
    small = engine(max_batch_size=1, **opts).generate(requests)
    # Another engine, other slots, the requests in reverse and mixed with others: same samples.
    big = engine(max_batch_size=16, **opts).generate([req(50, n=2), *reversed(requests), req(51)])
    assert tokens(small).items() <= tokens(big).items()
    for i, r in enumerate(requests):
        drawn = model.draw(r.params.seed, 3)
        got = [c for c in small if c.request_id == f"r{i}"]
        assert [c.num_tokens for c in got] == [min(d, 25) for d in drawn]
        assert [c.finish_reason for c in got] == ["stop" if d <= 25 else "length" for d in drawn]
    assert len({c.num_tokens for c in small}) > 5  # long-tailed, not constant


def test_prompt_factor_correlates_a_group() -> None:
    # With the per-sample spread off, the n samples of a request share one length; requests differ.
    e = engine(length_median=30, length_prompt_sigma=0.8, length_sample_sigma=0.0)
    out = e.generate([req(i, n=4, max_new_tokens=10_000) for i in range(8)])
    per_request = {}
    for c in out:
        per_request.setdefault(c.request_id, set()).add(c.num_tokens)
    assert all(len(v) == 1 for v in per_request.values())
    assert len({next(iter(v)) for v in per_request.values()}) > 4


def test_unseeded_requests_use_the_engine_seed() -> None:
    r = GenerationRequest("x", [1], SamplingParams(n=3, max_new_tokens=50))
    a, b, c = (engine(seed=s).generate([r]) for s in (7, 7, 8))
    assert tokens(a) == tokens(b) != tokens(c)


def test_greedy_samples_are_identical() -> None:
    out = engine().generate([req(0, n=4, temperature=0.0, max_new_tokens=200)])
    assert all(c.token_ids == out[0].token_ids and c.logprobs == out[0].logprobs for c in out)


def test_continuous_batching_with_constant_lengths() -> None:
    # Constant length 5, 2 slots, 3 sequences: two run steps 1-5, the third enters at step 6 and ends at 10.
    e = engine(max_batch_size=2, length_median=5, length_sample_sigma=0.0)
    e.submit([req(i, max_new_tokens=50) for i in range(3)])
    finished_at: dict[str, int] = {}
    step = 0
    while e.num_unfinished():
        step += 1
        for c in e.step():
            finished_at[c.request_id] = step
    assert finished_at == {"r0": 5, "r1": 5, "r2": 10}
    assert (e.stats.steps, e.stats.slot_steps, e.stats.generated_tokens) == (10, 15, 15)
    assert e.stats.occupancy == pytest.approx(15 / 20)


def test_update_between_steps_tags_later_tokens() -> None:
    e = engine(max_batch_size=4, length_median=8, length_sample_sigma=0.0)
    e.submit([req(0, n=2, max_new_tokens=50)])
    for _ in range(3):
        assert e.step() == []
    e.update_weights({"anything": object()}, 5)
    assert e.version == 5
    e.submit([req(1, max_new_tokens=50)])
    out = []
    while e.num_unfinished():
        out.extend(e.step())
    first = [c for c in out if c.request_id == "r0"]
    assert [c.versions for c in first] == [[0, 0, 0] + [5] * 5] * 2
    assert all(c.start_version == 0 for c in first)
    (late,) = [c for c in out if c.request_id == "r1"]
    assert late.start_version == 5 and late.versions == [5] * 8
    with pytest.raises(TypeError, match="mapping"):
        e.update_weights([1, 2], 6)  # type: ignore[arg-type]


def test_in_flight_update_from_another_thread() -> None:
    # Steps take modelled time; updates land between steps while a thread keeps stepping.
    e = EmulatedEngine(vocab_size=100, step_s=0.002, max_batch_size=8, length_median=60,
                       length_sample_sigma=0.0)
    e.submit([req(i, n=2, max_new_tokens=100) for i in range(4)])
    out: list[Completion] = []

    def loop() -> None:
        while e.num_unfinished():
            out.extend(e.step())

    thread = threading.Thread(target=loop)
    thread.start()
    for v in (1, 2, 3):
        time.sleep(0.02)
        e.update_weights({}, v)
    thread.join()
    assert len(out) == 8
    for c in out:
        assert c.num_tokens == 60 and c.start_version == 0
        assert c.versions == sorted(c.versions) and c.versions[0] == 0
    # Every token of one step has one version: all samples ran in lockstep, so their tags agree.
    assert all(c.versions == out[0].versions for c in out)
    assert set(out[0].versions) == {0, 1, 2, 3}


def test_interruption_cuts_long_samples() -> None:
    spec = InterruptionSpec(think_budget_lo=6, think_budget_hi=6, answer_budget=3, phrase_ids=(7, 8),
                            think_end_ids=(9, 10))
    e = engine(length_median=40, length_sample_sigma=0.0)
    (c,) = e.generate([req(0, max_new_tokens=100, interruption=spec)])
    assert c.finish_reason == "interrupted"
    assert c.num_tokens == 6 + 2 + 3
    assert c.token_ids[6:8] == [7, 8]
    assert c.loss_mask == [True] * 6 + [False] * 2 + [True] * 3
    assert c.metadata["interruption"] == {"think_budget": 6, "phrase_start": 6}
    assert e.stats.generated_tokens == 9 and e.stats.prefill_tokens == 3 + 2
    # A sample shorter than its budget is not interrupted.
    (short,) = engine(length_median=4, length_sample_sigma=0.0).generate(
        [req(1, max_new_tokens=100, interruption=spec)]
    )
    assert short.finish_reason == "stop" and short.num_tokens == 4


def test_bad_requests_are_rejected_before_queueing() -> None:
    e = engine()
    with pytest.raises(ValueError, match=r"'r0'.*outside \[0, 100\)"):
        e.submit([req(0, prompt=[1, 100])])
    with pytest.raises(ValueError, match="'r1': empty prompt"):
        e.submit([req(1, prompt=[])])
    with pytest.raises(ValueError, match="sampling support"):
        e.submit([req(2, top_k=5, return_support=True)])
    assert e.num_unfinished() == 0
    with pytest.raises(ValueError, match="eos_token_ids"):
        EmulatedEngine(vocab_size=10, eos_token_ids=(10,))


def test_modelled_device_time_is_exact() -> None:
    # Constant length 6, 3 sequences in 4 slots: 6 steps of 3 decodes, the first also prefills 3 x 4 tokens.
    e = engine(max_batch_size=4, length_median=6, length_sample_sigma=0.0, step_s=0.01, token_s=0.001,
               prefill_token_s=0.0005, update_s=0.2, slowdown=2.0)
    e.generate([req(i, prompt=[1, 2, 3, 4], max_new_tokens=50) for i in range(3)])
    expected = 2.0 * (6 * (0.01 + 3 * 0.001) + 12 * 0.0005)
    assert e.stats.device_s == pytest.approx(expected)
    e.update_weights({}, 1)
    assert e.stats.updates == 1 and e.stats.update_device_s == pytest.approx(0.4)


def _timed_generate(engines: list[EmulatedEngine]) -> float:
    """Wall seconds for every engine to generate its requests, each on its own thread."""
    threads = [
        threading.Thread(target=e.generate, args=([req(i, n=4, max_new_tokens=500) for i in range(2)],))
        for e in engines
    ]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - start


def test_wall_time_follows_the_model_and_engines_overlap_like_devices() -> None:
    # 40 steps of 5 ms (constant lengths). Ratios only: the machine's load changes absolute times.
    opts = {"vocab_size": 100, "max_batch_size": 8, "step_s": 0.005, "length_median": 40,
            "length_sample_sigma": 0.0}
    base = _timed_generate([EmulatedEngine(**opts)])
    slow = _timed_generate([EmulatedEngine(**opts, slowdown=3.0)])
    four = _timed_generate([EmulatedEngine(**opts) for _ in range(4)])
    assert base >= 0.2 * 0.95
    assert 2.3 < slow / base < 3.7
    # Four engines on four threads take about the time of one: sleeping devices, not shared cores.
    assert four / base < 1.6


def _generate_in_child(spec: EngineSpec, requests: list[GenerationRequest]) -> list[Completion]:
    return build_engine(spec).generate(requests)


def test_built_from_a_spec_in_another_process() -> None:
    spec = EngineSpec(kind="emulated", model_path=None, fp32_lm_head=False, seed=3, max_batch_size=4,
                      eos_token_ids=(EOS,), initial_version=2,
                      options={"vocab_size": 100, "step_s": 0.0, "length_median": 20})
    requests = [req(i, n=2, max_new_tokens=64) for i in range(3)] + [
        GenerationRequest("unseeded", [5], SamplingParams(n=2, max_new_tokens=64))
    ]
    local = build_engine(spec).generate(requests)
    assert all(c.versions == [2] * c.num_tokens for c in local)
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=ctx) as pool:
        remote = pool.submit(_generate_in_child, spec, requests).result(timeout=120)
    assert [(c.request_id, c.sample_index, c.token_ids, c.logprobs, c.versions) for c in remote] == [
        (c.request_id, c.sample_index, c.token_ids, c.logprobs, c.versions) for c in local
    ]
    with pytest.raises(ValueError, match="no model"):
        build_engine(spec, model=object())  # type: ignore[arg-type]


def test_completions_finished_by_another_generate_count_until_handed_out() -> None:
    # A `generate()` call steps the engine and finishes a request it did not submit: that completion
    # waits for the next `step()`, and `num_unfinished()` must not report 0 before.
    e = engine(length_median=3, length_sample_sigma=0.0)
    e.submit([req(0, max_new_tokens=50)])
    (mine,) = e.generate([req(1, max_new_tokens=50)])
    assert mine.request_id == "r1"
    assert e.num_unfinished() == 1
    (other,) = e.step()
    assert other.request_id == "r0" and e.num_unfinished() == 0
