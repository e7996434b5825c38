"""The trainer: one exact optimizer step on a batch of scored groups, algorithm-blind.

Everything the objective computes comes from `scalerl.algorithms`; everything that turns hidden
states into log-probs from `scalerl.models.lm_head` (through `training.forward`). What lives here
is the order of operations of one step:

1. collate the groups; drop zero-variance groups (counted; all dropped = a counted no-op step);
2. advantages on the kept samples from the step's `AdvantageEstimator` (`training.advantage`:
   a baseline and `adv_norm` on the outcome rewards, or the critic's GAE), optionally with the KL
   in the reward (per sequence, or per token as REINFORCE++);
3. per-token aggregation weights computed once on the whole kept batch, then sliced per
   micro-batch, so the loss and gradient do not depend on how the batch is split (`micro_batch_size`,
   `micro_batch_tokens`) or laid out (padded or packed: `training.packing`);
4. per micro-batch: forward, off-policy sequence mask, per-token policy loss, KL and entropy
   terms, `backward()` of the weighted sum (gradients accumulate);
5. NaN/Inf anywhere (inputs, log-probs, loss, gradient norm) skips the update and counts a bad
   step; `max_consecutive_bad_steps` in a row raise `TrainingDivergedError`;
6. clip, AdamW step, LR schedule step, `version += 1`;
7. the estimator's own update (the critic's optimizer step; nothing for outcome baselines).

Steps 1-3 always see the whole batch. The model passes, the merge of their statistics and the
clipping go through a `StepCollectives` (`training.collectives`): for one process the identity;
for FSDP2 ranks (`scalerl.distributed`) each rank runs its own rows, and what the ranks computed
is summed and merged, so the sharded step is this step.

The importance ratio is pi_train / pi_old with pi_old the generator's behaviour log-probs (ScaleRL
eq. 2), or, with `recompute_old_logprobs`, the trainer's own log-probs before the update (then TIS
can correct pi_old / pi_gen).
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from scalerl.algorithms.aggregation import token_weights, weighted_token_sum
from scalerl.algorithms.distill import distillation_advantages
from scalerl.algorithms.entropy import entropy_bonus
from scalerl.algorithms.filters import zero_variance_filter
from scalerl.algorithms.kl import kl_penalty, kl_shaped_rewards, sample_kl_coefs
from scalerl.algorithms.masks import off_policy_sequence_mask
from scalerl.algorithms.objectives import per_token_policy_loss
from scalerl.algorithms.stats import merge_policy_stats, reduce_token_stats
from scalerl.config import AlgorithmConfig, ConfigError, OptimConfig
from scalerl.models.lm_head import Fp32HeadWeight, decoder_of
from scalerl.models.moe import routing_shape
from scalerl.telemetry.compute import ComputeMeter, flop_params
from scalerl.training.advantage import AdvantageEstimator, OutcomeAdvantages
from scalerl.training.batch import ScoredGroup, TrainBatch, collate, pad_prompt_response
from scalerl.training.checkpoint import CheckpointState, load_checkpoint, save_checkpoint
from scalerl.training.collectives import StepCollectives
from scalerl.training.critic import Critic
from scalerl.training.forward import EntropyMode, ResponseForward, RoutingRecord, SupportRecord
from scalerl.training.optim import build_optimizer, build_scheduler
from scalerl.training.packing import MicroBatching, check_packed_attention, row_lengths
from scalerl.training.policy import Policy, is_activation_checkpointing

logger = logging.getLogger(__name__)


class TrainingDivergedError(RuntimeError):
    """Too many consecutive optimizer steps had a non-finite loss or gradient."""


class _NonFiniteError(Exception):
    """A NaN/Inf met during a step; the step is abandoned (internal control flow)."""


def _finite(x: Tensor, where: Tensor | None = None) -> bool:
    ok = torch.isfinite(x)
    if where is not None:
        ok = ok | ~where
    return bool(ok.all())


def same_weights(batch: TrainBatch, version: int) -> Tensor:
    """`[N]` bool: rows generated entirely by the weights of `version` (prompt prefill and every
    token), i.e. the rows on which |log pi_engine - log pi_trainer| at trainer version `version` is
    the train/inference mismatch alone, with no policy lag (PipelineRL in-flight updates, later
    PPO mini-batches) mixed in."""
    tokens_ok = ((batch.versions == version) | ~batch.token_mask).all(dim=1)
    return tokens_ok & (batch.start_version == version)


class _MeanMax:
    """Token-weighted mean and max of a per-token quantity, accumulated over micro-batches."""

    def __init__(self) -> None:
        self.total = 0.0
        self.count = 0
        self.max = -math.inf

    def add(self, values: Tensor, mask: Tensor) -> None:
        if not bool(mask.any()):
            return
        v = values.detach()[mask].double()
        self.total += float(v.sum())
        self.count += int(v.numel())
        self.max = max(self.max, float(v.max()))

    @property
    def mean(self) -> float:
        return self.total / self.count if self.count else math.nan

    @classmethod
    def merge(cls, parts: Sequence[_MeanMax]) -> _MeanMax:
        out = cls()
        for part in parts:
            out.total += part.total
            out.count += part.count
            out.max = max(out.max, part.max)
        return out


@dataclass
class _StepStats:
    """What one process's micro-batches add up to in a step; `merge` combines processes exactly."""

    loss: float = 0.0
    policy_loss: float = 0.0
    kl: _MeanMax = field(default_factory=_MeanMax)
    entropy: _MeanMax = field(default_factory=_MeanMax)
    gen_diff: _MeanMax = field(default_factory=_MeanMax)
    mismatch: _MeanMax = field(default_factory=_MeanMax)  # gen_diff on samples of the current weights only
    distill_kl: _MeanMax = field(default_factory=_MeanMax)  # `distill.estimator: full`'s KL per token
    # Keep-sampling-mask: loss tokens whose recorded set differs from these logits' own top-|S| /
    # whose set was not recorded whole (completed from these logits).
    support_mismatch: int = 0
    support_incomplete: int = 0
    # MoE with recorded routing (training passes): (token, layer) pairs with a record, those where
    # the trainer's own top-k differs from it, and (keep_routing) pairs routed freely for want of one.
    routing_pairs: int = 0
    routing_mismatched: int = 0
    routing_unrecorded: int = 0
    router_aux: float = 0.0  # the load-balancing loss, token-weighted over the passes
    # Forward/backward passes with rows, and their real tokens against the token slots they ran
    # (padding included): `padding_frac`, the share of the step's compute spent on padding.
    passes: int = 0
    real_tokens: int = 0
    slot_tokens: int = 0
    parts: list[dict[str, float]] = field(default_factory=list)  # `reduce_token_stats` per micro-batch
    problem: str | None = None  # the first non-finite value met (lockstep steps only)

    @classmethod
    def merge(cls, per_rank: Sequence[_StepStats]) -> _StepStats:
        problems = [(r, s.problem) for r, s in enumerate(per_rank) if s.problem is not None]
        problem = None
        if problems:
            rank, what = problems[0]
            problem = what if len(per_rank) == 1 else f"rank {rank}: {what}"
        return cls(
            loss=sum(s.loss for s in per_rank),
            policy_loss=sum(s.policy_loss for s in per_rank),
            kl=_MeanMax.merge([s.kl for s in per_rank]),
            entropy=_MeanMax.merge([s.entropy for s in per_rank]),
            gen_diff=_MeanMax.merge([s.gen_diff for s in per_rank]),
            mismatch=_MeanMax.merge([s.mismatch for s in per_rank]),
            distill_kl=_MeanMax.merge([s.distill_kl for s in per_rank]),
            support_mismatch=sum(s.support_mismatch for s in per_rank),
            support_incomplete=sum(s.support_incomplete for s in per_rank),
            routing_pairs=sum(s.routing_pairs for s in per_rank),
            routing_mismatched=sum(s.routing_mismatched for s in per_rank),
            routing_unrecorded=sum(s.routing_unrecorded for s in per_rank),
            router_aux=sum(s.router_aux for s in per_rank),
            passes=sum(s.passes for s in per_rank),
            real_tokens=sum(s.real_tokens for s in per_rank),
            slot_tokens=sum(s.slot_tokens for s in per_rank),
            parts=[p for s in per_rank for p in s.parts],
            problem=problem,
        )


