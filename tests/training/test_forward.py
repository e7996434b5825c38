"""Trainer log-probs agree with the generator's (same LM-head code), including keep-sampling-mask."""

from __future__ import annotations

import copy

import pytest
import torch

from scalerl.config import AlgorithmConfig, OptimConfig
from scalerl.data.records import PromptRecord
from scalerl.models.lm_head import sequence_logprobs
from scalerl.rollout import EmbeddedEngine, GenerationRequest, InterruptionSpec, SamplingParams
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
