"""Scoring finished groups off the generator thread, with bounded parallelism.

Verifiers can be slow (math-verify in a worker process, code in a sandbox with a timeout); scoring
on the generator thread would stall decoding. Each sample is one task on a thread pool of
`max_workers`; a group is ready when its last sample is scored, and the generator collects ready
groups at its next iteration (so the curriculum and the queue are only touched by that thread).
A verifier may return a number or an outcome with `reward`, `correct` and `status` (the rewards
router's `RewardOutcome`). A verifier that raises gives the sample `failure_reward`; both that and
an outcome with status "error"/"timeout" are counted as verifier failures, never silently: one
broken verifier call must not kill a run of thousands of steps, and a broken verifier must show.
A non-finite reward (NaN from a custom scorer) is a failure too, scored `failure_reward`.
A scorer that scores some tasks a group at a time (`batches(task)` and `score_group(record,
texts)`: the router's reward models) gets the whole group in one pool task, so the model batches it.
"""

from __future__ import annotations

import logging
import math
import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from scalerl.data.records import PromptRecord
from scalerl.rollout.protocol import Completion


class Verdict(Protocol):
    """A verifier's outcome (e.g. `scalerl.rewards.RewardOutcome`); `status` "error"/"timeout"
    marks a verifier failure."""

    @property
    def reward(self) -> float: ...

    @property
    def correct(self) -> bool: ...

    @property
    def status(self) -> str: ...


@runtime_checkable
class Scorer(Protocol):
    """The verifier for one sample (e.g. `scalerl.rewards.RewardRouter`): the reward of
    `completion_text` as an answer to `record`, as a number or a `Verdict`."""

    def score(self, record: PromptRecord, completion_text: str) -> float | Verdict: ...


log = logging.getLogger(__name__)
FAILURE_STATUSES = frozenset({"error", "timeout"})
# one sample's (reward, correct, failed, parts): `parts` the verdict's per-function scores
# (`rewards.functions`), None for a verifier that has none
_Result = tuple[float, bool, bool, Mapping[str, float] | None]


@dataclass
class ScoredBatch:
    """One group's verdicts, in sample order."""

    key: Any
    record: PromptRecord
    completions: list[Completion]
    rewards: list[float]
    correct: list[bool]
    failures: int
    failed: list[bool] | None = None  # per sample, in sample order
    parts: list[Mapping[str, float] | None] | None = None  # per sample: each reward function's score


class _Pending:
    def __init__(self, key: Any, record: PromptRecord, completions: list[Completion]) -> None:
        self.key = key
        self.record = record
        self.completions = completions
        self.rewards: list[float] = [0.0] * len(completions)
        self.correct: list[bool] = [False] * len(completions)
        self.failed: list[bool] = [False] * len(completions)
        self.parts: list[Mapping[str, float] | None] = [None] * len(completions)
        self.left = len(completions)


