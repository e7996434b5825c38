from __future__ import annotations

import pytest
import torch

from scalerl.data.records import PromptRecord
from scalerl.rollout.protocol import Completion
from scalerl.rollout.support import SupportIds
from scalerl.training.batch import ScoredGroup, collate


def _c(prompt, tokens, *, mask=None, support=None, cut=None, ids=None, reason="stop",
       version=0) -> Completion:
    n = len(tokens)
    return Completion("r", 0, prompt, tokens, [-1.0 - i for i in range(n)], [version] * n,
                      mask or [True] * n, reason, version, support=support, support_cut=cut, support_ids=ids)


def test_recorded_support_ids_are_laid_out_per_token_and_trimmed_by_select():
    rec = PromptRecord(id="a", task="t", prompt="x")
    long = _c([1], [2, 3, 4], support=[2, 0, 3], cut=(3, 1.0), ids=SupportIds([2, 0, 3], [2, 9, 4, 7, 8]))
    short = _c([1], [5, 6], support=[1, 1], cut=(3, 1.0), ids=SupportIds([1, 1], [5, 6]))
    none = _c([1, 1], [7])
    b = collate([ScoredGroup(rec, [long, short, none], [1.0, 0.0, 0.5])], 0)
    assert b.support_ids.dtype == torch.int32 and b.support_ids.shape == (3, 3, 3)
    assert b.support_ids[0].tolist() == [[2, 9, -1], [-1, -1, -1], [4, 7, 8]]
    assert b.support_ids[1].tolist() == [[5, -1, -1], [6, -1, -1], [-1, -1, -1]]
    assert bool((b.support_ids[2] == -1).all())
    sub = b.select([1, 2])  # response width 2, at most one id per token
    assert sub.support_ids.tolist() == [[[5], [6]], [[-1], [-1]]]
    assert sub.support_size.tolist() == [[1, 1], [-1, -1]]
    with pytest.raises(ValueError, match="support_ids"):
        _c([1], [2], support=[1], cut=(1, 1.0), ids=SupportIds([1, 1], [2, 3]))
    with pytest.raises(ValueError, match="support_ids"):
        _c([1], [2], ids=SupportIds([1], [2]))


def test_layout_left_pads_prompts_right_pads_responses():
    rec = PromptRecord(id="a", task="t", prompt="x")
    interrupted = _c([5, 6, 7], [10, 11, 12, 13], mask=[True, False, False, True])
    g1 = ScoredGroup(rec, [_c([5, 6, 7], [8, 9]), interrupted], [1.0, 0.0])
    g2 = ScoredGroup(PromptRecord(id="b", task="t", prompt="y"), [_c([20], [21], reason="length")], [0.5],
                     correct=[True])
    b = collate([g1, g2], pad_token_id=0)
    assert b.prompt_width == 3 and b.response_width == 4
    assert b.input_ids.tolist() == [[5, 6, 7, 8, 9, 0, 0], [5, 6, 7, 10, 11, 12, 13], [0, 0, 20, 21, 0, 0, 0]]
    assert b.position_ids[2].tolist()[2:4] == [0, 1]  # left padding does not shift positions
    assert b.response_mask.tolist()[1] == [True, False, False, True]
    assert b.token_mask.tolist()[1] == [True, True, True, True]
    assert b.group_ids.tolist() == [0, 0, 1] and b.correct.tolist() == [True, False, True]
    assert b.behavior_logprobs[0].tolist() == [-1.0, -2.0, 0.0, 0.0]
    assert b.versions[2].tolist() == [0, -1, -1, -1]
    sub = b.select([2])
    assert sub.input_ids.tolist() == [[20, 21]] and sub.prompt_width == 1 and sub.finish_reasons == ["length"]
    assert b.num_tokens == 5 + 7 + 2


def test_support_records_and_validation():
    rec = PromptRecord(id="a", task="t", prompt="x")
    g = ScoredGroup(rec, [_c([1], [2, 3, 4], support=[2, 0, -64], cut=(0, 0.9)), _c([1], [5])], [1.0, 0.0])
    b = collate([g], 0)
    assert b.support_size.tolist() == [[2, 0, -64], [-1, -1, -1]]  # -1: nothing recorded
    assert b.support_top_k.tolist() == [0, 0] and b.support_top_p.tolist() == pytest.approx([0.9, 1.0])
    sub = b.select([1, 0])
    assert sub.support_size.tolist() == [[-1, -1, -1], [2, 0, -64]]
    assert sub.support_top_p.tolist() == pytest.approx([1.0, 0.9])
    assert collate([ScoredGroup(rec, [_c([1], [5])], [1.0])], 0).support_size is None
    assert b.support_ids is not None and b.support_ids.shape == (2, 3, 0)  # no ids recorded anywhere
    with pytest.raises(ValueError, match="support_cut"):
        _c([1], [2], support=[1])
    with pytest.raises(ValueError, match="rewards"):
        ScoredGroup(rec, [_c([1], [2])], [1.0, 0.0])
    with pytest.raises(ValueError, match="old_logprobs"):
        ScoredGroup(rec, [_c([1], [2])], [1.0], old_logprobs=[[0.0, 1.0]])
    assert torch.equal(collate([g], 0).rewards, torch.tensor([1.0, 0.0]))
