"""`scalerl ablate`: the plan (runs and their exact configs), the outputs (Fig. 7 table, summary,
report, plot), failures, resuming, the command line, and one real study on the tiny model."""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path

import pytest
from study_helpers import TINY_OVERRIDES, FakeTrain

import scalerl.cli
from scalerl.cli import ablate as ablate_cli
from scalerl.config import RunConfig, build_config, yaml_layer
from scalerl.recipes import load_recipe_config
from scalerl.studies.ablate import plan_ablation, run_ablation
from scalerl.studies.fitting import FitSettings
from scalerl.studies.variants import apply_variant, loo_axis_names

SETTINGS = FitSettings(x="compute_device_hours", n_boot=50)


def _flat(tree: dict[str, object], prefix: str = "") -> dict[str, object]:
    out: dict[str, object] = {}
    for k, v in tree.items():
        if isinstance(v, dict) and v:
            out.update(_flat(v, f"{prefix}{k}."))  # type: ignore[arg-type]
        else:
            out[f"{prefix}{k}"] = v
    return out


def _diff(a: RunConfig, b: RunConfig) -> set[str]:
    fa, fb = _flat(a.model_dump(mode="json")), _flat(b.model_dump(mode="json"))
    return {k for k in fa if fa[k] != fb[k]}


def test_loo_plan_is_the_base_plus_one_run_per_reverted_axis(tmp_path: Path) -> None:
    plan = plan_ablation("scalerl", loo=True, overrides=["max_steps=40"], study_dir=tmp_path)
    names = [s.name for s in plan.specs]
    assert names == ["scalerl", *(f"loo-{a}" for a in loo_axis_names())]
    base = load_recipe_config("scalerl", overrides=["max_steps=40"])
    by_name = {s.name: s for s in plan.specs}
    # The base run is the recipe with the common overrides; each variant differs from it exactly by
    # its own overrides (plus the run's identity: name, recipe label, directory).
    assert _diff(by_name["scalerl"].config, base) == {"name", "output_dir"}
    for v in plan.variants[1:]:
        expected = apply_variant(base, v.overrides)
        assert _diff(by_name[v.name].config, expected) == {"name", "recipe", "output_dir"}
        assert by_name[v.name].config.recipe == v.name and by_name[v.name].config.max_steps == 40
    assert by_name["loo-off_policy"].config.pipeline.off_policy == "ppo_offpolicy"
    assert by_name["loo-loss"].run_dir == tmp_path / "runs" / "loo-loss"


def test_seeds_repeat_every_variant_with_its_own_rollout_seed(tmp_path: Path) -> None:
    plan = plan_ablation("scalerl", grid=["pipeline.k=1,4"], seeds=3, study_dir=tmp_path)
    assert [s.name for s in plan.specs] == [f"k-{k}-seed{i}" for k in (1, 4) for i in range(3)]
    k1 = [s.config for s in plan.specs[:3]]
    assert [c.generation.seed for c in k1] == [0, 1, 2]
    assert [c.data.shuffle_seed for c in k1] == [0, 1, 2]
    assert {c.seed for c in k1} == {0}  # same warm start and evaluation draws for every seed
    assert {s.group for s in plan.specs[:3]} == {"k-1"} and all(c.pipeline.k == 1 for c in k1)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "choose one study"),
        ({"loo": True, "grid": ["pipeline.k=1,2"]}, "choose one study"),
        ({"grid": ["pipeline.k=1,2"], "axes": ["loss"]}, "needs --loo"),
        ({"loo": True, "seeds": 0}, "--seeds"),
        ({"loo": True, "overrides": ["name=x"]}, "name is set by the study"),
        ({"loo": True, "overrides": ["algorithm.los_type=grpo"]}, "did you mean 'loss_type'"),
        ({"loo": True, "axes": ["los"]}, "unknown leave-one-out axis 'los'"),
        ({"grid": ["pipeline.k=1,0"]}, r"pipeline.k: value 0 is not valid"),
        ({"base": "nope", "loo": True}, "unknown recipe 'nope'"),
        ({"base": "base", "loo": True, "axes": ["loss"]}, "nothing to leave out"),
    ],
)
def test_bad_plans_are_refused_with_the_reason(tmp_path: Path, kwargs: dict[str, object],
                                               message: str) -> None:
    with pytest.raises(ValueError, match=message):
        plan_ablation(study_dir=tmp_path, **kwargs)  # type: ignore[arg-type]


