"""Loading a saved tokenizer exactly as it was saved."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

GENERIC_TOKENIZER_CLASSES = ("TokenizersBackend", "PreTrainedTokenizerFast")


def _saved_generic_tokenizer(source: str) -> bool:
    config = Path(source) / "tokenizer_config.json"
    if not config.is_file():
        return False
    return json.loads(config.read_text()).get("tokenizer_class") in GENERIC_TOKENIZER_CLASSES


def load_pretrained_tokenizer(source: str) -> Any:
    """`AutoTokenizer.from_pretrained`, except for generic saved tokenizers (e.g. the tiny default).

    transformers 5's AutoTokenizer picks the tokenizer class registered for the model type (Qwen2
    for the tiny default) and rebuilds its byte-level pre-tokenizer, which drops the spaces that a
    char-level vocabulary encodes; a tokenizer saved as a generic `tokenizer.json` is loaded as is.
    """
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    if _saved_generic_tokenizer(source):
        return PreTrainedTokenizerFast.from_pretrained(source)
    return AutoTokenizer.from_pretrained(source)
