"""`resolved.json`: what a built run's components actually use, read back from the objects.

`config.yaml` says what was asked for; this file says what the trainer, its advantage estimator,
the prompt pool, the generator and the engine were built with, read from those objects after
`build_training` wired them (never from the `RunConfig`): the objective and its hyperparameters
as the trainer holds them, the advantage estimator's baseline and normalisation, the LM head's
precision in trainer and engine, the prompt pool's retirement rule and curriculum, the driver's
off-policy mode, staleness bound, dynamic sampling, length shaping and forced interruption; and
`data`, the prompt counts (the pool's training prompts, the usable ones, those left out by
`data.max_train_prompts`). A test
per recipe (tests/pipeline/test_recipes_resolved.py) checks every entry against the recipe's YAML,
so a wiring that drops a key shows here even where the key would not change a short run's numbers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from scalerl.atomic import write_json_atomic
from scalerl.data import PromptPool
from scalerl.pipeline.driver import Driver
from scalerl.rollout import Engine
from scalerl.training.critic import Critic
from scalerl.training.trainer import Trainer, kl_used

RESOLVED_FILE = "resolved.json"


def _objective(trainer: Trainer) -> dict[str, Any]:
    """The loss the trainer's step computes: `Trainer._micro_batch_loss` reads these from `algo`;
    the keys it ignores for the loss type are recorded as None, as it ignores them."""
    a = trainer.algo
    return {
        "loss_type": a.loss_type,
        "eps_low": a.eps_low if a.loss_type in ("grpo", "gspo") else None,
        "eps_high": a.eps_high if a.loss_type in ("grpo", "gspo") else None,
        "eps_max": a.eps_max if a.loss_type == "cispo" else None,
        "dual_clip_c": a.dual_clip_c if a.loss_type in ("grpo", "gspo") else None,
        "kimi_tau": a.kimi_tau if a.loss_type == "kimi" else None,
        "aggregation": a.aggregation,
        "entropy_coef": a.entropy_coef,
        "kl_coef": a.kl_coef,
        "kl_coef_by_task": dict(a.kl_coef_by_task) or None,
        "kl_estimator": a.kl_estimator if kl_used(a) else None,
        "kl_in_reward": a.kl_in_reward if a.kl_coef > 0 else None,
        "kl_reward_level": a.kl_reward_level if a.kl_coef > 0 and a.kl_in_reward else None,
        "tis": {"level": a.tis.level, "cap": a.tis.cap} if a.tis.enabled else None,
        "recompute_old_logprobs": a.recompute_old_logprobs,
        "offpolicy_mask_delta": a.offpolicy_mask_delta,
        "keep_sampling_mask": a.keep_sampling_mask,
        "keep_routing": a.keep_routing,
        "zero_variance_filter": a.zero_variance_filter,
        "temperature": trainer.temperature,
        "max_new_tokens": trainer.max_new_tokens,
    }


def _advantages(trainer: Trainer) -> dict[str, Any]:
    """The estimator object the step calls (`Trainer.advantages`), by what it holds."""
    est = trainer.advantages
    if isinstance(est, Critic):
        c = est.cfg
        return {"estimator": type(est).__name__, "baseline": "critic", "adv_norm": est.adv_norm,
                "gamma": c.gamma, "gae_lambda": c.gae_lambda, "value_lambda": c.value_lambda,
                "value_clip": c.value_clip, "critic_lr": est.lr, "updates_per_step": c.updates_per_step}
    return {"estimator": type(est).__name__, "baseline": getattr(est, "baseline", None),
            "adv_norm": getattr(est, "adv_norm", None)}


def _head(trainer: Trainer, engine: Engine) -> dict[str, Any]:
    policy = trainer.policy
    return {"dtype": policy.dtype, "trainer_fp32_lm_head": policy.fp32_lm_head,
            # vLLM has no such attribute: its head precision is its own (docs/vllm.md).
            "engine_fp32_lm_head": getattr(engine, "fp32_lm_head", None)}


def _pool(pool: PromptPool) -> dict[str, Any]:
    return {"no_positive_resampling": pool.no_positive_resampling,
            "retire_threshold": pool.retire_threshold,
            "curriculum": pool.curriculum.model_dump(mode="json")}


def _driver(driver: Driver) -> dict[str, Any]:
    gen = driver.generator
    params = gen.params
    shaping = getattr(gen.shaping, "__self__", None)  # the bound `LengthShaping.shape`, or None
    stop = params.interruption
    return {
        "off_policy": driver.settings.pipeline.off_policy,
        "batches": type(driver.batches).__name__,
        "max_lag": driver.controller.max_lag,
        "prompts_per_step": driver.batch_size,
        "dynamic_sampling": gen.sampling.enabled,
        "length_shaping": None if shaping is None else {
            "kind": shaping.kind, "kimi_coef": shaping.kimi_coef,
            "kimi_warmup_steps": shaping.kimi_warmup_steps, "overlong_cache": shaping.cache_length},
        "forced_interruption": None if stop is None else {
            "think_budget": [stop.think_budget_lo, stop.think_budget_hi],
            "answer_budget": stop.answer_budget},
        "sampling": {"n": params.n, "temperature": params.temperature, "top_p": params.top_p,
                     "top_k": params.top_k, "max_new_tokens": params.max_new_tokens,
                     "return_support": params.return_support},
    }


def resolved_settings(trainer: Any, pool: PromptPool, driver: Driver, engine: Engine) -> dict[str, Any]:
    """The record of `RESOLVED_FILE` (module docstring). The trainer's entries are read from a
    trainer of this process; the Ray backend's ranks live in other processes and are recorded as
    None (their settings are the payload `scalerl.distributed` sends them, not read back here)."""
    local = isinstance(trainer, Trainer)
    return {"trainer": type(trainer).__name__,
            "objective": _objective(trainer) if local else None,
            "advantages": _advantages(trainer) if local else None,
            "head": _head(trainer, engine) if local else None,
            "pool": _pool(pool), "driver": _driver(driver)}


def write_resolved(run_path: Path, trainer: Any, pool: PromptPool, driver: Driver, engine: Engine,
                   data: dict[str, Any] | None = None) -> Path:
    """Write `run_path/resolved.json` (atomically; rewritten by each session of the run). `data`:
    the prompt counts of the build (usable, left out by `data.max_train_prompts`); the number of
    training prompts is read from the pool itself."""
    record = resolved_settings(trainer, pool, driver, engine)
    record["data"] = {**(data or {}), "training_prompts": len(pool)}
    return write_json_atomic(run_path / RESOLVED_FILE, record)
