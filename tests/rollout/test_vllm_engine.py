"""VLLMEngine's own logic, without vLLM: phases of forced interruption, version tagging across
updates, request ids, the update and layout checks, run against a small fake of vLLM's `LLMEngine`
interface. The real engine end to end (CPU or CUDA, whatever vLLM's platform is) is in
`tests/with_vllm/` (`make test-vllm`).
"""

from __future__ import annotations

import importlib.util
import types
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from scalerl.rollout import GenerationRequest, InterruptionSpec, SamplingParams, VLLMEngine
from scalerl.rollout.base import SteppingEngine
from scalerl.rollout.protocol import Completion, Engine
from scalerl.rollout.sampling import SUPPORT_FORCED
from scalerl.rollout.support import SupportIds
from scalerl.rollout.vllm_engine import (
    CheckpointLayout,
    check_full_update,
    contains_subsequence,
    default_kv_cache_bytes,
    import_vllm,
    phase_seed,
    read_layout,
    record_support,
    support_logprobs,
)

#: The default bound on recorded ids per token (`algorithm.keep_sampling_mask_max_ids`).
CAP = SamplingParams().support_max_ids

HAS_VLLM = importlib.util.find_spec("vllm") is not None


def test_import_error_names_the_extra() -> None:
    if HAS_VLLM:
        pytest.skip("vllm is installed")
    with pytest.raises(ImportError, match=r"scalerl\[vllm\]"):
        import_vllm()
    with pytest.raises(ImportError):
        VLLMEngine("any-model")


def test_helpers() -> None:
    assert contains_subsequence([1, 9, 10, 2], (9, 10))
    assert not contains_subsequence([9, 1, 10], (9, 10))
    assert not contains_subsequence([], (9,))
    assert phase_seed(3, 0, 0) == phase_seed(3, 0, 0)
    assert len({phase_seed(3, 0, 0), phase_seed(3, 0, 1), phase_seed(3, 1, 0), phase_seed(4, 0, 0)}) == 4
    assert phase_seed(-5, 0, 0) >= 0


def test_read_layout_of_a_saved_tiny_model(tmp_path: Path) -> None:
    from scalerl.models.tiny import TinyModelSpec, build_tiny_model

    model = build_tiny_model(TinyModelSpec(hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1,
                                           intermediate_size=64), vocab_size=50)
    model.save_pretrained(tmp_path)
    layout = read_layout(tmp_path)
    assert layout.tied_head and layout.vocab_size == 50 and layout.head_size == 32
    assert layout.kv_elements_per_token == 2 * 2 * 1 * 32 and layout.eos_token_ids == (1,)
    # save_pretrained leaves the tied head out; the trainer's state dict carries it.
    assert "lm_head.weight" not in layout.shapes
    state = model.state_dict()
    check_full_update(layout, state)
    with pytest.raises(KeyError, match=r"full state dict.*lm_head\.weight"):
        check_full_update(layout, {k: v for k, v in state.items() if k != "lm_head.weight"})
    with pytest.raises(KeyError, match="unknown"):
        check_full_update(layout, {**state, "extra.weight": torch.zeros(1)})
    with pytest.raises(ValueError, match="shape"):
        check_full_update(layout, {**state, "model.norm.weight": torch.zeros(3)})
    with pytest.raises(FileNotFoundError, match=r"config\.json"):
        read_layout(tmp_path / "missing")


def test_kv_cache_fits_every_sequence_in_whole_blocks() -> None:
    layout = CheckpointLayout({}, True, 100, 32, kv_elements_per_token=2 * 4 * 2 * 32,
                              max_position_embeddings=1024, eos_token_ids=(1,))
    # 64 sequences of 416 tokens -> 512 + 256 each, float32 K and V.
    assert default_kv_cache_bytes(layout, "float32", 64, 416) == 512 * 4 * 64 * 768
    assert default_kv_cache_bytes(layout, "bfloat16", 1, 256) == 512 * 2 * 512


