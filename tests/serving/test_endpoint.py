"""The OpenAI-compatible endpoint, with the real `openai` client against a server on an ephemeral port:
responses, and every call recorded as a trajectory stitched from the recorded ids."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence

import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

from scalerl.models.tiny import TinyModelSpec, build_tiny_model, build_tiny_tokenizer  # noqa: E402
from scalerl.rollout.embedded import EmbeddedEngine  # noqa: E402
from scalerl.serving.endpoint import Endpoint  # noqa: E402
from scalerl.serving.errors import RequestError  # noqa: E402
from scalerl.serving.http import EngineDriver, start_server  # noqa: E402
from tests.agentic.fakes import ScriptedEngine  # noqa: E402


@pytest.fixture(scope="module")
def tok():
    return build_tiny_tokenizer()


class Served:
    def __init__(self, engine, tok) -> None:
        self.engine = engine
        self.endpoint = Endpoint(engine, tok, model_name="tiny")
        self.driver = EngineDriver(self.endpoint, idle_wait_s=0.01)
        self.server = start_server(self.endpoint)

    def client(self, key: str = "s1"):
        return openai.OpenAI(base_url=self.server.url, api_key=key, max_retries=0, timeout=30)

    def close(self) -> None:
        self.server.close()
        self.driver.close()


def serve(engine, tok) -> Iterator[Served]:
    s = Served(engine, tok)
    try:
        yield s
    finally:
        s.close()


def scripted(tok, replies: Sequence[str]) -> ScriptedEngine:
    it = iter(replies)
    return ScriptedEngine(tok, lambda context: next(it), continuable=False)


@pytest.fixture
def two_turns(tok):
    yield from serve(scripted(tok, ["Hi there", "It is 4"]), tok)


def test_a_chat_conversation_becomes_one_trajectory_of_the_recorded_ids(two_turns, tok) -> None:
    s = two_turns
    client = s.client("episode-1")
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}]
    r1 = client.chat.completions.create(model="tiny", messages=msgs)
    assert r1.choices[0].message.content == "Hi there"
    assert r1.choices[0].finish_reason == "stop" and r1.system_fingerprint == "scalerl-policy-0"
    msgs += [{"role": "assistant", "content": r1.choices[0].message.content},
             {"role": "user", "content": "What is 2+2?"}]
    r2 = client.chat.completions.create(model="tiny", messages=msgs)
    assert r2.choices[0].message.content == "It is 4"

    session = s.endpoint.sessions["episode-1"]
    assert [c.parent for c in session.calls] == [None, 0] and session.windows() == 1
    trace = session.final().trace
    first = tok.apply_chat_template(msgs[:2], tokenize=False, add_generation_prompt=True)
    assert trace.prompt_ids == tok.encode(first, add_special_tokens=False)
    # The engine was given exactly the stitched context: prompt + its own reply ids + inserted ids.
    assert s.engine.prompts_seen[1] == session.calls[1].prompt_ids
    assert s.engine.prompts_seen[1][: len(session.calls[0].trace.context)] == session.calls[0].trace.context
    # A char-level template writes content then EOS: the stitched context equals a fresh rendering.
    full = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert session.calls[1].prompt_ids == tok.encode(full, add_special_tokens=False)
    # Model tokens carry loss and the engine's log-probs; inserted tokens are masked, log-prob 0.
    reply1 = [*tok.encode("Hi there", add_special_tokens=False), tok.eos_token_id]
    reply2 = [*tok.encode("It is 4", add_special_tokens=False), tok.eos_token_id]
    kinds = [k for k, _, _ in trace.segments]
    assert kinds == ["model", "env", "model"]
    (_, a, b), (_, c, d), (_, e, f) = trace.segments
    assert trace.token_ids[a:b] == reply1 and trace.token_ids[e:f] == reply2
    assert trace.token_ids[c:d] == tok.encode("<|user|>What is 2+2?<|assistant|>", add_special_tokens=False)
    assert trace.loss_mask == [True] * (b - a) + [False] * (d - c) + [True] * (f - e)
    assert trace.logprobs == [-0.5] * (b - a) + [0.0] * (d - c) + [-0.5] * (f - e)
    assert s.endpoint.counters["stitched_calls"] == 1


class IdEngine(ScriptedEngine):
    """Emits fixed token ids (not the tokenizer's encoding of any text)."""

    def __init__(self, tok, replies: Sequence[list[int]]) -> None:
        super().__init__(tok, lambda c: "", continuable=False)
        self.replies = iter(replies)

    def _segment(self, s):
        return list(next(self.replies)), "stop"


def test_the_models_own_ids_are_kept_where_re_tokenizing_would_change_them(tok) -> None:
    # "<think>" one char at a time: re-tokenizing the text gives the single added token instead.
    chars = [tok.convert_tokens_to_ids(ch) for ch in "<think>"]
    merged = tok.encode("<think>", add_special_tokens=False)
    assert len(merged) == 1 and len(chars) == 7
    engine = IdEngine(tok, [[*chars, tok.eos_token_id], [tok.convert_tokens_to_ids("x"), tok.eos_token_id]])
    for s in serve(engine, tok):
        client = s.client("k")
        msgs = [{"role": "user", "content": "go"}]
        r1 = client.chat.completions.create(model="tiny", messages=msgs)
        assert r1.choices[0].message.content == "<think>"
        msgs += [{"role": "assistant", "content": "<think>"}, {"role": "user", "content": "more"}]
        client.chat.completions.create(model="tiny", messages=msgs)
        trace = s.endpoint.sessions["k"].final().trace
        _kind, a, b = trace.segments[0]
        assert trace.token_ids[a:b] == [*chars, tok.eos_token_id]
        assert engine.prompts_seen[1][len(trace.prompt_ids): len(trace.prompt_ids) + 7] == chars


def test_a_rewritten_history_starts_a_new_window_and_counts_the_untrained_tokens(tok) -> None:
    for s in serve(scripted(tok, ["one", "two"]), tok):
        client = s.client("k")
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "a"}])
        # The program sends back another assistant text than it got: nothing to stitch to.
        client.chat.completions.create(model="tiny", messages=[
            {"role": "user", "content": "a"}, {"role": "assistant", "content": "edited"},
            {"role": "user", "content": "b"}])
        session = s.endpoint.sessions["k"]
        assert [c.parent for c in session.calls] == [None, None] and session.windows() == 2
        assert session.untrained_tokens() == len("one") + 1
        assert session.final().trace.segments == [("model", 0, len("two") + 1)]


