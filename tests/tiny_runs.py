"""The tiny model the end-to-end run tests train: one layer of width 32, warm-started for two SFT
steps on 60 synthetic prompts (seconds), cached in a folder of the calling test's own."""

from __future__ import annotations

from pathlib import Path

import pytest

TINY = {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1, "intermediate_size": 64,
        "max_position_embeddings": 256}


def warm_tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from scalerl.assembly.warm_start import warm_start_default
    from scalerl.config import RunConfig
    from scalerl.training.sft import SFTConfig

    base = RunConfig.model_validate({"model": {"tiny": TINY}, "data": {"synthetic": {"num_prompts": 60}}})
    return warm_start_default(base, SFTConfig(steps=2, batch_size=4), cache_dir=tmp_path_factory.mktemp("c"))
