from __future__ import annotations

import pytest
import torch

from scalerl.config import OptimConfig
from scalerl.training.optim import build_optimizer, build_scheduler, warmup_factor


def test_warmup_is_linear_then_constant():
    assert [warmup_factor(s, 4) for s in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    assert warmup_factor(0, 0) == 1.0


def test_scheduler_and_paper_defaults():
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.LayerNorm(3))
    opt = build_optimizer(model, OptimConfig(lr=0.1, warmup_steps=2))
    sched = build_scheduler(opt, 2)
    lrs = []
    for _ in range(4):
        lrs.append(sched.get_last_lr()[0])
        opt.step()
        sched.step()
    assert lrs == pytest.approx([0.05, 0.1, 0.1, 0.1])
    decay, no_decay = opt.param_groups
    assert decay["eps"] == 1e-15 and decay["weight_decay"] == 0.01
    assert no_decay["weight_decay"] == 0.0
    assert sum(p.numel() for p in decay["params"]) == 9  # only the weight matrix is decayed
