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

from collections.abc import Callable, Mapping
from dataclasses import asdict
from typing import Any, Protocol, runtime_checkable

from scalerl.data.records import PromptRecord
from scalerl.pipeline.interfaces import ReadyGroup
from scalerl.rollout.protocol import Completion
from scalerl.rollout.support import SupportIds
from scalerl.training.batch import ScoredGroup

SNAPSHOT_FILE = "pipeline_snapshot.pt"
SNAPSHOT_VERSION = 1


@runtime_checkable
class SnapshotEngine(Protocol):
    """An engine whose in-flight state can be saved and restored exactly (the embedded engine)."""

    def snapshot(self, include_weights: bool = False) -> dict[str, Any]: ...

    def restore(self, state: Mapping[str, Any]) -> None: ...


def _metadata_to_plain(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """Request/completion metadata with its task record (`metadata["record"]`, which the generator
    attaches for multi-turn environments) as a dict: the snapshot is read with
    `torch.load(weights_only=True)`, which refuses arbitrary objects."""
    out = dict(metadata)
    if isinstance(out.get("record"), PromptRecord):
        out["record"] = out["record"].to_dict()
    return out


def _metadata_from_plain(metadata: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(metadata)
    if isinstance(out.get("record"), Mapping):
        out["record"] = PromptRecord.from_dict(dict(out["record"]))
    return out


def completion_to_plain(c: Completion) -> dict[str, Any]:
    d = asdict(c)
    d["metadata"] = _metadata_to_plain(c.metadata)
    d["support_ids"] = None if c.support_ids is None else c.support_ids.to_plain()
    return d


def completion_from_plain(d: Mapping[str, Any]) -> Completion:
    d = dict(d)
    d["metadata"] = _metadata_from_plain(d["metadata"])
    ids = d.get("support_ids")
    d["support_ids"] = None if ids is None else SupportIds.from_plain(ids)
    return Completion(**d)


def _map_engine_requests(
    state: Mapping[str, Any], convert: Callable[[Mapping[str, Any]], dict[str, Any]]
) -> dict[str, Any]:
    """The engine snapshot (`EmbeddedEngine.snapshot`) with `convert` applied to the metadata of
    every sequence's request (slots and waiting)."""

    def seq(d: Mapping[str, Any] | None) -> dict[str, Any] | None:
        if d is None:
            return None
        request = dict(d["request"])
        request["metadata"] = convert(request["metadata"])
        return {**d, "request": request}

    return {**state, "slots": [seq(d) for d in state["slots"]], "waiting": [seq(d) for d in state["waiting"]]}


def engine_state_to_plain(state: Mapping[str, Any]) -> dict[str, Any]:
    return _map_engine_requests(state, _metadata_to_plain)


def engine_state_from_plain(state: Mapping[str, Any]) -> dict[str, Any]:
    return _map_engine_requests(state, _metadata_from_plain)


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
        "reward_parts": (None if g.reward_parts is None
                         else [None if p is None else dict(p) for p in g.reward_parts]),
    }


def ready_group_from_plain(d: Mapping[str, Any]) -> ReadyGroup:
    group = ScoredGroup(
        record=PromptRecord.from_dict(d["record"]),
        completions=[completion_from_plain(c) for c in d["completions"]],
        rewards=list(d["rewards"]),
        correct=None if d["correct"] is None else list(d["correct"]),
        old_logprobs=None if d["old_logprobs"] is None else [list(r) for r in d["old_logprobs"]],
        reward_parts=d.get("reward_parts"),  # absent in snapshots written before it was kept
    )
    return ReadyGroup(int(d["ticket"]), int(d["admit_version"]), group)
