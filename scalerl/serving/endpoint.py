"""The OpenAI-compatible endpoint's core: requests -> engine requests -> recorded calls -> responses.

`Endpoint(engine, tokenizer)` turns the JSON body of a `/v1/chat/completions` or `/v1/completions`
request into a `GenerationRequest` for any `Engine` (embedded, vLLM, a pool: the protocol is the
seam), queues it, and answers with the OpenAI response object once the engine finished it.
Whoever owns the engine steps it through `pump()`: a driver thread (`scalerl serve`) or the agent
environment's engine (`scalerl.serving.agent`), inside the pipeline's own `step()`, so weight
updates land between two steps as they do for every other rollout.

Chat prompts are rendered with the tokenizer's chat template (`tools` passed through), and
stitched from recorded ids when the history continues an earlier call of the same session
(`scalerl.serving.trace`). The session is a key `http` derives from the request (the
`X-Scalerl-Session` header, or the bearer token when no API key is set): an agent environment
hands every episode a client with its own key.

Sampling: `policy` settings (a training run's `SamplingParams`) win over the request's
temperature / top_p (the trainer's importance ratio needs the behaviour policy it configured);
`max_tokens`, `stop`, `n` and `seed` come from the request. Without a policy the request's
settings are used (OpenAI defaults: temperature 1, top_p 1). Every field is checked first against
`limits` (`scalerl.serving.validate`: a 400 naming the field), and the prompt + max_tokens against
`max_context` (a 400 naming both numbers). `n > 1` for a policy with a token budget is a 400 too.
A request whose awaiting coroutine is cancelled (its client went away) is dropped from the queue or
aborted in the engine (`cancel`). Sessions are kept least recently used first, at most
`max_sessions`; a session with `max_calls_per_session` calls starts afresh.

Responses follow the OpenAI schema (`stream: true` is served by `http` as events of the finished
response: buffered); `choices[i].logprobs` when `logprobs` is asked for;
`prompt_token_ids` / `choices[i].token_ids` when `return_token_ids` is true (vLLM's extension);
`system_fingerprint` is `scalerl-policy-<version>` (the version that sampled the last token).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import Any

from scalerl.agentic.chat import encoded_ids
from scalerl.agentic.toolcalls import TOOL_CALL_CLOSE, TOOL_CALL_OPEN, CallError, parse_tool_calls
from scalerl.rollout.protocol import Completion, Engine, GenerationRequest, SamplingParams
from scalerl.serving.errors import RequestError
from scalerl.serving.limits import ServeLimits
from scalerl.serving.trace import Call, Session, Trace, normalize_arguments
from scalerl.serving.validate import check_request

_SENTINEL = "\u2063SCALERL-SENTINEL\u2063"


@dataclass
class SessionPolicy:
    """A session's sampling settings and budget (a training episode's): `params` replaces the
    request's temperature/top_p/top_k; `max_total_tokens` bounds model + inserted tokens of the
    session's trajectory; `seed` derives a per-call seed."""

    params: SamplingParams
    max_total_tokens: int | None = None
    seed: int | None = None


@dataclass
class _Pending:
    request: GenerationRequest
    future: Future[list[Completion]]
    received: list[Completion] = field(default_factory=list)


def message_text(content: Any, where: str) -> str:
    """A message's content as text: a string, or a list of `{"type": "text", "text": ...}` parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for j, part in enumerate(content):
            if not isinstance(part, Mapping) or part.get("type") != "text":
                kind = part.get("type") if isinstance(part, Mapping) else type(part).__name__
                raise RequestError(f"{where}.content[{j}]: only text parts are supported, got {kind!r}")
            parts.append(str(part.get("text", "")))
        return "".join(parts)
    raise RequestError(f"{where}.content: expected a string or a list of text parts")


def normalize_messages(messages: Any) -> list[dict[str, Any]]:
    """The request's messages as plain dicts: text content, tool calls with parsed arguments."""
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages: expected a non-empty list")
    out = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, Mapping) or m.get("role") not in ("system", "developer", "user", "assistant",
                                                                 "tool"):
            raise RequestError(f"{where}.role: expected system, developer, user, assistant or tool")
        role = "system" if m["role"] == "developer" else m["role"]
        msg: dict[str, Any] = {"role": role, "content": message_text(m.get("content"), where)}
        if role == "assistant" and m.get("tool_calls"):
            msg["tool_calls"] = [
                {"type": "function", "id": c.get("id"),
                 "function": {"name": c["function"]["name"],
                              "arguments": normalize_arguments(c["function"].get("arguments"))}}
                for c in m["tool_calls"]
            ]
        if role == "tool":
            if m.get("tool_call_id") is not None:
                msg["tool_call_id"] = m["tool_call_id"]
            if m.get("name") is not None:
                msg["name"] = m["name"]
        out.append(msg)
    return out


