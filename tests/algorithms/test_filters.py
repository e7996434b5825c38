"""Zero-variance filtering, the DAPO dynamic-sampling predicate, and the pass-rate history."""

from __future__ import annotations

import json

import pytest
import torch

from scalerl.algorithms import (
    PassRateHistory,
    ZeroVarianceCounts,
    is_informative_group,
    no_positive_resampling,
    zero_variance_filter,
    zero_variance_mask,
)


def test_zero_variance_mask_and_counts() -> None:
    rewards = torch.tensor([1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.5, 0.2, 0.2])
    groups = torch.tensor([4, 4, 4, 9, 9, 2, 2, 7, 8, 8])
    keep = zero_variance_mask(rewards, groups)
    # group 4 all correct, group 2 all wrong, group 7 a single sample, group 8 constant 0.2: dropped.
    assert keep.tolist() == [False, False, False, True, True, False, False, False, False, False]
    keep2, counts = zero_variance_filter(rewards, groups)
    assert torch.equal(keep, keep2)
    assert counts == ZeroVarianceCounts(n_groups=5, n_dropped_groups=4, n_samples=10, n_dropped_samples=8)


def test_zero_variance_on_empty_batch() -> None:
    keep, counts = zero_variance_filter(torch.zeros(0), torch.zeros(0, dtype=torch.long))
    assert keep.shape == (0,) and counts == ZeroVarianceCounts(0, 0, 0, 0)


def test_is_informative_group() -> None:
    assert is_informative_group(torch.tensor([0.0, 1.0, 1.0]))
    assert is_informative_group([0.0, 0.5])
    assert not is_informative_group([1.0, 1.0, 1.0])
    assert not is_informative_group(torch.tensor([0.0, 0.0]))
    assert not is_informative_group([1.0])
    with pytest.raises(ValueError, match=r"^rewards: contains NaN at index 1$"):
        is_informative_group([0.0, float("nan")])


def test_pass_rate_history_update_and_retire() -> None:
    history = PassRateHistory()
    rates = history.update(["a", "a", "a", "a", "b", "b", 7, 7], torch.tensor([1.0, 1, 1, 0, 0, 0, 1, 1]))
    assert rates == {"a": 0.75, "b": 0.0, 7: 1.0}
    assert history.retired() == {7}
    assert history.retired(threshold=0.75) == {"a", 7}
    # Second round for "a": 10/10 correct. Latest round 1.0; cumulative 13/14.
    history.update(["a"] * 10, [1.0] * 10)
    assert history.pass_rate("a") == 1.0
    assert history.pass_rate("a", basis="cumulative") == pytest.approx(13 / 14)
    rec = history.records["a"]
    assert (rec.attempts, rec.successes, rec.last_attempts, rec.last_successes) == (14, 13, 10, 10)
    assert history.retired(0.9) == {"a", 7}
    assert history.retired(0.95, basis="cumulative") == {7}
    assert history.is_retired(7) and not history.is_retired("b") and not history.is_retired("never-seen")
    assert len(history) == 3 and "b" in history


def test_success_threshold() -> None:
    history = PassRateHistory()
    history.update([1, 1, 1, 1], [0.2, 0.6, 0.9, 1.0], success_threshold=0.5)
    assert history.pass_rate(1) == 0.75
    history.update(torch.tensor([3, 3]), torch.tensor([-1.0, 1.0]))
    assert history.pass_rate(3) == 0.5


def test_no_positive_resampling() -> None:
    history = PassRateHistory()
    history.update(["easy"] * 10 + ["hard"] * 10, [1.0] * 9 + [0.0] + [1.0] * 2 + [0.0] * 8)
    assert no_positive_resampling(["hard", "new", "easy"], history) == ["hard", "new"]
    assert no_positive_resampling(["hard", "easy"], history, threshold=0.95) == ["hard", "easy"]


def test_state_dict_round_trips_through_json() -> None:
    history = PassRateHistory()
    history.update(["p1", "p1", 5, 5, 5], [1.0, 0.0, 1.0, 1.0, 1.0])
    history.update(["p1"], [1.0])
    state = json.loads(json.dumps(history.state_dict()))
    restored = PassRateHistory()
    restored.load_state_dict(state)
    assert restored.records == history.records
    assert set(restored.records) == {"p1", 5}  # the int id stays an int
    assert restored.retired() == history.retired() == {"p1", 5}


@pytest.mark.parametrize(
    ("state", "message"),
    [
        ({"version": 2, "records": []}, r"^state: expected \{'version': 1"),
        ({"version": 1, "records": [{"prompt_id": "a"}]}, r"^state: record 0 must have exactly the keys"),
        (
            {
                "version": 1,
                "records": [
                    {"prompt_id": 1.5, "attempts": 1, "successes": 0, "last_attempts": 1, "last_successes": 0}
                ],
            },
            r"^state: record 0 prompt_id: expected str or int prompt ids, got float$",
        ),
        (
            {
                "version": 1,
                "records": [
                    {"prompt_id": "a", "attempts": 1, "successes": 2, "last_attempts": 1, "last_successes": 0}
                ],
            },
            r"^state: record 0 has more successes than attempts$",
        ),
        (
            {
                "version": 1,
                "records": [
                    {
                        "prompt_id": "a",
                        "attempts": -1,
                        "successes": 0,
                        "last_attempts": 0,
                        "last_successes": 0,
                    }
                ],
            },
            r"^state: record 0 counts must be non-negative integers$",
        ),
    ],
)
def test_load_state_dict_rejects_bad_state(state: dict[str, object], message: str) -> None:
    history = PassRateHistory()
    history.update(["kept"], [1.0])
    with pytest.raises(ValueError, match=message):
        history.load_state_dict(state)
    assert "kept" in history  # unchanged on error


def test_update_validation() -> None:
    history = PassRateHistory()
    with pytest.raises(
        ValueError, match=r"^rewards: expected shape \[N\] = \(2,\) matching prompt_ids, got \(3,\)$"
    ):
        history.update(["a", "b"], [1.0, 0.0, 1.0])
    with pytest.raises(ValueError, match=r"^rewards: contains NaN at index 0$"):
        history.update(["a"], [float("nan")])
    with pytest.raises(ValueError, match=r"^prompt_ids: expected str or int prompt ids, got tuple$"):
        history.update([("a",)], [1.0])  # type: ignore[list-item]
    assert len(history) == 0