def test_sessions_are_kept_apart_by_api_key(tok) -> None:
    for s in serve(scripted(tok, ["x", "y"]), tok):
        s.client("a").chat.completions.create(model="tiny", messages=[{"role": "user", "content": "q"}])
        s.client("b").chat.completions.create(model="tiny", messages=[{"role": "user", "content": "q"}])
        assert set(s.endpoint.sessions) == {"a", "b"}
        assert all(len(x.calls) == 1 for x in s.endpoint.sessions.values())


def test_tool_calls_come_back_parsed_and_their_results_are_inserted(tok) -> None:
    call = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 2}}</tool_call>'
    tools = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
    for s in serve(scripted(tok, [call, "4"]), tok):
        client = s.client("k")
        msgs = [{"role": "user", "content": "2+2?"}]
        r1 = client.chat.completions.create(model="tiny", messages=msgs, tools=tools)
        m = r1.choices[0].message
        assert r1.choices[0].finish_reason == "tool_calls" and m.content == ""
        assert m.tool_calls[0].function.name == "add"
        assert json.loads(m.tool_calls[0].function.arguments) == {"a": 2, "b": 2}
        msgs += [m.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": m.tool_calls[0].id, "content": "4"}]
        r2 = client.chat.completions.create(model="tiny", messages=msgs, tools=tools)
        assert r2.choices[0].message.content == "4"
        session = s.endpoint.sessions["k"]
        assert session.calls[1].parent == 0 and session.tool_calls == 1
        trace = session.final().trace
        _, a, b = trace.segments[0]
        assert tok.decode(trace.token_ids[a:b], skip_special_tokens=True) == call  # the call as sampled


def test_text_completions_continue_from_the_recorded_ids(tok) -> None:
    for s in serve(scripted(tok, [" world", "!"]), tok):
        client = s.client("k")
        r1 = client.completions.create(model="tiny", prompt="hello")
        assert r1.choices[0].text == " world"
        r2 = client.completions.create(model="tiny", prompt="hello world. Again", logprobs=1)
        assert r2.choices[0].text == "!" and r2.choices[0].logprobs.token_logprobs == [-0.5, -0.5]
        session = s.endpoint.sessions["k"]
        assert session.calls[1].parent == 0
        trace = session.final().trace
        # The EOS id that ended " world" is not in the text the client sent back: not in the context.
        assert trace.context == tok.encode("hello world. Again", add_special_tokens=False) + \
            tok.encode("!", add_special_tokens=False) + [tok.eos_token_id]
        assert [k for k, _, _ in trace.segments] == ["model", "env", "model"]


def test_what_the_endpoint_cannot_serve_is_a_400_naming_the_field(tok) -> None:
    for s in serve(scripted(tok, ["x"] * 5), tok):
        client = s.client()
        msgs = [{"role": "user", "content": "q"}]
        with pytest.raises(openai.BadRequestError, match="logit_bias"):
            client.chat.completions.create(model="tiny", messages=msgs, logit_bias={"1": 5})
        with pytest.raises(openai.BadRequestError, match=r"messages\[0\].content\[0\]"):
            client.chat.completions.create(model="tiny", messages=[
                {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}])
        with pytest.raises(openai.BadRequestError, match="prompt"):
            client.completions.create(model="tiny", prompt=["a", "b"])
        assert s.endpoint.counters["requests_refused"] == 3


def test_a_real_engine_answers_with_the_behaviour_logprobs_it_recorded(tok) -> None:
    model = build_tiny_model(TinyModelSpec(hidden_size=32, num_layers=1, num_heads=1, num_kv_heads=1,
                                           intermediate_size=64, max_position_embeddings=256))
    engine = EmbeddedEngine(model, max_batch_size=4, seed=0)
    for s in serve(engine, tok):
        client = s.client("k")
        r = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                           max_tokens=8, logprobs=True, n=2, seed=3,
                                           extra_body={"return_token_ids": True})
        assert len(r.choices) == 2 and r.usage.completion_tokens <= 16
        calls = s.endpoint.sessions["k"].calls
        for choice, call in zip(r.choices, calls, strict=True):
            assert [e.logprob for e in choice.logprobs.content] == pytest.approx(
                call.trace.logprobs, abs=1e-6)
            assert choice.model_extra["token_ids"] == call.completion_ids
            assert all(lp <= 0 for lp in call.trace.logprobs) and set(call.trace.versions) == {0}
        models = client.models.list()
        assert [m.id for m in models.data] == ["tiny"]


