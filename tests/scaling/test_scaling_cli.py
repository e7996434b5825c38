"""``scalerl fit`` / ``scalerl compare`` end to end through ``scalerl.cli.main``."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from scalerl.cli import main
from scalerl.scaling import reference_csv
from scalerl.scaling.forms import sigmoid_reward

REF = str(reference_csv())


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_fit_json_on_reference(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(
        [
            "fit",
            REF,
            "--r0",
            "0.4017",
            "--max-x",
            "50000",
            "--predict-at",
            "100000",
            "--bootstrap",
            "300",
            "--power-law",
            "--json",
        ],
        capsys,
    )
    assert code == 0, err
    data = json.loads(out)
    (r,) = data["runs"]
    assert {"A", "B", "C_mid", "R0", "diagnostics", "intervals", "predictions", "held_out"} <= r.keys()
    assert r["R0"] == 0.4017 and r["r0_source"] == "argument"
    assert abs(r["A"] - 0.645) < 0.02
    lo, hi = r["intervals"]["A"]
    assert lo < r["A"] < hi
    assert r["held_out"]["n"] == 9 and r["held_out"]["mae"] <= 0.015
    (pred,) = r["predictions"]
    assert pred["compute"] == 100000 and pred["lo"] <= pred["reward"] <= pred["hi"]
    assert pred["obs_lo"] <= pred["lo"] and pred["obs_hi"] >= pred["hi"]
    assert r["power_law"]["a_max"] == 1.0
    assert r["diagnostics"]["reliable"] is True


def test_fit_table_and_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    png = tmp_path / "fit.png"
    code, out, err = run(
        [
            "fit",
            REF,
            "--x",
            "compute_gpu_hours",
            "--y",
            "pass_rate",
            "--min-x",
            "1500",
            "--max-x",
            "50000",
            "--bootstrap",
            "100",
            "--plot",
            str(png),
        ],
        capsys,
    )
    assert code == 0, err
    assert "scalerl_8b_dense_fig1a" in out and "A profile interval" in out and "held-out points" in out
    header = next(line for line in out.splitlines() if line.startswith("run"))
    for column in ("points", "R0", "A", "B", "C_mid", "RMSE", "status"):
        assert column in header
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [p.name for p in tmp_path.iterdir()] == ["fit.png"]  # no temp files left behind
    umask = os.umask(0)
    os.umask(umask)
    assert png.stat().st_mode & 0o777 == 0o666 & ~umask


def test_fit_paper_method_on_small_csv(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The CLI wiring of --method paper, on a 15 x 20 slice of the paper grids: the full literal
    # search (7,100 curve_fit calls) is exercised once, in test_scaling_grids.py.
    monkeypatch.setattr("scalerl.scaling.sigmoid.PAPER_A_GRID", np.round(np.arange(0.55, 0.6901, 0.01), 3))
    monkeypatch.setattr("scalerl.scaling.sigmoid.PAPER_C_MID_GRID", np.linspace(1000, 20000, 20))
    c = np.linspace(1000, 30000, 12)
    y = sigmoid_reward(c, 0.62, 1.8, 6000, 0.4)
    p = tmp_path / "curve.csv"
    p.write_text("gpu_hours,pass_rate\n" + "".join(f"{a},{b}\n" for a, b in zip(c, y, strict=True)))
    code, out, err = run(
        ["fit", str(p), "--x", "gpu_hours", "--method", "paper", "--r0", "0.4", "--bootstrap", "0", "--json"],
        capsys,
    )
    assert code == 0, err
    (r,) = json.loads(out)["runs"]
    assert r["method"] == "paper" and r["A"] == 0.62
    assert r["intervals"] == {} and r["grid"]["n_A"] == 15 and r["grid"]["n_C_mid"] == 20
    assert r["C_mid"] == 6000


def test_fit_run_directory_with_step_window(
    tmp_path: Path, run_writer: Callable[..., Path], capsys: pytest.CaptureFixture[str]
) -> None:
    c = np.linspace(0, 40000, 41)
    rng = np.random.default_rng(0)
    y = sigmoid_reward(c, 0.62, 1.8, 6000, 0.4) + rng.normal(0, 0.003, c.size)
    d = run_writer(tmp_path, "seed0", c, y, config_name="cispo-8b")
    code, out, err = run(
        ["fit", str(d), "--min-step", "1000", "--max-epoch", "3", "--bootstrap", "50", "--json"], capsys
    )
    assert code == 0, err
    (r,) = json.loads(out)["runs"]
    # The run logs flops: the default x (issue 42: the axis every example uses, the same under any load).
    assert r["label"] == "cispo-8b" and r["x"] == "flops" and r["y"] == "val_pass_rate"
    assert r["fit_window"]["n_points"] == 21  # steps 1000..3000
    assert r["r0_source"] == "zero_compute_point"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["fit", REF, "--y", "accuracy"],
            r"no y column 'accuracy' \(have: compute_gpu_hours, pass_rate, split\)",
        ),
        (["fit", REF, "--max-x", "3000"], r"scalerl_8b_dense_fig1a .*only 2 point"),
        (["fit", "/nonexistent/run"], "no such file or directory"),
        (["fit", REF, "--min-step", "5"], r"no column 'step'"),
        (["fit", REF, "--r0", "0.5", "--a-max", "0.45"], "a_max"),
        (["fit", REF, "--block", "0"], "--block must be >= 1"),
    ],
)
def test_fit_errors_exit_2_with_clear_message(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(argv, capsys)
    assert code == 2
    assert out == ""  # nothing half-written
    assert err.startswith("scalerl fit: error: ")
    assert re.search(message, err), err


def test_malformed_log_is_reported_with_file_and_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    d = tmp_path / "run"
    d.mkdir()
    (d / "metrics.jsonl").write_text('{"kind": "step", "step": 1}\n{"kind": "eval", "val_pass_rate": \n')
    code, out, err = run(["fit", str(d)], capsys)
    assert code == 2 and out == ""
    assert f"{d / 'metrics.jsonl'}:2: malformed JSON" in err


def test_plot_into_missing_directory_writes_nothing(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, out, err = run(["fit", REF, "--bootstrap", "0", "--plot", str(tmp_path / "no" / "fig.png")], capsys)
    assert code == 2 and out == "" and "does not exist" in err
    assert not (tmp_path / "no").exists()


def test_compare_runs(
    tmp_path: Path, run_writer: Callable[..., Path], capsys: pytest.CaptureFixture[str]
) -> None:
    rng = np.random.default_rng(3)
    c = np.linspace(0, 40000, 41)
    paths = []
    for s in range(2):
        for name, A, B, cm in (("cispo", 0.64, 2.0, 8000), ("dapo", 0.58, 1.7, 3000)):
            y = sigmoid_reward(c, A, B, cm, 0.4) + rng.normal(0, 0.004, c.size)
            paths.append(str(run_writer(tmp_path, f"{name}-seed{s}", c, y, config_name=f"{name}-seed{s}")))
    png = tmp_path / "cmp.png"
    code, out, err = run(
        ["compare", *paths, "--bootstrap", "100", "--at", "50000", "--plot", str(png)], capsys
    )
    assert code == 0, err
    assert "fixed-A refit" in out and "cispo vs dapo" in out and "curves cross at C" in out
    assert "ahead at C = 5e+04" in out
    assert png.read_bytes()[:4] == b"\x89PNG"
    code, out, err = run(["compare", *paths, "--bootstrap", "100", "--json"], capsys)
    assert code == 0, err
    data = json.loads(out)
    assert [r["recipe"] for r in data["recipes"]] == ["cispo", "dapo"]
    (pair,) = data["pairs"]
    assert pair["A_differs"] is True and pair["A_diff"] > 0
    assert data["standings"][0]["leader"] == "cispo"
    assert data["fixed_A_refit"]["A"] == pytest.approx(np.mean([r["A"] for r in data["runs"]]))


def test_console_script_runs(tmp_path: Path) -> None:
    exe = Path(sys.executable).with_name("scalerl")
    if not exe.exists():
        pytest.skip("console script not installed next to this interpreter")
    proc = subprocess.run(
        [str(exe), "fit", REF, "--r0", "0.4017", "--bootstrap", "0", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert abs(json.loads(proc.stdout)["runs"][0]["A"] - 0.645) <= 0.01


def test_fit_says_how_much_more_compute_an_unpinned_fit_needs(
    tmp_path: Path, run_writer: Callable[..., Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """Data to 0.6x C_mid: `fit` and `compare` print the advice, JSON carries it, --a-width moves it."""
    rng = np.random.default_rng(5)
    c = np.linspace(0, 6000, 13)
    y = sigmoid_reward(c, 0.7, 1.5, 10000, 0.2) + rng.normal(0, 0.01, c.size)
    path = str(run_writer(tmp_path, "short", c, y))
    code, out, err = run(["fit", path, "--bootstrap", "200"], capsys)
    assert code == 0, err
    assert "compute needed: to pin A to +-0.02 (95%)" in out
    code, out, err = run(["fit", path, "--bootstrap", "200", "--json", "--a-width", "0.05"], capsys)
    assert code == 0, err
    loose = json.loads(out)["runs"][0]["compute_needed"]
    code, out, err = run(["fit", path, "--bootstrap", "200", "--json"], capsys)
    tight = json.loads(out)["runs"][0]["compute_needed"]
    assert loose["half_width"] == 0.05 and tight["half_width"] == 0.02
    assert loose["needed"] is not None and (tight["needed"] is None or tight["needed"] > loose["needed"])
    code, out, err = run(["compare", path, "--bootstrap", "200"], capsys)
    assert code == 0 and "short: compute needed:" in out, err
    code, out, err = run(["fit", path, "--a-width", "0"], capsys)
    assert code == 2 and "--a-width (the target half-width on A) must be in (0, 1)" in err


def test_compare_uses_the_paper_seed_margin_as_floor(
    tmp_path: Path, run_writer: Callable[..., Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """Two well-determined single-seed runs 0.015 apart in A: within the default +-0.02 margin,
    a difference with --margin-a 0."""
    c = np.linspace(0, 200000, 81)
    paths = [str(run_writer(tmp_path, name, c, sigmoid_reward(c, A, 1.5, 5000, 0.3)
                            + 0.0005 * np.sin(np.arange(c.size))))
             for name, A in (("one", 0.650), ("two", 0.635))]
    code, out, err = run(["compare", *paths, "--bootstrap", "100", "--json"], capsys)
    assert code == 0, err
    data = json.loads(out)
    assert all(r["A_margin"] >= 0.02 for r in data["recipes"])
    assert data["pairs"][0]["A_verdict"] == "within_margin"
    code, out, err = run(["compare", *paths, "--bootstrap", "100", "--json", "--margin-a", "0"], capsys)
    assert json.loads(out)["pairs"][0]["A_verdict"] == "a_higher"


def test_compare_plot_of_flat_runs(
    tmp_path: Path, run_writer: Callable[..., Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """Runs that never leave R0 (a tiny run scoring 0) fit A = R0 with any B: the fixed-A panel has
    no positive F(R) and C^B overflows; the plot is still written (it used to raise in matplotlib)."""
    c = np.linspace(0, 4e8, 5)
    paths = [str(run_writer(tmp_path, name, c, np.zeros(c.size), config_name=name)) for name in ("a", "b")]
    png = tmp_path / "flat.png"
    code, _, err = run(["compare", *paths, "--bootstrap", "0", "--fit-fraction", "1", "--plot", str(png)],
                       capsys)
    assert code == 0, err
    assert png.read_bytes()[:4] == b"\x89PNG"
