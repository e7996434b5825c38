"""Math answers checked with math-verify, time-bounded by killable worker processes.

`MathVerifier.check(completion, gold)` extracts the last `\\boxed{}` (else `<answer>` tag) after the
thinking (`answer.extract_final_answer`) and asks a worker process (`math_worker.py`) whether it equals the
gold answer. A worker that does not answer within `timeout_s` is killed and replaced, so a
pathological expression costs one worker restart, never a stuck trainer thread. Calls are
thread-safe; at most `workers` judgements run at once, the rest wait for a free worker.

`timeout_s=None` judges in the calling thread instead (no processes, no time bound): for
trusted inputs and quick scripts only.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import queue
import select
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from scalerl.rewards.answer import extract_final_answer

logger = logging.getLogger(__name__)

Status = Literal["ok", "error", "timeout", "no_answer"]

_WORKER_SCRIPT = Path(__file__).with_name("math_worker.py")


@dataclass(frozen=True)
class MathResult:
    """One judgement: `status` is "ok" when the answer was judged (right or wrong)."""

    correct: bool
    status: Status
    detail: str
    extracted: str | None = None


class VerifierTimeoutError(TimeoutError):
    """A verifier exceeded its time bound."""


def _worker_env() -> dict[str, str]:
    """No secrets for a process that parses model output: only what imports need."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8", "OMP_NUM_THREADS": "1"}
    if "PYTHONPATH" in os.environ:
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    return env


class _Worker:
    """One `math_worker.py` process and its line protocol."""

    def __init__(self, python: str, memory_mb: int, start_timeout_s: float) -> None:
        self.proc = subprocess.Popen(
            [python, str(_WORKER_SCRIPT), "--memory-mb", str(memory_mb)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            close_fds=True,
            env=_worker_env(),
        )
        self._buf = b""
        try:
            ready = self._read_line(time.monotonic() + start_timeout_s)
        except Exception:
            self.kill()
            raise
        if not ready.get("ready"):
            self.kill()
            raise RuntimeError(f"math worker sent {ready!r} instead of its ready line")

    def _read_line(self, deadline: float) -> dict[str, Any]:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buf:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise VerifierTimeoutError("math worker did not answer in time")
            readable, _, _ = select.select([fd], [], [], remaining)
            if not readable:
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                raise RuntimeError(f"math worker exited (code {self.proc.poll()})")
            self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        return json.loads(line)

    def ask(self, gold: str, pred: str, timeout_s: float) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps({"gold": gold, "pred": pred}) + "\n").encode())
        self.proc.stdin.flush()
        return self._read_line(time.monotonic() + timeout_s)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                stream.close()


class MathVerifier:
    """Thread-safe math-verify judge with a hard per-answer time bound (see module doc)."""

    def __init__(
        self,
        timeout_s: float | None = 5.0,
        workers: int = 2,
        memory_mb: int = 4096,
        python: str = sys.executable,
        start_timeout_s: float = 120.0,
    ) -> None:
        if timeout_s is not None and timeout_s <= 0:
            raise ValueError(f"timeout_s: must be > 0 or None, got {timeout_s}")
        if workers < 1:
            raise ValueError(f"workers: must be >= 1, got {workers}")
        self.timeout_s = timeout_s
        self.workers = workers
        self.memory_mb = memory_mb
        self.python = python
        self.start_timeout_s = start_timeout_s
        self._slots = threading.BoundedSemaphore(workers)
        self._idle: queue.LifoQueue[_Worker] = queue.LifoQueue()
        self._lock = threading.Lock()
        self._closed = False
        self.restarts = 0  # workers killed after a timeout or crash, for the caller's logs

    def judge(self, gold: str, pred: str) -> tuple[bool, str]:
        """(correct, detail) for a bare predicted answer; raises VerifierTimeoutError or ValueError."""
        if self.timeout_s is None:
            from scalerl.rewards.math_worker import judge

            return judge(gold, pred)
        with self._slots:
            if self._closed:
                raise RuntimeError("MathVerifier is closed")
            try:
                worker = self._idle.get_nowait()
            except queue.Empty:
                worker = _Worker(self.python, self.memory_mb, self.start_timeout_s)
            try:
                reply = worker.ask(gold, pred, self.timeout_s)
            except BaseException:
                worker.kill()
                with self._lock:
                    self.restarts += 1
                raise
            self._idle.put(worker)
        if not reply["ok"]:
            raise ValueError(reply["detail"])
        return bool(reply["correct"]), str(reply["detail"])

    def check(self, completion: str, gold: str) -> MathResult:
        """Judge a whole completion against the gold answer string; never raises on bad output."""
        if not isinstance(gold, str) or not gold.strip():
            return MathResult(False, "error", f"gold answer: expected a non-empty string, got {gold!r}")
        pred = extract_final_answer(completion)
        if pred is None:
            return MathResult(False, "no_answer", "no \\boxed{} or <answer> after the thinking")
        try:
            correct, detail = self.judge(gold, pred)
        except VerifierTimeoutError:
            return MathResult(False, "timeout", f"math-verify exceeded {self.timeout_s}s", pred)
        except Exception as exc:
            return MathResult(False, "error", f"{type(exc).__name__}: {exc}", pred)
        return MathResult(correct, "ok", detail, pred)

    def close(self) -> None:
        """Stop all idle workers; later judgements raise."""
        self._closed = True
        while True:
            try:
                self._idle.get_nowait().kill()
            except queue.Empty:
                break


_default: MathVerifier | None = None
_default_lock = threading.Lock()


def default_math_verifier() -> MathVerifier:
    """The process-wide verifier used by `math_reward` (created on first use)."""
    global _default
    with _default_lock:
        if _default is None:
            _default = MathVerifier()
            atexit.register(_default.close)
        return _default


def configure_math(**kwargs: Any) -> MathVerifier:
    """Replace the process-wide verifier (`MathVerifier` keyword arguments)."""
    global _default
    new = MathVerifier(**kwargs)
    with _default_lock:
        old, _default = _default, new
    atexit.register(new.close)
    if old is not None:
        old.close()
    return new


def math_reward(completion: str, answer: str) -> float:
    """1.0 if the last `\\boxed{}` after `</think>` equals `answer` (per math-verify), else 0.0.

    Timeouts and errors score 0.0 here; `MathVerifier.check` reports which it was.
    """
    if not isinstance(completion, str):
        raise TypeError(f"completion: expected str, got {type(completion).__name__}")
    if not isinstance(answer, str):
        raise TypeError(f"answer: expected the gold answer as a str, got {type(answer).__name__}")
    return 1.0 if default_math_verifier().check(completion, answer).correct else 0.0
