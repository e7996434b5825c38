"""The critic: a value model beside the policy, GAE advantages, and its own optimizer step.

PPO with a learned value function, as Open-Reasoner-Zero runs it on reasoning tasks (Hu et al.
2025, arXiv 2503.24290, §2.2: GAE with gamma = lambda = 1, no KL, a critic initialised from the
same base model), with VAPO's options (Yue et al. 2025, arXiv 2504.05118, §4.1-4.2: a separate
lambda for the value targets, a length-adaptive lambda for the policy).

`ValueModel` is a causal LM's backbone with its LM head replaced by a scalar head, so `V(s_t)` is
read at the position whose logits predict response token `t` (the state before the token is
emitted). The trainer computes every value (`estimate`, no gradient) and trains the critic
(`update`); the engine never sees it, so every pipeline mode works unchanged. The critic is one
process's model: a sharded trainer has no critic (a config error, `scalerl.config.RunConfig`).

Checkpoints: `save(directory)` writes `critic/` (weights, optimizer, schedule) into the trainer's
checkpoint directory, and `state_dict()` its counters into the trainer's state.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from scalerl.algorithms.advantages import masked_whiten
from scalerl.algorithms.aggregation import token_weights, weighted_token_sum
from scalerl.algorithms.returns import gae_advantages, length_adaptive_lambda, token_rewards
from scalerl.algorithms.value import explained_variance, value_loss
from scalerl.config import AlgorithmConfig, CriticConfig, ModelConfig, OptimConfig
from scalerl.models.lm_head import decoder_of
from scalerl.models.lora import base_copy, own_adapter_like
from scalerl.telemetry.compute import ComputeMeter, flop_params
from scalerl.training.batch import TrainBatch
from scalerl.training.forward import TokenLayout
from scalerl.training.optim import build_optimizer, build_scheduler
from scalerl.training.packing import MicroBatching, check_packed_attention, response_states, row_lengths
from scalerl.training.policy import Policy, load_model

logger = logging.getLogger(__name__)

CRITIC_DIR = "critic"
CRITIC_ADAPTER_SEED = 0x0C417  # offsets a LoRA critic's adapter init from the policy's
ADV_EPS = 1e-6


class CriticDivergedError(RuntimeError):
    """Too many consecutive critic updates had a non-finite loss or gradient."""


class ValueModel(nn.Module):
    """`V(s_t)` for every response token of a batch: a causal LM backbone and a scalar head.

    The head starts at zero, so the first values are 0 and the first advantages are the returns
    (the backbone's features are the policy's own; only the head has to be learned first). The head
    runs in float32 whatever the backbone's precision.
    """

    def __init__(self, backbone: nn.Module, hidden_size: int) -> None:
        super().__init__()
        self.backbone = backbone
        self.head = nn.Linear(hidden_size, 1)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    @classmethod
    def from_causal_lm(cls, lm: nn.Module) -> ValueModel:
        """The backbone of `lm` (its LM head dropped) with a fresh value head."""
        config = getattr(lm, "config", None)
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        hidden = getattr(text, "hidden_size", None)
        if not isinstance(hidden, int):
            raise TypeError(f"{type(lm).__name__}: its config has no integer hidden_size for a value head")
        backbone = decoder_of(lm)
        # The model's own device (and float32 master weights, as the policy's).
        device = next(lm.parameters()).device
        return cls(backbone, hidden).to(device)

    def get_input_embeddings(self) -> nn.Module:
        # For `flop_params`: the embedding lookup does no matmul work.
        return self.backbone.get_input_embeddings()

    def forward(self, batch: TokenLayout, packed: bool = False) -> Tensor:
        """Values `[n, T]` (float32) at the response positions of `batch`; arbitrary at padding.
        `packed`: the backbone runs on the real tokens packed into one sequence (`training.packing`)."""
        hidden = response_states(self.backbone, batch, packed=packed)
        return self.head(hidden.float()).squeeze(-1)


def critic_lm(policy: Policy, critic: CriticConfig, model_cfg: ModelConfig | None = None) -> nn.Module:
    """The causal LM the critic is built from: `critic.model`, or a copy of the policy's starting
    weights (its reference factory; a copy of the current weights when it has none). A LoRA
    policy's critic is LoRA too (`lora_critic`)."""
    lm = _critic_base(policy, critic, model_cfg)
    return lora_critic(policy, lm) if policy.lora else lm


