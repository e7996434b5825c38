"""Every field of a `/v1/chat/completions` or `/v1/completions` body checked before any work.

`check_request(body, kind, limits)` raises `RequestError` (HTTP 400) naming the first field that is
unknown, of the wrong type, out of range, over a `ServeLimits` cap, or a setting this endpoint
cannot honour (a non-zero penalty, `echo`, a forced tool...). A field is never silently ignored:
the accepted ones are listed in `CHAT_FIELDS` / `COMPLETION_FIELDS`, with OpenAI's types
(https://platform.openai.com/docs/api-reference/chat/create) and vLLM's extensions
(`top_k`, `return_token_ids`, `skip_special_tokens`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from scalerl.serving.errors import RequestError
from scalerl.serving.limits import ServeLimits

Check = Callable[[str, Any, ServeLimits], None]


def _fail(name: str, expected: str, value: Any) -> RequestError:
    shown = repr(value)
    if len(shown) > 60:
        shown = shown[:57] + "..."
    return RequestError(f"{name}: expected {expected}, got {shown}")


def _int(name: str, value: Any, lo: int, hi: int | None = None) -> int:
    # bool is an int in Python, never in JSON's meaning of the field.
    if isinstance(value, bool) or not isinstance(value, int):
        raise _fail(name, "an integer", value)
    if value < lo or (hi is not None and value > hi):
        raise _fail(name, f"an integer in [{lo}, {hi}]" if hi is not None else f"an integer >= {lo}", value)
    return value


def _number(name: str, value: Any, lo: float, hi: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise _fail(name, "a finite number", value)
    if not lo <= value <= hi:
        raise _fail(name, f"a number in [{lo}, {hi}]", value)
    return float(value)


def _str(name: str, value: Any) -> str:
    if not isinstance(value, str):
        raise _fail(name, "a string", value)
    return value


def _bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise _fail(name, "true or false", value)
    return value


def _obj(name: str, value: Any) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise _fail(name, "an object", value)
    return value


def _only(name: str, value: Any, allowed: tuple[Any, ...]) -> None:
    if value not in allowed or isinstance(value, bool) != isinstance(allowed[0], bool):
        raise RequestError(f"{name}: not supported by this endpoint except {' or '.join(map(repr, allowed))}"
                           f", got {value!r}")


def _unknown_keys(name: str, value: Mapping[str, Any], known: set[str]) -> None:
    extra = sorted(str(k) for k in value if k not in known)
    if extra:
        raise RequestError(f"{name}.{extra[0]}: unknown field")


# --------------------------------------------------------------------------------- field checks
def _max_tokens(name: str, v: Any, lim: ServeLimits) -> None:
    _int(name, v, 1, lim.max_tokens)


def _n(name: str, v: Any, lim: ServeLimits) -> None:
    _int(name, v, 1, lim.max_n)


def _temperature(name: str, v: Any, lim: ServeLimits) -> None:
    _number(name, v, 0.0, 2.0)


def _top_p(name: str, v: Any, lim: ServeLimits) -> None:
    if _number(name, v, 0.0, 1.0) <= 0.0:
        raise _fail(name, "a number in (0, 1]", v)


def _top_k(name: str, v: Any, lim: ServeLimits) -> None:
    _int(name, v, -1)  # vLLM: -1 or 0 mean no top-k


def _seed(name: str, v: Any, lim: ServeLimits) -> None:
    _int(name, v, -(1 << 63), (1 << 63) - 1)


def _stop(name: str, v: Any, lim: ServeLimits) -> None:
    if isinstance(v, str):
        return
    if not isinstance(v, list) or len(v) > lim.max_stop:
        raise _fail(name, f"a string or a list of at most {lim.max_stop} strings", v)
    for i, s in enumerate(v):
        _str(f"{name}[{i}]", s)


def _flag(name: str, v: Any, lim: ServeLimits) -> None:
    _bool(name, v)


def _text(name: str, v: Any, lim: ServeLimits) -> None:
    _str(name, v)


def _stream_options(name: str, v: Any, lim: ServeLimits) -> None:
    obj = _obj(name, v)
    _unknown_keys(name, obj, {"include_usage"})
    if "include_usage" in obj:
        _bool(f"{name}.include_usage", obj["include_usage"])


def _chat_logprobs(name: str, v: Any, lim: ServeLimits) -> None:
    _bool(name, v)


def _top_logprobs(name: str, v: Any, lim: ServeLimits) -> None:
    _int(name, v, 0, lim.max_logprobs)


def _completion_logprobs(name: str, v: Any, lim: ServeLimits) -> None:
    _int(name, v, 0, lim.max_logprobs)


def _zero(name: str, v: Any, lim: ServeLimits) -> None:
    _number(name, v, -2.0, 2.0)
    if v != 0:
        raise RequestError(f"{name}: not supported by this endpoint except 0, got {v!r}")


def _true_only(name: str, v: Any, lim: ServeLimits) -> None:
    _bool(name, v)
    _only(name, v, (True,))


def _false_only(name: str, v: Any, lim: ServeLimits) -> None:
    _bool(name, v)
    _only(name, v, (False,))


def _metadata(name: str, v: Any, lim: ServeLimits) -> None:
    for k, x in _obj(name, v).items():
        _str(f"{name}.{k}", x)


def _response_format(name: str, v: Any, lim: ServeLimits) -> None:
    obj = _obj(name, v)
    _unknown_keys(name, obj, {"type"})
    _only(f"{name}.type", obj.get("type"), ("text",))


def _tool_choice(name: str, v: Any, lim: ServeLimits) -> None:
    if isinstance(v, Mapping) or v == "required":
        raise RequestError(f"{name}: only 'auto' and 'none' are supported")
    _only(name, v, ("auto", "none"))


def _tools(name: str, v: Any, lim: ServeLimits) -> None:
    if not isinstance(v, list) or len(v) > lim.max_tools:
        raise _fail(name, f"a list of at most {lim.max_tools} tools", v)
    for i, t in enumerate(v):
        where = f"{name}[{i}]"
        tool = _obj(where, t)
        _unknown_keys(where, tool, {"type", "function"})
        _only(f"{where}.type", tool.get("type"), ("function",))
        fn = _obj(f"{where}.function", tool.get("function"))
        _unknown_keys(f"{where}.function", fn, {"name", "description", "parameters", "strict"})
        _str(f"{where}.function.name", fn.get("name"))
        if fn.get("description") is not None:
            _str(f"{where}.function.description", fn["description"])
        if fn.get("parameters") is not None:
            _obj(f"{where}.function.parameters", fn["parameters"])
        if fn.get("strict") is not None:
            _bool(f"{where}.function.strict", fn["strict"])


def _content(where: str, content: Any) -> None:
    if content is None or isinstance(content, str):
        return
    if not isinstance(content, list):
        raise _fail(f"{where}.content", "a string or a list of text parts", content)
    for j, part in enumerate(content):
        p = _obj(f"{where}.content[{j}]", part)
        if p.get("type") != "text":
            raise RequestError(f"{where}.content[{j}]: only text parts are supported, got {p.get('type')!r}")
        _unknown_keys(f"{where}.content[{j}]", p, {"type", "text"})
        _str(f"{where}.content[{j}].text", p.get("text"))


def _tool_calls(where: str, calls: Any) -> None:
    if not isinstance(calls, list):
        raise _fail(where, "a list of tool calls", calls)
    for k, c in enumerate(calls):
        w = f"{where}[{k}]"
        call = _obj(w, c)
        _unknown_keys(w, call, {"id", "type", "function", "index"})
        if call.get("id") is not None:
            _str(f"{w}.id", call["id"])
        if call.get("type") is not None:
            _only(f"{w}.type", call["type"], ("function",))
        fn = _obj(f"{w}.function", call.get("function"))
        _unknown_keys(f"{w}.function", fn, {"name", "arguments"})
        _str(f"{w}.function.name", fn.get("name"))
        args = fn.get("arguments")
        if args is not None and not isinstance(args, (str, Mapping)):
            raise _fail(f"{w}.function.arguments", "a JSON string or an object", args)


_MESSAGE_FIELDS = {"role", "content", "name", "tool_calls", "tool_call_id", "refusal", "reasoning_content",
                   "annotations"}


def _messages(name: str, v: Any, lim: ServeLimits) -> None:
    if not isinstance(v, list) or not v:
        raise _fail(name, "a non-empty list of messages", v)
    for i, m in enumerate(v):
        where = f"{name}[{i}]"
        msg = _obj(where, m)
        if msg.get("role") not in ("system", "developer", "user", "assistant", "tool"):
            raise RequestError(f"{where}.role: expected system, developer, user, assistant or tool, "
                               f"got {msg.get('role')!r}")
        # A message the client got from this endpoint and sends back (`model_dump()`) carries the
        # response's unset fields as null: null is "not set", as at the top level.
        _unknown_keys(where, {k: x for k, x in msg.items() if x is not None}, _MESSAGE_FIELDS)
        _content(where, msg.get("content"))
        if msg.get("annotations") not in (None, []):
            raise RequestError(f"{where}.annotations: not supported by this endpoint except []")
        for key in ("name", "tool_call_id", "refusal", "reasoning_content"):
            if msg.get(key) is not None:
                _str(f"{where}.{key}", msg[key])
        if msg.get("tool_calls") is not None:
            if msg["role"] != "assistant":
                raise RequestError(f"{where}.tool_calls: only an assistant message has tool calls")
            _tool_calls(f"{where}.tool_calls", msg["tool_calls"])


def _prompt(name: str, v: Any, lim: ServeLimits) -> None:
    if isinstance(v, list) and len(v) == 1 and isinstance(v[0], (str, list)):
        v = v[0]
    if isinstance(v, str):
        if not v:
            raise RequestError(f"{name}: empty")
        return
    if isinstance(v, list) and v and all(type(t) is int and t >= 0 for t in v):
        return
    raise _fail(name, "one string or one non-empty list of token ids", v)


def _best_of(name: str, v: Any, lim: ServeLimits) -> None:
    _int(name, v, 1, 1)


_COMMON: dict[str, Check] = {
    "model": _text, "max_tokens": _max_tokens, "n": _n, "temperature": _temperature, "top_p": _top_p,
    "top_k": _top_k, "seed": _seed, "stop": _stop, "stream": _flag, "stream_options": _stream_options,
    "presence_penalty": _zero, "frequency_penalty": _zero, "user": _text, "return_token_ids": _flag,
    "skip_special_tokens": _true_only,
}

CHAT_FIELDS: dict[str, Check] = {
    **_COMMON, "messages": _messages, "max_completion_tokens": _max_tokens, "logprobs": _chat_logprobs,
    "top_logprobs": _top_logprobs, "tools": _tools, "tool_choice": _tool_choice,
    "parallel_tool_calls": _true_only, "metadata": _metadata, "store": _false_only,
    "response_format": _response_format,
}

COMPLETION_FIELDS: dict[str, Check] = {
    **_COMMON, "prompt": _prompt, "logprobs": _completion_logprobs, "echo": _false_only, "best_of": _best_of,
}

# Known OpenAI fields this endpoint cannot honour: named as such rather than as unknown.
UNSUPPORTED = ("logit_bias", "functions", "function_call", "audio", "modalities", "prediction",
               "service_tier", "web_search_options", "reasoning_effort", "suffix", "min_tokens",
               "repetition_penalty", "min_p", "guided_json", "guided_regex", "guided_choice")


def check_request(body: Mapping[str, Any], kind: str, limits: ServeLimits) -> None:
    """Raise `RequestError` naming the first bad field of `body` (`kind`: "chat" or "completion")."""
    fields = CHAT_FIELDS if kind == "chat" else COMPLETION_FIELDS
    required = "messages" if kind == "chat" else "prompt"
    if required not in body:
        raise RequestError(f"{required}: required")
    for key, value in body.items():
        if not isinstance(key, str):
            raise RequestError(f"{key!r}: a field name must be a string")
        if key in UNSUPPORTED:
            if value is None:
                continue
            raise RequestError(f"{key}: not supported by this endpoint")
        check = fields.get(key)
        if check is None:
            raise RequestError(f"{key}: unknown field")
        if value is None and key not in (required,):
            continue  # OpenAI clients send null for "not set"
        check(key, value, limits)
    if "max_tokens" in body and "max_completion_tokens" in body and body["max_tokens"] is not None \
            and body["max_completion_tokens"] is not None:
        raise RequestError("max_completion_tokens: give either max_tokens or max_completion_tokens")
    if body.get("stream_options") is not None and not body.get("stream"):
        raise RequestError("stream_options: only with stream: true")
