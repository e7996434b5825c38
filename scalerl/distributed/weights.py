"""Moving full model weights from the trainer's rank 0 to the engines, in buckets.

A bucket is a run of parameters of one dtype whose sizes add up to at most `bucket_bytes` (a single
larger tensor gets a bucket of its own). Over the object store each bucket is one `ray.put` of its
tensors; over a collective group each bucket is flattened into one contiguous tensor and broadcast
from rank 0 of a group made of the trainer's rank 0 and every engine, then split back. The bucket
plan (`BucketMeta`: names, shapes, dtype) travels ahead of the data, so receivers allocate exactly.

The group is a standalone `ProcessGroupGloo` / `ProcessGroupNCCL` over its own `TCPStore`, not the
default process group: the trainer's rank 0 is already a member of the FSDP group, and the two must
not share a communicator. Every collective carries the group's timeout (`distributed.timeout_s`).
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class BucketMeta:
    """The tensors of one bucket, in order: (name, shape) with one dtype for all."""

    dtype: torch.dtype
    entries: tuple[tuple[str, tuple[int, ...]], ...]

    @property
    def numel(self) -> int:
        return sum(_numel(shape) for _, shape in self.entries)


def _numel(shape: Iterable[int]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def plan_buckets(state: Mapping[str, torch.Tensor], bucket_bytes: int) -> list[BucketMeta]:
    """Greedy buckets in `state` order, split by dtype and size (see module docstring)."""
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes: must be positive, got {bucket_bytes}")
    buckets: list[BucketMeta] = []
    open_: dict[torch.dtype, tuple[list[tuple[str, tuple[int, ...]]], int]] = {}
    for name, t in state.items():
        size = t.numel() * t.element_size()
        entries, used = open_.get(t.dtype, ([], 0))
        if entries and used + size > bucket_bytes:
            buckets.append(BucketMeta(t.dtype, tuple(entries)))
            entries, used = [], 0
        entries.append((name, tuple(int(d) for d in t.shape)))
        open_[t.dtype] = (entries, used + size)
    buckets.extend(BucketMeta(dtype, tuple(entries)) for dtype, (entries, _) in open_.items() if entries)
    return buckets


def bucket_state(state: Mapping[str, torch.Tensor], meta: BucketMeta) -> dict[str, torch.Tensor]:
    return {name: state[name] for name, _ in meta.entries}


def flatten_bucket(state: Mapping[str, torch.Tensor], meta: BucketMeta, device: torch.device) -> torch.Tensor:
    """The bucket's tensors as one contiguous 1-D tensor on `device`."""
    flat = torch.empty(meta.numel, dtype=meta.dtype, device=device)
    offset = 0
    for name, shape in meta.entries:
        n = _numel(shape)
        flat[offset: offset + n].copy_(state[name].reshape(-1))
        offset += n
    return flat


def unflatten_bucket(flat: torch.Tensor, meta: BucketMeta) -> dict[str, torch.Tensor]:
    """Inverse of `flatten_bucket` (views into `flat`)."""
    if flat.numel() != meta.numel:
        raise ValueError(f"bucket: got {flat.numel()} elements, the plan has {meta.numel}")
    out: dict[str, torch.Tensor] = {}
    offset = 0
    for name, shape in meta.entries:
        n = _numel(shape)
        out[name] = flat[offset: offset + n].view(shape)
        offset += n
    return out


def gathered_buckets(tensors: Mapping[str, torch.Tensor], buckets: Iterable[BucketMeta], device: torch.device,
                     keep: bool) -> Iterator[torch.Tensor | None]:
    """The buckets of a sharded model, one at a time, without ever holding the whole model.

    `tensors` maps names to the parameters and buffers as each rank holds them (FSDP2 `DTensor`
    shards, or plain tensors). For every bucket, every rank all-gathers its tensors one by one
    (`DTensor.full_tensor()`: a collective, so all ranks walk the same `buckets` in the same order);
    the rank with `keep` copies each into one flat bucket on `device` and yields it, the others
    yield None. Peak memory on the keeping rank: one bucket plus one full tensor, against the whole
    model for a full state dict (`full_state_dict`).
    """
    for meta in buckets:
        flat = torch.empty(meta.numel, dtype=meta.dtype, device=device) if keep else None
        offset = 0
        for name, shape in meta.entries:
            t = tensors[name]
            full = t.full_tensor() if hasattr(t, "full_tensor") else t
            n = _numel(shape)
            if flat is not None:
                flat[offset: offset + n].copy_(full.reshape(-1))
            offset += n
            del full
        yield flat


class WeightGroup:
    """A standalone process group between the trainer's rank 0 (group rank 0) and the engines."""

    def __init__(self, host: str, port: int, rank: int, world_size: int, backend: str, timeout_s: float,
                 device: torch.device | None = None) -> None:
        timeout = datetime.timedelta(seconds=timeout_s)
        self.rank = rank
        self.world_size = world_size
        self.backend = backend
        self.store = dist.TCPStore(host, port, world_size, rank == 0, timeout=timeout)
        if backend == "gloo":
            self.pg = dist.ProcessGroupGloo(self.store, rank, world_size, timeout)
            self.device = torch.device("cpu")
        elif backend == "nccl":
            opts = dist.ProcessGroupNCCL.Options()
            opts._timeout = timeout
            self.pg = dist.ProcessGroupNCCL(self.store, rank, world_size, opts)
            self.device = device or torch.device("cuda", torch.cuda.current_device())
        else:
            raise ValueError(f"distributed.collective_backend: unknown {backend!r} (gloo or nccl)")

    def broadcast(self, tensor: torch.Tensor) -> None:
        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        self.pg.broadcast([tensor], opts).wait()

    def receive_state(self, buckets: Iterable[BucketMeta]) -> dict[str, torch.Tensor]:
        """An engine: receive every bucket; CPU tensors (owned, not views of a shared buffer)."""
        out: dict[str, torch.Tensor] = {}
        for meta in buckets:
            flat = torch.empty(meta.numel, dtype=meta.dtype, device=self.device)
            self.broadcast(flat)
            out.update(unflatten_bucket(flat, meta))
        return out

    def close(self) -> None:
        # Dropping the references tears the communicator down; peers of a dead member see errors.
        self.pg = None  # type: ignore[assignment]
        self.store = None  # type: ignore[assignment]


def stream_to_group(tensors: Mapping[str, torch.Tensor], buckets: Sequence[BucketMeta], device: torch.device,
                    group: WeightGroup | None,
                    on_bucket: Callable[[dict[str, torch.Tensor]], None] | None = None) -> None:
    """Every trainer rank (a collective over the FSDP group): gather bucket by bucket
    (`gathered_buckets`). The sender, the rank holding `group` (rank 0, group rank 0 of the weight
    group), broadcasts each bucket as soon as it is whole and hands its tensors to `on_bucket` (the
    fingerprints); the others pass None. A broadcast that fails (an engine died) ends the
    broadcasting but not the gathering, so the other trainer ranks are never left waiting in an
    all-gather; the error is raised once every bucket has been gathered."""
    error: BaseException | None = None
    sender = group is not None
    for meta, flat in zip(buckets, gathered_buckets(tensors, buckets, device, sender), strict=True):
        if flat is None or group is None:
            continue
        if error is None:
            try:
                group.broadcast(flat)
            except Exception as err:  # re-raised once every bucket is gathered
                error = err
        if on_bucket is not None:
            on_bucket(unflatten_bucket(flat, meta))
    if error is not None:
        raise error
