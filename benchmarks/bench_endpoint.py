"""The OpenAI-compatible endpoint's cost per call, and continuous batching across sessions.

1. A scripted engine (no model: the reply is fixed), so only the endpoint is timed: `Endpoint.chat`
   called directly (templating, stitching, queueing, the engine owner's `pump`), then the same call
   through HTTP with the `openai` client, then a bare uvicorn `GET /health` on this machine for
   comparison (what HTTP alone costs here), then what a refusal costs: a foreign Host (421) and a
   body too large by its Content-Length (413), both answered by the guard before any work.
2. The embedded engine with a random tiny model (2 layers, width 64): 1 session, then 8 concurrent
   sessions of one chat call each (32 tokens), tokens per second. The endpoint queues concurrent
   calls, so one engine step decodes them together.

    python benchmarks/bench_endpoint.py
"""

from __future__ import annotations

import asyncio
import socket
import sys
import time
from pathlib import Path

import httpx
import openai

from scalerl.models.tiny import TinyModelSpec, build_tiny_model, build_tiny_tokenizer
from scalerl.rollout.embedded import EmbeddedEngine
from scalerl.serving.endpoint import Endpoint
from scalerl.serving.http import EngineDriver, start_server

# The scripted engine is the tests' (tests/agentic/fakes.py): the repository root on the path, so the
# script runs as `python benchmarks/bench_endpoint.py` from a checkout without PYTHONPATH.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.agentic.fakes import ScriptedEngine

MESSAGES = [{"role": "user", "content": "hello"}]


def per_call(calls: int = 100) -> None:
    tok = build_tiny_tokenizer()
    endpoint = Endpoint(ScriptedEngine(tok, lambda context: "ok", continuable=False), tok)
    driver = EngineDriver(endpoint, idle_wait_s=0.001)
    server = start_server(endpoint)
    try:
        async def direct() -> float:
            start = time.perf_counter()
            for _ in range(calls):
                await endpoint.chat({"messages": MESSAGES}, "direct")
            return (time.perf_counter() - start) / calls

        print(f"Endpoint.chat, direct:          {asyncio.run(direct()) * 1e3:7.2f} ms/call ({calls} calls)")
        client = openai.OpenAI(base_url=server.url, api_key="http", max_retries=0)
        client.chat.completions.create(model="x", messages=MESSAGES)
        start = time.perf_counter()
        for _ in range(calls):
            client.chat.completions.create(model="x", messages=MESSAGES)
        print(f"through HTTP, openai client:    {(time.perf_counter() - start) / calls * 1e3:7.2f} ms/call")
        with httpx.Client() as http:
            url = server.url.replace("/v1", "/health")
            http.get(url)
            start = time.perf_counter()
            for _ in range(calls):
                http.get(url)
            health = (time.perf_counter() - start) / calls
            print(f"GET /health (uvicorn, httpx):   {health * 1e3:7.2f} ms/call")
            start = time.perf_counter()
            for _ in range(calls):
                assert http.get(url, headers={"Host": "rebind.example"}).status_code == 421
            host = (time.perf_counter() - start) / calls
            print(f"refused, foreign Host (421):    {host * 1e3:7.2f} ms/call")
            # A raw request (an HTTP client would refuse to declare a length it does not send).
            head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json"
                    f"\r\nContent-Length: {1 << 30}\r\nConnection: close\r\n\r\n").encode()
            start = time.perf_counter()
            for _ in range(calls):
                with socket.create_connection(("127.0.0.1", server.port)) as sock:
                    sock.sendall(head)
                    assert sock.recv(64).startswith(b"HTTP/1.1 413")
            size = (time.perf_counter() - start) / calls
            print(f"refused, 1 GiB Content-Length:  {size * 1e3:7.2f} ms/call")
    finally:
        server.close()
        driver.close()


def batching(sessions: tuple[int, ...] = (1, 8), max_tokens: int = 32) -> None:
    tok = build_tiny_tokenizer()
    spec = TinyModelSpec(hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=128,
                         max_position_embeddings=512)
    endpoint = Endpoint(EmbeddedEngine(build_tiny_model(spec), max_batch_size=8, seed=0), tok)
    driver = EngineDriver(endpoint, idle_wait_s=0.001)
    server = start_server(endpoint)

    async def run(k: int) -> tuple[float, int]:
        clients = [openai.AsyncOpenAI(base_url=server.url, api_key=f"s{i}", max_retries=0) for i in range(k)]
        start = time.perf_counter()
        replies = await asyncio.gather(*(c.chat.completions.create(
            model="x", messages=MESSAGES, max_tokens=max_tokens, seed=i) for i, c in enumerate(clients)))
        return time.perf_counter() - start, sum(r.usage.completion_tokens for r in replies)

    try:
        for k in sessions:
            elapsed, tokens = asyncio.run(run(k))
            print(f"embedded tiny, {k} session(s): {tokens:4d} tokens in {elapsed:6.3f} s = "
                  f"{tokens / elapsed:6.0f} tokens/s")
    finally:
        server.close()
        driver.close()


if __name__ == "__main__":
    per_call()
    batching()
