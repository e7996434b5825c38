"""`scalerl fit-cross --budget C`: which model size N for a budget, from the fitted law (Tan et al.).

The reference is the law written out here with its own arithmetic: at a fixed budget C,
log10 L(N, C) = k(N) (c0 + r log10 N - log10 C) with k(N) = k_max N / (N + N0); setting its
derivative in u = log10 N to zero gives the budget at which N is optimal in closed form,
log10 C*(N) = c0 + r log10 N + r (N + N0) / (N0 ln 10).
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest

from scalerl.cli import main
from scalerl.scaling.cross_model import fit_cross_model, optimal_size

K_MAX, N0, C0, R = 0.5, 5e9, 9.0, 0.7
SIZES = {"m05": 0.5e9, "m15": 1.5e9, "m3": 3e9, "m7": 7e9, "m14": 14e9}


def true_pass(N: float, X: np.ndarray) -> np.ndarray:
    k = K_MAX * N / (N + N0)
    return 1.0 - 10.0 ** (k * (C0 + R * math.log10(N) - np.log10(X)))


def budget_where_optimal(N: float) -> float:
    """The closed-form budget at which N maximizes the pass rate (module docstring)."""
    return 10.0 ** (C0 + R * math.log10(N) + R * (N + N0) / (N0 * math.log(10.0)))


def write_runs(root: Path, noise: float = 0.002) -> list[str]:
    """Runs drawn from the law; each size from twice its pivot X* = 10^c0 N^r (where L < 1) to 1e20."""
    rng = np.random.default_rng(5)
    paths = []
    for label, N in SIZES.items():
        X = np.geomspace(2.0 * 10.0 ** (C0 + R * math.log10(N)), 1e20, 15)
        loss = (1.0 - true_pass(N, X)) * 10.0 ** rng.normal(0, noise, X.size)
        rows = [{"step": i, "flops": float(x), "val_pass_rate": float(1 - v)}
                for i, (x, v) in enumerate(zip(X, loss, strict=True))]
        path = root / f"{label}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        paths.append(str(path))
    return paths


def size_args() -> list[str]:
    return [a for label, N in SIZES.items() for a in ("--size", f"{label}={N:g}")]


def test_the_closed_form_is_the_argmax_of_the_written_law() -> None:
    """The reference itself: at C*(4B) the written law's pass rate peaks at 4B on a fine grid."""
    C = budget_where_optimal(4e9)
    Ns = np.geomspace(1e9, 16e9, 2001)
    passes = np.array([true_pass(n, np.array([C]))[0] for n in Ns])
    assert Ns[int(np.argmax(passes))] == pytest.approx(4e9, rel=0.01)


def test_fit_cross_picks_the_size_the_law_says(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    paths = write_runs(tmp_path)
    C = budget_where_optimal(4e9)  # 4B: between the fitted 3B and 7B, not one of them
    assert main(["fit-cross", *paths, *size_args(), "--budget", f"{C:.6g}", "--json"]) == 0
    (choice,) = json.loads(capsys.readouterr().out)["size_choices"]
    assert choice["N"] == pytest.approx(4e9, rel=0.1)
    assert choice["pass_rate"] == pytest.approx(float(true_pass(4e9, np.array([C]))[0]), abs=0.01)
    assert not choice["extrapolated"] and not choice["at_edge"] and not choice["budget_outside"]
    assert choice["candidates"] is None

    # Candidates: the written law's argmax among them; 32B lies outside the fitted sizes.
    cands = [1e9, 2e9, 4e9, 8e9, 32e9]
    C2 = budget_where_optimal(20e9)  # the optimum moves past the largest fitted size
    truth = max(cands, key=lambda n: float(true_pass(n, np.array([C2]))[0]))
    assert truth == 32e9  # the reference's answer (20B is optimal, 32B the nearest candidate above)
    assert main(["fit-cross", *paths, *size_args(), "--budget", f"{C2:.6g}", "--sizes", "1B,2B,4B,8B,32B",
                 "--json"]) == 0
    (pick,) = json.loads(capsys.readouterr().out)["size_choices"]
    assert pick["N"] == truth and pick["extrapolated"] is True
    assert [c["N"] for c in pick["candidates"]] == cands
    for c in pick["candidates"]:
        assert c["pass_rate"] == pytest.approx(float(true_pass(c["N"], np.array([C2]))[0]), abs=0.02)

    # Without candidates, the continuous search stops at the largest fitted size and says so.
    assert main(["fit-cross", *paths, *size_args(), "--budget", f"{C2:.6g}", "--budget", f"{C:.6g}"]) == 0
    text = capsys.readouterr().out
    assert "compute-optimal size at flops = " in text and "N = 1.4e+10" in text
    assert main(["fit-cross", *paths, *size_args(), "--budget", f"{C:.6g}", "--sizes", "4B,32B"]) == 0
    text32 = capsys.readouterr().out  # at C*(4B), 32B has not reached its pivot: its "pass rate" is < 0
    assert re.search(r"3\.2e\+10\s+-0\.\d+\s+extrapolation; budget below its pivot", text32)
    assert "on the edge of the fitted sizes" in text and re.search(r"N = (3\.9\de\+09|4\.0\de\+09)", text)


def test_optimal_size_flags_a_budget_outside_the_fitted_range() -> None:
    runs = []
    for N in SIZES.values():
        X = np.geomspace(2.0 * 10.0 ** (C0 + R * math.log10(N)), 1e20, 15)
        runs.append((N, X, true_pass(N, X)))
    law = fit_cross_model(runs)
    assert law.x_range == pytest.approx((min(r[1][0] for r in runs), 1e20))
    assert optimal_size(law, 1e22).budget_outside and not optimal_size(law, 1e18).budget_outside
    with pytest.raises(ValueError, match="budget must be a positive"):
        optimal_size(law, 0.0)


def test_fit_cross_budget_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    paths = write_runs(tmp_path)
    assert main(["fit-cross", *paths, *size_args(), "--sizes", "1B,2B"]) == 2
    assert "--sizes lists the candidate sizes of --budget" in capsys.readouterr().err
    assert main(["fit-cross", *paths, *size_args(), "--budget", "1e18", "--sizes", "1B,huge"]) == 2
    assert "--sizes: model size 'huge'" in capsys.readouterr().err
    assert main(["fit-cross", *paths, *size_args(), "--budget", "-5"]) == 2
    assert "--budget -5.0: must be a positive flops" in capsys.readouterr().err
