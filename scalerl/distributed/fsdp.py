"""One rank of the FSDP2-sharded trainer: the single-process `Trainer`'s step, spread over ranks.

    spec = ProcessGroupSpec(rank, world_size, "tcp://10.0.0.1:29500", timeout_s=300)
    rank = ShardedTrainerRank(model_cfg, settings, spec)  # joins the group, loads and shards the policy
    metrics = rank.step(groups)               # EVERY rank, with the SAME groups (collective)
    state = rank.full_state_dict()            # every rank calls; rank 0 gets the HF state dict
    shards = rank.sharded_state_dict()        # local: the DTensor shards (streamed: weights.py)
    rank.save(run_dir, step, extra={...})     # every rank; DCP shards + HF export + state.json
    saved = rank.load(path)                   # every rank; any world size DCP can reshard to

Every method documented as a collective must be called by all ranks in the same order (they talk
over `torch.distributed`); the others are local. A wrong call order or a dead peer surfaces as an
error after `ProcessGroupSpec.timeout_s`, not as a 30-minute hang.

The step is `scalerl.training.trainer.Trainer.step` itself, with `RankCollectives`: each rank
prepares the whole batch (so advantages and the aggregation's token/sample/prompt denominators
are global), trains its own slice of the rows, and FSDP sums the gradients; the metrics are merged
from all ranks, so every rank returns the global metrics of the 1-process step. A non-finite value
on any rank skips the step on all ranks (and counts it on all).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.device_mesh import init_device_mesh

from scalerl.config import ConfigError, ModelConfig
from scalerl.distributed.checkpoint import load_sharded_checkpoint, save_sharded_checkpoint
from scalerl.distributed.collectives import RankCollectives
from scalerl.distributed.group import ProcessGroupSpec, barrier, init_process_group
from scalerl.distributed.sharding import shard_causal_lm
from scalerl.models.lm_head import decoder_of
from scalerl.telemetry.compute import ComputeMeter
from scalerl.training.batch import ScoredGroup
from scalerl.training.checkpoint import CheckpointState
from scalerl.training.packing import MicroBatching, check_packed_attention
from scalerl.training.policy import Policy, load_model, load_policy
from scalerl.training.trainer import Trainer, TrainerSettings


def batch_fingerprint(groups: Sequence[ScoredGroup]) -> str:
    """A digest of what a step trains on (prompt and token ids, loss masks, behaviour log-probs,
    rewards), to check that every rank was given the same batch."""
    h = hashlib.sha256()
    for group in groups:
        h.update(group.record.id.encode())
        h.update(np.asarray(group.rewards, dtype=np.float64).tobytes())
        h.update(b"old" if group.old_logprobs is not None else b"-")
        for c in group.completions:
            for values, dtype in ((c.prompt_ids, np.int64), (c.token_ids, np.int64),
                                  (c.loss_mask, np.bool_), (c.logprobs, np.float32)):
                array = np.asarray(values, dtype=dtype)
                h.update(np.int64(array.size).tobytes())
                h.update(array.tobytes())
    return h.hexdigest()


class ShardedTrainerRank:
    """One FSDP2 rank of the trainer (see module docstring). Satisfies the pipeline's `Trainer`
    protocol on every rank, except that `weights_for_engine` returns None off rank 0.

    A `meter` counts what the whole step processed (every rank's rows), so one rank's meter
    (rank 0's) is the run's; its busy time is that rank's wall time.
    """

    def __init__(self, model: ModelConfig, settings: TrainerSettings, group: ProcessGroupSpec,
                 meter: ComputeMeter | None = None) -> None:
        if model.lora.r > 0:
            # Before joining the group: every rank refuses alike, no peer waits for it.
            raise ConfigError("model.lora.r > 0: the FSDP2 ranks do not shard peft adapters; LoRA runs "
                              "in the local trainer (distributed.backend=local)")
        self.model_cfg = model
        self.group = group
        self._owns_group = init_process_group(group)
        self.device = group.resolved_device
        self.mesh = init_device_mesh(self.device.type, (group.world_size,))
        # Built on the CPU (the same initial weights on every rank: a pretrained checkpoint or the
        # seeded tiny default), then sharded: each rank keeps only its shard on its device.
        loaded = load_policy(model, device="cpu")
        if MicroBatching.from_optim(settings.optim).packed:
            # Before sharding: the decoder of a sharded model cannot be called on its own.
            vocab = int(loaded.model.get_input_embeddings().weight.shape[0])
            check_packed_attention(decoder_of(loaded.model), vocab, "cpu")
        self.policy = Policy(
            model=shard_causal_lm(loaded.model, self.mesh),
            tokenizer=loaded.tokenizer,
            fp32_lm_head=loaded.fp32_lm_head,
            dtype=loaded.dtype,
            reference_factory=self._sharded_reference,
        )
        self.collectives = RankCollectives(group.rank, group.world_size, self.device)
        self.trainer = Trainer.from_settings(settings, self.policy, meter=meter, collectives=self.collectives)

    def _sharded_reference(self) -> torch.nn.Module:
        ref = load_model(self.model_cfg, torch.device("cpu"))
        ref.requires_grad_(False)
        ref.eval()
        return shard_causal_lm(ref, self.mesh)

    # -- identity ------------------------------------------------------------------------------

    @property
    def rank(self) -> int:
        return self.group.rank

    @property
    def world_size(self) -> int:
        return self.group.world_size

    @property
    def version(self) -> int:
        """Successful optimizer steps (the same on every rank)."""
        return self.trainer.version

    @property
    def tokenizer(self) -> Any:
        return self.policy.tokenizer

    # -- training (collectives) -----------------------------------------------------------------

    def _check_same_batch(self, groups: Sequence[ScoredGroup]) -> None:
        prints = self.collectives.gather(batch_fingerprint(groups))
        odd = [r for r, p in enumerate(prints) if p != prints[0]]
        if odd:
            raise ValueError(
                f"groups: ranks {odd} were given a different batch than rank 0; every rank of a "
                "sharded step must receive the same full list of groups"
            )

    def step(self, groups: Sequence[ScoredGroup]) -> dict[str, float]:
        """One optimizer step on `groups` (collective); the global metrics, on every rank."""
        self._check_same_batch(groups)
        return self.trainer.step(groups)

    def compute_gradients(self, groups: Sequence[ScoredGroup]) -> dict[str, float]:
        """`Trainer.compute_gradients` (collective): the summed gradients are left, sharded, in
        the parameters' `.grad`; see `gradients()`."""
        self._check_same_batch(groups)
        return self.trainer.compute_gradients(groups)

    def gradients(self) -> dict[str, Tensor]:
        """The full (unsharded) gradient of every parameter that has one, on every rank (collective)."""
        return {
            name: p.grad.full_tensor().detach().cpu()
            for name, p in self.policy.model.named_parameters()
            if p.grad is not None
        }

    def attach_old_logprobs(self, groups: Sequence[ScoredGroup]) -> None:
        """`Trainer.attach_old_logprobs` (collective): the same log-probs land on every rank."""
        self.trainer.attach_old_logprobs(groups)

    # -- weights (collective) -------------------------------------------------------------------

    def full_state_dict(self) -> dict[str, Tensor] | None:
        """The whole model as a CPU state dict with Hugging Face names on rank 0; None elsewhere.

        Every rank takes part in gathering the shards and none returns before all have finished,
        so rank 0 may send the result over another group straight away: a peer still gathering
        while rank 0 sends is the deadlock this ordering excludes.
        """
        state = get_model_state_dict(
            self.policy.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
        )
        barrier(self.device)
        return dict(state) if self.rank == 0 else None

    def sharded_state_dict(self) -> dict[str, Tensor]:
        """The model's parameters and buffers as this rank holds them (FSDP2 `DTensor` shards, no
        copy) under the names `full_state_dict` gives: what `weights.stream_to_group` gathers bucket
        by bucket. Local; the gathering is the collective."""
        return dict(get_model_state_dict(self.policy.model, options=StateDictOptions(full_state_dict=False)))

    def weights_for_engine(self) -> dict[str, Tensor] | None:
        """`full_state_dict()`: what `engine.update_weights` takes (rank 0; None elsewhere)."""
        return self.full_state_dict()

    # -- state -----------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, int]:
        return self.trainer.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.trainer.load_state_dict(state)

    def save(
        self, run_dir: str | Path, step: int, extra: Mapping[str, Any] | None = None, keep: int | None = None
    ) -> Path:
        """Checkpoint `<run_dir>/checkpoints/step_NNNNNN/` (collective; see
        `scalerl.distributed.checkpoint`): sharded model and optimizer (DCP), an HF export,
        scheduler, RNG, counters, and the caller's `extra` in `state.json`, written last by rank 0."""
        return save_sharded_checkpoint(
            run_dir,
            step,
            model=self.policy.model,
            optimizer=self.trainer.optimizer,
            scheduler=self.trainer.scheduler,
            tokenizer=self.policy.tokenizer,
            trainer_state=self.trainer.state_dict(),
            extra=extra,
            keep=keep,
            device=self.device,
        )

    def load(self, path: str | Path, restore_rng: bool = True) -> CheckpointState:
        """Restore a checkpoint written by `save`, possibly by another world size (collective)."""
        state = load_sharded_checkpoint(
            path,
            model=self.policy.model,
            optimizer=self.trainer.optimizer,
            scheduler=self.trainer.scheduler,
            restore_rng=restore_rng,
            device=self.device,
        )
        self.trainer.load_state_dict(state.trainer)
        return state

    def close(self) -> None:
        """Leave the process group if this rank created it (collective)."""
        if self._owns_group and dist.is_initialized():
            barrier(self.device)
            dist.destroy_process_group()
            self._owns_group = False
