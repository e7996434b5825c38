"""Chunked LM head (`training.forward.ChunkedHeadLogprobs`): the step's loss and gradients equal the
full-logit path's, for every objective setting, and no more than one chunk of logits is projected
at a time, in forward or backward."""

from __future__ import annotations

import contextlib
import copy

import pytest
import torch

import scalerl.training.forward as forward_module
from scalerl.config import AlgorithmConfig, OptimConfig, TisConfig
from scalerl.training.batch import collate
from scalerl.training.forward import logit_chunk_size, response_forward
from scalerl.training.trainer import Trainer

# float32 throughout: the chunked path runs the unchunked path's operations on fewer rows, so the
# only differences are the matrix products' rounding; and, on the closed-form path
# (training.head_grad), the entropy's sum in another order: a few float32 ulps of H ~ 5 nats.
ATOL = 1e-6
ENTROPY_RTOL = 1e-6
# A chunk above any micro-batch's response tokens: the unchunked (full-logit) reference path.
FULL = 10**9


@contextlib.contextmanager
def _reference_paths():
    """The paths the closed form is tested against (`forward.CLOSED_FORM` off): plain autograd over
    every position's logits within one chunk, autograd through each chunk's recomputation beyond."""
    forward_module.CLOSED_FORM = False
    try:
        yield
    finally:
        forward_module.CLOSED_FORM = True


def _grads(trainer: Trainer) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in trainer.policy.model.named_parameters() if p.grad is not None}


def _run(base, groups, algo: AlgorithmConfig, chunk: int, warm_groups=None):
    policy = copy.deepcopy(base)
    trainer = Trainer(policy, algo, OptimConfig(micro_batch_size=5, logit_chunk_tokens=chunk, lr=3e-3),
                      max_new_tokens=16)
    if warm_groups is not None:
        # One update first, so the policy differs from the KL reference (its initial weights).
        trainer.step(warm_groups)
    return trainer.compute_gradients(groups), _grads(trainer)


def _assert_same(base, groups, algo: AlgorithmConfig, warm_groups=None) -> None:
    with _reference_paths():
        ref_metrics, ref_grads = _run(base, groups, algo, FULL, warm_groups)
    assert ref_grads and any(float(g.abs().max()) > 0 for g in ref_grads.values())
    # Micro-batches of 5 samples hold up to ~55 response tokens: FULL is one chunk (the FP32 head's
    # closed form there too), and under the reference paths chunk 7 is autograd's recomputation.
    for chunk in (1, 7, 24, FULL):
        metrics, grads = _run(base, groups, algo, chunk, warm_groups)
        assert metrics["loss"] == pytest.approx(ref_metrics["loss"], rel=0, abs=ATOL), chunk
        assert metrics["entropy"] == pytest.approx(ref_metrics["entropy"], rel=0, abs=ATOL), chunk
        assert metrics["kl"] == pytest.approx(ref_metrics["kl"], rel=0, abs=ATOL, nan_ok=True), chunk
        assert grads.keys() == ref_grads.keys()
        for name, g in grads.items():
            torch.testing.assert_close(g, ref_grads[name], rtol=0, atol=ATOL, msg=f"{name} chunk={chunk}")
    with _reference_paths():
        metrics, grads = _run(base, groups, algo, 7, warm_groups)
    assert metrics["loss"] == pytest.approx(ref_metrics["loss"], rel=0, abs=ATOL)
    for name, g in grads.items():
        torch.testing.assert_close(g, ref_grads[name], rtol=0, atol=ATOL, msg=f"{name} autograd chunks")


@pytest.fixture
def setup(make_policy, make_groups):
    base = make_policy()
    groups = make_groups(base, n_groups=3, n=4, noise=0.4) + make_groups(base, n_groups=1, n=2, seed=7)
    return base, groups


@pytest.mark.parametrize("loss_type", ["cispo", "grpo", "gspo", "kimi"])
@pytest.mark.parametrize("aggregation", ["prompt", "sample", "token", "constant"])
def test_chunked_head_equals_full_logits_for_every_loss_and_aggregation(setup, loss_type, aggregation):
    base, groups = setup
    algo = AlgorithmConfig(loss_type=loss_type, aggregation=aggregation, eps_max=1.5, entropy_coef=0.01)
    _assert_same(base, groups, algo)


@pytest.mark.parametrize(
    "algo",
    [
        pytest.param(AlgorithmConfig(entropy_coef=0.0), id="entropy-metric"),
        pytest.param(AlgorithmConfig(entropy_coef=-0.05, loss_type="grpo"), id="entropy-grad"),
        pytest.param(AlgorithmConfig(recompute_old_logprobs=True, tis=TisConfig(enabled=True, cap=1.5)),
                     id="tis-token"),
        pytest.param(AlgorithmConfig(recompute_old_logprobs=True, loss_type="gspo",
                                     tis=TisConfig(enabled=True, cap=1.5, level="sequence")), id="tis-seq"),
        pytest.param(AlgorithmConfig(kl_coef=0.1, kl_estimator="k3"), id="kl-loss-k3"),
        pytest.param(AlgorithmConfig(kl_coef=0.1, kl_estimator="unbiased_k3", recompute_old_logprobs=True),
                     id="kl-loss-unbiased-k3"),
        pytest.param(AlgorithmConfig(kl_coef=0.1, kl_in_reward=True), id="kl-in-reward"),
        pytest.param(AlgorithmConfig(kl_coef=0.1, kl_in_reward=True, kl_reward_level="token",
                                     adv_norm="batch"), id="kl-in-reward-token"),
        pytest.param(AlgorithmConfig(offpolicy_mask_delta=0.3), id="offpolicy-mask"),
    ],
)
def test_chunked_head_equals_full_logits_for_tis_kl_and_entropy(setup, make_groups, algo):
    base, groups = setup
    warm = make_groups(base, seed=11) if algo.kl_coef > 0 else None
    _assert_same(base, groups, algo, warm)


