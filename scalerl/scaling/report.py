"""Render analyses and comparisons as readable text tables or JSON-ready dicts."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from scalerl.model_identity import identity_key
from scalerl.scaling.analysis import RunAnalysis
from scalerl.scaling.compare import Comparison, PairVerdict
from scalerl.scaling.io import DEFAULT_X, Curve

MODEL = "R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B)"


def num(value: float | None, digits: int = 4) -> str:
    """Compact number: ``digits`` significant figures, ``-`` for missing, ``inf`` spelled out."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.{digits}g}"


def interval(
    lo: float | None, hi: float | None, digits: int = 4, open_hi: bool = False, open_lo: bool = False
) -> str:
    if lo is None or hi is None:
        return ""
    left = "(<=" if open_lo else "["
    right = "+]" if open_hi else "]"
    return f"{left}{num(lo, digits)}, {num(hi, digits)}{right}"


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Left-aligned text table with two spaces between columns."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    lines = [fmt.format(*header), fmt.format(*("-" * w for w in widths))]
    lines += [fmt.format(*r) for r in rows]
    return "\n".join(line.rstrip() for line in lines)


def jsonable(value: object) -> object:
    """Recursively convert numpy scalars/arrays and tuples; NaN and inf become None (strict JSON)."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return [jsonable(v) for v in value.tolist()]
    if isinstance(value, (np.bool_, bool)):
        return bool(value)
    if isinstance(value, (np.integer, int)):
        return int(value)
    if isinstance(value, (np.floating, float)):
        v = float(value)
        return v if math.isfinite(v) else None
    return value


def run_to_dict(a: RunAnalysis) -> dict[str, object]:
    """JSON record of one run: the fit's parameters and diagnostics, intervals, predictions."""
    out: dict[str, object] = {
        "label": a.curve.label,
        "source": a.curve.source,
        "x": a.curve.x_name,
        "x_conversion": a.curve.x_note,  # how x was derived from tokens or steps (None: logged)
        "y": a.curve.y_name,
    }
    out.update(a.fit.to_dict())
    intervals: dict[str, object] = {}
    if a.boot is not None:
        for name in ("A", "B", "C_mid"):
            if not (name == "A" and a.fit.A_fixed):
                intervals[name] = list(a.boot.interval(name))
        out["bootstrap"] = a.boot.to_dict()
    if a.profile is not None:
        intervals["A_profile"] = a.profile.to_dict()
    out["intervals"] = intervals
    out["predictions"] = [p.__dict__ for p in a.predictions]
    out["held_out"] = None if a.held_out is None else a.held_out.__dict__
    out["power_law"] = None if a.power_law is None else a.power_law.to_dict()
    out["truncation"] = None if a.truncation is None else a.truncation.to_dict()
    out["warnings"] = list(a.warnings)
    out["reliable"] = a.reliable
    out["compute_needed"] = None if a.advice is None else a.advice.to_dict()
    return jsonable(out)  # type: ignore[return-value]


def render_fit(
    analyses: Sequence[RunAnalysis], level: float, n_boot: int, seed: int, details: bool = True
) -> str:
    """The ``scalerl fit`` text report: one summary table, then a few lines per run (with
    ``details=False``, as in ``scalerl compare``, only the runs' warnings)."""
    head = f"sigmoid fit {MODEL}"
    if n_boot > 0:
        head += f"; {level:.0%} bootstrap intervals ({n_boot} resamples, seed {seed})"
    rows = []
    for a in analyses:
        f, b = a.fit, a.boot
        ia = "" if b is None else interval(*b.interval("A"))
        ib = "" if b is None else interval(*b.interval("B"), digits=3)
        im = "" if b is None else interval(*b.interval("C_mid"), digits=3)
        rows.append(
            [
                a.curve.label,
                f"{f.diagnostics.n_points}/{f.compute.size}",
                num(f.R0),
                f"{num(f.A)} {ia}".strip(),
                f"{num(f.B, 3)} {ib}".strip(),
                f"{num(f.C_mid, 4)} {im}".strip(),
                num(f.diagnostics.rmse, 3),
                "ok" if a.reliable else "WARN",
            ]
        )
    parts = [head, "", table(["run", "points", "R0", "A", "B", "C_mid", "RMSE", "status"], rows)]
    for a in analyses:
        if details:
            parts.append("")
            parts.extend(_run_details(a))
        else:
            parts.extend(f"  {a.curve.label}: warning: {w}" for w in a.warnings)
            if a.advice is not None:
                parts.append(f"  {a.curve.label}: {a.advice.sentence(a.curve.x_name)}")
    return "\n".join(parts)


