"""The HTTP side: a Starlette app over an `Endpoint`, served by uvicorn in a background thread.

Routes: `POST /v1/chat/completions`, `POST /v1/completions`, `GET /v1/models`, `GET /health`,
behind `scalerl.serving.guard.Guard` (Host, Origin, API key, content type, body size and read
time, concurrency). Errors are OpenAI-shaped (`{"error": {"message", "type", "param", "code"}}`):
400 for a request the endpoint cannot serve (the message names the field), 503 once the engine
has failed (`/health` then answers 503 too), 500 with the exception for a failure of ours. The
session is the `X-Scalerl-Session` header, else the bearer token when no API key is set (the
token then names the client's session), else "default". A client that disconnects before its
answer has its generation cancelled (`Endpoint.cancel`).

Streaming is buffered: `stream: true` is answered with server-sent events of the finished response
(the engine finishes a sequence before the endpoint sees any of its tokens).

`start_server(endpoint, host, port, limits)` binds first (port 0: an ephemeral port, read back from
the socket) and returns once uvicorn accepts connections; `ServerHandle.close()` stops it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Any

from scalerl.serving.endpoint import Endpoint
from scalerl.serving.errors import RequestError
from scalerl.serving.guard import Guard, timed_protocol
from scalerl.serving.limits import ServeLimits

SESSION_HEADER = "X-Scalerl-Session"


def _session_key(request: Any, api_key: str | None) -> str:
    # A client that cannot choose its API key per episode (a verifiers harness reads it from an
    # environment variable) names its session in a header instead.
    named = request.headers.get(SESSION_HEADER.lower(), "").strip()
    if named:
        return str(named)
    auth = request.headers.get("authorization", "")
    if api_key is None and auth.lower().startswith("bearer ") and auth[7:].strip():
        return auth[7:].strip()
    return "default"  # with an API key set the bearer token is a credential, never a session name


async def _disconnected(receive: Any) -> None:
    """Returns when the client has gone (the body was read already: only `http.disconnect` comes)."""
    while (await receive())["type"] != "http.disconnect":
        pass


def _error(status: int, message: str, kind: str) -> Any:
    from starlette.responses import JSONResponse

    return JSONResponse({"error": {"message": message, "type": kind, "param": None, "code": status}},
                        status_code=status)


def sse_events(response: dict[str, Any], include_usage: bool) -> list[str]:
    """A finished response as OpenAI server-sent events: one chunk with each choice's whole
    content (and tool calls), one with its finish reason, the usage chunk if asked, `[DONE]`."""
    chat = response["object"] == "chat.completion"
    head = {k: response[k] for k in ("id", "created", "model", "system_fingerprint")}
    head["object"] = "chat.completion.chunk" if chat else "text_completion"
    chunks = []
    for c in response["choices"]:
        if chat:
            m = c["message"]
            delta: dict[str, Any] = {"role": "assistant", "content": m.get("content") or ""}
            if m.get("tool_calls"):
                delta["tool_calls"] = [{"index": j, **call} for j, call in enumerate(m["tool_calls"])]
            first = {"index": c["index"], "delta": delta, "logprobs": c.get("logprobs"),
                     "finish_reason": None}
            last = {"index": c["index"], "delta": {}, "logprobs": None, "finish_reason": c["finish_reason"]}
        else:
            first = {"index": c["index"], "text": c["text"], "logprobs": c.get("logprobs"),
                     "finish_reason": None}
            last = {"index": c["index"], "text": "", "logprobs": None, "finish_reason": c["finish_reason"]}
        for key in ("token_ids",):
            if key in c:
                first[key] = c[key]
        chunks += [{**head, "choices": [first]}, {**head, "choices": [last]}]
    if include_usage:
        chunks.append({**head, "choices": [], "usage": response["usage"]})
    return [f"data: {json.dumps(x)}\n\n" for x in chunks] + ["data: [DONE]\n\n"]


def build_app(endpoint: Endpoint, limits: ServeLimits | None = None, bind: str = "127.0.0.1") -> Any:
    """The ASGI app serving `endpoint` behind a `Guard` with `limits` (default `ServeLimits()`)."""
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse, Response, StreamingResponse
    from starlette.routing import Route

    def handler(kind: str) -> Any:
        async def route(request: Any) -> Any:
            try:
                body = await request.json()
            except Exception:
                return _error(400, "the request body is not JSON", "invalid_request_error")
            if not isinstance(body, dict):
                return _error(400, "the request body must be a JSON object", "invalid_request_error")
            try:
                run = endpoint.chat if kind == "chat" else endpoint.completion
                work = asyncio.ensure_future(run(body, _session_key(request, guard.limits.api_key)))
                gone = asyncio.ensure_future(_disconnected(request.receive))
                try:
                    await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    gone.cancel()
                if not work.done():  # the client went away: nobody reads the answer
                    work.cancel()
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await work
                    endpoint.counters["requests_disconnected"] += 1
                    return Response(status_code=499)
                response = work.result()
                # Streaming is buffered: the finished response, then sent as server-sent events.
                stream = body.get("stream") is True
                include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
                if stream:
                    endpoint.counters["streamed"] += 1
                    return StreamingResponse(iter(sse_events(response, include_usage)),
                                             media_type="text/event-stream")
                return JSONResponse(response)
            except RequestError as err:
                endpoint.counters["requests_refused"] += 1
                return _error(err.status, str(err), "invalid_request_error")
            except Exception as err:  # ours: the traceback goes to the log, the client gets a 500
                endpoint.counters["requests_failed"] += 1
                traceback.print_exc()
                return _error(500, f"{type(err).__name__}: {err}", "server_error")

        return route

    async def models(request: Any) -> Any:
        return JSONResponse({"object": "list", "data": [
            {"id": endpoint.model_name, "object": "model", "created": 0, "owned_by": "scalerl"}]})

    async def health(request: Any) -> Any:
        if endpoint.broken is not None:
            return JSONResponse({"status": "engine failed", "error": repr(endpoint.broken)}, status_code=503)
        return JSONResponse({"status": "ok", "policy_version": endpoint.engine.version})

    app = Starlette(routes=[
        Route("/v1/chat/completions", handler("chat"), methods=["POST"]),
        Route("/v1/completions", handler("completion"), methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
    ])
    guard = Guard(app, limits or ServeLimits(), bind)
    return guard


@dataclass
class ServerHandle:
    url: str  # http://host:port/v1, what an OpenAI client takes as base_url
    port: int
    server: Any
    thread: threading.Thread

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


def start_server(endpoint: Endpoint, host: str = "127.0.0.1", port: int = 0,
                 timeout_s: float = 30.0, limits: ServeLimits | None = None) -> ServerHandle:
    """Serve `endpoint` on `host:port` from a daemon thread; returns once it accepts connections."""
    limits = limits or endpoint.limits
    return serve_app(build_app(endpoint, limits, host), host, port, timeout_s, limits)


def serve_app(app: Any, host: str = "127.0.0.1", port: int = 0, timeout_s: float = 30.0,
              limits: ServeLimits | None = None) -> ServerHandle:
    """Serve any ASGI `app` on `host:port` (0: ephemeral) from a daemon thread: idle connections
    closed after `limits.keep_alive_s`, headers due within `limits.read_timeout_s`, at most
    `limits.max_connections` connections (uvicorn answers 503 past it)."""
    try:
        import uvicorn
    except ImportError as err:
        from scalerl.config import ConfigError

        raise ConfigError("the OpenAI-compatible endpoint needs starlette and uvicorn: "
                          "pip install 'scalerl[serve]'") from err
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # Accepted connections inherit it: without it a kept-alive connection's response (headers and
    # body written separately) waits out the client's delayed ACK, ~40 ms a call.
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind((host, port))
    except OSError as err:  # in use, or not an address of this machine: the user's choice
        sock.close()
        from scalerl.inputs import InputError

        raise InputError(f"--port/--host: cannot listen on {host}:{port} ({err.strerror or err})") from None
    bound = sock.getsockname()[1]
    limits = limits or ServeLimits()
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off",
                            http=timed_protocol(limits.read_timeout_s),
                            timeout_keep_alive=max(1, round(limits.keep_alive_s)),
                            limit_concurrency=limits.max_connections, h11_max_incomplete_event_size=64 * 1024)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="scalerl-endpoint",
                              daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout_s
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError(f"the endpoint on {host}:{bound} did not start")
        time.sleep(0.01)
    return ServerHandle(f"http://{host}:{bound}/v1", bound, server, thread)


class EngineDriver:
    """Steps an endpoint's engine from a thread of its own (`scalerl serve`: nobody else does)."""

    def __init__(self, endpoint: Endpoint, idle_wait_s: float = 0.05) -> None:
        self.endpoint = endpoint
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(idle_wait_s,), name="scalerl-driver",
                                        daemon=True)
        self.error: BaseException | None = None
        self._thread.start()

    def _run(self, idle_wait_s: float) -> None:
        try:
            while not self._stop.is_set():
                self.endpoint.pump(idle_wait_s)
        except BaseException as err:  # the engine broke: every waiting client gets the error
            self.error = err
            traceback.print_exc()
            self.endpoint.fail_pending(err)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
