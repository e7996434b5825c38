"""Run a function on N local ranks (torch.multiprocessing), for tests and single-machine use.

    results = spawn_ranks(train_fn, world_size=2, args=(cfg,), timeout_s=60)

Each rank is a fresh process (`spawn`) that joins a process group (gloo by default, over a free
local TCP port, with `timeout_s` on every collective) and calls `fn(spec, *args)` with its
`ProcessGroupSpec`; the return values come back in rank order. A rank that raises makes the call
raise `RankFailedError` naming that rank and carrying its traceback (its peers are terminated);
a run that outlives `deadline_s` is terminated and reported, naming the ranks still running.
Multi-node runs use torchrun (`ProcessGroupSpec.from_env`) or Ray instead.
"""

from __future__ import annotations

import contextlib
import socket
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from scalerl.distributed.group import Backend, ProcessGroupSpec, init_process_group


class RankFailedError(RuntimeError):
    """A spawned rank raised, died, or did not finish in time; `rank` names it (the first one)."""

    def __init__(self, message: str, rank: int | None) -> None:
        super().__init__(message)
        self.rank = rank


def free_port() -> int:
    """A TCP port free on this host right now (the OS's choice for port 0)."""
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rank_main(
    rank: int,
    fn: Callable[..., Any],
    args: Sequence[Any],
    world_size: int,
    init_method: str,
    timeout_s: float,
    backend: Backend,
    out_dir: str,
) -> None:
    spec = ProcessGroupSpec(rank, world_size, init_method, timeout_s=timeout_s, backend=backend)
    init_process_group(spec)
    try:
        result = fn(spec, *args)
        torch.save(result, Path(out_dir) / f"rank_{rank}.pt")
        # Nobody leaves while a peer may still talk to it.
        dist.barrier()
    finally:
        dist.destroy_process_group()


def spawn_ranks(
    fn: Callable[..., Any],
    world_size: int,
    *,
    args: Sequence[Any] = (),
    timeout_s: float = 120.0,
    deadline_s: float | None = None,
    backend: Backend = "gloo",
) -> list[Any]:
    """Run `fn(spec, *args)` on `world_size` new local ranks; their results in rank order.

    `fn` must be importable by name (a module-level function) and its result `torch.save`-able.
    `timeout_s` bounds every collective; `deadline_s` (default `3 * timeout_s + 60`) the whole run.
    """
    if world_size < 1:
        raise ValueError(f"world_size: expected >= 1, got {world_size}")
    deadline_s = deadline_s if deadline_s is not None else 3 * timeout_s + 60
    init_method = f"tcp://127.0.0.1:{free_port()}"
    with tempfile.TemporaryDirectory(prefix="scalerl-ranks-") as out_dir:
        ctx = mp.start_processes(
            _rank_main,
            args=(fn, tuple(args), world_size, init_method, timeout_s, backend, out_dir),
            nprocs=world_size,
            join=False,
            start_method="spawn",
        )
        start = time.monotonic()
        try:
            while not ctx.join(timeout=0.2):
                if time.monotonic() - start > deadline_s:
                    running = [r for r, p in enumerate(ctx.processes) if p.is_alive()]
                    raise RankFailedError(
                        f"ranks {running} still running after deadline_s={deadline_s:.0f}s; terminated",
                        running[0] if running else None,
                    )
        except mp.ProcessRaisedException as err:
            raise RankFailedError(f"rank {err.error_index} of {world_size} raised:\n{err.msg}",
                                  err.error_index) from None
        except mp.ProcessExitedException as err:
            raise RankFailedError(
                f"rank {err.error_index} of {world_size} exited with code {err.exit_code}"
                + (f" (signal {err.signal_name})" if err.signal_name else ""),
                err.error_index,
            ) from None
        finally:
            for p in ctx.processes:
                if p.is_alive():
                    p.terminate()
            for p in ctx.processes:
                p.join(timeout=10)
        return [torch.load(Path(out_dir) / f"rank_{r}.pt", weights_only=False) for r in range(world_size)]