def split_tool_calls(text: str) -> tuple[str, list[dict[str, Any]], int]:
    """(content without its `<tool_call>` blocks, OpenAI tool calls, malformed blocks). A turn whose
    blocks do not all parse keeps its text as content, no tool calls."""
    parsed = parse_tool_calls(text)
    if not parsed:
        return text, [], 0
    bad = sum(isinstance(p, CallError) for p in parsed)
    if bad:
        return text, [], bad
    calls = [{"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
              "function": {"name": p.name, "arguments": json.dumps(p.arguments)}}
             for p in parsed if not isinstance(p, CallError)]
    content = text
    while TOOL_CALL_OPEN in content and TOOL_CALL_CLOSE in content:
        a = content.index(TOOL_CALL_OPEN)
        b = content.index(TOOL_CALL_CLOSE, a) + len(TOOL_CALL_CLOSE)
        content = content[:a] + content[b:]
    return content.strip(), calls, 0


class Endpoint:
    """See the module docstring. Thread-safe: handlers run on the server's event loop thread,
    `pump()` on the engine owner's thread."""

    def __init__(
        self, engine: Engine, tokenizer: Any, *, model_name: str = "scalerl",
        max_tokens_default: int = 256, policy_for: Callable[[str], SessionPolicy | None] | None = None,
        on_call: Callable[[str, Call], None] | None = None, max_sessions: int | None = None,
        limits: ServeLimits | None = None, max_context: int | None = None,
        max_calls_per_session: int | None = None,
    ) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.max_tokens_default = max_tokens_default
        self.policy_for = policy_for or (lambda key: None)
        self.on_call = on_call
        self.eos_ids = {int(tokenizer.eos_token_id)} if tokenizer.eos_token_id is not None else set()
        self.sessions: dict[str, Session] = {}
        # A long-lived server keeps the most recent sessions only (`sessions_evicted` counts the
        # rest; a call continuing an evicted one starts a new window).
        self.max_sessions = max_sessions
        self.max_calls_per_session = max_calls_per_session
        # Every request is checked against these caps (`scalerl.serving.validate`) and its prompt +
        # max_tokens against the model's context: a prompt past it would make the engine's prefill
        # grow without bound (the mask is quadratic in the prompt).
        self.limits = limits or ServeLimits()
        self.max_context = max_context
        self._aborts: list[str] = []  # cancelled requests the engine still holds (pump aborts them)
        self._discard: dict[str, int] = {}  # cancelled request -> samples still to drop
        self._broken: BaseException | None = None
        self.counters: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._queue: list[_Pending] = []
        self._inflight: dict[str, _Pending] = {}
        self._serial = itertools.count()

    # ------------------------------------------------------------------------------ engine side
    def pump(self, wait_s: float = 0.0) -> int:
        """Submit the queued requests, step the engine once, resolve what finished; with nothing
        to do, wait up to `wait_s` for a request. Returns the number of requests resolved."""
        with self._wake:
            if not self._queue and not self._inflight and not self._aborts and wait_s > 0:
                self._wake.wait(wait_s)
            queued, self._queue = self._queue, []
            aborts, self._aborts = self._aborts, []
            for p in queued:
                self._inflight[p.request.request_id] = p
        if aborts:
            abort = getattr(self.engine, "abort", None)
            # An engine without `abort` finishes them: their samples are dropped on arrival.
            if abort is not None:
                dropped = set(abort(aborts))
                self.counters["generations_aborted"] += len(dropped)
                with self._lock:
                    for request_id in dropped:
                        self._discard.pop(request_id, None)
        if queued:
            try:
                self.engine.submit([p.request for p in queued])
            except Exception as err:  # the engine refused them (e.g. a prompt over its context)
                with self._lock:
                    for p in queued:
                        self._inflight.pop(p.request.request_id, None)
                for p in queued:
                    p.future.set_exception(RequestError(f"engine refused the request: {err}"))
        if not self.engine.num_unfinished():
            return 0
        resolved = 0
        for c in self.engine.step():
            with self._lock:
                p = self._inflight.get(c.request_id)
                if p is None:
                    if c.request_id in self._discard:  # its client went away
                        self.counters["cancelled_completions"] += 1
                        self._discard[c.request_id] -= 1
                        if self._discard[c.request_id] <= 0:
                            del self._discard[c.request_id]
                    else:
                        self.counters["foreign_completions"] += 1  # not ours: nobody waits for it
                    continue
                p.received.append(c)
                if len(p.received) < p.request.params.n:
                    continue
                del self._inflight[c.request_id]
            p.future.set_result(sorted(p.received, key=lambda x: x.sample_index))
            resolved += 1
        return resolved

    def notify(self) -> None:
        """Wake a `pump()` waiting for requests (something else its owner waits for happened)."""
        with self._wake:
            self._wake.notify_all()

    def fail_pending(self, err: BaseException) -> None:
        """Fail every waiting request and every later one (the engine broke, or is shutting down)."""
        with self._lock:
            self._broken = err
            pending = [*self._queue, *self._inflight.values()]
            self._queue, self._inflight = [], {}
        for p in pending:
            if not p.future.done():
                p.future.set_exception(RequestError(f"the endpoint's engine failed: {err!r}", status=503))

    def pending(self) -> int:
        with self._lock:
            return len(self._queue) + len(self._inflight)

    @property
    def broken(self) -> BaseException | None:
        """The error that ended the engine, or None while it serves."""
        return self._broken

    def cancel(self, request_id: str) -> None:
        """Forget a request whose client went away: dropped from the queue, or aborted in the
        engine at the next `pump()` (its samples dropped on arrival where the engine cannot)."""
        with self._wake:
            for i, p in enumerate(self._queue):
                if p.request.request_id == request_id:
                    del self._queue[i]
                    break
            else:
                p = self._inflight.pop(request_id, None)
                if p is None:
                    return
                self._aborts.append(request_id)
                self._discard[request_id] = p.request.params.n - len(p.received)
                self._wake.notify_all()
            self.counters["requests_cancelled"] += 1

    # ------------------------------------------------------------------------------ rendering
    def render_chat(self, messages: Sequence[dict[str, Any]], tools: list[dict[str, Any]] | None,
                    add_generation_prompt: bool = True) -> str:
        if not getattr(self.tokenizer, "chat_template", None):
            raise RequestError("messages: the model's tokenizer has no chat template "
                               "(use /v1/completions)")
        kwargs: dict[str, Any] = {"tools": tools} if tools else {}
        try:
            return str(self.tokenizer.apply_chat_template(
                list(messages), tokenize=False, add_generation_prompt=add_generation_prompt, **kwargs))
        except Exception as err:  # the template rejects the conversation (e.g. role order)
            raise RequestError(f"messages: the chat template cannot render them: {err}") from None

    def encode(self, text: str) -> list[int]:
        return encoded_ids(self.tokenizer(text, add_special_tokens=False))

    def inserted_chat_text(self, head: Sequence[dict[str, Any]], new: Sequence[dict[str, Any]],
                           tools: list[dict[str, Any]] | None, completion_ids: Sequence[int]) -> str:
        """The template's text after an assistant turn: what closes it, the `new` messages and the
        opened next assistant turn. Rendered with a sentinel as the assistant content (and no tool
        calls: the model's ids already hold its calls). When the turn ended in the EOS id, the text
        of that id, which the template writes as the turn's close, is not inserted twice."""
        text = self.render_chat([*head, {"role": "assistant", "content": _SENTINEL}, *new], tools)
        at = text.find(_SENTINEL)
        if at < 0:
            raise RequestError("messages: the chat template does not render assistant content verbatim, "
                               "so a conversation cannot continue from recorded ids")
        tail = text[at + len(_SENTINEL):]
        if completion_ids and int(completion_ids[-1]) in self.eos_ids:
            eos_text = str(self.tokenizer.decode([int(completion_ids[-1])], skip_special_tokens=False))
            if tail.startswith(eos_text):
                tail = tail[len(eos_text):]
        return tail

    # ------------------------------------------------------------------------------ requests
    def _params(self, body: Mapping[str, Any], policy: SessionPolicy | None, session: Session,
                window_used: int) -> SamplingParams:
        n = body.get("n") or 1
        if not isinstance(n, int) or n < 1:
            raise RequestError("n: expected a positive integer")
        max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
        if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens < 1):
            raise RequestError("max_tokens: expected a positive integer")
        stops = body.get("stop")
        stops = [stops] if isinstance(stops, str) else list(stops or [])
        stop_sequences = tuple(tuple(self.encode(s)) for s in stops if s)
        if policy is not None:
            budget = policy.max_total_tokens
            limit = policy.params.max_new_tokens if max_tokens is None else min(max_tokens,
                                                                                policy.params.max_new_tokens)
            if budget is not None:
                if n > 1:
                    raise RequestError("n: a training episode samples one choice per call")
                left = budget - window_used
                if left <= 0:
                    self.counters["budget_refused"] += 1
                    session.budget_refused = True
                    raise RequestError(f"the episode's token budget ({budget}) is spent", status=400)
                limit = min(limit, left)
            seed = None if policy.seed is None else (policy.seed * 1_000_003 + len(session.calls)) % (1 << 63)
            return replace(policy.params, n=n, max_new_tokens=max(1, limit), seed=seed,
                           stop_sequences=(*policy.params.stop_sequences, *stop_sequences))
        try:
            return SamplingParams(
                n=n, temperature=float(body.get("temperature", 1.0) if body.get("temperature") is not None
                                       else 1.0),
                top_p=float(body.get("top_p") if body.get("top_p") is not None else 1.0),
                top_k=max(0, int(body.get("top_k") or 0)),
                max_new_tokens=int(max_tokens or self.max_tokens_default),
                seed=None if body.get("seed") is None else int(body["seed"]),
                stop_sequences=stop_sequences,
            )
        except (TypeError, ValueError) as err:
            raise RequestError(f"sampling settings: {err}") from None

    def _queue_request(self, prompt: list[int], params: SamplingParams,
                       session: str) -> _Pending:
        request_id = f"api-{next(self._serial)}"
        future: Future[list[Completion]] = Future()
        request = GenerationRequest(request_id, list(prompt), params, {"session": session},
                                    cache_key=f"api-{session}")
        with self._wake:
            if self._broken is not None:
                raise RequestError(f"the endpoint's engine failed: {self._broken!r}", status=503)
            pending = _Pending(request, future)
            self._queue.append(pending)
            self._wake.notify_all()
        return pending

    def _session(self, key: str) -> Session:
        with self._lock:
            s = self.sessions.pop(key, None)
            if s is not None:
                self.sessions[key] = s  # most recently used last: eviction takes the first
                if self.max_calls_per_session is not None and len(s.calls) >= self.max_calls_per_session:
                    s = None  # a session past its call cap starts afresh (its stitching search is linear)
                    self.counters["sessions_restarted"] += 1
            if s is None:
                s = self.sessions[key] = Session(key)
                while self.max_sessions is not None and len(self.sessions) > self.max_sessions:
                    self.sessions.pop(next(iter(self.sessions)))
                    self.counters["sessions_evicted"] += 1
            return s

    async def chat(self, body: Mapping[str, Any], key: str) -> dict[str, Any]:
        check_request(body, "chat", self.limits)
        messages = normalize_messages(body.get("messages"))
        tools = body.get("tools") or None
        if tools is not None:
            if not isinstance(tools, list):
                raise RequestError("tools: expected a list")
            choice = body.get("tool_choice")
            if isinstance(choice, Mapping) or choice == "required":
                raise RequestError("tool_choice: only 'auto' and 'none' are supported")
            tools = [dict(t) for t in tools]
        session = self._session(key)
        version = self.engine.version
        found = session.chat_parent(messages)
        if found is not None:
            parent_index, n = found
            parent = session.calls[parent_index]
            trace = parent.trace.copy()
            inserted = self.encode(self.inserted_chat_text(messages[:n], messages[n + 1:], tools,
                                                           parent.completion_ids))
            trace.insert(inserted, version)
            self.counters["stitched_calls"] += 1
        else:
            parent_index = None
            trace = Trace(self.encode(self.render_chat(messages, tools)))
        completions = await self._generate(body, key, session, trace)
        out = []
        for c in completions:
            text = self._text(c)
            stop_cut = self._cut_at_stop(text, body)
            content, calls, bad = split_tool_calls(stop_cut) if tools and body.get("tool_choice") != "none" \
                else (stop_cut, [], 0)
            self.counters["malformed_tool_calls"] += bad
            message: dict[str, Any] = {"role": "assistant", "content": content}
            if calls:
                message["tool_calls"] = calls
            self._record(session, key, Call("chat", messages, message, self._extend(trace, c),
                                            len(trace.context), c.num_tokens, c.finish_reason, parent_index))
            session.tool_calls += len(calls)
            out.append((c, message, calls))
        choices = []
        for i, (c, message, calls) in enumerate(out):
            choice: dict[str, Any] = {"index": i, "message": message,
                                      "finish_reason": "tool_calls" if calls else self._finish(c)}
            if body.get("logprobs"):
                choice["logprobs"] = {"content": self._logprob_entries(c)}
            if body.get("return_token_ids"):
                choice["token_ids"] = list(c.token_ids)
            choices.append(choice)
        return self._response("chat.completion", choices, trace, completions, body)

    async def completion(self, body: Mapping[str, Any], key: str) -> dict[str, Any]:
        check_request(body, "completion", self.limits)
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]
        session = self._session(key)
        version = self.engine.version
        parent_index: int | None = None
        if isinstance(prompt, str):
            if not prompt:
                raise RequestError("prompt: empty")
            parent_index = session.completion_parent(prompt)
            if parent_index is not None:
                parent = session.calls[parent_index]
                keep = parent.prompt_len + parent.completion_len - (1 if parent.dropped_eos else 0)
                trace = parent.trace.cut(keep - len(parent.trace.prompt_ids))
                trace.insert(self.encode(prompt[len(parent.request) + len(parent.response):]), version)
                self.counters["stitched_calls"] += 1
            else:
                trace = Trace(self.encode(prompt))
        elif isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            trace = Trace([int(t) for t in prompt])  # token ids: taken as given
        else:
            raise RequestError("prompt: expected one string or one list of token ids")
        completions = await self._generate(body, key, session, trace)
        choices = []
        for i, c in enumerate(completions):
            text = self._cut_at_stop(self._text(c), body)
            dropped = bool(c.token_ids) and int(c.token_ids[-1]) in self.eos_ids
            self._record(session, key, Call("completion", prompt if isinstance(prompt, str) else list(prompt),
                                            text, self._extend(trace, c), len(trace.context), c.num_tokens,
                                            c.finish_reason, parent_index, dropped_eos=dropped))
            choice: dict[str, Any] = {"index": i, "text": text, "finish_reason": self._finish(c)}
            if body.get("logprobs"):
                choice["logprobs"] = {
                    "tokens": [str(self.tokenizer.decode([t])) for t in c.token_ids],
                    "token_logprobs": list(c.logprobs), "top_logprobs": None, "text_offset": None}
            else:
                choice["logprobs"] = None
            if body.get("return_token_ids"):
                choice["token_ids"] = list(c.token_ids)
            choices.append(choice)
        return self._response("text_completion", choices, trace, completions, body)

    async def _generate(self, body: Mapping[str, Any], key: str, session: Session,
                        trace: Trace) -> list[Completion]:
        policy = self.policy_for(key)
        params = self._params(body, policy, session, len(trace.token_ids))
        params = self._fit_context(params, len(trace.context), body)
        pending = self._queue_request(trace.context, params, key)
        self.counters["requests"] += 1
        start = time.perf_counter()
        try:
            completions = await asyncio.wrap_future(pending.future)
        except asyncio.CancelledError:  # the client disconnected: stop generating for it
            self.cancel(pending.request.request_id)
            raise
        elapsed = time.perf_counter() - start
        self.counters["gen_time_us"] += int(elapsed * 1e6)
        session.gen_time_s += elapsed
        return completions

    def _fit_context(self, params: SamplingParams, prompt_len: int,
                     body: Mapping[str, Any]) -> SamplingParams:
        """Prompt + max_tokens within the model's context: a request that names max_tokens past it
        is refused naming both numbers; the default max_tokens is cut to what the context leaves."""
        if self.max_context is None or prompt_len + params.max_new_tokens <= self.max_context:
            return params
        named = body.get("max_tokens") is not None or body.get("max_completion_tokens") is not None
        if named or prompt_len >= self.max_context:
            self.counters["context_refused"] += 1
            raise RequestError(f"the prompt ({prompt_len} tokens) + max_tokens ({params.max_new_tokens}) "
                               f"exceed the model's context ({self.max_context} tokens)")
        return replace(params, max_new_tokens=self.max_context - prompt_len)

    # ------------------------------------------------------------------------------ responses
    @staticmethod
    def _extend(trace: Trace, c: Completion) -> Trace:
        t = trace.copy()
        t.add("model", c.token_ids, c.logprobs, c.versions, c.loss_mask)
        return t

    def _record(self, session: Session, key: str, call: Call) -> None:
        with self._lock:
            session.calls.append(call)
        if self.on_call is not None:
            self.on_call(key, call)

    def _text(self, c: Completion) -> str:
        return str(self.tokenizer.decode(list(c.token_ids), skip_special_tokens=True))

    @staticmethod
    def _cut_at_stop(text: str, body: Mapping[str, Any]) -> str:
        """OpenAI semantics: the stop string that ended the text is not returned."""
        stops = body.get("stop")
        for s in [stops] if isinstance(stops, str) else list(stops or []):
            if s and text.endswith(s):
                return text[: -len(s)]
        return text

    @staticmethod
    def _finish(c: Completion) -> str:
        return "length" if c.finish_reason == "length" else "stop"

    def _logprob_entries(self, c: Completion) -> list[dict[str, Any]]:
        out = []
        for t, lp in zip(c.token_ids, c.logprobs, strict=True):
            tok = str(self.tokenizer.decode([t]))
            out.append({"token": tok, "logprob": float(lp), "bytes": list(tok.encode()), "top_logprobs": []})
        return out

    def _response(self, obj: str, choices: list[dict[str, Any]], trace: Trace, completions: list[Completion],
                  body: Mapping[str, Any]) -> dict[str, Any]:
        version = max((c.end_version for c in completions), default=self.engine.version)
        out: dict[str, Any] = {
            "id": f"{'chatcmpl' if obj.startswith('chat') else 'cmpl'}-{uuid.uuid4().hex}",
            "object": obj,
            "created": int(time.time()),
            "model": str(body.get("model") or self.model_name),
            "choices": choices,
            "system_fingerprint": f"scalerl-policy-{version}",
            "usage": {"prompt_tokens": len(trace.context),
                      "completion_tokens": sum(c.num_tokens for c in completions),
                      "total_tokens": len(trace.context) + sum(c.num_tokens for c in completions)},
        }
        if body.get("return_token_ids"):
            out["prompt_token_ids"] = trace.context
        return out
