"""Figures for fits and comparisons (matplotlib, imported lazily, drawn with the Agg canvas).

A fit figure shows, per run: the points used by the fit (filled circles) and the held-out points
(crosses), the fitted curve (solid) and its extrapolation (dashed) with the bootstrap band, the
asymptote A (dotted), the fit window shaded, the bounded power law when fitted (dash-dot) and the
predictions asked for (stars with the band of a new evaluation), on a log-compute axis -- the
layout of the paper's Fig. 1. The y range follows the data, curves and predictions (an asymptote
off that range is named at the top, not stretching the axis), and the legend sits below the
axes. The comparison figure adds the paper's Fig. 7 view: the efficiency transform of a fixed-A
refit, where each run is a line of slope B on log-log axes.

No pyplot: figures are built on ``matplotlib.figure.Figure`` with an Agg canvas, so plotting
never changes the caller's backend or global state, and files are written atomically.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from scalerl.atomic import atomic_path
from scalerl.scaling.analysis import Prediction
from scalerl.scaling.compare import Comparison, efficiency_transform
from scalerl.scaling.power_law import PowerLawFit
from scalerl.scaling.sigmoid import SigmoidFit
from scalerl.scaling.uncertainty import Bootstrap
from scalerl.scaling.validation import MissingCurveError

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

COLORS: tuple[str, ...] = (
    "#1f77b4",
    "#d62728",
    "#2ca02c",
    "#9467bd",
    "#ff7f0e",
    "#17becf",
    "#8c564b",
    "#e377c2",
)


@dataclass(frozen=True, eq=False)
class FitPlotItem:
    """One run to draw: its fit, optionally its bootstrap (the band), its power-law fit and the
    predictions to mark (``scalerl fit --predict-at``, the demo's final point)."""

    label: str
    fit: SigmoidFit
    boot: Bootstrap | None = None
    power_law: PowerLawFit | None = None
    predictions: Sequence[Prediction] = ()


# Sizes for figures saved at 200 dpi: readable when the PNG is shown at its full width.
FONT = {"tick": 11, "label": 12, "title": 13, "legend": 10}
FIT_SIZE = (10.0, 6.6)
COMPARE_SIZE = (15.0, 7.0)


def _figure(width: float, height: float, ncols: int = 1) -> tuple[Figure, list[Axes]]:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    axes = [fig.add_subplot(1, ncols, i + 1) for i in range(ncols)]
    for ax in axes:
        ax.spines[["top", "right"]].set_visible(False)
        ax.grid(True, which="major", alpha=0.3, linewidth=0.6)
        ax.grid(True, which="minor", alpha=0.12, linewidth=0.4)
        ax.tick_params(labelsize=FONT["tick"])
    return fig, axes


def compact_number(x: float, _pos: object = None) -> str:
    """Tick label: ``500``, ``2k``, ``50k``, ``1.5M``, and scientific from 1e9 (FLOP-scale compute)."""
    if x <= 0:
        return "0"
    if x < 1e9:
        for scale, unit in ((1e6, "M"), (1e3, "k")):
            if x >= scale:
                return f"{x / scale:g}{unit}"
        return f"{x:g}"
    mantissa, exponent = f"{x:.0e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def log_compute_axis(ax: Axes) -> None:
    """Log x axis with ticks at 1, 2, 5 per decade when the data spans at most ~4 decades."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    ax.set_xscale("log")
    lo, hi = ax.get_xlim()
    if hi / lo <= 1e4:
        ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.xaxis.set_minor_formatter(NullFormatter())
    ax.xaxis.set_major_formatter(FuncFormatter(compact_number))


def save_figure(fig: Figure, path: str | Path, dpi: int = 200) -> Path:
    """Write ``fig`` to ``path`` atomically (temp file in the same directory, then rename)."""
    out = Path(path)
    if out.parent and not out.parent.exists():
        raise MissingCurveError(f"{out.parent}: directory does not exist")
    suffix = out.suffix.lower() or ".png"
    with atomic_path(out, suffix=suffix) as tmp:
        fig.savefig(tmp, dpi=dpi, format=suffix.lstrip("."))
    return out


MARKERS: tuple[str, ...] = ("o", "s", "^", "D", "v", "P")


def _has_held_out(fit: SigmoidFit) -> bool:
    """Held-out points that a log axis can show (zero-compute points cannot)."""
    return bool((~fit.in_fit & (fit.compute > 0)).any())


def _draw_fit(
    ax: Axes, item: FitPlotItem, color: str, x_hi: float, level: float, shade: bool, marker: str = "o"
) -> list[float]:
    """Draw one run; returns the y values the axis must show (data, curve, predictions), which
    set the y range instead of the asymptote (an A on its bound of 1 would squash the data)."""
    f = item.fit
    pos = f.compute > 0  # zero-compute points (R0) have no place on a log axis
    used, held = f.in_fit & pos, ~f.in_fit & pos
    lo_fit, hi_fit = float(f.fit_compute.min()), float(f.fit_compute.max())
    x_lo = float(f.compute[pos].min())
    if shade:
        ax.axvspan(lo_fit, hi_fit, color="0.5", alpha=0.08, linewidth=0)
    grid = np.geomspace(min(x_lo, lo_fit) / 1.05, x_hi, 400)
    if item.boot is not None:
        lo, hi = item.boot.band(grid, level=level)
        ax.fill_between(grid, lo, hi, color=color, alpha=0.18, linewidth=0)
    inside = (grid >= lo_fit) & (grid <= hi_fit)
    pred = f.predict(grid)
    warn = "" if f.diagnostics.reliable else " (!)"
    name = f"{item.label}: A={f.A:.3f}, B={f.B:.2f}, $C_{{mid}}$={f.C_mid:.3g}{warn}"
    ax.plot(grid[inside], pred[inside], color=color, linewidth=1.8, label=name)
    for part in (grid < lo_fit, grid > hi_fit):
        if part.any():
            ax.plot(grid[part], pred[part], color=color, linewidth=1.6, linestyle="--")
    ax.axhline(f.A, color=color, linewidth=0.8, linestyle=":", alpha=0.8)
    if item.power_law is not None:
        w = item.power_law
        bound = " (bound)" if w.A_at_bound else ""
        ax.plot(grid, w.predict(grid), color=color, linewidth=1.3, linestyle="-.", alpha=0.85,
                label=f"{item.label}: power law, A={w.A:.3f}{bound}, B={w.B:.2f}")
    ax.scatter(
        f.compute[used],
        f.reward[used],
        s=26,
        color=color,
        marker=marker,
        edgecolors="white",
        linewidths=0.5,
        zorder=3,
    )
    if held.any():
        ax.scatter(f.compute[held], f.reward[held], s=34, color=color, marker="x", linewidths=1.3, zorder=3)
    shown = [*f.reward[pos].tolist(), *pred[grid >= x_lo].tolist()]
    for p in item.predictions:
        if p.compute <= 0:
            continue
        if p.obs_lo is not None and p.obs_hi is not None:
            yerr = [[max(p.reward - p.obs_lo, 0.0)], [max(p.obs_hi - p.reward, 0.0)]]
            ax.errorbar([p.compute], [p.reward], yerr=yerr, color=color, linewidth=1.4, capsize=5, zorder=4)
            shown += [p.obs_lo, p.obs_hi]
        ax.scatter([p.compute], [p.reward], s=170, marker="*", color=color, edgecolors="black",
                   linewidths=0.7, zorder=5)
        ax.annotate(f"{p.reward:.3f}", (p.compute, p.reward), xytext=(9, 6), textcoords="offset points",
                    fontsize=FONT["legend"], color=color,
                    bbox={"boxstyle": "round,pad=0.15", "fc": "white", "ec": "none", "alpha": 0.85})
        shown.append(p.reward)
    return shown


def _y_range(ax: Axes, shown: Sequence[float], asymptotes: Sequence[float]) -> None:
    """Fit the y axis to the data, curves and predictions (8% margins); an asymptote outside that
    range is named at the top edge instead of stretching the axis."""
    values = np.asarray([v for v in shown if np.isfinite(v)], dtype=np.float64)
    if values.size == 0:
        return
    lo, hi = float(values.min()), float(values.max())
    pad = 0.08 * max(hi - lo, 1e-3)
    top = hi + pad
    visible = [a for a in asymptotes if lo - pad <= a <= top + pad]
    if visible:
        top = max(top, max(visible) + pad / 2)
    ax.set_ylim(lo - pad, top)
    above = sorted({round(a, 3) for a in asymptotes if a > top})
    if above:
        text = "asymptote A = " + ", ".join(f"{a:g}" for a in above) + " (above the plot)"
        ax.text(0.01, 0.99, text, transform=ax.transAxes, ha="left", va="top", fontsize=FONT["legend"],
                color="0.35")


def _legend_markers(
    ax: Axes, any_held: bool, any_band: bool, level: float, shaded: bool, any_pred: bool = False
) -> None:
    """The legend, below the axes (two columns) so that it never covers data."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    handles, labels = ax.get_legend_handles_labels()
    extra = [
        (Line2D([], [], color="0.3", marker="o", linestyle="", markersize=6), "fitted points"),
        (Line2D([], [], color="0.3", linestyle="--"), "extrapolation"),
        (Line2D([], [], color="0.3", linestyle=":"), "asymptote A"),
    ]
    if any_held:
        extra.insert(
            1, (Line2D([], [], color="0.3", marker="x", linestyle="", markersize=7), "held-out points")
        )
    if any_pred:
        extra.append((Line2D([], [], color="0.3", marker="*", linestyle="", markersize=11,
                             markeredgecolor="black"), f"prediction, {level:.0%} band"))
    if any_band:
        extra.append((Patch(color="0.3", alpha=0.25), f"{level:.0%} band of the curve"))
    if shaded:
        extra.append((Patch(color="0.5", alpha=0.15), "fit window"))
    # A figure legend placed "outside": constrained layout makes room for it under the axes.
    ax.figure.legend(
        handles + [h for h, _ in extra],
        labels + [t for _, t in extra],
        fontsize=FONT["legend"],
        frameon=False,
        loc="outside lower center",
        ncol=2,
    )


def plot_fits(
    items: Sequence[FitPlotItem],
    path: str | Path,
    *,
    x_label: str = "compute",
    y_label: str = "reward",
    title: str | None = None,
    extend_to: float | None = None,
    level: float = 0.95,
) -> Path:
    """``fit_figure`` saved to ``path`` (atomically)."""
    return save_figure(fit_figure(items, x_label=x_label, y_label=y_label, title=title, extend_to=extend_to,
                                  level=level), path)


def fit_figure(
    items: Sequence[FitPlotItem],
    *,
    x_label: str = "compute",
    y_label: str = "reward",
    title: str | None = None,
    extend_to: float | None = None,
    level: float = 0.95,
) -> Figure:
    """Fitted curves with points, extrapolation, band, fit window, power law and predictions.
    The legend sits below the axes."""
    if not items:
        raise ValueError("nothing to plot")
    fig, (ax,) = _figure(*FIT_SIZE)
    x_hi = extend_to or 1.5 * max(float(i.fit.compute.max()) for i in items)
    x_hi = max([x_hi, *(1.15 * p.compute for i in items for p in i.predictions)])
    shown: list[float] = []
    for k, item in enumerate(items):
        shown += _draw_fit(ax, item, COLORS[k % len(COLORS)], x_hi, level, shade=True)
    log_compute_axis(ax)
    _y_range(ax, shown, [i.fit.A for i in items])
    ax.set_xlabel(x_label, fontsize=FONT["label"])
    ax.set_ylabel(y_label, fontsize=FONT["label"])
    if title:
        ax.set_title(title, fontsize=FONT["title"])
    _legend_markers(
        ax,
        any(_has_held_out(i.fit) for i in items),
        any(i.boot is not None for i in items),
        level,
        shaded=True,
        any_pred=any(i.predictions for i in items),
    )
    return fig


def plot_comparison(
    comparison: Comparison,
    items: Mapping[str, FitPlotItem],
    path: str | Path,
    *,
    x_label: str = "compute",
    y_label: str = "reward",
    level: float = 0.95,
) -> Path:
    """``comparison_figure`` saved to ``path`` (atomically)."""
    fig = comparison_figure(comparison, items, x_label=x_label, y_label=y_label, level=level)
    return save_figure(fig, path)


def comparison_figure(
    comparison: Comparison,
    items: Mapping[str, FitPlotItem],
    *,
    x_label: str = "compute",
    y_label: str = "reward",
    level: float = 0.95,
) -> Figure:
    """Left: every run's fit, one colour per recipe and one marker per seed. Right: the fixed-A
    efficiency transform, one line of slope B per run (paper Fig. 7); omitted without a refit."""
    refit = comparison.A_fixed_refit
    width, height = COMPARE_SIZE if refit else FIT_SIZE
    fig, axes = _figure(width, height, ncols=2 if refit else 1)
    ax = axes[0]
    x_hi = 1.5 * max(float(i.fit.compute.max()) for i in items.values())
    style: dict[str, tuple[str, str]] = {}
    for k, recipe in enumerate(comparison.recipes):
        for j, label in enumerate(recipe.labels):
            style[label] = (COLORS[k % len(COLORS)], MARKERS[j % len(MARKERS)])
    shown: list[float] = []
    for label, item in items.items():
        color, marker = style.get(label, ("0.3", "o"))
        shown += _draw_fit(ax, item, color, x_hi, level, shade=False, marker=marker)
    log_compute_axis(ax)
    _y_range(ax, shown, [i.fit.A for i in items.values()])
    ax.set_xlabel(x_label, fontsize=FONT["label"])
    ax.set_ylabel(y_label, fontsize=FONT["label"])
    ax.set_title("fits and extrapolation", fontsize=FONT["title"])
    _legend_markers(
        ax,
        any(_has_held_out(i.fit) for i in items.values()),
        any(i.boot is not None for i in items.values()),
        level,
        shaded=False,
    )
    if refit is not None:
        ax2 = axes[1]
        drawn = False
        for label, f in refit.fits.items():
            color, marker = style.get(label, ("0.3", "o"))
            F = efficiency_transform(f.fit_reward, f.A, f.B, f.C_mid, f.R0)
            ok = np.isfinite(F) & (F > 0)
            ax2.scatter(f.fit_compute[ok], F[ok], s=20, color=color, marker=marker, alpha=0.8)
            g = np.geomspace(f.fit_compute.min(), f.fit_compute.max(), 50)
            with np.errstate(over="ignore"):
                line = np.exp(f.B * np.log(g))
            # A flat curve (R = R0 = A) fits any B: C^B can overflow, and F(R) has no positive value.
            keep = np.isfinite(line) & (line > 0)
            ax2.plot(g[keep], line[keep], color=color, linewidth=1.6, label=f"{label}: B={f.B:.2f}")
            drawn = drawn or bool(ok.any() or keep.any())
        if drawn:  # log axes with nothing positive on them are an error in matplotlib
            log_compute_axis(ax2)
            ax2.set_yscale("log")
        else:
            ax2.text(0.5, 0.5, "no finite F(R) > 0 to draw", transform=ax2.transAxes, ha="center",
                     fontsize=FONT["legend"])
        ax2.set_xlabel(x_label, fontsize=FONT["label"])
        ax2.set_ylabel(r"$F(R) = C_{mid}^B / ((A-R_0)/(R-R_0) - 1)$", fontsize=FONT["label"])
        ax2.set_title(f"fixed-A refit (A = {refit.A:.3f}): slope = B", fontsize=FONT["title"])
        ax2.legend(fontsize=FONT["legend"], frameon=False, loc="upper left")
    return fig
