"""The held-out split: a fixed-seed random subset of prompts kept out of training for the whole run.

ScaleRL holds out 1,000 prompts and fits its compute-scaling curves on their pass rate, so the
subset must not drift: it depends only on the seed and the set of record ids (not on file order,
and not on the training shuffle seed), and its ids are saved so a resumed or re-analysed run can
rebuild exactly the same split.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from scalerl.data.records import PromptRecord
from scalerl.data.rejects import DataError


@dataclass(frozen=True)
class HeldOutSplit:
    """Training and held-out records (each in input order) and the seed that chose them."""

    train: list[PromptRecord]
    heldout: list[PromptRecord]
    seed: int | None

    @property
    def heldout_ids(self) -> list[str]:
        return [r.id for r in self.heldout]


def _check_unique(records: Sequence[PromptRecord]) -> None:
    seen: dict[str, str] = {}
    for r in records:
        if r.id in seen:
            raise DataError(f"id: {r.id!r} appears twice ({seen[r.id] or '?'} and {r.source or '?'})")
        seen[r.id] = r.source


def split_heldout(records: Sequence[PromptRecord], n_heldout: int, seed: int) -> HeldOutSplit:
    """Hold out `n_heldout` records chosen uniformly at random by `seed`.

    The choice is made over the sorted ids, so the same prompt set in any order gives the same split.
    """
    if n_heldout < 0:
        raise ValueError(f"n_heldout: must be >= 0, got {n_heldout}")
    if n_heldout >= len(records):
        raise DataError(  # bad input (data.heldout_size against the prompts given): exit 2
            f"n_heldout: {n_heldout} held-out prompts leave none of the {len(records)} for training"
        )
    _check_unique(records)
    ordered = sorted(r.id for r in records)
    rng = np.random.default_rng(seed)
    chosen = {ordered[i] for i in rng.choice(len(ordered), size=n_heldout, replace=False)}
    return HeldOutSplit(
        train=[r for r in records if r.id not in chosen],
        heldout=[r for r in records if r.id in chosen],
        seed=seed,
    )


def unique_subset(records: Sequence[PromptRecord], n: int, seed: int) -> list[PromptRecord]:
    """`n` of `records` (in input order), chosen uniformly at random by `seed`: the first `n` of a
    fixed permutation of the sorted ids, so the choice does not depend on file order and a smaller
    `n` takes a subset of a larger one's prompts (the data-reuse study compares nested prompt sets,
    as Tan et al. 2025 keep the difficulty mix across subset sizes). Its random stream is not the
    held-out split's, though both are seeded by `data.heldout_seed`."""
    if n < 1:
        raise ValueError(f"n: must be >= 1, got {n}")
    if n > len(records):
        raise DataError(f"data.max_train_prompts: {n} unique training prompts asked for, the prompt set "
                        f"has {len(records)} after the held-out split; set it to at most {len(records)}")
    _check_unique(records)
    ordered = sorted(r.id for r in records)
    perm = np.random.default_rng([seed, 0x7E05E]).permutation(len(ordered))
    chosen = {ordered[i] for i in perm[:n]}
    return [r for r in records if r.id in chosen]


def split_by_ids(records: Sequence[PromptRecord], heldout_ids: Iterable[str]) -> HeldOutSplit:
    """Rebuild a split from saved held-out ids; every saved id must be among `records`."""
    _check_unique(records)
    wanted = set(heldout_ids)
    known = {r.id for r in records}
    missing = sorted(wanted - known)
    if missing:
        shown = ", ".join(repr(m) for m in missing[:5])
        raise DataError(
            f"held-out ids: {len(missing)} saved id(s) are not in the prompt set (e.g. {shown}); "
            "the data changed since the split was saved"
        )
    return HeldOutSplit(
        train=[r for r in records if r.id not in wanted],
        heldout=[r for r in records if r.id in wanted],
        seed=None,
    )


def save_heldout_ids(split: HeldOutSplit, path: str | os.PathLike[str]) -> Path:
    """Write the held-out ids (and the seed) as JSON."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"seed": split.seed, "heldout_ids": split.heldout_ids}, indent=1) + "\n")
    return out


def load_heldout_ids(path: str | os.PathLike[str]) -> list[str]:
    src = Path(path)
    try:
        data = json.loads(src.read_text())
    except json.JSONDecodeError as err:
        raise DataError(f"{src}:{err.lineno}: not valid JSON ({err.msg})") from None
    ids = data.get("heldout_ids") if isinstance(data, dict) else None
    if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
        raise DataError(f"{src}: field 'heldout_ids' must be a list of strings")
    return ids
