"""Coverage of the fit's observation band on later points of curves nobody tuned the band on.

    python benchmarks/band_calibration.py                          # the two digitized paper curves
    python benchmarks/band_calibration.py runs/demo-s0 runs/demo-s1 ...   # plus run directories

Each curve is fitted the way its source extrapolates: the paper curves on their `train` points
(the stars of Fig. 1a; the `extended` crosses are the later points), a run directory on the first
`--fit-fraction` of its compute (x = `--x`, default flops). For every point after the fit window it
checks whether the observation falls inside the nominal `--level` band for a new evaluation, with
the drift term of `scalerl.scaling.uncertainty` (local-level model) and without it (the plain
residual band). Prints one row per curve and the pooled coverage; numpy/scipy only (no torch).
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

from scalerl.scaling import bootstrap, fit_sigmoid, read_curves, reference_csv
from scalerl.scaling.io import read_run_dir
from scalerl.scaling.report import table

# Digitized Fig. 1a curves (package data) and the R0 their paper fits use.
PAPER_CURVES = (("paper 8B dense", "scalerl_8b_dense_fig1a", 0.4017),
                ("paper Scout MoE", "scalerl_scout_moe_fig1a", 0.5116))


def _train_end(path: Path) -> float:
    """The largest compute of the rows marked `train` in a digitized reference CSV."""
    rows = csv.DictReader(line for line in path.read_text().splitlines() if not line.startswith("#"))
    ends = [float(r["compute_gpu_hours"]) for r in rows if r["split"] == "train"]
    if not ends:
        raise ValueError(f"{path}: no rows with split=train")
    return max(ends)


def coverage(x: np.ndarray, y: np.ndarray, r0: float | None, window_end: float, level: float,
             n_boot: int, seed: int) -> dict[str, float]:
    """Fit on x <= window_end; the share of later points inside the band, with and without drift."""
    fit = fit_sigmoid(x, y, r0=r0, max_compute=window_end)
    after = ~fit.in_fit & (fit.compute > fit.fit_compute.max())
    c, r = fit.compute[after], fit.reward[after]
    if not c.size:
        raise ValueError(f"no points after the fit window (x <= {window_end:.4g})")
    boot = bootstrap(fit, n_boot=n_boot, seed=seed, level=level)
    lo, hi = boot.band(c, observation=True)
    plo, phi = replace(boot, drift=0.0).band(c, observation=True)
    return {"fitted": float(fit.fit_compute.size), "later": float(c.size),
            "inside": float(np.sum((r >= lo) & (r <= hi))),
            "inside_plain": float(np.sum((r >= plo) & (r <= phi))),
            "drift_sd": math.sqrt(boot.drift), "span": fit.diagnostics.C_max_over_C_mid,
            "half_width_end": float(hi[-1] - lo[-1]) / 2}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="*", metavar="RUN_DIR", help="scalerl run directories (metrics.jsonl)")
    p.add_argument("--x", default="flops", help="compute column of the run directories (default flops)")
    p.add_argument("--fit-fraction", type=float, default=0.5, help="fit window of the runs (default 0.5)")
    p.add_argument("--level", type=float, default=0.9, help="nominal band level (default 0.9)")
    p.add_argument("--bootstrap", type=int, default=1000, help="resamples (default 1000)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    results: list[tuple[str, dict[str, float]]] = []
    try:
        for label, name, r0 in PAPER_CURVES:
            path = reference_csv(name)
            curve = read_curves(path)[0]
            results.append((label, coverage(curve.x, curve.y, r0, _train_end(Path(path)), args.level,
                                            args.bootstrap, args.seed)))
        for run in args.runs:
            curve = read_run_dir(run, x=args.x)
            results.append((run, coverage(curve.x, curve.y, None, args.fit_fraction * float(curve.x[-1]),
                                          args.level, args.bootstrap, args.seed)))
    except ValueError as err:
        print(f"band_calibration: {err}", file=sys.stderr)
        return 2
    rows = [[label, f"{int(r['fitted'])}/{int(r['later'])}", f"{r['span']:.2f}", f"{r['drift_sd']:.4f}",
             f"{r['half_width_end']:.3f}", f"{r['inside'] / r['later']:.0%}",
             f"{r['inside_plain'] / r['later']:.0%}"] for label, r in results]
    later = sum(r["later"] for _, r in results)
    inside = sum(r["inside"] for _, r in results) / later
    plain = sum(r["inside_plain"] for _, r in results) / later
    rows.append(["pooled", f"-/{int(later)}", "", "", "", f"{inside:.0%}", f"{plain:.0%}"])
    print(f"coverage of the nominal {args.level:.0%} observation band on the points after the fit window "
          f"({args.bootstrap} resamples, seed {args.seed})\n")
    print(table(["curve", "fitted/later", "span/C_mid", "drift sd", "band +- at end", "drift band",
                 "plain band"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
