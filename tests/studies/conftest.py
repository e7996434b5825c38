"""A tiny warm-started model shared by the study tests that train for real (2 SFT steps, cached in a
temporary directory for the session)."""

from __future__ import annotations

import pytest
from study_helpers import TINY_OVERRIDES

from scalerl.assembly.warm_start import warm_start_default
from scalerl.config import load_config
from scalerl.training.sft import SFTConfig


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    cfg = load_config(overrides=TINY_OVERRIDES)
    return str(warm_start_default(cfg, SFTConfig(steps=2, batch_size=4),
                                  cache_dir=tmp_path_factory.mktemp("sft")))
