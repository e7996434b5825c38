"""The embedded default: a character-level tokenizer and a tiny Qwen2 model built from a config.

Nothing is downloaded. The tokenizer is a `PreTrainedTokenizerFast` (so everything that takes a
Hugging Face tokenizer takes it: chat templates, `save_pretrained`, `from_pretrained`), with one
token per printable ASCII character plus a few multi-character tokens that the synthetic tasks use
often (`<think>`, `</think>`, `\\boxed{`), which keeps sequences short enough for CPU training.
"""

from __future__ import annotations

import string
from dataclasses import dataclass

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

PAD, EOS, SYSTEM, USER, ASSISTANT, UNK = (
    "<|pad|>",
    "<|end|>",
    "<|system|>",
    "<|user|>",
    "<|assistant|>",
    "<|unk|>",
)
TINY_SPECIAL_TOKENS: tuple[str, ...] = (PAD, EOS, SYSTEM, USER, ASSISTANT, UNK)
# Not special: they must survive `decode(skip_special_tokens=True)` because verifiers read them.
TINY_WORD_TOKENS: tuple[str, ...] = ("<think>", "</think>", "\\boxed{", "```python\n", "```")

# A chat template in the Hugging Face jinja format; `add_generation_prompt` opens the assistant turn.
TINY_CHAT_TEMPLATE = (
    "{% for m in messages %}"
    "{% if m['role'] == 'system' %}" + SYSTEM + "{{ m['content'] }}"
    "{% elif m['role'] == 'user' %}" + USER + "{{ m['content'] }}"
    "{% else %}" + ASSISTANT + "{{ m['content'] }}" + EOS + "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}" + ASSISTANT + "{% endif %}"
)


def _char_vocab() -> list[str]:
    printable = [c for c in string.printable if c not in "\r\x0b\x0c"]
    return list(TINY_SPECIAL_TOKENS) + list(TINY_WORD_TOKENS) + printable


def build_tiny_tokenizer(pad_to: int | None = None) -> PreTrainedTokenizerFast:
    """Character-level tokenizer (vocabulary ~110) with a chat template and `<think>` tokens.

    `pad_to` extends the vocabulary with unused placeholder tokens (`<|unused_N|>`, never produced by
    encoding, decoded as themselves) up to that size: for a random-init model with a real config's
    embedding (e.g. 151,936 rows), so that every id it can sample decodes.
    """
    pieces = _char_vocab()
    if pad_to is not None:
        if pad_to < len(pieces):
            raise ValueError(f"pad_to: {pad_to} is below the base vocabulary ({len(pieces)})")
        pieces += [f"<|unused_{i}|>" for i in range(pad_to - len(pieces))]
    vocab = {tok: i for i, tok in enumerate(pieces)}
    core = Tokenizer(models.WordLevel(vocab, unk_token=UNK))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    core.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token=PAD,
        eos_token=EOS,
        unk_token=UNK,
        additional_special_tokens=[SYSTEM, USER, ASSISTANT],
    )
    # Added tokens are matched before pre-tokenization, so "</think>" is one token, not eight chars.
    tok.add_tokens(list(TINY_WORD_TOKENS))
    tok.chat_template = TINY_CHAT_TEMPLATE
    return tok


@dataclass(frozen=True)
class TinyModelSpec:
    """Size of the embedded default model (a Qwen2 decoder)."""

    hidden_size: int = 128
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 384
    max_position_embeddings: int = 1024
    tie_word_embeddings: bool = True


def build_tiny_model(
    spec: TinyModelSpec | None = None,
    vocab_size: int | None = None,
    seed: int = 0,
) -> Qwen2ForCausalLM:
    """A randomly initialised tiny Qwen2 causal LM (deterministic from `seed`)."""
    import torch

    spec = spec or TinyModelSpec()
    tok_vocab = vocab_size if vocab_size is not None else len(build_tiny_tokenizer())
    config = Qwen2Config(
        vocab_size=tok_vocab,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        max_position_embeddings=spec.max_position_embeddings,
        tie_word_embeddings=spec.tie_word_embeddings,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=None,
        use_cache=True,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    return model
