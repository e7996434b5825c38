"""How many CPU threads torch uses for a run: decided here, from the model, not by the environment.

Two reasons to choose in code rather than inherit `OMP_NUM_THREADS` or torch's default (one thread
per core):

* Speed. The embedded default's matrices are 128 wide: splitting them over threads saves little,
  and when another job holds a core (shared machines, laptops) OpenMP threads spin-wait for the
  busy core. Measured on the shared 2-core machine with another job running: 10 SFT steps of the
  tiny model took 7 s on 1 thread and 32 s on torch's default 2.
* Reproducibility. Float reductions split over threads add in a different order, so the same seed
  on 1 and 2 threads differs in the last bits from the first optimizer step (loss
  -0.04320498 vs -0.04320497), and RL amplifies that into a different run within ~100 steps. A
  thread count that does not depend on the machine makes "a seed reproduces the run" hold.

Rule: a model narrower than `SMALL_HIDDEN` (the tiny default, any toy) runs on one thread; a
larger model on the CPU uses every core this process may run on (its result then depends on that
count, which is stated in the run's log). On a GPU the CPU thread count is left alone.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

#: Hidden sizes below this run on a single thread (see the module docstring).
SMALL_HIDDEN = 1024
_WIDTH_KEYS = ("hidden_size", "n_embd", "d_model")


def available_cpus() -> int:
    """CPUs this process may run on (its affinity mask, not the machine's core count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def cpu_threads(hidden_size: int | None) -> int:
    """Intra-op threads for a model of width `hidden_size` on the CPU (None: width unknown)."""
    if hidden_size is not None and hidden_size < SMALL_HIDDEN:
        return 1
    return available_cpus()


def model_width(model_cfg: Any) -> int | None:
    """Hidden size of the model a `ModelConfig` names: the tiny config, or a local `config.json`."""
    if model_cfg.name_or_path is None:
        return int(model_cfg.tiny.hidden_size)
    config = Path(model_cfg.name_or_path) / "config.json"
    if not config.is_file():
        return None
    try:
        data = json.loads(config.read_text())
    except (OSError, ValueError):
        return None
    data = data.get("text_config", data) if isinstance(data, dict) else {}
    for key in _WIDTH_KEYS:
        if isinstance(data.get(key), int):
            return int(data[key])
    return None


def _on_gpu(device: str | None) -> bool:
    if device is not None:
        return str(device).startswith("cuda")
    import torch

    return bool(torch.cuda.is_available())


@contextlib.contextmanager
def torch_threads(n: int | None) -> Iterator[int | None]:
    """Run the block with `torch.set_num_threads(n)` (None: unchanged); the old count is restored."""
    if n is None:
        yield None
        return
    import torch

    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield n
    finally:
        torch.set_num_threads(old)


def same_threads_as_caller() -> Callable[[], None]:
    """A function that gives the calling OS thread's torch intra-op thread count to another thread.

    The count is per OS thread (OpenMP's `nthreads-var` is a per-thread setting): a thread started
    later begins at the process default (`OMP_NUM_THREADS` or one per core), not at what
    `run_threads` chose. A background generator or engine thread calls the returned function first,
    so every thread of a run computes with one count. That is also what vLLM's CPU attention
    requires: it checks that a step runs on as many threads as its metadata was built for.
    """
    import torch

    n = torch.get_num_threads()
    return lambda: torch.set_num_threads(n)


def run_threads(model_cfg: Any, device: str | None = None) -> contextlib.AbstractContextManager[int | None]:
    """`torch_threads` with the count for this model and device (unchanged on a GPU)."""
    return torch_threads(None if _on_gpu(device) else cpu_threads(model_width(model_cfg)))


__all__ = [
    "SMALL_HIDDEN",
    "available_cpus",
    "cpu_threads",
    "model_width",
    "run_threads",
    "same_threads_as_caller",
    "torch_threads",
]
