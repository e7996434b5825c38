"""`metrics.jsonl`: the run's append-only record of training steps and evaluations.

One JSON object per line, each with `"kind"` (`"step"` or `"eval"`) and `"step"`. Eval rows are
what the scaling fits read (x = `compute_device_hours`, y = `val_pass_rate`). Every row is flushed
when written, so a crash loses at most the row being written; a torn last line is dropped when the
log is read or resumed. On resume the log is cut back to the checkpointed step (atomically: a
rewritten copy replaces the file) so that it continues without a gap or a duplicate row.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Literal

RowKind = Literal["step", "eval", "sample"]
METRICS_FILE = "metrics.jsonl"
#: A few trained samples per step, readable text (`logging.samples_every`); same row format.
SAMPLES_FILE = "samples.jsonl"


def _plain(value: Any) -> Any:
    """A JSON-safe copy: tensors/numpy scalars become numbers, non-finite floats become null."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, (bool, str)) or value is None:
        return value
    if hasattr(value, "item") and callable(value.item):
        value = value.item()
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        # Strict JSON has no NaN/Infinity; readers such as jq reject them.
        return value if math.isfinite(value) else None
    raise TypeError(f"metric value {value!r} of type {type(value).__name__} is not JSON-serialisable")


def read_rows(path: str | Path, kind: RowKind | None = None) -> list[dict[str, Any]]:
    """All complete rows of a metrics file (optionally of one kind), in file order."""
    return list(_iter_rows(Path(path), kind))


def _iter_rows(path: Path, kind: RowKind | None) -> Iterator[dict[str, Any]]:
    if not path.exists():
        return
    with path.open(encoding="utf-8") as f:
        for line in f:
            row = _parse(line)
            if row is not None and (kind is None or row.get("kind") == kind):
                yield row


def _parse(line: str) -> dict[str, Any] | None:
    # A line without its newline is the torn tail of an interrupted write.
    if not line.endswith("\n") or not line.strip():
        return None
    try:
        row = json.loads(line)
    except json.JSONDecodeError:
        return None
    return row if isinstance(row, dict) else None


class MetricsLog:
    """Appends step and eval rows to `<run_dir>/metrics.jsonl`.

    `resume_step=None` starts a fresh log (an existing file is replaced); `resume_step=s` keeps the
    rows with `step <= s` and drops everything after, so a run resumed from the checkpoint of step
    `s` logs step `s + 1` next.
    """

    def __init__(self, run_dir: str | Path, resume_step: int | None = None,
                 filename: str = METRICS_FILE) -> None:
        self.path = Path(run_dir) / filename
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if resume_step is None:
            self._rewrite([])
        else:
            self.truncate_after(resume_step)
        self._file = self.path.open("a", encoding="utf-8")

    def truncate_after(self, step: int) -> int:
        """Drop rows with `step > step` (and a torn last line); return how many rows were dropped."""
        kept: list[str] = []
        dropped = 0
        if self.path.exists():
            with self.path.open(encoding="utf-8") as f:
                for line in f:
                    row = _parse(line)
                    if row is not None and int(row.get("step", -1)) <= step:
                        kept.append(line)
                    else:
                        dropped += 1
        self._rewrite(kept)
        return dropped

    def _rewrite(self, lines: list[str]) -> None:
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        with tmp.open("w", encoding="utf-8") as f:
            f.writelines(lines)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)

    def write(self, kind: RowKind, step: int, metrics: Mapping[str, Any]) -> dict[str, Any]:
        """Append one row; `kind` and `step` override same-named keys in `metrics`. Returns the row."""
        if kind not in ("step", "eval", "sample"):
            raise ValueError(f"kind: expected 'step', 'eval' or 'sample', got {kind!r}")
        row = {"kind": kind, "step": int(step), **_plain({k: v for k, v in metrics.items()
                                                         if k not in ("kind", "step")})}
        self._file.write(json.dumps(row, allow_nan=False) + "\n")
        self._file.flush()
        return row

    def log_step(self, step: int, metrics: Mapping[str, Any]) -> dict[str, Any]:
        return self.write("step", step, metrics)

    def log_eval(self, step: int, metrics: Mapping[str, Any]) -> dict[str, Any]:
        return self.write("eval", step, metrics)

    def rows(self, kind: RowKind | None = None) -> list[dict[str, Any]]:
        return read_rows(self.path, kind)

    def close(self) -> None:
        if not self._file.closed:
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()

    def __enter__(self) -> MetricsLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
