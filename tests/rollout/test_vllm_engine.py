"""VLLMEngine.

Without vLLM (CPU): the module imports, and its own logic (phases of forced interruption, version
tagging across updates, the fp32 logits function, weight loading in the worker) runs against a small
fake of vLLM's `LLMEngine` interface. With vLLM and a GPU (`gpu` marker): the real engine end to end.
"""

from __future__ import annotations

import importlib.util
import types
from pathlib import Path
from typing import Any

import pytest
import torch

from scalerl.models.lm_head import lm_head_logits, sequence_logprobs
from scalerl.rollout import GenerationRequest, InterruptionSpec, SamplingParams, VLLMEngine
from scalerl.rollout.base import SteppingEngine
from scalerl.rollout.protocol import Completion, Engine
from scalerl.rollout.vllm_engine import (
    _fp32_get_logits,
    contains_subsequence,
    import_vllm,
    load_weights_in_worker,
    phase_seed,
)

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


def test_fp32_logits_function_matches_lm_head(make_model) -> None:
    model = make_model(dtype=torch.bfloat16)
    proc = types.SimpleNamespace(
        _scalerl_fp32_weight=None, org_vocab_size=60, _gather_logits=lambda logits: logits
    )
    hidden = torch.randn(5, 32, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    logits = _fp32_get_logits(proc, hidden, model.lm_head, None)
    assert logits is not None and logits.dtype == torch.float32 and logits.shape == (5, 60)
    torch.testing.assert_close(logits, lm_head_logits(model, hidden, fp32=True)[:, :60], rtol=0, atol=0)
    assert proc._scalerl_fp32_weight is not None  # cached for the next step


def test_load_weights_in_worker_uses_model_loader_and_drops_fp32_cache() -> None:
    loaded: list[tuple[str, torch.Tensor]] = []
    head = torch.nn.Module()
    head._scalerl_fp32_weight = torch.ones(1)
    model = torch.nn.Sequential(head)
    model.load_weights = lambda weights: loaded.extend(weights)  # vLLM models take an iterable
    worker = types.SimpleNamespace(model_runner=types.SimpleNamespace(get_model=lambda: model))
    assert load_weights_in_worker(worker, [("w", torch.zeros(2))]) == 1
    assert [name for name, _ in loaded] == ["w"]
    assert head._scalerl_fp32_weight is None


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

    def add_request(self, rid: str, prompt: dict, params: Any) -> str:
        self.requests[rid] = {"ids": list(prompt["prompt_token_ids"]), "params": params, "n": 0}
        self.added.append((rid, list(prompt["prompt_token_ids"]), params.max_tokens))
        return rid

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def collective_rpc(self, fn: Any, args: tuple = ()) -> list[Any]:
        assert fn is load_weights_in_worker
        self.weights_version = int(dict(args[0])["version"].item())
        return [len(args[0])]

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
            outputs.append(types.SimpleNamespace(request_id=rid, finished=reason is not None, outputs=[out]))
            if reason is not None:
                del self.requests[rid]
        return outputs


def fake_engine(script: Any, eos: tuple[int, ...] = (1,)) -> tuple[VLLMEngine, FakeCore]:
    engine = VLLMEngine.__new__(VLLMEngine)
    SteppingEngine.__init__(engine, 0)
    core = FakeCore(script)
    engine._init_state(core, seed=0, max_logprobs=20)
    engine.vocab_size, engine.eos_token_ids = 64, eos

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


def test_support_needs_top_k() -> None:
    engine, _ = fake_engine(counting)
    params = SamplingParams(top_p=0.9, return_support=True)
    with pytest.raises(ValueError, match="top_k"):
        engine.submit([GenerationRequest("a", [5], params)])
    with pytest.raises(ValueError, match="outside"):
        engine.submit([GenerationRequest("a", [5, 99], SamplingParams())])


# ----------------------------------------------------------------------------- real vLLM (GPU)


def _save_tiny(path: Path, seed: int) -> torch.nn.Module:
    from scalerl.models.tiny import TinyModelSpec, build_tiny_model, build_tiny_tokenizer

    tok = build_tiny_tokenizer()
    # head_dim 64 (hidden 128 / 2 heads): a size every vLLM attention backend supports.
    spec = TinyModelSpec(hidden_size=128, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=256)
    model = build_tiny_model(spec, vocab_size=len(tok), seed=seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.2)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return model


@pytest.fixture(scope="module")
def vllm_setup(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[VLLMEngine, torch.nn.Module, torch.nn.Module]:
    path = tmp_path_factory.mktemp("tiny_a")
    model_a = _save_tiny(path, seed=0)
    model_b = _save_tiny(tmp_path_factory.mktemp("tiny_b"), seed=1)
    engine = VLLMEngine(
        str(path),
        fp32_lm_head=True,
        gpu_memory_utilization=0.2,
        max_batch_size=16,
        engine_kwargs={"max_model_len": 512, "enforce_eager": True, "dtype": "bfloat16"},
    )
    return engine, model_a, model_b


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_VLLM, reason="vllm not installed")
def test_vllm_logprobs_match_trainer(vllm_setup) -> None:
    engine, model_a, _b = vllm_setup
    trainer = model_a.to("cuda", torch.bfloat16)
    params = SamplingParams(temperature=0.8, top_k=10, max_new_tokens=24, n=4, return_support=True, seed=1)
    outs = engine.generate([GenerationRequest("q", [10, 11, 12, 13], params)])
    assert len(outs) == 4
    diffs = []
    for c in outs:
        assert c.support is not None and all(t in s for t, s in zip(c.token_ids, c.support, strict=True))
        ids = torch.tensor([c.prompt_ids + c.token_ids], device="cuda")
        support = torch.zeros(1, c.num_tokens, trainer.config.vocab_size, dtype=torch.bool, device="cuda")
        for t, sup in enumerate(c.support):
            support[0, t, sup] = True
        with torch.no_grad():
            ref = sequence_logprobs(
                trainer, ids, fp32_lm_head=True, temperature=0.8, response_start=4, support_mask=support
            )[0]
        diffs.append((torch.tensor(c.logprobs, device="cuda") - ref).abs())
    diff = torch.cat(diffs)
    # bf16 backbones with different kernels: close on average, not bit-equal.
    assert diff.mean() < 0.02 and diff.max() < 0.2


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_VLLM, reason="vllm not installed")
def test_vllm_in_flight_update(vllm_setup) -> None:
    engine, _a, model_b = vllm_setup
    engine.submit(
        [GenerationRequest(f"r{i}", [10 + i, 11], SamplingParams(max_new_tokens=32)) for i in range(4)]
    )
    done: list[Completion] = []
    for _ in range(5):
        done += engine.step()
    engine.update_weights({k: v.to(torch.bfloat16) for k, v in model_b.state_dict().items()}, version=1)
    while engine.num_unfinished():
        done += engine.step()
    assert sorted(c.request_id for c in done) == [f"r{i}" for i in range(4)]
    for c in done:
        assert c.versions == sorted(c.versions) and set(c.versions) <= {0, 1}
    assert any(c.versions[0] == 0 and c.versions[-1] == 1 for c in done)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_VLLM, reason="vllm not installed")
def test_vllm_forced_interruption(vllm_setup) -> None:
    engine, _a, _b = vllm_setup
    spec = InterruptionSpec(
        think_budget_lo=4, think_budget_hi=8, answer_budget=5, phrase_ids=(40, 41, 42), think_end_ids=(7, 8)
    )
    params = SamplingParams(max_new_tokens=40, n=8, interruption=spec, seed=3)
    outs = engine.generate([GenerationRequest("q", [10, 11, 12], params)])
    for c in outs:
        start = c.metadata["interruption"]["phrase_start"]
        if start is not None:
            assert c.token_ids[start : start + 3] == [40, 41, 42]
            assert c.finish_reason in ("interrupted", "length")
            assert c.num_tokens <= start + 3 + 5
            assert c.loss_mask[start : start + 3] == [False] * 3