def _run_details(a: RunAnalysis) -> list[str]:
    f = a.fit
    fc = f.fit_compute
    lines = [
        f"{a.curve.label} ({a.curve.source})",
        f"  x = {a.curve.x_name}, y = {a.curve.y_name}; fit window {num(fc.min())}..{num(fc.max())} "
        f"({fc.size} of {f.compute.size} points); R0 = {num(f.R0)} ({f.r0_source.replace('_', ' ')}); "
        f"method {f.method}",
    ]
    if a.profile is not None:
        p = a.profile
        span = interval(p.lo, p.hi, open_lo=p.lo_open, open_hi=p.hi_open)
        lines.append(
            f"  A profile interval ({p.level:.0%}): {span}"
            + ("  (open: the data cannot bound A on that side)" if p.lo_open or p.hi_open else "")
        )
    if a.held_out is not None:
        h = a.held_out
        cov = (
            "" if h.coverage is None else f", {h.coverage:.0%} inside the {a.boot.level:.0%} observation band"
        )  # type: ignore[union-attr]
        lines.append(
            f"  held-out points after the window: {h.n}, mean abs error {num(h.mae, 3)} "
            f"(max {num(h.max_abs, 3)}){cov}"
        )
    for p in a.predictions:
        band = (
            ""
            if p.lo is None
            else f"  curve {interval(p.lo, p.hi)}, new evaluation {interval(p.obs_lo, p.obs_hi)}"
        )
        lines.append(f"  predicted at {num(p.compute)}: {num(p.reward)}{band}")
        if p.caveat:
            lines.append(f"    caveat: {p.caveat}")
    if a.power_law is not None:
        w = a.power_law
        bound = f" (ON THE BOUND a_max = {num(w.a_max)})" if w.A_at_bound else ""
        lines.append(
            f"  power law A - D/C^B (paper A.4): A = {num(w.A)}{bound}, B = {num(w.B, 3)}, "
            f"D = {num(w.D, 3)}, RMSE {num(w.rmse, 3)}"
        )
    for w_text in a.warnings:
        lines.append(f"  warning: {w_text}")
    if a.advice is not None:
        lines.append(f"  {a.advice.sentence(a.curve.x_name)}")
    if a.boot is not None and a.boot.n_unconverged:
        lines.append(
            f"  note: {a.boot.n_unconverged} of {a.boot.n_requested} bootstrap refits were still "
            "drifting along a flat valley (kept; the parameter is poorly determined)"
        )
    return lines


def comparison_to_dict(cmp: Comparison, analyses: Sequence[RunAnalysis]) -> dict[str, object]:
    recipes = []
    for r in cmp.recipes:
        recipes.append(
            {
                "recipe": r.name,
                "runs": list(r.labels),
                "A": r.A,
                "B": r.B,
                "C_mid": r.C_mid,
                "R0": r.R0,
                "A_margin": r.A_margin,
                "B_margin": r.B_margin,
                "seed_spread": r.spread.to_dict(),
                "A_interval": r.interval("A"),
                "B_interval": r.interval("B"),
                "C_mid_interval": r.interval("C_mid"),
                "fixed_A_B": cmp.B_at_fixed_A.get(r.name),
                "pooled": None if r.pooled is None else r.pooled.to_dict(),
            }
        )
    out = {
        "model": MODEL,
        "runs": [run_to_dict(a) for a in analyses],
        "recipes": recipes,
        "pairs": [p.to_dict() for p in cmp.pairs],
        "start_models": dict(cmp.start_models),
        "same_start_model": cmp.same_start_model,
        "standings": [s.to_dict() for s in cmp.standings],
        "fixed_A_refit": None
        if cmp.A_fixed_refit is None
        else {
            "A": cmp.A_fixed_refit.A,
            "runs": {
                label: {"B": f.B, "C_mid": f.C_mid, "rmse": f.diagnostics.rmse}
                for label, f in cmp.A_fixed_refit.fits.items()
            },
        },
    }
    return jsonable(out)  # type: ignore[return-value]


