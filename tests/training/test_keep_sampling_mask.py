"""Keep-sampling-mask end to end: the embedded engine records the sampler's set S_old as token ids,
and a real Trainer renormalises pi_theta over exactly that set after its weights moved (issue 37's
counter-example, DeepSeek-V3.2 Sec. 3.1), with independent closed forms written here.

The tiny policy is given exact logits at the first response position: with the prompt's hidden
state `h` (from Hugging Face's own forward), embedding row j (the head is tied) is set to
`(z_j + SHIFT) h / |h|^2`, so the logit of token j is `z_j + SHIFT`; every other row except the
prompt's is 0 (about -SHIFT relative: e^-30 of the mass, nothing top-p 0.85 reaches). Vocabulary
ids 20..25 play the example's tokens 0..5. "The update" swaps rows 21 and 22: the trainer's logits
become [3, 1, 2, 0, -5, -5].
"""

from __future__ import annotations

import copy
import math

import pytest
import torch

from scalerl.config import AlgorithmConfig, OptimConfig
from scalerl.data.records import PromptRecord
from scalerl.rollout import EmbeddedEngine, GenerationRequest, SamplingParams
from scalerl.training.batch import ScoredGroup, collate
from scalerl.training.trainer import Trainer

PROMPT = [10, 11]
BASE = 20
SAMPLER = [3.0, 2.0, 1.0, 0.0, -5.0, -5.0]
SHIFT = 30.0
CUTS = [{"top_k": 2}, {"top_p": 0.85}]


def _lse(*zs: float) -> float:
    return math.log(sum(math.exp(z) for z in zs))


