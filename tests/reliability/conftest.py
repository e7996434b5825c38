from __future__ import annotations

from pathlib import Path

import pytest

from scalerl.assembly.warm_start import warm_start_default
from scalerl.config import RunConfig
from scalerl.training.sft import SFTConfig

from .helpers import TINY


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The tiny model after 2 SFT steps (a valid tokenizer and chat template; seconds to build)."""
    cache = tmp_path_factory.mktemp("warm")
    base = RunConfig.model_validate({"model": {"tiny": TINY}, "data": {"synthetic": {"num_prompts": 60}}})
    return str(warm_start_default(base, SFTConfig(steps=2, batch_size=4), cache_dir=Path(cache)))
