"""The demo: train the embedded default, fit its curve on the first half, check the prediction.

`run_demo` warm-starts the tiny model (cached), trains it with the `scalerl` recipe through the
composition root (`scalerl.assembly.run.train_run`), fits R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B)
on the first part of the compute and writes `fit.png`, `report.md` and `summary.json` beside the
run; `run_seeds` repeats it over seeds and reports the spread. Settings are in `demo.yaml`
(`load_settings`). The command is `scalerl demo` (`scalerl.cli.demo`).
"""

from __future__ import annotations

import json
import logging
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from scalerl.atomic import write_atomic, write_json_atomic
from scalerl.config import RunConfig, build_config, load_yaml, override_layer, yaml_layer
from scalerl.inputs import InputError
from scalerl.ownership import check_output_dir_owned, claim_output_dir
from scalerl.recipes import recipe_path
from scalerl.scaling.analysis import FitOptions, RunAnalysis, analyze_curve
from scalerl.scaling.io import Curve, read_run_dir
from scalerl.scaling.plot import FitPlotItem, plot_fits
from scalerl.scaling.report import interval, jsonable, num, render_fit, run_to_dict
from scalerl.studies.study import check_overrides

logger = logging.getLogger(__name__)

SETTINGS_FILE = Path(__file__).resolve().parent / "demo.yaml"
MARKER_FILE = "demo.json"
#: the kind a demo folder is marked with (`scalerl.ownership`)
DEMO_KIND = "demo"
SUMMARY_FILE = "summary.json"
REPORT_FILE = "report.md"
PLOT_FILE = "fit.png"
# The paper's bar for an extrapolated pass rate (Sec. 2: fits land within about +-0.02).
PAPER_TOLERANCE = 0.02


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class DemoFit(_Section):
    x: str = "flops"
    fraction: float = Field(0.5, gt=0.0, lt=1.0)
    bootstrap: int = Field(1000, ge=0)


class DemoQuick(_Section):
    run: dict[str, Any] = {}


class DemoSettings(_Section):
    """The demo's own settings file (`demo.yaml`)."""

    recipe: str = "scalerl"
    seed: int = 0
    fit: DemoFit = DemoFit()
    run: dict[str, Any] = {}
    quick: DemoQuick = DemoQuick()


@dataclass(frozen=True)
class LoadedSettings:
    settings: DemoSettings
    path: Path
    marks: dict[tuple[str, ...], int]

    def layer(self, *prefix: str) -> tuple[dict[str, Any], dict[tuple[str, ...], str]]:
        """The RunConfig subtree at `prefix` as a config layer whose errors point into this file."""
        tree: Any = self.settings.model_dump()
        for key in prefix:
            tree = tree[key]
        n = len(prefix)
        origins = {path[n:]: f"{self.path}:{line}" for path, line in self.marks.items()
                   if path[:n] == prefix and len(path) > n}
        return dict(tree), origins


def load_settings(path: str | Path | None = None) -> LoadedSettings:
    """Read and validate the demo settings; errors name the file, line and key."""
    p = Path(path) if path is not None else SETTINGS_FILE
    data, marks = load_yaml(p)
    try:
        settings = DemoSettings.model_validate(data)
    except ValidationError as err:
        lines = []
        for e in err.errors():
            loc = tuple(str(x) for x in e["loc"])
            line = next((marks[loc[:n]] for n in range(len(loc), 0, -1) if loc[:n] in marks), None)
            where = f"{p}:{line}" if line is not None else str(p)
            msg = "unknown key" if e["type"] == "extra_forbidden" else f"{e['msg']} (got {e.get('input')!r})"
            lines.append(f"{where}: {'.'.join(loc)}: {msg}")
        raise InputError("demo settings error:\n  " + "\n  ".join(lines)) from None
    return LoadedSettings(settings, p, marks)


def demo_config(
    loaded: LoadedSettings,
    *,
    output_dir: str | Path,
    quick: bool = False,
    seed: int | None = None,
    max_time_s: float | None = None,
    overrides: list[str] | None = None,
) -> RunConfig:
    """Recipe, the settings' `run`, `quick.run` with `--quick`, the flags, then the overrides."""
    overrides = list(overrides or [])
    check_overrides(overrides, reserved=("output_dir", "name"))
    s = loaded.settings
    flags: dict[str, Any] = {"seed": s.seed if seed is None else seed, "name": "demo",
                             "output_dir": str(output_dir), "recipe": s.recipe}
    if max_time_s is not None:
        flags["max_time_s"] = max_time_s
    layers = [yaml_layer(recipe_path(s.recipe)), loaded.layer("run")]
    if quick:
        layers.append(loaded.layer("quick", "run"))
    layers += [(flags, {(k,): "command line" for k in flags}), override_layer(overrides)]
    return build_config(layers)


