"""The embedded default's warm start: which traces, which key, where cached (reads the run's config).

`warm_start_default(cfg)` is what `scalerl train` calls when no model is given: it SFTs the
embedded tiny model on the synthetic task's gold traces (`metadata["solution"]`), drawn apart from
the RL prompt set, and caches the result under `~/.cache/scalerl/sft/` (or `$SCALERL_CACHE_DIR/sft/`),
keyed by a hash of everything that determines it (`scalerl.training.sft` explains the procedure).
It reads the model, data, agentic and seed settings of a run, so it lives here, in the composition
root; the SFT loop, the example encoding and the cache helpers it calls are `scalerl.training.sft`'s.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path

import torch

from scalerl.config import DataConfig, ModelConfig, RunConfig
from scalerl.data.records import PromptRecord
from scalerl.data.synthetic import make_synthetic
from scalerl.data.tokenize import resolve_system_prompt
from scalerl.training.policy import load_policy
from scalerl.training.sft import (
    INFO_FILE,
    SFT_RECIPE_VERSION,
    SFTConfig,
    SFTExample,
    cache_root,
    content_digest,
    examples_from_records,
    file_lock,
    result_summary,
    save_sft_model,
    solution_pairs,
    train_sft,
)
from scalerl.training.threads import torch_threads

logger = logging.getLogger(__name__)


def system_prompt_of(data: DataConfig) -> str | None:
    """The system prompt RL prompts get (`data.system_prompt`, else the `<think>` one if asked)."""
    return resolve_system_prompt(data.think_system_prompt, data.system_prompt)


SFT_SEED_OFFSET = 7919


def default_sft_records(cfg: RunConfig) -> list[PromptRecord]:
    """Gold traces for the warm start, on problems the RL run never sees.

    Drawn from a separate seed stream of the synthetic task, minus every problem whose prompt text
    is in the RL prompt set (training pool and held-out split alike): warm-starting on the RL pool
    would let the model memorise its answers, leaving RL with all-correct (zero-variance) groups and
    the held-out curve with nothing to measure.
    """
    syn = cfg.data.synthetic
    # The same call as the RL prompt set (`assembly.build.load_records`) ...
    rl_prompts = {r.prompt for r in make_synthetic(syn.task, syn.num_prompts, syn.seed,
                                                   tuple(syn.difficulty), syn.weights)}
    # ... under another seed, on the warm start's own levels when it has them.
    if syn.warm_start_difficulty is None:
        levels, weights = tuple(syn.difficulty), syn.weights
    else:
        levels, weights = tuple(syn.warm_start_difficulty), None
    drawn = make_synthetic(syn.task, syn.num_prompts, syn.seed + SFT_SEED_OFFSET, levels, weights)
    return [r for r in drawn if r.prompt not in rl_prompts]


#: The warm start's own precision settings; the RL run's `model.dtype` / `model.fp32_lm_head` /
#: `model.gradient_checkpointing` are RL settings and do not change the starting model.
WARM_START_MODEL = {"dtype": "float32", "fp32_lm_head": True, "gradient_checkpointing": False}
#: Threads of the warm start's torch ops: fixed, so the cached weights do not depend on the machine.
WARM_START_THREADS = 1


#: `model.tiny` keys that only an MoE model (`num_experts > 0`) reads.
MOE_TINY_KEYS = ("num_experts", "num_experts_per_tok", "moe_intermediate_size",
                 "shared_expert_intermediate_size", "norm_topk_prob")


def warm_start_key(model: ModelConfig, sft: SFTConfig, examples: Sequence[SFTExample]) -> str:
    """Hash of everything the warm-started weights depend on: the tiny model's size and init seed,
    the SFT settings, the encoded examples and the torch version (no RL-only setting)."""
    dumped = model.model_dump(mode="json", include={"tiny", "init_seed"})
    if not model.tiny.num_experts:
        # The MoE keys join the digest only for an MoE model, so dense warm starts keep their key.
        for key in MOE_TINY_KEYS:
            dumped["tiny"].pop(key, None)
    return content_digest({
        "recipe": SFT_RECIPE_VERSION,
        "model": dumped,
        "sft": asdict(sft),
        # A mask joins the digest only where one is set, so mask-less warm starts keep their key.
        "examples": content_digest([[list(e.prompt_ids), list(e.response_ids),
                              *([list(e.response_mask)] if e.response_mask is not None else [])]
                             for e in examples]),
        "torch": torch.__version__.split("+")[0],
    })


def warm_start_default(
    cfg: RunConfig,
    sft: SFTConfig | None = None,
    *,
    records: Sequence[PromptRecord] | None = None,
    cache_dir: str | Path | None = None,
    on_step: Callable[[int, float], None] | None = None,
) -> Path:
    """Path of the SFT-warm-started tiny model for `cfg` (trained and cached on first use).

    `records` are the training prompts with gold `metadata["solution"]`; by default the synthetic
    task's training split. Only for the embedded default (`model.name_or_path` unset).
    """
    if cfg.model.name_or_path is not None:
        raise ValueError("warm_start_default: only for the embedded tiny model (model.name_or_path is set)")
    sft = sft or SFTConfig(seed=cfg.model.init_seed)
    policy = load_policy(cfg.model.model_copy(update=WARM_START_MODEL), device="cpu")
    sft_records = records if records is not None else default_sft_records(cfg)
    if cfg.agentic.environment is not None:
        # Agentic runs warm-start on a mix of tool-use and direct traces (cached under its own key).
        from scalerl.agentic.sft import agentic_examples

        examples = agentic_examples(cfg.agentic, cfg.seed, policy.tokenizer, sft_records, sft.max_length)
    else:
        pairs = solution_pairs(sft_records)
        examples = examples_from_records(pairs, policy.tokenizer, system_prompt_of(cfg.data), sft.max_length,
                                         cfg.data.template)
    key = warm_start_key(cfg.model, sft, examples)
    root = Path(cache_dir) if cache_dir is not None else cache_root() / "sft"
    target = root / f"tiny-{key[:16]}"
    if (target / INFO_FILE).is_file():
        return target
    with file_lock(root / f".tiny-{key[:16]}.lock"):
        if (target / INFO_FILE).is_file():  # another process finished it while we waited
            return target
        logger.info("SFT warm start of the tiny model (%d steps, cached at %s)", sft.steps, target)
        with torch_threads(WARM_START_THREADS):
            result = train_sft(policy, examples, sft, on_step)
        save_sft_model(policy, target, {"key": key, "sft": asdict(sft), **result_summary(result)})
    return target
