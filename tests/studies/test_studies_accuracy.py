"""The predictive-accuracy study: per-recipe runs from the demo's settings, the table of absolute
errors (checked against curves whose end is known), reuse of existing runs, argument errors."""

from __future__ import annotations

import importlib.util
import io
import json
from pathlib import Path
from typing import Any

import pytest
from study_helpers import FakeTrain, write_curve

from scalerl.config import RunConfig
from scalerl.studies import accuracy
from scalerl.studies.accuracy import DEFAULT_RECIPES, plan_accuracy, recipe_config, run_accuracy
from scalerl.studies.demo import load_settings
from scalerl.studies.fitting import FitSettings

SETTINGS = FitSettings(x="flops", n_boot=50)


def test_each_recipe_runs_with_the_demo_settings(tmp_path: Path) -> None:
    demo_run = load_settings().settings.run
    specs = plan_accuracy(DEFAULT_RECIPES, tmp_path / "runs", ["optim.lr=3e-5"], max_steps=30)
    assert [s.name for s in specs] == list(DEFAULT_RECIPES)
    by = {s.name: s.config for s in specs}
    assert by["gspo"].algorithm.loss_type == "gspo" and by["scalerl"].algorithm.loss_type == "cispo"
    assert by["qwen_dapo"].pipeline.prompts_per_step == 13  # the recipe's own batch shape survives
    assert all(c.max_steps == 30 and c.optim.lr == 3e-5 for c in by.values())
    assert all(c.eval.every == demo_run["eval"]["every"] for c in by.values())
    assert by["dr_grpo"].output_dir == str(tmp_path / "runs" / "dr_grpo")
    assert by["dr_grpo"].recipe == "dr_grpo"
    assert recipe_config("base", [], None).max_steps == demo_run["max_steps"]


@pytest.mark.parametrize(
    ("recipes", "overrides", "message"),
    [([], [], "no recipe"), (["gspo", "gspo"], [], "given twice"), (["nope"], [], "unknown recipe 'nope'"),
     (["gspo"], ["output_dir=x"], "set by the study")],
)
def test_bad_plans_are_refused(tmp_path: Path, recipes: list[str], overrides: list[str],
                               message: str) -> None:
    with pytest.raises(ValueError, match=message):
        plan_accuracy(recipes, tmp_path, overrides, None)


def test_the_table_reports_each_recipes_extrapolation_error(tmp_path: Path) -> None:
    curves = {"scalerl": (0.62, 1.6, 40.0), "gspo": (0.5, 1.2, 30.0)}
    out = io.StringIO()
    code = run_accuracy(["scalerl", "gspo"], output_dir=tmp_path, settings=SETTINGS,
                        train_fn=FakeTrain(lambda cfg: curves[cfg.recipe]), out=out,
                        overrides=["model.name_or_path=some/model"], command="test")
    assert code == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    runs = {r["recipe"]: r for r in summary["runs"]}
    for recipe in curves:
        r = runs[recipe]
        assert r["status"] == "completed"
        assert r["abs_error"] == pytest.approx(abs(r["predicted"] - r["observed"]))
        assert r["abs_error"] < 0.02 and r["fit"]["A"] == pytest.approx(curves[recipe][0], abs=0.05)
    assert summary["overall"]["n"] == 2 and summary["overall"]["within_tolerance"] == 2
    table = (tmp_path / "accuracy.md").read_text()
    assert "| scalerl |" in table and "| gspo |" in table and "2 of 2 within the paper's +-0.02" in table
    assert "2 of 2 within" in out.getvalue() and (tmp_path / "curves.png").is_file()


def test_existing_runs_are_refitted_without_training(tmp_path: Path) -> None:
    runs = tmp_path / "my_runs"
    write_curve(runs / "scalerl", RunConfig(name="scalerl"), A=0.6, noise=0.002)
    out = io.StringIO()
    code = run_accuracy(["scalerl", "gspo"], output_dir=tmp_path / "out", runs_dir=runs, settings=SETTINGS,
                        train=False, out=out)
    assert code == 0
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    gspo = next(r for r in summary["runs"] if r["recipe"] == "gspo")
    assert "no metrics.jsonl" in gspo["error"] and summary["overall"]["n"] == 1
    assert "not fitted" in out.getvalue()
    with pytest.raises(FileNotFoundError, match="no run to fit"):
        run_accuracy(["gspo"], output_dir=tmp_path / "o2", runs_dir=runs, settings=SETTINGS, train=False)


