"""What stands between the network and the endpoint: an ASGI middleware and a timed HTTP protocol.

`Guard(app, limits, bind)` answers, before the app sees the request:
  421 a Host header that is not a local name, the bind address or an `--allow-host` name (a page
      reaching 127.0.0.1 through DNS rebinding sends its own name), 403 an `Origin` whose host is
      not one of those (a browser page's cross-site request);
  401 a `/v1/` request without `Authorization: Bearer <the API key>` when one is set (compared in
      constant time, `hmac.compare_digest`; the key is never logged);
  415 a POST whose Content-Type is not `application/json`;
  413 a body over `max_body_bytes` (by its Content-Length, else as it arrives);
  408 a body that has not arrived `read_timeout_s` after the headers (the connection is closed);
  429 a generation request past `max_concurrent` in flight (`Retry-After: 1`).
The body is read whole here and handed to the app, so the app's own `receive()` then reports only
the client's disconnect (`scalerl.serving.http` cancels the generation on it).

`timed_protocol(read_timeout_s)` is uvicorn's h11 protocol with a deadline for a request's headers:
uvicorn itself closes an idle kept-alive connection (`timeout_keep_alive`) but waits forever for a
connection that sends nothing, or half a request line.
"""

from __future__ import annotations

import asyncio
import hmac
import json
from collections import Counter
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import urlsplit

from scalerl.serving.limits import ServeLimits

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


def host_name(host: str) -> str:
    """The name part of a Host header value (`[::1]:8000` -> `[::1]`, `a.b:80` -> `a.b`)."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[: host.find("]") + 1] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def bearer_ok(header: str | None, key: str) -> bool:
    """Whether an Authorization header carries `Bearer <key>` (constant-time comparison)."""
    if not header or header[:7].lower() != "bearer ":
        return False
    return hmac.compare_digest(header[7:].strip().encode(), key.encode())


async def _answer(send: Send, status: int, message: str, headers: dict[str, str] | None = None,
                  close: bool = False) -> None:
    body = json.dumps({"error": {"message": message, "type": "invalid_request_error", "param": None,
                                 "code": status}}).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    raw += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    if close:
        raw.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


class Guard:
    """See the module docstring. `counters` counts each refusal by status."""

    def __init__(self, app: Any, limits: ServeLimits, bind: str = "127.0.0.1") -> None:
        self.app = app
        self.limits = limits
        self.hosts = limits.hosts(bind)
        self.in_flight = 0
        self.counters: Counter[str] = Counter()

    def _refuse(self, status: int) -> None:
        self.counters[f"refused_{status}"] += 1

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            if scope["type"] == "websocket":
                await send({"type": "websocket.close", "code": 1008})
                return
            await self.app(scope, receive, send)
            return
        headers: dict[str, str] = {}
        for k, v in scope.get("headers", []):
            name = k.decode("latin-1").lower()
            if name in headers and name in ("host", "authorization", "content-length", "content-type"):
                self._refuse(400)  # two Hosts or two keys: which one counts is ambiguous
                await _answer(send, 400, f"header {name} given twice")
                return
            headers[name] = v.decode("latin-1")
        if host_name(headers.get("host", "")) not in self.hosts:
            self._refuse(421)
            await _answer(send, 421, "the Host header names no address of this server "
                                     "(scalerl serve --allow-host NAME adds one)")
            return
        origin = headers.get("origin")
        if origin is not None and origin != "null" and host_name(urlsplit(origin).netloc) not in self.hosts:
            self._refuse(403)
            await _answer(send, 403, "requests from another site's page are refused (Origin)")
            return
        if origin == "null":
            self._refuse(403)
            await _answer(send, 403, "requests from an opaque origin are refused (Origin: null)")
            return
        path = scope.get("path", "")
        key = self.limits.api_key
        if key and path.startswith("/v1/") and not bearer_ok(headers.get("authorization"), key):
            self._refuse(401)
            await _answer(send, 401, "missing or wrong API key (Authorization: Bearer KEY)",
                          {"WWW-Authenticate": "Bearer"})
            return
        if scope.get("method") != "POST":
            await self.app(scope, receive, send)
            return
        ctype = headers.get("content-type", "").split(";", 1)[0].strip().lower()
        if ctype != "application/json":
            self._refuse(415)
            await _answer(send, 415, f"Content-Type must be application/json, got {ctype or 'none'!r}",
                          close=True)
            return
        length = headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > self.limits.max_body_bytes):
            self._refuse(413)
            await _answer(send, 413, f"the request body is over {self.limits.max_body_bytes} bytes "
                                     "(scalerl serve --max-body-bytes)", close=True)
            return
        if self.in_flight >= self.limits.max_concurrent:
            self._refuse(429)
            await _answer(send, 429, f"{self.limits.max_concurrent} requests are in flight; retry later "
                                     "(scalerl serve --max-concurrent)", {"Retry-After": "1"}, close=True)
            return
        self.in_flight += 1
        try:
            await self._read_then_serve(scope, receive, send)
        finally:
            self.in_flight -= 1

    async def _read_then_serve(self, scope: Scope, receive: Receive, send: Send) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.limits.read_timeout_s
        body = bytearray()
        while True:
            try:
                message = await asyncio.wait_for(receive(), timeout=max(0.0, deadline - loop.time()))
            except TimeoutError:
                self._refuse(408)
                await _answer(send, 408, "the request body did not arrive within "
                                         f"{self.limits.read_timeout_s} s", close=True)
                return
            if message["type"] == "http.disconnect":
                self.counters["disconnected_before_body"] += 1
                return
            body += message.get("body", b"")
            if len(body) > self.limits.max_body_bytes:
                self._refuse(413)
                await _answer(send, 413, f"the request body is over {self.limits.max_body_bytes} bytes "
                                         "(scalerl serve --max-body-bytes)", close=True)
                return
            if not message.get("more_body", False):
                break
        handed = False

        async def replay() -> Message:
            nonlocal handed
            if not handed:
                handed = True
                return {"type": "http.request", "body": bytes(body), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


def timed_protocol(read_timeout_s: float) -> type:
    """uvicorn's h11 protocol closing a connection whose next request's headers have not arrived
    `read_timeout_s` after it opened or after its last response."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class TimedH11Protocol(H11Protocol):  # type: ignore[misc]
        _header_timer: asyncio.TimerHandle | None = None

        def _waiting_for_headers(self) -> bool:
            return self.cycle is None or self.cycle.response_complete

        def _arm(self) -> None:
            if self._header_timer is None:
                self._header_timer = self.loop.call_later(read_timeout_s, self._expire, self.cycle)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _expire(self, cycle_at_arm: Any) -> None:
            self._header_timer = None
            # Still no new request since the timer was armed: a silent or half-sent connection.
            if self.cycle is cycle_at_arm and self._waiting_for_headers() and not self.transport.is_closing():
                self.transport.close()

        def connection_made(self, transport: Any) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()

        def data_received(self, data: bytes) -> None:
            if self._waiting_for_headers():
                self._arm()  # the next request's bytes: its headers must complete in time
            super().data_received(data)
            if not self._waiting_for_headers():
                self._disarm()

        def on_response_complete(self) -> None:
            super().on_response_complete()  # arms uvicorn's keep-alive timer for an idle connection
            self._disarm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

    return TimedH11Protocol
