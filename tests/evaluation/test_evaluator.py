"""mean@k evaluation on the real embedded engine (a tiny random model): the aggregation, the
determinism given a seed, extra sets, verifier failures, incomplete generations."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import torch

from scalerl.data.records import PromptRecord
from scalerl.evaluation import Evaluator, evaluate
from scalerl.models.tiny import TinyModelSpec, build_tiny_model
from scalerl.pipeline import GroupScorer
from scalerl.rollout import EmbeddedEngine, GenerationRequest, SamplingParams
from scalerl.rollout.protocol import Completion

SPEC = TinyModelSpec(hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=64,
                     max_position_embeddings=128)
PARAMS = SamplingParams(max_new_tokens=10, temperature=1.0)


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    m = build_tiny_model(SPEC, seed=0)
    with torch.no_grad():
        for p in m.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.3, generator=torch.Generator().manual_seed(1))
    return m


def engine(model: torch.nn.Module, seed: int = 0, slots: int = 8) -> EmbeddedEngine:
    return EmbeddedEngine(model, max_batch_size=slots, seed=seed, eos_token_ids=())


def records(n: int) -> list[PromptRecord]:
    return [PromptRecord(id=f"q{i}", task="parity", prompt=f"question {i}") for i in range(n)]


def encode(record: PromptRecord) -> list[int]:
    return [5 + int(record.id[1:]) % 50, 6, 7]


def decode(ids: list[int]) -> str:
    return " ".join(map(str, ids))


def first_token_even(text: str) -> bool:
    return int(text.split()[0]) % 2 == 0


class ParityScorer:
    """Correct iff the first generated token id is even; raises on `fail_ids` prompts."""

    def __init__(self, fail_ids: Sequence[str] = ()) -> None:
        self.fail_ids = set(fail_ids)

    def score(self, record: PromptRecord, completion_text: str) -> float:
        if record.id in self.fail_ids:
            raise RuntimeError("verifier crashed")
        return 1.0 if first_token_even(completion_text) else 0.0


def scorer(**kwargs: object) -> GroupScorer:
    return GroupScorer(ParityScorer(**kwargs), decode, max_workers=2)  # type: ignore[arg-type]


def test_mean_at_k_is_mean_over_prompts_of_fraction_correct(model: torch.nn.Module) -> None:
    recs, k = records(5), 4
    seen: list[Completion] = []

    def generate(requests: Sequence[GenerationRequest]) -> list[Completion]:
        out = engine(model).generate(requests)
        seen.extend(out)
        return out

    out = evaluate(generate, recs, encode, k, PARAMS, scorer(), seed=3)
    per_prompt = {}
    for c in seen:
        per_prompt.setdefault(c.request_id, []).append(c.token_ids[0] % 2 == 0)
    assert len(per_prompt) == 5 and all(len(v) == k for v in per_prompt.values())
    expected = sum(sum(v) / k for v in per_prompt.values()) / 5
    assert out["val_pass_rate"] == pytest.approx(expected)
    assert out["val_pass_at_k"] == pytest.approx(sum(any(v) for v in per_prompt.values()) / 5)
    assert out["val_reward_mean"] == pytest.approx(expected)  # equal group sizes
    assert out["val_truncation_rate"] == 1.0  # no stop token: every sample hits max_new_tokens
    assert out["val_response_length"] == 10
    assert out["val_num_prompts"] == 5 and out["val_k"] == 4
    assert 0.0 < expected < 1.0


def test_deterministic_given_seed(model: torch.nn.Module) -> None:
    recs = records(6)
    seen: dict[int, list[list[int]]] = {}

    def gen(tag: int, eng: EmbeddedEngine):
        def generate(requests: Sequence[GenerationRequest]) -> list[Completion]:
            out = eng.generate(requests)
            seen[tag] = [c.token_ids for c in out]
            return out
        return generate

    drop = {"val_time_s"}
    # Different engine seeds and slot counts: the evaluator's per-request seeds decide the draws.
    a = evaluate(gen(0, engine(model, seed=1, slots=8)), recs, encode, 3, PARAMS, scorer(), seed=7)
    b = evaluate(gen(1, engine(model, seed=2, slots=3)), recs, encode, 3, PARAMS, scorer(), seed=7)
    c = evaluate(gen(2, engine(model, seed=1, slots=8)), recs, encode, 3, PARAMS, scorer(), seed=8)
    assert seen[0] == seen[1]
    # The sampled-token entropy sums engine log-probs, which differ in float rounding with the batch.
    drop |= {k for k in a if k.startswith("val_entropy")}
    assert {k: v for k, v in a.items() if k not in drop} == {k: v for k, v in b.items() if k not in drop}
    assert a["val_entropy"] == pytest.approx(b["val_entropy"], rel=1e-6)
    assert seen[2] != seen[0]
    assert c.keys() == a.keys()


def test_verifier_failure_counts_as_incorrect(model: torch.nn.Module) -> None:
    seen: list[Completion] = []

    def generate(requests: Sequence[GenerationRequest]) -> list[Completion]:
        out = engine(model).generate(requests)
        seen.extend(out)
        return out

    out = evaluate(generate, records(2), encode, 4, PARAMS, scorer(fail_ids=["q0"]), seed=1)
    assert out["val_verifier_failures"] == 4
    q1 = [c.token_ids[0] % 2 == 0 for c in seen if c.request_id == "eval/1"]
    assert out["val_pass_rate"] == pytest.approx((0.0 + sum(q1) / 4) / 2)


def test_extra_sets_get_their_own_keys(model: torch.nn.Module) -> None:
    ev = Evaluator(records(2), encode, scorer(), k=2, params=PARAMS, seed=0,
                   extra_sets={"aime": records(3)})
    out = ev.run(engine(model).generate)
    alone = evaluate(engine(model).generate, records(3), encode, 2, PARAMS, scorer(), seed=0)
    assert out["val_aime_pass_rate"] == alone["val_pass_rate"]
    assert out["val_aime_num_prompts"] == 3 and out["val_num_prompts"] == 2
    with pytest.raises(ValueError, match="identifier"):
        Evaluator(records(1), encode, scorer(), k=1, params=PARAMS, extra_sets={"a-b": records(1)})


def test_rejects_incomplete_generation(model: torch.nn.Module) -> None:
    def lossy(requests: Sequence[GenerationRequest]) -> list[Completion]:
        return engine(model).generate(requests)[:-1]

    with pytest.raises(RuntimeError, match=r"expected 0\.\.2"):
        evaluate(lossy, records(1), encode, 3, PARAMS, scorer())
