from __future__ import annotations

import random
from pathlib import Path

import pytest

from scalerl.data import (
    DataError,
    PromptRecord,
    load_heldout_ids,
    save_heldout_ids,
    split_by_ids,
    split_heldout,
)


def _records(n: int) -> list[PromptRecord]:
    return [PromptRecord(id=f"p{i}", task="math", prompt=f"q{i}", answer=str(i)) for i in range(n)]


def test_split_sizes_disjoint_and_order_kept() -> None:
    recs = _records(50)
    split = split_heldout(recs, 10, seed=3)
    assert len(split.heldout) == 10 and len(split.train) == 40
    train_ids = [r.id for r in split.train]
    assert not set(train_ids) & set(split.heldout_ids)
    assert set(train_ids) | set(split.heldout_ids) == {r.id for r in recs}
    order = {r.id: i for i, r in enumerate(recs)}
    assert train_ids == sorted(train_ids, key=order.__getitem__)


def test_split_depends_on_seed_and_ids_not_on_order() -> None:
    recs = _records(200)
    a = split_heldout(recs, 20, seed=1)
    shuffled = list(recs)
    random.Random(0).shuffle(shuffled)
    b = split_heldout(shuffled, 20, seed=1)
    assert set(a.heldout_ids) == set(b.heldout_ids)
    assert set(split_heldout(recs, 20, seed=2).heldout_ids) != set(a.heldout_ids)


def test_split_rejects_bad_sizes_and_duplicates() -> None:
    with pytest.raises(ValueError, match="leave none"):
        split_heldout(_records(5), 5, seed=0)
    with pytest.raises(ValueError, match=">= 0"):
        split_heldout(_records(5), -1, seed=0)
    dup = [*_records(3), PromptRecord(id="p1", task="math", prompt="x", answer="1", source="b.jsonl:9")]
    with pytest.raises(DataError, match=r"'p1' appears twice .*b\.jsonl:9"):
        split_heldout(dup, 1, seed=0)
    assert split_heldout(_records(3), 0, seed=0).heldout == []


def test_saved_ids_rebuild_the_same_split(tmp_path: Path) -> None:
    recs = _records(30)
    split = split_heldout(recs, 7, seed=5)
    path = save_heldout_ids(split, tmp_path / "run" / "heldout.json")
    ids = load_heldout_ids(path)
    assert ids == split.heldout_ids
    again = split_by_ids(recs, ids)
    assert again.train == split.train and again.heldout == split.heldout
    with pytest.raises(DataError, match="1 saved id"):
        split_by_ids(recs[1:], [*ids, "p0"])
    (tmp_path / "bad.json").write_text('{"heldout_ids": [1, 2]}')
    with pytest.raises(DataError, match="list of strings"):
        load_heldout_ids(tmp_path / "bad.json")
