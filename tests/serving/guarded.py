"""Helpers for the endpoint's abuse tests: an engine that holds requests until released, a served
endpoint with chosen limits, and raw-socket requests (a client that sends what it likes)."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Sequence

from scalerl.rollout.protocol import Completion, GenerationRequest
from scalerl.serving.endpoint import Endpoint
from scalerl.serving.http import EngineDriver, start_server
from scalerl.serving.limits import ServeLimits


class GateEngine:
    """Answers each sample with token 5 + EOS, but only while `gate` is set (else it holds them);
    `abort` drops held requests and records their ids."""

    def __init__(self, eos: int, gate_open: bool = True) -> None:
        self.eos = eos
        self.gate = threading.Event()
        if gate_open:
            self.gate.set()
        self.version = 0
        self.waiting: list[GenerationRequest] = []
        self.aborted: list[str] = []
        self.submitted: list[str] = []
        self.lock = threading.Lock()
        self.fail_next_step: BaseException | None = None

    def submit(self, requests: Sequence[GenerationRequest]) -> None:
        with self.lock:
            self.waiting += list(requests)
            self.submitted += [r.request_id for r in requests]

    def num_unfinished(self) -> int:
        with self.lock:
            return sum(r.params.n for r in self.waiting)

    def abort(self, request_ids: Sequence[str]) -> list[str]:
        with self.lock:
            found = [r.request_id for r in self.waiting if r.request_id in set(request_ids)]
            self.waiting = [r for r in self.waiting if r.request_id not in set(request_ids)]
            self.aborted += found
        return found

    def step(self) -> list[Completion]:
        if self.fail_next_step is not None:
            raise self.fail_next_step
        if not self.gate.wait(0.01):
            return []
        with self.lock:
            done, self.waiting = self.waiting, []
        return [Completion(r.request_id, i, list(r.prompt_ids), [5, self.eos], [-0.5, -0.5], [0, 0],
                           [True, True], "stop", 0)
                for r in done for i in range(r.params.n)]


class Served:
    def __init__(self, engine, tok, limits: ServeLimits | None = None, **endpoint_kw) -> None:
        self.engine = engine
        self.endpoint = Endpoint(engine, tok, model_name="tiny", limits=limits, **endpoint_kw)
        self.driver = EngineDriver(self.endpoint, idle_wait_s=0.01)
        self.server = start_server(self.endpoint, limits=limits)
        self.port = self.server.port
        self.base = f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        self.server.close()
        self.driver.close()


def raw_request(port: int, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None,
                timeout: float = 10.0) -> tuple[int, bytes]:
    """(status, body) of one request sent byte for byte over a fresh connection."""
    h = {"Host": f"127.0.0.1:{port}", "Content-Type": "application/json", "Content-Length": str(len(body)),
         "Connection": "close", **(headers or {})}
    head = f"{method} {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in h.items() if v is not None)
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(head.encode() + b"\r\n" + body)
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    status = int(data.split(b" ", 2)[1])
    return status, data.split(b"\r\n\r\n", 1)[1]


def chat_body(content: str = "hi", **extra) -> bytes:
    return json.dumps({"model": "tiny", "messages": [{"role": "user", "content": content}], **extra}).encode()
