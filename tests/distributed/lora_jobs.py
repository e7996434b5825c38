"""What the LoRA-on-FSDP2 test runs on spawned ranks (`spawn_ranks(fn, ...)` calls `fn(spec, *args)`)."""

from __future__ import annotations

from typing import Any

import torch
from fsdp_jobs import Op, batch, run_ops

from scalerl.assembly.sections import trainer_settings
from scalerl.config import RunConfig
from scalerl.distributed import ProcessGroupSpec, ShardedTrainerRank
from scalerl.distributed.trainer import TrainerRankWorker, settings_payload
from scalerl.distributed.weights import unflatten_bucket
from scalerl.training.checkpoint import latest_checkpoint


class RecordingGroup:
    """A weight group that keeps what rank 0 broadcasts (a copy of every flat bucket)."""

    def __init__(self) -> None:
        self.sent: list[torch.Tensor] = []

    def broadcast(self, flat: torch.Tensor) -> None:
        self.sent.append(flat.detach().clone())


def lora_job(spec: ProcessGroupSpec, cfg: RunConfig, ops: list[Op], run_dir: str) -> dict[str, Any]:
    """`ops` on a LoRA rank; then what a streamed sync and an object-store gather send (merged);
    then a checkpoint after the ops, a further step, and a fresh rank that loads it and takes the
    same step."""
    rank0 = spec.rank == 0
    # Built as a Ray trainer actor builds its rank (the payload carries the run's seed), in the
    # process group `spawn_ranks` made (so the worker's own address is never used).
    worker = TrainerRankWorker(spec.rank, spec.world_size)
    payload = settings_payload(cfg.model, trainer_settings(cfg), cfg.distributed, lora_seed=cfg.seed)
    info = worker.setup(payload, "127.0.0.1", 0, None)
    rank: ShardedTrainerRank = worker.trainer
    out: dict[str, Any] = {
        "info": (info.n_params, info.n_trainable, worker.meter.train_flops_per_token,
                 worker.meter.generation_params),
        "optimizer_params": sum(p.numel() for g in rank.trainer.optimizer.param_groups for p in g["params"]),
        "frozen_dtensors": sum(1 for p in rank.policy.model.parameters()
                               if not p.requires_grad and hasattr(p, "full_tensor")),
        "adapter_dtensors": sum(1 for p in rank.policy.model.parameters()
                                if p.requires_grad and hasattr(p, "full_tensor")),
    }
    out["ops"] = run_ops(rank, ops, rank0)
    # The collective sync as the Ray channel drives it: the plan (rank 0's, the same on every rank),
    # then every rank streams while rank 0 broadcasts (here: records) and fingerprints each bucket.
    buckets = worker.plan_stream(4096)  # several buckets
    group = RecordingGroup() if rank0 else None
    worker._group = group  # type: ignore[assignment]
    out["stream_prints"] = worker.stream_weights(rank.version, buckets, "float32")
    out["streamed"] = ({name: t for b, flat in zip(buckets, group.sent, strict=True)
                        for name, t in unflatten_bucket(flat, b).items()} if group is not None else None)
    out["buckets"] = len(buckets)
    out["engine_state"] = rank.engine_state_dict()

    out["path"] = str(rank.save(run_dir, rank.version, extra={"pipeline": {"cursor": 3}}))
    out["continued"] = rank.step(batch(3))
    out["weights_continued"] = rank.full_state_dict()
    fresh = ShardedTrainerRank(cfg.model, trainer_settings(cfg), spec, lora_seed=cfg.seed + 1)
    state = fresh.load(latest_checkpoint(run_dir))
    out["loaded"] = {"step": state.step, "version": fresh.version}
    out["resumed"] = fresh.step(batch(3))
    out["weights_resumed"] = fresh.full_state_dict()
    return out
