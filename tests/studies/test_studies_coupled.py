"""Coupled-axis studies (`scalerl ablate --coupled`), the compute-optimal choice per budget (IsoCompute)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
from study_helpers import FakeTrain, sigmoid

import scalerl.cli
from scalerl.studies.ablate import base_config, plan_ablation, run_ablation
from scalerl.studies.fitting import FitSettings
from scalerl.studies.variants import apply_variant, coupled_variants

SETTINGS = FitSettings(x="compute_device_hours", n_boot=50)


def test_generations_per_prompt_keeps_n_times_b() -> None:
    base = base_config("scalerl", [], [])
    total = base.generation.n * base.pipeline.prompts_per_step
    variants = coupled_variants(base, "generations_per_prompt")
    assert [v.name for v in variants] == ["n4-B16", "n8-B8", "n16-B4"]
    for v in variants:
        cfg = apply_variant(base, v)
        assert cfg.generation.n * cfg.pipeline.prompts_per_step == total
    assert [v.name for v in coupled_variants(base, "generations_per_prompt", [2, 32])] == ["n2-B32", "n32-B2"]
    with pytest.raises(ValueError, match=r"per prompt 3: does not divide the total batch n x B = 64"):
        coupled_variants(base, "generations_per_prompt", [3, 8])
    with pytest.raises(ValueError, match="needs n >= 2"):
        coupled_variants(base, "generations_per_prompt", [1, 8])


def test_batch_size_and_generation_length() -> None:
    base = base_config("scalerl", [], [])
    assert [apply_variant(base, v).pipeline.prompts_per_step for v in coupled_variants(base, "batch_size")] \
        == [4, 8, 16]
    lengths = {v.name: apply_variant(base, v) for v in coupled_variants(base, "generation_length")}
    assert list(lengths) == ["len80", "len160", "len320"]
    for cfg in lengths.values():  # the interruption budgets move with the response budget
        f = cfg.generation.max_new_tokens / base.generation.max_new_tokens
        lc, lc0 = cfg.generation.length_control, base.generation.length_control
        assert list(lc.think_budget) == [round(lc0.think_budget[0] * f), round(lc0.think_budget[1] * f)]
        assert lc.answer_budget == round(lc0.answer_budget * f)
    assert lengths["len160"].model_dump() == base.model_dump()  # the base's own value changes nothing
    with pytest.raises(ValueError, match="too short for the interruption budgets"):
        coupled_variants(base, "generation_length", [1, 160])  # budgets rounded up to 1 + 1 > 1
    with pytest.raises(ValueError, match="unknown axis 'lr'"):
        coupled_variants(base, "lr")
    with pytest.raises(ValueError, match="at least two values"):
        coupled_variants(base, "batch_size", [8])
    with pytest.raises(ValueError, match="given twice"):
        coupled_variants(base, "batch_size", [8, 8])


# Fewer generations per prompt (more prompts) rise early; more generations reach higher (a crossover).
CURVES = {4: (0.55, 2.5, 20.0), 8: (0.62, 2.0, 40.0), 16: (0.72, 1.6, 80.0)}


def n_curve(cfg):  # type: ignore[no-untyped-def]
    return CURVES[cfg.generation.n]


def test_coupled_study_reports_the_compute_optimal_choice(tmp_path: Path) -> None:
    plan = plan_ablation("scalerl", coupled="generations_per_prompt", study_dir=tmp_path,
                         overrides=["model.name_or_path=some/model"])
    assert plan.kind == "coupled" and plan.coupled == "generations_per_prompt"
    out = io.StringIO()
    budgets = [10.0, 30.0, 150.0, 400.0]
    train = FakeTrain(n_curve, noise=0.002)
    assert run_ablation(plan, SETTINGS, train_fn=train, out=out, budgets=budgets) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    choices = summary["compute_optimal"]
    assert [c["budget"] for c in choices] == budgets
    # The closed-form truth: the variant whose true sigmoid is highest at each budget.
    names = {4: "n4-B16", 8: "n8-B8", 16: "n16-B4"}
    for c in choices:
        truth = {names[n]: float(sigmoid(np.array([c["budget"]]), A, B, C, 0.2)[0])
                 for n, (A, B, C) in CURVES.items()}
        ranked = sorted(truth, key=lambda k: -truth[k])
        assert c["best"] == ranked[0]
        assert [v["variant"] for v in c["ranked"]] == ranked
        fitted = {v["variant"]: v["reward"] for v in c["ranked"]}
        assert all(abs(fitted[k] - truth[k]) < 0.03 for k in truth)
    assert choices[0]["best"] == "n4-B16" and choices[-1]["best"] == "n16-B4"
    assert choices[-1]["ranked"][0]["extrapolated"] is True  # 400 is past every run's last point (200)
    assert choices[0]["separated"] is True
    text = out.getvalue()
    assert "Compute-optimal variant per budget" in text and "n16-B4" in text
    report = (tmp_path / "report.md").read_text()
    assert "# Ablation study (coupled-axis: generations_per_prompt)" in report
    assert "## Compute-optimal choice per budget (IsoCompute)" in report
    # Default budgets: five, spread in log compute over the study's range.
    plan2 = plan_ablation("scalerl", coupled="generations_per_prompt", study_dir=tmp_path / "b",
                          overrides=["model.name_or_path=some/model"])
    run_ablation(plan2, SETTINGS, train_fn=FakeTrain(n_curve, noise=0.002), out=io.StringIO())
    default = json.loads((tmp_path / "b" / "summary.json").read_text())["compute_optimal"]
    assert len(default) == 5 and default[0]["budget"] == pytest.approx(10.0)
    assert default[-1]["budget"] == pytest.approx(200.0)


def test_loo_studies_have_no_budget_table(tmp_path: Path) -> None:
    plan = plan_ablation("scalerl", loo=True, axes=["loss"], study_dir=tmp_path,
                         overrides=["model.name_or_path=some/model"])
    run_ablation(plan, SETTINGS, train_fn=FakeTrain(), out=io.StringIO())
    assert json.loads((tmp_path / "summary.json").read_text())["compute_optimal"] is None


def test_coupled_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    main = scalerl.cli.main
    assert main(["ablate", "--coupled", "batch_size", "--values", "4,32", "--dry-run",
                 "--output-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "coupled-axis (batch_size) study" in out and "B4" in out and "B32" in out
    assert main(["ablate", "--coupled", "generations_per_prompt", "--values", "3,8", "--dry-run"]) == 2
    assert "does not divide the total batch" in capsys.readouterr().err
    assert main(["ablate", "--coupled", "batch_size", "--values", "4,x", "--dry-run"]) == 2
    assert "--values: expected integers" in capsys.readouterr().err
    assert main(["ablate", "--loo", "--values", "4,8", "--dry-run"]) == 2
    assert "needs --coupled" in capsys.readouterr().err
    assert main(["ablate", "--loo", "--coupled", "batch_size", "--dry-run"]) == 2
    assert "choose one study" in capsys.readouterr().err
    assert main(["ablate", "--loo", "--budget", "10", "--dry-run"]) == 2
    assert "--budget" in capsys.readouterr().err
