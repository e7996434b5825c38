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
import json
import signal
import socket
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from scalerl.distributed.group import Backend, ProcessGroupSpec, init_process_group

_POLL_S = 0.1
_FAILURE_GRACE_S = 2.0


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
    out = Path(out_dir)
    spec = ProcessGroupSpec(rank, world_size, init_method, timeout_s=timeout_s, backend=backend)
    try:
        init_process_group(spec)
        result = fn(spec, *args)
        torch.save(result, out / f"rank_{rank}.pt")
        # Nobody leaves while a peer may still talk to it.
        dist.barrier()
    except BaseException:
        # Reported before the group is torn down (which is what makes the peers fail), so the
        # first rank to fail can be told from the peers it took down by the time.
        report = {"time": time.time(), "traceback": traceback.format_exc()}
        (out / f"rank_{rank}.error").write_text(json.dumps(report), encoding="utf-8")
        raise
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _exit_reason(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by {signal.Signals(-code).name}"
    return f"exited with code {code}"


def _failure(out: Path, world_size: int, codes: list[int | None], terminated: list[int]) -> RankFailedError:
    """The error for a failed run: a rank that died without a Python error (killed, crashed,
    `os._exit`) is the cause; else the rank whose exception came first."""
    reports = {}
    for r in range(world_size):
        file = out / f"rank_{r}.error"
        if file.is_file():
            reports[r] = json.loads(file.read_text(encoding="utf-8"))
    died = [r for r, c in enumerate(codes) if c not in (None, 0) and r not in terminated]
    silent = [r for r in died if r not in reports]
    if silent:
        cause = silent[0]
        message = f"rank {cause} of {world_size} {_exit_reason(int(codes[cause] or 0))}"
    else:
        cause = min(reports, key=lambda r: reports[r]["time"])
        message = f"rank {cause} of {world_size} raised:\n{reports[cause]['traceback']}"
    for r in sorted(reports):
        if r != cause:
            last = reports[r]["traceback"].strip().splitlines()[-1]
            message += f"\nthen rank {r} raised: {last}"
    if terminated:
        message += f"\nranks {terminated} were still running and have been terminated"
    return RankFailedError(message, cause)


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
        procs = ctx.processes
        start = time.monotonic()
        try:
            while True:
                codes = [p.exitcode for p in procs]
                if all(c == 0 for c in codes):
                    break
                if any(c not in (None, 0) for c in codes):
                    # Peers usually fail within moments of the first; give them that long to report.
                    grace = time.monotonic() + _FAILURE_GRACE_S
                    while any(p.is_alive() for p in procs) and time.monotonic() < grace:
                        time.sleep(_POLL_S)
                    terminated = [r for r, p in enumerate(procs) if p.is_alive()]
                    _stop(procs)
                    raise _failure(Path(out_dir), world_size, [p.exitcode for p in procs], terminated)
                if time.monotonic() - start > deadline_s:
                    running = [r for r, p in enumerate(procs) if p.is_alive()]
                    _stop(procs)
                    raise RankFailedError(
                        f"ranks {running} still running after deadline_s={deadline_s:.0f}s; terminated",
                        running[0] if running else None,
                    )
                time.sleep(_POLL_S)
        finally:
            _stop(procs)
        return [torch.load(Path(out_dir) / f"rank_{r}.pt", weights_only=False) for r in range(world_size)]


def _stop(procs: Sequence[Any]) -> None:
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        p.join(timeout=10)
        if p.is_alive():
            p.kill()
            p.join()
