"""Text, markdown and figures for studies: the Fig. 7 table, per-run fits, failures.

Every writer builds its whole output in memory first and writes it with a rename (`write_atomic`,
`scalerl.scaling.plot.save_figure`), so an error never leaves half a report behind.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from scalerl.scaling.plot import FitPlotItem, plot_comparison, plot_fits
from scalerl.scaling.report import MODEL, interval, num, render_fit, table
from scalerl.studies.fitting import FitSettings, GroupRow, RunFit, StudyFits


def _with_interval(value: float | None, span: tuple[float, float] | None, digits: int = 4) -> str:
    if value is None:
        return "-"
    return f"{num(value, digits)} {interval(*span, digits=digits) if span else ''}".strip()


def fig7_rows(rows: Sequence[GroupRow]) -> list[list[str]]:
    out = []
    for r in rows:
        margin = f" +-{num(r.A_margin, 2)}" if len(r.runs) > 1 else ""
        out.append([
            r.group,
            str(len(r.runs)),
            _with_interval(r.A, r.A_interval) + margin,
            _with_interval(r.B, r.B_interval, 3),
            _with_interval(r.B_fixed, r.B_fixed_interval, 3),
            _with_interval(r.C_mid, r.C_mid_interval, 3),
            num(r.observed_final, 3),
            "ok" if r.reliable else "WARN",
        ])
    return out


def fig7_header(fixed_A: float | None) -> list[str]:
    fixed = "B @ fixed A" if fixed_A is None else f"B @ A={fixed_A:.3g}"
    return ["variant", "runs", "A", "B", fixed, "C_mid", "final", "status"]


def fig7_text(fits: StudyFits) -> str:
    """The paper's Fig. 7 table as aligned text (what the terminal shows)."""
    if not fits.rows:
        return "no fitted runs: " + "; ".join(fits.notes)
    return table(fig7_header(fits.fixed_A), fig7_rows(fits.rows))


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    def cell(text: str) -> str:
        return text.replace("|", "\\|")

    lines = ["| " + " | ".join(cell(h) for h in header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def fig7_markdown(fits: StudyFits) -> str:
    if not fits.rows:
        return "_No run could be fitted: " + "; ".join(fits.notes) + "._"
    return markdown_table(fig7_header(fits.fixed_A), fig7_rows(fits.rows))


def legend_text(fits: StudyFits, settings: FitSettings) -> str:
    """What the table's columns mean (shared by the terminal and the report)."""
    x = fits.analyses[0].curve.x_name if fits.analyses else (settings.x or "compute")
    y = fits.analyses[0].curve.y_name if fits.analyses else (settings.y or "reward")
    level = f"{settings.level:.0%}"
    parts = [
        f"{MODEL}; x = {x}, y = {y}; {settings.describe()}.",
        f"A, B, C_mid: each variant's fit (mean over its seeds; [{level} bootstrap interval], pooled over "
        "seeds; +- the margin: max(seed-to-seed spread, bootstrap half-width, the paper's +-0.02 seed margin "
        "on A) when it has several seeds).",
    ]
    if fits.fixed_A is not None:
        parts.append(f"B @ A={fits.fixed_A:.3g}: every run refitted with A fixed to the mean A of all runs "
                     "(paper Sec. 4): with the asymptote shared, B alone carries the efficiency difference.")
    parts.append("final: the last evaluation's observed pass rate (mean over seeds). status WARN: a "
                 "diagnostic fired (see the per-run warnings).")
    return "\n".join(parts)


def per_run_text(fits: StudyFits, settings: FitSettings) -> str:
    """Each run's own fit (the `scalerl fit` table, with warnings), then runs that could not be fitted."""
    parts = []
    if fits.analyses:
        parts.append(render_fit(fits.analyses, settings.level, settings.n_boot, settings.seed, details=False))
    for r in fits.runs:
        if r.error is not None:
            parts.append(f"  {r.name}: not fitted: {r.error}")
    return "\n".join(parts)


def prediction_rows(runs: Sequence[RunFit]) -> list[list[str]]:
    rows = []
    for r in runs:
        if r.analysis is None:
            continue
        band = r.predicted_band
        rows.append([
            r.name,
            num(r.final_x, 4),
            f"{r.predicted_final:.3f}" + (f" [{band[0]:.3f}, {band[1]:.3f}]" if band else ""),
            f"{r.observed_final:.3f}",
            f"{r.abs_error:.3f}" if r.extrapolates and r.abs_error is not None else "- (in window)",
        ])
    return rows


PREDICTION_HEADER = ["run", "final x", "predicted", "observed", "abs error"]


def write_plot(fits: StudyFits, path: Path, title: str | None = None) -> Path | None:
    """All fitted curves (left) and the fixed-A efficiency view (right); None with nothing to draw."""
    analyses = fits.analyses
    if not analyses:
        return None
    items = {a.curve.label: FitPlotItem(a.curve.label, a.fit, a.boot) for a in analyses}
    x_label = analyses[0].curve.x_name
    y_label = analyses[0].curve.y_name
    level = next((a.boot.level for a in analyses if a.boot is not None), 0.95)
    if fits.comparison is None or len(items) == 1:
        return plot_fits(list(items.values()), path, x_label=x_label, y_label=y_label, title=title,
                         level=level)
    return plot_comparison(fits.comparison, items, path, x_label=x_label, y_label=y_label, level=level)


__all__ = [
    "PREDICTION_HEADER",
    "fig7_markdown",
    "fig7_text",
    "legend_text",
    "markdown_table",
    "per_run_text",
    "prediction_rows",
    "write_plot",
]