def k_curve(cfg: RunConfig) -> tuple[float, float, float]:
    """A higher max_lag reaches a higher asymptote in this made-up study."""
    return {1: (0.5, 1.5, 40.0), 4: (0.7, 1.5, 40.0)}[cfg.pipeline.k]


def test_a_study_writes_the_table_summary_report_and_plot(tmp_path: Path) -> None:
    plan = plan_ablation("scalerl", grid=["pipeline.k=1,4"], seeds=2, study_dir=tmp_path,
                         overrides=["model.name_or_path=some/model"])
    out = io.StringIO()
    code = run_ablation(plan, SETTINGS, train_fn=FakeTrain(k_curve), out=out)
    assert code == 0
    text = out.getvalue()
    assert "variant" in text and "B @ A=" in text and "k-1" in text and "k-4" in text
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["n_runs"] == 4 and summary["n_failed"] == 0 and summary["failed"] == []
    rows = {v["variant"]: v for v in summary["variants"]}
    assert list(rows) == ["k-1", "k-4"]
    assert abs(rows["k-1"]["A"] - 0.5) < 0.05 and abs(rows["k-4"]["A"] - 0.7) < 0.05
    assert rows["k-4"]["runs"] == ["k-4-seed0", "k-4-seed1"] and rows["k-4"]["A_interval"] is not None
    assert summary["fixed_A"] == pytest.approx((rows["k-1"]["A"] + rows["k-4"]["A"]) / 2)
    run = summary["runs"][0]
    assert run["status"] == "completed" and run["fit"]["A"] > 0 and run["final"]["abs_error"] < 0.05
    report = (tmp_path / "report.md").read_text()
    assert "| k-1 | 2 |" in report and "![fits of every run](curves.png)" in report
    assert (tmp_path / "curves.png").stat().st_size > 10_000
    assert json.loads((tmp_path / "study.json").read_text())["kind"] == "grid"
    # The run directories record the variant as `recipe`, so `scalerl compare` groups their seeds.
    saved = build_config([yaml_layer(tmp_path / "runs" / "k-4-seed1" / "config.yaml")])
    assert saved.recipe == "k-4" and saved.name == "k-4-seed1" and saved.generation.seed == 1
    assert not list(tmp_path.glob(".*.tmp"))


def test_failed_runs_are_counted_named_and_retried_on_rerun(tmp_path: Path) -> None:
    plan = plan_ablation("scalerl", grid=["pipeline.k=1,4"], study_dir=tmp_path,
                         overrides=["model.name_or_path=some/model"])
    out = io.StringIO()
    assert run_ablation(plan, SETTINGS, train_fn=FakeTrain(k_curve, fail={"k-4"}), out=out) == 1
    assert "1 of 2 runs failed" in out.getvalue() and "k-4: RuntimeError: boom in k-4" in out.getvalue()
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["failed"] == ["k-4"] and summary["n_completed"] == 1
    assert [v["variant"] for v in summary["variants"]] == ["k-1"]
    assert "## Failed runs" in (tmp_path / "report.md").read_text()
    retry = FakeTrain(k_curve)
    assert run_ablation(plan, SETTINGS, train_fn=retry, out=io.StringIO()) == 0
    assert retry.names == ["k-4"]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["failed"] == [] and [v["variant"] for v in summary["variants"]] == ["k-1", "k-4"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="scalerl")
    ablate_cli.register(parser.add_subparsers(dest="command"))
    return parser


def test_dry_run_prints_the_plan_and_runs_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = _parser().parse_args(["ablate", "--loo", "--axes", "loss,off_policy", "--output-dir",
                                 str(tmp_path / "s"), "--dry-run", "max_steps=40"])
    assert args.func(args) == 0
    out = capsys.readouterr().out
    assert "3 runs" in out and "loo-loss" in out and "loo-off_policy" in out and "max_steps=40" in out
    assert not (tmp_path / "s").exists()


