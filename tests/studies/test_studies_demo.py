"""`scalerl demo`: its settings file (shipped, validated, errors with file:line), the config it
resolves, the output directory rules, the fit of the first half, and a real short demo."""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path

import pytest
import yaml
from study_helpers import TINY_OVERRIDES, write_curve

from scalerl.cli import demo as demo_cli
from scalerl.config import ConfigError, RunConfig
from scalerl.ownership import OWNER_FILE
from scalerl.studies import demo
from scalerl.studies.demo import MARKER_FILE, demo_config, fit_demo, load_settings, prepare_output_dir


def test_the_shipped_settings_resolve_to_the_demo_run(tmp_path: Path) -> None:
    loaded = load_settings()
    shipped = yaml.safe_load(demo.SETTINGS_FILE.read_text())
    cfg = demo_config(loaded, output_dir=tmp_path / "d")
    assert cfg.recipe == "scalerl" and cfg.name == "demo" and cfg.output_dir == str(tmp_path / "d")
    assert cfg.max_steps == shipped["run"]["max_steps"]
    assert cfg.eval.every == shipped["run"]["eval"]["every"] and cfg.eval.k == shipped["run"]["eval"]["k"]
    assert cfg.data.heldout_size == shipped["run"]["data"]["heldout_size"]
    assert cfg.algorithm.loss_type == "cispo"  # from the recipe
    assert cfg.pipeline.off_policy == "pipeline" and cfg.pipeline.schedule == "interleaved"
    # The demo's task (two levels, one the warm start never shows) and learning rate are its own
    # (demo.yaml says why).
    assert cfg.optim.lr == shipped["run"]["optim"]["lr"] != RunConfig().optim.lr
    syn = shipped["run"]["data"]["synthetic"]
    assert list(cfg.data.synthetic.difficulty) == syn["difficulty"]
    assert cfg.data.synthetic.weights == syn["weights"]
    assert list(cfg.data.synthetic.warm_start_difficulty) == syn["warm_start_difficulty"]
    assert loaded.settings.fit.x == "flops" and loaded.settings.fit.fraction == 0.5
    quick = demo_config(loaded, output_dir=tmp_path / "q", quick=True, seed=3, max_time_s=60.0,
                        overrides=["eval.k=3"])
    assert quick.max_steps == shipped["quick"]["run"]["max_steps"] < cfg.max_steps
    assert quick.eval.every == 1 and quick.eval.k == 3 and quick.seed == 3 and quick.max_time_s == 60.0
    assert quick.data.heldout_size == shipped["quick"]["run"]["data"]["heldout_size"]


def test_bad_settings_name_the_file_line_and_key(tmp_path: Path) -> None:
    bad = tmp_path / "demo.yaml"
    bad.write_text("recipe: scalerl\nfit:\n  fractoin: 0.5\n")
    with pytest.raises(ValueError, match=r"demo.yaml:3: fit.fractoin: unknown key"):
        load_settings(bad)
    bad.write_text("fit:\n  fraction: 1.5\n")
    with pytest.raises(ValueError, match=r"demo.yaml:2: fit.fraction: Input should be less than 1"):
        load_settings(bad)
    bad.write_text("run:\n  eval:\n    every: 0\n")
    with pytest.raises(ConfigError, match=r"demo.yaml:3: eval.every: Input should be greater than or equal"):
        demo_config(load_settings(bad), output_dir=tmp_path)
    with pytest.raises(ValueError, match="output_dir is set by the study"):
        demo_config(load_settings(), output_dir=tmp_path, overrides=["output_dir=elsewhere"])


def test_output_dir_is_replaced_only_if_it_holds_a_demo(tmp_path: Path) -> None:
    other = tmp_path / "mine"
    other.mkdir()
    (other / "precious.txt").write_text("keep")
    with pytest.raises(ValueError, match=r"--output-dir: .*mine is not empty and was not made by scalerl"):
        prepare_output_dir(other)
    assert (other / "precious.txt").read_text() == "keep"
    old = tmp_path / "demo"
    old.mkdir()
    (old / MARKER_FILE).write_text("{}")
    (old / "metrics.jsonl").write_text("old run\n")
    prepare_output_dir(old)
    assert old.is_dir() and [p.name for p in old.iterdir()] == [OWNER_FILE]  # claimed by the new demo
    prepare_output_dir(tmp_path / "new" / "dir")
    assert (tmp_path / "new" / "dir").is_dir()