_VERDICT_TEXT = {
    "A": ("has the higher asymptote", "asymptotes within margin"),
    "B": ("has the higher B (steeper in log compute)", "B within margin"),
}


def _verdict_text(p: PairVerdict, param: str) -> str:
    v = p.verdict(param)
    higher, within = _VERDICT_TEXT[param]
    if v == "undetermined":
        return "undetermined (why: below)"
    return within if v == "within_margin" else f"{p.leader(param)} {higher}"


def start_model_lines(cmp: Comparison) -> list[str]:
    """A warning (and a blank line) when the runs started from different or unrecorded models."""
    same = cmp.same_start_model
    if same is True or not cmp.start_models:
        return []
    if same is False:
        groups: dict[str, list[str]] = {}
        for label, key in cmp.start_models.items():
            groups.setdefault(str(key), []).append(label)
        listing = "; ".join(f"{', '.join(labels)} from {key}" for key, labels in groups.items())
        return [f"WARNING: the runs started from different models ({listing}): differences below mix the "
                "recipes with their starting points", ""]
    unknown = [label for label, key in cmp.start_models.items() if key is None]
    return [f"note: {', '.join(unknown)} did not record a starting model (start_model.json); "
            "that all runs started from the same weights is not checked", ""]


def render_comparison(cmp: Comparison, level: float) -> str:
    """The ``scalerl compare`` text report."""
    rows = []
    for r in cmp.recipes:
        ia, ib = r.interval("A"), r.interval("B")
        rows.append(
            [
                r.name,
                str(len(r.fits)),
                num(r.A),
                f"+-{num(r.A_margin, 2)}",
                interval(*ia) if ia else "",
                num(r.B, 3),
                f"+-{num(r.B_margin, 2)}",
                interval(*ib, digits=3) if ib else "",
                num(r.C_mid),
                "" if r.name not in cmp.B_at_fixed_A else num(cmp.B_at_fixed_A[r.name], 3),
            ]
        )
    fixed_head = "B @ fixed A" if cmp.A_fixed_refit is None else f"B @ A={cmp.A_fixed_refit.A:.3g}"
    parts = [*start_model_lines(cmp)]
    parts += [
        f"recipes ({level:.0%} intervals; "
        "margin = max(seed-to-seed spread, bootstrap half-width, --margin-*))",
        "",
        table(
            ["recipe", "runs", "A", "margin", "A interval", "B", "margin", "B interval", "C_mid", fixed_head],
            rows,
        ),
    ]
    for r in cmp.recipes:
        sp = r.spread
        if sp.n_seeds >= 2:
            a_part = f"A {num(sp.A_mean)} +-{num(sp.A_margin, 2)} (std {num(sp.A_std, 2)})"
            b_part = f"B {num(sp.B_mean, 3)} +-{num(sp.B_margin, 2)} (std {num(sp.B_std, 2)})"
            parts.append(f"  {r.name}: seed-to-seed over {sp.n_seeds} runs: {a_part}, {b_part}")
        if r.pooled is not None:
            parts.append(f"  {r.name}: pooled fit of its {len(r.labels)} seeds (A, B, C_mid and their "
                         "intervals above); margin = max(pooled interval half-width, --margin-*)")
    if cmp.pairs:
        parts += [
            "",
            "pairwise (a - b; a verdict needs both fits identifiable and |difference| > the combined "
            "margin sqrt(m_a^2 + m_b^2))",
        ]
        for p in cmp.pairs:
            parts.append(
                f"  {p.a} vs {p.b}: dA = {p.A_diff:+.4f} (margin {num(p.A_margin, 2)}): "
                f"{_verdict_text(p, 'A')}; dB = {p.B_diff:+.3f} (margin {num(p.B_margin, 2)}): "
                f"{_verdict_text(p, 'B')}"
            )
            why = dict.fromkeys([*p.A_undetermined, *p.B_undetermined])
            if why:
                which = " and ".join(k for k, r in (("A", p.A_undetermined), ("B", p.B_undetermined)) if r)
                parts.append(f"    {which} undetermined: " + "; ".join(why))
            if p.crossovers:
                where = ", ".join(num(c) for c in p.crossovers)
                extra = ""
                if p.crossover_interval is not None:
                    extra = f" ({level:.0%} interval {interval(*p.crossover_interval)}"
                    extra += f"; {p.crossover_fraction:.0%} of bootstrap pairs cross)"
                parts.append(f"    curves cross at C = {where}{extra}")
            elif p.crossover_fraction is not None:
                parts.append(
                    f"    no crossover up to 100x the largest compute ({p.crossover_fraction:.0%} of "
                    "bootstrap pairs cross)"
                )
            else:
                parts.append("    no crossover up to 100x the largest compute")
    for s in cmp.standings:
        parts += ["", f"ahead at C = {num(s.compute)}:"]
        for name, reward, lo, hi in s.ranking:
            parts.append(f"  {name:<24} {num(reward)} {interval(lo, hi)}".rstrip())
        if s.p_ahead is not None:
            parts.append(f"  P({s.ranking[0][0]} ahead of {s.ranking[1][0]}) = {s.p_ahead:.2f}")
        parts.extend(f"  caveat: {c}" for c in s.caveats)
    if cmp.A_fixed_refit is not None:
        if any(p.A_differs for p in cmp.pairs):
            parts += [
                "",
                "note: some recipes' asymptotes differ beyond their margins; with A forced to a common value "
                "their B absorbs that gap, so read the fixed-A B ranking only among recipes of similar A "
                "(the paper applies it to runs whose A agree within the margin)",
            ]
        parts += [
            "",
            f"fixed-A refit (paper Sec. 4): every run refitted with A = {cmp.A_fixed_refit.A:.4g} "
            "(mean A of all runs); higher B = more compute-efficient",
        ]
        rows = [
            [label, num(f.B, 3), num(f.C_mid), num(f.diagnostics.rmse, 3)]
            for label, f in sorted(cmp.A_fixed_refit.fits.items(), key=lambda kv: -kv[1].B)
        ]
        parts.append(table(["run", "B", "C_mid", "RMSE"], rows))
    return "\n".join(parts)


