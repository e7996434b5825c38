"""Trainer log-probs agree with the generator's (same LM-head code), including keep-sampling-mask."""

from __future__ import annotations

import copy

import pytest
import torch

from scalerl.config import AlgorithmConfig, OptimConfig
from scalerl.data.records import PromptRecord
from scalerl.models.lm_head import sequence_logprobs
from scalerl.rollout import EmbeddedEngine, GenerationRequest, InterruptionSpec, SamplingParams
from scalerl.rollout.support import SupportIds
from scalerl.training.batch import ScoredGroup, collate
from scalerl.training.forward import response_forward
from scalerl.training.trainer import Trainer


def _generate(policy, params: SamplingParams, prompts: list[list[int]]) -> list[ScoredGroup]:
    engine = EmbeddedEngine(copy.deepcopy(policy.model), max_batch_size=4, fp32_lm_head=True, seed=3)
    requests = [GenerationRequest(f"r{i}", p, params) for i, p in enumerate(prompts)]
    completions = engine.generate(requests)
    groups = []
    for i in range(len(prompts)):
        comps = [c for c in completions if c.request_id == f"r{i}"]
        rewards = [float(j % 2) for j in range(len(comps))]
        groups.append(ScoredGroup(PromptRecord(id=f"r{i}", task="toy", prompt="x"), comps, rewards))
    return groups


def _max_diff(trainer: Trainer, groups: list[ScoredGroup]) -> float:
    batch = collate(groups, trainer.policy.pad_token_id)
    lp = trainer.compute_logprobs(batch)
    return float((lp - batch.behavior_logprobs).abs()[batch.response_mask].max())


def test_response_forward_equals_lm_head_sequence_logprobs(make_policy, make_groups):
    policy = make_policy()
    batch = collate(make_groups(policy), policy.pad_token_id)
    ours = response_forward(policy.model, batch, temperature=0.8, fp32_lm_head=True, entropy="metric")
    theirs = sequence_logprobs(policy.model, batch.input_ids, batch.attention_mask, fp32_lm_head=True,
                               temperature=0.8, response_start=batch.prompt_width)
    mask = batch.token_mask
    torch.testing.assert_close(ours.logprobs[mask], theirs[mask], rtol=0, atol=1e-6)
    assert bool((ours.entropy[mask] > 0).all()) and bool((ours.entropy[~mask] == 0).all())


PROMPTS = [[10, 11, 12], [13, 14, 15, 16, 17, 18, 19], [20, 21]]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_trainer_logprobs_match_generator(make_policy, temperature):
    policy = make_policy()
    spec = InterruptionSpec(think_budget_lo=4, think_budget_hi=6, answer_budget=3, phrase_ids=(50, 51),
                            think_end_ids=(52,))
    params = SamplingParams(n=3, temperature=temperature, max_new_tokens=12, interruption=spec, seed=1)
    groups = _generate(policy, params, PROMPTS)
    batch = collate(groups, policy.pad_token_id)
    assert not bool(batch.response_mask[batch.token_mask].all()), "expected some forced (masked) tokens"
    trainer = Trainer(policy, AlgorithmConfig(), OptimConfig(micro_batch_size=4), temperature=temperature)
    assert _max_diff(trainer, groups) < 1e-5


def test_keep_sampling_mask_renormalises_over_recorded_support(make_policy):
    policy = make_policy()
    params = SamplingParams(n=3, temperature=1.0, top_k=4, max_new_tokens=8, return_support=True, seed=2)
    groups = _generate(policy, params, PROMPTS)
    assert groups[0].completions[0].support is not None
    masked = Trainer(policy, AlgorithmConfig(keep_sampling_mask=True), OptimConfig())
    full = Trainer(policy, AlgorithmConfig(keep_sampling_mask=False), OptimConfig())
    assert _max_diff(masked, groups) < 1e-5
    assert _max_diff(full, groups) > 1e-2
    m = masked.compute_gradients(groups)
    assert torch.isfinite(torch.tensor(m["loss"]))


@pytest.mark.parametrize("params", [{"top_k": 4}, {"top_p": 0.7}, {"top_k": 6, "top_p": 0.8}])
def test_keep_sampling_mask_chunked_equals_full_and_counts_cut_mismatch(make_policy, params):
    policy = make_policy()
    # Every set recorded whole (the tiny model's top-p sets reach most of its 108 tokens).
    sampling = SamplingParams(n=3, temperature=1.0, max_new_tokens=8, return_support=True, seed=2,
                              support_max_ids=128, **params)
    groups = _generate(policy, sampling, PROMPTS)
    algo = AlgorithmConfig(keep_sampling_mask=True, entropy_coef=0.01)
    results = []
    for chunk in (10**9, 3):  # the unchunked path, then chunks of 3 tokens
        trainer = Trainer(copy.deepcopy(policy), algo, OptimConfig(logit_chunk_tokens=chunk))
        assert _max_diff(trainer, groups) < 1e-5
        m = trainer.compute_gradients(groups)
        grads = {n: p.grad.clone() for n, p in trainer.policy.model.named_parameters() if p.grad is not None}
        results.append((m, grads))
        # Same weights as the sampler: its cut lands in the same place on every token.
        assert m["support_cut_mismatch_tokens"] == 0 and m["support_incomplete_tokens"] == 0
    (m_full, g_full), (m_chunk, g_chunk) = results
    assert m_chunk["loss"] == pytest.approx(m_full["loss"], rel=0, abs=1e-6)
    for name, g in g_chunk.items():
        torch.testing.assert_close(g, g_full[name], rtol=0, atol=1e-6, msg=name)

    # Other weights than the sampler's: where the cut moves it is counted, never silent.
    moved = Trainer(make_policy(seed=5), algo, OptimConfig())
    m = moved.compute_gradients(groups)
    assert m["support_cut_mismatch_tokens"] > 0


def test_lower_bound_support_recomputes_the_cut_and_counts_it(make_policy):
    """An engine that showed only the top log-probs (vLLM, top-p alone) records 'at least n' with
    the n ids it saw (here none): the trainer completes the set with top_p on its own logits and
    counts those tokens."""
    policy = make_policy()
    sampling = SamplingParams(n=2, temperature=1.0, top_p=0.7, max_new_tokens=8, return_support=True, seed=4)
    groups = _generate(policy, sampling, PROMPTS)
    exact = Trainer(policy, AlgorithmConfig(keep_sampling_mask=True), OptimConfig())
    lp_exact = exact.compute_logprobs(collate(groups, policy.pad_token_id))
    for g in groups:
        for c in g.completions:
            c.support = [-1 if s > 0 else s for s in c.support]  # "at least one"
            c.support_ids = SupportIds([0] * c.num_tokens)
    batch = collate(groups, policy.pad_token_id)
    lp = exact.compute_logprobs(batch)
    # The recomputed cut on the sampler's own weights is the sampler's cut.
    torch.testing.assert_close(lp[batch.token_mask], lp_exact[batch.token_mask], rtol=0, atol=1e-6)
    m = exact.compute_gradients(groups)
    assert m["support_incomplete_tokens"] == float(batch.response_mask.sum())
    assert m["support_cut_mismatch_tokens"] == 0
