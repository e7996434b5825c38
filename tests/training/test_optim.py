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


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_fused_update_is_adamws_formula(dtype):
    """Plain tensors take PyTorch's fused AdamW; two steps equal AdamW written out (Loshchilov &
    Hutter, arXiv 1711.05101, Alg. 2, with PyTorch's bias correction and decoupled decay):
    theta <- theta (1 - lr wd); m <- b1 m + (1 - b1) g; v <- b2 v + (1 - b2) g^2;
    theta <- theta - lr (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(4, 3, bias=False).to(dtype)
    cfg = OptimConfig(lr=0.05, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    opt = build_optimizer(lin, cfg)
    assert opt.param_groups[0]["fused"] is True
    theta = lin.weight.detach().double().clone()
    m, v = torch.zeros_like(theta), torch.zeros_like(theta)
    for t in (1, 2):
        g = torch.randn(3, 4).to(dtype)
        lin.weight.grad = g.clone()
        opt.step()
        g = g.double()
        theta = theta * (1 - cfg.lr * cfg.weight_decay)
        m = 0.9 * m + 0.1 * g
        v = 0.95 * v + 0.05 * g * g
        theta = theta - cfg.lr * (m / (1 - 0.9**t)) / ((v / (1 - 0.95**t)).sqrt() + cfg.eps)
        if dtype == torch.bfloat16:  # the parameter is stored in bf16 after every step
            theta = theta.to(dtype).double()
    tol = 1e-6 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(lin.weight.detach().double(), theta, rtol=0, atol=tol)
