"""Honest comparisons: verdicts only for identifiable fits, caveats on far predictions, starting
models, the fit window as a fraction, run labels, and what the figures show."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from scalerl.cli import main
from scalerl.scaling.analysis import FitOptions, analyze_curve
from scalerl.scaling.compare import EXTRAPOLATION_LIMIT, compare
from scalerl.scaling.forms import sigmoid_reward
from scalerl.scaling.io import Curve, read_run_dir
from scalerl.scaling.plot import FitPlotItem, comparison_figure, fit_figure
from scalerl.scaling.sigmoid import fit_sigmoid
from scalerl.scaling.uncertainty import bootstrap

SyntheticCurve = Callable[..., tuple[np.ndarray, np.ndarray]]


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def _short(synthetic: SyntheticCurve, A: float, seed: int) -> object:
    # Data that stops at ~0.6 C_mid: A runs to its bound of 1, the fit is not identifiable.
    return fit_sigmoid(*synthetic(A=A, B=1.5, C_mid=20000, c_max=12000, n=15, noise=0.01, seed=seed), r0=0.4)


def test_a_verdict_needs_identifiable_fits(synthetic: SyntheticCurve) -> None:
    long_hi = fit_sigmoid(*synthetic(A=0.70, seed=1), r0=0.4)
    long_lo = fit_sigmoid(*synthetic(A=0.60, seed=2), r0=0.4)
    short = _short(synthetic, 0.62, 3)
    assert not short.diagnostics.identifiable
    fits = {"hi": long_hi, "lo": long_lo, "short": short}
    cmp = compare(fits, {k: bootstrap(f, n_boot=100, seed=0) for k, f in fits.items()}, refit_fixed_A=False)
    pairs = {(p.a, p.b): p for p in cmp.pairs}
    good = pairs[("hi", "lo")]
    assert good.verdict("A") == "a_higher" and good.leader("A") == "hi" and not good.A_undetermined
    for key in (("hi", "short"), ("lo", "short")):
        p = pairs[key]
        # Whatever the difference and margin say, no verdict on A or B with the short run.
        assert p.verdict("A") == "undetermined" and p.verdict("B") == "undetermined"
        assert not p.A_differs and p.leader("A") is None
        assert any("short: data stops at" in why for why in p.A_undetermined)
        d = p.to_dict()
        assert d["A_verdict"] == "undetermined" and d["A_higher"] is None and d["A_undetermined_because"]


def test_prediction_far_beyond_a_runs_data_carries_a_caveat(synthetic: SyntheticCurve) -> None:
    a = fit_sigmoid(*synthetic(A=0.65, c_max=50000, seed=4), r0=0.4)
    b = fit_sigmoid(*synthetic(A=0.62, c_max=10000, seed=5), r0=0.4)
    near = compare({"a": a, "b": b}, at=(20000.0,), refit_fixed_A=False).standings[0]
    assert not any("beyond its fitted data" in c for c in near.caveats)
    far = compare({"a": a, "b": b}, at=(50000.0,), refit_fixed_A=False).standings[0]
    assert any(c.startswith("b: 5.0x beyond its fitted data") for c in far.caveats)
    assert not any(c.startswith("a:") and "beyond" in c for c in far.caveats)
    assert far.to_dict()["caveats"] == list(far.caveats)
    assert EXTRAPOLATION_LIMIT < 2.7  # the "2.7x beyond" is far


def _pair_of_runs(
    tmp_path: Path, run_writer: Callable[..., Path], models: tuple[str | None, str | None]
) -> list[str]:
    rng = np.random.default_rng(0)
    c = np.linspace(0, 40000, 41)
    paths = []
    for name, A, model in (("cispo", 0.66, models[0]), ("grpo", 0.58, models[1])):
        d = run_writer(tmp_path, name, c, sigmoid_reward(c, A, 2.0, 6000, 0.4) + rng.normal(0, 0.004, c.size),
                       config_name=name)
        if model is not None:
            identity = {"name_or_path": f"/m/{model}", "sha256": model * 8}
            (d / "start_model.json").write_text(json.dumps(identity))
        paths.append(str(d))
    return paths


def test_compare_says_when_runs_started_from_different_models(
    tmp_path: Path, run_writer: Callable[..., Path], capsys: pytest.CaptureFixture[str]
) -> None:
    same = _pair_of_runs(tmp_path / "same", run_writer, ("abc", "abc"))
    code, out, _ = _run(["compare", *same, "--bootstrap", "50"], capsys)
    assert code == 0 and "different models" not in out and "did not record" not in out
    differ = _pair_of_runs(tmp_path / "differ", run_writer, ("abc", "def"))
    code, out, _ = _run(["compare", *differ, "--bootstrap", "50"], capsys)
    assert code == 0 and "WARNING: the runs started from different models" in out
    assert "sha256:abcabcabcabc" in out and "sha256:defdefdefdef" in out
    code, out, _ = _run(["compare", *differ, "--bootstrap", "50", "--json"], capsys)
    data = json.loads(out)
    assert data["same_start_model"] is False
    assert data["start_models"] == {"cispo": "sha256:abcabcabcabc", "grpo": "sha256:defdefdefdef"}
    (pair,) = data["pairs"]
    assert pair["A_verdict"] == "a_higher" and pair["A_higher"] == "cispo"
    unknown = _pair_of_runs(tmp_path / "unknown", run_writer, ("abc", None))
    code, out, _ = _run(["compare", *unknown, "--bootstrap", "50"], capsys)
    assert "grpo did not record a starting model" in out


def test_compare_prints_undetermined_with_reasons(
    tmp_path: Path, run_writer: Callable[..., Path], capsys: pytest.CaptureFixture[str]
) -> None:
    rng = np.random.default_rng(1)
    c = np.linspace(0, 12000, 13)
    paths = []
    for name, A in (("a", 0.9), ("b", 0.6)):
        y = sigmoid_reward(c, A, 1.5, 20000, 0.4) + rng.normal(0, 0.01, c.size)
        paths.append(str(run_writer(tmp_path, name, c, y, config_name=name)))
    code, out, _ = _run(["compare", *paths, "--bootstrap", "100", "--x", "flops"], capsys)
    assert code == 0
    line = next(ln for ln in out.splitlines() if ln.startswith("  a vs b:"))
    assert "has the higher" not in line and "undetermined" in line
    assert "A and B undetermined:" in out and "data stops at" in out


def test_fit_fraction_holds_out_the_rest_of_each_run(
    tmp_path: Path, run_writer: Callable[..., Path], capsys: pytest.CaptureFixture[str]
) -> None:
    c = np.linspace(0, 0.019, 20)  # a run ending before --max-x 0.045: nothing would be held out
    y = sigmoid_reward(np.maximum(c, 1e-9), 0.6, 1.5, 0.006, 0.3)
    d = run_writer(tmp_path, "r", c, y, config_name="r")
    curve = read_run_dir(d, x="compute_device_hours")
    assert analyze_curve(curve, FitOptions(max_x=0.045, n_boot=0)).held_out is None
    half = analyze_curve(curve, FitOptions(max_x_fraction=0.5, n_boot=0))
    assert half.held_out is not None and half.held_out.n == 10
    assert float(half.fit.fit_compute.max()) <= 0.5 * 0.019
    code, out, _ = _run(["fit", str(d), "--fit-fraction", "0.5", "--bootstrap", "0"], capsys)
    assert code == 0 and "held-out points after the window: 10" in out
    # The run logs flops: the default x, printed with the fit; no wall-clock note.
    assert "x axis: flops" in out and "note: x = " not in out
    code, out, _ = _run(["fit", str(d), "--fit-fraction", "0.5", "--bootstrap", "0",
                         "--x", "compute_device_hours"], capsys)
    # Device-hours are wall-clock based: the output says so.
    assert "x axis: compute_device_hours" in out
    assert "note: x = compute_device_hours" in out and "--x flops" in out
    with pytest.raises(ValueError, match="fit-fraction"):
        FitOptions(max_x_fraction=1.5)


def test_runs_without_a_chosen_name_are_labelled_by_their_folder(
    tmp_path: Path, run_writer: Callable[..., Path]
) -> None:
    c = np.linspace(0, 10, 11)
    a = run_writer(tmp_path, "scalerl", c, 0.3 + 0.01 * c, config_name="run")  # the old default name
    b = run_writer(tmp_path, "grpo", c, 0.3 + 0.01 * c, config_name="my-grpo")
    assert read_run_dir(a).label == "scalerl" and read_run_dir(b).label == "my-grpo"


def test_fit_figure_shows_the_data_not_the_asymptote() -> None:
    rng = np.random.default_rng(0)
    c = np.linspace(500, 12000, 15)  # stops before C_mid: A far above every point
    y = sigmoid_reward(c, 0.9, 1.5, 20000, 0.3) + rng.normal(0, 0.005, 15)
    curve = Curve("early", "mem", "x", "y", c, y, np.arange(15))
    a = analyze_curve(curve, FitOptions(n_boot=50, predict_at=(24000.0,), power_law=True))
    assert float(curve.y.max()) + 0.3 < a.fit.A
    fig = fit_figure([FitPlotItem("early", a.fit, a.boot, a.power_law, a.predictions)], title="t")
    ax = fig.axes[0]
    _, hi = ax.get_ylim()
    top = max(float(curve.y.max()), a.predictions[0].obs_hi or 0.0)
    assert top <= hi < a.fit.A  # the data fills the axis; the asymptote does not stretch it
    assert any("above the plot" in t.get_text() for t in ax.texts)
    assert ax.get_title() == "t"
    (legend,) = fig.legends  # a figure legend, outside the axes
    texts = [t.get_text() for t in legend.get_texts()]
    assert any("power law" in t for t in texts) and any(t.startswith("prediction") for t in texts)
    fig.canvas.draw()
    legend_box = legend.get_window_extent()
    axes_box = ax.get_window_extent()
    assert legend_box.y1 <= axes_box.y0  # below the axes: it covers no data
    assert any(t.get_text() == f"{a.predictions[0].reward:.3f}" for t in ax.texts)  # the prediction, marked
    assert ax.xaxis.get_ticklabels()[0].get_fontsize() >= 11


def test_comparison_figure_labels_runs_by_name(tmp_path: Path, run_writer: Callable[..., Path]) -> None:
    paths = _pair_of_runs(tmp_path, run_writer, ("abc", "abc"))
    analyses = [analyze_curve(read_run_dir(p), FitOptions(n_boot=20)) for p in paths]
    cmp = compare({a.curve.label: a.fit for a in analyses}, {a.curve.label: a.boot for a in analyses})
    items = {a.curve.label: FitPlotItem(a.curve.label, a.fit, a.boot) for a in analyses}
    fig = comparison_figure(cmp, items)
    texts = [t.get_text() for t in fig.legends[0].get_texts()]
    assert any(t.startswith("cispo:") for t in texts) and any(t.startswith("grpo:") for t in texts)
    assert not any(t.startswith("run") for t in texts)
    assert fig.axes[0].title.get_fontsize() >= 13


def test_a_on_its_bound_does_not_ask_to_widen_the_grid() -> None:
    """The demo's own curve (tests/scaling/data/demo_curve.csv): fitted on its first half, A runs
    to its bound of 1. The diagnostics say so, and do not suggest widening a grid whose edge is
    that bound."""
    from scalerl.scaling.io import read_curves

    (curve,) = read_curves(Path(__file__).parent / "data" / "demo_curve.csv", x="flops")
    a = analyze_curve(curve, FitOptions(max_x_fraction=0.5, n_boot=0))
    d = a.fit.diagnostics
    assert d.A_at_bound and pytest.approx(1.0) == a.fit.A
    assert any("upper bound 1" in w for w in d.warnings)
    assert not any("widen the grid" in w for w in d.warnings)
