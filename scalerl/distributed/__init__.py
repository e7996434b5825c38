"""Scale-out: FSDP2-sharded trainer ranks and their distributed checkpoints (torch.distributed).

The single-process code never imports this package. See docs/distributed_fsdp.md.

    from scalerl.distributed import ProcessGroupSpec, ShardedTrainerRank, spawn_ranks

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