def _script() -> Any:
    """`benchmarks/predictive_accuracy.py`, the study's command line, imported from its file."""
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "predictive_accuracy.py"
    spec = importlib.util.spec_from_file_location("predictive_accuracy", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_script_reports_bad_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    script = _script()
    assert script.main(["--max-steps", "0"]) == 2
    assert "--max-steps: must be >= 1" in capsys.readouterr().err
    assert script.main(["--recipes", "scalerl,bogus", "--no-train"]) == 2
    assert "unknown recipe 'bogus'" in capsys.readouterr().err
    assert script.main(["--fit-fraction", "0"]) == 2
    assert "fit fraction" in capsys.readouterr().err


def test_the_scripts_overrides_may_stand_anywhere_among_the_flags() -> None:
    args = _script().parse_args(["--max-steps", "140", "eval.every=4", "--recipes", "scalerl",
                                 "--seeds", "3", "optim.lr=1e-5"])
    assert args.overrides == ["eval.every=4", "optim.lr=1e-5"]
    assert (args.max_steps, args.recipes, args.seeds) == (140, "scalerl", 3)


def test_every_recipe_starts_from_the_demo_recipes_warm_start_whatever_the_order(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The warm start's cache key covers `model.fp32_lm_head`, which recipes set differently, so
    taking the first listed recipe's warm start would tie the starting model to the order of
    `--recipes` (dr_grpo first gave another model than scalerl first)."""
    asked: list[RunConfig] = []

    def fake_shared_model(cfg: RunConfig, say: Any = None) -> str:
        asked.append(cfg)
        return "warm/start"

    monkeypatch.setattr(accuracy, "shared_model", fake_shared_model)
    seen: dict[str, str | None] = {}
    curves = {"dr_grpo": (0.6, 1.5, 40.0), "scalerl": (0.62, 1.6, 40.0)}

    fake = FakeTrain(lambda c: curves[c.recipe])

    def train(cfg: RunConfig, run_dir: Path, **kwargs: Any) -> int:
        seen[cfg.recipe] = cfg.model.name_or_path
        return fake(cfg, run_dir, **kwargs)

    assert recipe_config("dr_grpo", [], None).model.fp32_lm_head is False
    run_accuracy(["dr_grpo", "scalerl"], output_dir=tmp_path, settings=SETTINGS, train_fn=train,
                 out=io.StringIO())
    (cfg,) = asked
    assert cfg.recipe == accuracy.WARM_START_RECIPE == "scalerl" and cfg.model.fp32_lm_head is True
    assert seen == {"dr_grpo": "warm/start", "scalerl": "warm/start"}


def test_seeds_report_the_spread_of_the_error_and_of_A_and_B(tmp_path: Path) -> None:
    """3 seeds per recipe (RECIPE-seedI, the RL seeds moved): the spread table matches the per-run
    numbers it summarizes."""
    specs = plan_accuracy(["scalerl", "gspo"], tmp_path / "runs", [], None, seeds=3)
    assert [s.name for s in specs] == [f"{r}-seed{i}" for r in ("scalerl", "gspo") for i in range(3)]
    assert len({s.config.generation.seed for s in specs}) == 3 and len({s.config.seed for s in specs}) == 1
    out = io.StringIO()
    curves = {"scalerl": (0.62, 1.6, 40.0), "gspo": (0.5, 1.2, 30.0)}
    code = run_accuracy(["scalerl", "gspo"], output_dir=tmp_path, settings=SETTINGS, seeds=3,
                        train_fn=FakeTrain(lambda cfg: curves[cfg.recipe], noise=0.01), out=out,
                        overrides=["model.name_or_path=some/model"], command="test")
    assert code == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["seeds"] == 3 and [r["recipe"] for r in summary["seed_spread"]] == ["scalerl", "gspo"]
    for row in summary["seed_spread"]:
        runs = [r for r in summary["runs"] if r["recipe"] == row["recipe"]]
        err = [r["predicted"] - r["observed"] for r in runs]
        A = [r["fit"]["A"] for r in runs]
        mean = sum(A) / 3
        assert row["n"] == 3 and row["error_mean"] == pytest.approx(sum(err) / 3)
        assert row["A_margin"] == pytest.approx(max(abs(a - mean) for a in A))
        assert row["max_abs_error"] == pytest.approx(max(abs(e) for e in err))
    assert "error (mean +- margin)" in out.getvalue()
    assert "Over seeds" in (tmp_path / "accuracy.md").read_text()
    with pytest.raises(ValueError, match="--seeds: must be >= 1"):
        plan_accuracy(["gspo"], tmp_path, [], None, seeds=0)


def test_a_second_batch_of_seeds_is_new_runs(tmp_path: Path) -> None:
    """`--first-seed 3 --seeds 3` plans seeds 3-5: other names and other RL seeds than seeds 0-2
    (generation.seed and data.shuffle_seed moved by the index), the same warm-start/eval seed."""
    first = plan_accuracy(["scalerl"], tmp_path, [], None, seeds=3)
    second = plan_accuracy(["scalerl"], tmp_path, [], None, seeds=3, first_seed=3)
    assert [s.name for s in second] == ["scalerl-seed3", "scalerl-seed4", "scalerl-seed5"]
    base = first[0].config
    assert [s.config.generation.seed for s in second] == [base.generation.seed + i for i in (3, 4, 5)]
    assert [s.config.data.shuffle_seed for s in second] == [base.data.shuffle_seed + i for i in (3, 4, 5)]
    assert {s.config.seed for s in first + second} == {base.seed}
    one = plan_accuracy(["scalerl"], tmp_path, [], None, seeds=1, first_seed=7)
    assert [s.name for s in one] == ["scalerl-seed7"]
    with pytest.raises(ValueError, match="--first-seed: must be >= 0"):
        plan_accuracy(["gspo"], tmp_path, [], None, first_seed=-1)
