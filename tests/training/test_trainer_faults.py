"""A skipped step leaves the optimizer exactly as it was: NaN logits, every group filtered."""

from __future__ import annotations

import copy

import pytest
import torch

from scalerl.config import AlgorithmConfig, OptimConfig
from scalerl.training import forward as forward_module
from scalerl.training.trainer import Trainer, TrainingDivergedError


def _snapshot(trainer: Trainer) -> dict:
    return {
        "optimizer": copy.deepcopy(trainer.optimizer.state_dict()),
        "scheduler": copy.deepcopy(trainer.scheduler.state_dict()),
        "params": [p.detach().clone() for p in trainer.policy.model.parameters()],
        "version": trainer.version,
    }


def _equal(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def _poison_logits(mp: pytest.MonkeyPatch, rows: list[int] | None) -> None:
    """NaN in the LM head's logits (a bad kernel, an overflow in bf16): in `rows` of every block the
    head projects (the first response token of the micro-batch's first sample, for `[0]`), or
    everywhere."""
    real = forward_module.project_logits

    def poisoned(hidden, weight, bias, *, fp32, softcap, **kw):
        logits = real(hidden, weight, bias, fp32=fp32, softcap=softcap, **kw)
        if rows is None:
            return logits * float("nan")
        return logits.index_fill(0, torch.tensor(rows, device=logits.device), float("nan"))

    mp.setattr(forward_module, "project_logits", poisoned)


@pytest.fixture
def warm_trainer(make_policy, make_groups) -> Trainer:
    """Three real updates first, so the optimizer has moments and a step count to corrupt."""
    policy = make_policy()
    trainer = Trainer(policy, AlgorithmConfig(), OptimConfig(lr=1e-3, warmup_steps=10,
                                                             max_consecutive_bad_steps=3))
    for seed in range(3):
        assert trainer.step(make_groups(policy, seed=seed))["skipped_nonfinite"] == 0.0
    assert trainer.optimizer.state and trainer.version == 3
    return trainer


def test_nan_logits_skip_the_step_and_leave_the_optimizer_untouched(warm_trainer, make_groups) -> None:
    trainer = warm_trainer
    groups = make_groups(trainer.policy, seed=7)
    before = _snapshot(trainer)
    # NaN in one sample's logits, for one step only.
    with pytest.MonkeyPatch.context() as mp:
        _poison_logits(mp, rows=[0])
        m = trainer.step(groups)
    assert m["skipped_nonfinite"] == 1.0 and m["bad_steps_total"] == 1.0
    assert _equal(_snapshot(trainer), before)
    assert all(p.grad is None for p in trainer.policy.model.parameters())
    # The next step is a normal one, from exactly the state a run without the bad batch would have.
    twin = copy.deepcopy(trainer)
    assert trainer.step(groups)["skipped_nonfinite"] == 0.0
    twin.step(groups)
    assert all(torch.equal(a, b) for a, b in
               zip(trainer.policy.model.parameters(), twin.policy.model.parameters(), strict=True))


def test_nan_logits_in_a_row_stop_with_a_clear_error(warm_trainer, make_groups) -> None:
    trainer = warm_trainer
    groups = make_groups(trainer.policy, seed=7)
    before = _snapshot(trainer)
    with pytest.MonkeyPatch.context() as mp:
        _poison_logits(mp, rows=None)
        assert trainer.step(groups)["skipped_nonfinite"] == 1.0
        assert trainer.step(groups)["skipped_nonfinite"] == 1.0
        with pytest.raises(TrainingDivergedError, match=r"3 consecutive .*non-finite policy log-probs"):
            trainer.step(groups)
    assert _equal(_snapshot(trainer), before)


def test_a_batch_whose_every_group_is_filtered_is_a_counted_noop(warm_trainer, make_groups) -> None:
    trainer = warm_trainer
    flat = make_groups(trainer.policy, n_groups=3, zero_variance_groups=3, seed=9)
    before = _snapshot(trainer)
    m = trainer.step(flat)
    assert m["skipped_no_signal"] == 1.0 and m["zero_variance_frac"] == 1.0 and m["noop_steps_total"] == 1.0
    assert _equal(_snapshot(trainer), before)
