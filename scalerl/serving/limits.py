"""The bounds an OpenAI-compatible endpoint puts on its clients (`scalerl serve`'s options).

One `ServeLimits` is read by the HTTP guard (`scalerl.serving.guard`: body size, read timeout,
concurrency, API key, Host/Origin, content type), by the request check
(`scalerl.serving.validate`: `n`, `max_tokens`, `logprobs` caps) and by the endpoint (sessions).
The defaults are what `scalerl serve` uses; an agent environment's endpoint in training uses them
too (its clients are the run's own programs on localhost).
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Names a browser or a local client uses for this machine. A DNS-rebinding page reaches 127.0.0.1
# under its own name (`evil.example`), so any other Host is refused.
LOCAL_HOSTS: tuple[str, ...] = ("localhost", "127.0.0.1", "::1", "[::1]")


@dataclass(frozen=True)
class ServeLimits:
    max_body_bytes: int = 1 << 20  # a larger request body is a 413
    max_n: int = 8  # choices per request
    max_tokens: int = 4096  # a request's max_tokens (the default is `Endpoint.max_tokens_default`)
    max_logprobs: int = 5  # completions' `logprobs` / chat's `top_logprobs`
    max_stop: int = 16  # stop strings per request
    max_tools: int = 128  # tools per request
    max_concurrent: int = 32  # generation requests in flight; one more is a 429
    max_connections: int = 128  # open connections + tasks; uvicorn answers 503 past it
    read_timeout_s: float = 10.0  # a request's headers and body must arrive within this
    keep_alive_s: float = 5.0  # an idle kept-alive connection is closed after this
    max_sessions: int = 256  # the most recent sessions kept for stitching (LRU)
    max_calls_per_session: int | None = 256  # a session past it starts afresh (counted)
    api_key: str | None = field(default=None, repr=False)  # never printed
    allowed_hosts: tuple[str, ...] = ()  # Host names accepted besides LOCAL_HOSTS and the bind address

    def hosts(self, bind: str) -> frozenset[str]:
        """Every Host name (without port) accepted: localhost names, the bind address (unless a
        wildcard) and the extra names."""
        names = {*LOCAL_HOSTS, *(h.lower() for h in self.allowed_hosts)}
        if bind not in ("0.0.0.0", "::", ""):
            names.add(bind.lower())
            if ":" in bind:
                names.add(f"[{bind.lower()}]")
        return frozenset(names)