def lora_critic(policy: Policy, lm: nn.Module) -> nn.Module:
    """`lm` with a LoRA adapter of its own (the policy's rank, alpha, dropout and targets; A drawn
    from `CRITIC_ADAPTER_SEED` + the process's initial seed, so runs of one seed agree): its base is
    frozen, only the adapter and the value head train.

    Its own adapter on its own copy of the base, not a second adapter on the policy's model: the
    policy's passes, its KL reference (adapter disabled) and the critic's passes then never switch
    peft's active adapter under one another (peft's `set_adapter` also changes which parameters
    require gradients), and each model keeps its own optimizer over its own tensors. The price is
    one more frozen copy of the base in memory (no gradients, no optimizer state): a full-weight
    critic holds that copy plus its gradients and two AdamW moments, about 4x the base's size, a
    LoRA critic about 1x plus its adapter."""
    return own_adapter_like(policy.model, lm, seed=CRITIC_ADAPTER_SEED + torch.initial_seed())


def _critic_base(policy: Policy, critic: CriticConfig, model_cfg: ModelConfig | None) -> nn.Module:
    if critic.model is not None:
        lm = load_model(ModelConfig(name_or_path=critic.model,
                                    dtype=model_cfg.dtype if model_cfg else "float32"), policy.device)
        rows = lm.get_input_embeddings().weight.shape[0]
        if len(policy.tokenizer) > rows:
            raise ValueError(
                f"algorithm.critic.model: {critic.model} has {rows} embedding rows but the policy's "
                f"tokenizer has {len(policy.tokenizer)} tokens; the critic reads the policy's token ids"
            )
        return lm
    if policy.lora:
        return base_copy(policy.model)  # the frozen base is the starting weights
    if policy.reference_factory is not None:
        return policy.reference_factory().to(policy.device)
    return copy.deepcopy(policy.model)


def _vocab_rows(model: ValueModel) -> int:
    return int(model.get_input_embeddings().weight.shape[0])


