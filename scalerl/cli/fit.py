"""``scalerl fit`` and ``scalerl compare``: predict where runs end and compare recipes (and
``scalerl fit-cross``, the cross-model-size law, in ``scalerl.cli.fit_cross``).

Registered by ``scalerl.cli`` through ``register(subparsers)``. Each command reads every input,
computes everything, and only then prints (and writes the plot atomically), so an error never
leaves half an output behind.
"""

from __future__ import annotations

import argparse
import json
import sys

from scalerl.inputs import InputError
from scalerl.ownership import check_output_file, writing_output
from scalerl.scaling.analysis import FitOptions, RunAnalysis, analyze_curve
from scalerl.scaling.compare import PAPER_SEED_MARGIN_A, compare, recipe_name
from scalerl.scaling.compute_axis import FlopsAxis
from scalerl.scaling.compute_needed import DEFAULT_HALF_WIDTH
from scalerl.scaling.diagnostics import TRUNCATION_THRESHOLD
from scalerl.scaling.io import DEFAULT_X, DEFAULT_Y, read_many
from scalerl.scaling.logs import FORMATS
from scalerl.scaling.pooled import PooledFit, fit_pooled
from scalerl.scaling.report import (
    axis_notes,
    comparison_to_dict,
    jsonable,
    render_comparison,
    render_fit,
    run_to_dict,
    start_models,
)


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text}")
    return value


def _rate(text: str) -> float:
    value = float(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"expected a rate in (0, 1], e.g. 0.1; got {text}")
    return value


def _level(text: str) -> float:
    value = float(text)
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"expected a level in (0, 1), e.g. 0.95; got {text}")
    return value