def test_support_logprobs() -> None:
    assert CAP == 64
    assert support_logprobs(SamplingParams(top_k=5, top_p=0.9), 151_936) == 5
    assert support_logprobs(SamplingParams(top_p=0.9), 151_936) == CAP
    assert support_logprobs(SamplingParams(top_p=0.9), 50) == 50
    # The id bound caps what vLLM is asked for, top-k included.
    assert support_logprobs(SamplingParams(top_k=100, support_max_ids=16), 151_936) == 16
    assert support_logprobs(SamplingParams(top_p=0.9, support_max_ids=256), 151_936) == 256


def _entry(logprobs: dict[int, float]) -> dict[int, Any]:
    """vLLM's per-token log-prob dict: token id -> an object with `.logprob`."""
    return {t: types.SimpleNamespace(logprob=lp) for t, lp in logprobs.items()}


def test_record_support_from_processed_logprobs() -> None:
    inf = float("inf")
    # Some of the shown log-probs are -inf: the whole set was seen, its ids all recorded.
    assert record_support(_entry({7: -0.1, 3: -1.2, 9: -inf, 4: -inf}), shown=4, bound=151_936) == (2, [7, 3])
    # All shown finite: at least that many (the trainer completes the set), the shown ids recorded.
    assert record_support(_entry({7: -1.0, 3: -0.5, 9: -2.0, 4: -1.0}), shown=4, bound=151_936) == (
        -4, [3, 4, 7, 9])  # by log-prob, ties by lower id
    # ... plus the sampled token (8) from outside the shown ones: at least 5, the top 4 ids kept.
    got = record_support(_entry({7: -1.0, 3: -1.0, 9: -1.0, 4: -1.0, 8: -3.0}), shown=4, bound=151_936)
    assert got == (-5, [3, 4, 7, 9])
    # top-k shown in full (bound = top_k = shown): exact.
    assert record_support(_entry({1: -1.0, 2: -1.0, 5: -1.0, 6: -1.0}), shown=4, bound=4) == (4, [1, 2, 5, 6])
    with pytest.raises(RuntimeError, match="finite"):
        record_support(_entry({3: -inf}), shown=4, bound=10)


# ----------------------------------------------------------------------------- fake vLLM core
class FakeCore:
    """The part of vLLM's `LLMEngine` that VLLMEngine uses: add_request / step (DELTA outputs, one
    token per running request per step) / has_unfinished_requests / collective_rpc. Token t of a
    request is `script(prompt + generated)`; its log-prob is -0.25 * version of the core's weights."""

    def __init__(self, script: Any) -> None:
        self.script = script
        self.requests: dict[str, dict[str, Any]] = {}
        self.added: list[tuple[str, list[int], int]] = []
        self.weights_version = 0
        self.aborted: list[str] = []
        self.salts: dict[str, str] = {}

    def add_request(self, rid: str, prompt: dict, params: Any) -> str:
        self.requests[rid] = {"ids": list(prompt["prompt_token_ids"]), "params": params, "n": 0}
        self.added.append((rid, list(prompt["prompt_token_ids"]), params.max_tokens))
        self.salts[rid] = prompt["cache_salt"]
        return f"{rid}-internal"  # as vLLM 0.32: a randomized internal id; outputs carry ours

    def abort_request(self, request_ids: list[str]) -> None:
        for rid in request_ids:
            del self.requests[rid]
        self.aborted.extend(request_ids)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def collective_rpc(self, method: Any, args: tuple = (), kwargs: dict | None = None) -> list[Any]:
        assert method == "reload_weights" and kwargs is not None and kwargs["is_checkpoint_format"]
        self.weights_version = int(dict(kwargs["weights_iterator"])["version"].item())
        return [None]

    def step(self) -> list[Any]:
        outputs = []
        for rid, req in list(self.requests.items()):
            tok = self.script(req["ids"])
            req["ids"].append(tok)
            req["n"] += 1
            params = req["params"]
            reason = None
            if tok in params.stop_token_ids:
                reason = "stop"
            elif req["n"] >= params.max_tokens:
                reason = "length"
            entry = {tok: types.SimpleNamespace(logprob=-0.25 * self.weights_version - 0.1)}
            out = types.SimpleNamespace(token_ids=[tok], logprobs=[entry], finish_reason=reason)
            outputs.append(types.SimpleNamespace(request_id=rid, finished=reason is not None, outputs=[out],
                                                 num_cached_tokens=0))
            if reason is not None:
                del self.requests[rid]
        return outputs


