"""Data reuse (Tan et al. 2025: D_total = tau x D_unique): the `data_reuse` coupled axis of
`scalerl ablate`, `data.max_train_prompts`, and a real run that trains on only those prompts."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from study_helpers import TINY_OVERRIDES, FakeTrain

import scalerl.cli
from scalerl.assembly.build import build_training
from scalerl.config import ConfigError, load_config
from scalerl.data.records import PromptRecord
from scalerl.data.rejects import DataError
from scalerl.data.split import unique_subset
from scalerl.studies.ablate import base_config, plan_ablation, run_ablation
from scalerl.studies.fitting import FitSettings
from scalerl.studies.variants import apply_variant, coupled_variants


def test_the_axis_keeps_the_total_and_divides_the_unique_prompts() -> None:
    base = base_config("scalerl", [], ["max_steps=120"])
    total = 120 * base.pipeline.prompts_per_step  # D_total = max_steps x prompts per step = 960
    assert total == 960
    variants = coupled_variants(base, "data_reuse")
    assert [v.name for v in variants] == ["tau1-U960", "tau2-U480", "tau4-U240", "tau8-U120"]
    for v, tau in zip(variants, (1, 2, 4, 8), strict=True):
        cfg = apply_variant(base, v)
        assert cfg.data.max_train_prompts == total / tau
        assert cfg.max_steps * cfg.pipeline.prompts_per_step == total  # the total is the base's
        assert cfg.model_copy(update={"data": base.data}).model_dump() == base.model_dump()  # nothing else
    odd = coupled_variants(base, "data_reuse", [3, 5])
    assert [apply_variant(base, v).data.max_train_prompts for v in odd] == [320, 192]
    with pytest.raises(ValueError, match=r"reuse factor 7: does not divide the total prompts D_total = 960"):
        coupled_variants(base, "data_reuse", [1, 7])
    with pytest.raises(ValueError, match="reuse factor 0: must be >= 1"):
        coupled_variants(base, "data_reuse", [0, 2])
    with pytest.raises(ConfigError, match="max_train_prompts"):
        load_config(overrides=["data.max_train_prompts=0"])


def _records(ids: list[str]) -> list[PromptRecord]:
    return [PromptRecord(id=i, prompt=f"q {i}", answer="1", task="math") for i in ids]


def test_unique_subset_is_nested_ordered_and_independent_of_file_order() -> None:
    ids = [f"p{i:03d}" for i in range(50)]
    records = _records(ids)
    sub10 = unique_subset(records, 10, seed=0)
    sub20 = unique_subset(records, 20, seed=0)
    assert len(sub10) == 10 and len({r.id for r in sub10}) == 10
    assert {r.id for r in sub10} <= {r.id for r in sub20}  # nested: tau 8's prompts are among tau 4's
    assert [r.id for r in sub10] == sorted(r.id for r in sub10)  # input order kept (the input is sorted)
    shuffled = list(reversed(records))
    assert {r.id for r in unique_subset(shuffled, 10, seed=0)} == {r.id for r in sub10}
    assert {r.id for r in unique_subset(records, 10, seed=1)} != {r.id for r in sub10}
    assert {r.id for r in sub10} != set(ids[:10])  # a random subset, not the first rows of the file
    assert len(unique_subset(records, 50, seed=0)) == 50
    with pytest.raises(DataError, match=r"data\.max_train_prompts: 51 unique training prompts asked for"):
        unique_subset(records, 51, seed=0)


def test_a_run_trains_on_max_train_prompts_prompts_only(tmp_path: Path, tiny_model: str) -> None:
    """The wiring: 4 steps x 2 prompts = 8 draws. With the key the 8 draws reuse 3 prompts; without
    it (36 training prompts) they would be 8 different ones."""
    overrides = [*TINY_OVERRIDES, f"model.name_or_path={tiny_model}", "max_steps=4", "eval.every=4",
                 "data.max_train_prompts=3", "algorithm.no_positive_resampling=false",
                 "pipeline.off_policy=sync"]
    cfg = load_config(overrides=overrides)
    with build_training(cfg, tmp_path / "run", device="cpu", checkpoints=False) as run:
        assert len(run.pool) == 3
        heldout = {r.id for r in run.heldout}
        run.driver.run()
        trained = set(run.pool.history.records)
        assert run.pool.counters["prompts_drawn"] >= 8
    assert len(trained) == 3 and not trained & heldout
    data = json.loads((tmp_path / "run" / "resolved.json").read_text())["data"]
    assert data == {"usable_prompts": 36, "max_train_prompts": 3, "left_out_by_max_train_prompts": 33,
                    "training_prompts": 3}


def test_asking_for_more_unique_prompts_than_there_are_fails_before_work(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # 40 synthetic prompts, 4 held out: 36 can train; tau 1 of 20 steps x 2 prompts asks for 40.
    args = ["ablate", "--coupled", "data_reuse", "--values", "1,2", "--output-dir", str(tmp_path / "s"),
            *TINY_OVERRIDES, "max_steps=20", "model.name_or_path=some/model"]
    assert scalerl.cli.main(args) == 2
    err = capsys.readouterr().err
    assert "data.max_train_prompts: 40 unique training prompts asked for" in err and "at most 36" in err
    assert not (tmp_path / "s" / "runs").exists()


def test_a_data_reuse_study_reports_A_and_B_per_tau(tmp_path: Path) -> None:
    plan = plan_ablation("scalerl", coupled="data_reuse", study_dir=tmp_path,
                         overrides=["model.name_or_path=some/model", "max_steps=64"])
    # Fake curves: tau up to 4 changes nothing, tau 8 lowers the asymptote.
    A = {64 * 8: 0.7, 256: 0.7, 128: 0.7, 64: 0.55}
    train = FakeTrain(lambda cfg: (A[cfg.data.max_train_prompts], 1.5, 40.0), noise=0.002)
    out = io.StringIO()
    assert run_ablation(plan, FitSettings(x="compute_device_hours", n_boot=50), train_fn=train, out=out) == 0
    rows = {v["variant"]: v for v in json.loads((tmp_path / "summary.json").read_text())["variants"]}
    assert list(rows) == ["tau1-U512", "tau2-U256", "tau4-U128", "tau8-U64"]
    assert all(rows[k]["A"] == pytest.approx(0.7, abs=0.03) for k in ("tau1-U512", "tau2-U256", "tau4-U128"))
    assert rows["tau8-U64"]["A"] == pytest.approx(0.55, abs=0.03)
    assert all(rows[k]["B"] == pytest.approx(1.5, rel=0.2) for k in rows)
    assert "tau8-U64" in out.getvalue()