def test_a_streamed_request_gets_the_finished_response_as_events(tok) -> None:
    for s in serve(scripted(tok, ["streamed reply", "text"]), tok):
        client = s.client("k")
        chunks = list(client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "q"}], stream=True,
            stream_options={"include_usage": True}))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text == "streamed reply"
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
        assert chunks[-1].usage.completion_tokens == len("streamed reply") + 1
        parts = list(client.completions.create(model="tiny", prompt="p", stream=True))
        assert "".join(p.choices[0].text for p in parts) == "text"
        assert s.endpoint.counters["streamed"] == 2


def test_the_session_header_wins_over_the_api_key(tok) -> None:
    for s in serve(scripted(tok, ["x"]), tok):
        client = openai.OpenAI(base_url=s.server.url, api_key="shared", max_retries=0,
                               default_headers={"X-Scalerl-Session": "episode-7"})
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "q"}])
        assert set(s.endpoint.sessions) == {"episode-7"}


def test_a_long_lived_endpoint_keeps_its_latest_sessions_and_a_broken_engine_fails_fast(tok) -> None:
    import asyncio

    endpoint = Endpoint(scripted(tok, ["a", "b", "c"]), tok, max_sessions=2)
    driver = EngineDriver(endpoint, idle_wait_s=0.01)
    try:
        for key in ("k1", "k2", "k3"):
            asyncio.run(endpoint.chat({"messages": [{"role": "user", "content": "q"}]}, key))
        assert list(endpoint.sessions) == ["k2", "k3"] and endpoint.counters["sessions_evicted"] == 1
    finally:
        driver.close()
    endpoint.fail_pending(RuntimeError("engine died"))
    with pytest.raises(RequestError, match="engine died") as refused:
        asyncio.run(endpoint.chat({"messages": [{"role": "user", "content": "q"}]}, "k4"))
    assert refused.value.status == 503