def test_response_forward_chunked_equals_full_values_and_padding(make_policy, make_groups):
    policy = make_policy()
    batch = collate(make_groups(policy), policy.pad_token_id)
    mask = batch.token_mask
    with _reference_paths():
        full = response_forward(policy.model, batch, temperature=0.7, fp32_lm_head=True, entropy="grad",
                                logit_chunk_tokens=FULL)
    chunked = response_forward(policy.model, batch, temperature=0.7, fp32_lm_head=True, entropy="grad",
                               logit_chunk_tokens=5)
    torch.testing.assert_close(chunked.logprobs[mask], full.logprobs[mask], rtol=0, atol=ATOL)
    torch.testing.assert_close(chunked.entropy, full.entropy, rtol=ENTROPY_RTOL, atol=ATOL)
    assert bool((chunked.logprobs[~mask] == 0).all()) and bool((chunked.entropy[~mask] == 0).all())


def test_chunked_head_with_a_model_dtype_head_and_bf16_autocast(make_policy, make_groups):
    """fp32_lm_head=False (the head in the autocast dtype): backward recomputes each chunk under the
    forward's autocast state, so the chunked gradient is the full path's (bf16 rounding aside)."""
    base = make_policy(dtype="bfloat16", fp32_lm_head=False)
    groups = make_groups(base, noise=0.4)
    results = []
    for chunk in (FULL, 6):
        policy = copy.deepcopy(base)
        trainer = Trainer(policy, AlgorithmConfig(entropy_coef=0.01),
                          OptimConfig(logit_chunk_tokens=chunk))
        results.append((trainer.compute_gradients(groups), _grads(trainer)))
    (m_full, g_full), (m_chunk, g_chunk) = results
    assert m_chunk["loss"] == pytest.approx(m_full["loss"], rel=1e-2, abs=1e-3)
    for name, g in g_chunk.items():
        torch.testing.assert_close(g, g_full[name], rtol=5e-2, atol=5e-3, msg=name)


def test_no_more_than_one_chunk_of_logits_is_projected_at_a_time(make_policy, make_groups, monkeypatch):
    policy = make_policy()
    groups = make_groups(policy, n_groups=3, n=4)
    real = forward_module.project_logits
    rows: list[int] = []

    def counting(hidden, weight, bias, *, fp32, softcap, **kw):
        rows.append(int(hidden.shape[:-1].numel()))
        return real(hidden, weight, bias, fp32=fp32, softcap=softcap, **kw)

    monkeypatch.setattr(forward_module, "project_logits", counting)
    trainer = Trainer(policy, AlgorithmConfig(entropy_coef=0.01),
                      OptimConfig(micro_batch_size=64, logit_chunk_tokens=4))
    trainer.compute_gradients(groups)
    n_tokens = int(collate(groups, policy.pad_token_id).token_mask.sum())
    assert max(rows) == 4 and len(rows) == 2 * ((n_tokens + 3) // 4)  # forward + backward recompute
    assert sum(rows) == 2 * n_tokens  # padding is never projected


def test_default_chunk_follows_the_vocabulary_and_one_chunk_takes_the_closed_form(
    make_policy, make_groups, monkeypatch
):
    """null: 2^27 float32 logits per chunk, 883 tokens at Qwen's 151,936; the tiny default's 108
    never needs a second chunk. With the FP32 head its micro-batch is one chunk of real tokens
    through the closed form (projected once forward, once backward); without it (the reference
    paths), one projection of every padded position through plain autograd."""
    assert logit_chunk_size(None, 151_936) == 883 and logit_chunk_size(None, 108) == 2**27 // 108
    assert logit_chunk_size(300, 151_936) == 300
    policy = make_policy()
    groups = make_groups(policy)
    real = forward_module.project_logits
    shapes: list[tuple[int, ...]] = []

    def recording(hidden, weight, bias, *, fp32, softcap, **kw):
        shapes.append(tuple(hidden.shape[:-1]))
        return real(hidden, weight, bias, fp32=fp32, softcap=softcap, **kw)

    monkeypatch.setattr(forward_module, "project_logits", recording)
    batch = collate(groups, policy.pad_token_id)
    Trainer(policy, AlgorithmConfig(), OptimConfig()).compute_gradients(groups)
    tokens = int(batch.token_mask.sum())
    assert shapes == [(tokens,), (tokens,)]
    shapes.clear()
    with _reference_paths():
        Trainer(policy, AlgorithmConfig(), OptimConfig()).compute_gradients(groups)
    assert shapes == [(len(batch), batch.response_width)]


def test_bad_chunk_size_is_a_clear_error(make_policy, make_groups):
    policy = make_policy()
    batch = collate(make_groups(policy), policy.pad_token_id)
    with pytest.raises(ValueError, match="logit_chunk_tokens"):
        response_forward(policy.model, batch, temperature=1.0, fp32_lm_head=True, logit_chunk_tokens=0)