def is_run_dir(curve: Curve) -> bool:
    """The curve was read from a scalerl run directory (its `metrics.jsonl`)."""
    return Path(curve.source).name == "metrics.jsonl"


def axis_notes(analyses: list[RunAnalysis]) -> list[str]:
    """The x axis each run was fitted on (and how it was derived, when converted from tokens or
    steps), and a note when it is wall-clock based (it moves with the machine and its load)."""
    by_axis: dict[tuple[str, str | None], list[str]] = {}
    for a in analyses:
        by_axis.setdefault((a.curve.x_name, a.curve.x_note), []).append(a.curve.label)
    out = []
    for (name, note), labels in by_axis.items():
        runs = f" ({', '.join(labels)})" if len(by_axis) > 1 else ""
        out.append(f"x axis{runs}: {note if note else name}")
    timed = [a.curve.label for a in analyses if a.curve.x_name == DEFAULT_X and is_run_dir(a.curve)]
    if timed:
        out.append(f"note: x = {DEFAULT_X} ({', '.join(timed)}) is wall-clock time x devices: it changes "
                   "with the machine and its load, so reruns and other machines do not line up; --x flops "
                   "counts the work done and is reproducible")
    return out


def start_models(analyses: list[RunAnalysis]) -> dict[str, str | None]:
    """Label -> starting-model key of every scalerl run directory (None: not recorded)."""
    return {a.curve.label: identity_key(a.curve.start_model) if a.curve.start_model else None
            for a in analyses if is_run_dir(a.curve)}