def fake_engine(script: Any, eos: tuple[int, ...] = (1,)) -> tuple[VLLMEngine, FakeCore]:
    engine = VLLMEngine.__new__(VLLMEngine)
    SteppingEngine.__init__(engine, 0)
    core = FakeCore(script)
    layout = CheckpointLayout({"version": ()}, False, 64, 32, kv_elements_per_token=1,
                              max_position_embeddings=None, eos_token_ids=eos)
    engine._init_state(core, layout=layout, seed=0)
    engine.eos_token_ids, engine.max_model_len = eos, 64

    def params(self: VLLMEngine, p: SamplingParams, seed: int, max_tokens: int, want_support: bool) -> Any:
        stops = set(p.stop_token_ids) | set(self.eos_token_ids)
        return types.SimpleNamespace(max_tokens=max_tokens, seed=seed, stop_token_ids=stops)

    engine._vllm_params = types.MethodType(params, engine)  # type: ignore[method-assign]
    return engine, core


def counting(ids: list[int]) -> int:
    """Next token = 10 + (length of the context mod 20): never the stop id 1."""
    return 10 + len(ids) % 20


def test_fake_engine_satisfies_the_protocol() -> None:
    assert isinstance(fake_engine(counting)[0], Engine)


def test_versions_follow_in_flight_updates() -> None:
    engine, core = fake_engine(counting)
    engine.submit([GenerationRequest("a", [5, 6], SamplingParams(max_new_tokens=6, n=2))])
    done: list[Completion] = []
    for _ in range(2):
        done += engine.step()
    engine.update_weights({"version": torch.tensor(1)}, version=1)
    while engine.num_unfinished():
        done += engine.step()
    assert len(done) == 2
    for c in done:
        assert c.versions == [0, 0, 1, 1, 1, 1] and c.finish_reason == "length"
        assert c.logprobs[:2] == [-0.1, -0.1] and c.logprobs[2] == pytest.approx(-0.35)
        assert c.token_ids == [counting([0] * n) for n in range(2, 8)]
    # Distinct seeds for the two samples of one request.
    assert core.added[0][0] != core.added[1][0]


def test_stop_token_finishes_as_stop() -> None:
    engine, _ = fake_engine(lambda ids: 1 if len(ids) == 5 else 20)
    (c,) = engine.generate([GenerationRequest("a", [5, 6], SamplingParams(max_new_tokens=10))])
    assert c.token_ids == [20, 20, 20, 1] and c.finish_reason == "stop"


def test_a_stop_sequence_aborts_the_request_and_finishes_as_stop() -> None:
    engine, core = fake_engine(counting)  # tokens 12, 13, 14, ...
    params = SamplingParams(max_new_tokens=10, stop_sequences=((30, 31), (13, 14)))
    (c,) = engine.generate([GenerationRequest("a", [5, 6], params)])
    assert c.token_ids == [12, 13, 14] and c.finish_reason == "stop" and c.loss_mask == [True] * 3
    assert len(core.aborted) == 1 and not core.requests
    # A sequence that never appears: the request runs to its length.
    (c,) = engine.generate([GenerationRequest("b", [5, 6], SamplingParams(max_new_tokens=4,
                                                                         stop_sequences=((13, 12),)))])
    assert c.token_ids == [12, 13, 14, 15] and c.finish_reason == "length"


SPEC = InterruptionSpec(
    think_budget_lo=3, think_budget_hi=3, answer_budget=2, phrase_ids=(40, 41), think_end_ids=(60, 61)
)