def _add_data_args(p: argparse.ArgumentParser, required: bool = True) -> None:
    p.add_argument(
        "paths",
        nargs="+" if required else "*",
        metavar="PATH",
        help="run directory (metrics.jsonl), .csv, .jsonl, W&B chart export CSV, TensorBoard event file or "
        "folder, TRL trainer_state.json, MLflow run or experiment folder, verl console log",
    )
    g = p.add_argument_group("data")
    g.add_argument("--x", metavar="COL",
                   help=f"compute column (default: flops when logged, else {DEFAULT_X} or a known "
                   "alternative); "
                   "with --params or --flops-per-step: the token or step column to convert to FLOPs")
    g.add_argument("--y", metavar="COL",
                   help=f"reward column or tag (default {DEFAULT_Y}, or a known alternative)")
    g.add_argument("--format", choices=FORMATS, metavar="FMT",
                   help=f"log format ({', '.join(FORMATS)}; default: detected from the file or folder)")
    g.add_argument(
        "--min-x", type=float, metavar="X", help="fit only points with x >= X (the paper skips ~1 epoch)"
    )
    g.add_argument(
        "--max-x", type=float, metavar="X", help="fit only points with x <= X (later points are held out)"
    )
    g.add_argument(
        "--fit-fraction",
        type=float,
        metavar="F",
        help="fit only points with x <= F x the run's last x (0.5: the first half; the rest is held out)",
    )
    g.add_argument("--min-step", type=float, metavar="S", help="fit only points with step >= S")
    g.add_argument("--max-step", type=float, metavar="S", help="fit only points with step <= S")
    g.add_argument("--min-epoch", type=float, metavar="E", help="fit only points with epoch >= E")
    g.add_argument("--max-epoch", type=float, metavar="E", help="fit only points with epoch <= E")
    g.add_argument(
        "--downsample",
        type=_positive_int,
        metavar="BINS",
        help="fit only record-breaking points: where the reward first enters one of BINS levels",
    )
    c = p.add_argument_group("compute axis (FLOPs from tokens or steps, docs/scaling.md)")
    c.add_argument("--params", type=float, metavar="N",
                   help="parameters N: --x COL counts tokens, each priced 8N (generated 2N + trained 6N); "
                   "or price --gen-tokens / --train-tokens / --scored-tokens apart")
    c.add_argument("--gen-tokens", metavar="COL", help="generated (and prefilled) tokens column: 2N each")
    c.add_argument("--train-tokens", metavar="COL", help="trained tokens column: 6N each")
    c.add_argument("--scored-tokens", metavar="COL",
                   help="forward-only scored tokens column (reference / old log-probs): 2N each")
    c.add_argument("--flops-per-step", type=float, metavar="F",
                   help="FLOPs of one step: x = the step column (--x, default step) x F")
    c.add_argument("--per-step", action="store_true",
                   help="the token columns are per-step counts (verl's perf/total_num_tokens): summed")
    m = p.add_argument_group("model")
    m.add_argument(
        "--r0",
        type=float,
        metavar="V",
        help="reward at zero compute (default: the first evaluation of each run)",
    )
    m.add_argument(
        "--method",
        choices=("fast", "paper"),
        default="fast",
        help="fast: vectorized grid + continuous refinement (default); paper: literal A.5 grid",
    )
    m.add_argument(
        "--a-max",
        type=float,
        metavar="V",
        help="upper bound on A (default 1 when rewards are <= 1, else none; 'inf' for none)",
    )
    u = p.add_argument_group("uncertainty")
    u.add_argument(
        "--bootstrap",
        type=_positive_int,
        default=1000,
        metavar="N",
        help="bootstrap resamples for intervals and bands (default 1000; 0 = none)",
    )
    u.add_argument(
        "--block",
        type=int,
        default=1,
        metavar="L",
        help="resample residuals in blocks of L consecutive points (correlated errors)",
    )
    u.add_argument(
        "--errors",
        choices=("iid", "local_level"),
        default="iid",
        help="residual error model of the bootstrap: iid (default), or local_level for a curve that "
        "wanders (a random walk on the residuals; the live forecast's default, docs/scaling.md)",
    )
    u.add_argument("--seed", type=int, default=0, help="random seed of the bootstrap (default 0)")
    u.add_argument("--level", type=_level, default=0.95, help="interval level (default 0.95)")
    d = p.add_argument_group("diagnostics")
    d.add_argument(
        "--truncation-threshold",
        type=_rate,
        default=TRUNCATION_THRESHOLD,
        metavar="F",
        help=f"flag runs whose training truncation_rate passed F (default {TRUNCATION_THRESHOLD:g}, the "
        "paper's instability warning; 1 = never)",
    )
    u.add_argument(
        "--a-width",
        type=float,
        default=DEFAULT_HALF_WIDTH,
        metavar="W",
        help="for a fit that does not pin A: say how far the run must go for A's interval to be +-W "
        f"(default {DEFAULT_HALF_WIDTH}, the paper's seed margin)",
    )
    o = p.add_argument_group("output")
    o.add_argument("--json", action="store_true", help="print JSON instead of tables")
    o.add_argument("--plot", metavar="OUT.png", help="write a figure (png, pdf or svg)")
    o.add_argument("--overwrite", action="store_true", help="replace an existing --plot file")


def _options(
    args: argparse.Namespace, predict_at: tuple[float, ...] = (), power_law: bool = False
) -> FitOptions:
    return FitOptions(
        min_x=args.min_x,
        max_x=args.max_x,
        min_step=args.min_step,
        max_step=args.max_step,
        min_epoch=args.min_epoch,
        max_epoch=args.max_epoch,
        r0=args.r0,
        method=args.method,
        a_max=args.a_max,
        n_boot=args.bootstrap,
        block=args.block,
        errors=args.errors,
        seed=args.seed,
        level=args.level,
        downsample_bins=args.downsample,
        predict_at=predict_at,
        power_law=power_law,
        max_x_fraction=args.fit_fraction,
        truncation_threshold=args.truncation_threshold,
        a_half_width=args.a_width,
    )


def _recipe_groups(specs: list[str]) -> list[tuple[str, list[str]]]:
    """``NAME=PATH[,PATH...]`` arguments of ``--recipe``, checked."""
    out: list[tuple[str, list[str]]] = []
    for spec in specs:
        name, sep, rest = spec.partition("=")
        paths = [p for p in rest.split(",") if p.strip()]
        if not sep or not name.strip() or len(paths) < 2:
            raise InputError(f"--recipe {spec!r}: expected NAME=PATH,PATH[,...] (two or more seeds to pool)")
        if name.strip() in {n for n, _ in out}:
            raise InputError(f"--recipe {name.strip()!r} is given twice")
        out.append((name.strip(), paths))
    return out


