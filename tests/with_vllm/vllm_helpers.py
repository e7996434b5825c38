"""Helpers of the real-vLLM tests (a uniquely named module: every test directory has a conftest)."""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[2]


def vllm_device() -> str:
    from vllm.platforms import current_platform

    return str(current_platform.device_type)


def save_tiny(path: Path, seed: int, *, std: float = 0.1, num_layers: int = 2, tied: bool = True) -> Path:
    """A tiny Qwen2 (hidden 128, 4 heads of 32, 2 kv heads) with weights spread enough that greedy
    and sampled tokens vary, and the tiny default's char tokenizer, saved to `path`."""
    from dataclasses import replace

    from scalerl.models.tiny import TinyModelSpec, build_tiny_model, build_tiny_tokenizer

    tok = build_tiny_tokenizer()
    spec = replace(TinyModelSpec(), num_layers=num_layers, intermediate_size=256,
                   max_position_embeddings=512, tie_word_embeddings=tied)
    model = build_tiny_model(spec, vocab_size=len(tok), seed=seed)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() == 2:
                param.normal_(0.0, std, generator=generator)
            elif name.endswith("bias"):
                param.normal_(0.0, 0.05, generator=generator)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def digit_share(completion: str, record: object) -> float:
    """A dense verifier a random tiny model can learn in a few steps: the share of digits among the
    completion's characters (about 10 of the tiny tokenizer's ~108 tokens are digits)."""
    return sum(ch.isdigit() for ch in completion) / len(completion) if completion else 0.0


def _bench_real_shape() -> Any:
    """`benchmarks/bench_real_shape.py`, imported from its file (its model builder is reused)."""
    name = "bench_real_shape"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclasses resolve their annotations through sys.modules
    spec.loader.exec_module(module)
    return module


def save_real_shape(path: Path, *, layers: int = 2, init_std: float | None = None, seed: int = 0) -> Path:
    """A random-init Qwen2 with Qwen2.5-0.5B's layer shape (hidden 896, 14 heads of 64, 2 KV heads,
    MLP 4864, tied embeddings) and vocabulary 151,936, `layers` layers, and the tiny char tokenizer
    padded to that vocabulary, saved to `path` (`bench_real_shape.save_model`; nothing downloaded)."""
    bench = _bench_real_shape()
    shape = bench.Shape(**{**asdict(bench.QWEN25_05B), "layers": layers})
    bench.save_model(shape, path, seed=seed, init_std=init_std)
    return path


@contextmanager
def local_ray(*paths: Path) -> Iterator[Any]:
    """A local Ray of 4 CPUs whose workers import from `paths` (then this PYTHONPATH), one torch
    thread each and vLLM in-process (no engine-core subprocess per actor); shut down on exit."""
    import ray

    path = os.pathsep.join([*map(str, paths), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env = {"PYTHONPATH": path, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
           "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False, runtime_env={"env_vars": env})
    try:
        yield ray
    finally:
        ray.shutdown()
