"""Scale-out: FSDP2-sharded trainer ranks and their distributed checkpoints (torch.distributed).

The single-process code never imports this package. See docs/distributed_fsdp.md.

    from scalerl.distributed import ProcessGroupSpec, ShardedTrainerRank, spawn_ranks
"""

from scalerl.distributed.checkpoint import CheckpointRankError
from scalerl.distributed.fsdp import ShardedTrainerRank
from scalerl.distributed.group import ProcessGroupSpec
from scalerl.distributed.launch import RankFailedError, spawn_ranks

__all__ = ["CheckpointRankError", "ProcessGroupSpec", "RankFailedError", "ShardedTrainerRank", "spawn_ranks"]
