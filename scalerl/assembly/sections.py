"""From the run's config to each component's own settings: the only place that picks sections.

Each function reads a `RunConfig` and returns what one component takes: the trainer's
`TrainerSettings`, the driver's `DriverSettings`, an engine's `EngineSpec`, the sampling parameters,
the prompt records. Components never see the whole config, so what a
component depends on is visible in its signature, and a test builds it from the sections it needs.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from scalerl.assembly.inputs import gold_free  # the one gold-free rule (re-exported here)
from scalerl.config import (
    GenerationConfig,
    ReasoningGymConfig,
    ReasoningGymDatasetConfig,
    RunConfig,
)
from scalerl.data import PromptRecord, load_prompts, make_synthetic
from scalerl.pipeline.driver import DriverSettings
from scalerl.rollout import InterruptionSpec, SamplingParams
from scalerl.rollout.factory import EngineSpec, spec_from_config
from scalerl.training.optim import scaled_optim
from scalerl.training.trainer import TrainerSettings

THINK_END = "</think>"

# A prime well above any study's seed offset (`generation.seed + i`, i < a few hundred), so the
# streams of (seed S, section seed G) and (seed S', section seed G') never coincide for S != S'.
RUN_SEED_STRIDE = 1_000_003


def stream_seed(run_seed: int, section_seed: int) -> int:
    """The seed of one RL random stream (rollout sampling, prompt order): the section's own seed
    offset by the run's, `section_seed + 1_000_003 * run_seed`.

    Why: `seed=S` must give another run (other rollouts, another data order), as a run's seed does
    in TRL and verl; before, only the held-out evaluation draws read `seed`, so two "seeds" of a run
    trained identically. Seed 0 leaves the section's seed as it is (runs and checkpoints of seed 0
    are unchanged), and a study that holds `seed` and moves `generation.seed` / `data.shuffle_seed`
    by the seed index (`scalerl.studies.study.seed_overrides`) still gets one stream per index.
    """
    return section_seed + RUN_SEED_STRIDE * run_seed


def run_generation(cfg: RunConfig) -> GenerationConfig:
    """The `generation` section the engines and the generator take: its sampling seed moved by the
    run's `seed` (`stream_seed`)."""
    return cfg.generation.model_copy(update={"seed": stream_seed(cfg.seed, cfg.generation.seed)})


def samples_per_step(cfg: RunConfig) -> int:
    """Samples per optimizer step: `pipeline.prompts_per_step * generation.n`."""
    return cfg.pipeline.prompts_per_step * cfg.generation.n


def trainer_settings(cfg: RunConfig) -> TrainerSettings:
    """The trainer's sections, with `optim.lr_scaling` applied for the run's batch."""
    return TrainerSettings(
        algorithm=cfg.algorithm,
        optim=scaled_optim(cfg.optim, samples_per_step(cfg)),
        temperature=cfg.generation.temperature,
        max_new_tokens=cfg.generation.max_new_tokens,
    )


def driver_settings(cfg: RunConfig) -> DriverSettings:
    """The driver's sections and limits."""
    return DriverSettings(
        pipeline=cfg.pipeline,
        generation=run_generation(cfg),
        rewards=cfg.rewards,
        eval=cfg.eval,
        max_steps=cfg.max_steps,
        max_time_s=cfg.max_time_s,
        checkpoint_every=cfg.checkpoint.every,
        dynamic_sampling=cfg.algorithm.dynamic_sampling,
        max_consecutive_dropped_groups=cfg.algorithm.max_consecutive_dropped_groups,
        max_consecutive_noop_steps=cfg.optim.max_consecutive_noop_steps,
        samples_every=cfg.logging.samples_every,
        samples_per_step=cfg.logging.samples_per_step,
    )


def engine_spec(
    cfg: RunConfig,
    *,
    model_path: str | None,
    eos_token_ids: tuple[int, ...],
    pad_token_id: int | None,
    initial_version: int = 0,
) -> EngineSpec:
    """The engine `generation` asks for, its length limit from `data.max_prompt_tokens`."""
    return spec_from_config(run_generation(cfg), cfg.model, max_prompt_tokens=cfg.data.max_prompt_tokens,
                            model_path=model_path, eos_token_ids=eos_token_ids, pad_token_id=pad_token_id,
                            initial_version=initial_version)


def sampling_params(config: RunConfig, tokenizer: Any) -> SamplingParams:
    """Training sampling parameters: `generation.*`, eos as stop token, forced interruption."""
    g = config.generation
    lc = g.length_control
    interruption = None
    if lc.kind == "interruption":
        lo, hi = lc.think_budget
        interruption = InterruptionSpec(
            think_budget_lo=lo,
            think_budget_hi=hi,
            answer_budget=lc.answer_budget,
            phrase_ids=tuple(tokenizer.encode(lc.phrase, add_special_tokens=False)),
            think_end_ids=tuple(tokenizer.encode(THINK_END, add_special_tokens=False)),
        )
    params = SamplingParams(
        n=g.n,
        temperature=g.temperature,
        top_p=g.top_p,
        top_k=g.top_k,
        max_new_tokens=g.max_new_tokens,
        stop_token_ids=(int(tokenizer.eos_token_id),),
        interruption=interruption,
    )
    return replace(params, return_support=config.algorithm.keep_sampling_mask and params.truncates_support,
                   support_max_ids=config.algorithm.keep_sampling_mask_max_ids)


def reasoning_gym_mix(source: str, rg: ReasoningGymConfig) -> dict[str, tuple[float, dict[str, Any]]]:
    """name -> (weight, options): `data.reasoning_gym.config` for "reasoning_gym:<name>", the
    `data.reasoning_gym.datasets` mix for "reasoning_gym"."""
    name = source.partition(":")[2]
    if name:
        return {name: (1.0, dict(rg.config))}
    out: dict[str, tuple[float, dict[str, Any]]] = {}
    for dataset, spec in rg.datasets.items():
        entry: ReasoningGymDatasetConfig = spec
        out[dataset] = (entry.weight, dict(entry.config))
    return out


def load_records(config: RunConfig) -> list[PromptRecord]:
    """The run's prompt set: `data.train_path`, `data.source` (reasoning-gym), a `verifiers:`
    environment's taskset, or the built-in synthetic task."""
    d = config.data
    on_error = d.on_bad_row
    if d.source is not None:
        from scalerl.data.rgym import make_reasoning_gym

        rg = d.reasoning_gym
        mix = reasoning_gym_mix(d.source, rg)
        # One generator: its name is data.source's, its options data.reasoning_gym.config.
        keys = {name: f"data.source={d.source} (options: data.reasoning_gym.config)"
                for name in mix} if ":" in d.source else None
        return make_reasoning_gym(mix, rg.size, rg.seed, keys)
    if d.train_path is not None:
        return load_prompts(d.train_path, field_map=d.field_map, default_task=d.default_task,
                            format=d.format, on_error=on_error, gold_free_tasks=gold_free(config),
                            subset=d.subset, split=d.split, keys=("data.subset", "data.split")).records
    env = config.agentic.environment
    if env is not None and env.startswith("verifiers:"):  # the environment's own dataset
        from scalerl.serving.verifiers_env import load_verifiers_env, taskset_records

        spec = load_verifiers_env(env[len("verifiers:"):], config.agentic.environment_args)
        return taskset_records(spec, d.default_task)
    s = d.synthetic
    # One call for every task: "math+code" caps the shared difficulty range at each task's own
    # levels (code has 5, math 8), so the default range (1, 6) is valid for the mix.
    return make_synthetic(s.task, s.num_prompts, s.seed, s.difficulty, s.weights)
