"""Held-out entropy (`val_entropy`, ScaleRL A.12): the sampled-token estimate against the exact
entropy of the tiny policy at the same prefixes, and its bookkeeping (forced tokens left out,
per-task keys, absent when nothing was sampled)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import pytest
import torch

from scalerl.data.records import PromptRecord
from scalerl.evaluation import evaluate
from scalerl.evaluation.evaluator import sampled_token_entropy
from scalerl.models.tiny import TinyModelSpec, build_tiny_model
from scalerl.pipeline import GroupScorer
from scalerl.rollout import EmbeddedEngine, GenerationRequest, SamplingParams
from scalerl.rollout.protocol import Completion

SPEC = TinyModelSpec(hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=64,
                     max_position_embeddings=128)


class Half:
    def score(self, record: PromptRecord, completion_text: str) -> float:
        return float(record.task == "a")


def _completion(logprobs: list[float], mask: list[bool], rid: str = "r", i: int = 0) -> Completion:
    n = len(logprobs)
    return Completion(request_id=rid, sample_index=i, prompt_ids=[1], token_ids=list(range(n)),
                      logprobs=logprobs, versions=[0] * n, loss_mask=mask, finish_reason="stop",
                      start_version=0)


def test_pooled_over_sampled_tokens_only() -> None:
    a = _completion([-1.0, -2.0, -9.0], [True, True, False])  # the forced token does not count
    b = _completion([-0.5], [True])
    assert sampled_token_entropy([a, b]) == pytest.approx((1.0 + 2.0 + 0.5) / 3)
    assert sampled_token_entropy([_completion([-3.0], [False])]) is None


def test_estimate_matches_exact_entropy_of_the_policy() -> None:
    model = build_tiny_model(SPEC, seed=0).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.15, generator=torch.Generator().manual_seed(3))
    recs = [PromptRecord(id=f"q{i}", task="a" if i % 2 else "b", prompt="x") for i in range(8)]
    seen: list[Completion] = []

    def generate(requests: Sequence[GenerationRequest]) -> list[Completion]:
        out = EmbeddedEngine(model, max_batch_size=8, seed=0, eos_token_ids=()).generate(requests)
        seen.extend(out)
        return out

    params = SamplingParams(max_new_tokens=12, temperature=1.0)
    scorer = GroupScorer(Half(), lambda ids: "", max_workers=1)  # type: ignore[arg-type]
    out = evaluate(generate, recs, lambda r: [5 + int(r.id[1:]), 6, 7], 4, params, scorer, seed=1)
    # Exact H(pi(. | prefix)) at every sampled token's prefix, and -log pi of the token drawn.
    exact, drawn = [], []
    with torch.no_grad():
        for c in seen:
            ids = torch.tensor([c.prompt_ids + c.token_ids])
            logp = torch.log_softmax(model(ids).logits[0].double(), dim=-1)
            for t, tok in enumerate(c.token_ids):
                row = logp[len(c.prompt_ids) - 1 + t]
                exact.append(float(-(row.exp() * row).sum()))
                drawn.append(float(-row[tok]))
    assert out["val_entropy"] == pytest.approx(sum(drawn) / len(drawn), rel=1e-3)  # engine log-probs
    # E[-log pi(x) | prefix] = H(prefix): the gap is noise; 4 standard errors bound it.
    gaps = [d - e for d, e in zip(drawn, exact, strict=True)]
    mean = sum(gaps) / len(gaps)
    se = math.sqrt(sum((g - mean) ** 2 for g in gaps) / (len(gaps) - 1) / len(gaps))
    assert abs(mean) < 4 * se
    assert 0.5 < sum(exact) / len(exact) < math.log(model.config.vocab_size)
    for task in ("a", "b"):
        assert out[f"val_entropy/{task}"] > 0
