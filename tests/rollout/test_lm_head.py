"""scalerl.models.lm_head: logits, log-probs and full-sequence log-probs."""

from __future__ import annotations

import types

import pytest
import torch

from scalerl.models.lm_head import (
    Fp32HeadWeight,
    check_head_matches_model,
    lm_head_logits,
    position_ids_from_mask,
    sequence_logprobs,
    softcap_logits,
    token_logprobs,
)


def test_fp32_head_on_bf16_model_is_float32_matmul(make_model) -> None:
    model = make_model(dtype=torch.bfloat16)
    hidden = torch.randn(3, 32, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    logits = lm_head_logits(model, hidden, fp32=True)
    assert logits.dtype == torch.float32
    expected = hidden.float() @ model.lm_head.weight.float().T
    torch.testing.assert_close(logits, expected, rtol=0, atol=1e-6)
    plain = lm_head_logits(model, hidden, fp32=False)
    assert plain.dtype == torch.bfloat16
    # The bf16 projection rounds its output: the two must differ somewhere.
    assert (plain.float() - logits).abs().max() > 0


def test_fp32_weight_cache_follows_in_place_updates(make_model) -> None:
    model = make_model(dtype=torch.bfloat16)
    cache = Fp32HeadWeight()
    hidden = torch.ones(1, 32, dtype=torch.bfloat16)
    before = lm_head_logits(model, hidden, fp32=True, weight_cache=cache)
    with torch.no_grad():
        model.lm_head.weight.mul_(2)
    after = lm_head_logits(model, hidden, fp32=True, weight_cache=cache)
    torch.testing.assert_close(after, lm_head_logits(model, hidden, fp32=True))
    assert not torch.allclose(before, after)


def test_token_logprobs_temperature_and_support() -> None:
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    ids = torch.tensor([1])
    expected = torch.log_softmax(logits / 0.5, -1)[0, 1]
    torch.testing.assert_close(token_logprobs(logits, ids, 0.5)[0], expected)
    # Temperature 0 scores under T = 1.
    torch.testing.assert_close(token_logprobs(logits, ids, 0.0)[0], torch.log_softmax(logits, -1)[0, 1])
    support = torch.tensor([[True, True, False, False]])
    renorm = torch.log_softmax(torch.tensor([2.0, 1.0]), -1)[1]
    torch.testing.assert_close(token_logprobs(logits, ids, 1.0, support)[0], renorm)
    assert token_logprobs(logits, torch.tensor([3]), 1.0, support)[0] == float("-inf")


def test_softcap() -> None:
    x = torch.tensor([-100.0, 0.0, 3.0])
    torch.testing.assert_close(softcap_logits(x, 30.0), 30.0 * torch.tanh(x / 30.0))
    assert softcap_logits(x, None) is x


def test_position_ids_from_mask() -> None:
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 0]])
    assert position_ids_from_mask(mask).tolist() == [[0, 0, 0, 1, 2], [0, 1, 2, 3, 3]]


def test_sequence_logprobs_matches_model_forward_with_padding(make_model) -> None:
    model = make_model()
    a, b = [5, 6, 7, 8, 9, 10], [11, 12, 13]
    # Left-pad the shorter sequence: its log-probs must equal those computed without padding.
    ids = torch.tensor([a, [0, 0, 0, *b]])
    mask = torch.tensor([[1] * 6, [0, 0, 0, 1, 1, 1]])
    with torch.no_grad():
        got = sequence_logprobs(model, ids, mask, fp32_lm_head=False, temperature=0.7)
        for row, seq in enumerate((a, b)):
            logits = model(torch.tensor([seq])).logits[0, :-1]
            ref = (
                torch.log_softmax(logits / 0.7, -1)
                .gather(-1, torch.tensor(seq[1:]).unsqueeze(-1))
                .squeeze(-1)
            )
            torch.testing.assert_close(got[row, -len(seq) + 1 :], ref, rtol=0, atol=1e-5)
        tail = sequence_logprobs(model, ids, mask, fp32_lm_head=False, temperature=0.7, response_start=4)
    torch.testing.assert_close(tail, got[:, 3:])


def test_sequence_logprobs_is_differentiable(make_model) -> None:
    model = make_model()
    out = sequence_logprobs(model, torch.tensor([[3, 4, 5, 6]]), fp32_lm_head=True)
    out.sum().backward()
    assert model.lm_head.weight.grad is not None


def test_check_head_rejects_a_model_that_rescales_logits(make_model) -> None:
    model = make_model()
    check_head_matches_model(model)
    original = model.forward

    def scaled_forward(self, *args, **kwargs):
        out = original(*args, **kwargs)
        out.logits = out.logits * 2.0
        return out

    model.forward = types.MethodType(scaled_forward, model)
    with pytest.raises(ValueError, match="does not reproduce"):
        check_head_matches_model(model)