def test_interruption_runs_a_continuation_with_the_phrase() -> None:
    engine, core = fake_engine(counting)
    req = GenerationRequest("a", [5, 6], SamplingParams(max_new_tokens=20, interruption=SPEC))
    (c,) = engine.generate([req])
    think = [counting([0] * n) for n in (2, 3, 4)]
    answer = [counting([0] * n) for n in (7, 8)]  # after prompt (2) + think (3) + phrase (2)
    assert c.token_ids == [*think, 40, 41, *answer]
    assert c.loss_mask == [True] * 3 + [False] * 2 + [True] * 2
    assert c.logprobs[3:5] == [0.0, 0.0]
    assert c.finish_reason == "interrupted"
    assert c.metadata["interruption"] == {"think_budget": 3, "phrase_start": 3}
    assert [(prompt, max_tokens) for _, prompt, max_tokens in core.added] == [
        ([5, 6], 3),
        ([5, 6, *think, 40, 41], 2),
    ]


def test_cache_salts_scope_the_prefix_cache() -> None:
    """A request's samples and its interruption continuation share one salt; another request gets
    its own unless both carry the same `cache_key` (an episode's turns)."""
    engine, core = fake_engine(counting)
    params = SamplingParams(n=2, max_new_tokens=20, interruption=SPEC)
    engine.generate([GenerationRequest("a", [5, 6], params), GenerationRequest("b", [5, 6], params),
                     GenerationRequest("t1", [5], replace(params, n=1), cache_key="ep"),
                     GenerationRequest("t2", [5, 7], replace(params, n=1), cache_key="ep")])
    by_request: dict[str, set[str]] = {}  # our vLLM ids are serial-sample-phase
    for rid, _, _ in core.added:
        by_request.setdefault(rid.split("-")[0], set()).add(core.salts[rid])
    assert len(core.added) == 12  # every sample runs its think phase, then a continuation
    a, b, t1, t2 = (by_request[k] for k in sorted(by_request, key=int))
    assert len(a) == len(b) == 1 and a != b
    assert t1 == t2 == {"key:ep"} and not (a & t1)
    assert engine.stats.requests == 12 and engine.stats.cached_prompt_tokens == 0
    assert engine.stats.prompt_tokens == sum(len(prompt) for _, prompt, _ in core.added)


def test_closed_think_continues_without_the_phrase() -> None:
    script = {2: 60, 3: 61}
    engine, core = fake_engine(lambda ids: script.get(len(ids), 30))
    req = GenerationRequest("a", [5, 6], SamplingParams(max_new_tokens=8, interruption=SPEC))
    (c,) = engine.generate([req])
    assert c.token_ids == [60, 61, 30, 30, 30, 30, 30, 30] and c.finish_reason == "length"
    assert all(c.loss_mask) and c.metadata["interruption"]["phrase_start"] is None
    assert [max_tokens for _, _, max_tokens in core.added] == [3, 5]


def test_no_room_for_the_phrase_is_length() -> None:
    engine, _ = fake_engine(counting)
    req = GenerationRequest("a", [5, 6], SamplingParams(max_new_tokens=5, interruption=SPEC))
    (c,) = engine.generate([req])
    assert c.num_tokens == 3 and c.finish_reason == "length"


def test_bad_requests_are_refused_before_anything_is_queued() -> None:
    engine, core = fake_engine(counting)
    with pytest.raises(ValueError, match="outside"):
        engine.submit([GenerationRequest("a", [5, 99], SamplingParams())])
    with pytest.raises(ValueError, match="max_model_len"):
        engine.submit([GenerationRequest("a", [5, 6], SamplingParams(max_new_tokens=63))])
    assert core.added == [] and engine.num_unfinished() == 0


class ShowingCore(FakeCore):
    """A fake core that returns `CAP` processed log-probs per token, of which the
    first `sizes[step]` are finite (the sampled token first), the rest -inf; a size above the
    shown count also returns the sampled token from outside them (vLLM's top-N plus the sample)."""

    def __init__(self, script: Any, sizes: list[int]) -> None:
        super().__init__(script)
        self.sizes = sizes
        self.steps = 0

    def step(self) -> list[Any]:
        outputs = super().step()
        for o in outputs:
            (out,) = o.outputs
            tok = out.token_ids[0]
            size = self.sizes[self.steps % len(self.sizes)]
            others = [t for t in range(100, 100 + CAP + 1) if t != tok]
            shown = CAP if size <= CAP else CAP + 1
            entry = {tok: out.logprobs[0][tok]}
            for i, t in enumerate(others[: shown - 1]):
                entry[t] = types.SimpleNamespace(logprob=-2.0 if i + 1 < size else float("-inf"))
            out.logprobs = [entry]
        self.steps += 1
        return outputs


