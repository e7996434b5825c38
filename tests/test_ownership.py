"""No command writes into a folder (or over a file) it did not create (`scalerl.ownership`).

Each command is pointed at a folder that holds a user's files (or at an existing file): it exits 2
naming the folder and the flag that chooses another, before any work, and every file in the way
is left byte for byte as it was. A folder claimed by an earlier command of the same kind is
accepted; another command's folder is not.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import scalerl.assembly.warm_start as ws_mod
from scalerl.cli import main
from scalerl.ownership import (
    OWNER_FILE,
    OwnershipError,
    check_output_dir_owned,
    check_output_file,
    claim_output_dir,
    earlier_output,
    owner_of,
)

USER_FILES = {"thesis.tex": b"\\documentclass{article}\n", "data/raw.bin": bytes(range(256)),
              ".git/HEAD": b"ref: refs/heads/main\n"}
CURVE = "".join(f'{{"step": {i}, "compute_device_hours": {0.1 * i:.1f}, "val_pass_rate": 0.{i}}}\n'
                for i in range(1, 7))
ROWS = '{"prompt": "1+1?", "answer": "2", "task": "math"}\n'
RATED = '{"prompt": "1+1?", "answer": "2", "task": "math", "pass_rate": 0.5}\n'


def _put(root: Path, files: dict[str, bytes]) -> None:
    for name, content in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(content)


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture
def no_work(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("work started before the output folder was checked")

    monkeypatch.setattr(ws_mod, "warm_start_default", refuse)


# (command line with USER for the user's folder, the flag the message must name)
FOLDER_COMMANDS = {
    "train": (["train", "--output-dir", "USER", "--model", "model"], "--output-dir"),
    "sft": (["sft", "--output", "USER"], "--output"),
    "sft-model": (["sft", "--model", "model", "--output", "USER"], "--output"),
    "demo": (["demo", "--output-dir", "USER"], "--output-dir"),
    "ablate": (["ablate", "--loo", "--output-dir", "USER"], "--output-dir"),
}


@pytest.mark.usefixtures("no_work")
@pytest.mark.parametrize("name", list(FOLDER_COMMANDS))
def test_a_folder_of_the_users_is_refused_and_left_as_it_was(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    _put(tmp_path, {"model/config.json": b"{}"})
    user = tmp_path / "USER"
    _put(user, USER_FILES)
    before = _snapshot(tmp_path)
    argv, flag = FOLDER_COMMANDS[name]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"{flag}: USER is not empty and was not made by scalerl" in err, err
    assert f"choose another {flag}" in err and "Traceback" not in err
    assert _snapshot(tmp_path) == before


# (command line, the existing file it would write)
FILE_COMMANDS = {
    "data-synth": (["data", "synth", "--n", "3", "--out", "out.jsonl"], "--out"),
    "data-curate": (["data", "curate", "rated.jsonl", "--out", "out.jsonl"], "--out"),
    "data-difficulty": (["data", "difficulty", "p.jsonl", "--model", "model", "--out", "out.jsonl"], "--out"),
    "fit-plot": (["fit", "m.jsonl", "--plot", "out.jsonl"], "--plot"),
    "compare-plot": (["compare", "m.jsonl", "m2.jsonl", "--plot", "out.jsonl"], "--plot"),
}


@pytest.mark.usefixtures("no_work")
@pytest.mark.parametrize("name", list(FILE_COMMANDS))
def test_an_existing_file_is_replaced_only_with_overwrite(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    _put(tmp_path, {"model/config.json": b"{}", "rated.jsonl": RATED.encode(), "p.jsonl": ROWS.encode(),
                    "m.jsonl": CURVE.encode(), "m2.jsonl": CURVE.encode(), "out.jsonl": b"my own notes\n"})
    before = _snapshot(tmp_path)
    argv, flag = FILE_COMMANDS[name]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"{flag} out.jsonl: exists; pass --overwrite to replace it" in err, err
    assert _snapshot(tmp_path) == before


def test_data_synth_overwrites_when_told(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    out.write_text("old\n")
    assert main(["data", "synth", "--n", "3", "--out", str(out), "--overwrite"]) == 0
    assert len(out.read_text().splitlines()) == 3


def test_the_helper_accepts_new_empty_and_its_own_folders_only(tmp_path: Path) -> None:
    new = claim_output_dir(tmp_path / "a" / "b", "train", "--output-dir")
    assert owner_of(new) == "train" and json.loads((new / OWNER_FILE).read_text())["kind"] == "train"
    (new / "metrics.jsonl").write_text("x\n")
    assert check_output_dir_owned(new, "train", "--output-dir") == new  # its own: accepted
    with pytest.raises(OwnershipError, match=r"output of `scalerl train`; .*choose another --output"):
        check_output_dir_owned(new, "sft", "--output")
    empty = tmp_path / "empty"
    empty.mkdir()
    assert owner_of(claim_output_dir(empty, "sft", "--output")) == "sft"
    (tmp_path / "f").write_text("x")
    with pytest.raises(OwnershipError, match="is a file"):
        check_output_dir_owned(tmp_path / "f", "sft", "--output")
    with pytest.raises(OwnershipError, match=r"is under .*f, which is a file"):
        check_output_dir_owned(tmp_path / "f" / "x", "sft", "--output")
    with pytest.raises(OwnershipError, match="is a directory"):
        check_output_file(tmp_path / "a", "--out")
    assert check_output_file(tmp_path / "f", "--out", overwrite=True) == tmp_path / "f"


def test_save_sft_model_never_deletes_a_folder_it_did_not_write(tmp_path: Path) -> None:
    from scalerl.config import ModelConfig
    from scalerl.training.policy import load_policy
    from scalerl.training.sft import SFT_KIND, save_sft_model

    policy = load_policy(ModelConfig(), device="cpu")
    user = tmp_path / "home"
    _put(user, USER_FILES)
    before = _snapshot(user)
    with pytest.raises(OwnershipError, match="home is not empty"):
        save_sft_model(policy, user, {"x": 1})
    assert _snapshot(user) == before
    out = tmp_path / "sft"
    save_sft_model(policy, out, {"x": 1})
    assert owner_of(out) == SFT_KIND and (out / "config.json").is_file()
    save_sft_model(policy, out, {"x": 2})  # an SFT output of its own: replaced
    assert json.loads((out / "sft_info.json").read_text()) == {"x": 2}


# -- folders written by a scalerl from before the markers (`EARLIER_OUTPUTS`)

EARLIER_STUDY = {"study.json": b'{"kind": "loo", "variants": [], "runs": []}\n',
                 "runs/base/config.yaml": b"name: base\n", "runs/base/metrics.jsonl": b'{"step": 1}\n',
                 "report.md": b"# study\n"}
EARLIER_RUN = {"config.yaml": b"name: r\n", "metrics.jsonl": b'{"step": 1}\n', "checkpoints/step_1/x": b"\0"}
EARLIER_SFT = {"sft_info.json": b'{"steps": 2}', "config.json": b"{}", "model.safetensors": b"\0" * 8}


def test_an_earlier_study_is_adopted_by_ablate_and_marked_nothing_else_changes(tmp_path: Path) -> None:
    study = tmp_path / "study"
    _put(study, EARLIER_STUDY)
    before = _snapshot(study)
    assert earlier_output(study) is not None and earlier_output(study).kind == "ablate"  # type: ignore[union-attr]
    assert claim_output_dir(study, "ablate", "--output-dir") == study
    assert owner_of(study) == "ablate"
    after = _snapshot(study)
    assert set(after) == set(before) | {OWNER_FILE} and {k: after[k] for k in before} == before
    assert earlier_output(study) is None  # marked now: an own folder, no longer an earlier one


@pytest.mark.parametrize("files, looks_like, kind, flag, todo", [
    (EARLIER_STUDY, "ablate", "train", "--output-dir", "scalerl train writes only into a new or empty"),
    (EARLIER_RUN, "train", "train", "--output-dir", "to continue that run, pass it with --resume, or choose "
                                                    "another --output-dir"),
    (EARLIER_RUN, "train", "ablate", "--output-dir", "scalerl ablate writes only into"),
    (EARLIER_SFT, "sft", "sft", "--output", "to replace that model, remove the folder yourself, or choose "
                                            "another --output"),
    (EARLIER_SFT, "sft", "train", "--output-dir", "choose another --output-dir"),
])
def test_other_earlier_outputs_are_refused_saying_what_they_look_like(
        tmp_path: Path, files: dict[str, bytes], looks_like: str, kind: str, flag: str, todo: str) -> None:
    folder = tmp_path / "old"
    _put(folder, files)
    before = _snapshot(tmp_path)
    with pytest.raises(OwnershipError, match=rf"^{flag}: .*old is not empty and looks like the output of an "
                                             rf"earlier scalerl {looks_like} \(it holds .*and no "
                                             rf"\.scalerl-owner\.json\); ") as info:
        claim_output_dir(folder, kind, flag)
    assert todo in str(info.value)
    assert _snapshot(tmp_path) == before


def test_a_users_study_json_is_not_taken_for_a_study(tmp_path: Path) -> None:
    folder = tmp_path / "mine"
    _put(folder, {"study.json": b'{"title": "my own study"}', "notes.txt": b"x"})
    before = _snapshot(tmp_path)
    assert earlier_output(folder) is None
    with pytest.raises(OwnershipError, match=r"mine is not empty and was not made by scalerl"):
        claim_output_dir(folder, "ablate", "--output-dir")
    assert _snapshot(tmp_path) == before
