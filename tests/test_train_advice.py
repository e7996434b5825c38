"""`scalerl train --print-config` and the warnings for a real model left on tiny defaults."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from scalerl.assembly.advice import TINY_DEFAULTS, tiny_default_advice
from scalerl.cli import main
from scalerl.config import RunConfig, load_config

ROOT = Path(__file__).resolve().parents[1]


def test_print_config_prints_the_resolved_config_and_writes_nothing(tmp_path: Path, monkeypatch,
                                                                   capsys) -> None:
    monkeypatch.chdir(tmp_path)
    argv = ["train", "--recipe", "gspo", "--output-dir", "runs/x", "--print-config", "optim.lr=3e-6"]
    assert main(argv) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["optim"]["lr"] == 3e-6 and printed["algorithm"]["loss_type"] == "gspo"
    assert printed["recipe"] == "gspo" and printed["output_dir"] == "runs/x"
    RunConfig.model_validate(printed)  # it is a whole, valid config
    assert not (tmp_path / "runs").exists()


def test_the_tiny_defaults_listed_are_the_schema_defaults() -> None:
    # The advice names a key as "still at the tiny default" by value: if a default changes, so must this.
    cfg = RunConfig()
    for key, (tiny, _, _) in TINY_DEFAULTS.items():
        node: object = cfg
        for part in key.split("."):
            node = getattr(node, part)
        assert node == tiny, key


def test_a_named_model_on_tiny_defaults_gets_one_line_per_key(tmp_path: Path) -> None:
    assert tiny_default_advice(RunConfig()) == []  # the embedded default: nothing to say
    named = RunConfig.model_validate({"model": {"name_or_path": "some/model"}})  # a Hub id
    lines = tiny_default_advice(named)
    assert [ln.split(" ", 1)[0] for ln in lines] == list(TINY_DEFAULTS)
    for width, advised in ((896, True), (64, False)):  # a local folder: a toy is not advised
        folder = tmp_path / str(width)
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps({"hidden_size": width}))
        cfg = RunConfig.model_validate({"model": {"name_or_path": str(folder)}})
        assert bool(tiny_default_advice(cfg)) is advised, width
    tuned = load_config(ROOT / "examples" / "qwen2.5-0.5b-instruct-gsm8k.yaml",
                        overrides=["model.name_or_path=some/model"])
    assert tiny_default_advice(tuned) == []