def test_top_p_only_support_is_recorded_at_a_real_vocabulary() -> None:
    """deepseek_v32's sampling (top_p 0.95, top_k 0) at vocabulary 151,936: per token the finite
    ids vLLM showed (at most `CAP`), with the exact set size where vLLM showed all of it and a lower
    bound where it did not."""
    engine, _ = fake_engine(counting)
    engine.vocab_size = 151_936
    core = ShowingCore(counting, sizes=[3, CAP, 1, CAP + 1])
    engine._engine = core
    params = SamplingParams(top_p=0.95, return_support=True, max_new_tokens=4, temperature=1.0)
    engine.check_params(params)
    (c,) = engine.generate([GenerationRequest("a", [5, 6], params)])
    assert c.support == [3, -CAP, 1, -(CAP + 1)]
    assert c.support_cut == (0, 0.95)
    assert c.support_ids is not None and list(c.support_ids.counts) == [3, CAP, 1, CAP]
    toks = c.token_ids
    # The sampled token (log-prob 0 in the fake) ranks first; then the finite others, by id.
    assert c.support_ids.token(0) == [toks[0], *(t for t in range(100, 103) if t != toks[0])][:3]
    assert c.support_ids.token(2) == [toks[2]]
    assert toks[3] in c.support_ids.token(3) and len(set(c.support_ids.token(3))) == CAP
    assert c.support_ids.nbytes == 4 * (4 + 3 + CAP + 1 + CAP)


def test_interruption_phrase_support_is_forced() -> None:
    engine, _ = fake_engine(counting)
    params = SamplingParams(top_k=5, return_support=True, max_new_tokens=20, interruption=SPEC)
    (c,) = engine.generate([GenerationRequest("a", [5, 6], params)])
    assert c.support is not None and c.support[3:5] == [SUPPORT_FORCED, SUPPORT_FORCED]
    assert c.support[:3] == [1, 1, 1]  # the fake core shows the sampled token alone: size 1 of top-5
    assert c.support_ids == SupportIds([1, 1, 1, 0, 0, *[1] * (len(c.token_ids) - 5)],
                                       [*c.token_ids[:3], *c.token_ids[5:]])


def test_a_partial_update_is_refused() -> None:
    engine, core = fake_engine(counting)
    with pytest.raises(KeyError, match="missing"):
        engine.update_weights({}, version=1)
    assert engine.version == 0 and core.weights_version == 0


def test_sleep_mode_calls_and_refusals() -> None:
    engine, core = fake_engine(counting)
    calls: list[tuple] = []
    core.sleep = lambda **kw: calls.append(("sleep", kw))  # type: ignore[attr-defined]
    core.wake_up = lambda tags: calls.append(("wake", tuple(tags))) or tags == ["kv_cache"]  # type: ignore[attr-defined]
    request = GenerationRequest("a", [5, 6], SamplingParams(max_new_tokens=3, n=1))
    with pytest.raises(RuntimeError, match="without sleep mode"):
        engine.sleep(1)
    engine.sleep_mode = True
    engine.submit([request])
    with pytest.raises(RuntimeError, match="1 sequences in flight"):  # vLLM would abort them
        engine.sleep(1)
    while engine.num_unfinished():
        engine.step()
    assert engine.sleep(2) == 0  # no CUDA: nothing measured
    with pytest.raises(RuntimeError, match="while the engine sleeps"):
        engine.submit([request])
    assert engine.wake_up(["weights"]) is False  # still asleep: requests still refused
    with pytest.raises(RuntimeError, match="while the engine sleeps"):
        engine.submit([request])
    assert engine.wake_up(["kv_cache"]) is True
    engine.submit([request])
    assert calls == [("sleep", {"level": 2}), ("wake", ("weights",)), ("wake", ("kv_cache",))]