def test_the_fit_of_the_first_half_predicts_the_end(tmp_path: Path) -> None:
    write_curve(tmp_path / "r", RunConfig(name="demo"), A=0.6, B=1.5, C_mid=40.0, noise=0.002)
    result = fit_demo(tmp_path / "r", "flops", 0.5, 200)
    assert abs(result.error) < 0.02 and result.observed == pytest.approx(0.6, abs=0.05)
    assert float(result.analysis.fit.fit_compute.max()) <= 100e9
    text = demo.render_result(result, RunConfig(name="demo", recipe="scalerl"))
    assert "predicted" in text and "observed" in text and "within the paper's" in text and "A     =" in text
    write_curve(tmp_path / "short", RunConfig(name="demo"), A=0.6, n_evals=6)
    with pytest.raises(ValueError, match=r"2 evaluation\(s\) with flops in .* the fit needs at least 4"):
        fit_demo(tmp_path / "short", "flops", 0.5, 0)


def test_a_short_real_demo(tmp_path: Path, tiny_model: str) -> None:
    settings = tmp_path / "tiny_demo.yaml"
    run: dict[str, object] = {}
    # As in the shipped settings: PipelineRL on the interleaved schedule, so a seed reproduces the run.
    for text in [*TINY_OVERRIDES, f"model.name_or_path={tiny_model}", "max_steps=12",
                 "pipeline.schedule=interleaved"]:
        key, value = text.split("=", 1)
        node = run
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})  # type: ignore[assignment]
        node[leaf] = yaml.safe_load(value)
    settings.write_text(yaml.safe_dump({"fit": {"x": "flops", "fraction": 0.5, "bootstrap": 50}, "run": run}))
    out = io.StringIO()
    code = demo.run_demo(settings_path=settings, output_dir=tmp_path / "demo", seed=1, device="cpu", out=out)
    assert code == 0
    text = out.getvalue()
    assert "predicted" in text and "observed" in text and "fit status" in text
    d = tmp_path / "demo"
    summary = json.loads((d / "summary.json").read_text())
    evals = [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in evals if r["kind"] == "eval"]
    assert [r["step"] for r in evals] == list(range(13))
    assert summary["final"]["observed"] == evals[-1]["val_pass_rate"] and summary["seed"] == 1
    assert summary["final"]["x"] == evals[-1]["flops"] and summary["x"] == "flops"
    assert (d / "fit.png").stat().st_size > 10_000 and "# scalerl demo" in (d / "report.md").read_text()
    # A second demo in the same directory replaces the first, and the same seed reproduces it.
    first = (d / "metrics.jsonl").read_text()
    assert demo.run_demo(settings_path=settings, output_dir=d, seed=1, device="cpu", out=io.StringIO()) == 0
    again = json.loads((d / "summary.json").read_text())
    assert again["final"] == summary["final"] and again["fit"]["A"] == summary["fit"]["A"]

    def curve(text: str) -> list[tuple[int, float, float, float]]:
        rows = [json.loads(line) for line in text.splitlines()]
        return [(r["step"], r["val_pass_rate"], r["val_response_length"], r["flops"])
                for r in rows if r["kind"] == "eval"]

    assert curve((d / "metrics.jsonl").read_text()) == curve(first)


def test_the_command_line_passes_its_options(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, object] = {}
    monkeypatch.setattr(demo_cli, "run_demo", lambda **kw: seen.update(kw) or 0)
    parser = argparse.ArgumentParser(prog="scalerl")
    demo_cli.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["demo", "--quick", "--seed", "4", "--max-time", "30", "max_steps=5"])
    assert args.func(args) == 0
    assert seen["quick"] is True and seen["seed"] == 4 and seen["max_time_s"] == 30.0
    assert seen["overrides"] == ["max_steps=5"] and seen["output_dir"] == "runs/demo"
    with pytest.raises(SystemExit):
        parser.parse_args(["demo", "--max-time", "-1"])


def _summary(seed: int, predicted: float, observed: float, A: float, B: float, reliable: bool) -> dict:
    return {"seed": seed, "final": {"predicted": predicted, "observed": observed},
            "fit": {"A": A, "B": B, "C_mid": 1e12, "diagnostics": {"reliable": reliable},
                    "held_out": {"mae": 0.01}}}