def _hidden(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model.model(input_ids=torch.tensor([PROMPT])).last_hidden_state[0, -1].float()


def _policy_with_example_logits(make_policy):
    policy = make_policy()
    model = policy.model
    h = _hidden(model)
    emb = model.get_input_embeddings().weight
    with torch.no_grad():
        keep = emb[PROMPT].clone()
        emb.zero_()
        emb[PROMPT] = keep
        for i, z in enumerate(SAMPLER):
            emb[BASE + i] = ((z + SHIFT) * h / h.dot(h)).to(emb.dtype)
        logits = model(input_ids=torch.tensor([PROMPT])).logits[0, -1].float()
    assert torch.allclose(logits[BASE : BASE + 6], torch.tensor(SAMPLER) + SHIFT, atol=1e-3)
    others = torch.cat([logits[:BASE], logits[BASE + 6 :]])
    assert float(others.max()) < SHIFT - 20  # negligible mass outside the example's six tokens
    return policy, h


def _swap_21_22(policy) -> None:
    """The update: the trainer's logits become [3, 1, 2, 0, -5, -5] (+ SHIFT)."""
    emb = policy.model.get_input_embeddings().weight
    with torch.no_grad():
        emb[[BASE + 1, BASE + 2]] = emb[[BASE + 2, BASE + 1]].clone()


def _generate(policy, cut: dict, **kw) -> list:
    engine = EmbeddedEngine(copy.deepcopy(policy.model), max_batch_size=8, fp32_lm_head=True, seed=3)
    params = SamplingParams(n=24, temperature=1.0, max_new_tokens=1, return_support=True, seed=11,
                            **cut, **kw)
    return engine.generate([GenerationRequest("r", PROMPT, params)])


@pytest.mark.parametrize("cut", CUTS, ids=["top_k_2", "top_p_0.85"])
def test_embedded_engine_records_the_samplers_set_as_ids(make_policy, cut):
    policy, _ = _policy_with_example_logits(make_policy)
    completions = _generate(policy, cut)
    drawn = {c.token_ids[0] for c in completions}
    assert drawn == {BASE, BASE + 1}  # both members were drawn (seeded)
    behaviour = {BASE: 3.0 - _lse(3.0, 2.0), BASE + 1: 2.0 - _lse(3.0, 2.0)}  # pi_gen over {0, 1}
    for c in completions:
        assert c.support == [2] and c.support_cut == (cut.get("top_k", 0), cut.get("top_p", 1.0))
        assert c.support_ids is not None and c.support_ids.token(0) == [BASE, BASE + 1]
        assert c.logprobs[0] == pytest.approx(behaviour[c.token_ids[0]], abs=1e-4)
        assert c.support_ids.nbytes == 4 * (1 + 2)
    # A bound of 1 id per token: the set's size is still recorded, its top member only.
    (c, *_) = _generate(policy, cut, support_max_ids=1)
    assert c.support == [2] and c.support_ids.token(0) == [BASE]


@pytest.mark.parametrize("chunk", [None, 5], ids=["unchunked", "chunked"])
@pytest.mark.parametrize("cut", CUTS, ids=["top_k_2", "top_p_0.85"])
def test_trainer_step_renormalises_over_the_recorded_set_after_an_update(make_policy, cut, chunk):
    """Over S_old = {20, 21} on the trainer's logits [3, 1, 2, ...]: log pi(20) = 3 - log(e^3 + e^1)
    = -0.127 (the trainer's own top-2 {20, 22} would give -0.313), log pi(21) = 1 - log(e^3 + e^1).
    The gradient of a token's renormalised log-prob w.r.t. the logits, e_t - softmax_S(z), is zero
    outside S and sums to zero over S, so the step moves embedding rows 20 and 21 only (no weight
    decay; the prompt's rows aside), never row 22."""
    policy, h = _policy_with_example_logits(make_policy)
    completions = _generate(policy, cut)
    _swap_21_22(policy)
    rewards = [1.0 if c.token_ids[0] == BASE else 0.0 for c in completions]
    groups = [ScoredGroup(PromptRecord(id="r", task="toy", prompt="x"), completions, rewards)]
    trainer = Trainer(policy, AlgorithmConfig(keep_sampling_mask=True),
                      OptimConfig(weight_decay=0.0, lr=1e-2, logit_chunk_tokens=chunk))

    lp = trainer.compute_logprobs(collate(groups, policy.pad_token_id))[:, 0]
    expected = {BASE: 3.0 - _lse(3.0, 1.0), BASE + 1: 1.0 - _lse(3.0, 1.0)}
    assert round(expected[BASE], 3) == -0.127 and round(3.0 - _lse(3.0, 2.0), 3) == -0.313
    for c, got in zip(completions, lp.tolist(), strict=True):
        assert got == pytest.approx(expected[c.token_ids[0]], abs=1e-4)

    emb = policy.model.get_input_embeddings().weight
    trainer.compute_gradients(groups)
    g = emb.grad.float() @ h / h.dot(h)  # each row's gradient along h: d loss / d logit_j
    outside = [j for j in range(emb.shape[0]) if j not in (BASE, BASE + 1, *PROMPT)]
    assert float(emb.grad[outside].abs().max()) == 0.0
    assert abs(float(g[BASE])) > 1e-3 and float(g[BASE] + g[BASE + 1]) == pytest.approx(0.0, abs=1e-6)

    before = emb.detach().clone()
    metrics = trainer.step(groups)
    assert metrics["skipped_nonfinite"] == 0.0 and metrics["skipped_no_signal"] == 0.0
    moved = (emb.detach() - before).abs().amax(dim=1)
    assert float(moved[outside].max()) == 0.0 and float(moved[BASE]) > 0 and float(moved[BASE + 1]) > 0
    # Every token's recorded set {20, 21} differs from the trainer's own top-2 {20, 22}: counted.
    assert metrics["support_cut_mismatch_tokens"] == float(len(completions))
    assert metrics["support_incomplete_tokens"] == 0.0


def test_an_incomplete_record_is_completed_from_the_trainers_logits_and_counted(make_policy):
    """One id per token (`support_max_ids: 1`): S_old = {20, 21} is recorded as {20} with size 2; the
    trainer keeps 20 and fills the second place with its own best other token, 22 (logit 2 after the
    update): log pi(20) = 3 - log(e^3 + e^2), and every token is counted incomplete."""
    policy, _ = _policy_with_example_logits(make_policy)
    completions = _generate(policy, {"top_k": 2}, support_max_ids=1)
    _swap_21_22(policy)
    rewards = [1.0 if c.token_ids[0] == BASE else 0.0 for c in completions]
    groups = [ScoredGroup(PromptRecord(id="r", task="toy", prompt="x"), completions, rewards)]
    trainer = Trainer(policy, AlgorithmConfig(keep_sampling_mask=True), OptimConfig(weight_decay=0.0))
    lp = trainer.compute_logprobs(collate(groups, policy.pad_token_id))[:, 0]
    for c, got in zip(completions, lp.tolist(), strict=True):
        if c.token_ids[0] == BASE:
            assert got == pytest.approx(3.0 - _lse(3.0, 2.0), abs=1e-4)
        else:  # 21 was drawn from S_old, so it stays in the set beside the filled {20, 22}
            assert got == pytest.approx(1.0 - _lse(3.0, 2.0, 1.0), abs=1e-4)
    metrics = trainer.step(groups)
    assert metrics["support_incomplete_tokens"] == float(len(completions))
