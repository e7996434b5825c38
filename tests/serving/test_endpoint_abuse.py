"""`scalerl serve`'s endpoint under careless and hostile clients: every request bounded (size,
context, caps, time, concurrency), authenticated when asked, only local Host names and JSON, a
disconnect cancels the generation, a failed engine fails /health and ends the command."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from pathlib import Path

import pytest

httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")
pytest.importorskip("uvicorn")

from scalerl.assembly.evaluate import resolve_source  # noqa: E402
from scalerl.assembly.serve import start_serving  # noqa: E402
from scalerl.cli import main  # noqa: E402
from scalerl.models.tiny import TinyModelSpec, build_tiny_model, build_tiny_tokenizer  # noqa: E402
from scalerl.rollout.embedded import EmbeddedEngine  # noqa: E402
from scalerl.rollout.protocol import GenerationRequest, SamplingParams  # noqa: E402
from scalerl.serving.limits import ServeLimits  # noqa: E402
from tests.serving.guarded import GateEngine, Served, chat_body, raw_request  # noqa: E402
from tests.serving.test_serve_cli import save_tiny  # noqa: E402


@pytest.fixture(scope="module")
def tok():
    return build_tiny_tokenizer()


@pytest.fixture(scope="module")
def served(tok):
    s = Served(GateEngine(tok.eos_token_id), tok, ServeLimits(max_n=2, max_tokens=64, max_logprobs=2))
    yield s
    s.close()


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    return save_tiny(tmp_path_factory.mktemp("m") / "tiny")  # max_position_embeddings 256


# --------------------------------------------------------------------------- context and size
def test_an_oversized_prompt_is_a_400_naming_both_numbers_and_the_next_request_is_a_200(tiny_dir) -> None:
    serving = start_serving(resolve_source(str(tiny_dir)), device="cpu", max_tokens=4)
    try:
        client = openai.OpenAI(base_url=serving.url, api_key="x", max_retries=0, timeout=60)
        long = "7" * 300  # the tiny tokenizer: one id a character, past the model's 256 positions
        with pytest.raises(openai.BadRequestError) as refused:
            client.completions.create(model="tiny", prompt=long, max_tokens=4)
        # Prompt ids: 300 characters, no special tokens added; context: max_position_embeddings.
        assert "prompt (300 tokens) + max_tokens (4)" in str(refused.value)
        assert "context (256 tokens)" in str(refused.value)
        # Within the context but past it with max_tokens: refused; the default max_tokens is cut.
        with pytest.raises(openai.BadRequestError, match=r"\(250 tokens\) \+ max_tokens \(10\)"):
            client.completions.create(model="tiny", prompt="7" * 250, max_tokens=10)
        r = client.completions.create(model="tiny", prompt="7" * 254)
        assert r.usage.completion_tokens <= 2
        r = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                           max_tokens=3)
        assert r.choices[0].finish_reason in ("stop", "length") and r.usage.completion_tokens <= 3
        assert serving.endpoint.counters["context_refused"] == 2
    finally:
        serving.close()


LIMITS_READ_S = 3.0


def test_a_body_over_the_limit_is_a_413_by_header_and_by_bytes(tok) -> None:
    s = Served(GateEngine(tok.eos_token_id), tok,
               ServeLimits(max_body_bytes=2000, read_timeout_s=LIMITS_READ_S))
    try:
        assert raw_request(s.port, "POST", "/v1/chat/completions", chat_body("x" * 3000))[0] == 413
        # Refused by its Content-Length alone, before any of the body is read (or waited for).
        start = time.monotonic()
        status, _ = raw_request(s.port, "POST", "/v1/chat/completions", b"", {"Content-Length": "1000000000"})
        assert status == 413 and time.monotonic() - start < LIMITS_READ_S
        # A client that lies about the length (chunked: no Content-Length) is cut off as bytes arrive.
        body = chat_body("x" * 3000)
        chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
        status, text = raw_request(s.port, "POST", "/v1/chat/completions", chunked,
                                   {"Content-Length": None, "Transfer-Encoding": "chunked"})
        assert status == 413 and b"2000 bytes" in text
        assert raw_request(s.port, "POST", "/v1/chat/completions", chat_body("x" * 100))[0] == 200
    finally:
        s.close()


# --------------------------------------------------------------------------- field checks
BAD_FIELDS = [
    ({"temperature": float("nan")}, "temperature"),
    ({"temperature": 3}, "temperature"),
    ({"max_tokens": True}, "max_tokens"),
    ({"max_tokens": 65}, "max_tokens"),  # over the cap (64)
    ({"max_tokens": "5"}, "max_tokens"),
    ({"n": 0}, "n"),
    ({"n": 3}, "n"),  # over the cap (2)
    ({"stop": {"a": 1}}, "stop"),
    ({"stop": [1, 2]}, r"stop\[0\]"),
    ({"stop": ["a"] * 17}, "stop"),
    ({"tools": "add"}, "tools"),
    ({"tools": [{"type": "function"}]}, r"tools\[0\].function"),
    ({"tools": [{"type": "function", "function": {"name": 3}}]}, r"tools\[0\].function.name"),
    ({"tools": [{"type": "retrieval", "function": {"name": "a"}}]}, r"tools\[0\].type"),
    ({"stream": True, "stream_options": "yes"}, "stream_options"),
    ({"stream": True, "stream_options": {"include_usage": "yes"}}, "stream_options.include_usage"),
    ({"stream": "yes"}, "stream"),
    ({"stream_options": {"include_usage": True}}, "stream_options"),  # without stream
    ({"logprobs": 1}, "logprobs"),  # chat: a boolean
    ({"logprobs": True, "top_logprobs": 3}, "top_logprobs"),  # over the cap (2)
    ({"seed": 1.5}, "seed"),
    ({"top_p": 0}, "top_p"),
    ({"presence_penalty": 0.5}, "presence_penalty"),
    ({"logit_bias": {"1": 5}}, "logit_bias"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"response_format": {"type": "json_object"}}, "response_format.type"),
    ({"temprature": 0.5}, "temprature: unknown field"),
    ({"messages": "hi"}, "messages"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, r"messages\[0\].role"),
    ({"messages": [{"role": "user", "content": 5}]}, r"messages\[0\].content"),
    ({"messages": [{"role": "user", "content": "x", "mood": "sad"}]}, r"messages\[0\].mood"),
    ({"messages": [{"role": "assistant", "content": "", "tool_calls": "x"}]}, r"messages\[0\].tool_calls"),
    ({"messages": [{"role": "assistant", "content": "", "tool_calls": [{"function": "f"}]}]},
     r"messages\[0\].tool_calls\[0\].function"),
    ({"messages": [{"role": "assistant", "content": "",
                    "tool_calls": [{"function": {"name": "f", "arguments": 3}}]}]},
     r"messages\[0\].tool_calls\[0\].function.arguments"),
    ({"messages": [{"role": "user", "content": "x", "tool_calls": []}]}, r"messages\[0\].tool_calls"),
]


def test_a_response_message_sent_back_whole_is_accepted(served) -> None:
    client = openai.OpenAI(base_url=f"{served.base}/v1", api_key="echo", max_retries=0)
    msgs = [{"role": "user", "content": "q"}]
    reply = client.chat.completions.create(model="tiny", messages=msgs).choices[0].message
    msgs += [reply.model_dump(), {"role": "user", "content": "more"}]  # nulls and all
    assert msgs[1]["function_call"] is None and "annotations" in msgs[1]
    assert client.chat.completions.create(model="tiny", messages=msgs).choices[0].message.content is not None
    with pytest.raises(openai.BadRequestError, match=r"messages\[1\].audio: unknown field"):
        client.chat.completions.create(model="tiny", messages=[*msgs[:1], {**msgs[1], "audio": {"id": "a"}}])


@pytest.mark.parametrize(("extra", "field"), BAD_FIELDS, ids=[f for _, f in BAD_FIELDS])
def test_a_malformed_field_is_a_400_naming_it_never_a_500(served, extra, field) -> None:
    body = {"model": "tiny", "messages": [{"role": "user", "content": "q"}], **extra}
    r = httpx.post(f"{served.base}/v1/chat/completions", content=json.dumps(body),
                   headers={"Content-Type": "application/json"})
    assert r.status_code == 400, r.text
    message = r.json()["error"]["message"]
    assert pytest.importorskip("re").match(field, message), message
    assert served.endpoint.counters["requests_failed"] == 0


BAD_COMPLETIONS = [
    ({"prompt": ""}, "prompt"),
    ({"prompt": ["a", "b"]}, "prompt"),
    ({"prompt": [1, True]}, "prompt"),
    ({"prompt": {"text": "a"}}, "prompt"),
    ({"prompt": "a", "logprobs": 3}, "logprobs"),  # over the cap (2)
    ({"prompt": "a", "logprobs": True}, "logprobs"),
    ({"prompt": "a", "echo": True}, "echo"),
    ({"prompt": "a", "best_of": 4}, "best_of"),
    ({"prompt": "a", "suffix": "z"}, "suffix"),
    ({}, "prompt: required"),
]


@pytest.mark.parametrize(("body", "field"), BAD_COMPLETIONS, ids=[f for _, f in BAD_COMPLETIONS])
def test_a_malformed_completions_field_is_a_400_naming_it(served, body, field) -> None:
    r = httpx.post(f"{served.base}/v1/completions", json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["message"].startswith(field), r.text


def test_a_body_that_is_not_a_json_object_is_a_400(served) -> None:
    for raw in (b"{", b"[1, 2]", b"\xff\xfe", b"[" * 100_000 + b"]" * 100_000):
        status, text = raw_request(served.port, "POST", "/v1/chat/completions", raw)
        assert status in (400, 413), text
    assert served.endpoint.counters["requests_failed"] == 0


# --------------------------------------------------------------------------- who may call
def test_with_an_api_key_a_request_without_it_is_a_401_and_the_key_is_no_session(tok) -> None:
    s = Served(GateEngine(tok.eos_token_id), tok, ServeLimits(api_key="k-secret"))
    try:
        url = f"{s.base}/v1/chat/completions"
        assert httpx.post(url, content=chat_body()).status_code == 401  # the key is checked first
        assert httpx.post(url, json=json.loads(chat_body())).status_code == 401
        bad = httpx.post(url, json=json.loads(chat_body()), headers={"Authorization": "Bearer k-secreT"})
        assert bad.status_code == 401 and bad.headers["www-authenticate"] == "Bearer"
        assert httpx.get(f"{s.base}/v1/models").status_code == 401
        assert httpx.get(f"{s.base}/health").status_code == 200  # liveness needs no key
        client = openai.OpenAI(base_url=s.server.url, api_key="k-secret", max_retries=0)
        assert client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "q"}])
        assert list(s.endpoint.sessions) == ["default"]  # the key is a credential, not a session name
    finally:
        s.close()


def test_a_foreign_host_or_origin_is_refused_and_an_allowed_one_served(tok) -> None:
    s = Served(GateEngine(tok.eos_token_id), tok, ServeLimits(allowed_hosts=("box.lan",)))
    try:
        path = "/v1/chat/completions"
        # DNS rebinding: the page's own name in Host, though the socket is 127.0.0.1.
        assert raw_request(s.port, "POST", path, chat_body(), {"Host": "evil.example"})[0] == 421
        assert raw_request(s.port, "GET", "/v1/models", headers={"Host": "evil.example:80"})[0] == 421
        # No Host at all: h11 refuses an HTTP/1.1 request without one.
        assert raw_request(s.port, "POST", path, chat_body(), {"Host": None})[0] == 400
        assert raw_request(s.port, "POST", path, chat_body(), {"Origin": "https://evil.example"})[0] == 403
        assert raw_request(s.port, "POST", path, chat_body(), {"Origin": "null"})[0] == 403
        # A text/plain POST is what a page may send without a CORS preflight: refused.
        assert raw_request(s.port, "POST", path, chat_body(), {"Content-Type": "text/plain"})[0] == 415
        assert raw_request(s.port, "POST", path, chat_body(), {"Host": "box.lan:8000"})[0] == 200
        assert raw_request(s.port, "POST", path, chat_body(), {"Host": "localhost"})[0] == 200
        assert raw_request(s.port, "POST", path, chat_body(),
                           {"Origin": f"http://127.0.0.1:{s.port}"})[0] == 200
        assert s.server.server.config.loaded_app.app.counters["refused_421"] == 2  # type: ignore[union-attr]
    finally:
        s.close()


# --------------------------------------------------------------------------- time and load
def test_requests_over_the_concurrency_limit_get_a_429(tok) -> None:
    engine = GateEngine(tok.eos_token_id, gate_open=False)
    s = Served(engine, tok, ServeLimits(max_concurrent=2))
    try:
        results: list[int] = []

        def post() -> None:
            results.append(raw_request(s.port, "POST", "/v1/chat/completions", chat_body())[0])

        held = [threading.Thread(target=post) for _ in range(2)]
        for t in held:
            t.start()
        deadline = time.monotonic() + 10
        while s.endpoint.pending() < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        status, text = raw_request(s.port, "POST", "/v1/chat/completions", chat_body())
        assert status == 429 and b"2 requests are in flight" in text
        engine.gate.set()
        for t in held:
            t.join(10)
        assert results == [200, 200]
        assert raw_request(s.port, "POST", "/v1/chat/completions", chat_body())[0] == 200
    finally:
        s.close()


def test_connections_over_the_limit_get_a_503(tok) -> None:
    s = Served(GateEngine(tok.eos_token_id), tok, ServeLimits(max_connections=3))
    try:
        idle = [socket.create_connection(("127.0.0.1", s.port)) for _ in range(2)]
        deadline = time.monotonic() + 10
        while len(s.server.server.server_state.connections) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert raw_request(s.port, "POST", "/v1/chat/completions", chat_body())[0] == 503
        for c in idle:
            c.close()
        while s.server.server.server_state.connections and time.monotonic() < deadline:
            time.sleep(0.01)
        assert raw_request(s.port, "POST", "/v1/chat/completions", chat_body())[0] == 200
    finally:
        s.close()


def test_a_client_that_disconnects_has_its_generation_cancelled(tok) -> None:
    engine = GateEngine(tok.eos_token_id, gate_open=False)
    s = Served(engine, tok)
    try:
        body = chat_body()
        with socket.create_connection(("127.0.0.1", s.port)) as c:
            c.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
                      f"application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
            deadline = time.monotonic() + 10
            while not engine.submitted and time.monotonic() < deadline:
                time.sleep(0.01)
            assert len(engine.submitted) == 1
        deadline = time.monotonic() + 10
        while not engine.aborted and time.monotonic() < deadline:
            time.sleep(0.01)
        assert engine.aborted == engine.submitted  # the engine was told to drop it
        assert s.endpoint.counters["requests_cancelled"] == 1 and s.endpoint.pending() == 0
        assert s.endpoint.counters["requests_disconnected"] == 1
        engine.gate.set()
        assert raw_request(s.port, "POST", "/v1/chat/completions", chat_body())[0] == 200
    finally:
        s.close()


def test_the_embedded_engine_drops_an_aborted_request(tok) -> None:
    spec = TinyModelSpec(hidden_size=32, num_layers=1, num_heads=1, num_kv_heads=1, intermediate_size=64,
                         max_position_embeddings=256)
    engine = EmbeddedEngine(build_tiny_model(spec), max_batch_size=2, seed=0, eos_token_ids=(10_000,))
    params = SamplingParams(n=2, max_new_tokens=50)
    engine.submit([GenerationRequest("a", [3, 4, 5], params), GenerationRequest("b", [3, 4], params)])
    engine.step()  # "a"'s two samples run, "b"'s wait
    assert engine.num_unfinished() == 4
    assert engine.abort(["a", "b", "zz"]) == ["a", "b"]
    assert engine.num_unfinished() == 0 and engine.step() == [] and engine.stats.aborted == 2
    engine.submit([GenerationRequest("c", [3], SamplingParams(max_new_tokens=2))])
    done = []
    while engine.num_unfinished():
        done += engine.step()
    assert [c.request_id for c in done] == ["c"] and done[0].num_tokens == 2


def _closed_within(port: int, send: bytes, seconds: float) -> tuple[bool, bytes]:
    """Whether the server closes a connection that sent `send` and then nothing, and what it said."""
    with socket.create_connection(("127.0.0.1", port)) as c:
        c.settimeout(seconds)
        c.sendall(send)
        data = b""
        try:
            while chunk := c.recv(4096):
                data += chunk
        except TimeoutError:
            return False, data
        return True, data


def test_silent_half_sent_and_idle_connections_are_closed(tok) -> None:
    s = Served(GateEngine(tok.eos_token_id), tok, ServeLimits(read_timeout_s=0.5, keep_alive_s=1.0))
    try:
        start = time.monotonic()
        assert _closed_within(s.port, b"", 5)[0]  # connects, sends nothing
        assert _closed_within(s.port, b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127", 5)[0]
        closed, said = _closed_within(s.port, b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                      b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{", 5)
        assert closed and said.startswith(b"HTTP/1.1 408")
        # A kept-alive connection: one answer, then closed once idle for keep_alive_s.
        body = chat_body()
        closed, said = _closed_within(s.port, b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                      b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                                      % (len(body), body), 5)
        assert closed and said.startswith(b"HTTP/1.1 200")
        assert time.monotonic() - start < 10
    finally:
        s.close()


# --------------------------------------------------------------------------- sessions and failure
def test_sessions_are_bounded_least_recently_used_first_and_by_calls(tok) -> None:
    s = Served(GateEngine(tok.eos_token_id), tok, max_sessions=2, max_calls_per_session=2)
    try:
        def call(key: str) -> None:
            asyncio.run(s.endpoint.chat({"messages": [{"role": "user", "content": "q"}]}, key))

        for key in ("a", "b", "a", "c"):  # "a" used after "b": "b" is the least recently used
            call(key)
        assert list(s.endpoint.sessions) == ["a", "c"] and s.endpoint.counters["sessions_evicted"] == 1
        call("a")  # its third call: past the cap of 2, the session starts afresh
        assert len(s.endpoint.sessions["a"].calls) == 1 and s.endpoint.counters["sessions_restarted"] == 1
    finally:
        s.close()


def test_a_failed_engine_fails_health_and_every_request_with_a_503(tok) -> None:
    engine = GateEngine(tok.eos_token_id)
    s = Served(engine, tok)
    try:
        assert httpx.get(f"{s.base}/health").status_code == 200
        engine.fail_next_step = MemoryError("the engine ran out of memory")
        r = httpx.post(f"{s.base}/v1/chat/completions", json=json.loads(chat_body()), timeout=10)
        assert r.status_code == 503 and "ran out of memory" in r.json()["error"]["message"]
        health = httpx.get(f"{s.base}/health")
        assert health.status_code == 503 and "MemoryError" in health.json()["error"]
        r = httpx.post(f"{s.base}/v1/chat/completions", json=json.loads(chat_body()))
        assert r.status_code == 503 and "engine failed" in r.json()["error"]["message"]
    finally:
        s.close()


def test_scalerl_serve_ends_with_exit_1_and_the_traceback_when_its_engine_fails(tiny_dir, monkeypatch,
                                                                                capsys) -> None:
    import scalerl.assembly.serve as assembly_serve

    started = {}
    real = assembly_serve.start_serving

    def start_then_break(*args, **kwargs):
        serving = real(*args, **kwargs)
        started["serving"] = serving
        serving.endpoint.fail_pending(RuntimeError("engine thread died"))
        return serving

    monkeypatch.setattr(assembly_serve, "start_serving", start_then_break)
    assert main(["serve", str(tiny_dir), "--port", "0", "--device", "cpu"]) == 1
    err = capsys.readouterr().err
    assert "engine thread died" in err and "Traceback" in err and "the engine failed" in err
    assert not started["serving"].closers  # closed: the port and the engine are released


# --------------------------------------------------------------------------- --record and help
def test_record_is_refused_before_the_model_loads_and_never_holds_a_credential(tiny_dir, tmp_path,
                                                                               capsys) -> None:
    missing_model = str(tmp_path / "no-such-model")  # the record check comes first: this never loads
    existing = tmp_path / "calls.jsonl"
    existing.write_text("keep me\n")
    for record, says in ((existing, "exists; pass --overwrite"), (tmp_path, "is a directory"),
                         (tmp_path / "nope" / "calls.jsonl", "does not exist")):
        assert main(["serve", missing_model, "--port", "0", "--record", str(record)]) == 2
        assert says in capsys.readouterr().err
    assert existing.read_text() == "keep me\n"

    serving = start_serving(resolve_source(str(tiny_dir)), device="cpu", max_tokens=2, record=str(existing),
                            overwrite=True)
    try:
        client = openai.OpenAI(base_url=serving.url, api_key="sk-very-secret-token", max_retries=0,
                               timeout=60)
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}])
    finally:
        serving.close()
    text = existing.read_text()
    assert "keep me" not in text and "sk-very-secret-token" not in text
    (line,) = [json.loads(x) for x in text.splitlines()]
    assert line["session"].startswith("s-") and len(line["session"]) == 18 and line["kind"] == "chat"


def test_serve_help_says_streaming_is_buffered() -> None:
    import argparse

    from scalerl.cli.serve import register

    sub = argparse.ArgumentParser().add_subparsers()
    register(sub)
    text = sub.choices["serve"].format_help()
    assert "Streaming is buffered" in text and "--api-key" in text and "SCALERL_API_KEY" in text
    assert "Not supported (a 400 naming the field): streaming" not in text


def test_the_api_key_comes_from_the_option_else_the_environment_and_is_never_shown(monkeypatch) -> None:
    import argparse

    from scalerl.cli.serve import limits_from_args, register

    sub = argparse.ArgumentParser().add_subparsers()
    register(sub)
    parse = sub.choices["serve"].parse_args
    monkeypatch.delenv("SCALERL_API_KEY", raising=False)
    assert limits_from_args(parse(["m"])).api_key is None
    monkeypatch.setenv("SCALERL_API_KEY", "from-env")
    assert limits_from_args(parse(["m"])).api_key == "from-env"
    limits = limits_from_args(parse(["m", "--api-key", "from-flag", "--allow-host", "a.lan", "--max-n", "3"]))
    assert limits.api_key == "from-flag" and limits.allowed_hosts == ("a.lan",) and limits.max_n == 3
    assert "from-flag" not in repr(limits)
