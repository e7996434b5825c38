"""Checkpoints: atomic, complete, resumable to an identical next step; keep-last-k; latest."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from scalerl.config import AlgorithmConfig, OptimConfig
from scalerl.training.checkpoint import latest_checkpoint, list_checkpoints, save_checkpoint
from scalerl.training.trainer import Trainer


def _trainer(policy) -> Trainer:
    return Trainer(policy, AlgorithmConfig(), OptimConfig(lr=2e-3, warmup_steps=3))


def test_save_load_gives_identical_next_step(make_policy, make_groups, tmp_path):
    policy = make_policy()
    batches = [make_groups(policy, seed=s) for s in range(3)]
    a = _trainer(policy)
    a.step(batches[0])
    a.step(batches[1])
    a.save(tmp_path, step=2, extra={"pool": {"cursor": 17}, "meter": {"flops": 1.5}})
    rng_after_save = (random.random(), float(np.random.rand()), torch.rand(3))
    m_a = a.step(batches[2])

    b = _trainer(make_policy(seed=99))  # different initial weights: everything must come from disk
    state = b.load(latest_checkpoint(tmp_path))
    assert state.step == 2 and state.extra == {"pool": {"cursor": 17}, "meter": {"flops": 1.5}}
    assert b.version == 2
    rng_after_load = (random.random(), float(np.random.rand()), torch.rand(3))
    assert rng_after_load[0] == rng_after_save[0] and rng_after_load[1] == rng_after_save[1]
    assert torch.equal(rng_after_load[2], rng_after_save[2])
    m_b = b.step(batches[2])

    assert m_a["loss"] == m_b["loss"] and m_a["lr"] == m_b["lr"]
    for pa, pb in zip(a.policy.model.parameters(), b.policy.model.parameters(), strict=True):
        assert torch.equal(pa, pb)
    assert b.version == a.version == 3


def test_checkpoint_loads_with_from_pretrained(make_policy, make_groups, tmp_path):
    policy = make_policy()
    t = _trainer(policy)
    t.step(make_groups(policy))
    path = t.save(tmp_path, step=1)
    model = AutoModelForCausalLM.from_pretrained(path)
    tok = AutoTokenizer.from_pretrained(path)
    ids = torch.tensor([tok.encode("12+34")])
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, policy.model(ids).logits)
    assert list(path.glob("*.safetensors"))


def test_keep_last_k_and_latest(make_policy, tmp_path):
    policy = make_policy()
    for step in (1, 2, 3, 4):
        save_checkpoint(tmp_path, step, model=policy.model, keep=2)
    assert [s for s, _ in list_checkpoints(tmp_path)] == [3, 4]
    assert latest_checkpoint(tmp_path).name == "step_000004"
    assert latest_checkpoint(tmp_path / "nothing") is None


def test_interrupted_save_is_invisible_and_cleaned(make_policy, tmp_path):
    policy = make_policy()
    save_checkpoint(tmp_path, 1, model=policy.model)
    # A crash mid-save leaves a temporary directory (and maybe a step dir without state.json).
    (tmp_path / "checkpoints" / ".tmp-step_000002-123").mkdir()
    (tmp_path / "checkpoints" / "step_000003").mkdir()
    assert latest_checkpoint(tmp_path).name == "step_000001"
    save_checkpoint(tmp_path, 2, model=policy.model)
    assert not list((tmp_path / "checkpoints").glob(".tmp-*"))
    assert latest_checkpoint(tmp_path).name == "step_000002"


def test_failed_save_leaves_previous_checkpoint(make_policy, tmp_path):
    policy = make_policy()
    save_checkpoint(tmp_path, 1, model=policy.model, extra={"a": 1})
    with pytest.raises(ValueError, match="JSON"):
        save_checkpoint(tmp_path, 2, model=policy.model, extra={"bad": object()})
    assert [s for s, _ in list_checkpoints(tmp_path)] == [1]
    assert not list((tmp_path / "checkpoints").glob(".tmp-*"))
    assert json.loads((latest_checkpoint(tmp_path) / "state.json").read_text())["extra"] == {"a": 1}


def test_resave_same_step_replaces(make_policy, tmp_path):
    policy = make_policy()
    save_checkpoint(tmp_path, 5, model=policy.model, extra={"v": 1})
    save_checkpoint(tmp_path, 5, model=policy.model, extra={"v": 2})
    ckpts = list_checkpoints(tmp_path)
    assert len(ckpts) == 1
    assert json.loads((ckpts[0][1] / "state.json").read_text())["extra"] == {"v": 2}