class GroupScorer:
    """Scores groups asynchronously (`max_workers >= 1`) or inline (`max_workers == 0`).

    `on_ready` is called from a worker thread whenever a group becomes ready, so a waiting
    generator can wake up. A sample is correct when the verifier's outcome says so or, for a plain
    number, when it is `> success_threshold`.
    """

    def __init__(
        self,
        scorer: Scorer,
        decode: Callable[[list[int]], str],
        *,
        max_workers: int = 4,
        success_threshold: float = 0.0,
        failure_reward: float = 0.0,
        on_ready: Callable[[], None] | None = None,
    ) -> None:
        if max_workers < 0:
            raise ValueError(f"max_workers: must be >= 0, got {max_workers}")
        self.scorer = scorer
        self.decode = decode
        self.success_threshold = float(success_threshold)
        self.failure_reward = float(failure_reward)
        self.on_ready = on_ready
        self._executor = (
            ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="scalerl-score")
            if max_workers
            else None
        )
        self._lock = threading.Lock()
        self._ready: deque[ScoredBatch] = deque()
        self._ready_cond = threading.Condition(self._lock)
        self._pending = 0
        self.failures = 0
        self.samples_scored = 0
        self.samples_cancelled = 0  # queued when `close()` ran, never scored
        self.last_error: str | None = None

    @property
    def pending(self) -> int:
        """Groups submitted and not yet collected (being scored or ready)."""
        with self._lock:
            return self._pending

    def _note_failure(self, message: str) -> None:
        with self._lock:
            first = self.last_error is None
            self.last_error = message
        if first:
            log.warning("verifier failed: %s", message)

    def _score_one(self, record: PromptRecord, completion: Completion) -> _Result:
        """(reward, correct, failed, parts) of one sample."""
        try:
            # A scorer that reads the completion itself (trajectories: the answer turn, or the
            # environment's own score) rather than its decoded text.
            by_completion = getattr(self.scorer, "score_completion", None)
            if callable(by_completion):
                verdict = by_completion(record, completion, self.decode)
            else:
                verdict = self.scorer.score(record, self.decode(completion.token_ids))
        except Exception as err:  # a verifier bug or crash is counted and scored as a failure
            self._note_failure(f"{type(err).__name__}: {err} (prompt {record.id!r})")
            return self.failure_reward, False, True, None
        return self._judged(record, verdict)

    def _judged(self, record: PromptRecord, verdict: float | Verdict) -> _Result:
        parts: Mapping[str, float] | None = None
        if isinstance(verdict, (int, float)):
            reward = float(verdict)
            correct = reward > self.success_threshold
        else:
            reward = float(verdict.reward)
            correct = bool(verdict.correct)
            parts = getattr(verdict, "parts", None)
            if getattr(verdict, "status", "ok") in FAILURE_STATUSES:
                detail = getattr(verdict, "detail", "")
                self._note_failure(f"status {verdict.status!r}: {detail} (prompt {record.id!r})")
                return reward, correct, True, parts
        if not math.isfinite(reward):
            # A NaN reward would turn every advantage of the batch (batch normalisation) into NaN.
            self._note_failure(f"non-finite reward {reward!r} (prompt {record.id!r})")
            return self.failure_reward, False, True, parts
        return reward, correct, False, parts

    def _finish_sample(self, pending: _Pending, index: int, result: _Result) -> None:
        reward, correct, failed, parts = result
        with self._lock:
            pending.rewards[index] = reward
            pending.correct[index] = correct and not failed
            pending.failed[index] = failed
            pending.parts[index] = parts
            pending.left -= 1
            if pending.left:
                return
            n_failed = sum(pending.failed)
            self.failures += n_failed
            self.samples_scored += len(pending.completions)
            self._ready.append(
                ScoredBatch(
                    key=pending.key,
                    record=pending.record,
                    completions=pending.completions,
                    rewards=pending.rewards,
                    correct=list(pending.correct),
                    failures=n_failed,
                    failed=list(pending.failed),
                    parts=list(pending.parts) if any(p is not None for p in pending.parts) else None,
                )
            )
            self._ready_cond.notify_all()
        if self.on_ready is not None:
            self.on_ready()

    def _batched(self, record: PromptRecord) -> bool:
        batches = getattr(self.scorer, "batches", None)
        return callable(batches) and bool(batches(record.task)) and callable(
            getattr(self.scorer, "score_group", None))

    def _score_group(self, record: PromptRecord, completions: list[Completion]) -> list[_Result]:
        """(reward, correct, failed, parts) of each sample of a group scored in one call."""
        try:
            texts = [self.decode(c.token_ids) for c in completions]
            verdicts = self.scorer.score_group(record, texts)  # type: ignore[attr-defined]
            if len(verdicts) != len(completions):
                raise ValueError(f"score_group returned {len(verdicts)} verdicts for "
                                 f"{len(completions)} samples")
        except Exception as err:
            self._note_failure(f"{type(err).__name__}: {err} (prompt {record.id!r})")
            return [(self.failure_reward, False, True, None)] * len(completions)
        return [self._judged(record, v) for v in verdicts]

    def _finish_group(self, pending: _Pending, future: Future[list[_Result]]) -> None:
        if future.cancelled():
            with self._lock:
                self.samples_cancelled += len(pending.completions)
            return
        for i, result in enumerate(future.result()):
            self._finish_sample(pending, i, result)

    def submit(self, key: Any, record: PromptRecord, completions: Sequence[Completion]) -> None:
        """Schedule a group; `key` comes back with its `ScoredBatch`."""
        if not completions:
            raise ValueError(f"completions: empty group for prompt {record.id!r}")
        pending = _Pending(key, record, list(completions))
        with self._lock:
            self._pending += 1
        if self._batched(record):
            if self._executor is None:
                for i, result in enumerate(self._score_group(record, pending.completions)):
                    self._finish_sample(pending, i, result)
            else:
                group_future = self._executor.submit(self._score_group, record, pending.completions)
                group_future.add_done_callback(lambda f: self._finish_group(pending, f))
            return
        for i, completion in enumerate(pending.completions):
            if self._executor is None:
                self._finish_sample(pending, i, self._score_one(record, completion))
            else:
                future: Future[_Result] = self._executor.submit(
                    self._score_one, record, completion
                )
                future.add_done_callback(lambda f, i=i: self._on_done(pending, i, f))

    def _on_done(self, pending: _Pending, index: int, future: Future[_Result]) -> None:
        # `close()` cancels the samples still queued when a run stops (a slow code sandbox leaves
        # many); their groups are abandoned, counted, and must not raise in the pool's callback.
        if future.cancelled():
            with self._lock:
                self.samples_cancelled += 1
            return
        self._finish_sample(pending, index, future.result())

    def collect(self) -> list[ScoredBatch]:
        """Groups scored since the last call, in the order they became ready."""
        with self._lock:
            out = list(self._ready)
            self._ready.clear()
            self._pending -= len(out)
            return out

    def wait(self, timeout: float | None) -> bool:
        """Block until some group is ready (True) or `timeout` passes (False)."""
        with self._ready_cond:
            if not self._ready:
                self._ready_cond.wait(timeout)
            return bool(self._ready)

    def drain(self, timeout: float | None = None) -> bool:
        """Block until every submitted group is ready to collect (True) or `timeout` passes (False).

        The interleaved pipeline schedule calls it after each engine step so that which groups have
        been scored at a given point does not depend on the verifier threads' timing.
        """
        with self._ready_cond:
            return self._ready_cond.wait_for(lambda: len(self._ready) == self._pending, timeout)

    def score_all(
        self, groups: Sequence[tuple[Any, PromptRecord, Sequence[Completion]]]
    ) -> list[ScoredBatch]:
        """Score several groups and wait for all of them; results in the order given."""
        keys = [key for key, _, _ in groups]
        if len(set(map(repr, keys))) != len(keys):
            raise ValueError("score_all: keys must be distinct")
        for key, record, completions in groups:
            self.submit(key, record, completions)
        got: dict[str, ScoredBatch] = {}
        while len(got) < len(groups):
            self.wait(0.05)
            for batch in self.collect():
                got[repr(batch.key)] = batch
        return [got[repr(k)] for k in keys]

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)
