"""`scalerl watch`: follow runs while they train, with their live forecast.

    scalerl watch runs/grpo runs/ablate-scalerl-loo/runs/*      # a table, refreshed every 10 s
    scalerl watch runs/grpo --once                              # print it once and exit
    scalerl watch runs/grpo --plot curves.png                   # also rewrite a PNG of the fits
    scalerl watch verl_log.jsonl wandb_export.csv --x gpu_hours # other frameworks' logs
    scalerl watch runs/tb/ --y eval/reward --x step             # TensorBoard, TRL, MLflow, verl logs

One row per run: its last step, its compute, its last held-out pass rate, the forecast (the 95%
interval of the asymptote A; the point A only once it is pinned, printed by the function the
run's progress line uses: `scaling.live.forecast_text`), B, and the compute beyond the run's data
that would pin A to +-a_width (`forecast_compute_to_pin`). A scalerl run folder is read as it is
being written (by this machine's run or a Ray task's: a last line still being written is left for
the next refresh), and its forecast is the one the run logged on its newest eval row
(`scalerl.scaling.live`; the row says which evaluation it fitted, and its `forecast_shown` the
steady state shown). Anything else (a run without a logged forecast, a JSONL or CSV log of
another framework, a W&B export, TensorBoard event files, a TRL trainer_state.json, an MLflow run
folder, a verl console log: the readers `scalerl fit` has) is fitted here the same way, once per
refresh; with no history of fits, it shows that fit's own state (no hysteresis).
`--plot` redraws the curves and their fitted sigmoids into one PNG at every refresh.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scalerl.inputs import InputError, MissingInputError


@dataclass(frozen=True)
class WatchRow:
    run: str
    step: str
    compute: float | None
    pass_rate: float | None
    A: float | None
    A_lo: float | None
    A_hi: float | None
    B: float | None
    to_pin: float | None
    status: str
    note: str = ""  # which evaluation the forecast fitted, or why there is none
    shown: str | None = None  # the logged steady state (forecast_shown); None: this fit's own

    def forecast_fields(self) -> dict[str, Any]:
        """The row's forecast as eval-row keys (what `scaling.live.forecast_text` reads)."""
        if self.status == "-":
            return {}
        return {"forecast_A": self.A, "forecast_A_lo": self.A_lo, "forecast_A_hi": self.A_hi,
                "forecast_status": self.status, "forecast_shown": self.shown}


