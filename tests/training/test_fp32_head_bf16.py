"""`model.fp32_lm_head` under `model.dtype: bfloat16` reaches the trainer's forward and changes it.

A bf16 run (`training.policy`: float32 master weights, every pass under bf16 autocast) computes the
LM head as bf16 matmul unless `fp32_lm_head` is on (ScaleRL Sec. 3.2; MiniMax-M1 Sec. 3.2). The
references here take the decoder's hidden states under the same autocast (each sample run alone)
and project them by hand: `h.float() @ W.float().T` (the FP32 head) and `h.bf16() @ W.bf16().T`
(the bf16 head), log-softmax in float64. The trainer's log-probs (its `compute_logprobs` and the
passes of a real `Trainer.step`) must follow the one the key names, and the two heads must differ
measurably on this batch.
"""

from __future__ import annotations

import pytest
import torch

from scalerl.config import AlgorithmConfig, OptimConfig
from scalerl.training.batch import collate
from scalerl.training.trainer import Trainer

# One row per pass: no padding, so the trainer's bf16 decoder sees exactly what each reference sample
# does (under bf16, padding alone moves hidden states by about as much as the head's rounding).
ONE_ROW = OptimConfig(micro_batch_size=1)


def _reference_logprobs(policy, groups, head_dtype: torch.dtype) -> list[torch.Tensor]:
    """log pi of each response token with the head matmul in `head_dtype` (no autocast there)."""
    model = policy.model
    weight = model.get_output_embeddings().weight.detach()
    out = []
    with torch.no_grad():
        for g in groups:
            for c in g.completions:
                ids = torch.tensor([list(c.prompt_ids) + list(c.token_ids)])
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    hidden = model.get_decoder()(input_ids=ids).last_hidden_state[0]
                p = len(c.prompt_ids)
                h = hidden[p - 1 : p - 1 + c.num_tokens]
                logits = torch.nn.functional.linear(h.to(head_dtype), weight.to(head_dtype))
                lp = torch.log_softmax(logits.double(), dim=-1)
                out.append(lp[torch.arange(c.num_tokens), torch.tensor(c.token_ids)])
    return out


def _trainer_logprobs(trainer: Trainer, groups) -> list[torch.Tensor]:
    batch = collate(groups, trainer.policy.pad_token_id)
    lp = trainer.compute_logprobs(batch)
    return [lp[i, : int(n)].double() for i, n in enumerate(batch.response_lengths)]


def _gap(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max(float((x - y).abs().max()) for x, y in zip(a, b, strict=True))


@pytest.fixture
def bf16_setup(make_policy, make_groups):
    """A policy loaded from `model: {dtype: bfloat16, fp32_lm_head: <key>}` and a batch."""

    def build(fp32_lm_head: bool = True):
        policy = make_policy(seed=0, dtype="bfloat16", fp32_lm_head=fp32_lm_head)
        with torch.no_grad():  # larger logits: bf16 rounding of the head shows in the log-probs
            policy.model.get_output_embeddings().weight.mul_(8.0)
        groups = make_groups(policy, n_groups=2, n=4, noise=0.0, interrupted=False)
        return policy, groups

    return build


def test_the_two_heads_differ_measurably(bf16_setup):
    policy, groups = bf16_setup()
    assert policy.dtype == "bfloat16"
    gap = _gap(_reference_logprobs(policy, groups, torch.float32),
               _reference_logprobs(policy, groups, torch.bfloat16))
    assert gap > 5e-3, gap


@pytest.mark.parametrize("fp32_lm_head", [True, False])
def test_the_trainer_forward_follows_the_key(bf16_setup, fp32_lm_head):
    policy, groups = bf16_setup(fp32_lm_head)
    trainer = Trainer(policy, AlgorithmConfig(), ONE_ROW)
    ours = _trainer_logprobs(trainer, groups)
    fp32 = _reference_logprobs(policy, groups, torch.float32)
    bf16 = _reference_logprobs(policy, groups, torch.bfloat16)
    if fp32_lm_head:
        assert _gap(ours, fp32) < 1e-4, _gap(ours, fp32)
        assert _gap(ours, bf16) > 5e-3
    else:
        assert _gap(ours, fp32) > 5e-3, _gap(ours, fp32)
        assert _gap(ours, bf16) < 1e-4, _gap(ours, bf16)


@pytest.mark.parametrize("fp32_lm_head", [True, False])
def test_a_step_scores_with_the_configured_head(bf16_setup, fp32_lm_head):
    """One real `Trainer.step` whose behaviour log-probs are the FP32 head's: the step's measured gap
    to them (`logprob_diff_vs_gen_max`, taken in the training pass) is ~0 exactly when the key is on."""
    policy, groups = bf16_setup(fp32_lm_head)
    fp32 = iter(_reference_logprobs(policy, groups, torch.float32))
    for g in groups:
        for c in g.completions:
            c.logprobs = next(fp32).tolist()
    trainer = Trainer(policy, AlgorithmConfig(), ONE_ROW)
    metrics = trainer.step(groups)
    assert metrics["version"] == 1.0
    if fp32_lm_head:
        assert metrics["logprob_diff_vs_gen_max"] < 1e-4
    else:
        assert metrics["logprob_diff_vs_gen_max"] > 5e-3
