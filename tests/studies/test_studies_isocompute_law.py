"""The n*(C) law and the IsoCompute recipe of `scalerl ablate` on fake study folders whose held-out
curves are known sigmoids: the reference is the argmax of those sigmoids, computed here."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import numpy as np
import pytest
from study_helpers import FakeTrain, sigmoid, write_curve

import scalerl.cli
from scalerl.config import RunConfig
from scalerl.studies.ablate import plan_ablation, run_ablation
from scalerl.studies.fitting import FitSettings

SETTINGS = FitSettings(x="compute_device_hours", n_boot=50)
MODEL = "model.name_or_path=some/model"
# (A, B, C_mid) by generations per prompt: fewer samples per prompt rise early, more reach higher.
CURVES = {4: (0.55, 2.5, 20.0), 8: (0.62, 2.0, 40.0), 16: (0.72, 1.6, 80.0)}


def true_best_n(budget: float) -> int:
    """The n whose true sigmoid is highest at `budget` (R0 = 0.2, as the fake runs are written)."""
    return max(CURVES, key=lambda n: float(sigmoid(np.array([budget]), *CURVES[n], 0.2)[0]))


def n_curve(cfg: RunConfig) -> tuple[float, float, float]:
    return CURVES[cfg.generation.n]


def test_coupled_study_fits_the_law_and_prints_the_recipe(tmp_path: Path) -> None:
    plan = plan_ablation("scalerl", coupled="generations_per_prompt", study_dir=tmp_path, overrides=[MODEL])
    out = io.StringIO()
    assert run_ablation(plan, SETTINGS, train_fn=FakeTrain(n_curve, noise=0.002), out=out,
                        budgets=[12.0, 150.0]) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    ns = summary["n_star"]
    assert len(ns["budgets"]) == 25 and ns["budgets"][0] == pytest.approx(10.0)
    truth = [true_best_n(b) for b in ns["budgets"]]
    assert truth[0] == 4 and truth[-1] == 16  # the reference moves through all three values
    assert sum(a != b for a, b in zip(ns["n_star"], truth, strict=True)) <= 1  # at most one near a crossover
    law = ns["law"]
    assert law["n_lo"] == pytest.approx(4.0, rel=0.15) and law["n_hi"] == pytest.approx(16.0, rel=0.15)
    crossings = [b for b, a, c in zip(ns["budgets"], truth, truth[1:], strict=False) if a != c]
    assert crossings[0] <= law["C_mid"] <= ns["budgets"][truth.index(16)]  # between the crossovers
    # The recipe: n from the law, B = 64 / n (n x B fixed), M = budget / 10 (every fake run: 10 per step).
    r12, r150 = summary["recipes"]
    for r, budget in ((r12, 12.0), (r150, 150.0)):
        assert r["n"] == true_best_n(budget) and r["B"] == 64 // r["n"]
        assert r["variant"] == f"n{r['n']}-B{64 // r['n']}"
        assert r["compute_per_step"] == pytest.approx(10.0) and r["steps"] == pytest.approx(budget / 10.0)
        assert r["extrapolated"] is False
    assert 2 ** round(math.log2(r150["n_law"])) == r150["n"]
    text = out.getvalue()
    assert "Optimal generations per prompt n*(C) (IsoCompute)" in text
    assert "IsoCompute recipe at compute_device_hours = 150" in text and "15 steps" in text
    report = (tmp_path / "report.md").read_text()
    assert "## The n*(C) law and the IsoCompute recipe" in report


class GridTrain(FakeTrain):
    """n x B grid: the curve by n; a step costs n x B / 6.4 (10 at n x B = 64). Not stable: B = 4
    runs truncate 30% of their samples (the instability flag); n = 16, B = 8 collapses at its last
    evaluation (0.25 below its curve, after the fit window)."""

    def __call__(self, cfg: RunConfig, run_dir: Path, *, resume: Path | None = None,
                 device: str | None = None) -> int:
        A, B, C_mid = CURVES[cfg.generation.n]
        per_step = cfg.generation.n * cfg.pipeline.prompts_per_step / 6.4
        write_curve(Path(run_dir), cfg, A, B, C_mid, span=20 * per_step, noise=0.002,
                    seed=sum(map(ord, cfg.name)))
        if cfg.pipeline.prompts_per_step == 4:
            path = Path(run_dir) / "metrics.jsonl"
            rows = [json.loads(line) for line in path.read_text().splitlines()]
            for row in rows:
                if row["kind"] == "step":
                    row["truncation_rate"] = 0.3
            path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        if (cfg.generation.n, cfg.pipeline.prompts_per_step) == (16, 8):
            path = Path(run_dir) / "metrics.jsonl"
            rows = [json.loads(line) for line in path.read_text().splitlines()]
            rows[-1]["val_pass_rate"] -= 0.25
            path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        return 0


def test_the_recipe_takes_the_smallest_stable_batch(tmp_path: Path) -> None:
    plan = plan_ablation("scalerl", grid=["generation.n=4,16", "pipeline.prompts_per_step=4,8,16"],
                         study_dir=tmp_path, overrides=[MODEL])
    assert run_ablation(plan, SETTINGS, train_fn=GridTrain(), out=io.StringIO(), budgets=[400.0]) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    stable = {v["variant"]: v["stable"] for v in summary["n_star"]["variants"]}
    assert stable == {"n-4__prompts_per_step-4": False, "n-4__prompts_per_step-8": True,
                      "n-4__prompts_per_step-16": True, "n-16__prompts_per_step-4": False,
                      "n-16__prompts_per_step-8": False, "n-16__prompts_per_step-16": True}
    why = {v["variant"]: v["why_not"] for v in summary["n_star"]["variants"]}
    assert "training truncation rate passed 10%" in why["n-16__prompts_per_step-4"]
    assert "fell below its fit's band" in why["n-16__prompts_per_step-8"]
    (r,) = summary["recipes"]
    assert r["n"] == 16 == true_best_n(400.0)
    assert r["B"] == 16  # B = 4 truncates, B = 8 collapsed: 16 is the smallest stable batch
    assert r["compute_per_step"] == pytest.approx(16 * 16 / 6.4) and r["steps"] == pytest.approx(400 / 40.0)


def test_a_study_without_an_n_axis_has_no_law(tmp_path: Path) -> None:
    plan = plan_ablation("scalerl", coupled="batch_size", study_dir=tmp_path, overrides=[MODEL])
    run_ablation(plan, SETTINGS, train_fn=FakeTrain(), out=io.StringIO(), budgets=[100.0])
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["n_star"] is None and summary["recipes"] == []


def test_the_command_prints_the_recipe_for_a_study_folder(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """`scalerl ablate` on a study folder whose runs are complete: it refits them and prints the law and
    the recipe (the completed runs are skipped, nothing trains)."""
    plan = plan_ablation("scalerl", coupled="generations_per_prompt", study_dir=tmp_path, overrides=[MODEL])
    assert run_ablation(plan, SETTINGS, train_fn=FakeTrain(n_curve, noise=0.002), out=io.StringIO()) == 0
    argv = ["ablate", "--coupled", "generations_per_prompt", "--output-dir", str(tmp_path), MODEL,
            "--bootstrap", "50", "--budget", "150", "--device", "cpu"]
    assert scalerl.cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "law: log2 n*(C) = log2 n_lo + (log2 n_hi - log2 n_lo) / (1 + (C_mid / C)^b)" in out
    assert "IsoCompute recipe at compute_device_hours = 150" in out
    assert f"  n = {true_best_n(150.0)} (n*(C) = " in out and "M = 150 / 10 per step = 15 steps" in out
    assert scalerl.cli.main([*argv[:-4], "--budget", "-3", "--device", "cpu"]) == 2
    assert "--budget: must be a positive compute" in capsys.readouterr().err