def kl_used(algo: AlgorithmConfig) -> bool:
    """Whether any sample gets a KL term: `kl_coef` or a task's `kl_coef_by_task` above 0."""
    return algo.kl_coef > 0 or any(c > 0 for c in algo.kl_coef_by_task.values())


def _zero_loss(logprobs: Tensor) -> Tensor:
    """A loss of exactly 0 whose backward still runs through the whole model (a pass that learns
    nothing, so that a rank keeps pace with its peers' collectives); non-finite values are masked
    so that 0 * inf cannot turn into NaN."""
    return torch.where(torch.isfinite(logprobs), logprobs, 0.0).sum() * 0.0


@dataclass(frozen=True)
class TrainerSettings:
    """The trainer's sections of a run: `algorithm`, `optim` (its learning rate already scaled for
    the run's batch, `scalerl.training.optim.scaled_optim`), and the two generation values its
    log-probs and aggregation depend on: the sampling `temperature` and the `max_new_tokens` budget
    (the `constant` aggregation's divisor). Built by the composition root; plain picklable values,
    so the same settings build a trainer rank in another process."""

    algorithm: AlgorithmConfig
    optim: OptimConfig
    temperature: float = 1.0
    max_new_tokens: int | None = None


class Trainer:
    """Owns the policy's optimizer and schedule; `step(groups)` performs one update.

    `version` counts successful optimizer steps: the version the generator must tag tokens with
    after `engine.update_weights(trainer.weights_for_engine(), trainer.version)`.

    `collectives` spreads the step over processes (`scalerl.distributed`); the default is one process.
    `advantages` is the step's advantage estimator; the default is the one `algorithm` names.
    """

    def __init__(
        self,
        policy: Policy,
        algorithm: AlgorithmConfig,
        optim: OptimConfig,
        *,
        temperature: float = 1.0,
        max_new_tokens: int | None = None,
        meter: ComputeMeter | None = None,
        collectives: StepCollectives | None = None,
        advantages: AdvantageEstimator | None = None,
    ) -> None:
        if temperature <= 0:
            raise ValueError(
                f"generation.temperature: the trainer needs the sampling temperature (> 0) to match "
                f"the generator's log-probs, got {temperature}"
            )
        if algorithm.aggregation == "constant" and max_new_tokens is None:
            raise ValueError("algorithm.aggregation='constant' needs max_new_tokens (generation budget)")
        if algorithm.tis.enabled and not algorithm.recompute_old_logprobs:
            raise ValueError(
                "algorithm.tis.enabled needs algorithm.recompute_old_logprobs=true: TIS corrects "
                "pi_old / pi_gen, and without recomputation pi_old is pi_gen (the weight would be 1)"
            )
        if algorithm.router_aux_loss_coef > 0 and routing_shape(policy.model) is None:
            raise ConfigError(f"algorithm.router_aux_loss_coef: {type(policy.model).__name__} has no MoE "
                              "routers (a dense model)")
        if algorithm.keep_routing:
            if routing_shape(policy.model) is None:
                raise ConfigError(f"algorithm.keep_routing: {type(policy.model).__name__} has no MoE "
                                  "routers to replay (a dense model)")
            if is_activation_checkpointing(policy.model):
                raise ConfigError("algorithm.keep_routing: not with gradient checkpointing (the "
                                  "recomputation in backward would route freely)")
        if kl_used(algorithm) and policy.reference_factory is None and not policy.lora:
            raise ValueError("algorithm.kl_coef > 0 needs a reference model (policy.reference_factory)")
        self.policy = policy
        self.algo = algorithm
        self.optim_cfg = optim
        self.temperature = float(temperature)
        self.max_new_tokens = max_new_tokens
        self.meter = meter
        self.collectives = collectives if collectives is not None else StepCollectives()
        self.batching = MicroBatching.from_optim(optim)
        if self.batching.packed and not self.collectives.lockstep:
            # Sharded ranks check before sharding (`scalerl.distributed.fsdp`): the decoder of a
            # sharded model cannot be called on its own.
            vocab = int(policy.model.get_input_embeddings().weight.shape[0])
            check_packed_attention(decoder_of(policy.model), vocab, policy.device)
        self.optimizer = build_optimizer(policy.model, optim)
        self.scheduler = build_scheduler(self.optimizer, optim.warmup_steps)
        self.version = 0
        self.consecutive_bad_steps = 0
        self.bad_steps = 0
        self.noop_steps = 0
        self._reference: torch.nn.Module | None = None
        self._teacher: torch.nn.Module | None = None
        self._teacher_params = 0
        self._teacher_head = Fp32HeadWeight()  # the frozen teacher's float32 head (`estimator: full`)
        if algorithm.distill.teacher is not None and self.collectives.lockstep:
            raise ValueError("algorithm.distill.teacher: the teacher runs in one local trainer process; "
                             "sharded ranks have none (use distributed.backend=local)")
        self.advantages = advantages if advantages is not None else self._default_estimator()

    def _default_estimator(self) -> AdvantageEstimator:
        if self.algo.baseline != "critic":
            return OutcomeAdvantages(self.algo)
        if self.collectives.lockstep:
            raise ValueError(
                "algorithm.baseline: 'critic' has no sharded form (the value model is one process's); "
                "use distributed.backend=local"
            )
        return Critic.for_policy(self.policy, self.algo, self.optim_cfg, meter=self.meter)

    @classmethod
    def from_settings(
        cls,
        settings: TrainerSettings,
        policy: Policy,
        meter: ComputeMeter | None = None,
        collectives: StepCollectives | None = None,
    ) -> Trainer:
        return cls(
            policy,
            settings.algorithm,
            settings.optim,
            temperature=settings.temperature,
            max_new_tokens=settings.max_new_tokens,
            meter=meter,
            collectives=collectives,
        )

    # -- model passes ----------------------------------------------------------------------------

    @property
    def device(self) -> torch.device:
        return self.policy.device

    @property
    def reference(self) -> torch.nn.Module:
        if self._reference is None:
            self._reference = self.policy.load_reference()
        return self._reference

    @property
    def teacher(self) -> torch.nn.Module:
        """The distillation teacher (`algorithm.distill.teacher`), loaded on first use."""
        if self._teacher is None:
            from scalerl.training.teacher import load_teacher

            assert self.algo.distill.teacher is not None
            self._teacher = load_teacher(self.algo.distill.teacher, self.policy)
            self._teacher_params = flop_params(self._teacher)
        return self._teacher

    @contextlib.contextmanager
    def _reference_model(self) -> Iterator[torch.nn.Module]:
        """The KL reference: a LoRA policy with its adapter disabled, else the frozen copy."""
        if self.policy.lora:
            with self.policy.reference_model() as base:
                yield base
        else:
            yield self.reference

    def _reference_params(self) -> int | None:
        """N of a reference pass: a LoRA policy's base alone (the adapter is disabled)."""
        return self.meter.generation_params if self.meter is not None and self.policy.lora else None

    def _forward(
        self, model: torch.nn.Module, mb: TrainBatch, *, grad: bool, entropy: EntropyMode = "none",
        teacher: torch.nn.Module | None = None,
    ) -> ResponseForward:
        support = None
        if self.algo.keep_sampling_mask and mb.support_size is not None:
            support = SupportRecord(mb.support_size, mb.support_ids, mb.support_top_k, mb.support_top_p)
        routing = None
        if mb.routing is not None:
            routing = RoutingRecord(mb.routing, replay=self.algo.keep_routing)
        with self.policy.autocast(), (contextlib.nullcontext() if grad else torch.no_grad()):
            return self.collectives.forward(
                model,
                mb,
                temperature=self.temperature,
                fp32_lm_head=self.policy.fp32_lm_head,
                entropy=entropy,
                support=support,
                logit_chunk_tokens=self.optim_cfg.logit_chunk_tokens,
                packed=self.batching.packed,
                routing=routing,
                router_aux=grad and self.algo.router_aux_loss_coef > 0,
                teacher=teacher,
                teacher_head_cache=self._teacher_head,
            )

    @torch.no_grad()
    def compute_logprobs(self, batch: TrainBatch, model: torch.nn.Module | None = None,
                         n_params: int | None = None) -> Tensor:
        """Log-probs `[N, T]` of the batch's response tokens under `model` (default: the policy),
        micro-batched, without gradient; 0 at padding. `n_params`: the N its FLOPs are counted
        with (default: the meter's; the teacher's own size for the teacher)."""
        model = model if model is not None else self.policy.model
        out = torch.zeros(batch.response_mask.shape, dtype=torch.float32, device=batch.input_ids.device)
        for rows in self.collectives.micro_batch_plan(row_lengths(batch), self.batching):
            mb = batch.select(rows or [0]).to(self.device)
            lp = self._forward(model, mb, grad=False).logprobs
            if rows:
                out[rows, : lp.shape[1]] = torch.where(mb.token_mask, lp, 0.0).float().to(out.device)
        if self.meter is not None:
            self.meter.add_logprob_pass(batch.num_tokens, n_params)
        return self.collectives.sum_rows(out)

    @torch.no_grad()
    def probe_logprobs(self, probe: Sequence[Sequence[int]]) -> list[list[float]]:
        """The weight-sync probe's log-probs under the policy as it is now (`scalerl.rollout.probe`):
        `log p(x_t | x_<t)` for t >= 1 of each sequence, temperature 1, through the trainer's own
        forward (`collectives.forward`: FSDP ranks each call this together) in eval mode (no
        dropout) and the trainer's precision. Not counted in the compute meter: it is a check."""
        model = self.policy.model
        tokens = pad_prompt_response([list(s[:1]) for s in probe], [list(s[1:]) for s in probe],
                                     self.policy.pad_token_id).to_device(self.device)
        training = model.training
        model.eval()
        try:
            with self.policy.autocast():
                lp = self.collectives.forward(model, tokens, temperature=1.0,
                                              fp32_lm_head=self.policy.fp32_lm_head).logprobs
        finally:
            model.train(training)
        rows = lp.float().cpu().tolist()
        return [[float(x) for x in row[: len(s) - 1]] for row, s in zip(rows, probe, strict=True)]

    def attach_old_logprobs(self, groups: Sequence[ScoredGroup]) -> None:
        """Fill `group.old_logprobs` with the current policy's log-probs (pi_old, for TIS and for
        PPO-style multi-update rounds that must share one pi_old)."""
        batch = collate(groups, self.policy.pad_token_id)
        lp = self.compute_logprobs(batch)
        row = 0
        for group in groups:
            group.old_logprobs = []
            for c in group.completions:
                group.old_logprobs.append(lp[row, : c.num_tokens].tolist())
                row += 1

    # -- the step --------------------------------------------------------------------------------

    def step(self, groups: Sequence[ScoredGroup]) -> dict[str, float]:
        """One optimizer step on `groups`; returns the step's metrics.

        A step with nothing to learn from (every group zero-variance) is a counted no-op; a step
        with a non-finite input, log-prob, loss or gradient is skipped and counted, and the
        `max_consecutive_bad_steps`-th in a row raises `TrainingDivergedError`.
        """
        busy = self.meter.busy("trainer") if self.meter is not None else contextlib.nullcontext()
        start = time.perf_counter()
        metrics = dict.fromkeys(("skipped_nonfinite", "skipped_no_signal", "batch_tokens"), 0.0)
        with busy:
            try:
                prepared = self._prepare(groups, metrics)
                if prepared is None:
                    self.noop_steps += 1
                    metrics["skipped_no_signal"] = 1.0
                else:
                    self._accumulate(*prepared, metrics)
                    self._apply(prepared[0], metrics)
                    metrics.update(self.advantages.update(prepared[0]))
            except (_NonFiniteError, FloatingPointError) as bad:
                self._bad_step(metrics, str(bad))
        elapsed = time.perf_counter() - start
        metrics["step_time_s"] = elapsed
        metrics["tokens_per_s"] = metrics["batch_tokens"] / elapsed if elapsed > 0 else 0.0
        metrics["version"] = float(self.version)
        metrics["bad_steps_total"] = float(self.bad_steps)
        metrics["noop_steps_total"] = float(self.noop_steps)
        return metrics

    def compute_gradients(self, groups: Sequence[ScoredGroup]) -> dict[str, float]:
        """Everything `step` does before clipping: the gradients are left in the parameters' `.grad`
        and nothing else changes (no update, no counters). For diagnostics and tests.

        Raises `FloatingPointError` where `step` would skip, `ValueError` if no group carries signal.
        """
        metrics: dict[str, float] = {}
        try:
            prepared = self._prepare(groups, metrics)
            if prepared is None:
                raise ValueError("groups: every group has zero reward variance; nothing to differentiate")
            self._accumulate(*prepared, metrics)
        except (_NonFiniteError, FloatingPointError) as bad:
            raise FloatingPointError(str(bad)) from None
        return metrics

    def _prepare(
        self, groups: Sequence[ScoredGroup], metrics: dict[str, float]
    ) -> tuple[TrainBatch, Tensor] | None:
        """Collate, filter, compute advantages and aggregation weights; None if no signal is left."""
        full = collate(groups, self.policy.pad_token_id)
        metrics.update(self._batch_metrics(full, len(groups)))
        keep = list(range(len(full)))
        metrics["zero_variance_frac"] = 0.0
        distill = self.algo.distill
        # With a teacher every sample carries signal (its tokens' reverse KL), so groups of equal
        # rewards are kept: their outcome advantage is exactly 0 (`compute_advantages`).
        if self.algo.zero_variance_filter and distill.teacher is None:
            mask, counts = zero_variance_filter(full.rewards, full.group_ids)
            keep = torch.nonzero(mask).flatten().tolist()
            metrics["zero_variance_frac"] = counts.n_dropped_groups / counts.n_groups
        metrics["kept_samples"] = float(len(keep))
        if not keep:
            return None
        batch = full.select(keep)
        if not bool(batch.response_mask.any()):
            return None

        if not _finite(batch.behavior_logprobs, batch.response_mask):
            raise _NonFiniteError("non-finite behaviour log-probs from the generator")
        if self.algo.recompute_old_logprobs and batch.old_logprobs is None:
            batch.old_logprobs = self.compute_logprobs(batch)
        if batch.old_logprobs is not None and not _finite(batch.old_logprobs, batch.response_mask):
            raise _NonFiniteError("non-finite old log-probs")

        rewards, token_penalty = batch.rewards, None
        if self.algo.kl_in_reward and self.algo.kl_coef > 0:
            policy_lp = batch.old_logprobs if batch.old_logprobs is not None else self.compute_logprobs(batch)
            with self._reference_model() as reference:
                ref_lp = self.compute_logprobs(batch, reference, self._reference_params())
            if self.algo.kl_reward_level == "token":
                # REINFORCE++ eq. 9: KL(t) = log pi_old(t) / pi_ref(t), the k1 estimate per token.
                kl = kl_penalty(policy_lp, ref_lp, "k1", mask=batch.response_mask)
                token_penalty = self.algo.kl_coef * kl
            else:
                mask, beta = batch.response_mask, self.algo.kl_coef
                rewards = kl_shaped_rewards(rewards, policy_lp, ref_lp, mask, beta)
        batch.advantages, estimated = self.advantages.estimate(batch, rewards, token_penalty)
        metrics.update(estimated)
        if distill.teacher is not None:
            metrics.update(self._distill(batch))
        adv = batch.advantages
        metrics["advantage_abs_mean"] = float(
            (adv.abs() if adv.dim() == 1 else adv[batch.response_mask].abs()).mean()
        )
        # Computed once on the whole kept batch: the per-prompt (or per-batch) token counts the
        # aggregation divides by must not depend on how the batch is split into micro-batches.
        weights = token_weights(
            batch.response_mask, batch.group_ids, self.algo.aggregation, self.max_new_tokens
        )
        return batch, weights

    def _distill(self, batch: TrainBatch) -> dict[str, float]:
        """Add the teacher's reverse-KL term to `batch.advantages` (scalerl.algorithms.distill):
        the student's log-probs are the sampler's (pi_old when recomputed), as in on-policy
        distillation's estimator; the teacher's come from one forward pass (counted in the FLOPs).
        With `estimator: full` only the outcome advantage is scaled here: the KL is a loss term of
        the training passes (`_accumulate`)."""
        d = self.algo.distill
        if d.estimator == "full":
            batch.advantages = batch.advantages * d.reward_weight
            return {}
        teacher = self.teacher
        student_lp = batch.old_logprobs if batch.old_logprobs is not None else batch.behavior_logprobs
        teacher_lp = self.compute_logprobs(batch, teacher, self._teacher_params).to(student_lp.device)
        mask = batch.response_mask
        if not _finite(teacher_lp, mask):
            raise _NonFiniteError("non-finite teacher log-probs")
        batch.advantages = distillation_advantages(batch.advantages, student_lp, teacher_lp, mask,
                                                   d.coef, d.reward_weight)
        reverse_kl = (student_lp - teacher_lp)[mask]
        return {"distill_reverse_kl": float(reverse_kl.mean()) if reverse_kl.numel() else 0.0,
                "distill_teacher_logprob": float(teacher_lp[mask].mean()) if reverse_kl.numel() else 0.0}

    def _accumulate(self, batch: TrainBatch, weights: Tensor, metrics: dict[str, float]) -> None:
        """Forward and backward this process's micro-batches; gradients accumulate in `.grad`.

        Every pass runs the same collectives in the same order (policy forward, reference forward
        if a KL loss is used, one backward), whatever its rows hold, so a lockstep (sharded) step
        stays in step across ranks even when one rank meets a non-finite value or has no rows left.
        """
        model = self.policy.model
        model.train()
        self.optimizer.zero_grad(set_to_none=True)
        use_kl_loss = kl_used(self.algo) and not self.algo.kl_in_reward
        entropy_mode: EntropyMode = "grad" if self.algo.entropy_coef != 0 else "metric"
        full_kl = self.algo.distill.teacher is not None and self.algo.distill.estimator == "full"
        teacher = self.teacher if full_kl else None
        local = _StepStats()

        for rows in self.collectives.micro_batch_plan(row_lengths(batch), self.batching):
            mb = batch.select(rows or [0]).to(self.device)
            if rows:
                local.passes += 1
                local.real_tokens += mb.num_tokens
                local.slot_tokens += mb.num_tokens if self.batching.packed else int(mb.input_ids.numel())
            out = self._forward(model, mb, grad=True, entropy=entropy_mode, teacher=teacher)
            ref_lp = None
            if use_kl_loss:
                with self._reference_model() as reference:
                    ref_lp = self._forward(reference, mb, grad=False).logprobs
            loss = None
            if rows and local.problem is None:
                w = weights[rows][:, : mb.response_width].to(self.device)
                loss = self._micro_batch_loss(mb, w, out, ref_lp, entropy_mode, local)
                if loss is not None and out.router_aux_loss is not None:
                    # Each pass's load-balancing loss weighted by its share of the batch's tokens.
                    aux = out.router_aux_loss * (mb.num_tokens / batch.num_tokens)
                    local.router_aux += float(aux.detach())
                    loss = loss + self.algo.router_aux_loss_coef * aux
            (loss if loss is not None else _zero_loss(out.logprobs)).backward()

        stats = _StepStats.merge(self.collectives.gather(local))
        if use_kl_loss and self.meter is not None:
            # The reference passes over the whole batch (all ranks together).
            self.meter.add_logprob_pass(batch.num_tokens, self._reference_params())
        if full_kl and self.meter is not None:
            # The teacher's decoder ran inside each training pass: once over the batch, 2 N_teacher.
            self.meter.add_logprob_pass(batch.num_tokens, self._teacher_params)
        if stats.problem is not None:
            raise _NonFiniteError(stats.problem)
        merged = merge_policy_stats(stats.parts)
        metrics.update(
            loss=stats.loss,
            policy_loss=stats.policy_loss,
            response_tokens=float(batch.response_mask.sum()),
            entropy=stats.entropy.mean,
            kl=stats.kl.mean,
            logprob_diff_vs_gen=stats.gen_diff.mean,
            logprob_diff_vs_gen_max=stats.gen_diff.max if stats.gen_diff.count else math.nan,
            logprob_mismatch=stats.mismatch.mean,
            logprob_mismatch_max=stats.mismatch.max if stats.mismatch.count else math.nan,
            logprob_mismatch_tokens=float(stats.mismatch.count),
            support_cut_mismatch_tokens=float(stats.support_mismatch),
            support_incomplete_tokens=float(stats.support_incomplete),
            # Keep Routing (docs/moe.md): share of (token, layer) pairs of the training passes where
            # the trainer's own top-k differs from the engine's recorded experts (NaN: no record).
            routing_mismatch=(stats.routing_mismatched / stats.routing_pairs if stats.routing_pairs
                              else math.nan),
            routing_pairs=float(stats.routing_pairs),
            routing_unrecorded_pairs=float(stats.routing_unrecorded),
            router_aux_loss=stats.router_aux if self.algo.router_aux_loss_coef > 0 else math.nan,
            micro_batches=float(stats.passes),
            padding_frac=1.0 - stats.real_tokens / stats.slot_tokens if stats.slot_tokens else 0.0,
            clip_frac_low=merged["clip_frac_low"],
            clip_frac_high=merged["clip_frac_high"],
            dual_clip_frac=merged["dual_clip_frac"],
            is_truncated_frac=merged["is_truncated_frac"],
            is_ratio_mean=merged["ratio_mean"],
            is_ratio_max=merged["ratio_max"],
            is_ratio_min=merged["ratio_min"],
            tis_weight_mean=merged["tis_weight_mean"],
            offpolicy_masked_frac=merged["dropped_frac"],
        )
        if full_kl:
            metrics["distill_reverse_kl"] = stats.distill_kl.mean

    def _problem(self, stats: _StepStats, what: str) -> None:
        """A non-finite value: ends the step here, or (lockstep) marks it bad for all ranks at the end."""
        if not self.collectives.lockstep:
            raise _NonFiniteError(what)
        stats.problem = what

    def _micro_batch_loss(
        self,
        mb: TrainBatch,
        w: Tensor,
        out: ResponseForward,
        ref_lp: Tensor | None,
        entropy_mode: EntropyMode,
        stats: _StepStats,
    ) -> Tensor | None:
        """The micro-batch's share of the step's loss (its statistics added to `stats`), or None
        after a non-finite value."""
        lp = out.logprobs
        if not _finite(lp.detach(), mb.response_mask):
            self._problem(stats, "non-finite policy log-probs")
            return None
        behaviour = mb.behavior_logprobs
        old = mb.old_logprobs if mb.old_logprobs is not None else behaviour
        keep_mask = None
        if self.algo.offpolicy_mask_delta is not None:
            keep_mask = off_policy_sequence_mask(
                lp.detach(), behaviour, mb.advantages, mb.response_mask, self.algo.offpolicy_mask_delta
            )
        per_token, token_stats = per_token_policy_loss(
            lp,
            old,
            mb.advantages,
            mb.response_mask,
            loss_type=self.algo.loss_type,
            eps_low=self.algo.eps_low,
            eps_high=self.algo.eps_high,
            eps_max=self.algo.eps_max,
            dual_clip_c=self.algo.dual_clip_c if self.algo.loss_type in ("grpo", "gspo") else None,
            behavior_logprobs=behaviour if self.algo.tis.enabled else None,
            tis_cap=self.algo.tis.cap if self.algo.tis.enabled else None,
            tis_level=self.algo.tis.level,
            keep_mask=keep_mask,
            kimi_tau=self.algo.kimi_tau if self.algo.loss_type == "kimi" else None,
        )
        policy_part = weighted_token_sum(per_token, w)
        loss = policy_part
        if ref_lp is not None:
            kl = kl_penalty(
                lp,
                ref_lp,
                self.algo.kl_estimator,
                old if self.algo.kl_estimator == "unbiased_k3" else None,
                mask=mb.response_mask,
            )
            coef = sample_kl_coefs(mb.tasks, len(mb), self.algo.kl_coef, self.algo.kl_coef_by_task)
            loss = loss + weighted_token_sum(kl * coef.to(kl)[:, None], w)
            stats.kl.add(kl, mb.response_mask)
        if out.entropy is not None:
            stats.entropy.add(out.entropy, mb.response_mask)
            if entropy_mode == "grad":
                loss = loss + entropy_bonus(out.entropy, w, self.algo.entropy_coef)
        if out.distill_kl is not None:
            # GKD's reverse KL over the vocabulary, aggregated like the policy loss
            stats.distill_kl.add(out.distill_kl.detach(), mb.response_mask)
            loss = loss + self.algo.distill.coef * weighted_token_sum(out.distill_kl, w)
        loss_value = float(loss.detach())
        if not math.isfinite(loss_value):
            self._problem(stats, "non-finite loss")
            return None
        stats.loss += loss_value
        stats.policy_loss += float(policy_part.detach())
        stats.parts.append(reduce_token_stats(token_stats))
        gap = (lp.detach() - behaviour).abs()
        stats.gen_diff.add(gap, mb.response_mask)
        stats.mismatch.add(gap, mb.response_mask & same_weights(mb, self.version)[:, None])
        if out.support_mismatch is not None and out.support_incomplete is not None:
            stats.support_mismatch += int((out.support_mismatch & mb.response_mask).sum())
            stats.support_incomplete += int((out.support_incomplete & mb.response_mask).sum())
        if out.routing is not None:
            stats.routing_pairs += out.routing.pairs
            stats.routing_mismatched += out.routing.mismatched
            stats.routing_unrecorded += out.routing.unrecorded
        return loss

    def _apply(self, batch: TrainBatch, metrics: dict[str, float]) -> None:
        """Clip, check, and take the optimizer and LR-schedule step."""
        params = [p for p in self.policy.model.parameters() if p.grad is not None]
        max_norm = self.optim_cfg.grad_clip if self.optim_cfg.grad_clip is not None else math.inf
        grad_norm = self.collectives.clip_grad_norm(params, max_norm)
        if not math.isfinite(grad_norm):
            raise _NonFiniteError("non-finite gradient norm")
        metrics["lr"] = self.scheduler.get_last_lr()[0]
        metrics["grad_norm"] = grad_norm
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.version += 1
        self.consecutive_bad_steps = 0
        metrics["batch_tokens"] = float(batch.num_tokens)
        if self.meter is not None:
            self.meter.add_training(batch.num_tokens, len(batch))

    def _bad_step(self, metrics: dict[str, float], reason: str) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        self.bad_steps += 1
        self.consecutive_bad_steps += 1
        metrics["skipped_nonfinite"] = 1.0
        metrics["loss"] = math.nan
        logger.warning("optimizer step skipped: %s (%d in a row)", reason, self.consecutive_bad_steps)
        if self.consecutive_bad_steps >= self.optim_cfg.max_consecutive_bad_steps:
            raise TrainingDivergedError(
                f"{self.consecutive_bad_steps} consecutive optimizer steps skipped (last: {reason}); "
                f"stopping (optim.max_consecutive_bad_steps={self.optim_cfg.max_consecutive_bad_steps}). "
                "Lower optim.lr, check the generator's log-probs, or resume from an earlier checkpoint."
            )

    def _batch_metrics(self, batch: TrainBatch, n_groups: int) -> dict[str, float]:
        """Statistics of everything the generator produced, before any filtering."""
        lengths = batch.response_lengths.double()
        reasons = batch.finish_reasons
        tokens = batch.token_mask
        lag = (self.version - batch.versions).double()[tokens]
        return {
            "batch_groups": float(n_groups),
            "batch_samples": float(len(batch)),
            "reward_mean": float(batch.rewards.double().mean()),
            "reward_std": float(batch.rewards.double().std()) if len(batch) > 1 else 0.0,
            "pass_rate": float(batch.correct.double().mean()),
            "response_length_mean": float(lengths.mean()),
            "response_length_max": float(lengths.max()),
            "truncation_rate": sum(r == "length" for r in reasons) / len(reasons),
            "interruption_rate": sum(r == "interrupted" for r in reasons) / len(reasons),
            "version_lag_mean": float(lag.mean()) if lag.numel() else 0.0,
            "version_lag_max": float(lag.max()) if lag.numel() else 0.0,
        }

    # -- weights and state -----------------------------------------------------------------------

    def weights_for_engine(self) -> dict[str, Tensor]:
        return self.policy.weights_for_engine()

    def state_dict(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "consecutive_bad_steps": self.consecutive_bad_steps,
            "bad_steps": self.bad_steps,
            "noop_steps": self.noop_steps,
            "advantages": self.advantages.state_dict(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.version = int(state["version"])
        self.consecutive_bad_steps = int(state.get("consecutive_bad_steps", 0))
        self.bad_steps = int(state.get("bad_steps", 0))
        self.noop_steps = int(state.get("noop_steps", 0))
        self.advantages.load_state_dict(state.get("advantages", {}))

    def save(
        self, run_dir: str | Path, step: int, extra: Mapping[str, Any] | None = None, keep: int | None = None,
        files: Mapping[str, Any] | None = None,
    ) -> Path:
        """Checkpoint the policy, optimizer, schedule, RNG, trainer counters, the advantage
        estimator's files (the critic's), the caller's `extra` (JSON) and `files` (name -> object
        for `torch.save`)."""
        return save_checkpoint(
            run_dir,
            step,
            model=self.policy.model,
            tokenizer=self.policy.tokenizer,
            optimizer=self.optimizer,
            scheduler=self.scheduler,
            trainer_state=self.state_dict(),
            extra=extra,
            keep=keep,
            extra_files=self.advantages.save,
            files=files,
        )

    def set_lr(self, lr: float) -> None:
        """Make `lr` the schedule's base learning rate (after `load`, whose optimizer and schedule
        state carry the saved one): the current step's rate becomes lr x the schedule's factor."""
        sched = self.scheduler
        sched.base_lrs = [lr for _ in sched.base_lrs]
        factors = [fn(sched.last_epoch) for fn in sched.lr_lambdas]
        for group, factor in zip(self.optimizer.param_groups, factors, strict=True):
            group["initial_lr"] = lr
            group["lr"] = lr * factor
        sched._last_lr = [group["lr"] for group in self.optimizer.param_groups]  # what get_last_lr() reports

    def load(self, path: str | Path, restore_rng: bool = True) -> CheckpointState:
        """Restore a checkpoint written by `save`; returns its step and the caller's extra state."""
        state = load_checkpoint(
            path,
            model=self.policy.model,
            optimizer=self.optimizer,
            scheduler=self.scheduler,
            restore_rng=restore_rng,
        )
        self.advantages.load(Path(path))
        self.load_state_dict(state.trainer)
        return state