def test_seed_spread_closed_form() -> None:
    rows = [demo.seed_row(_summary(s, p, o, a, 1.0 + 0.1 * s, ok)) for s, (p, o, a, ok) in
            enumerate([(0.60, 0.59, 0.70, True), (0.62, 0.64, 0.72, True), (0.55, 0.60, 0.66, False)])]
    stats = demo.seed_spread_summary(rows)
    assert stats["n_seeds"] == 3 and stats["flagged"] == 1
    assert stats["error"]["min"] == pytest.approx(-0.05) and stats["error"]["max"] == pytest.approx(0.01)
    assert stats["mean_abs_error"] == pytest.approx((0.01 + 0.02 + 0.05) / 3)
    assert stats["within_0.02"] == 2 and stats["within_0.03"] == 2
    assert stats["A"]["mean"] == pytest.approx(0.69333333)
    assert stats["A"]["margin"] == pytest.approx(0.03333333)
    assert stats["B"]["margin"] == pytest.approx(0.1)
    text = demo.render_seeds(rows, stats)
    assert "within +-0.02 on 2 of 3" in text and "FLAGGED" in text and "A = 0.693 +-0.033" in text


def test_first_half_bar_unflagged_against_the_last_three_flagged_against_the_band() -> None:
    """Issue 43's bar per seed: an unflagged fit within +-0.02 of the mean of the last three
    evaluations (not the last one alone), a flagged fit's band holding the final point."""
    def row(predicted: float, observed: float, last3: float, band: list[float], ok: bool) -> demo.SeedRow:
        s = _summary(0, predicted, observed, 0.7, 1.0, ok)
        s["final"].update(last3=last3, band=band)
        return demo.seed_row(s)

    rows = [
        row(0.700, 0.730, 0.715, [0.66, 0.74], True),   # 0.030 from the last point, 0.015 from the last 3
        row(0.700, 0.700, 0.675, [0.66, 0.74], True),   # 0.025 from the last 3: missed
        row(0.800, 0.720, 0.720, [0.70, 0.90], False),  # flagged, final inside its band
        row(0.800, 0.690, 0.690, [0.70, 0.90], False),  # flagged, final below its band: missed
    ]
    assert [r.meets_bar() for r in rows] == [True, False, True, False]
    assert rows[0].error_last3 == pytest.approx(-0.015)
    stats = demo.seed_spread_summary(rows)
    assert (stats["bar_met"], stats["bar_measured"]) == (2, 4)
    text = demo.render_seeds(rows, stats)
    assert "met on 2 of 4" in text and text.count("MISSED") == 2
    assert demo.seed_row(_summary(0, 0.6, 0.6, 0.7, 1.0, True)).meets_bar() is None  # an older summary


def test_seeds_runs_each_seed_in_its_own_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[int, Path]] = []

    def fake_demo(*, output_dir: Path, seed: int, out: io.StringIO, **kw: object) -> int:
        calls.append((seed, Path(output_dir)))
        Path(output_dir).mkdir(parents=True)
        (Path(output_dir) / "summary.json").write_text(json.dumps(_summary(seed, 0.6, 0.6 - 0.01 * seed,
                                                                           0.7, 1.0, True)))
        return 0

    monkeypatch.setattr(demo, "run_demo", fake_demo)
    out = io.StringIO()
    assert demo.run_seeds(n_seeds=3, output_dir=tmp_path / "seeds", seed=2, out=out) == 0
    assert [s for s, _ in calls] == [2, 3, 4] and calls[0][1] == tmp_path / "seeds" / "seed-2"
    saved = json.loads((tmp_path / "seeds" / "seeds.json").read_text())
    assert [r["seed"] for r in saved["seeds"]] == [2, 3, 4]
    assert saved["spread"]["max_abs_error"] == pytest.approx(0.04)
    assert "3 seed(s)" in out.getvalue() and (tmp_path / "seeds" / "seeds.md").is_file()
    # A rerun replaces the whole set (the top directory carries the demo marker).
    assert demo.run_seeds(n_seeds=1, output_dir=tmp_path / "seeds", seed=0, out=io.StringIO()) == 0
    assert sorted(p.name for p in (tmp_path / "seeds").iterdir()) == [OWNER_FILE, MARKER_FILE, "seed-0",
                                                                       "seeds.json", "seeds.md"]
    with pytest.raises(ValueError, match="--seeds must be >= 1"):
        demo.run_seeds(n_seeds=0, output_dir=tmp_path / "x")


def test_the_command_line_passes_seeds(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, object] = {}
    monkeypatch.setattr(demo_cli, "run_seeds", lambda **kw: seen.update(kw) or 0)
    parser = argparse.ArgumentParser(prog="scalerl")
    demo_cli.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["demo", "--seeds", "5", "--seed", "1"])
    assert args.func(args) == 0 and seen["n_seeds"] == 5 and seen["seed"] == 1
