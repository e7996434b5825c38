"""Calibration of the live forecast: replay curves evaluation by evaluation, as a run would see them.

    python benchmarks/forecast_calibration.py                         # the two digitized paper curves
    python benchmarks/forecast_calibration.py runs/demo-s0 other.csv  # plus run folders / logs
    python benchmarks/forecast_calibration.py --width 0.02 --width 0.04

For each curve and each prefix of its first k evaluations (k from `forecast.min_evals` = 4 to
n - 1), the live forecast (`scalerl.scaling.live.forecast_curve`: the fit `scalerl fit` makes,
1000 bootstrap resamples, seed 0) gives A with its 95% interval. The reference is A fitted on
the full curve (all n points) the same way. Reported per curve:

* `covered`: the share of prefixes whose A interval contains the full-curve A (all prefixes, and
  the unflagged ones only: those `--stop-when-known` may act on);
* for each `--width W`: where `--stop-when-known W` would stop (the first unflagged prefix of k
  evaluations whose A interval is narrower than W; a live run logs that forecast on evaluation
  k + 1 and stops there), as the fraction of the curve's compute spent by then, and how far that
  forecast's A is from the full-curve A.

numpy/scipy only (no torch).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

from scalerl.config import ForecastConfig
from scalerl.scaling.io import Curve, read_curves, reference_csv
from scalerl.scaling.live import forecast_curve
from scalerl.scaling.report import table

PAPER_CURVES = (("paper 8B dense (Fig. 1a)", "scalerl_8b_dense_fig1a"),
                ("paper Scout MoE (Fig. 1a)", "scalerl_scout_moe_fig1a"))


def prefix(curve: Curve, k: int) -> Curve:
    """The curve as a run sees it after its first `k` evaluations."""
    return replace(curve, x=curve.x[:k], y=curve.y[:k], lines=curve.lines[:k],
                   extra={n: v[:k] for n, v in curve.extra.items()}, truncation=None)


def replay(curve: Curve, widths: list[float], min_evals: int = 4) -> dict[str, object]:
    """The replay of one curve (see the module docstring)."""
    cfg = ForecastConfig(x=curve.x_name, min_evals=min_evals)
    full = forecast_curve(curve, cfg)
    if full is None:
        raise ValueError(f"{curve.label}: fewer than {min_evals} points with x > 0")
    a_full = full.A
    first = int(np.argmax(curve.x > 0))
    rows = []
    for k in range(first + min_evals, curve.x.size):
        f = forecast_curve(prefix(curve, k), cfg)
        if f is not None and f.A_lo is not None and f.A_hi is not None:
            rows.append((k, f))
    inside = [f.A_lo <= a_full <= f.A_hi for _, f in rows]  # type: ignore[operator]
    ok = [f.A_lo <= a_full <= f.A_hi for _, f in rows if f.status == "ok"]  # type: ignore[operator]
    stops = {}
    end = float(curve.x[-1])
    for w in widths:
        hit = next(((k, f) for k, f in rows if f.known(w)), None)
        # A live run logs the forecast of its first k evaluations on evaluation k + 1 and stops
        # there: the compute spent is that of point k (0-based).
        stops[w] = None if hit is None else (float(curve.x[hit[0]]) / end, abs(hit[1].A - a_full), hit[0])  # type: ignore[operator]
    return {"label": curve.label, "n": int(curve.x.size), "A_full": a_full, "full_status": full.status,
            "prefixes": len(rows), "covered": float(np.mean(inside)) if inside else None,
            "n_ok": len(ok), "covered_ok": float(np.mean(ok)) if ok else None, "stops": stops,
            "inside": (sum(inside), len(inside), sum(ok), len(ok))}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("paths", nargs="*", help="more curves: run folders, .jsonl, .csv")
    p.add_argument("--x", help="compute column of the extra curves (default: the reader's)")
    p.add_argument("--width", type=float, action="append", help="--stop-when-known widths (default 0.02)")
    args = p.parse_args(argv)
    widths = args.width or [0.02]
    curves = [replace(read_curves(reference_csv(name))[0], label=label) for label, name in PAPER_CURVES]
    for path in args.paths:
        # Run folders of one study share a run name (`demo`): the folder tells them apart.
        name = Path(path).name
        curves.extend(replace(c, label=f"{c.label} ({name})") for c in read_curves(Path(path), args.x))
    results = [replay(c, widths) for c in curves]
    body = []
    for r in results:
        row = [str(r["label"]), str(r["n"]), f"{r['A_full']:.4f} ({r['full_status']})",
               f"{r['covered']:.0%} of {r['prefixes']}" if r["covered"] is not None else "-",
               f"{r['covered_ok']:.0%} of {r['n_ok']}" if r["covered_ok"] is not None else "- of 0"]
        for w in widths:
            s = r["stops"][w]  # type: ignore[index]
            row.append("never" if s is None else f"{s[0]:.0%} (k={s[2]}, |dA| {s[1]:.3f})")
        body.append(row)
    head = ["curve", "evals", "A full", "A interval covers", "unflagged cover",
            *(f"--stop-when-known {w:g} stops at" for w in widths)]
    sys.stdout.write(table(head, body) + "\n" + pooled(results) + "\n")
    return 0


def pooled(results: list[dict[str, object]]) -> str:
    """Coverage over every prefix of every curve (each prefix one trial), all and unflagged."""
    counts = np.array([r["inside"] for r in results], dtype=float).reshape(-1, 4).sum(axis=0)
    hit, n, hit_ok, n_ok = counts
    if not n:
        return "pooled: no prefixes"
    ok = f"{hit_ok / n_ok:.0%} of {n_ok:.0f}" if n_ok else "- of 0"
    return (f"pooled over {len(results)} curves: the A interval contains the full-curve A at "
            f"{hit / n:.0%} of {n:.0f} prefixes (unflagged: {ok})")

if __name__ == "__main__":
    raise SystemExit(main())