def _read_from(a: RunAnalysis, path: str) -> bool:
    """Whether ``a``'s curve was read from ``path`` (its file, or a file inside its folder)."""
    from pathlib import Path

    src, p = Path(a.curve.source).resolve(), Path(path).resolve()
    return src == p or p in src.parents


def _analyze(args: argparse.Namespace, opts: FitOptions, extra: list[str] | None = None) -> list[RunAnalysis]:
    if args.plot:  # before any work; never over a file that is not to be replaced
        check_output_file(args.plot, "--plot", overwrite=args.overwrite)
    if args.block < 1:
        raise InputError(f"--block must be >= 1, got {args.block}")
    axis = flops_axis(args)
    curves = read_many([*args.paths, *(extra or [])], x=None if axis else args.x, y=args.y, axis=axis,
                       fmt=args.format)
    for curve in curves:  # a curve trained under more than one config: say so where it changed
        for change in getattr(curve, "config_changes", ()):
            print(f"scalerl {args.command}: note: {curve.label} changed {change['key']} from "
                  f"{json.dumps(change['from'])} to {json.dumps(change['to'])} after step {change['step']} "
                  "(a resumed session; sessions.jsonl)", file=sys.stderr)
    return [analyze_curve(c, opts) for c in curves]


def flops_axis(args: argparse.Namespace) -> FlopsAxis | None:
    """The FLOPs axis the compute-axis flags ask for (None: x is a logged column)."""
    kinds = {"--gen-tokens": args.gen_tokens, "--train-tokens": args.train_tokens,
             "--scored-tokens": args.scored_tokens}
    named = [flag for flag, col in kinds.items() if col]
    if args.flops_per_step is not None:
        if args.params is not None or named:
            raise InputError("--flops-per-step prices steps; it does not combine with --params or token "
                             "columns")
        return FlopsAxis.from_steps(args.x or "step", args.flops_per_step)
    if args.params is None:
        if named or args.per_step:
            flags = ", ".join(named) or "--per-step"
            raise InputError(f"{flags}: token counts need --params N (the model's parameters) to price them")
        return None
    if named:
        if args.x is not None:
            raise InputError("--x with --gen-tokens/--train-tokens: name the token columns with those "
                             "flags only")
        return FlopsAxis.from_token_kinds(args.params, generated=args.gen_tokens, trained=args.train_tokens,
                                          scored=args.scored_tokens, per_step=args.per_step)
    if args.x is None:
        raise InputError("--params N prices tokens: name the token column with --x (e.g. --x num_tokens) or "
                         "with --gen-tokens / --train-tokens")
    return FlopsAxis.from_tokens(args.x, args.params, per_step=args.per_step)


def _axis_labels(analyses: list[RunAnalysis]) -> tuple[str, str]:
    xs = sorted({a.curve.x_name for a in analyses})
    ys = sorted({a.curve.y_name for a in analyses})
    return " / ".join(xs), " / ".join(ys)


def run_fit(args: argparse.Namespace) -> int:
    """``scalerl fit``: fit each run, print the table (or JSON), optionally plot."""
    opts = _options(args, tuple(args.predict_at or ()), args.power_law)
    analyses = _analyze(args, opts)
    pooled = _pool(analyses, args) if args.pool else None
    if args.json:
        payload: dict[str, object] = {
            "model": "R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B)",
            "runs": [run_to_dict(a) for a in analyses],
        }
        if pooled is not None:
            payload["pooled"] = pooled.to_dict()
        text = json.dumps(jsonable(payload), indent=2, allow_nan=False)
    else:
        text = render_fit(analyses, args.level, args.bootstrap, args.seed)
        if pooled is not None:
            text += "\n\n" + render_pooled(pooled)
        notes = axis_notes(analyses)
        if notes:
            text += "\n\n" + "\n".join(notes)
    if args.plot:
        from scalerl.scaling.plot import FitPlotItem, plot_fits

        x_label, y_label = _axis_labels(analyses)
        extend = max([*(args.predict_at or ()), *(1.5 * float(a.fit.compute.max()) for a in analyses)])
        with writing_output(args.plot, "--plot"):
            plot_fits(
                [FitPlotItem(a.curve.label, a.fit, a.boot, a.power_law, a.predictions) for a in analyses],
                args.plot,
                x_label=x_label,
                y_label=y_label,
                title=_fit_title(analyses),
                extend_to=1.15 * extend,
                level=args.level,
            )
        if not args.json:
            text += f"\n\nplot written to {args.plot}"
    sys.stdout.write(text + "\n")
    return 0


