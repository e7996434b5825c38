"""The chunked head's closed-form path (`training.head_grad`): values and gradients against the
formulas written out here in float64, element by element, and the path's wiring in the trainer."""

from __future__ import annotations

import copy
import math

import pytest
import torch

import scalerl.training.forward as forward_module
from scalerl.config import AlgorithmConfig, OptimConfig
from scalerl.training.head_grad import chunk_logit_grad, chunk_logprobs
from scalerl.training.trainer import Trainer


def _reference(logits: torch.Tensor, targets: torch.Tensor, t: float, g_lp: torch.Tensor,
               g_h: torch.Tensor) -> tuple[list[float], list[float], list[list[float]]]:
    """log p_t, H and dL/dlogits, L = sum_i g_lp_i log p_t_i + g_h_i H_i, by the textbook formulas:
    p_j = exp(z_j) / sum_k exp(z_k), z = logits / T; d log p_t / dz_j = [j = t] - p_j;
    dH / dz_j = -p_j (log p_j + H); d/dlogits = d/dz / T. Plain Python floats (double)."""
    lps, hs, grads = [], [], []
    for i, row in enumerate(logits.double().tolist()):
        z = [x / t for x in row]
        top = max(z)
        norm = sum(math.exp(x - top) for x in z)
        p = [math.exp(x - top) / norm for x in z]
        logp = [x - top - math.log(norm) for x in z]
        h = -sum(pj * lj for pj, lj in zip(p, logp, strict=True))
        tgt = int(targets[i])
        lps.append(logp[tgt])
        hs.append(h)
        a, b = float(g_lp[i]), float(g_h[i])
        grads.append([(a * ((j == tgt) - p[j]) - b * p[j] * (logp[j] + h)) / t for j in range(len(z))])
    return lps, hs, grads


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_chunk_values_and_gradient_match_the_formulas(temperature):
    gen = torch.Generator().manual_seed(0)
    logits = 3.0 * torch.randn(6, 40, generator=gen)  # peaked rows: entropies well below log 40
    targets = torch.randint(0, 40, (6,), generator=gen)
    g_lp, g_h = torch.randn(6, generator=gen), torch.randn(6, generator=gen)
    ref_lp, ref_h, ref_grad = _reference(logits, targets, temperature, g_lp, g_h)
    lp, h, lse = chunk_logprobs(logits.clone(), targets, temperature, torch.empty(6, 40))
    assert h is not None
    torch.testing.assert_close(lp.double(), torch.tensor(ref_lp, dtype=torch.float64), rtol=0, atol=1e-5)
    torch.testing.assert_close(h.double(), torch.tensor(ref_h, dtype=torch.float64), rtol=0, atol=1e-5)
    expected = torch.tensor(ref_grad, dtype=torch.float64)
    grad = chunk_logit_grad(logits.clone(), targets, lse, temperature, g_lp, g_h, torch.empty(6, 40))
    torch.testing.assert_close(grad.double(), expected, rtol=0, atol=1e-5)
    # Without the entropy term: the log-prob part alone (g_h = 0 in the formula).
    _, _, ref_lp_only = _reference(logits, targets, temperature, g_lp, torch.zeros(6))
    grad = chunk_logit_grad(logits.clone(), targets, lse, temperature, g_lp)
    expected = torch.tensor(ref_lp_only, dtype=torch.float64)
    torch.testing.assert_close(grad.double(), expected, rtol=0, atol=1e-5)


def test_log_probs_without_entropy_and_greedy_temperature():
    """No spare block: no entropy; temperature 0 scores under T = 1 (`token_logprobs`)."""
    logits = torch.tensor([[0.0, 1.0, 2.0], [5.0, -1.0, 0.5]])
    lp, h, _ = chunk_logprobs(logits.clone(), torch.tensor([2, 1]), 0.0)
    assert h is None
    expected = [2.0 - math.log(1 + math.e + math.e**2),
                -1.0 - math.log(math.exp(5) + math.exp(-1) + math.exp(0.5))]
    torch.testing.assert_close(lp.double(), torch.tensor(expected, dtype=torch.float64), rtol=0, atol=1e-6)


def _counted_closed_form(monkeypatch) -> list[int]:
    """Every call of `chunk_logit_grad` (the closed form's backward) appends to the returned list."""
    calls: list[int] = []
    real = forward_module.chunk_logit_grad

    def counting(*a, **kw):
        calls.append(1)
        return real(*a, **kw)

    monkeypatch.setattr(forward_module, "chunk_logit_grad", counting)
    return calls


def _gradients(base, groups, monkeypatch, chunk: int, closed_form: bool) -> dict[str, torch.Tensor]:
    """Every parameter gradient of one `compute_gradients` (GRPO-family default, entropy term on) on
    a copy of `base`, with `forward.CLOSED_FORM` set."""
    monkeypatch.setattr(forward_module, "CLOSED_FORM", closed_form)
    policy = copy.deepcopy(base)
    Trainer(policy, AlgorithmConfig(entropy_coef=-0.02),
            OptimConfig(micro_batch_size=64, logit_chunk_tokens=chunk)).compute_gradients(groups)
    return {n: p.grad.clone() for n, p in policy.model.named_parameters() if p.grad is not None}


def test_the_trainer_takes_the_closed_form_path_and_its_gradient_is_the_full_paths(make_policy, make_groups,
                                                                                  monkeypatch):
    """The FP32 head, in one chunk or several: `ChunkedHeadLogprobs` runs `chunk_logit_grad`
    (counted) and the step's gradients equal plain autograd's over the full logits."""
    base = make_policy()
    groups = make_groups(base, n_groups=3, n=4, noise=0.4)
    calls = _counted_closed_form(monkeypatch)
    reference = _gradients(base, groups, monkeypatch, 10**9, closed_form=False)  # plain autograd
    assert not calls
    for chunk in (10**9, 5):  # one chunk, and several
        calls.clear()
        grads = _gradients(base, groups, monkeypatch, chunk, closed_form=True)
        assert calls, f"chunk {chunk}: the FP32 head did not take the closed-form path"
        for name, g in grads.items():
            torch.testing.assert_close(g, reference[name], rtol=0, atol=1e-6, msg=f"{name} chunk {chunk}")


def test_a_bf16_run_with_the_fp32_head_gets_the_reference_gradient(make_policy, make_groups, monkeypatch):
    """A bf16 run (float32 master weights, every pass under bf16 autocast: `training.policy`) with
    the FP32 head, ScaleRL's setting: the closed form runs inside the autocast pass (its products
    in float32, autocast off there) and every parameter gradient matches the reference paths' to
    bf16 rounding of the decoder."""
    base = make_policy(dtype="bfloat16", fp32_lm_head=True)
    groups = make_groups(base, n_groups=3, n=4, noise=0.4)
    calls = _counted_closed_form(monkeypatch)
    reference = _gradients(base, groups, monkeypatch, 5, closed_form=False)
    assert not calls
    closed = _gradients(base, groups, monkeypatch, 5, closed_form=True)
    assert calls  # the closed form ran
    assert reference.keys() == closed.keys() and reference
    for name, g in closed.items():
        torch.testing.assert_close(g, reference[name], rtol=2e-2, atol=1e-4, msg=name)
