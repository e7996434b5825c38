from __future__ import annotations

import json
from collections import Counter

import pytest
import torch

from scalerl.data import PoolExhaustedError, PromptPool, PromptRecord


def _records(n: int) -> list[PromptRecord]:
    return [PromptRecord(id=f"p{i}", task="math", prompt=f"q{i}", answer=str(i)) for i in range(n)]


def _ids(prompts: list[PromptRecord]) -> list[str]:
    return [p.id for p in prompts]


def test_epochs_cover_every_prompt_once_in_a_fresh_shuffle() -> None:
    pool = PromptPool(_records(10), seed=0)
    first, second = _ids(pool.next_prompts(10)), _ids(pool.next_prompts(10))
    assert sorted(first) == sorted(second) == sorted(f"p{i}" for i in range(10))
    assert first != second
    assert pool.epoch == 2
    # A batch can span an epoch boundary.
    pool2 = PromptPool(_records(10), seed=0)
    assert _ids(pool2.next_prompts(7)) + _ids(pool2.next_prompts(7)) == first + second[:4]
    assert pool2.stats()["epoch_progress"] == pytest.approx(0.4)


def test_seed_determines_the_stream() -> None:
    a, b, c = (PromptPool(_records(20), seed=s) for s in (1, 1, 2))
    assert _ids(a.next_prompts(50)) == _ids(b.next_prompts(50)) != _ids(c.next_prompts(50))


def test_retired_prompts_leave_future_epochs_only() -> None:
    pool = PromptPool(_records(6), seed=0, retire_threshold=0.9)
    epoch1 = _ids(pool.next_prompts(3))
    easy = epoch1[0]
    assert pool.report(easy, [1.0, 1.0, 1.0, 1.0]) is False
    assert pool.report(epoch1[1], [1.0, 0.0, 1.0, 1.0]) is True  # pass rate 0.75: stays
    assert pool.retired == {easy}
    rest = _ids(pool.next_prompts(3))
    assert sorted(epoch1 + rest) == sorted(f"p{i}" for i in range(6))
    later = _ids(pool.next_prompts(50))
    assert easy not in later
    assert Counter(later)[epoch1[1]] == 10  # 5 active prompts, 10 epochs


def test_no_positive_resampling_off_keeps_history_but_retires_nothing() -> None:
    pool = PromptPool(_records(3), seed=0, no_positive_resampling=False)
    for p in pool.next_prompts(3):
        pool.report(p.id, [1.0, 1.0])
    assert not pool.retired and pool.pass_rate("p0") == 1.0
    assert len(pool.next_prompts(3)) == 3


def test_late_report_skips_a_prompt_already_in_the_next_epoch() -> None:
    pool = PromptPool(_records(4), seed=0)
    pool.next_prompts(4)
    upcoming = _ids(pool.next_prompts(1))  # epoch 2 is shuffled now
    order = pool.state_dict()["order"]
    pool.report(order[2], [1.0] * 4)  # an async report retires a prompt queued later in this epoch
    assert _ids(pool.next_prompts(2)) == [order[1], order[3]]
    assert pool.counters["retired_skips"] == 1
    assert upcoming == [order[0]]


def test_exhaustion_raises_and_draws_nothing() -> None:
    pool = PromptPool(_records(3), seed=0)
    for p in pool.next_prompts(2):
        pool.report(p.id, [1.0, 1.0])
    last = pool.next_prompts(1)[0]
    pool.report(last.id, [1.0, 1.0])
    before = pool.state_dict()
    with pytest.raises(PoolExhaustedError, match="all 3 training prompts are retired"):
        pool.next_prompts(1)
    assert pool.state_dict() == before
    assert pool.next_prompts(0) == []


def test_exhaustion_mid_batch_rolls_back() -> None:
    pool = PromptPool(_records(3), seed=0)
    for p in pool.next_prompts(3):
        pool.report(p.id, [1.0])
    pool2 = PromptPool(_records(3), seed=0)
    pool2.next_prompts(1)
    pool2.retired = {"p0", "p1", "p2"}
    before = pool2.state_dict()
    with pytest.raises(PoolExhaustedError):
        pool2.next_prompts(5)  # two left in this epoch are retired, then no epoch can start
    assert pool2.state_dict() == before


