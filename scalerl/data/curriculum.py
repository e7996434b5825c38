"""Kimi k1.5's prompt sampling strategies: easy-to-hard curriculum and prioritized resampling.

Kimi Team 2025 (arXiv 2501.12599, §2.3.4 "Sampling Strategies"):

- *Curriculum sampling*: "start by training on easier tasks and gradually progress to more
  challenging ones". Prompts are ranked by a difficulty value carried by each record
  (`metadata[difficulty_key]`: a grade label, or a model-measured pass rate with
  `harder="lower"`); after `d` draws the easiest `frontier(d)` share of the prompts is open to
  training, growing linearly from `start_fraction` to all of them over `ramp_prompts` draws.
- *Prioritized sampling*: "track the success rates s_i for each problem i and sample problems
  proportional to 1 - s_i, so that problems with lower success rates receive higher sampling
  probabilities". A prompt never drawn has no success yet (`s = 0`).

The functions here are pure (numpy); `scalerl.data.pool.PromptPool` draws with them when a
`CurriculumConfig` (the `algorithm.curriculum` section) asks for either strategy.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from scalerl.config import CurriculumConfig
from scalerl.data.records import PromptRecord


def weighted(spec: CurriculumConfig) -> bool:
    """Whether draws follow weights (either strategy) rather than epoch shuffles."""
    return spec.order != "shuffle" or spec.priority != "uniform"


def metadata_value(metadata: dict, key: str) -> object:
    """`metadata[key]`, or, when `key` is absent and has dots, the nested value it names
    (`"model_difficulty.pass_rate"`: the pass rate `scalerl data difficulty` writes); None if missing."""
    if key in metadata or "." not in key:
        return metadata.get(key)
    value: object = metadata
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def difficulty_ranks(records: Sequence[PromptRecord], key: str, harder: str, seed: int) -> dict[str, int]:
    """Each prompt's rank from easiest (0) to hardest; ties are broken by a seeded permutation.

    `key` names `metadata[key]`, or a nested value by a dotted path (`metadata_value`). Raises
    `ValueError` naming the record (and its source) whose value is missing or not a finite number.
    """
    values = []
    for r in records:
        v = metadata_value(r.metadata, key)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            where = f" ({r.source})" if r.source else ""
            raise ValueError(
                f"algorithm.curriculum.difficulty_key: prompt {r.id!r}{where} has no numeric "
                f"metadata[{key!r}] (got {v!r}); easy_to_hard needs a difficulty on every training prompt"
            )
        values.append(float(v) if harder == "higher" else -float(v))
    tiebreak = np.random.default_rng([seed, 0x6375]).permutation(len(records))
    order = sorted(range(len(records)), key=lambda i: (values[i], int(tiebreak[i])))
    return {records[i].id: rank for rank, i in enumerate(order)}


def curriculum_frontier(draws: int, ramp_prompts: int, start_fraction: float) -> float:
    """Share of the prompts (easiest first) open after `draws` draws:
    `start + (1 - start) * min(1, draws / ramp_prompts)`."""
    if draws < 0:
        raise ValueError(f"draws: expected >= 0, got {draws}")
    return start_fraction + (1.0 - start_fraction) * min(1.0, draws / ramp_prompts)


def failure_rate_weights(success_rates: Sequence[float]) -> np.ndarray:
    """Kimi's prioritized-sampling weights `1 - s_i` (clipped to [0, 1])."""
    s = np.asarray(success_rates, dtype=np.float64)
    if s.ndim != 1 or not np.all(np.isfinite(s)):
        raise ValueError("success_rates: expected a 1-D sequence of finite numbers")
    return np.clip(1.0 - s, 0.0, 1.0)


def draw_weighted(rng: np.random.Generator, weights: np.ndarray, k: int) -> tuple[list[int], bool]:
    """`k` indices drawn with probability proportional to `weights`, without replacement while
    enough indices have weight; returns (indices, fell_back) where `fell_back` says every weight
    was 0 and the draw was uniform instead."""
    w = np.asarray(weights, dtype=np.float64)
    if w.ndim != 1 or w.size == 0 or np.any(w < 0) or not np.all(np.isfinite(w)):
        raise ValueError("weights: expected a non-empty 1-D array of finite non-negative numbers")
    fell_back = not w.sum() > 0
    if fell_back:
        w = np.ones_like(w)
    replace = int(np.count_nonzero(w)) < k
    picked = rng.choice(w.size, size=k, replace=replace, p=w / w.sum())
    return [int(i) for i in picked], fell_back
