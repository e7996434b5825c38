"""The trainer side: the policy, one exact optimizer step on scored groups, checkpoints, and SFT.

    policy = load_policy(cfg.model)
    trainer = Trainer.from_config(cfg, policy, meter=meter)
    metrics = trainer.step(groups)              # groups: list[ScoredGroup]
    engine.update_weights(trainer.weights_for_engine(), trainer.version)
    trainer.save(run_dir, step, extra={...});   trainer.load(latest_checkpoint(run_dir))

See docs/training.md.
"""

from scalerl.training.batch import ScoredGroup, TrainBatch, collate
from scalerl.training.checkpoint import (
    CheckpointState,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    save_checkpoint,
)
from scalerl.training.policy import Policy, load_policy
from scalerl.training.sft import SFTConfig, train_sft, warm_start_default
from scalerl.training.trainer import Trainer, TrainingDivergedError

__all__ = [
    "CheckpointState",
    "Policy",
    "SFTConfig",
    "ScoredGroup",
    "TrainBatch",
    "Trainer",
    "TrainingDivergedError",
    "collate",
    "latest_checkpoint",
    "list_checkpoints",
    "load_checkpoint",
    "load_policy",
    "save_checkpoint",
    "train_sft",
    "warm_start_default",
]
