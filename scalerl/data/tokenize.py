"""Prompt token ids: a prompt template applied through the tokenizer, and the prompt-length check.

`data.template` picks how a record becomes the model's input (`TEMPLATES`):

* `chat` (default): the tokenizer's own chat template (`apply_chat_template`, generation prompt
  opened); a tokenizer without one is an error that names the text templates below.
* `r1`: DeepSeek-R1-Zero's plain-text template (DeepSeek-AI 2025, arXiv 2501.12948, Table 1),
  word for word: an instruction to reason inside `<think> </think>` and answer inside
  `<answer> </answer>`, then `User: {prompt}. Assistant:`.
* `qwen_math`: the Qwen2.5-Math prompt with its fixed system line "Please reason step by step, and
  put your final answer within \\boxed{}." written out in ChatML text (`<|im_start|>` ...), as
  Dr. GRPO compares it (Liu et al. 2025, arXiv 2503.20783, Sec. 3.1).
* `raw`: the question text alone, no template ("no template" in Dr. GRPO).

The three text templates work with any tokenizer, chat template or none: they are rendered as text
and encoded with `tokenizer.encode(text)` (special tokens of the tokenizer, such as a BOS, added as
it adds them to plain text). Each takes one question: `record.prompt`, or a chat of exactly one user
turn; a longer chat is a bad row. Answers are read after the thinking as for the chat template
(`scalerl.rewards.answer`): the last `\\boxed{}`, else the last `<answer> </answer>` (what `r1`
asks for).

A prompt longer than the context budget would be truncated or crash the engine mid-run; checking
every prompt once, up front, turns that into a counted rejection that names the record.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from scalerl.data.modes import row_thinking
from scalerl.data.records import PromptRecord
from scalerl.data.rejects import DataError, OnError, RejectLog, check_on_error, settle

# The `<think>` option: ask for reasoning inside <think></think> and the final answer in \boxed{}.
THINK_SYSTEM_PROMPT = (
    "Think step by step inside <think> and </think>, then give the final answer in \\boxed{}."
)


Template = Literal["chat", "r1", "qwen_math", "raw"]
TEMPLATES: tuple[str, ...] = ("chat", "r1", "qwen_math", "raw")
#: Templates that are plain text: no chat template needed.
TEXT_TEMPLATES: tuple[str, ...] = ("r1", "qwen_math", "raw")

# DeepSeek-R1 (arXiv 2501.12948) Table 1, verbatim; "prompt" is replaced by the question.
R1_TEMPLATE = (
    "A conversation between User and Assistant. The user asks a question, and the Assistant solves it. "
    "The assistant first thinks about the reasoning process in the mind and then provides the user with "
    "the answer. The reasoning process and answer are enclosed within <think> </think> and <answer> "
    "</answer> tags, respectively, i.e., <think> reasoning process here </think> <answer> answer here "
    "</answer>. User: {prompt}. Assistant:"
)
# Qwen2.5-Math's chat format with its default system prompt, as text (Dr. GRPO, arXiv 2503.20783).
QWEN_MATH_SYSTEM = "Please reason step by step, and put your final answer within \\boxed{}."
QWEN_MATH_TEMPLATE = (
    "<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n"
)


def check_template(template: str, system_prompt: str | None = None) -> Template:
    """`template` if it is one of `TEMPLATES` and combines with `system_prompt`, else `ValueError`.

    `r1` and `qwen_math` carry their own instruction (that is what they are): a system prompt on
    top would change the template the literature compares, so it is refused. `raw` puts a system
    prompt before the question, separated by a blank line.
    """
    if template not in TEMPLATES:
        raise DataError(f"data.template: must be one of {TEMPLATES}, got {template!r}")
    if system_prompt is not None and template in ("r1", "qwen_math"):
        raise DataError(
            f"data.template={template} carries its own instruction; unset data.system_prompt and "
            "data.think_system_prompt (or use template chat or raw)"
        )
    return template  # type: ignore[return-value]


def _question(record: PromptRecord, template: str) -> str:
    """The single question a text template takes (a `RowError`-style `ValueError` otherwise)."""
    if record.prompt is not None:
        return record.prompt
    turns = record.messages or []
    users = [t for t in turns if t["role"] == "user"]
    if len(turns) != 1 or len(users) != 1:
        roles = ", ".join(t["role"] for t in turns)
        raise ValueError(f"data.template={template} takes one question; this record is a chat of "
                         f"{len(turns)} turns ({roles}): use template chat")
    return users[0]["content"]


def render_prompt(record: PromptRecord, template: str, system_prompt: str | None = None) -> str:
    """The text a text template (`r1`, `qwen_math`, `raw`) makes of `record` (see module doc)."""
    template = check_template(template, system_prompt)
    if template == "chat":
        raise ValueError("render_prompt: the chat template is the tokenizer's; use encode_prompt")
    question = _question(record, template)
    if template == "r1":
        return R1_TEMPLATE.format(prompt=question)
    if template == "qwen_math":
        return QWEN_MATH_TEMPLATE.format(system=QWEN_MATH_SYSTEM, prompt=question)
    return question if system_prompt is None else f"{system_prompt}\n\n{question}"


def resolve_system_prompt(think_system_prompt: bool = False, system_prompt: str | None = None) -> str | None:
    """The system prompt a run uses: a custom one if given, else the `<think>` one if asked, else none."""
    if system_prompt is not None and not system_prompt.strip():
        raise DataError("system_prompt: empty; leave it unset for no system prompt")
    if system_prompt is not None:
        return system_prompt
    return THINK_SYSTEM_PROMPT if think_system_prompt else None


def bind_chat_template_kwargs(tokenizer: Any, kwargs: Mapping[str, Any]) -> Any:
    """`tokenizer` with `kwargs` passed to every `apply_chat_template` call (`data.chat_template_kwargs`,
    e.g. Qwen3's `{"enable_thinking": false}`); a call's own keywords win. Bound once on the run's
    tokenizer by the composition root, so training, evaluation, tool-use turns and `scalerl serve`
    all render with them. Binding again replaces the earlier keywords."""
    if not kwargs:
        return tokenizer
    original = getattr(tokenizer, "_scalerl_apply_chat_template", None) or tokenizer.apply_chat_template
    bound = dict(kwargs)

    def apply_chat_template(*args: Any, **call: Any) -> Any:
        return original(*args, **{**bound, **call})

    tokenizer._scalerl_apply_chat_template = original
    tokenizer.apply_chat_template = apply_chat_template
    return tokenizer


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


def encode_prompt(
    record: PromptRecord, tokenizer: Any, system_prompt: str | None = None, template: str = "chat"
) -> list[int]:
    """Token ids of `record` under `template`: a chat with the assistant turn opened, or a text
    template's rendering (see the module docstring). A row's `thinking` column picks its mode
    (`scalerl.data.modes`): the system prompt and the chat template's `enable_thinking`."""
    thinking = row_thinking(record)
    kwargs: dict[str, Any] = {}
    if thinking is not None:
        if template in ("r1", "qwen_math"):
            raise DataError(f"{_where(record)}: column 'thinking' needs data.template chat or raw "
                            f"({template} carries its own instruction)")
        if thinking:
            system_prompt = system_prompt or THINK_SYSTEM_PROMPT
        elif system_prompt == THINK_SYSTEM_PROMPT:
            system_prompt = None
        kwargs["enable_thinking"] = thinking
    try:
        template = check_template(template, system_prompt)
    except ValueError as err:
        raise DataError(str(err)) from None
    if template != "chat":
        return [int(i) for i in tokenizer.encode(render_prompt(record, template, system_prompt))]
    if not getattr(tokenizer, "chat_template", None):
        raise DataError(
            f"{_where(record)}: the tokenizer has no chat template; set `tokenizer.chat_template`, use a "
            "chat/instruct model's tokenizer, or a text template for a base model "
            "(data.template: r1, qwen_math or raw)"
        )
    encoded = tokenizer.apply_chat_template(
        record.chat(system_prompt), add_generation_prompt=True, tokenize=True, **kwargs
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
    template: str = "chat",
) -> EncodedPrompts:
    """Encode every record under `template`; prompts over `max_prompt_tokens` (or that the template
    rejects) are bad rows.

    With `on_error="error"` a `DataError` lists every bad prompt with its file:line; with "skip"
    they are dropped and counted in `EncodedPrompts.rejects`.
    """
    on_error = check_on_error(on_error)
    if max_prompt_tokens <= 0:
        raise DataError(f"max_prompt_tokens: must be positive, got {max_prompt_tokens}")
    kept: list[PromptRecord] = []
    token_ids: dict[str, list[int]] = {}
    rejects = RejectLog()
    for record in records:
        try:
            ids = encode_prompt(record, tokenizer, system_prompt, template)
        except DataError:
            raise  # a tokenizer problem, not a row problem: every row would fail the same way
        except Exception as err:  # jinja raises TemplateError for e.g. an unsupported role order
            if template == "chat":
                rejects.add("chat template error", _where(record), f"{type(err).__name__}: {err}")
            else:  # a text template's own message says what is wrong with the record
                rejects.add("template error", _where(record), str(err))
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
