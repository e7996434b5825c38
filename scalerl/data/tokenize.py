"""Prompt token ids: the chat template applied through the tokenizer, and the prompt-length check.

A prompt longer than the context budget would be truncated or crash the engine mid-run; checking
every prompt once, up front, turns that into a counted rejection that names the record.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from scalerl.data.records import PromptRecord
from scalerl.data.rejects import DataError, OnError, RejectLog, check_on_error, settle

# The `<think>` option: ask for reasoning inside <think></think> and the final answer in \boxed{}.
THINK_SYSTEM_PROMPT = (
    "Think step by step inside <think> and </think>, then give the final answer in \\boxed{}."
)


def resolve_system_prompt(think_system_prompt: bool = False, system_prompt: str | None = None) -> str | None:
    """The system prompt a run uses: a custom one if given, else the `<think>` one if asked, else none."""
    if system_prompt is not None and not system_prompt.strip():
        raise ValueError("system_prompt: empty; leave it unset for no system prompt")
    if system_prompt is not None:
        return system_prompt
    return THINK_SYSTEM_PROMPT if think_system_prompt else None


def _where(record: PromptRecord) -> str:
    return record.source or f"prompt {record.id!r}"


def _token_ids(encoded: Any, record: PromptRecord) -> list[int]:
    # transformers 5 returns a BatchEncoding (a Mapping) from apply_chat_template(tokenize=True);
    # older versions and `return_dict=False` return the id list itself.
    ids = encoded["input_ids"] if isinstance(encoded, Mapping) else encoded
    if hasattr(ids, "tolist"):
        ids = ids.tolist()
    if ids and isinstance(ids[0], (list, tuple)):
        if len(ids) != 1:
            raise DataError(f"{_where(record)}: chat template returned {len(ids)} sequences for one prompt")
        ids = ids[0]
    return [int(i) for i in ids]


def encode_prompt(record: PromptRecord, tokenizer: Any, system_prompt: str | None = None) -> list[int]:
    """Token ids of `record` as a chat, with the generation prompt (assistant turn) opened."""
    if not getattr(tokenizer, "chat_template", None):
        raise DataError(
            f"{_where(record)}: the tokenizer has no chat template; set `tokenizer.chat_template` "
            "or use a chat/instruct model's tokenizer"
        )
    encoded = tokenizer.apply_chat_template(
        record.chat(system_prompt), add_generation_prompt=True, tokenize=True
    )
    return _token_ids(encoded, record)


@dataclass
class EncodedPrompts:
    """Records that fit the prompt budget, their token ids by record id, and those rejected."""

    records: list[PromptRecord]
    token_ids: dict[str, list[int]]
    rejects: RejectLog = field(default_factory=RejectLog)

    def __len__(self) -> int:
        return len(self.records)

    def ids_for(self, records: Sequence[PromptRecord]) -> list[list[int]]:
        return [self.token_ids[r.id] for r in records]


def encode_prompts(
    records: Iterable[PromptRecord],
    tokenizer: Any,
    *,
    max_prompt_tokens: int,
    system_prompt: str | None = None,
    on_error: OnError = "error",
) -> EncodedPrompts:
    """Encode every record; prompts over `max_prompt_tokens` (or that the template rejects) are bad rows.

    With `on_error="error"` a `DataError` lists every bad prompt with its file:line; with "skip"
    they are dropped and counted in `EncodedPrompts.rejects`.
    """
    on_error = check_on_error(on_error)
    if max_prompt_tokens <= 0:
        raise ValueError(f"max_prompt_tokens: must be positive, got {max_prompt_tokens}")
    kept: list[PromptRecord] = []
    token_ids: dict[str, list[int]] = {}
    rejects = RejectLog()
    for record in records:
        try:
            ids = encode_prompt(record, tokenizer, system_prompt)
        except DataError:
            raise  # a tokenizer problem, not a row problem: every row would fail the same way
        except Exception as err:  # jinja raises TemplateError for e.g. an unsupported role order
            rejects.add("chat template error", _where(record), f"{type(err).__name__}: {err}")
            continue
        if len(ids) > max_prompt_tokens:
            rejects.add(
                "prompt too long", _where(record),
                f"{len(ids)} tokens > max_prompt_tokens={max_prompt_tokens}",
            )
            continue
        kept.append(record)
        token_ids[record.id] = ids
    settle(rejects, on_error, "prompt tokenization")
    if not kept:
        raise DataError(f"prompt tokenization: no prompt fits max_prompt_tokens={max_prompt_tokens}\n"
                        f"{rejects.summary()}")
    return EncodedPrompts(records=kept, token_ids=token_ids, rejects=rejects)
