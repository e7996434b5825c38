"""Optional metric sinks: TensorBoard and Weights & Biases, imported only when asked for.

Neither package is a dependency; asking for one that is not installed is an error that says which
package to install, raised when the run starts rather than at the first log call.
"""

from __future__ import annotations

import importlib
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol


class MissingDependencyError(RuntimeError):
    """An optional feature was requested but its package is not installed."""


def _require(module: str, feature: str, package: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise MissingDependencyError(
            f"{feature} needs the '{package}' package, which is not installed: "
            f"pip install {package}  (or: pip install 'scalerl[logging]')"
        ) from err


def scalars(row: Mapping[str, Any]) -> dict[str, float]:
    """The finite numeric entries of a row (bools and strings are not plotted)."""
    out: dict[str, float] = {}
    for key, value in row.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if math.isfinite(value):
            out[key] = float(value)
    return out


#: The columns of the samples table (`scalerl.pipeline.stats.sample_rows`), in the order shown.
SAMPLE_COLUMNS: tuple[str, ...] = ("prompt_id", "task", "sample", "reward", "reward_fn", "correct",
                                   "lag", "tokens", "finish_reason", "prompt", "response")


def sample_cells(row: Mapping[str, Any]) -> list[Any]:
    """One samples-table row: scalars as they are, anything else (a chat prompt) as JSON text."""
    cells: list[Any] = []
    for column in SAMPLE_COLUMNS:
        value = row.get(column)
        ok = value is None or isinstance(value, (str, int, float, bool))
        cells.append(value if ok else json.dumps(value, ensure_ascii=False))
    return cells


def samples_markdown(rows: Sequence[Mapping[str, Any]]) -> str:
    """The samples as a Markdown table (TensorBoard's text plugin renders it); a cell's `|` and
    line breaks are escaped so that a response cannot break the table."""
    def cell(value: Any) -> str:
        text = "" if value is None else str(value)
        return text.replace("\\", "\\\\").replace("|", "\\|").replace("\r", "").replace("\n", "<br>")

    lines = ["| " + " | ".join(SAMPLE_COLUMNS) + " |", "|" + " --- |" * len(SAMPLE_COLUMNS)]
    lines += ["| " + " | ".join(cell(v) for v in sample_cells(row)) + " |" for row in rows]
    return "\n".join(lines)


class Sink(Protocol):
    def log(self, kind: str, step: int, row: Mapping[str, Any]) -> None: ...

    def log_samples(self, step: int, rows: Sequence[Mapping[str, Any]]) -> None: ...

    def close(self) -> None: ...


class TensorBoardSink:
    """Scalars under `<kind>/<key>` (e.g. `eval/val_pass_rate`) in `<run_dir>/tensorboard`.

    `purge_step`: a resumed run (from the checkpoint of step s) passes s + 1, a run started again
    in a directory with old event files 0. TensorBoard then hides what earlier sessions logged at
    steps >= purge_step (a session killed after its last checkpoint logged steps the resumed run
    logs again), so each step shows once, as in `metrics.jsonl`.
    """

    def __init__(self, run_dir: str | Path, purge_step: int | None = None) -> None:
        _require("tensorboard", "logging.tensorboard=true", "tensorboard")
        writer_mod = importlib.import_module("torch.utils.tensorboard")
        self.log_dir = Path(run_dir) / "tensorboard"
        self._writer = writer_mod.SummaryWriter(log_dir=str(self.log_dir), purge_step=purge_step)

    def log(self, kind: str, step: int, row: Mapping[str, Any]) -> None:
        for key, value in scalars(row).items():
            if key != "step":
                self._writer.add_scalar(f"{kind}/{key}", value, global_step=step)
        self._writer.flush()

    def log_samples(self, step: int, rows: Sequence[Mapping[str, Any]]) -> None:
        """The step's samples as one Markdown table under the text tag `samples`."""
        self._writer.add_text("samples", samples_markdown(rows), global_step=step)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


class WandbSink:
    """A W&B run whose id is kept in `<run_dir>/wandb_run.json`, so a resumed run continues it.

    A killed session loses what W&B had not yet written (its service buffers; offline logs of a
    SIGKILLed session are empty), and logged rows the checkpoint does not cover. So the id file
    also records `durable_step`, the last step of the last session that closed cleanly (everything
    up to it is in W&B). A run resumed from the checkpoint of step s rewinds the W&B run to
    `min(s, durable_step)` (`resume_from="<id>?_step=..."`: later rows are discarded) and the
    caller logs `metrics.jsonl`'s rows after that point again (`replay_after`), so W&B ends with
    each step once, as the metrics log. If no session closed cleanly, what W&B holds is unknown:
    the history goes to a new W&B run, whole. (Plain `resume="allow"` would keep a killed session's
    rows past the checkpoint and refuse the resumed run's: W&B does not take a step it has seen.)
    """

    def __init__(
        self,
        run_dir: str | Path,
        project: str,
        name: str,
        config: Mapping[str, Any] | None = None,
        resume: bool = False,
        resume_step: int | None = None,
    ) -> None:
        self._wandb = _require("wandb", "logging.wandb=true", "wandb")
        self._id_file = Path(run_dir) / "wandb_run.json"
        saved: dict[str, Any] = {}
        if (resume or resume_step is not None) and self._id_file.exists():
            saved = json.loads(self._id_file.read_text())
        run_id, durable = saved.get("id"), saved.get("durable_step")
        # Rows with a step in (replay_after, resume_step] must be logged again (None: none).
        self.replay_after: int | None = None
        where: dict[str, Any] = {}
        if run_id and resume_step is not None:
            if durable is not None:
                self.replay_after = min(int(durable), int(resume_step))
                where["resume_from"] = f"{run_id}?_step={self.replay_after}"
            else:
                self.replay_after, run_id, durable = -1, None, None
        elif run_id:
            where.update(id=run_id, resume="allow")
        self._run = self._wandb.init(
            project=project,
            name=name,
            config=dict(config or {}),
            dir=str(run_dir),
            **where,
        )
        self._durable = durable if run_id else None
        self._last_step: int | None = None
        self._save_id()

    def _save_id(self) -> None:
        self._id_file.write_text(json.dumps({"id": self._run.id, "durable_step": self._durable}))

    def log(self, kind: str, step: int, row: Mapping[str, Any]) -> None:
        data = {f"{kind}/{key}": value for key, value in scalars(row).items() if key != "step"}
        self._run.log(data, step=step)
        self._last_step = step

    def log_samples(self, step: int, rows: Sequence[Mapping[str, Any]]) -> None:
        """The step's samples as a `wandb.Table` under the key `samples`."""
        table = self._wandb.Table(columns=list(SAMPLE_COLUMNS), data=[sample_cells(r) for r in rows])
        self._run.log({"samples": table}, step=step)
        self._last_step = step

    def close(self) -> None:
        self._run.finish()
        if self._last_step is not None:
            self._durable = self._last_step
        self._save_id()
