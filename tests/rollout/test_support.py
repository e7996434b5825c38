"""scalerl.rollout.support: the recorded sampling sets, their layout and their memory per token."""

from __future__ import annotations

import copy
import pickle

import pytest
import torch

from scalerl.data.records import PromptRecord
from scalerl.pipeline.snapshot import completion_from_plain, completion_to_plain
from scalerl.rollout.embedded import EmbeddedEngine
from scalerl.rollout.protocol import Completion, GenerationRequest, SamplingParams
from scalerl.rollout.sampling import sample_next_tokens, support_from_record
from scalerl.rollout.support import SupportIds
from scalerl.training.batch import ScoredGroup, collate

VOCAB = 151_936  # Qwen2.5 / Qwen3


def test_support_ids_layout_slices_and_round_trips() -> None:
    s = SupportIds()
    s.append([4, 9])
    s.append_empty(2)
    s.append([151_935])
    assert len(s) == 4 and list(s.counts) == [2, 0, 0, 1] and list(s.ids) == [4, 9, 151_935]
    assert s.token(0) == [4, 9] and s.token(1) == [] and s.token(3) == [151_935]
    assert s[1:4] == SupportIds([0, 0, 1], [151_935]) and s[0:1] == SupportIds([2], [4, 9])
    assert s.padded().tolist() == [[4, 9], [-1, -1], [-1, -1], [151_935, -1]]
    assert s.padded(3).shape == (4, 3) and s.padded().dtype == torch.int32
    assert s.nbytes == 4 * (4 + 3)
    assert pickle.loads(pickle.dumps(s)) == s and SupportIds.from_plain(s.to_plain()) == s
    t = s.copy()
    t.extend(SupportIds([1], [7]))
    assert len(t) == 5 and len(s) == 4 and t.token(4) == [7]
    with pytest.raises(ValueError, match="counts"):
        SupportIds([2], [1])
    with pytest.raises(ValueError, match="contiguous"):
        s[::2]


def test_a_checkpointed_completion_keeps_its_recorded_sets() -> None:
    """The pipeline snapshot (read with `torch.load(weights_only=True)`) stores the ids as lists."""
    c = Completion("r", 0, [1], [5, 6], [-0.1, 0.0], [0, 0], [True, False], "stop", 0,
                   support=[2, 0], support_cut=(2, 1.0), support_ids=SupportIds([2, 0], [5, 8]))
    plain = completion_to_plain(c)
    assert plain["support_ids"] == {"counts": [2, 0], "ids": [5, 8]}
    assert completion_from_plain(plain) == c


def test_memory_per_token_at_vocabulary_151936_with_top_p_095() -> None:
    """deepseek_v32's sampler (top-p 0.95, top-k 0) at vocabulary 151,936 with the default bound of
    64 ids per token. Rows range from peaked (a few tokens reach 0.95) to flat (most of the
    vocabulary does). The record costs 4 bytes per token plus 4 per id: at most 4 * (1 + 64) = 260
    bytes per token (`SupportIds.nbytes`), the batch's `[N, T, S]` int32 ids plus the int64 size
    at most 4 * 64 + 8 = 264; a dense bool mask over the vocabulary would be 151,936. Sets larger
    than 64 keep their 64 highest-scoring ids and are the ones the trainer counts incomplete."""
    cap = SamplingParams().support_max_ids
    assert cap == 64
    rows = 12
    g = torch.Generator().manual_seed(0)
    scale = torch.linspace(0.5, 12.0, rows).unsqueeze(1)  # flat ... peaked
    logits = torch.randn(rows, VOCAB, generator=g) * scale
    top_k, top_p = torch.zeros(rows, dtype=torch.long), torch.full((rows,), 0.95)
    gens = [torch.Generator().manual_seed(i) for i in range(rows)]
    out = sample_next_tokens(logits, torch.ones(rows), top_k, top_p, gens,
                             record_ids=torch.full((rows,), cap))
    sizes = out.support_size.tolist()
    assert min(sizes) <= cap < max(sizes)  # both kinds of token occur
    record = SupportIds()
    flat, start = out.support_ids.tolist(), 0
    for c in out.support_counts.tolist():
        record.append(flat[start : start + c])
        start += c
    assert list(record.counts) == [min(s, cap) for s in sizes]
    assert record.nbytes == 4 * (rows + sum(min(s, cap) for s in sizes))
    assert record.nbytes / rows <= 4 * (1 + cap) == 260

    completion = Completion("r", 0, [1], out.token_ids.tolist(), out.logprobs.tolist(), [0] * rows,
                            [True] * rows, "length", 0, support=sizes, support_cut=(0, 0.95),
                            support_ids=record)
    batch = collate([ScoredGroup(PromptRecord(id="r", task="t", prompt="x"), [completion], [1.0])], 0)
    per_token = (batch.support_ids.element_size() * batch.support_ids.shape[-1]
                 + batch.support_size.element_size())
    assert batch.support_ids.shape == (1, rows, cap) and per_token == 4 * cap + 8 == 264
    assert VOCAB / per_token > 575  # against a dense [T, V] bool mask

    # On the sampler's own logits the trainer's mask is the sampler's set, the large sets completed
    # from these logits and counted.
    mask, _, mismatch, incomplete = support_from_record(logits, out.token_ids, out.support_size,
                                                        batch.support_ids[0], top_k, top_p)
    assert torch.equal(mask, out.support)
    assert incomplete.tolist() == [s > cap for s in sizes] and not bool(mismatch.any())


def test_recorded_sets_survive_an_engine_snapshot(make_model, tmp_path) -> None:
    """An embedded-engine snapshot mid-generation (read back with `weights_only=True`) resumes the
    recorded ids exactly: the completions equal an uninterrupted run's, `support_ids` included."""
    model = make_model()
    params = SamplingParams(n=3, max_new_tokens=8, seed=4, top_k=4, return_support=True)
    requests = [GenerationRequest("a", [20, 21, 22], params), GenerationRequest("b", [30, 31], params)]

    def engine() -> EmbeddedEngine:
        return EmbeddedEngine(copy.deepcopy(model), max_batch_size=3, fp32_lm_head=True, seed=1)

    straight = engine().generate(requests)
    first = engine()
    first.submit(requests)
    done = []
    for _ in range(3):
        done += first.step()
    torch.save(first.snapshot(), tmp_path / "engine.pt")
    second = engine()
    second.restore(torch.load(tmp_path / "engine.pt", weights_only=True))
    while second.num_unfinished():
        done += second.step()
    key = lambda c: (c.request_id, c.sample_index)  # noqa: E731
    for a, b in zip(sorted(straight, key=key), sorted(done, key=key), strict=True):
        assert a.support_ids is not None and len(a.support_ids) == a.num_tokens
        assert all(len(a.support_ids.token(t)) == 4 for t in range(a.num_tokens))
        assert a == b
