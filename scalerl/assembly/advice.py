"""Advice before a run on a real model: the keys still at the tiny model's defaults.

The built-in defaults are sized for the embedded default (a ~1M-parameter model on a short
synthetic task). A 0.5B-7B model trained with them learns badly or not at all and says nothing:
lr 1e-4 is ~100x what peers use, 160 new tokens cut most GSM8K chains before their answer (reward
0), and no checkpoint is written until the end. Nothing here changes the config; it names each key
and the usual value so the user decides (examples/ holds configs with real-model values).
"""

from __future__ import annotations

import json
from pathlib import Path

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


#: A local model narrower than this is a toy (the tiny default and the tests' models are 32-128 wide;
#: Qwen2.5-0.5B is 896): the tiny defaults suit it.
TOY_HIDDEN_SIZE = 512


def _is_toy(name_or_path: str) -> bool:
    config = Path(name_or_path) / "config.json"
    try:
        hidden = json.loads(config.read_text()).get("hidden_size")
    except (OSError, ValueError, AttributeError):
        return False  # a Hub id or an unreadable folder: a real model as far as advice goes
    return isinstance(hidden, int) and hidden < TOY_HIDDEN_SIZE


def tiny_default_advice(cfg: RunConfig) -> list[str]:
    """One line per key a named real model (`model.name_or_path` set, not a local toy narrower
    than `TOY_HIDDEN_SIZE`) still has at its tiny default."""
    if cfg.model.name_or_path is None or _is_toy(cfg.model.name_or_path):
        return []
    lines = []
    for key, (tiny, usual, why) in TINY_DEFAULTS.items():
        if _value(cfg, key) == tiny:
            lines.append(f"{key} is {tiny!r}, the tiny model's default; a real model usually wants {usual} "
                         f"({why})")
    return lines


__all__ = ["TINY_DEFAULTS", "tiny_default_advice"]
