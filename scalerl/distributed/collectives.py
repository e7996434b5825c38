"""`StepCollectives` for FSDP2 ranks: each rank trains its own rows; sums and merges are exact.

Rank `r` of `W` takes the contiguous rows `[n r / W, n (r + 1) / W)` of the step's (kept) batch and
runs them in micro-batches of `micro_batch_size`; with `micro_batch_tokens`, the rows are spread so
that ranks hold balanced token counts, each rank's in token-budget micro-batches (`training.packing`).
Every forward and backward of a sharded model is a collective, so all ranks run the same number of
passes: a rank with fewer micro-batches than the busiest one pads its plan with empty passes that
learn nothing.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed.tensor import DTensor

from scalerl.distributed.sharding import sharded_response_forward
from scalerl.training.collectives import StepCollectives
from scalerl.training.forward import ResponseForward
from scalerl.training.packing import Lengths, MicroBatching, balance_rows

T = TypeVar("T")


def row_slice(n_rows: int, rank: int, world_size: int) -> range:
    """Rank `rank`'s rows of `n_rows`: `[floor(n r / W), floor(n (r + 1) / W))`; sizes differ by <= 1."""
    return range(n_rows * rank // world_size, n_rows * (rank + 1) // world_size)


def rank_rows(lengths: Lengths, batching: MicroBatching, rank: int, world_size: int) -> list[int]:
    """Rank `rank`'s rows: contiguous `row_slice`s when micro-batches are counted in samples;
    balanced by tokens (`training.packing.balance_rows`) when they are sized by tokens."""
    if batching.tokens is None:
        return list(row_slice(len(lengths), rank, world_size))
    return balance_rows(lengths, world_size)[rank]


def lockstep_plan(lengths: Lengths, batching: MicroBatching, rank: int, world_size: int) -> list[list[int]]:
    """Rank `rank`'s micro-batches (row indices), padded with empty passes to the busiest rank's count.

    Every rank computes every rank's plan (all know the whole batch's lengths), so the pass counts
    agree without a collective."""
    plans = []
    for r in range(world_size):
        rows = rank_rows(lengths, batching, r, world_size)
        plans.append([[rows[i] for i in mb] for mb in batching.plan([lengths[i] for i in rows])])
    passes = max(len(p) for p in plans)
    mine = plans[rank]
    return mine + [[] for _ in range(passes - len(mine))]


class RankCollectives(StepCollectives):
    """The step of one rank in the default process group (see module docstring)."""

    lockstep = True

    def __init__(self, rank: int, world_size: int, device: torch.device) -> None:
        self.rank = rank
        self.world_size = world_size
        self.device = device

    def micro_batch_plan(self, lengths: Lengths, batching: MicroBatching) -> list[list[int]]:
        return lockstep_plan(lengths, batching, self.rank, self.world_size)

    def forward(self, model: torch.nn.Module, batch: Any, **kwargs: Any) -> ResponseForward:
        return sharded_response_forward(model, batch, **kwargs)

    def sum_rows(self, tensor: Tensor) -> Tensor:
        # Exact: on every element all ranks but one contribute 0.
        summed = tensor.to(self.device, copy=True)
        dist.all_reduce(summed, op=dist.ReduceOp.SUM)
        return summed.to(tensor.device)

    def gather(self, obj: T) -> list[T]:
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def clip_grad_norm(self, params: Iterable[torch.nn.Parameter], max_norm: float) -> float:
        # On sharded (DTensor) gradients the norm is reduced over ranks: every rank gets the same
        # global norm, so a non-finite one skips the step on all of them.
        norm = torch.nn.utils.clip_grad_norm_(list(params), max_norm)
        if isinstance(norm, DTensor):
            norm = norm.full_tensor()
        return float(norm)
