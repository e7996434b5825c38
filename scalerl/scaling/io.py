"""Read learning curves from scalerl run directories, CSV, JSONL and W&B chart exports.

Every reader returns ``Curve`` objects: one run's x (compute) and y (reward) columns with the
source line of every point, so a bad value is reported as ``file:line``. Rules shared by all
formats:

* a row without the y column (or with an empty / null y) is not an evaluation: it is skipped;
* a row with y but without a usable x, a non-numeric or non-finite value, or an x that does not
  increase is an error naming ``file:line`` and the column;
* a missing column is an error listing the columns that exist;
* a numeric ``truncation_rate`` (the share of training samples cut at the length budget, on a
  scalerl run's step rows) is kept per row as ``Curve.truncation``, for the instability flag of
  ``scaling.diagnostics.truncation_flag``; rows without one are not a problem.

Formats:

* ``RUN_DIR/`` -- a scalerl run: ``metrics.jsonl`` (rows with ``"kind": "eval"`` carry
  ``compute_device_hours`` and ``val_pass_rate``); ``config.yaml`` names the run (``name``; the
  folder's name when it is the default ``run``) and may say which recipe it is a seed of
  (``recipe``); ``start_model.json`` identifies the model it started from.
* ``*.jsonl`` / ``*.ndjson`` -- one JSON object per line, same rules.
* ``*.csv`` -- a header row (``#`` comment lines before it are skipped); if it has a ``run``
  column the file holds several runs, split by it.
* W&B chart "Export CSV" -- columns ``<x>``, ``<run> - <y>``, ``<run> - <y>__MIN``,
  ``<run> - <y>__MAX`` (one set per run); detected from the `` - `` headers.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from itertools import pairwise
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from scalerl.scaling.compute_axis import FLOPS_COLUMN, FlopsAxis
from scalerl.scaling.validation import CurveError, MissingCurveError

#: Default columns, matching the scalerl trainer's eval rows.
DEFAULT_X = "compute_device_hours"
DEFAULT_Y = "val_pass_rate"
#: Tried in order when the user named no x column: FLOPs first (the work done, the same on every
#: machine and under any load), then the wall-clock axes.
X_FALLBACKS: tuple[str, ...] = ("flops", DEFAULT_X, "compute_gpu_hours", "gpu_hours", "compute")
Y_FALLBACKS: tuple[str, ...] = (DEFAULT_Y, "pass_rate", "val_reward", "reward")
#: Numeric columns kept alongside x and y when present (for step/epoch fit windows).
EXTRA_COLUMNS: tuple[str, ...] = ("step", "epoch", "compute_device_hours", "flops", "samples", "tokens",
                                  "model_size")
WANDB_SEP = " - "
#: The largest |x| or |y| read: the fit's grids and predictions reach past the largest compute by
#: factors of 10..1000 (`sigmoid.C_MID_REACH`, `grids.adaptive_grids`), and must stay finite floats.
MAX_MAGNITUDE = 1e300
TRUNCATION_COLUMN = "truncation_rate"


@dataclass(frozen=True, eq=False)
class TruncationSeries:
    """The training truncation rate of a run, row by row: ``step`` (the row's step, else its line)."""

    steps: NDArray[np.float64]
    rates: NDArray[np.float64]
    lines: NDArray[np.int64]


@dataclass(frozen=True, eq=False)
class Curve:
    """One run's learning curve as read from disk."""

    label: str
    source: str
    x_name: str
    y_name: str
    x: NDArray[np.float64]
    y: NDArray[np.float64]
    lines: NDArray[np.int64]
    extra: dict[str, NDArray[np.float64]] = field(default_factory=dict)
    recipe: str | None = None  # ``recipe`` from a run's config.yaml: groups seeds in comparisons
    # The model a scalerl run started from (its ``start_model.json``), None when not recorded.
    start_model: dict[str, object] | None = None
    truncation: TruncationSeries | None = None  # rows with a ``truncation_rate``, None: no such rows
    # How x was derived when it is not a logged column (``scaling.compute_axis``), None: logged.
    x_note: str | None = None
    # "line": ``lines`` are line numbers; "step": they are the logged steps of a step-keyed log
    # (TensorBoard, MLflow, W&B), located as ``file:tag:step N``.
    unit: str = "line"
    # Keys a resumed scalerl run changed (``sessions.jsonl``): ``{"step", "key", "from", "to"}``,
    # the step after which the new value trained; () when its config never changed.
    config_changes: tuple[dict[str, object], ...] = ()

    def where(self, i: int) -> str:
        """``file:line`` (or ``file:tag:step N``) of point ``i``."""
        return locate(self.source, int(self.lines[i]), self.y_name, self.unit)

    def column(self, name: str) -> NDArray[np.float64]:
        """An extra numeric column aligned with the points (NaN where a row lacked it)."""
        if name == self.x_name:
            return self.x
        if name == self.y_name:
            return self.y
        if name not in self.extra:
            have = ", ".join(sorted({self.x_name, self.y_name, *self.extra})) or "none"
            raise CurveError(f"{self.source}: no column {name!r} in the evaluation rows (have: {have})")
        return self.extra[name]


def locate(source: str, n: int, column: str, unit: str = "line") -> str:
    """Where row ``n`` of ``source`` is: ``file:line``, or ``file:tag:step N`` for step-keyed logs."""
    return f"{source}:{n}" if unit == "line" else f"{source}:{column}:step {n}"


def _number(value: object, where: str, column: str) -> float:
    """Parse one cell as a finite float or raise ``ValueError`` naming ``file:line`` and column."""
    if isinstance(value, bool):
        raise CurveError(f"{where}: {column} is a boolean ({value!r}), expected a number")
    if isinstance(value, (int, float)):
        out = float(value)
    elif isinstance(value, str):
        try:
            out = float(value.strip())
        except ValueError:
            raise CurveError(f"{where}: {column} = {value!r} is not a number") from None
    else:
        raise CurveError(f"{where}: {column} = {value!r} is not a number")
    if not math.isfinite(out):
        raise CurveError(f"{where}: {column} = {value!r} is not finite")
    if abs(out) > MAX_MAGNITUDE:
        raise CurveError(f"{where}: {column} = {value!r} is beyond {MAX_MAGNITUDE:g}: the fit searches past "
                         "the largest value (C_mid up to 1000x the largest compute), which would overflow a "
                         "float; rescale the column")
    return out


def _missing(value: object) -> bool:
    return value is None or (isinstance(value, str) and value.strip() == "")


def pick_column(
    available: Iterable[str], requested: str | None, fallbacks: Sequence[str], what: str, source: str
) -> str:
    """The column to use: ``requested`` if given (must exist), else the first fallback present."""
    have = list(dict.fromkeys(available))
    if requested is not None:
        if requested not in have:
            raise CurveError(f"{source}: no {what} column {requested!r} (have: {', '.join(have) or 'none'})")
        return requested
    for name in fallbacks:
        if name in have:
            return name
    raise CurveError(
        f"{source}: none of the default {what} columns ({', '.join(fallbacks)}) is present; "
        f"name one with --{what} (have: {', '.join(have) or 'none'})"
    )


def _build(
    label: str, source: str, x_name: str, y_name: str, rows: list[tuple[int, float, float, dict[str, float]]],
    unit: str = "line",
) -> Curve:
    """Check x strictly increases (else ``file:line``) and pack the rows into a ``Curve``."""
    if not rows:
        raise CurveError(f"{source}: no rows with a {y_name!r} value")
    for (line0, x0, _, _), (line1, x1, _, _) in pairwise(rows):
        if x1 <= x0:
            raise CurveError(
                f"{locate(source, line1, y_name, unit)}: {x_name} = {x1:g} does not increase "
                f"({unit} {line0} has {x0:g}); "
                "a resumed run that re-logged evaluations? keep one row per evaluation"
            )
    names = sorted({k for *_, ex in rows for k in ex})
    extra = {k: np.array([ex.get(k, math.nan) for *_, ex in rows]) for k in names}
    return Curve(
        label=label,
        source=source,
        x_name=x_name,
        y_name=y_name,
        x=np.array([r[1] for r in rows]),
        y=np.array([r[2] for r in rows]),
        lines=np.array([r[0] for r in rows], dtype=np.int64),
        extra=extra,
        unit=unit,
    )


def _extras(row: Mapping[str, object], x_name: str, y_name: str) -> dict[str, float]:
    out = {}
    for key in EXTRA_COLUMNS:
        if key in (x_name, y_name) or _missing(row.get(key)):
            continue
        try:
            out[key] = float(row[key])  # type: ignore[arg-type]
        except (TypeError, ValueError):
            continue  # extras are optional metadata; a window on a broken one errors later
    return out


def _iter_jsonl(path: Path) -> Iterator[tuple[int, dict[str, object]]]:
    with path.open(encoding="utf-8") as fh:
        for lineno, raw in enumerate(fh, start=1):
            text = raw.strip()
            if not text:
                continue
            try:
                obj = json.loads(text)
            except json.JSONDecodeError as err:
                raise CurveError(
                    f"{path}:{lineno}: malformed JSON ({err.msg} at column {err.colno})"
                ) from None
            except RecursionError:
                raise CurveError(f"{path}:{lineno}: malformed JSON (nested too deeply to parse)") from None
            if not isinstance(obj, dict):
                raise CurveError(f"{path}:{lineno}: expected a JSON object, got {type(obj).__name__}")
            yield lineno, obj


def read_jsonl(
    path: str | Path, x: str | None = None, y: str | None = None, label: str | None = None,
    axis: FlopsAxis | None = None,
) -> Curve:
    """Curve from a JSONL log: rows having the y key are evaluations (see module docstring)."""
    p = Path(path)
    return curve_from_numbered([(n, obj) for n, obj in _iter_jsonl(p)], str(p), x, y, label or p.stem,
                               axis=axis)


def curve_from_rows(
    rows: Sequence[Mapping[str, object]], x: str | None = None, y: str | None = None, label: str = "run",
    source: str = "metrics.jsonl",
) -> Curve:
    """Curve from rows already in memory (a run's logged rows, in file order): the same rules and
    the same numbers as ``read_jsonl`` on the file they were written to, so the live forecast
    (``scaling.live``) and ``scalerl fit RUN_DIR`` fit identical data."""
    return curve_from_numbered(list(enumerate(rows, start=1)), source, x, y, label)


def curve_from_numbered(
    rows_raw: Sequence[tuple[int, Mapping[str, object]]], source: str, x: str | None, y: str | None,
    label: str, unit: str = "line", axis: FlopsAxis | None = None,
) -> Curve:
    """Curve from ``(line or step, row)`` pairs in log order: the rules of the module docstring.
    ``unit="step"``: the numbers are logged steps, and errors say ``file:tag:step N``. ``axis``:
    x is the ``flops`` column it derives from the rows' token or step counts (``compute_axis``)."""
    p = source
    if axis is not None:
        rows_raw = axis.apply(rows_raw, lambda n, col: locate(p, n, col, unit))
        x = FLOPS_COLUMN
    keys = [k for _, obj in rows_raw for k in obj]
    y_name = pick_column(keys, y, Y_FALLBACKS, "y", str(p))
    evals = [(n, obj) for n, obj in rows_raw if not _missing(obj.get(y_name))]
    x_name = pick_column([k for _, obj in evals for k in obj], x, X_FALLBACKS, "x", str(p))
    rows = []
    for n, obj in evals:
        where = locate(p, n, y_name, unit)
        if _missing(obj.get(x_name)):
            raise CurveError(f"{where}: row has {y_name} but no {x_name}")
        rows.append(
            (
                n,
                _number(obj[x_name], where, x_name),
                _number(obj[y_name], where, y_name),
                _extras(obj, x_name, y_name),
            )
        )
    curve = _build(label, p, x_name, y_name, rows, unit)
    return replace(curve, truncation=_truncation(rows_raw), x_note=None if axis is None else axis.description)


def _truncation(rows: Sequence[tuple[int, Mapping[str, object]]]) -> TruncationSeries | None:
    """Every row's numeric ``truncation_rate`` with its step (rows lacking a usable one are skipped:
    the rate is a diagnostic, never a reason to refuse a curve)."""
    found = []
    for lineno, row in rows:
        value, step = row.get(TRUNCATION_COLUMN), row.get("step")
        if isinstance(value, bool) or _missing(value):
            continue
        if _missing(step) or isinstance(step, bool):
            step = lineno
        try:
            rate, where = float(value), float(step)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            continue
        if math.isfinite(rate) and math.isfinite(where):
            found.append((where, rate, lineno))
    if not found:
        return None
    return TruncationSeries(np.array([f[0] for f in found]), np.array([f[1] for f in found]),
                            np.array([f[2] for f in found], dtype=np.int64))


def _run_identity(run_dir: Path) -> tuple[str, str | None]:
    """``(name, recipe)`` from ``config.yaml``: ``name`` (else the directory name) labels the run,
    ``recipe`` (if any) groups it with its other seeds."""
    data = None
    cfg = run_dir / "config.yaml"
    if cfg.is_file():
        try:
            import yaml

            data = yaml.safe_load(cfg.read_text(encoding="utf-8"))
        except Exception:  # a label is not worth failing a fit over: fall back to the dir name
            data = None
    if not isinstance(data, dict):
        data = {}

    def text(key: str) -> str | None:
        value = data.get(key)
        return value.strip() if isinstance(value, str) and value.strip() else None

    name = text("name")
    # "run" is RunConfig's default name: runs that never chose one are told apart by their folder.
    if name in (None, "run"):
        name = run_dir.resolve().name
    return name, text("recipe")


def read_rows(path: str | Path) -> list[dict[str, object]]:
    """The complete JSON-object lines of a JSONL file another process may be writing: a last line
    without its newline is still being written (left for the next read), and a line that is not a
    JSON object is skipped (``read_jsonl`` is the strict reader that names it)."""
    p = Path(path)
    if not p.is_file():
        return []
    out = []
    with p.open(encoding="utf-8") as fh:
        for line in fh:
            if not line.endswith("\n") or not line.strip():
                continue
            try:
                row = json.loads(line)
            except (ValueError, RecursionError):
                continue
            if isinstance(row, dict):
                out.append(row)
    return out


def run_label(run_dir: str | Path) -> str:
    """The label ``scalerl fit`` gives a run directory (``config.yaml``'s name, else the folder)."""
    return _run_identity(Path(run_dir))[0]


def read_run_dir(path: str | Path, x: str | None = None, y: str | None = None,
                 axis: FlopsAxis | None = None) -> Curve:
    """Curve from a scalerl run directory (``metrics.jsonl`` + optional ``config.yaml``)."""
    d = Path(path)
    log = d / "metrics.jsonl"
    if not log.is_file():
        raise MissingCurveError(f"{d}: not a scalerl run directory (no metrics.jsonl)")
    name, recipe = _run_identity(d)
    return replace(read_jsonl(log, x, y, label=name, axis=axis), recipe=recipe, start_model=_start_model(d),
                   config_changes=config_changes(d))


SESSIONS_FILE = "sessions.jsonl"  # written by `scalerl train` (scalerl/assembly/run.py)


def config_changes(run_dir: str | Path) -> tuple[dict[str, object], ...]:
    """The config changes a run's resumed sessions recorded (``sessions.jsonl`` start records with
    ``config_changes`` and ``from_step``), oldest first, one ``{"step", "key", "from", "to"}`` each."""
    out: list[dict[str, object]] = []
    for row in read_rows(Path(run_dir) / SESSIONS_FILE):
        changes = row.get("config_changes")
        if row.get("event") != "start" or not isinstance(changes, list):
            continue
        for change in changes:
            if isinstance(change, dict) and isinstance(change.get("key"), str):
                out.append({"step": row.get("from_step"), "key": change["key"], "from": change.get("from"),
                            "to": change.get("to")})
    return tuple(out)


START_MODEL_FILE = "start_model.json"  # written by `scalerl train` (scalerl/model_identity.py)


def _start_model(run_dir: Path) -> dict[str, object] | None:
    p = run_dir / START_MODEL_FILE
    try:
        data = json.loads(p.read_text(encoding="utf-8")) if p.is_file() else None
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _csv_rows(path: Path) -> tuple[list[str], list[tuple[int, list[str]]]]:
    """Header and ``(line, cells)`` rows of a CSV, skipping ``#`` comment lines before the header."""
    with path.open(encoding="utf-8-sig", newline="") as fh:
        lines = list(fh)
    start = 0
    while start < len(lines) and (lines[start].lstrip().startswith("#") or not lines[start].strip()):
        start += 1
    if start == len(lines):
        raise CurveError(f"{path}: no header row")
    reader = csv.reader(lines[start:])
    header = [h.strip() for h in next(reader)]
    rows = []
    for cells in reader:
        lineno = start + reader.line_num
        if not cells or all(not c.strip() for c in cells):
            continue
        if len(cells) > len(header):
            raise CurveError(f"{path}:{lineno}: {len(cells)} cells but the header has {len(header)} columns")
        rows.append((lineno, cells + [""] * (len(header) - len(cells))))
    return header, rows


def is_wandb_export(header: Sequence[str], y: str | None = None) -> bool:
    """W&B chart exports name their series ``<run> - <metric>`` (often with ``__MIN``/``__MAX``
    companions). A header counts as one when no column is the y column itself (``y``, or any
    default y name when ``y`` is None) and some column is ``<run> - <that name>``."""
    names = (y,) if y is not None else Y_FALLBACKS
    if any(h in names for h in header):
        return False
    return any(h.endswith(WANDB_SEP + name) for h in header for name in names) or (
        y is None and any(WANDB_SEP in h and h.endswith(("__MIN", "__MAX")) for h in header)
    )


def read_csv(path: str | Path, x: str | None = None, y: str | None = None,
             axis: FlopsAxis | None = None) -> list[Curve]:
    """Curves from a CSV (plain, plain with a ``run`` column, or a W&B chart export)."""
    p = Path(path)
    header, rows = _csv_rows(p)
    if is_wandb_export(header, y):
        if axis is not None:
            raise CurveError(f"{p}: a W&B chart export holds only its x and y series; a FLOPs axis from "
                             "tokens or steps needs the run's own log (its history or an offline run folder)")
        return _read_wandb(p, header, rows, x, y)
    y_name = pick_column(header, y, Y_FALLBACKS, "y", str(p))
    if axis is None:
        pick_column(header, x, X_FALLBACKS, "x", str(p))
    run_col = header.index("run") if "run" in header else None
    by_run: dict[str, list[tuple[int, dict[str, object]]]] = {}
    for lineno, cells in rows:
        key = cells[run_col].strip() if run_col is not None else p.stem
        by_run.setdefault(key, []).append((lineno, dict(zip(header, cells, strict=True))))
    # A run with no y value at all is not a curve of this file (another metric's rows): left out.
    with_y = {k: r for k, r in by_run.items() if any(not _missing(row[y_name]) for _, row in r)}
    if not with_y:
        raise CurveError(f"{p}: no rows with a {y_name!r} value")
    return [curve_from_numbered(r, str(p), x, y_name, label, axis=axis) for label, r in with_y.items()]


def _read_wandb(
    p: Path, header: list[str], rows: list[tuple[int, list[str]]], x: str | None, y: str | None
) -> list[Curve]:
    """One curve per ``<run> - <y>`` column; x is ``<run> - <x>`` if exported, else the first column."""
    metrics = {
        h.split(WANDB_SEP, 1)[1] for h in header if WANDB_SEP in h and not h.endswith(("__MIN", "__MAX"))
    }
    y_name = pick_column(sorted(metrics), y, Y_FALLBACKS, "y", str(p))
    series = [h for h in header if h.endswith(WANDB_SEP + y_name)]
    curves = []
    for col in series:
        run = col[: -len(WANDB_SEP + y_name)]
        if x is None:
            x_col = f"{run}{WANDB_SEP}{DEFAULT_X}" if f"{run}{WANDB_SEP}{DEFAULT_X}" in header else header[0]
        else:
            x_col = f"{run}{WANDB_SEP}{x}" if f"{run}{WANDB_SEP}{x}" in header else x
            if x_col not in header:
                raise CurveError(f"{p}: no x column {x!r} (have: {', '.join(header)})")
        xi, yi = header.index(x_col), header.index(col)
        pts = []
        for lineno, cells in rows:
            if _missing(cells[yi]):
                continue
            where = f"{p}:{lineno}"
            if _missing(cells[xi]):
                raise CurveError(f"{where}: row has {col} but no {x_col}")
            pts.append((lineno, _number(cells[xi], where, x_col), _number(cells[yi], where, col), {}))
        x_label = x_col.split(WANDB_SEP, 1)[1] if WANDB_SEP in x_col else x_col
        curves.append(_build(run, str(p), x_label, y_name, pts))
    return curves


def read_curves(path: str | Path, x: str | None = None, y: str | None = None,
                axis: FlopsAxis | None = None, fmt: str | None = None) -> list[Curve]:
    """Read every curve in ``path``: a scalerl run directory, .csv, .jsonl/.ndjson/.json, or another
    framework's log (``scaling.logs``: TensorBoard, TRL, MLflow, W&B offline, verl console),
    detected from the file or folder's shape unless ``fmt`` names it."""
    from scalerl.scaling import logs  # the other frameworks' readers build on this module

    p = Path(path)
    if not p.exists():
        raise MissingCurveError(f"{p}: no such file or directory")
    try:
        if not p.is_dir() and not p.is_file():  # a FIFO or a device: reading it could wait forever
            raise CurveError(f"{p}: not a regular file")
        kind = fmt or logs.detect_format(p)
        if kind != "scalerl":
            return logs.read_log(p, kind, x, y, axis)
        if p.is_dir():
            return [read_run_dir(p, x, y, axis)]
        suffix = p.suffix.lower()
        if suffix in (".jsonl", ".ndjson", ".json"):
            return [read_jsonl(p, x, y, axis=axis)]
        if suffix in (".csv", ".tsv", ".txt"):
            return read_csv(p, x, y, axis)
    except CurveError:  # MissingCurveError is a FileNotFoundError too: already the message
        raise
    except UnicodeDecodeError as err:  # a binary file under a text name
        # (err.start counts from the decoder's chunk, not the file: no offset is given)
        raise CurveError(f"{p}: not UTF-8 text ({err.reason}): a binary file? expected a run directory, "
                         ".csv or .jsonl") from None
    except OSError as err:  # permissions, EIO: the user's file, named
        name = err.filename if isinstance(err.filename, str) else p
        raise CurveError(f"{name}: cannot read ({err.strerror or err})") from None
    raise CurveError(f"{p}: unknown format {suffix!r} (expected a run directory, .csv or .jsonl, or "
                     f"one of the logs --format names: {', '.join(logs.FORMATS)})")


def write_curves_csv(curves: Sequence[Curve], path: str | Path) -> None:
    """Curves as one CSV that `read_csv` reads back as the same curves: a `run` column (each
    curve's label), `step` where the curve has one, its x and y. The file must be new (mode "x": an
    existing file is never overwritten). Small enough to ship a study's runs as reference data."""
    if not curves:
        raise CurveError(f"{path}: no curves to write")
    x_name, y_name = curves[0].x_name, curves[0].y_name
    with Path(path).open("x", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["run", "step", x_name, y_name])
        for c in curves:
            steps = c.extra.get("step")
            for i in range(c.x.size):
                step = "" if steps is None or not math.isfinite(steps[i]) else f"{steps[i]:g}"
                w.writerow([c.label, step, repr(float(c.x[i])), repr(float(c.y[i]))])


def read_many(paths: Sequence[str | Path], x: str | None = None, y: str | None = None,
              axis: FlopsAxis | None = None, fmt: str | None = None) -> list[Curve]:
    """Read several sources; labels are made unique by appending ``#2``, ``#3`` ... to repeats."""
    curves = [c for p in paths for c in read_curves(p, x, y, axis, fmt)]
    seen: dict[str, int] = {}
    out = []
    for c in curves:
        seen[c.label] = seen.get(c.label, 0) + 1
        if seen[c.label] > 1:
            c = replace(c, label=f"{c.label}#{seen[c.label]}")
        out.append(c)
    return out


def window_mask(curve: Curve, column: str, lo: float | None, hi: float | None) -> NDArray[np.bool_]:
    """Points with ``lo <= column <= hi`` (e.g. a step or epoch window); rows lacking it are excluded."""
    values = curve.column(column)
    mask = np.isfinite(values)
    if lo is not None:
        mask &= values >= lo
    if hi is not None:
        mask &= values <= hi
    return mask


def reference_csv(name: str = "scalerl_8b_dense_fig1a") -> Path:
    """Path of a digitized reference curve shipped with the package (see the file's header)."""
    p = Path(__file__).parent / "data" / f"{name}.csv"
    if not p.is_file():
        raise MissingCurveError(f"no reference curve {name!r} in {p.parent}")
    return p
