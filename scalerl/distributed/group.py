"""The process group a sharded trainer rank joins: rendezvous, backend, device, explicit timeout.

A `torch.distributed` group's default timeout is 30 minutes, so a rank that died or a collective
that one rank skipped would hang its peers for half an hour; every group scalerl creates carries
the caller's `timeout_s` instead, which turns such a hang into an error after that long.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass
from typing import Literal

import torch
import torch.distributed as dist

Backend = Literal["gloo", "nccl"]


@dataclass(frozen=True)
class ProcessGroupSpec:
    """Where and how one rank joins its peers.

    `init_method` is a `torch.distributed` rendezvous URL (`tcp://host:port`, `file:///path`, or
    `env://` for torchrun's MASTER_ADDR/MASTER_PORT). `backend` None picks NCCL when CUDA is
    available and gloo otherwise; `device` None picks `cuda:<local_rank>` under NCCL and the CPU
    under gloo.
    """

    rank: int
    world_size: int
    init_method: str = "env://"
    timeout_s: float = 300.0
    backend: Backend | None = None
    device: str | None = None
    local_rank: int | None = None

    def __post_init__(self) -> None:
        if self.world_size < 1:
            raise ValueError(f"world_size: expected >= 1, got {self.world_size}")
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank: expected 0 <= rank < world_size={self.world_size}, got {self.rank}")
        if not self.timeout_s > 0:
            raise ValueError(f"timeout_s: expected > 0, got {self.timeout_s}")
        if self.backend not in (None, "gloo", "nccl"):
            raise ValueError(f"backend: expected 'gloo', 'nccl' or None, got {self.backend!r}")

    @classmethod
    def from_env(cls, timeout_s: float, backend: Backend | None = None) -> ProcessGroupSpec:
        """The spec of a torchrun-launched rank (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT)."""
        missing = [k for k in ("RANK", "WORLD_SIZE") if k not in os.environ]
        if missing:
            raise ValueError(f"environment: {', '.join(missing)} not set (launch with torchrun)")
        return cls(
            rank=int(os.environ["RANK"]),
            world_size=int(os.environ["WORLD_SIZE"]),
            init_method="env://",
            timeout_s=timeout_s,
            backend=backend,
            local_rank=int(os.environ.get("LOCAL_RANK", "0")),
        )

    @property
    def resolved_backend(self) -> Backend:
        if self.backend is not None:
            return self.backend
        return "nccl" if torch.cuda.is_available() else "gloo"

    @property
    def resolved_device(self) -> torch.device:
        if self.device is not None:
            return torch.device(self.device)
        if self.resolved_backend == "nccl":
            return torch.device("cuda", self.local_rank if self.local_rank is not None else 0)
        return torch.device("cpu")

    @property
    def timeout(self) -> datetime.timedelta:
        return datetime.timedelta(seconds=self.timeout_s)


def init_process_group(spec: ProcessGroupSpec) -> bool:
    """Join the default process group of `spec`; True if this call created it.

    A group that already exists (e.g. made by the caller) is used as it is after checking that its
    rank and world size are the spec's; its timeout is then the caller's.
    """
    device = spec.resolved_device
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if dist.is_initialized():
        if (dist.get_rank(), dist.get_world_size()) != (spec.rank, spec.world_size):
            raise ValueError(
                f"torch.distributed: already initialised as rank {dist.get_rank()} of "
                f"{dist.get_world_size()}, but this rank is {spec.rank} of {spec.world_size}"
            )
        return False
    dist.init_process_group(
        backend=spec.resolved_backend,
        init_method=spec.init_method,
        rank=spec.rank,
        world_size=spec.world_size,
        timeout=spec.timeout,
    )
    return True


def barrier(device: torch.device) -> None:
    """Wait for every rank (NCCL needs the device the barrier runs on)."""
    if device.type == "cuda":
        dist.barrier(device_ids=[device.index if device.index is not None else torch.cuda.current_device()])
    else:
        dist.barrier()
