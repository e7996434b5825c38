"""Model construction: the embedded tiny default and loading of any Hugging Face causal LM."""

from scalerl.models.tiny import (
    TINY_SPECIAL_TOKENS,
    TinyModelSpec,
    build_tiny_model,
    build_tiny_tokenizer,
)

__all__ = ["TINY_SPECIAL_TOKENS", "TinyModelSpec", "build_tiny_model", "build_tiny_tokenizer"]