def prepare_output_dir(path: Path) -> None:
    """Make `path` ready for a fresh demo: create it, or clear a previous demo's; refuse otherwise
    (`scalerl.ownership`: a folder that is not new, empty or a demo's is never touched)."""
    check_output_dir_owned(path, DEMO_KIND, "--output-dir")  # an earlier scalerl's demo is adopted
    if path.is_dir() and any(path.iterdir()):
        # An earlier demo (finished or interrupted) in its own directory: replaced as a whole, so its
        # metrics, checkpoints and report cannot mix with the new run's.
        shutil.rmtree(path)
    claim_output_dir(path, DEMO_KIND, "--output-dir")


@dataclass(frozen=True, eq=False)
class DemoResult:
    analysis: RunAnalysis
    fraction: float
    seconds: float

    @property
    def observed(self) -> float:
        return float(self.analysis.curve.y[-1])

    @property
    def predicted(self) -> float:
        return self.analysis.predictions[0].reward

    @property
    def error(self) -> float:
        return self.predicted - self.observed

    @property
    def last3(self) -> float:
        """Mean of the last three evaluations: the run's end with one evaluation's noise averaged."""
        return float(self.analysis.curve.y[-3:].mean())


def fit_demo(run_dir: Path, x: str, fraction: float, n_boot: int, seconds: float = 0.0) -> DemoResult:
    """Fit the run's curve on `x <= fraction x final x` and predict the final evaluation."""
    return fit_demo_curve(read_run_dir(run_dir, x=x), fraction, n_boot, seconds, where=str(run_dir))


def fit_demo_curve(curve: Curve, fraction: float, n_boot: int, seconds: float = 0.0,
                   where: str | None = None) -> DemoResult:
    """`fit_demo` on a curve read by any reader (a run folder, a CSV export of one)."""
    run_dir = where or curve.source
    x = curve.x_name
    end = float(curve.x[-1])
    window = fraction * end
    inside = int(((curve.x > 0) & (curve.x <= window)).sum())
    if inside < 4:
        raise InputError(
            f"{run_dir}: {inside} evaluation(s) with {x} in (0, {window:.4g}], the first {fraction:.0%} "
            f"of the compute; the fit needs at least 4 (evaluate more often: eval.every, or train longer)"
        )
    opts = FitOptions(max_x=window, n_boot=n_boot, predict_at=(end,))
    return DemoResult(analyze_curve(curve, opts), fraction, seconds)


def _param_lines(a: RunAnalysis) -> list[str]:
    f, b = a.fit, a.boot

    def span(name: str, digits: int) -> str:
        return "" if b is None else "  " + interval(*b.interval(name), digits=digits)

    return [
        f"  A     = {num(f.A)}{span('A', 4)}   asymptotic pass rate",
        f"  B     = {num(f.B, 3)}{span('B', 3)}   compute efficiency",
        f"  C_mid = {num(f.C_mid, 3)}{span('C_mid', 3)}   {a.curve.x_name} at half of the gain",
        f"  R0    = {num(f.R0)}   ({f.r0_source.replace('_', ' ')})",
    ]


def render_result(r: DemoResult, cfg: RunConfig) -> str:
    a = r.analysis
    f, p = a.fit, a.predictions[0]
    fc = f.fit_compute
    band = ""
    if p.obs_lo is not None and a.boot is not None:
        band = (f"  {interval(p.obs_lo, p.obs_hi, digits=3)} ({a.boot.level:.0%} band for a new evaluation, "
                "drift included)")
    verdict = "within" if abs(r.error) <= PAPER_TOLERANCE else "outside"
    # The step of the last evaluation, not max_steps: --max-time may have stopped the run earlier.
    steps = a.curve.extra.get("step")
    trained = f"{int(steps[-1])} steps" if steps is not None else f"{cfg.max_steps} steps"
    lines = [
        f"demo: recipe {cfg.recipe}, {trained}, {a.curve.x.size} evaluations "
        f"({cfg.data.heldout_size} held-out prompts x {cfg.eval.k} samples), {r.seconds / 60:.1f} min",
        f"fit of R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B) on the first {r.fraction:.0%} of the compute "
        f"(x = {a.curve.x_name}, {fc.size} points up to {num(float(fc.max()))}):",
        *_param_lines(a),
        f"final pass rate at {a.curve.x_name} = {num(p.compute)}:",
        f"  predicted {p.reward:.3f}{band}",
        f"  observed  {r.observed:.3f}",
        f"  error     {r.error:+.3f}  ({verdict} the paper's +-{PAPER_TOLERANCE} for extrapolated points)",
    ]
    if a.held_out is not None:
        lines.append(f"  all {a.held_out.n} points after the fit window: mean abs error {a.held_out.mae:.3f} "
                     f"(max {a.held_out.max_abs:.3f})")
    status = "ok" if f.diagnostics.reliable else "FLAGGED"
    lines.append(f"fit status: {status}")
    lines += [f"  warning: {w}" for w in f.diagnostics.warnings]
    if a.advice is not None:
        lines.append(f"  {a.advice.sentence(a.curve.x_name)}")
    return "\n".join(lines)


