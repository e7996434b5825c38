"""Study runs (`scalerl ablate --ray`) as Ray tasks: variants train concurrently on a cluster.

`RayRuns.train` has the signature of `scalerl.studies.runs.execute_runs`'s `train_fn`: it runs
`scalerl.assembly.run.train_run` (what `scalerl train` runs) for one run inside a Ray task
holding `num_cpus` / `num_gpus`, and blocks until it ends, so `execute_runs(parallel=N)` keeps N
of them in flight while Ray's scheduler queues what does not fit. Each run writes to its own run
directory, which must be on a filesystem the cluster's nodes share (on one machine, any
directory). A run whose config says `distributed.backend: ray` starts its own actors from inside
its task, on the same cluster.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from scalerl.config import DistributedConfig, RunConfig
from scalerl.distributed.cluster import connect


def _train_task(config: dict[str, Any], run_dir: str, resume: str | None, device: str | None) -> int:
    from scalerl.assembly.run import stderr_say, train_run

    # A run with `distributed.backend: ray` finds this worker connected already, so its actors
    # join the same cluster.
    cfg = RunConfig.model_validate(config)
    # the worker's stderr reaches the driver's console (Ray forwards it), as `scalerl train`'s lines do
    return train_run(cfg, Path(run_dir), resume=None if resume is None else Path(resume), device=device,
                     say=stderr_say)


class RayRuns:
    """Connects to Ray (`address` None: a local instance) and runs study runs as tasks."""

    def __init__(self, address: str | None, *, num_cpus: float = 1.0, num_gpus: float = 0.0) -> None:
        self.ray, self._started = connect(DistributedConfig(backend="ray", address=address))
        self._task = self.ray.remote(_train_task).options(num_cpus=num_cpus, num_gpus=num_gpus,
                                                          max_retries=0)

    def train(self, cfg: RunConfig, run_dir: Path, *, resume: Path | None = None,
              device: str | None = None) -> int:
        ref = self._task.remote(cfg.model_dump(mode="json"), str(run_dir),
                                None if resume is None else str(resume), device)
        return int(self.ray.get(ref))

    def close(self) -> None:
        if self._started:
            self.ray.shutdown()

    def __enter__(self) -> RayRuns:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
