"""Advice before a run on a real model: the keys still at the tiny model's defaults.

The built-in defaults are sized for the embedded default (a ~1M-parameter model on a short
synthetic task). A 0.5B-7B model trained with them learns badly or not at all and says nothing:
lr 1e-4 is ~100x what peers use, 160 new tokens cut most GSM8K chains before their answer (reward
0), and no checkpoint is written until the end. Nothing here changes the config; it names each key
and the usual value so the user decides (examples/ holds configs with real-model values).
"""

from __future__ import annotations

from scalerl.config import RunConfig

#: key -> (the tiny default, what peers use for 0.5B-7B models, why it matters)
TINY_DEFAULTS: dict[str, tuple[object, str, str]] = {
    "optim.lr": (1e-4, "~1e-6", "TRL's and verl's GRPO examples for 0.5B-7B models"),
    "model.dtype": ("float32", "bfloat16", "half the memory; the LM head stays float32 (model.fp32_lm_head)"),
    "generation.max_new_tokens": (160, "1024 or more", "reasoning chains cut short earn no reward"),
    "data.max_prompt_tokens": (256, "512 or more", "longer prompts are refused (or skipped)"),
    "checkpoint.every": (0, "e.g. 50", "0 writes a checkpoint only at the end"),
}


def _value(cfg: RunConfig, dotted: str) -> object:
    node: object = cfg
    for part in dotted.split("."):
        node = getattr(node, part)
    return node


def tiny_default_advice(cfg: RunConfig) -> list[str]:
    """One line per key a named model (`model.name_or_path` set) still has at its tiny default."""
    if cfg.model.name_or_path is None:
        return []
    lines = []
    for key, (tiny, usual, why) in TINY_DEFAULTS.items():
        if _value(cfg, key) == tiny:
            lines.append(f"{key} is {tiny!r}, the tiny model's default; a real model usually wants {usual} "
                         f"({why})")
    return lines


__all__ = ["TINY_DEFAULTS", "tiny_default_advice"]
