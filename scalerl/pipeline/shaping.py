"""Length reward shaping of a scored group, before it goes to the trainer.

`generation.length_control.kind` picks how over-long responses are handled. "interruption" and
"none" leave rewards alone (interruption acts in the engine). "overlong_penalty" adds DAPO's soft
overlong punishment to the correct samples (ScaleRL App. A.10); "kimi" adds Kimi k1.5's
group-relative length reward, with the report's warm-up (none for `kimi_warmup_steps` optimizer
steps, read from `version()`, the trainer's version when the group is shaped). Only the reward the
advantage is computed from changes: the verdicts (`correct`), the curriculum's pass rates and
dynamic sampling's keep/drop decision all use the verifier's reward, so shaping never makes a
solved prompt look unsolved or a flat group informative.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from scalerl.algorithms.length import apply_kimi_length_reward, apply_overlong_penalty, kimi_length_coef
from scalerl.config import GenerationConfig

SHAPING_KINDS = ("overlong_penalty", "kimi")


class LengthShaping:
    """`shape(rewards, lengths)` for one group under the configured length control."""

    def __init__(self, kind: str, *, max_new_tokens: int, cache_length: int, kimi_coef: float,
                 correct_threshold: float, kimi_warmup_steps: int = 0, kimi_ramp_steps: int = 0,
                 version: Callable[[], int] | None = None) -> None:
        self.kind = kind
        self.max_new_tokens = max_new_tokens
        self.cache_length = min(cache_length, max_new_tokens)
        self.kimi_coef = kimi_coef
        self.correct_threshold = correct_threshold
        self.kimi_warmup_steps = kimi_warmup_steps
        self.kimi_ramp_steps = kimi_ramp_steps
        if kind == "kimi" and (kimi_warmup_steps or kimi_ramp_steps) and version is None:
            raise ValueError("generation.length_control.kimi_warmup_steps: a warm-up needs version()")
        self.version = version

    @classmethod
    def from_generation(
        cls, generation: GenerationConfig, correct_threshold: float, version: Callable[[], int] | None = None
    ) -> LengthShaping:
        """The shaping `generation.length_control` asks for (`generation.max_new_tokens` bounds it)."""
        lc = generation.length_control
        return cls(
            lc.kind,
            max_new_tokens=generation.max_new_tokens,
            cache_length=lc.overlong_cache,
            kimi_coef=lc.kimi_coef,
            correct_threshold=correct_threshold,
            kimi_warmup_steps=lc.kimi_warmup_steps,
            kimi_ramp_steps=lc.kimi_ramp_steps,
            version=version,
        )

    def kimi_weight(self) -> float:
        """The length reward's weight now (Kimi k1.5's warm-up schedule over optimizer steps)."""
        step = self.version() if self.version is not None else 0
        return kimi_length_coef(step, self.kimi_coef, self.kimi_warmup_steps, self.kimi_ramp_steps)

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
                r, lens, torch.zeros_like(lens), coef=self.kimi_weight(),
                correct_threshold=self.correct_threshold,
            )
        return [float(x) for x in out]