def _pool(analyses: list[RunAnalysis], args: argparse.Namespace, name: str | None = None) -> PooledFit:
    """One pooled fit of every run in ``analyses`` (the seeds of one recipe)."""
    if name is None:
        names = {a.curve.recipe or recipe_name(a.curve.label) for a in analyses}
        name = names.pop() if len(names) == 1 else "pooled"
    return fit_pooled(name, [(a.curve.label, a.fit) for a in analyses], n_boot=args.bootstrap,
                      seed=args.seed, level=args.level)


def render_pooled(p: PooledFit) -> str:
    """The pooled fit: shared parameters with their intervals, each seed's R0 and noise."""
    def iv(name: str, digits: int = 4) -> str:
        got = p.interval(name)
        return "" if got is None else f" [{got[0]:.{digits}g}, {got[1]:.{digits}g}]"

    lines = [f"pooled fit of {p.name} ({len(p.labels)} seeds, one A, B, C_mid; each seed its own R0 and "
             f"noise; {p.level:.0%} interval: residual bootstrap within each seed)",
             f"  A {p.A:.4g}{iv('A')}   B {p.B:.3g}{iv('B', 3)}   C_mid {p.C_mid:.4g}{iv('C_mid')}"]
    for label, r0, sd, k in zip(p.labels, p.R0s, p.sigmas, p.n_points, strict=True):
        lines.append(f"  {label}: {k} points, R0 {r0:.4g}, noise sd {sd:.3g}")
    lines.extend(f"  warning: {w}" for w in p.warnings)
    return "\n".join(lines)


def _fit_title(analyses: list[RunAnalysis]) -> str:
    names = ", ".join(a.curve.label for a in analyses[:3]) + (" ..." if len(analyses) > 3 else "")
    ends = {float(a.fit.fit_compute.max()) for a in analyses}
    held = any(a.held_out is not None for a in analyses)
    title = f"sigmoid fit: {names}"
    if len(ends) == 1 and held:
        title += f", fitted up to {next(iter(ends)):.3g}"
    if len(analyses) == 1 and analyses[0].predictions:
        preds = analyses[0].predictions
        title += "; predicted " + ", ".join(f"{p.reward:.3f} at {p.compute:.3g}" for p in preds)
    return title


