"""Scale-out: FSDP2-sharded trainer ranks, their distributed checkpoints, and the Ray backend.

The single-process code never imports this package: only `distributed.backend: ray` reaches it
(`scalerl.assembly.build` imports `scalerl.assembly.ray` lazily), and the Ray modules
need the `distributed` extra. See docs/distributed.md and docs/distributed_fsdp.md.

    from scalerl.distributed import ProcessGroupSpec, ShardedTrainerRank, spawn_ranks

The controller process keeps the driver, the staleness controller, the prompt pool, the metrics
and the checkpoint state; what moves out sits behind the seams the local loop already has:

* `pool.EnginePool` is an `Engine`: N engine actors (`engine_actor`), groups to the least-loaded
  one, results as they finish, `version` = the minimum over live engines (so the max-lag
  admission proof of `scalerl.pipeline.staleness` holds for any N), dead engines' work re-issued.
* `trainer.RayTrainer` is a `Trainer`: `trainer_world_size` FSDP2 ranks (`fsdp.ShardedTrainerRank`)
  in Ray actors, each training its slice of every step with global denominators.
* `channel.RayWeightChannel` is a `WeightChannel`: after all ranks gathered the full weights,
  rank 0 sends them, bucketed, over the object store or a gloo/NCCL group (`weights`).
* `checkpoint` writes the ranks' DCP shards and HF export, then the driver's state last.
* `cluster` attaches to (or starts) Ray and bounds every wait with a timeout naming the peer.

Names are imported on first use, so a process that only launches ranks (`spawn_ranks`) or joins
a group does not pay for importing transformers.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "CheckpointRankError": "scalerl.distributed.checkpoint",
    "ProcessGroupSpec": "scalerl.distributed.group",
    "RankFailedError": "scalerl.distributed.launch",
    "ShardedTrainerRank": "scalerl.distributed.fsdp",
    "spawn_ranks": "scalerl.distributed.launch",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'scalerl.distributed' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
