"""Helpers of the real-vLLM tests (a uniquely named module: every test directory has a conftest)."""

from __future__ import annotations

from pathlib import Path

import torch


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