def report_markdown(r: DemoResult, cfg: RunConfig, text: str, settings_path: Path) -> str:
    a = r.analysis
    return "\n".join([
        "# scalerl demo",
        "",
        f"The tiny default model, warm-started by SFT, trained with the `{cfg.recipe}` recipe for "
        f"{cfg.max_steps} steps (seed {cfg.seed}); the held-out pass rate (mean@{cfg.eval.k} over "
        f"{cfg.data.heldout_size} prompts) every {cfg.eval.every} steps. Settings: `{settings_path}`.",
        "",
        "```",
        text,
        "```",
        "",
        f"![fit on the first {r.fraction:.0%} of the compute, extrapolated]({PLOT_FILE})",
        "",
        "Filled points were fitted; crosses are the later evaluations the fit had to predict; the dashed "
        "line is the extrapolation with its bootstrap band; the dotted line is the asymptote A.",
        "",
        f"Refit it yourself: `scalerl fit {cfg.output_dir} --x {a.curve.x_name} "
        f"--max-x {num(float(a.fit.fit_compute.max()), 6)} --predict-at {num(float(a.curve.x[-1]), 6)}`.",
        "",
        "```",
        render_fit([a], a.boot.level if a.boot else 0.95, a.boot.n_requested if a.boot else 0,
                   a.boot.seed if a.boot else 0),
        "```",
        "",
    ])


def run_demo(
    *,
    settings_path: str | Path | None = None,
    output_dir: str | Path = "runs/demo",
    quick: bool = False,
    seed: int | None = None,
    max_time_s: float | None = None,
    overrides: list[str] | None = None,
    device: str | None = None,
    out: Any = None,
    say: Any = logger.info,
) -> int:
    """The whole demo (see the module docstring); returns the exit status. `say`: where the
    training run's lines go (`scalerl demo` passes stderr)."""
    from scalerl.assembly.inputs import check_run_inputs
    from scalerl.assembly.run import prepare_model, train_run

    stream = out or sys.stdout
    start = time.perf_counter()
    loaded = load_settings(settings_path)
    run_dir = Path(output_dir)
    cfg = demo_config(loaded, output_dir=run_dir, quick=quick, seed=seed, max_time_s=max_time_s,
                      overrides=overrides)
    check_run_inputs(cfg)  # an override naming a missing file fails here, before any work
    from scalerl.rollout.factory import check_engine_available  # torch: imported only when running

    check_engine_available(cfg.generation.engine)
    prepare_output_dir(run_dir)
    write_json_atomic(run_dir / MARKER_FILE, {"kind": "scalerl demo", "settings": str(loaded.path),
                                             "quick": quick, "seed": cfg.seed})
    cfg = prepare_model(cfg, say=say)
    code = train_run(cfg, run_dir, device=device, say=say)
    if code:
        return code
    fit = loaded.settings.fit
    result = fit_demo(run_dir, fit.x, fit.fraction, fit.bootstrap, time.perf_counter() - start)
    text = render_result(result, cfg)
    a = result.analysis
    title = f"scalerl demo: fit on the first {result.fraction:.0%} of the compute"
    plot_fits([FitPlotItem("demo", a.fit, a.boot, predictions=a.predictions)], run_dir / PLOT_FILE,
              x_label=a.curve.x_name, y_label=a.curve.y_name, title=title,
              level=a.boot.level if a.boot else 0.95)
    write_atomic(run_dir / REPORT_FILE, report_markdown(result, cfg, text, loaded.path))
    p = a.predictions[0]
    write_json_atomic(run_dir / SUMMARY_FILE, jsonable({
        "kind": "scalerl demo",
        "settings": str(loaded.path),
        "quick": quick,
        "seed": cfg.seed,
        "recipe": cfg.recipe,
        "max_steps": cfg.max_steps,
        "x": a.curve.x_name,
        "fit_fraction": result.fraction,
        "final": {"x": p.compute, "predicted": p.reward, "band": [p.obs_lo, p.obs_hi],
                  "observed": result.observed, "error": result.error, "last3": result.last3,
                  "within_paper_tolerance": abs(result.error) <= PAPER_TOLERANCE},
        "fit": run_to_dict(a),
        "seconds": result.seconds,
        "files": {"plot": PLOT_FILE, "report": REPORT_FILE},
    }))
    stream.write(text + f"\n\nplot: {run_dir / PLOT_FILE}; report: {run_dir / REPORT_FILE}\n")
    return 0


