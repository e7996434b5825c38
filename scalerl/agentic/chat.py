"""Token ids of contexts and environment segments, through the tokenizer's chat template.

Three things a multi-turn rollout needs from the template:

* the first prompt: `render_ids(messages, tools)` (Qwen-style templates render the tool list
  themselves from `tools=`);
* the environment segment that follows a model turn ending in a tool call: the tokens that close
  the assistant turn, carry the observations and open the next assistant turn. They are the
  template's own rendering, taken as a text delta: render `[..., assistant(SENTINEL), *observations]`
  with the generation prompt and keep what follows the sentinel. The model's own tokens are never
  re-tokenized (token in, token out), so behaviour log-probs stay those of the sampled tokens;
* a rebuilt context (thinking retention dropped reasoning, context management discarded history):
  `render_ids(messages)` of the new message list.

Templates without a tool role (the embedded tiny default's): the documented default, Qwen's own
layout, is used instead: the tool results of one turn become one user message of
`<tool_response>...</tool_response>` blocks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from scalerl.agentic.messages import Message
from scalerl.agentic.toolcalls import TOOL_CALL_CLOSE

TOOL_RESPONSE_OPEN = "<tool_response>"
TOOL_RESPONSE_CLOSE = "</tool_response>"
_SENTINEL = "\u2063SCALERL-SENTINEL\u2063"


def encoded_ids(encoded: Any) -> list[int]:
    """The token ids of a tokenizer's output (a `BatchEncoding`, a tensor, a list, one row of a batch)."""
    ids = encoded["input_ids"] if isinstance(encoded, Mapping) else encoded
    if hasattr(ids, "tolist"):
        ids = ids.tolist()
    if ids and isinstance(ids[0], (list, tuple)):
        ids = ids[0]
    return [int(i) for i in ids]


def template_has_tool_role(tokenizer: Any) -> bool:
    """Whether the chat template renders `tool` messages itself (Qwen, Llama 3.1, Hermes...)."""
    template = getattr(tokenizer, "chat_template", None) or ""
    return "'tool'" in template or '"tool"' in template


def tool_messages_as_user(observations: Sequence[Message]) -> list[Message]:
    """The default layout: consecutive tool results folded into one user message of
    `<tool_response>` blocks (what Qwen's template renders them as); other messages unchanged."""
    out: list[Message] = []
    blocks: list[str] = []

    def flush() -> None:
        if blocks:
            out.append({"role": "user", "content": "".join(blocks)})
            blocks.clear()

    for m in observations:
        if m.get("role") == "tool":
            blocks.append(f"{TOOL_RESPONSE_OPEN}{m.get('content', '')}{TOOL_RESPONSE_CLOSE}")
        else:
            flush()
            out.append(dict(m))
    flush()
    return out


class ChatFormat:
    """Renders message lists to token ids for one tokenizer (see the module docstring)."""

    def __init__(self, tokenizer: Any, tools: Sequence[Mapping[str, Any]] | None = None,
                 stop_text: str | None = TOOL_CALL_CLOSE) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("agentic: the tokenizer has no chat template")
        self.tokenizer = tokenizer
        self.tools = [dict(t) for t in tools] if tools else None
        self.native_tools = template_has_tool_role(tokenizer)
        # Generation stops after a call's closing tag (the JSON formats: at the model's end of turn).
        self.stop_sequence = (tuple(tokenizer.encode(stop_text, add_special_tokens=False))
                              if stop_text else None)

    def _prepare(self, messages: Sequence[Message]) -> list[Message]:
        msgs = [{k: v for k, v in m.items() if k != "reasoning_content" or self.native_tools}
                for m in messages]
        return msgs if self.native_tools else tool_messages_as_user(msgs)

    def render_text(self, messages: Sequence[Message], add_generation_prompt: bool = True) -> str:
        kwargs: dict[str, Any] = {}
        if self.tools and self.native_tools:
            kwargs["tools"] = self.tools
        return str(self.tokenizer.apply_chat_template(
            self._prepare(messages), tokenize=False, add_generation_prompt=add_generation_prompt, **kwargs))

    def render_ids(self, messages: Sequence[Message], add_generation_prompt: bool = True) -> list[int]:
        """The context `messages` as prompt ids, the next assistant turn opened."""
        text = self.render_text(messages, add_generation_prompt)
        return encoded_ids(self.tokenizer(text, add_special_tokens=False))

    def segment_text(self, observations: Sequence[Message]) -> str:
        """The text between the end of a model turn and the start of the next one."""
        base = [{"role": "user", "content": "x"}, {"role": "assistant", "content": _SENTINEL}]
        text = self.render_text([*base, *observations], add_generation_prompt=True)
        at = text.find(_SENTINEL)
        if at < 0:
            raise ValueError("agentic: the chat template does not render assistant content verbatim")
        return text[at + len(_SENTINEL):]

    def segment_ids(self, observations: Sequence[Message]) -> list[int]:
        """Token ids of the environment segment carrying `observations` (module docstring)."""
        return encoded_ids(self.tokenizer(self.segment_text(observations), add_special_tokens=False))

    def truncate(self, text: str, max_tokens: int) -> str:
        """`text` cut to at most `max_tokens` tokens (a note says how much was cut)."""
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        if len(ids) <= max_tokens:
            return text
        head = self.tokenizer.decode(ids[:max_tokens], skip_special_tokens=True)
        return f"{head}...[{len(ids) - max_tokens} tokens cut]"
