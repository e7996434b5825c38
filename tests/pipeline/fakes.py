"""Small stand-ins for the engine, trainer, curriculum and verifier, with random speeds.

`FakeEngine` follows the engine protocol: continuous batching over `max_batch_size` slots, one
token per in-flight sequence per `step()`, `start_version` stamped at slot admission, every token
tagged with the version of the weights at the step that produced it, `update_weights` callable
from another thread. How many tokens a sample takes is drawn from its own seeded generator
(heavy-tailed, so late starters often overtake early ones); each step can also sleep a random time.
Tokens: token 0 is the sample index, so a verifier can know which sample it sees.
"""

from __future__ import annotations

import random
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from scalerl.data.pool import PoolExhaustedError
from scalerl.data.records import PromptRecord
from scalerl.rollout.protocol import Completion, GenerationRequest
from scalerl.training.batch import ScoredGroup


@dataclass
class _Seq:
    request: GenerationRequest
    index: int
    length: int
    tokens: list[int] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    start_version: int = -1


class FakeEngine:
    def __init__(
        self,
        max_batch_size: int = 16,
        *,
        step_sleep: tuple[float, float] = (0.0, 0.0),
        long_tail: float = 0.1,
        max_len: int = 40,
        seed: int = 0,
        version: int = 0,
    ) -> None:
        self.max_batch_size = max_batch_size
        self.step_sleep = step_sleep
        self.long_tail = long_tail
        self.max_len = max_len
        self._rng = random.Random(seed)
        self._version = version
        self._waiting: deque[_Seq] = deque()
        self._slots: list[_Seq] = []
        self._lock = threading.Lock()
        self.updates: list[int] = []
        self.steps = 0
        self.busy_during_train = 0
        self.trainer_busy = threading.Event()

    @property
    def version(self) -> int:
        return self._version

    def _length(self, request: GenerationRequest, index: int) -> int:
        seed = request.params.seed
        rng = random.Random(f"{seed}/{index}") if seed is not None else self._rng
        if rng.random() < self.long_tail:
            return rng.randint(self.max_len // 2, self.max_len)
        return rng.randint(1, max(1, self.max_len // 8))

    def submit(self, requests: Sequence[GenerationRequest]) -> None:
        with self._lock:
            for r in requests:
                for i in range(r.params.n):
                    length = min(self._length(r, i), r.params.max_new_tokens)
                    self._waiting.append(_Seq(r, i, length))

    def num_unfinished(self) -> int:
        with self._lock:
            return len(self._waiting) + len(self._slots)

    def step(self) -> list[Completion]:
        lo, hi = self.step_sleep
        if hi > 0:
            time.sleep(random.uniform(lo, hi))
        with self._lock:
            if self.trainer_busy.is_set():
                self.busy_during_train += 1
            self.steps += 1
            while self._waiting and len(self._slots) < self.max_batch_size:
                seq = self._waiting.popleft()
                seq.start_version = self._version
                self._slots.append(seq)
            done: list[Completion] = []
            for seq in list(self._slots):
                seq.tokens.append(seq.index if not seq.tokens else 7)
                seq.versions.append(self._version)
                if len(seq.tokens) >= seq.length:
                    self._slots.remove(seq)
                    reason = "length" if seq.length >= seq.request.params.max_new_tokens else "stop"
                    done.append(
                        Completion(
                            request_id=seq.request.request_id,
                            sample_index=seq.index,
                            prompt_ids=list(seq.request.prompt_ids),
                            token_ids=list(seq.tokens),
                            logprobs=[-1.0] * len(seq.tokens),
                            versions=list(seq.versions),
                            loss_mask=[True] * len(seq.tokens),
                            finish_reason=reason,
                            start_version=seq.start_version,
                        )
                    )
            return done

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        if self.num_unfinished():
            raise RuntimeError("FakeEngine.generate needs an idle engine")
        self.submit(requests)
        out: list[Completion] = []
        while self.num_unfinished():
            out.extend(self.step())
        order = {r.request_id: i for i, r in enumerate(requests)}
        return sorted(out, key=lambda c: (order[c.request_id], c.sample_index))

    def update_weights(self, state: Mapping[str, torch.Tensor], version: int) -> None:
        with self._lock:
            self._version = version
            self.updates.append(version)


class FakeTrainer:
    """Records what each step trained at which version; sleeps a random time per step."""

    def __init__(
        self,
        engine: FakeEngine | None = None,
        step_time: tuple[float, float] = (0.0, 0.0),
        seed: int = 0,
        noop_every: int = 0,
    ) -> None:
        self._version = 0
        self.engine = engine
        self.step_time = step_time
        self.noop_every = noop_every
        self._rng = random.Random(seed)
        self.batches: list[tuple[int, list[ScoredGroup]]] = []

    @property
    def version(self) -> int:
        return self._version

    def step(self, groups: Sequence[ScoredGroup]) -> dict[str, float]:
        if self.engine is not None:
            self.engine.trainer_busy.set()
        try:
            self.batches.append((self._version, list(groups)))
            lo, hi = self.step_time
            if hi > 0:
                time.sleep(self._rng.uniform(lo, hi))
            if not (self.noop_every and len(self.batches) % self.noop_every == 0):
                self._version += 1
            return {"loss": 0.5, "version": float(self._version)}
        finally:
            if self.engine is not None:
                self.engine.trainer_busy.clear()

    def weights_for_engine(self) -> dict[str, torch.Tensor]:
        return {"w": torch.tensor([float(self._version)])}

    def load_version(self, version: int) -> None:
        self._version = version


def make_records(n: int, prefix: str = "p", **metadata: Any) -> list[PromptRecord]:
    return [PromptRecord(id=f"{prefix}{i}", task="fake", prompt=f"question {i}", metadata=dict(metadata))
            for i in range(n)]


class FakeSource:
    """Sequential prompts `p0, p1, ...` (finite when `limit` is set); checkpointable position."""

    def __init__(self, limit: int | None = None) -> None:
        self.limit = limit
        self.position = 0
        self.drawn: list[str] = []
        self.refills = 0
        self.reports: dict[str, list[list[float]]] = {}
        self.lock_violations = 0
        self._busy = threading.Lock()

    def _record(self, i: int) -> PromptRecord:
        # Prompts with id divisible by 5 are "solved": every sample is correct (zero variance).
        return PromptRecord(id=f"p{i}", task="fake", prompt=f"question {i}", metadata={"easy": i % 5 == 0})

    def next_prompts(self, k: int, *, refill: bool = False) -> list[PromptRecord]:
        if not self._busy.acquire(blocking=False):
            self.lock_violations += 1
            self._busy.acquire()
        try:
            if self.limit is not None and self.position >= self.limit:
                raise PoolExhaustedError("no prompts left")
            end = self.position + k if self.limit is None else min(self.limit, self.position + k)
            out = [self._record(i) for i in range(self.position, end)]
            self.position = end
            self.drawn.extend(r.id for r in out)
            if refill:
                self.refills += len(out)
            return out
        finally:
            self._busy.release()

    def report(self, prompt_id: str, rewards: Sequence[float], success_threshold: float = 0.0) -> bool:
        self.reports.setdefault(prompt_id, []).append(list(rewards))
        return len(set(rewards)) > 1

    def state_dict(self) -> dict[str, Any]:
        return {"position": self.position}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.position = int(state["position"])


class FakeScorer:
    """Sample `i` of a prompt is correct iff `i` is even (every sample for "easy" prompts).

    `fail_every`: every such sample index (of prompt ids divisible by 7) raises instead.
    """

    def __init__(self, fail_every: int = 0) -> None:
        self.fail_every = fail_every
        self.calls = 0
        self._lock = threading.Lock()

    def score(self, record: PromptRecord, completion_text: str) -> float:
        with self._lock:
            self.calls += 1
        index = int(completion_text.split()[0])
        number = int(record.id.lstrip("p")) if record.id.lstrip("p").isdigit() else 1
        if self.fail_every and number % 7 == 0 and index % self.fail_every == 0:
            raise RuntimeError("verifier crashed")
        if record.metadata.get("easy"):
            return 1.0
        if "n_correct" in record.metadata:
            return 1.0 if index < record.metadata["n_correct"] else 0.0
        return 1.0 if index % 2 == 0 else 0.0


def decode(ids: list[int]) -> str:
    return " ".join(str(i) for i in ids)


def encode(record: PromptRecord) -> list[int]:
    return [1, 2, 3]


class Rows:
    """A metrics sink that keeps the rows."""

    def __init__(self) -> None:
        self.steps: list[tuple[int, dict[str, Any]]] = []
        self.evals: list[tuple[int, dict[str, Any]]] = []
        self.samples: list[tuple[int, dict[str, Any]]] = []

    def log_step(self, step: int, metrics: Mapping[str, Any]) -> None:
        self.steps.append((step, dict(metrics)))

    def log_eval(self, step: int, metrics: Mapping[str, Any]) -> None:
        self.evals.append((step, dict(metrics)))

    def log_samples(self, step: int, rows: list[Mapping[str, Any]]) -> None:
        self.samples.extend((step, dict(r)) for r in rows)
