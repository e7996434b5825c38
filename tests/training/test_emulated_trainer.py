"""EmulatedTrainer: the Trainer protocol with a modelled step time."""

from __future__ import annotations

import time

import pytest

from scalerl.data.records import PromptRecord
from scalerl.pipeline.interfaces import Trainer
from scalerl.rollout.emulated import EmulatedEngine
from scalerl.rollout.protocol import GenerationRequest, SamplingParams
from scalerl.training.batch import ScoredGroup
from scalerl.training.emulated import EmulatedTrainer


def groups(lengths: list[int]) -> list[ScoredGroup]:
    engine = EmulatedEngine(vocab_size=50, step_s=0.0, sleep=False, length_median=1e9)
    out = []
    for i, length in enumerate(lengths):
        request = GenerationRequest(f"r{i}", [1], SamplingParams(max_new_tokens=length, seed=i))
        (c,) = engine.generate([request])  # a huge median: every sample is truncated at `length`
        out.append(ScoredGroup(PromptRecord(id=f"p{i}", task="t", prompt="q"), [c], [0.0]))
    return out


def test_step_time_and_versions() -> None:
    trainer = EmulatedTrainer(step_s=0.01, token_s=0.001, slowdown=2.0, weight_numel=5, sleep=False)
    assert isinstance(trainer, Trainer)
    metrics = trainer.step(groups([7, 13]))
    assert metrics["train_tokens"] == 20
    assert metrics["train_device_s"] == pytest.approx(2.0 * (0.01 + 0.001 * 20))
    assert trainer.version == 1 and trainer.steps == 1
    trainer.step(groups([5]))
    assert trainer.device_s == pytest.approx(2.0 * (0.01 + 0.02) + 2.0 * (0.01 + 0.005))
    weights = trainer.weights_for_engine()
    assert weights["weight"].shape == (5,) and weights["weight"].eq(2.0).all()
    with pytest.raises(ValueError, match="no groups"):
        trainer.step([])
    with pytest.raises(ValueError, match="slowdown"):
        EmulatedTrainer(slowdown=0.0)


def test_step_sleeps_the_modelled_time() -> None:
    trainer = EmulatedTrainer(step_s=0.05)
    start = time.perf_counter()
    trainer.step(groups([3]))
    assert time.perf_counter() - start >= 0.05
