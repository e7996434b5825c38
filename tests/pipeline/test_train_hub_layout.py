"""`scalerl train` on a snapshot folder laid out as the Hub's openai/gsm8k: refused (exit 2, naming
data.subset / data.split) until a config and a split are chosen, then a short run trains on that
split only; evaluation prompts that are also training prompts are reported with their count."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import yaml

from scalerl.cli import main
from tests.data.test_dataset_layouts import make_gsm8k_snapshot
from tests.tiny_runs import warm_tiny_model

from .test_kill_resume import tiny_run_config


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return warm_tiny_model(tmp_path_factory)


def _config(tiny_model: Path, tmp_path: Path, **data: object) -> Path:
    cfg = tiny_run_config(str(tiny_model), tmp_path / "run")
    cfg.max_steps = 2
    raw = cfg.model_dump(mode="json")
    raw["data"] = {"format": "gsm8k", "heldout_size": 2, **data}
    raw["checkpoint"] = {"every": 0}
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_multi_split_snapshot_is_refused_naming_the_key(
    tiny_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    snap = make_gsm8k_snapshot(tmp_path / "gsm8k", readme=False)
    config = _config(tiny_model, tmp_path, train_path=str(snap), subset="main")
    assert main(["train", "--recipe", "base", "-c", str(config)]) == 2
    err = capsys.readouterr().err
    assert "data.train_path" in err
    assert "2 splits in config 'main' 'test', 'train'; choose one with data.split" in err
    assert not (tmp_path / "run").exists()  # nothing half-written
    config = _config(tiny_model, tmp_path, train_path=str(snap), split="train")
    assert main(["train", "--recipe", "base", "-c", str(config)]) == 2
    assert "choose one with data.subset" in capsys.readouterr().err


def test_short_run_on_the_train_split_of_a_hub_layout_snapshot(
    tiny_model: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    snap = make_gsm8k_snapshot(tmp_path / "gsm8k", readme=False, sizes={"train": 12, "test": 4})
    # An extra evaluation set holding 3 of the training questions (case and punctuation changed).
    overlap = tmp_path / "overlap.jsonl"
    rows = [{"prompt": f"[MAIN/TRAIN] what is {i} + {i}", "answer": str(2 * i)} for i in (0, 1, 2)]
    rows.append({"prompt": "An unseen question?", "answer": "1"})
    overlap.write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = _config(tiny_model, tmp_path, train_path=str(snap), subset="main", split="train")
    raw = yaml.safe_load(config.read_text())
    raw["eval"]["extra_sets"] = {"mine": str(overlap),  # and the snapshot's test split, chosen per set
                                 "gsm8k_test": {"path": str(snap), "format": "gsm8k", "subset": "main",
                                                "split": "test"}}
    config.write_text(yaml.safe_dump(raw))
    with caplog.at_level(logging.WARNING, logger="scalerl.assembly.build"):
        assert main(["train", "--recipe", "base", "-c", str(config)]) == 0
    assert "data overlap: 3 of 4 prompts of eval.extra_sets.mine are also training prompts" in caplog.text
    assert "held-out split" not in caplog.text  # the held-out split of a duplicate-free file: no overlap
    run = tmp_path / "run"
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert max(r["step"] for r in steps if "step" in r) == 2
    evals = [r for r in steps if "val_gsm8k_test_pass_rate" in r]
    assert [r["step"] for r in evals] == [0, 2]
    assert "eval.extra_sets.gsm8k_test" not in caplog.text  # main/test shares no question with main/train
    held = json.loads((run / "heldout_ids.json").read_text())
    ids = held["heldout_ids"]
    # Only main/train rows were read: their ids are the train shard's, none from test or socratic.
    assert ids and all(i.startswith("main/train-00000-of-00001:") for i in ids)


def test_eval_and_data_check_choose_a_split_of_the_snapshot(
    tiny_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    snap = make_gsm8k_snapshot(tmp_path / "gsm8k", readme=False)
    base = ["--format", "gsm8k", "--subset", "main"]
    assert main(["data", "check", str(snap), *base]) == 2
    assert "choose one with data.split (--split)" in capsys.readouterr().err
    assert main(["data", "check", str(snap), *base, "--split", "test"]) == 0
    assert ": 3 rows read, 3 records loaded" in capsys.readouterr().out
    evaluate = ["eval", str(tiny_model), "--data", str(snap), *base, "--k", "1", "--json"]
    assert main(evaluate) == 2
    assert "choose one with --split" in capsys.readouterr().err
    assert main([*evaluate, "--split", "test"]) == 0
    assert json.loads(capsys.readouterr().out)["prompts"].startswith("3 prompts of ")
