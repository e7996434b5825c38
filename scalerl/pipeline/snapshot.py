"""Exact resume: the whole pipeline between the curriculum and the trainer, in the checkpoint.

A checkpoint's JSON state (`Driver.state_dict`) lists the prompts that were admitted but not yet
trained; a resume re-issues them, so no prompt is lost or trained twice, but their rollouts are
generated again under the checkpoint's weights: the resumed run is a valid run, not the same run.
For the schedules that are a function of their seed (`sync`, `ppo_offpolicy`, `pipeline` with
`schedule: interleaved`) the checkpoint also holds a snapshot (`pipeline_snapshot.pt`, next to
the trainer's files and covered by the manifest) of:

* the engine: every sequence in flight or waiting (tokens, behaviour log-probs, per-token
  versions, its sampler's generator state, interruption budget), the KV cache, the engine's seed
  stream, and its weights when they are not the trainer's (mid-round in `ppo_offpolicy`, or
  before an interleaved in-flight update lands);
* the generator: groups generating (with their finished samples), groups scored and queued for
  the trainer, tickets, refill debt, counters;
* the staleness controller's outstanding counts, the schedule's clock (interleaved ticks, the
  round in progress).

Restored, the run continues with the very tokens, groups and updates the uninterrupted run would
have produced: the same final weights, bit for bit (tests/reliability/test_kill_cycles.py). The
snapshot needs a quiescent, single-threaded loop and an engine with `snapshot()` / `restore()`
(the embedded engine); otherwise (`threaded` pipeline, vLLM, Ray engine pools) it is absent and
the resume re-issues, which the JSON state always allows. A snapshot that cannot be restored
(another engine, another `generation.max_batch_size`) falls back to re-issuing, with a warning.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict
from typing import Any, Protocol, runtime_checkable

from scalerl.data.records import PromptRecord
from scalerl.pipeline.interfaces import ReadyGroup
from scalerl.rollout.protocol import Completion
from scalerl.training.batch import ScoredGroup

SNAPSHOT_FILE = "pipeline_snapshot.pt"
SNAPSHOT_VERSION = 1


@runtime_checkable
class SnapshotEngine(Protocol):
    """An engine whose in-flight state can be saved and restored exactly (the embedded engine)."""

    def snapshot(self, include_weights: bool = False) -> dict[str, Any]: ...

    def restore(self, state: Mapping[str, Any]) -> None: ...


def completion_to_plain(c: Completion) -> dict[str, Any]:
    return asdict(c)


def completion_from_plain(d: Mapping[str, Any]) -> Completion:
    return Completion(**dict(d))


def ready_group_to_plain(item: ReadyGroup) -> dict[str, Any]:
    g = item.group
    return {
        "ticket": item.ticket,
        "admit_version": item.admit_version,
        "record": g.record.to_dict(),
        "completions": [completion_to_plain(c) for c in g.completions],
        "rewards": list(g.rewards),
        "correct": None if g.correct is None else list(g.correct),
        "old_logprobs": None if g.old_logprobs is None else [list(r) for r in g.old_logprobs],
    }


def ready_group_from_plain(d: Mapping[str, Any]) -> ReadyGroup:
    group = ScoredGroup(
        record=PromptRecord.from_dict(d["record"]),
        completions=[completion_from_plain(c) for c in d["completions"]],
        rewards=list(d["rewards"]),
        correct=None if d["correct"] is None else list(d["correct"]),
        old_logprobs=None if d["old_logprobs"] is None else [list(r) for r in d["old_logprobs"]],
    )
    return ReadyGroup(int(d["ticket"]), int(d["admit_version"]), group)
