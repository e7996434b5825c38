"""Length reward shaping of a scored group, before it goes to the trainer.

`generation.length_control.kind` picks how over-long responses are handled. "interruption" and
"none" leave rewards alone (interruption acts in the engine). "overlong_penalty" adds DAPO's soft
overlong punishment to the correct samples (ScaleRL App. A.10); "kimi" adds Kimi k1.5's
group-relative length reward. Only the reward the advantage is computed from changes: the verdicts
(`correct`), the curriculum's pass rates and dynamic sampling's keep/drop decision all use the
verifier's reward, so shaping never makes a solved prompt look unsolved or a flat group informative.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from scalerl.algorithms.length import apply_kimi_length_reward, apply_overlong_penalty
from scalerl.config import RunConfig

SHAPING_KINDS = ("overlong_penalty", "kimi")


class LengthShaping:
    """`shape(rewards, lengths)` for one group under the configured length control."""

    def __init__(self, kind: str, *, max_new_tokens: int, cache_length: int, kimi_coef: float,
                 correct_threshold: float) -> None:
        self.kind = kind
        self.max_new_tokens = max_new_tokens
        self.cache_length = min(cache_length, max_new_tokens)
        self.kimi_coef = kimi_coef
        self.correct_threshold = correct_threshold

    @classmethod
    def from_config(cls, config: RunConfig, correct_threshold: float) -> LengthShaping:
        lc = config.generation.length_control
        return cls(
            lc.kind,
            max_new_tokens=config.generation.max_new_tokens,
            cache_length=lc.overlong_cache,
            kimi_coef=lc.kimi_coef,
            correct_threshold=correct_threshold,
        )

    @property
    def active(self) -> bool:
        return self.kind in SHAPING_KINDS

    def shape(self, rewards: Sequence[float], lengths: Sequence[int]) -> list[float]:
        if not self.active:
            return list(rewards)
        r = torch.tensor(list(rewards), dtype=torch.float64)
        lens = torch.tensor(list(lengths), dtype=torch.long)
        if self.kind == "overlong_penalty":
            out = apply_overlong_penalty(
                r, lens, self.max_new_tokens, self.cache_length, correct_threshold=self.correct_threshold
            )
        else:
            out = apply_kimi_length_reward(
                r, lens, torch.zeros_like(lens), coef=self.kimi_coef, correct_threshold=self.correct_threshold
            )
        return [float(x) for x in out]
