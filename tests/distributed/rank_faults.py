"""Rank functions for the launcher tests: torch only, so the spawned ranks start quickly."""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist

from scalerl.distributed.group import ProcessGroupSpec


def sum_job(spec: ProcessGroupSpec, base: int) -> int:
    """All-reduce of (rank + base): every rank gets the same sum; returns sum * 100 + rank."""
    t = torch.tensor([spec.rank + base])
    dist.all_reduce(t)
    return int(t) * 100 + spec.rank


def failing_job(spec: ProcessGroupSpec, mode: str) -> None:
    """Rank 1 raises, exits, or hangs while rank 0 waits for it in a collective."""
    if spec.rank == 1:
        if mode == "raise":
            raise ValueError("boom on purpose")
        if mode == "exit":
            os._exit(3)
        time.sleep(600)  # "hang": never joins the barrier
    dist.barrier()