def test_zero_variance_and_refill_counters() -> None:
    pool = PromptPool(_records(8), seed=0, retire_threshold=1.0)
    batch = pool.next_prompts(4)
    results = [pool.report(p.id, r) for p, r in zip(batch, [[1, 1, 1], [0, 0, 0], [0, 1, 0], [0.5, 0.5, 0.5]],
                                                      strict=True)]
    assert results == [False, False, True, False]
    pool.next_prompts(3, refill=True)
    pool.report(batch[0].id, torch.tensor([0.0, 1.0]))
    s = pool.stats()
    assert s["groups_reported"] == 5 and s["informative_groups"] == 2
    assert s["zero_variance_groups"] == 3
    assert s["all_correct_groups"] == 2 and s["all_wrong_groups"] == 1  # 0.5 > threshold 0 succeeds
    assert s["zero_variance_fraction"] == pytest.approx(3 / 5)
    assert s["prompts_drawn"] == 7 and s["refill_prompts"] == 3
    assert pool.retired == {batch[0].id, batch[3].id}


def test_success_threshold_is_used() -> None:
    pool = PromptPool(_records(2), seed=0)
    pool.report("p0", [0.5, 0.5], success_threshold=0.5)
    assert pool.counters["all_wrong_groups"] == 1 and pool.pass_rate("p0") == 0.0


def test_resume_is_exact() -> None:
    def run(pool: PromptPool, steps: int) -> list[list[str]]:
        drawn = []
        for step in range(steps):
            batch = pool.next_prompts(5)
            drawn.append(_ids(batch))
            for j, p in enumerate(batch):
                # Deterministic, prompt-dependent rewards: every 4th prompt is solved and retires.
                if int(p.id[1:]) % 4 == 0:
                    pool.report(p.id, [1.0] * 4)
                else:
                    pool.report(p.id, [0.0, 1.0, 0.0, float((step + j) % 2)])
        return drawn

    original = PromptPool(_records(23), seed=7)
    run(original, 6)
    state = json.loads(json.dumps(original.state_dict()))  # the state survives a JSON checkpoint
    expected = run(original, 10)

    restored = PromptPool(_records(23), seed=999)  # the saved seed wins
    restored.load_state_dict(state)
    assert run(restored, 10) == expected
    assert restored.state_dict() == original.state_dict()
    assert original.retired and original.epoch > 2


def test_load_state_validates() -> None:
    pool = PromptPool(_records(5), seed=0)
    pool.next_prompts(2)
    state = pool.state_dict()
    with pytest.raises(ValueError, match="different set of training prompt ids"):
        PromptPool(_records(6), seed=0).load_state_dict(state)
    with pytest.raises(ValueError, match="missing key"):
        PromptPool(_records(5), seed=0).load_state_dict({k: v for k, v in state.items() if k != "order"})
    bad = dict(state, position=99)
    with pytest.raises(ValueError, match="'position' 99"):
        PromptPool(_records(5), seed=0).load_state_dict(bad)
    with pytest.raises(ValueError, match="version"):
        PromptPool(_records(5), seed=0).load_state_dict({"version": 0})


def test_construction_errors() -> None:
    with pytest.raises(ValueError, match="at least one"):
        PromptPool([], seed=0)
    with pytest.raises(ValueError, match="duplicate prompt id 'p0'"):
        PromptPool(_records(2) + _records(1), seed=0)
    with pytest.raises(ValueError, match="1 held-out prompt"):
        PromptPool(_records(3), seed=0, heldout_ids=["p2", "x"])
    with pytest.raises(ValueError, match="retire_threshold"):
        PromptPool(_records(3), seed=0, retire_threshold=0.0)
    pool = PromptPool(_records(3), seed=0)
    with pytest.raises(KeyError, match="'zz'"):
        pool.report("zz", [1.0])
    with pytest.raises(ValueError, match="empty reward group"):
        pool.report("p0", [])
    assert pool.record("p1").prompt == "q1" and "p1" in pool and len(pool) == 3
