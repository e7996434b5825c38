"""The sampler's truncation set S_old of every generated token, as token ids (keep-sampling-mask).

DeepSeek-V3.2 (arXiv 2512.02556, Sec. 3.1 "Keep Sampling Mask") keeps the set of tokens top-k/top-p
left the sampler, S_old, and renormalises pi_old and pi_theta over exactly that set. `SupportIds`
records it per token in a compressed-row layout: `counts[t]` ids of token t, laid end to end in
`ids`, both `array('i')` (4 bytes per entry), so a token costs `4 * (1 + count)` bytes whatever the
vocabulary. How many ids a token may record is bounded by `SamplingParams.support_max_ids`
(`algorithm.keep_sampling_mask_max_ids`): a set larger than that keeps its highest-scoring
`support_max_ids` ids, and `Completion.support[t]` (the set's size, or a lower bound of it) tells the
trainer the record is incomplete (`rollout.sampling.support_from_record`). A forced token
(interruption phrase, environment tokens) records no id: the token itself is its only member.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Sequence
from itertools import accumulate

import torch


class SupportIds:
    """Per-token token-id sets in compressed-row form (`counts`, `ids`: `array('i')`)."""

    __slots__ = ("counts", "ids")

    def __init__(self, counts: Iterable[int] = (), ids: Iterable[int] = ()) -> None:
        self.counts = array("i", counts)
        self.ids = array("i", ids)
        if sum(self.counts) != len(self.ids) or any(c < 0 for c in self.counts):
            raise ValueError(f"support_ids: counts sum to {sum(self.counts)}, {len(self.ids)} ids given")

    def __len__(self) -> int:
        return len(self.counts)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SupportIds) and self.counts == other.counts and self.ids == other.ids

    def __repr__(self) -> str:
        return f"SupportIds({len(self)} tokens, {len(self.ids)} ids)"

    def __getstate__(self) -> tuple[array, array]:
        return self.counts, self.ids

    def __setstate__(self, state: tuple[array, array]) -> None:
        self.counts, self.ids = state

    def append(self, token_ids: Sequence[int]) -> None:
        """One more token, drawn from `token_ids` (empty: a forced token / nothing recorded)."""
        self.counts.append(len(token_ids))
        self.ids.extend(token_ids)

    def append_empty(self, k: int) -> None:
        """`k` more tokens with no recorded id (forced tokens)."""
        self.counts.extend([0] * k)

    def extend(self, other: SupportIds) -> None:
        self.counts.extend(other.counts)
        self.ids.extend(other.ids)

    def copy(self) -> SupportIds:
        return self[0 : len(self)]

    def __getitem__(self, rows: slice) -> SupportIds:
        """Tokens `rows` (a slice with step 1)."""
        lo, hi, step = rows.indices(len(self))
        if step != 1:
            raise ValueError("support_ids: only contiguous slices")
        hi = max(lo, hi)
        start = sum(self.counts[:lo])
        stop = start + sum(self.counts[lo:hi])
        return SupportIds(self.counts[lo:hi], self.ids[start:stop])

    def token(self, t: int) -> list[int]:
        """The recorded ids of token `t`."""
        start = sum(self.counts[:t])
        return list(self.ids[start : start + self.counts[t]])

    @property
    def nbytes(self) -> int:
        """Bytes the record holds: `4 * (tokens + ids)`."""
        return self.counts.itemsize * len(self.counts) + self.ids.itemsize * len(self.ids)

    def padded(self, width: int | None = None) -> torch.Tensor:
        """`[tokens, width]` int32 ids, -1 after each token's own (width: the largest count)."""
        counts = torch.tensor(self.counts, dtype=torch.long)
        w = int(counts.max()) if width is None and len(counts) else int(width or 0)
        out = torch.full((len(counts), w), -1, dtype=torch.int32)
        if len(self.ids):
            flat = torch.tensor(self.ids, dtype=torch.int32)
            rows = torch.repeat_interleave(torch.arange(len(counts)), counts)
            starts = torch.tensor([0, *accumulate(self.counts)][:-1], dtype=torch.long)
            cols = torch.arange(len(flat)) - starts[rows]
            out[rows, cols] = flat
        return out

    def to_plain(self) -> dict[str, list[int]]:
        return {"counts": list(self.counts), "ids": list(self.ids)}

    @classmethod
    def from_plain(cls, d: dict[str, Sequence[int]]) -> SupportIds:
        return cls((int(c) for c in d["counts"]), (int(i) for i in d["ids"]))