SEEDS_FILE = "seeds.json"
SEEDS_REPORT = "seeds.md"


@dataclass(frozen=True)
class SeedRow:
    """One seed's demo, read back from its `summary.json`."""

    seed: int
    predicted: float
    observed: float
    A: float
    B: float
    C_mid: float
    reliable: bool
    held_out_mae: float | None
    last3: float | None = None  # mean of the last three evaluations (None: an older summary)
    band: tuple[float, float] | None = None  # the prediction's band for a new evaluation

    @property
    def error(self) -> float:
        return self.predicted - self.observed

    @property
    def error_last3(self) -> float | None:
        return None if self.last3 is None else self.predicted - self.last3

    @property
    def in_band(self) -> bool | None:
        return None if self.band is None else self.band[0] <= self.observed <= self.band[1]

    def meets_bar(self) -> bool | None:
        """The first-half bar (issue 43): an unflagged fit within +-0.02 of the mean of the last
        three evaluations; a flagged fit's band contains the final point. None: not measurable."""
        if self.reliable:
            e = self.error_last3
            return None if e is None else abs(e) <= PAPER_TOLERANCE + 1e-9
        return self.in_band


def seed_row(summary: dict[str, Any]) -> SeedRow:
    fit, final = summary["fit"], summary["final"]
    held = fit.get("held_out") or {}
    band = final.get("band")
    ok_band = isinstance(band, list) and len(band) == 2 and all(isinstance(b, (int, float)) for b in band)
    return SeedRow(seed=int(summary["seed"]), predicted=float(final["predicted"]),
                   observed=float(final["observed"]), A=float(fit["A"]), B=float(fit["B"]),
                   C_mid=float(fit["C_mid"]), reliable=bool(fit["diagnostics"]["reliable"]),
                   held_out_mae=held.get("mae"),
                   last3=None if final.get("last3") is None else float(final["last3"]),
                   band=(float(band[0]), float(band[1])) if ok_band else None)


def row_of(seed: int, result: DemoResult) -> SeedRow:
    """The seed table's row of a fitted demo curve (what `seed_row` reads back from a summary)."""
    a, p = result.analysis, result.analysis.predictions[0]
    band = None if p.obs_lo is None or p.obs_hi is None else (float(p.obs_lo), float(p.obs_hi))
    return SeedRow(seed=seed, predicted=p.reward, observed=result.observed, A=a.fit.A, B=a.fit.B,
                   C_mid=a.fit.C_mid, reliable=a.fit.diagnostics.reliable,
                   held_out_mae=None if a.held_out is None else a.held_out.mae, last3=result.last3, band=band)


def seed_spread_summary(rows: list[SeedRow]) -> dict[str, Any]:
    """Spread over seeds of the final-point error and of A and B (margin: the largest deviation
    of a seed from the mean, the paper's "+-0.02 on A from 3 seeds", A.5)."""
    err = [r.error for r in rows]

    def spread(values: list[float]) -> dict[str, float | None]:
        mean = sum(values) / len(values)
        margin = max(abs(v - mean) for v in values) if len(values) > 1 else None
        return {"mean": mean, "margin": margin, "min": min(values), "max": max(values)}

    return {
        "n_seeds": len(rows),
        "error": spread(err),
        "mean_abs_error": sum(abs(e) for e in err) / len(err),
        "max_abs_error": max(abs(e) for e in err),
        # (1e-9: an error printed as 0.020 counts as within +-0.02, whatever its last bits say)
        "within_0.02": sum(abs(e) <= PAPER_TOLERANCE + 1e-9 for e in err),
        "within_0.03": sum(abs(e) <= 0.03 + 1e-9 for e in err),
        "flagged": sum(not r.reliable for r in rows),
        # The first-half bar: unflagged within +-0.02 of the last three's mean, flagged in band.
        "bar_met": sum(r.meets_bar() is True for r in rows),
        "bar_measured": sum(r.meets_bar() is not None for r in rows),
        "A": spread([r.A for r in rows]),
        "B": spread([r.B for r in rows]),
    }


