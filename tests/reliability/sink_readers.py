"""Read TensorBoard and W&B (offline) logs back, the way their own tools see them."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any


def tensorboard_steps(run_dir: Path, tag: str) -> list[int]:
    """The steps of `tag` as TensorBoard shows them: its `EventAccumulator` over every event file
    of the run, purging what a session's `purge_step` (SessionLog.START) discards."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tensorboard"), purge_orphaned_data=True)
    acc.Reload()
    return [event.step for event in acc.Scalars(tag)]


_BLOCK = 32768  # W&B's transaction log: LevelDB log records in 32 KiB blocks after a 7-byte header


def _wandb_records(path: Path) -> list[bytes]:
    data = path.read_bytes()
    if data[:4] != b":W&B":
        raise ValueError(f"{path}: not a W&B transaction log")
    out: list[bytes] = []
    pos, partial = 7, b""
    while pos + 7 <= len(data):
        if _BLOCK - pos % _BLOCK < 7:  # block trailer: padding
            pos += _BLOCK - pos % _BLOCK
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        pos += 7
        chunk, pos = data[pos : pos + length], pos + length
        if kind == 1:  # full
            out.append(chunk)
        elif kind == 2:  # first
            partial = chunk
        elif kind == 3:  # middle
            partial += chunk
        elif kind == 4:  # last
            out.append(partial + chunk)
        elif kind == 0 and length == 0:
            break
    return out


def wandb_sessions(run_dir: Path) -> list[dict[str, Any]]:
    """Each offline session of the run's W&B run (`wandb_run.json`), in order: its rewind point
    (None: none) and its history rows."""
    from wandb.proto import wandb_internal_pb2 as pb

    run_id = json.loads((run_dir / "wandb_run.json").read_text())["id"]
    sessions = []
    for folder in sorted((run_dir / "wandb").glob(f"offline-run-*-{run_id}")):
        (log,) = folder.glob("*.wandb")
        rewind, rows = None, []
        for raw in _wandb_records(log):
            record = pb.Record()
            record.ParseFromString(raw)
            kind = record.WhichOneof("record_type")
            if kind == "run" and record.run.HasField("branch_point"):
                rewind = int(record.run.branch_point.value)
            elif kind == "history":
                rows.append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                             for item in record.history.item})
        sessions.append({"rewind": rewind, "rows": rows})
    return sessions


def wandb_history(run_dir: Path) -> dict[int, dict[str, Any]]:
    """The run's history as W&B keeps it: each session first rewinds to its branch point (drops
    later steps), then appends its rows; a row at a step the run already has is refused (the
    server's rule), which is a test failure here rather than a silent drop."""
    history: dict[int, dict[str, Any]] = {}
    for session in wandb_sessions(run_dir):
        if session["rewind"] is not None:
            history = {s: row for s, row in history.items() if s <= session["rewind"]}
        for row in session["rows"]:
            step = int(row["_step"])
            if history and step <= max(history):
                raise AssertionError(f"W&B would drop the row of step {step}: the run is already at "
                                     f"{max(history)}")
            history[step] = row
    return history
