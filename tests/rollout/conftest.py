"""Fixtures for the rollout tests: tiny Qwen2 models with weights spread enough that greedy and
sampled outputs vary from token to token (the default 0.02 init makes every row nearly uniform)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

VOCAB = 64


def tiny_model(
    seed: int = 0,
    *,
    std: float = 0.3,
    dtype: torch.dtype = torch.float32,
    attn_implementation: str = "sdpa",
    sliding_window: int | None = None,
) -> Qwen2ForCausalLM:
    """A 2-layer, hidden-32 Qwen2 causal LM (vocabulary 64, eos 1, pad 0), deterministic in `seed`."""
    config = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=None,
        use_sliding_window=sliding_window is not None,
        sliding_window=sliding_window,
        max_window_layers=1,
    )
    config._attn_implementation = attn_implementation
    generator = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() == 2:
                param.normal_(0.0, std, generator=generator)
            elif name.endswith("bias"):
                param.normal_(0.0, 0.05, generator=generator)
    return model.to(dtype).eval()


@pytest.fixture
def make_model() -> Callable[..., Qwen2ForCausalLM]:
    return tiny_model
