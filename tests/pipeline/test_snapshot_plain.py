"""The exact-resume snapshot stays loadable with `torch.load(weights_only=True)` although the
generator attaches each request's task record (a `PromptRecord`) to its metadata."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from scalerl.data.records import PromptRecord
from scalerl.pipeline.interfaces import ReadyGroup
from scalerl.pipeline.snapshot import (
    completion_from_plain,
    completion_to_plain,
    engine_state_from_plain,
    engine_state_to_plain,
    ready_group_from_plain,
    ready_group_to_plain,
)
from scalerl.rollout.protocol import Completion
from scalerl.training.batch import ScoredGroup

RECORD = PromptRecord(id="p1", task="math", prompt="1+1=", answer="2", metadata={"level": 1}, source="f:3")


def _engine_state() -> dict:
    seq = {"serial": 3, "request": {"request_id": "r", "prompt_ids": [1, 2],
                                    "metadata": {"prompt_id": "p1", "ticket": 7, "record": RECORD}}}
    return {"format": 1, "slots": [None, seq], "waiting": [seq]}


def _load(tmp_path: Path, obj: object) -> object:
    path = tmp_path / "snap.pt"
    torch.save(obj, path)
    return torch.load(path, weights_only=True)


def test_the_raw_engine_state_is_refused_by_a_weights_only_load(tmp_path: Path) -> None:
    # The failure the conversion exists for (a resume stopped with "unreadable").
    with pytest.raises(Exception, match=r"[Ww]eights only"):
        _load(tmp_path, _engine_state())


def test_engine_state_round_trips_through_a_weights_only_load(tmp_path: Path) -> None:
    back = engine_state_from_plain(_load(tmp_path, engine_state_to_plain(_engine_state())))  # type: ignore[arg-type]
    assert back["slots"][0] is None
    for seq in (back["slots"][1], back["waiting"][0]):
        md = seq["request"]["metadata"]
        assert md["record"] == RECORD and isinstance(md["record"], PromptRecord)
        assert (md["prompt_id"], md["ticket"]) == ("p1", 7)
    assert _engine_state()["slots"][1]["request"]["metadata"]["record"] is RECORD  # input untouched


def test_completion_round_trips_with_its_record(tmp_path: Path) -> None:
    c = Completion("r", 0, [1], [5, 6], [-0.1, -0.2], [0, 1], [True, True], "stop", 0,
                   metadata={"prompt_id": "p1", "record": RECORD})
    back = completion_from_plain(_load(tmp_path, completion_to_plain(c)))  # type: ignore[arg-type]
    assert back == c and isinstance(back.metadata["record"], PromptRecord)


def test_ready_group_round_trips_with_its_reward_parts(tmp_path: Path) -> None:
    """A queued group keeps each sample's per-function scores across a resume (samples rows show them)."""
    cs = [Completion("r", i, [1], [5], [-0.1], [0], [True], "stop", 0) for i in range(2)]
    group = ScoredGroup(RECORD, cs, [1.5, 0.0], [True, False], None,
                        [{"length_reward": 0.5, "has_digit": 1.0}, None])
    back = ready_group_from_plain(_load(tmp_path, ready_group_to_plain(ReadyGroup(4, 2, group))))  # type: ignore[arg-type]
    assert (back.ticket, back.admit_version) == (4, 2)
    assert back.group.reward_parts == [{"length_reward": 0.5, "has_digit": 1.0}, None]
    assert back.group.rewards == [1.5, 0.0] and back.group.correct == [True, False]
