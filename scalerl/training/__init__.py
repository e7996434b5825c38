"""The trainer side: the policy, one exact optimizer step on scored groups, checkpoints, and SFT.

    policy = load_policy(cfg.model)
    trainer = Trainer.from_settings(TrainerSettings(cfg.algorithm, cfg.optim), policy, meter=meter)
    metrics = trainer.step(groups)              # groups: list[ScoredGroup]
    engine.update_weights(trainer.weights_for_engine(), trainer.version)
    trainer.save(run_dir, step, extra={...});   trainer.load(latest_checkpoint(run_dir))

See docs/training.md.
"""

from typing import TYPE_CHECKING

from scalerl._lazy import lazy_exports

# Imported on first use (scalerl/_lazy.py): the command line (`scalerl.cli`) imports this package
# without paying for torch.
_EXPORTS = {
    "CheckpointState": "scalerl.training.checkpoint",
    "Policy": "scalerl.training.policy",
    "SFTConfig": "scalerl.training.sft_config",
    "ScoredGroup": "scalerl.training.batch",
    "TrainBatch": "scalerl.training.batch",
    "Trainer": "scalerl.training.trainer",
    "TrainerSettings": "scalerl.training.trainer",
    "TrainingDivergedError": "scalerl.training.trainer",
    "collate": "scalerl.training.batch",
    "latest_checkpoint": "scalerl.training.checkpoint",
    "list_checkpoints": "scalerl.training.checkpoint",
    "load_checkpoint": "scalerl.training.checkpoint",
    "load_policy": "scalerl.training.policy",
    "save_checkpoint": "scalerl.training.checkpoint",
    "train_sft": "scalerl.training.sft",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

if TYPE_CHECKING:
    from scalerl.training.batch import ScoredGroup, TrainBatch, collate
    from scalerl.training.checkpoint import (
        CheckpointState,
        latest_checkpoint,
        list_checkpoints,
        load_checkpoint,
        save_checkpoint,
    )
    from scalerl.training.policy import Policy, load_policy
    from scalerl.training.sft import train_sft
    from scalerl.training.sft_config import SFTConfig
    from scalerl.training.trainer import Trainer, TrainerSettings, TrainingDivergedError

__all__ = [
    "CheckpointState",
    "Policy",
    "SFTConfig",
    "ScoredGroup",
    "TrainBatch",
    "Trainer",
    "TrainerSettings",
    "TrainingDivergedError",
    "collate",
    "latest_checkpoint",
    "list_checkpoints",
    "load_checkpoint",
    "load_policy",
    "save_checkpoint",
    "train_sft",
]
