"""The embedded default: a character-level tokenizer and a tiny Qwen2 model built from a config.

With `num_experts > 0` the model is a Qwen2-MoE decoder instead (every layer a sparse MoE block:
`num_experts` routed experts of width `moe_intermediate_size`, `num_experts_per_tok` of them per
token, plus Qwen2-MoE's always-on shared expert of width `shared_expert_intermediate_size` behind
its sigmoid gate). The defaults (8 x 128, top-2, shared 128) run 2 x 128 + 128 = 384 hidden units
of MLP per token, the dense default's `intermediate_size`, so dense and MoE cost the same FLOPs.
Its router's load-balancing loss is not used: the trainer calls the decoder, not the causal-LM
head that adds `router_aux_loss_coef * aux_loss` to a supervised loss (docs/moe.md).

Nothing is downloaded. The tokenizer is a `PreTrainedTokenizerFast` (so everything that takes a
Hugging Face tokenizer takes it: chat templates, `save_pretrained`, `from_pretrained`), with one
token per printable ASCII character plus a few multi-character tokens that the synthetic tasks use
often (`<think>`, `</think>`, `\\boxed{`), which keeps sequences short enough for CPU training.
"""

from __future__ import annotations

import string
from dataclasses import dataclass

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import (
    PreTrainedModel,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen2MoeConfig,
    Qwen2MoeForCausalLM,
)

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
    """Size of the embedded default model (a Qwen2 decoder; Qwen2-MoE with `num_experts > 0`)."""

    hidden_size: int = 128
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 384
    max_position_embeddings: int = 1024
    tie_word_embeddings: bool = True
    num_experts: int = 0  # 0: dense
    num_experts_per_tok: int = 2
    moe_intermediate_size: int = 128
    shared_expert_intermediate_size: int = 128
    norm_topk_prob: bool = False  # Qwen2-MoE's default: top-k gate weights not renormalised

    def __post_init__(self) -> None:
        if self.num_experts < 0:
            raise ValueError(f"model.tiny.num_experts: must be >= 0 (0 = dense), got {self.num_experts}")
        if self.num_experts and not 1 <= self.num_experts_per_tok <= self.num_experts:
            raise ValueError(
                f"model.tiny.num_experts_per_tok: must be in [1, num_experts={self.num_experts}], "
                f"got {self.num_experts_per_tok}"
            )


def build_tiny_model(
    spec: TinyModelSpec | None = None,
    vocab_size: int | None = None,
    seed: int = 0,
) -> PreTrainedModel:
    """A randomly initialised tiny Qwen2 (or Qwen2-MoE) causal LM (deterministic from `seed`)."""
    import torch

    spec = spec or TinyModelSpec()
    tok_vocab = vocab_size if vocab_size is not None else len(build_tiny_tokenizer())
    common = dict(
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
        if not spec.num_experts:
            return Qwen2ForCausalLM(Qwen2Config(**common))
        config = Qwen2MoeConfig(
            **common,
            num_experts=spec.num_experts,
            num_experts_per_tok=spec.num_experts_per_tok,
            moe_intermediate_size=spec.moe_intermediate_size,
            shared_expert_intermediate_size=spec.shared_expert_intermediate_size,
            norm_topk_prob=spec.norm_topk_prob,
            decoder_sparse_step=1,
            mlp_only_layers=[],
            # The trainer never adds the load-balancing loss (module docstring); 0 says so in
            # the saved config.
            router_aux_loss_coef=0.0,
            output_router_logits=False,
        )
        return Qwen2MoeForCausalLM(config)
