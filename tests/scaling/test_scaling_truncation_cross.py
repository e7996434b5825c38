"""`scalerl fit`'s truncation flag (ScaleRL's instability warning) and `scalerl fit-cross` (Tan et al.)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from scalerl.cli import main
from scalerl.scaling import efficiency_k
from scalerl.scaling.cross_runs import parse_size
from scalerl.scaling.diagnostics import truncation_flag
from scalerl.scaling.forms import sigmoid_reward


def test_truncation_flag_by_hand() -> None:
    steps = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    rates = np.array([0.05, 0.12, 0.10, 0.30, 0.08])
    flag = truncation_flag(steps, rates, 0.10)
    assert flag is not None
    assert (flag.first_step, flag.max_rate, flag.max_step, flag.n_over, flag.n_rows) == (2.0, 0.30, 4.0, 2, 5)
    assert "passed 10% at step 2" in flag.message() and "max 30.0% at step 4" in flag.message()
    assert truncation_flag(steps, rates, 0.30) is None  # strictly above: 0.30 itself does not pass
    with pytest.raises(ValueError, match="truncation threshold"):
        truncation_flag(steps, rates, 0.0)


def write_run(path: Path, truncation: list[float]) -> Path:
    """A scalerl-style run directory: step rows with a truncation rate, eval rows every 5 steps."""
    path.mkdir(parents=True)
    c = np.arange(1, len(truncation) + 1) * 1e9
    y = sigmoid_reward(c, 0.7, 1.5, 8e9, 0.2) + np.random.default_rng(0).normal(0, 0.004, c.size)
    rows = [{"kind": "eval", "step": 0, "flops": 0.0, "compute_device_hours": 0.0, "val_pass_rate": 0.2}]
    for i, rate in enumerate(truncation, start=1):
        rows.append({"kind": "step", "step": i, "flops": float(c[i - 1]), "truncation_rate": rate})
        if i % 5 == 0:
            rows.append({"kind": "eval", "step": i, "flops": float(c[i - 1]),
                         "compute_device_hours": i / 100, "val_pass_rate": float(y[i - 1])})
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def fit_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    assert main(["fit", *argv, "--x", "flops", "--bootstrap", "0", "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_fit_flags_a_run_whose_truncation_passed_the_threshold(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    rates = [0.02] * 60 + [0.04, 0.15, 0.22, 0.09] + [0.03] * 36
    run = write_run(tmp_path / "unstable", rates)
    (r,) = fit_json(capsys, str(run))["runs"]
    assert r["truncation"] == {"threshold": 0.1, "first_step": 62.0, "max_rate": 0.22, "max_step": 63.0,
                               "n_over": 2, "n_rows": 100}
    assert r["reliable"] is False and any("truncation rate passed 10%" in w for w in r["warnings"])
    # The threshold is a flag: at 25% the same run passes.
    (r,) = fit_json(capsys, str(run), "--truncation-threshold", "0.25")["runs"]
    assert r["truncation"] is None and not any("truncation" in w for w in r["warnings"])
    # The table says WARN and prints the warning.
    assert main(["fit", str(run), "--x", "flops", "--bootstrap", "0"]) == 0
    out = capsys.readouterr().out
    assert "training truncation rate passed 10% at step 62" in out
    with pytest.raises(SystemExit) as exc:  # argparse refuses it (exit 2) before anything runs
        main(["fit", str(run), "--truncation-threshold", "0"])
    assert exc.value.code == 2 and "--truncation-threshold" in capsys.readouterr().err


def test_truncation_from_a_csv_column(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    c = np.arange(1, 41) * 1e9
    y = sigmoid_reward(c, 0.7, 1.5, 8e9, 0.2)
    trunc = [0.01] * 39 + [0.5]
    lines = ["flops,val_pass_rate,truncation_rate,step"] + [
        f"{x},{v},{t},{i}" for i, (x, v, t) in enumerate(zip(c, y, trunc, strict=True), start=1)]
    path = tmp_path / "run.csv"
    path.write_text("\n".join(lines) + "\n")
    (r,) = fit_json(capsys, str(path))["runs"]
    assert r["truncation"]["first_step"] == 40.0 and r["truncation"]["n_over"] == 1


# ---------------------------------------------------------------------------------------------
# scalerl fit-cross

TRUTH = {"k_max": 0.5, "N0": 5e9, "c0": 9.0, "r": 0.7}


def law_pass(N: float, X: np.ndarray) -> np.ndarray:
    k = efficiency_k(N, TRUTH["k_max"], TRUTH["N0"])
    return 1.0 - 10.0 ** (k * (TRUTH["c0"] + TRUTH["r"] * np.log10(N) - np.log10(X)))


def write_sized_runs(root: Path, sizes: dict[str, float], noise: float = 0.002) -> list[str]:
    rng = np.random.default_rng(3)
    paths = []
    for label, N in sizes.items():
        X = np.geomspace(1e17, 1e20, 15)
        loss = (1.0 - law_pass(N, X)) * 10.0 ** rng.normal(0, noise, X.size)
        rows = [{"step": 0, "flops": 0.0, "val_pass_rate": 0.05}]  # the start-of-run evaluation: X = 0
        rows += [{"step": i + 1, "flops": float(x), "val_pass_rate": float(1 - v)}
                 for i, (x, v) in enumerate(zip(X, loss, strict=True))]
        path = root / f"{label}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        paths.append(str(path))
    return paths


def test_parse_size() -> None:
    assert parse_size("7B") == 7e9 and parse_size("135M") == 135e6 and parse_size("1.5b") == 1.5e9
    assert parse_size("7e9") == 7e9 and parse_size("2T") == 2e12 and parse_size("512k") == 512e3
    for bad in ("seven", "-1B", "0", "7X"):
        with pytest.raises(ValueError, match="model size"):
            parse_size(bad)


def test_fit_cross_recovers_the_law_and_extrapolates(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    sizes = {"m05": 0.5e9, "m15": 1.5e9, "m3": 3e9, "m7": 7e9, "m14": 14e9}
    paths = write_sized_runs(tmp_path, sizes)
    argv = ["fit-cross", *paths, *[a for label, N in sizes.items() for a in ("--size", f"{label}={N:g}")],
            "--predict", "32B", "1e19", "--validate"]
    assert main([*argv, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    law = out["law"]
    assert law["k_max"] == pytest.approx(TRUTH["k_max"], rel=0.05)
    assert law["N0"] == pytest.approx(TRUTH["N0"], rel=0.15)
    assert law["n_points"] == 75 and all(r["dropped_nonpositive_x"] == 1 for r in out["runs"])
    (pred,) = out["predictions"]
    assert pred["N"] == 32e9 and pred["pass_rate"] == pytest.approx(float(law_pass(32e9, np.array(1e19))),
                                                                    abs=0.01)
    v = out["validation"]
    assert v["held_out_size"] == 14e9 and v["n_points"] == 15 and v["mae"] < 0.02
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert re.search(r"k_max = 0\.49|k_max = 0\.50", text) and "beyond the largest fitted size" in text
    assert "left out 1 with flops <= 0" in text and "validation: fitted without N = 1.4e+10" in text


def test_fit_cross_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    paths = write_sized_runs(tmp_path, {"a": 1e9, "b": 2e9})
    assert main(["fit-cross", *paths, "--size", "a=1B"]) == 2
    assert "b (" in (err := capsys.readouterr().err) and "no model size; pass --size b=N" in err
    assert main(["fit-cross", *paths, "--size", "a=1B", "--size", "b=2B", "--size", "zz=3B"]) == 2
    assert "--size zz: no run has this label" in capsys.readouterr().err
    assert main(["fit-cross", *paths, "--size", "a=1B", "--size", "b=2B", "--validate"]) == 2
    assert "at least three model sizes" in capsys.readouterr().err
    assert main(["fit-cross", paths[0], "--size", "a=1B"]) == 2
    assert "at least two model sizes" in capsys.readouterr().err