def run_compare(args: argparse.Namespace) -> int:
    """``scalerl compare``: fit every run, group seeds into recipes, compare them."""
    opts = _options(args)
    groups = _recipe_groups(args.recipe or [])
    if not args.paths and not groups:
        raise InputError("compare: give runs (PATH ...) or pooled recipes (--recipe NAME=PATH,PATH)")
    analyses = _analyze(args, opts, extra=[p for _, paths in groups for p in paths])
    # The --recipe runs are read after the positional ones, in order: split them back by group.
    tail = analyses[len(analyses) - sum(len(paths) for _, paths in groups):]
    named = {a.curve.label: a.curve.recipe for a in analyses if a.curve.recipe}
    pooled: dict[str, PooledFit] = {}
    start = 0
    for name, paths in groups:
        members = []
        for path in paths:
            got = [a for a in tail[start:] if _read_from(a, path)]
            members.extend(got)
            start += len(got)
        for a in members:
            named[a.curve.label] = name
        pooled[name] = _pool(members, args, name)
    fits = {a.curve.label: a.fit for a in analyses}
    boots = {a.curve.label: a.boot for a in analyses if a.boot is not None}
    cmp = compare(
        fits,
        boots,
        at=tuple(args.at or ()),
        margin_A=args.margin_a,
        margin_B=args.margin_b,
        group_seeds=not args.no_seed_groups,
        recipes=named,
        fixed_A=args.fixed_a,
        seed=args.seed,
        start_models=start_models(analyses),
        pooled=pooled,
    )
    if args.json:
        text = json.dumps(comparison_to_dict(cmp, analyses), indent=2, allow_nan=False)
    else:
        fits_text = render_fit(analyses, args.level, args.bootstrap, args.seed, details=False)
        for p in pooled.values():
            fits_text += "\n\n" + render_pooled(p)
        text = fits_text + "\n\n" + render_comparison(cmp, args.level)
        notes = axis_notes(analyses)
        if notes:
            text += "\n\n" + "\n".join(notes)
    if args.plot:
        from scalerl.scaling.plot import FitPlotItem, plot_comparison

        x_label, y_label = _axis_labels(analyses)
        items = {a.curve.label: FitPlotItem(a.curve.label, a.fit, a.boot) for a in analyses}
        plot_comparison(cmp, items, args.plot, x_label=x_label, y_label=y_label, level=args.level)
        if not args.json:
            text += f"\n\nplot written to {args.plot}"
    sys.stdout.write(text + "\n")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the ``fit`` and ``compare`` subcommands to the ``scalerl`` parser."""
    fit = subparsers.add_parser(
        "fit",
        help="fit the ScaleRL sigmoid to runs and predict where they end",
        description="Fit R(C) = R0 + (A - R0) / (1 + (C_mid/C)^B) (ScaleRL eq. 1) to each run's "
        "held-out reward curve, with bootstrap intervals, a profile interval for A, "
        "held-out extrapolation error, and diagnostics.",
    )
    _add_data_args(fit)
    fit.add_argument(
        "--predict-at",
        type=float,
        action="append",
        metavar="X",
        help="predict the reward at compute X (repeatable)",
    )
    fit.add_argument(
        "--power-law", action="store_true", help="also fit the bounded power law A - D/C^B (A.4)"
    )
    fit.add_argument(
        "--pool", action="store_true",
        help="the runs are seeds of one recipe: also fit one (A, B, C_mid) to all of them, each seed with "
        "its own R0 and noise level, with a bootstrap interval (docs/scaling.md 'Pooled seeds')",
    )
    fit.set_defaults(func=run_fit)

    cmp = subparsers.add_parser(
        "compare",
        help="compare recipes: asymptote, efficiency, crossover, fixed-A refit",
        description="Fit every run, group seeds of one recipe (config.yaml 'recipe', else labels "
        "ending in -seedN / _sN), and "
        "compare recipes the ScaleRL way: A and B with margins, who is ahead at a compute, "
        "crossovers, and a refit with A fixed to the mean A.",
    )
    _add_data_args(cmp, required=False)
    cmp.add_argument(
        "--recipe", action="append", metavar="NAME=PATH,PATH",
        help="a pooled recipe: these runs are seeds of NAME, fitted as one curve (as fit --pool); "
        "repeatable; positional runs are compared beside them",
    )
    cmp.add_argument(
        "--at",
        type=float,
        action="append",
        metavar="X",
        help="report who is ahead at compute X (repeatable; default: the largest compute seen)",
    )
    cmp.add_argument(
        "--margin-a",
        type=float,
        default=PAPER_SEED_MARGIN_A,
        metavar="M",
        help=f"floor of the margin on A (default {PAPER_SEED_MARGIN_A}: the paper's seed-to-seed margin; "
        "0: only the measured seed spread and bootstrap)",
    )
    cmp.add_argument("--margin-b", type=float, default=0.0, metavar="M", help="floor of the margin on B")
    cmp.add_argument("--fixed-a", type=float, metavar="A", help="A for the fixed-A refit (default: mean A)")
    cmp.add_argument("--no-seed-groups", action="store_true", help="treat every run as its own recipe")
    cmp.set_defaults(func=run_compare)