def test_the_command_reports_bad_input_and_exits_2(monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert "scalerl.cli.ablate" in scalerl.cli.COMMAND_MODULES
    assert scalerl.cli.main(["ablate", "--grid", "pipeline.kk=1,2"]) == 2
    assert "scalerl ablate: error: pipeline.kk: unknown key 'pipeline.kk'" in capsys.readouterr().err
    assert scalerl.cli.main(["ablate", "--loo", "--fit-fraction", "2", "--dry-run"]) == 2
    assert "fit fraction: must be in (0, 1]" in capsys.readouterr().err


def test_a_real_study_on_the_tiny_model(tmp_path: Path, tiny_model: str) -> None:
    """Two real runs through `train_run`: shared warm start, run dirs, statuses, summary."""
    plan = plan_ablation("scalerl", grid=["pipeline.off_policy=sync,pipeline"], study_dir=tmp_path,
                         overrides=[*TINY_OVERRIDES, f"model.name_or_path={tiny_model}"])
    out = io.StringIO()
    assert run_ablation(plan, SETTINGS, device="cpu", out=out) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["n_completed"] == 2 and summary["failed"] == []
    # Three evaluations (steps 0, 1, 2) are too few to fit: reported as not fitted, not as failed.
    assert summary["not_fitted"] == ["off_policy-sync", "off_policy-pipeline"]
    for name in summary["not_fitted"]:
        run_dir = tmp_path / "runs" / name
        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        assert [r["step"] for r in rows if r["kind"] == "eval"] == [0, 1, 2]
        assert json.loads((run_dir / "study_status.json").read_text())["status"] == "completed"
        assert build_config([yaml_layer(run_dir / "config.yaml")]).model.name_or_path == tiny_model
    assert "no run could be fitted" in (tmp_path / "report.md").read_text()


def test_scalerl_ablate_adopts_a_study_folder_of_an_earlier_scalerl(tmp_path: Path) -> None:
    """A study written before the ownership markers (its own files, no .scalerl-owner.json) is marked
    and continued: its completed runs are skipped and their files stay byte for byte."""
    from scalerl.ownership import OWNER_FILE, owner_of

    plan = plan_ablation("scalerl", grid=["pipeline.k=1,4"], study_dir=tmp_path,
                         overrides=["model.name_or_path=some/model"])
    assert run_ablation(plan, SETTINGS, train_fn=FakeTrain(k_curve), out=io.StringIO()) == 0
    (tmp_path / OWNER_FILE).unlink()  # as an earlier scalerl left it

    def run_files() -> dict[str, bytes]:
        return {str(p.relative_to(tmp_path)): p.read_bytes() for p in (tmp_path / "runs").rglob("*")
                if p.is_file()}

    runs = run_files()
    again = FakeTrain(k_curve)
    assert run_ablation(plan, SETTINGS, train_fn=again, out=io.StringIO()) == 0
    assert again.calls == [] and owner_of(tmp_path) == "ablate"
    assert run_files() == runs


def test_a_pruned_study_reports_every_run_and_the_compute_it_used(tmp_path: Path) -> None:
    """`--prune` wiring: the controller watches every run; the summary, report and table say what
    each used (these stand-in runs log no forecast, so none is stopped and nothing is saved)."""
    plan = plan_ablation("scalerl", grid=["pipeline.k=1,4"], study_dir=tmp_path,
                         overrides=["model.name_or_path=some/model"])
    out = io.StringIO()
    assert run_ablation(plan, SETTINGS, train_fn=FakeTrain(k_curve), out=out, prune_margin=0.02) == 0
    prune = json.loads((tmp_path / "summary.json").read_text())["prune"]
    assert [r["run"] for r in prune["runs"]] == ["k-1", "k-4"] and prune["n_pruned"] == 0
    assert all(r["request"] is None for r in prune["runs"]) and prune["margin"] == 0.02
    assert "## Pruning by forecast" in (tmp_path / "report.md").read_text()
    assert "pruning by forecast (margin 0.02" in out.getvalue()
    assert not any((tmp_path / "runs" / n / "stop_request.json").exists() for n in ("k-1", "k-4"))