def _num(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def _run_dir_row(path: Path, x: str, y: str, a_width: float) -> WatchRow:
    from scalerl.config import ForecastConfig
    from scalerl.scaling.io import curve_from_rows, read_rows, run_label
    from scalerl.scaling.validation import CurveError

    label = run_label(path)
    rows = read_rows(path / "metrics.jsonl")
    steps = [r for r in rows if r.get("kind") == "step"]
    evals = [r for r in rows if r.get("kind") == "eval" and _num(r.get(y)) is not None]
    last_step = str(steps[-1].get("step", "-")) if steps else "-"
    # The newest row that carries the compute (step rows are stamped with it, so is every eval).
    compute = next((v for r in reversed(rows) if (v := _num(r.get(x))) is not None), None)
    pass_rate = _num(evals[-1].get(y)) if evals else None
    logged = next((r for r in reversed(evals) if _num(r.get("forecast_A")) is not None), None)
    if logged is not None:
        return WatchRow(label, last_step, compute, pass_rate, _num(logged.get("forecast_A")),
                        _num(logged.get("forecast_A_lo")), _num(logged.get("forecast_A_hi")),
                        _num(logged.get("forecast_B")), _num(logged.get("forecast_compute_to_pin")),
                        str(logged.get("forecast_status", "")),
                        f"logged at step {logged.get('step')} "
                        f"(fit through step {logged.get('forecast_step')})",
                        shown if isinstance(shown := logged.get("forecast_shown"), str) else None)
    if not evals:
        return WatchRow(label, last_step, compute, None, None, None, None, None, None, "-",
                        "no evaluation yet")
    try:
        curve = curve_from_rows(rows, x=x, y=y, label=label, source=str(path / "metrics.jsonl"))
    except CurveError as err:
        return WatchRow(label, last_step, compute, pass_rate, None, None, None, None, None, "-", str(err))
    return _forecast_row(curve, ForecastConfig(x=x, a_width=a_width), last_step, compute)


def _forecast_row(curve: Any, cfg: Any, step: str, compute: float | None) -> WatchRow:
    from scalerl.scaling.live import forecast_curve

    f = forecast_curve(curve, cfg)
    pass_rate = float(curve.y[-1]) if curve.y.size else None
    if f is None:
        return WatchRow(curve.label, step, compute, pass_rate, None, None, None, None, None, "-",
                        f"fewer than {cfg.min_evals} evaluations with {curve.x_name} > 0")
    return WatchRow(curve.label, step, compute, pass_rate, f.A, f.A_lo, f.A_hi, f.B, f.compute_to_pin,
                    f.status, f"fitted here on {f.evals} evaluations (x = {curve.x_name})")


def collect(paths: Sequence[str], x: str | None, y: str | None, a_width: float,
            fmt: str | None = None) -> list[WatchRow]:
    """One row per run in `paths` (a run folder, or every curve a log file or log folder holds:
    TensorBoard, TRL, MLflow, verl, CSV, JSONL; `fmt` names the format, else it is detected)."""
    from scalerl.config import ForecastConfig
    from scalerl.scaling.io import DEFAULT_X, DEFAULT_Y, read_curves
    from scalerl.scaling.logs import detect_format

    out = []
    for p in paths:
        path = Path(p)
        if not path.exists():
            raise MissingInputError(f"{path}: no such run folder or log file")
        if path.is_dir() and (fmt or detect_format(path)) == "scalerl":
            if not (path / "metrics.jsonl").is_file():
                out.append(WatchRow(path.name, "-", None, None, None, None, None, None, None, "-",
                                    "no metrics.jsonl yet"))
                continue
            out.append(_run_dir_row(path, x or DEFAULT_X, y or DEFAULT_Y, a_width))
            continue
        for curve in read_curves(path, x, y, fmt=fmt):
            cfg = ForecastConfig(x=curve.x_name, a_width=a_width)
            step = curve.extra.get("step")
            last = str(int(step[-1])) if step is not None and math.isfinite(step[-1]) else "-"
            out.append(_forecast_row(curve, cfg, last, float(curve.x[-1])))
    return out


def render(rows: Sequence[WatchRow], x_name: str, a_width: float = 0.02) -> str:
    """The table: the forecast column is `scaling.live.forecast_text`, the function the run's
    progress line prints with (the interval; the point only once pinned to +-a_width)."""
    from scalerl.scaling.live import forecast_text
    from scalerl.scaling.report import num, table

    body = [[r.run, r.step, num(r.compute), num(r.pass_rate, 3),
             forecast_text(r.forecast_fields(), a_width) or "-", num(r.B, 3), num(r.to_pin)] for r in rows]
    head = ["run", "step", x_name, "pass rate", "forecast (95% interval of A)", "B", "compute to pin A"]
    notes = [f"  {r.run}: {r.note}" for r in rows if r.note]
    return "\n".join([table(head, body), *notes])


def write_plot(paths: Sequence[str], x: str | None, y: str | None, out: str, fmt: str | None = None) -> int:
    """Every readable curve with its fitted sigmoid and band, into `out` (atomically); how many
    curves it drew (0: none can be fitted yet, and `out` was not written)."""
    from scalerl.scaling.analysis import FitOptions, analyze_curve
    from scalerl.scaling.io import curve_from_rows, read_curves, read_rows, run_label
    from scalerl.scaling.logs import detect_format
    from scalerl.scaling.plot import FitPlotItem, plot_fits
    from scalerl.scaling.validation import CurveError

    items = []
    for p in paths:
        path = Path(p)
        try:
            native = path.is_dir() and (fmt or detect_format(path)) == "scalerl"
            curves = ([curve_from_rows(read_rows(path / "metrics.jsonl"), x, y, run_label(path), str(path))]
                      if native else read_curves(path, x, y, fmt=fmt))
            for c in curves:
                a = analyze_curve(c, FitOptions(n_boot=200))
                items.append(FitPlotItem(c.label, a.fit, a.boot))
        except CurveError:
            continue  # too early to fit: the table says why
    if items:
        extend = max(1.5 * float(i.fit.compute.max()) for i in items)
        plot_fits(items, out, x_label=x or "compute", y_label=y or "val_pass_rate",
                  title="scalerl watch: curves and forecasts", extend_to=extend)
    return len(items)


def run_watch(args: argparse.Namespace) -> int:
    if args.interval <= 0:
        raise InputError(f"--interval: must be > 0 seconds, got {args.interval}")
    if not 0 < args.a_width < 1:
        raise InputError(f"--a-width: must be in (0, 1), got {args.a_width}")
    if args.plot:
        from scalerl.ownership import check_output_file

        # An existing file is replaced only when --overwrite hands it over; from the first refresh
        # on, the file is this command's own and each refresh rewrites it.
        check_output_file(args.plot, "--plot", overwrite=args.overwrite)
    from scalerl.ownership import writing_output

    x_name = args.x or "compute_device_hours"
    try:
        while True:
            rows = collect(args.paths, args.x, args.y, args.a_width, args.format)
            text = render(rows, x_name, args.a_width)
            if args.plot:
                with writing_output(args.plot, "--plot"):
                    drawn = write_plot(args.paths, args.x, args.y, args.plot, args.format)
                text += (f"\nplot written to {args.plot} ({drawn} curve(s))" if drawn else
                         f"\nplot not written: no curve can be fitted yet ({args.plot} left as it was)")
            if args.once:
                sys.stdout.write(text + "\n")
                return 0
            clear = "\x1b[2J\x1b[H" if sys.stdout.isatty() else ""
            sys.stdout.write(f"{clear}{time.strftime('%H:%M:%S')} (every {args.interval:g} s; Ctrl-C stops)\n"
                             f"{text}\n")
            sys.stdout.flush()
            time.sleep(args.interval)
    except KeyboardInterrupt:
        return 0


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "watch",
        help="follow runs in progress: step, compute, pass rate, live forecast of A",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("paths", nargs="+", metavar="RUN_DIR",
                   help="scalerl run folder (being written or not), a .jsonl / .csv / W&B export log, a "
                   "TensorBoard event file or folder, a TRL trainer_state.json, an MLflow run folder, "
                   "a verl log")
    p.add_argument("--once", action="store_true", help="print the table once and exit")
    p.add_argument("--interval", type=float, default=10.0, metavar="S", help="seconds between refreshes")
    p.add_argument("--plot", metavar="PNG",
                   help="rewrite this figure of the curves and fits at every refresh (a new file, or an "
                        "existing one with --overwrite)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --plot file")
    p.add_argument("--x", metavar="COL", help="compute column (default compute_device_hours)")
    p.add_argument("--y", metavar="COL", help="reward column or tag (default val_pass_rate)")
    p.add_argument("--format", choices=("scalerl", "tensorboard", "trl", "mlflow", "verl"), metavar="FMT",
                   help="log format (scalerl, tensorboard, trl, mlflow, verl; default: detected)")
    p.add_argument("--a-width", type=float, default=0.02, metavar="W",
                   help="target half-width on A of curves fitted here: 'compute to pin A', and the "
                   "point shown once the interval is narrower than 2W (default 0.02)")
    p.set_defaults(func=run_watch)


__all__ = ["WatchRow", "collect", "register", "render", "run_watch"]
