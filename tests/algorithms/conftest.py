"""Shared batch builder for the objective-library tests."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import pytest
import torch
from torch import Tensor

# Response lengths: uneven, one empty row; groups: uneven sizes, non-contiguous ids, one singleton.
LENGTHS = (7, 3, 5, 0, 6, 2, 4, 7)
GROUP_IDS = (10, 10, 10, 3, 3, 7, 7, 42)
MAX_TOKENS = 9


@dataclass(frozen=True)
class Batch:
    logprobs: Tensor
    old_logprobs: Tensor
    behavior_logprobs: Tensor
    advantages: Tensor
    mask: Tensor
    group_ids: Tensor

    def leaf(self) -> Batch:
        """A copy whose `logprobs` is a fresh leaf requiring grad."""
        return replace(self, logprobs=self.logprobs.detach().clone().requires_grad_(True))

    def to(self, dtype: torch.dtype) -> Batch:
        return Batch(
            logprobs=self.logprobs.detach().to(dtype),
            old_logprobs=self.old_logprobs.to(dtype),
            behavior_logprobs=self.behavior_logprobs.to(dtype),
            advantages=self.advantages.to(dtype),
            mask=self.mask,
            group_ids=self.group_ids,
        )


def build_batch(seed: int = 0, dtype: torch.dtype = torch.float64, width: int = 7) -> Batch:
    gen = torch.Generator().manual_seed(seed)
    n = len(LENGTHS)
    lengths = torch.tensor(LENGTHS)
    mask = torch.arange(width)[None, :] < lengths[:, None]
    logprobs = -2.0 * torch.rand(n, width, generator=gen, dtype=torch.float64)
    old = logprobs + 0.4 * torch.randn(n, width, generator=gen, dtype=torch.float64)
    behavior = old + 0.4 * torch.randn(n, width, generator=gen, dtype=torch.float64)
    advantages = torch.randn(n, generator=gen, dtype=torch.float64)
    return Batch(
        logprobs=logprobs.to(dtype),
        old_logprobs=old.to(dtype),
        behavior_logprobs=behavior.to(dtype),
        advantages=advantages.to(dtype),
        mask=mask,
        group_ids=torch.tensor(GROUP_IDS),
    )


@pytest.fixture
def make_batch() -> Callable[..., Batch]:
    return build_batch
