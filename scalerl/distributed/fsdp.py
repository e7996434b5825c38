"""One rank of the FSDP2-sharded trainer: the single-process `Trainer`'s step, spread over ranks.

    spec = ProcessGroupSpec(rank, world_size, "tcp://10.0.0.1:29500", timeout_s=300)
    rank = ShardedTrainerRank(model_cfg, settings, spec)  # joins the group, loads and shards the policy
    metrics = rank.step(groups)               # EVERY rank, with the SAME groups (collective)
    state = rank.full_state_dict()            # every rank calls; rank 0 gets the HF state dict
    shards = rank.sharded_state_dict()        # local: the DTensor shards (streamed: weights.py)
    sent = rank.engine_tensors()              # local: what the engines get (LoRA: merged when gathered)
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

LoRA (`model.lora.r` > 0): the peft model's base is sharded (frozen W and trainable A, B in the
same per-layer FSDP units), the optimizer holds the adapter only, the KL reference is the base
with the adapter disabled, and the engines get `W + (alpha / r) B A` merged layer by layer as
the streamed sync gathers it (`engine_tensors`). A checkpoint holds the adapter and its
optimizer state (DCP, frozen base left out) and the adapter in peft's format (`adapter/`) instead
of an HF export, as the local trainer's.
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

from scalerl.config import ModelConfig
from scalerl.distributed.checkpoint import load_sharded_checkpoint, save_sharded_checkpoint
from scalerl.distributed.collectives import RankCollectives
from scalerl.distributed.group import ProcessGroupSpec, barrier, init_process_group
from scalerl.distributed.sharding import shard_causal_lm
from scalerl.models.lm_head import decoder_of
from scalerl.models.lora import MergedWeight, merged_tensors
from scalerl.telemetry.compute import ComputeMeter
from scalerl.training.batch import ScoredGroup
from scalerl.training.checkpoint import CheckpointState
from scalerl.training.packing import MicroBatching, check_packed_attention
from scalerl.training.policy import Policy, apply_lora, load_model, load_policy
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
                 meter: ComputeMeter | None = None, lora_seed: int = 0) -> None:
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
        if model.lora.r > 0:
            # LoRA: the adapter is added on the CPU from `lora_seed` (A's init, as the local
            # trainer's `apply_lora` with the run's seed: the same adapter on every rank), then the
            # peft model's base (the HF model, its linear layers now peft's) is sharded: frozen base
            # weights and adapters alike, per decoder layer. The optimizer takes the trainable
            # (adapter) parameters only; the KL reference is the base with the adapter disabled.
            loaded = apply_lora(loaded, model.lora, seed=lora_seed)
            shard_causal_lm(loaded.model.get_base_model(), self.mesh)
            sharded, reference = loaded.model, None
        else:
            sharded, reference = shard_causal_lm(loaded.model, self.mesh), self._sharded_reference
        self.policy = Policy(
            model=sharded,
            tokenizer=loaded.tokenizer,
            fp32_lm_head=loaded.fp32_lm_head,
            dtype=loaded.dtype,
            reference_factory=reference,
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
        copy) under the names `full_state_dict` gives. Local."""
        return dict(get_model_state_dict(self.policy.model, options=StateDictOptions(full_state_dict=False)))

    @property
    def lora(self) -> bool:
        return self.policy.lora

    def engine_tensors(self) -> dict[str, Tensor | MergedWeight]:
        """What the engines get, as this rank holds it, under the base model's Hugging Face names:
        the `DTensor` shards (`sharded_state_dict`), and for LoRA every adapted layer's weight as a
        `MergedWeight` over the shards of W, A and B, merged (`W + (alpha / r) B A`) only when
        gathered. What `weights.stream_to_group` gathers bucket by bucket: a LoRA layer is merged
        there, one layer at a time, never the whole model on one rank. Local; the gathering is
        the collective."""
        if not self.lora:
            return self.sharded_state_dict()
        base = self.policy.model.get_base_model()
        shards = get_model_state_dict(base, options=StateDictOptions(full_state_dict=False))
        return merged_tensors(self.policy.model, shards)

    def engine_state_dict(self) -> dict[str, Tensor] | None:
        """The engines' weights whole, as a CPU state dict on rank 0 (None elsewhere; collective):
        `full_state_dict()`, or for LoRA the merged weights, gathered tensor by tensor."""
        if not self.lora:
            return self.full_state_dict()
        out: dict[str, Tensor] = {}
        made: dict[int, Tensor | None] = {}  # a tied head stays one tensor (gathered once)
        for name, t in self.engine_tensors().items():
            if id(t) not in made:
                whole = t.full_tensor() if hasattr(t, "full_tensor") else t
                made[id(t)] = whole.detach().to("cpu", copy=True) if self.rank == 0 else None
                del whole
            kept = made[id(t)]
            if kept is not None:
                out[name] = kept
        barrier(self.device)  # as full_state_dict: no rank returns while a peer still gathers
        return out if self.rank == 0 else None

    def weights_for_engine(self) -> dict[str, Tensor] | None:
        """`engine_state_dict()`: what `engine.update_weights` takes (rank 0; None elsewhere)."""
        return self.engine_state_dict()

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
