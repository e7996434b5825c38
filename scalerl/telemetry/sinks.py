"""Optional metric sinks: TensorBoard and Weights & Biases, imported only when asked for.

Neither package is a dependency; asking for one that is not installed is an error that says which
package to install, raised when the run starts rather than at the first log call.
"""

from __future__ import annotations

import importlib
import json
import math
from collections.abc import Mapping
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


class Sink(Protocol):
    def log(self, kind: str, step: int, row: Mapping[str, Any]) -> None: ...

    def close(self) -> None: ...


class TensorBoardSink:
    """Scalars under `<kind>/<key>` (e.g. `eval/val_pass_rate`) in `<run_dir>/tensorboard`."""

    def __init__(self, run_dir: str | Path) -> None:
        _require("tensorboard", "logging.tensorboard=true", "tensorboard")
        writer_mod = importlib.import_module("torch.utils.tensorboard")
        self.log_dir = Path(run_dir) / "tensorboard"
        self._writer = writer_mod.SummaryWriter(log_dir=str(self.log_dir))

    def log(self, kind: str, step: int, row: Mapping[str, Any]) -> None:
        for key, value in scalars(row).items():
            if key != "step":
                self._writer.add_scalar(f"{kind}/{key}", value, global_step=step)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


class WandbSink:
    """A W&B run whose id is kept in `<run_dir>/wandb_run.json`, so a resumed run continues it."""

    def __init__(
        self,
        run_dir: str | Path,
        project: str,
        name: str,
        config: Mapping[str, Any] | None = None,
        resume: bool = False,
    ) -> None:
        self._wandb = _require("wandb", "logging.wandb=true", "wandb")
        id_file = Path(run_dir) / "wandb_run.json"
        run_id = None
        if resume and id_file.exists():
            run_id = json.loads(id_file.read_text())["id"]
        self._run = self._wandb.init(
            project=project,
            name=name,
            config=dict(config or {}),
            dir=str(run_dir),
            id=run_id,
            resume="allow" if run_id else None,
        )
        id_file.write_text(json.dumps({"id": self._run.id}))

    def log(self, kind: str, step: int, row: Mapping[str, Any]) -> None:
        data = {f"{kind}/{key}": value for key, value in scalars(row).items() if key != "step"}
        self._run.log(data, step=step)

    def close(self) -> None:
        self._run.finish()
