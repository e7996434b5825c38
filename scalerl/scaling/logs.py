"""Read learning curves from other frameworks' logs: TensorBoard, TRL, MLflow and verl's console.

Each reader turns a log into rows (``(line or step, {column: value})`` in log order) and builds
the curve with ``io.curve_from_numbered``, so every rule of ``scaling.io`` holds (rows without y
are not evaluations, a bad or non-increasing value is an error naming where it is) and a FLOPs
axis from tokens or steps (``scaling.compute_axis``) applies to all of them.

Formats (``detect_format`` picks one from the path's shape; ``--format`` names one):

* ``tensorboard`` -- an ``events.out.tfevents.*`` file, or a folder holding them (each folder
  with event files is one run, labelled by its path under the given folder). Scalars (and scalar
  tensors) are read with tensorboard's ``EventAccumulator``; the tags logged at one step form one
  row (the latest write of a tag at a step wins, as TensorBoard shows a resumed run). Errors say
  ``file:tag:step N``. Needs ``tensorboard`` (``pip install 'scalerl[logging]'``).
* ``trl`` -- a ``trainer_state.json`` (or a checkpoint folder holding one), as transformers'
  ``Trainer`` (and so TRL's trainers) writes it: each ``log_history`` entry is a row at the line
  where it starts; evaluation entries carry ``eval_*`` keys (default y: ``eval_reward``).
* ``mlflow`` -- an MLflow file-store run folder (``<run>/metrics/<key>``, lines
  ``timestamp value step``; keys with ``/`` are sub-folders), or an experiment folder (every run in
  it). Read as text: mlflow itself is not needed. Rows are the steps; the label is the run's
  ``run_name`` (``meta.yaml``), else its id.
* ``verl`` -- verl's console log (its ``LocalLogger`` prints ``step:N - key:value - ...``, one line
  per step; lines with other text are skipped; a Ray prefix such as ``(TaskRunner pid=1)`` is
  allowed). Default y: the one ``val-core/.../mean@k`` (else ``val/test_score/...``) key.

W&B offline run folders (``run-*.wandb``) are not read: the installed wandb library (0.31) has no
Python reader for its transaction log (the Go ``wandb-core`` reads it, to sync). Export the chart
as CSV (``io.read_csv``) or log the run to TensorBoard as well.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

from scalerl.scaling.compute_axis import FlopsAxis
from scalerl.scaling.io import Y_FALLBACKS, Curve, curve_from_numbered, pick_column
from scalerl.scaling.validation import CurveError, MissingCurveError

FORMATS: tuple[str, ...] = ("scalerl", "tensorboard", "trl", "mlflow", "verl")
TB_PREFIX = "events.out.tfevents."
TRL_STATE = "trainer_state.json"
#: TRL's evaluation reward first (its trainers log the eval reward as ``eval_reward``).
TRL_Y: tuple[str, ...] = ("eval_reward", "eval_rewards/mean", *Y_FALLBACKS)
VERL_LINE = re.compile(r"(?:^|\s)step:(\d+)((?: - [^\s:][^:]*:\S+)+)\s*$")
VERL_Y = (re.compile(r"^val-core/.+/mean@\d+$"), re.compile(r"^val/test_score/.+$"))

Rows = list[tuple[int, dict[str, object]]]


def detect_format(path: Path) -> str:
    """The format of ``path`` from its shape (``scalerl`` for run folders, CSV and JSONL)."""
    if path.is_dir():
        if (path / "metrics.jsonl").is_file():
            return "scalerl"
        if (path / TRL_STATE).is_file():
            return "trl"
        if (path / "metrics").is_dir() and (path / "meta.yaml").is_file():
            return "mlflow"
        runs = (d for d in path.iterdir() if d.is_dir())
        if (path / "meta.yaml").is_file() and any((d / "metrics").is_dir() for d in runs):
            return "mlflow"
        if next(_event_files(path), None) is not None:
            return "tensorboard"
        return "scalerl"  # read_run_dir names what a run folder needs
    if path.name.startswith(TB_PREFIX):
        return "tensorboard"
    if path.name == TRL_STATE:
        return "trl"
    if path.suffix.lower() in (".log", ".out", ".txt") and _looks_like_verl(path):
        return "verl"
    return "scalerl"


def read_log(path: Path, fmt: str, x: str | None, y: str | None, axis: FlopsAxis | None) -> list[Curve]:
    """Every curve of a log in format ``fmt`` (one of ``FORMATS`` but ``scalerl``)."""
    readers = {"tensorboard": read_tensorboard, "trl": read_trl, "mlflow": read_mlflow, "verl": read_verl}
    if fmt not in readers:
        raise CurveError(f"--format: unknown format {fmt!r} (choose from {', '.join(FORMATS)})")
    return readers[fmt](path, x, y, axis)


# -- TensorBoard ---------------------------------------------------------------------------------


def _event_files(folder: Path) -> Iterable[Path]:
    return (p for p in sorted(folder.rglob(f"{TB_PREFIX}*")) if p.is_file())


def read_tensorboard(path: str | Path, x: str | None = None, y: str | None = None,
                     axis: FlopsAxis | None = None) -> list[Curve]:
    """One curve per folder of event files (``path`` itself when it is an event file's folder)."""
    p = Path(path)
    if p.is_file():
        groups = {p.parent: [p]}
    else:
        groups = {}
        for f in _event_files(p):
            groups.setdefault(f.parent, []).append(f)
        if not groups:
            raise MissingCurveError(f"{p}: no TensorBoard event files ({TB_PREFIX}*) in this folder")
    curves = []
    for folder, files in groups.items():
        rows = _tensorboard_rows(files)
        rel = folder.relative_to(p) if p.is_dir() and folder != p else None
        label = str(rel) if rel is not None else folder.name
        source = str(files[0]) if len(files) == 1 else str(folder)
        if not rows:
            raise CurveError(f"{source}: no scalar values in the event files")
        curves.append(curve_from_numbered(rows, source, x, y, label, unit="step", axis=axis))
    return curves


def _tensorboard_rows(files: Sequence[Path]) -> Rows:
    """Rows keyed by step from the scalars (and scalar tensors) of ``files``, in step order."""
    try:
        from tensorboard.backend.event_processing import event_accumulator as ea
        from tensorboard.util import tensor_util
    except ImportError:
        raise CurveError("reading TensorBoard event files needs the tensorboard package: "
                         "pip install 'scalerl[logging]' (or pip install tensorboard)") from None
    by_step: dict[int, dict[str, tuple[float, float]]] = {}
    for f in files:
        acc = ea.EventAccumulator(str(f), size_guidance={ea.SCALARS: 0, ea.TENSORS: 0})
        try:
            acc.Reload()
        except Exception as err:  # a truncated or foreign file: the library's own words
            raise CurveError(f"{f}: not a readable TensorBoard event file ({err})") from None
        tags = acc.Tags()
        for tag in tags.get("scalars", []):
            for ev in acc.Scalars(tag):
                _keep(by_step, ev.step, tag, ev.wall_time, float(ev.value))
        for tag in tags.get("tensors", []):
            for ev in acc.Tensors(tag):
                arr = tensor_util.make_ndarray(ev.tensor_proto)
                if arr.size == 1 and arr.dtype.kind in "fiu":
                    _keep(by_step, ev.step, tag, ev.wall_time, float(arr.reshape(-1)[0]))
    rows = []
    for step in sorted(by_step):
        row: dict[str, object] = {tag: v for tag, (_, v) in by_step[step].items()}
        row.setdefault("step", step)
        rows.append((step, row))
    return rows


def _keep(by_step: dict[int, dict[str, tuple[float, float]]], step: int, tag: str, wall: float,
          value: float) -> None:
    """The latest write of ``tag`` at ``step`` wins (a resumed run re-logs the steps it repeats)."""
    cell = by_step.setdefault(int(step), {})
    if tag not in cell or wall >= cell[tag][0]:
        cell[tag] = (wall, value)


# -- TRL / transformers Trainer ------------------------------------------------------------------


def read_trl(path: str | Path, x: str | None = None, y: str | None = None,
             axis: FlopsAxis | None = None) -> list[Curve]:
    """The curve of a ``trainer_state.json`` (or of the checkpoint folder holding one)."""
    p = Path(path)
    state = p / TRL_STATE if p.is_dir() else p
    if not state.is_file():
        raise MissingCurveError(f"{p}: no {TRL_STATE}")
    text = state.read_text(encoding="utf-8")
    rows = _log_history_rows(text, state)
    keys = [k for _, row in rows for k in row]
    y_name = pick_column(keys, y, TRL_Y, "y", str(state))
    label = state.parent.name if state.parent.name else state.stem
    return [curve_from_numbered(rows, str(state), x, y_name, label, axis=axis)]


def _log_history_rows(text: str, where: Path) -> Rows:
    """``log_history`` entries with the line each starts on."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise CurveError(f"{where}:{err.lineno}: malformed JSON ({err.msg})") from None
    if not isinstance(data, dict) or not isinstance(data.get("log_history"), list):
        raise CurveError(f"{where}: no 'log_history' list (not a Trainer state file?)")
    # Walk the array with raw_decode to learn where each entry starts (json.loads drops positions).
    key = re.search(r'"log_history"\s*:\s*\[', text)
    if key is None:  # pragma: no cover - json.loads found the key, so the text has it
        raise CurveError(f"{where}: 'log_history' not found in the text")
    decoder = json.JSONDecoder()
    pos, rows = key.end(), []
    for i, entry in enumerate(data["log_history"]):
        while text[pos] in " \t\r\n,":
            pos += 1
        line = text.count("\n", 0, pos) + 1
        _, pos = decoder.raw_decode(text, pos)
        if not isinstance(entry, dict):
            raise CurveError(f"{where}:{line}: log_history[{i}] is a {type(entry).__name__}, "
                             "expected an object")
        rows.append((line, entry))
    return rows


# -- MLflow file store ---------------------------------------------------------------------------


def read_mlflow(path: str | Path, x: str | None = None, y: str | None = None,
                axis: FlopsAxis | None = None) -> list[Curve]:
    """One curve per run: ``path`` is a run folder, or an experiment folder of runs."""
    p = Path(path)
    if (p / "metrics").is_dir():
        runs = [p]
    else:
        runs = sorted(d for d in p.iterdir() if d.is_dir() and (d / "metrics").is_dir())
        if not runs:
            raise MissingCurveError(f"{p}: not an MLflow run or experiment folder (no <run>/metrics)")
    return [curve_from_numbered(_mlflow_rows(run), str(run), x, y, _mlflow_name(run), unit="step", axis=axis)
            for run in runs]


def _mlflow_rows(run: Path) -> Rows:
    """Rows keyed by step from every ``metrics/<key>`` file (``timestamp value step`` lines)."""
    metrics = run / "metrics"
    by_step: dict[int, dict[str, tuple[float, float]]] = {}
    for f in sorted(q for q in metrics.rglob("*") if q.is_file()):
        key = f.relative_to(metrics).as_posix()
        with f.open(encoding="utf-8") as fh:
            for lineno, raw in enumerate(fh, start=1):
                parts = raw.split()
                if not parts:
                    continue
                if len(parts) not in (2, 3):
                    raise CurveError(f"{f}:{lineno}: expected 'timestamp value step', got {raw.strip()!r}")
                try:
                    stamp, value = float(parts[0]), float(parts[1])
                    step = int(parts[2]) if len(parts) == 3 else 0
                except ValueError:
                    raise CurveError(f"{f}:{lineno}: not numbers: {raw.strip()!r}") from None
                if not math.isfinite(value):
                    raise CurveError(f"{f}:{lineno}: {key} = {parts[1]} is not finite")
                _keep(by_step, step, key, stamp, value)
    rows = []
    for step in sorted(by_step):
        row: dict[str, object] = {k: v for k, (_, v) in by_step[step].items()}
        row.setdefault("step", step)
        rows.append((step, row))
    if not rows:
        raise CurveError(f"{metrics}: no metric values")
    return rows


def _mlflow_name(run: Path) -> str:
    meta = run / "meta.yaml"
    name_tag = run / "tags" / "mlflow.runName"
    try:
        import yaml

        data = yaml.safe_load(meta.read_text(encoding="utf-8")) if meta.is_file() else None
    except Exception:  # a label is not worth failing a fit over: fall back to the run id
        data = None
    if isinstance(data, dict) and isinstance(data.get("run_name"), str) and data["run_name"].strip():
        return data["run_name"].strip()
    if name_tag.is_file():
        text = name_tag.read_text(encoding="utf-8").strip()
        if text:
            return text
    return run.name


# -- verl console --------------------------------------------------------------------------------


def _looks_like_verl(path: Path, lines: int = 2000) -> bool:
    try:
        with path.open(encoding="utf-8", errors="replace") as fh:
            for i, raw in enumerate(fh):
                if i >= lines:
                    break
                if VERL_LINE.search(raw.rstrip("\n")):
                    return True
    except OSError:
        return False
    return False


def read_verl(path: str | Path, x: str | None = None, y: str | None = None,
              axis: FlopsAxis | None = None) -> list[Curve]:
    """The curve of a verl console log (``step:N - key:value - ...`` lines)."""
    p = Path(path)
    rows: Rows = []
    with p.open(encoding="utf-8", errors="replace") as fh:
        for lineno, raw in enumerate(fh, start=1):
            m = VERL_LINE.search(raw.rstrip("\n"))
            if m is None:
                continue
            row: dict[str, object] = {"step": int(m.group(1))}
            for part in m.group(2).split(" - ")[1:]:
                key, _, value = part.rpartition(":")
                row[key.strip()] = value.strip()  # parsed (and checked) by the curve builder
            rows.append((lineno, row))
    if not rows:
        raise CurveError(f"{p}: no verl metric lines ('step:N - key:value - ...')")
    y_name = y if y is not None else _verl_y([k for _, r in rows for k in r], p)
    return [curve_from_numbered(rows, str(p), x, y_name, p.stem, axis=axis)]


def _verl_y(keys: Sequence[str], p: Path) -> str:
    have = list(dict.fromkeys(keys))
    for pattern in VERL_Y:
        found = [k for k in have if pattern.match(k)]
        if len(found) == 1:
            return found[0]
        if len(found) > 1:
            raise CurveError(f"{p}: several validation metrics ({', '.join(found)}); name one with --y")
    return pick_column(have, None, Y_FALLBACKS, "y", str(p))


__all__ = ["FORMATS", "detect_format", "read_log", "read_mlflow", "read_tensorboard", "read_trl", "read_verl"]