def render_seeds(rows: list[SeedRow], stats: dict[str, Any]) -> str:
    from scalerl.scaling.report import table

    def opt(v: float | None, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)

    def bar(r: SeedRow) -> str:
        met = r.meets_bar()
        return "-" if met is None else ("met" if met else "MISSED")

    body = [[str(r.seed), f"{r.predicted:.3f}", f"{r.observed:.3f}", f"{r.error:+.3f}", opt(r.last3, ".3f"),
             opt(r.error_last3, "+.3f"), "-" if r.band is None else f"[{r.band[0]:.3f}, {r.band[1]:.3f}]",
             opt(r.held_out_mae, ".3f"), num(r.A), num(r.B, 3), num(r.C_mid, 3),
             "ok" if r.reliable else "FLAGGED", bar(r)] for r in rows]
    n = stats["n_seeds"]
    a, b = stats["A"], stats["B"]
    margin = "" if a["margin"] is None else f" +-{a['margin']:.3f}"
    bmargin = "" if b["margin"] is None else f" +-{b['margin']:.3f}"
    return "\n".join([
        table(["seed", "predicted", "observed", "error", "last 3", "error (3)", "band", "MAE later", "A", "B",
               "C_mid", "fit", "bar"], body),
        "",
        f"{n} seed(s): final-point error {stats['error']['min']:+.3f} to {stats['error']['max']:+.3f} "
        f"(mean abs {stats['mean_abs_error']:.3f}); within +-{PAPER_TOLERANCE} on {stats['within_0.02']} "
        f"of {n}, "
        f"within +-0.03 on {stats['within_0.03']} of {n}; {stats['flagged']} flagged fit(s)",
        f"first-half bar (unflagged: within +-{PAPER_TOLERANCE} of the mean of the last three evaluations; "
        f"flagged: the final point inside the band): met on {stats['bar_met']} of {stats['bar_measured']}",
        f"A = {a['mean']:.3f}{margin}, B = {b['mean']:.3f}{bmargin} over the seeds (margin: the largest "
        "deviation of a seed from the mean; the paper's is about +-0.02 on A from 3 seeds)",
    ])


def run_seeds(*, n_seeds: int, output_dir: str | Path = "runs/demo", seed: int | None = None,
              out: Any = None, **kwargs: Any) -> int:
    """`scalerl demo --seeds N`: the demo on N consecutive seeds (each in `OUTPUT_DIR/seed-S`), then
    the spread of the prediction error and of A and B over them."""
    if n_seeds < 1:
        raise InputError(f"--seeds must be >= 1, got {n_seeds}")
    stream = out or sys.stdout
    root = Path(output_dir)
    first = load_settings(kwargs.get("settings_path")).settings.seed if seed is None else seed
    prepare_output_dir(root)
    write_json_atomic(root / MARKER_FILE, {"kind": "scalerl demo --seeds", "seeds": n_seeds, "first": first})
    rows = []
    for s in range(first, first + n_seeds):
        stream.write(f"\n=== seed {s} ({s - first + 1} of {n_seeds}) ===\n")
        code = run_demo(output_dir=root / f"seed-{s}", seed=s, out=stream, **kwargs)
        if code:
            return code
        rows.append(seed_row(json.loads((root / f"seed-{s}" / SUMMARY_FILE).read_text())))
    stats = seed_spread_summary(rows)
    text = render_seeds(rows, stats)
    write_json_atomic(root / SEEDS_FILE, jsonable({"seeds": [r.__dict__ | {"error": r.error} for r in rows],
                                                   "spread": stats}))
    write_atomic(root / SEEDS_REPORT, "# scalerl demo over seeds\n\n```\n" + text + "\n```\n")
    stream.write(f"\n=== {n_seeds} seed(s) ===\n{text}\n\nreport: {root / SEEDS_REPORT}\n")
    return 0


__all__ = ["DemoSettings", "SeedRow", "demo_config", "fit_demo", "fit_demo_curve", "load_settings",
           "render_seeds", "row_of", "run_demo", "run_seeds", "seed_row", "seed_spread_summary"]