class Critic:
    """`baseline: critic` (module docstring). An `AdvantageEstimator` (`training.advantage`)."""

    def __init__(
        self,
        model: ValueModel,
        critic: CriticConfig,
        algorithm: AlgorithmConfig,
        optim: OptimConfig,
        *,
        autocast: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext,
        meter: ComputeMeter | None = None,
    ) -> None:
        if algorithm.adv_norm == "group":
            raise ValueError("algorithm.adv_norm: 'group' needs a group baseline; use 'batch' or 'none'")
        self.model = model
        self.cfg = critic
        self.adv_norm = algorithm.adv_norm
        self.optim_cfg = optim
        self.batching = MicroBatching.from_optim(optim)
        if self.batching.packed:
            check_packed_attention(model.backbone, _vocab_rows(model), self.device)
        self.lr = critic.lr_scale * optim.lr
        self.optimizer = build_optimizer(model, optim.model_copy(update={"lr": self.lr}))
        self.scheduler = build_scheduler(self.optimizer, optim.warmup_steps)
        self.autocast = autocast
        self.meter = meter
        self.n_params = flop_params(model)
        # A LoRA critic (`lora_critic`) trains its adapter and head only: 4N + 2 N_trainable a token.
        trainable = flop_params(model, trainable_only=True)
        self.n_trainable = trainable if trainable < self.n_params else None
        self.steps = 0
        self.bad_steps = 0
        self.consecutive_bad_steps = 0
        self._pending: tuple[Tensor, Tensor] | None = None  # (old values, returns) of the last estimate

    @classmethod
    def for_policy(
        cls,
        policy: Policy,
        algorithm: AlgorithmConfig,
        optim: OptimConfig,
        *,
        meter: ComputeMeter | None = None,
        model_cfg: ModelConfig | None = None,
    ) -> Critic:
        value_model = ValueModel.from_causal_lm(critic_lm(policy, algorithm.critic, model_cfg))
        value_model.train()
        return cls(value_model, algorithm.critic, algorithm, optim, autocast=policy.autocast, meter=meter)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    # -- values and advantages -------------------------------------------------------------------

    @torch.no_grad()
    def values(self, batch: TrainBatch) -> Tensor:
        """`V(s_t)` `[N, T]` of every response token (float32, CPU), micro-batched; 0 at padding."""
        out = torch.zeros(batch.response_mask.shape, dtype=torch.float32)
        for rows in self.batching.plan(row_lengths(batch)):
            mb = batch.select(rows).to(self.device)
            with self.autocast():
                v = self.model(mb, packed=self.batching.packed)
            out[rows, : v.shape[1]] = torch.where(mb.token_mask, v, 0.0).float().cpu()
        if self.meter is not None:
            self.meter.add_logprob_pass(batch.num_tokens, self.n_params)
        return out

    def _lambdas(self, mask: Tensor) -> tuple[float | Tensor, float | Tensor]:
        """(lambda of the policy's advantages, lambda of the value targets)."""
        c = self.cfg
        policy_lam: float | Tensor = c.gae_lambda
        if c.length_adaptive_alpha is not None:
            policy_lam = length_adaptive_lambda(mask.sum(dim=-1), c.length_adaptive_alpha).float()
        value_lam = c.value_lambda if c.value_lambda is not None else policy_lam
        return policy_lam, value_lam

    def estimate(
        self, batch: TrainBatch, rewards: Tensor, token_penalty: Tensor | None
    ) -> tuple[Tensor, dict[str, float]]:
        """GAE advantages `[N, T]` from the critic's values of `batch` (and the value targets,
        kept for `update`)."""
        mask = batch.response_mask
        values = self.values(batch)
        if not bool(torch.isfinite(values[mask]).all()):
            # The trainer skips and counts the step (a critic gone bad stops the run after
            # optim.max_consecutive_bad_steps such steps).
            raise FloatingPointError("non-finite critic values")
        step_rewards = token_rewards(rewards.float(), mask, token_penalty)
        policy_lam, value_lam = self._lambdas(mask)
        adv, returns = gae_advantages(step_rewards, values, mask, self.cfg.gamma, policy_lam)
        if value_lam is not policy_lam:
            _, returns = gae_advantages(step_rewards, values, mask, self.cfg.gamma, value_lam)
        self._pending = (values, returns)
        if self.adv_norm == "batch":
            adv = masked_whiten(adv, mask, ADV_EPS)
        m = mask
        return adv, {
            "value_mean": float(values[m].double().mean()) if bool(m.any()) else math.nan,
            "return_mean": float(returns[m].double().mean()) if bool(m.any()) else math.nan,
            "value_explained_variance": explained_variance(values, returns, m),
        }

    # -- the critic's own step -------------------------------------------------------------------

    def update(self, batch: TrainBatch) -> dict[str, float]:
        """`critic.updates_per_step` AdamW steps on the clipped value loss (token mean over the
        batch) against the targets of the last `estimate` of this batch. A non-finite loss or
        gradient skips that update (counted; `optim.max_consecutive_bad_steps` in a row raise)."""
        if self._pending is None or self._pending[0].shape != batch.response_mask.shape:
            raise RuntimeError("Critic.update: call estimate() on this batch first")
        old_values, returns = self._pending
        self._pending = None
        mask = batch.response_mask
        weights = token_weights(mask, aggregation="token")
        metrics: dict[str, float] = {}
        for _ in range(self.cfg.updates_per_step):
            metrics = self._one_update(batch, old_values, returns, weights)
        metrics["critic_lr"] = self.scheduler.get_last_lr()[0]
        metrics["critic_bad_steps_total"] = float(self.bad_steps)
        return metrics

    def _one_update(
        self, batch: TrainBatch, old_values: Tensor, returns: Tensor, weights: Tensor
    ) -> dict[str, float]:
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        total, clipped, tokens = 0.0, 0, 0
        problem = None
        for rows in self.batching.plan(row_lengths(batch)):
            mb = batch.select(rows).to(self.device)
            width = mb.response_width
            with self.autocast():
                v = self.model(mb, packed=self.batching.packed)
            per_token, active = value_loss(
                v, old_values[rows, :width].to(self.device), returns[rows, :width].to(self.device),
                mb.response_mask, self.cfg.value_clip,
            )
            loss = weighted_token_sum(per_token, weights[rows, :width].to(self.device))
            value = float(loss.detach())
            if not math.isfinite(value):
                problem = "non-finite value loss"
                break
            loss.backward()
            total += value
            clipped += int(active.sum())
            tokens += int(mb.response_mask.sum())
        grad_norm = math.nan
        if problem is None:
            params = [p for p in self.model.parameters() if p.grad is not None]
            max_norm = self.optim_cfg.grad_clip if self.optim_cfg.grad_clip is not None else math.inf
            grad_norm = float(torch.nn.utils.clip_grad_norm_(params, max_norm))
            if not math.isfinite(grad_norm):
                problem = "non-finite critic gradient norm"
        if problem is not None:
            self.optimizer.zero_grad(set_to_none=True)
            self._bad_update(problem)
            return {"value_loss": math.nan, "critic_skipped_nonfinite": 1.0}
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.steps += 1
        self.consecutive_bad_steps = 0
        if self.meter is not None:
            self.meter.add_auxiliary_training(batch.num_tokens, self.n_params, self.n_trainable)
        return {
            "value_loss": total,
            "value_clip_frac": clipped / tokens if tokens else 0.0,
            "critic_grad_norm": grad_norm,
            "critic_skipped_nonfinite": 0.0,
        }

    def _bad_update(self, reason: str) -> None:
        self.bad_steps += 1
        self.consecutive_bad_steps += 1
        logger.warning("critic update skipped: %s (%d in a row)", reason, self.consecutive_bad_steps)
        if self.consecutive_bad_steps >= self.optim_cfg.max_consecutive_bad_steps:
            raise CriticDivergedError(
                f"{self.consecutive_bad_steps} consecutive critic updates skipped (last: {reason}); stopping "
                f"(optim.max_consecutive_bad_steps={self.optim_cfg.max_consecutive_bad_steps}). Lower "
                "algorithm.critic.lr_scale or optim.lr, or resume from an earlier checkpoint."
            )

    # -- state -----------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return {
            "steps": self.steps,
            "bad_steps": self.bad_steps,
            "consecutive_bad_steps": self.consecutive_bad_steps,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.steps = int(state.get("steps", 0))
        self.bad_steps = int(state.get("bad_steps", 0))
        self.consecutive_bad_steps = int(state.get("consecutive_bad_steps", 0))

    def save(self, directory: Path) -> None:
        """`directory/critic/`: `model.safetensors`, `optimizer.pt`, `scheduler.pt`."""
        out = Path(directory) / CRITIC_DIR
        out.mkdir()
        state = {k: v.detach().contiguous().cpu() for k, v in self.model.state_dict().items()}
        save_file(state, str(out / "model.safetensors"))
        torch.save(self.optimizer.state_dict(), out / "optimizer.pt")
        torch.save(self.scheduler.state_dict(), out / "scheduler.pt")

    def load(self, directory: Path) -> None:
        src = Path(directory) / CRITIC_DIR
        if not (src / "model.safetensors").is_file():
            raise FileNotFoundError(
                f"{directory}: the checkpoint has no critic ({CRITIC_DIR}/model.safetensors); it was not "
                "written by a run with algorithm.baseline: critic"
            )
        self.model.load_state_dict(load_file(str(src / "model.safetensors")))
        optimizer = torch.load(src / "optimizer.pt", map_location=self.device, weights_only=True)
        self.optimizer.load_state_dict(optimizer)
        self.scheduler.load_state_dict(torch.load(src / "scheduler.pt", weights_only=True))
