"""Drawing distinct problems from levels of difficulty, deterministically from a seed.

Each level is a finite problem space (indices 0..size-1). A synthetic prompt set must not repeat a
problem: the same question under two ids would split its pass-rate history and could leak a
held-out prompt into training. Small spaces are enumerated in a seeded random order; large ones are
sampled with rejection of repeats. When a level runs out, its share goes to the levels still open.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

from scalerl.config import level_shares
from scalerl.data.rejects import DataError

# Below this size a level's whole space is shuffled once; above it, repeats are rejected on draw.
ENUMERATE_BELOW = 200_000


def level_range(difficulty: int | tuple[int, int], n_levels: int, what: str) -> list[int]:
    """The 1-based levels named by `difficulty` (one level, or an inclusive (lo, hi) range)."""
    lo, hi = (difficulty, difficulty) if isinstance(difficulty, int) else tuple(difficulty)
    if not 1 <= lo <= hi <= n_levels:
        raise DataError(f"{what} difficulty: need 1 <= lo <= hi <= {n_levels}, got {difficulty!r}")
    return list(range(lo, hi + 1))


def level_weights(levels: Sequence[int], weights: Sequence[float] | None, what: str) -> np.ndarray:
    """Each level's share of the draws (`scalerl.config.level_shares`, the rule the config checks)."""
    return np.asarray(level_shares(levels, weights, what), dtype=float)


def unique_draws(
    rng: np.random.Generator, sizes: Sequence[int], weights: np.ndarray
) -> Iterator[tuple[int, int]]:
    """Yield distinct (level position, problem index) pairs until every weighted level is used up."""
    remaining = np.asarray(sizes, dtype=np.int64).copy()
    orders: dict[int, np.ndarray] = {}
    seen: dict[int, set[int]] = {}
    while True:
        live = np.where(remaining > 0, weights, 0.0)
        if live.sum() <= 0:
            return
        pos = int(rng.choice(len(sizes), p=live / live.sum()))
        size = int(sizes[pos])
        if size <= ENUMERATE_BELOW:
            if pos not in orders:
                orders[pos] = rng.permutation(size)
            index = int(orders[pos][size - remaining[pos]])
        else:
            taken = seen.setdefault(pos, set())
            index = int(rng.integers(size))
            while index in taken:
                index = int(rng.integers(size))
            taken.add(index)
        remaining[pos] -= 1
        yield pos, index
