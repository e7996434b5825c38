"""A run folder under careless resumes: another run's checkpoint, a changed config, no manifest.

Each test trains the tiny model for a few steps in process (`scalerl.cli.main`, seconds), then
resumes it the way a careless user would and checks the exit status, the message, and that no
file of either run was created, changed or removed where the resume was refused.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from scalerl.cli import main
from scalerl.scaling.io import read_run_dir
from scalerl.training.checkpoint import MANIFEST_FILE, list_checkpoints, verify_checkpoint

from .helpers import HERE, run_config, write_config

ROOT = Path(__file__).resolve().parents[2]


def _tree(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) if p.is_file() else (-1, 0)
            for p in root.rglob("*")}


def _train(tmp: Path, model: str, name: str, *extra: str, steps: int = 4) -> Path:
    cfg = run_config(model, tmp / name, "sync", max_steps=steps, **{"checkpoint.every": 2, "eval.every": 2})
    config = write_config(cfg, tmp / f"{name}.yaml")
    assert main(["train", "--recipe", "base", "-c", str(config), *extra]) == 0
    return tmp / name


def _cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    try:
        status = main(argv)
    except SystemExit as exit_:  # argparse
        status = int(exit_.code or 0)
    return status, capsys.readouterr().err


def _starts(run: Path) -> list[dict[str, object]]:
    rows = [json.loads(line) for line in (run / "sessions.jsonl").read_text().splitlines()]
    return [r for r in rows if r["event"] == "start"]


@pytest.fixture
def two_runs(tiny_model: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(HERE))  # the parity verifier of the run configs
    return _train(tmp_path, tiny_model, "A"), _train(tmp_path, tiny_model, "B")


def test_another_runs_checkpoint_is_refused_and_nothing_is_touched(
    two_runs: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = two_runs
    b_id = json.loads((b / "run.json").read_text())["run_id"]
    assert b_id != json.loads((a / "run.json").read_text())["run_id"]
    before = _tree(tmp_path)
    status, err = _cli(["train", "--output-dir", "A", "--resume", "B/checkpoints/step_000002",
                        "--max-steps", "8"], capsys)
    assert status == 2, err
    want = rf"--resume: B/checkpoints/step_000002 belongs to run {b_id}, not to the run in A"
    assert re.search(want, err), err
    assert "--resume-from-other" in err and "Traceback" not in err
    assert _tree(tmp_path) == before
    # Into a folder that holds a run, --resume-from-other is refused too: it would mix two runs.
    status, err = _cli(["train", "--output-dir", "A", "--resume", "B/checkpoints/step_000002",
                        "--resume-from-other", "--max-steps", "8"], capsys)
    assert status == 2 and "A already holds a run" in err, err
    assert _tree(tmp_path) == before


def test_resume_from_other_starts_a_new_run_and_leaves_the_parent_alone(
    two_runs: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, b = two_runs
    before_b = _tree(b)
    status, err = _cli(["train", "--output-dir", "C", "--resume", "B/checkpoints/step_000002",
                        "--resume-from-other", "--max-steps", "10"], capsys)
    assert status == 0, err
    c = tmp_path / "C"
    record = json.loads((c / "run.json").read_text())
    assert record["parent"]["run_id"] == json.loads((b / "run.json").read_text())["run_id"]
    assert record["parent"]["step"] == 2 and record["run_id"] != record["parent"]["run_id"]
    assert _starts(c)[0]["parent"] == record["parent"]
    steps = [r["step"] for r in map(json.loads, (c / "metrics.jsonl").read_text().splitlines())
             if r.get("kind") != "eval" and "step" in r]
    assert min(steps) == 3 and max(steps) == 10  # continues the parent's step count
    # Rotation (checkpoint.keep=3) deleted the new run's step 4, and nothing of the parent's.
    assert [s for s, _ in list_checkpoints(c)] == [6, 8, 10]
    assert _tree(b) == before_b  # the parent run is read, never written
    # The new run's own checkpoints are its own: a plain --resume of C takes them.
    status, err = _cli(["train", "--output-dir", "C", "--resume", "C/checkpoints/step_000010",
                        "--max-steps", "12"], capsys)
    assert status == 0, err


def test_a_changed_key_is_named_recorded_and_seen_by_the_curve_reader(
    two_runs: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    a, _ = two_runs
    status, err = _cli(["train", "--output-dir", "A", "--resume", "--max-steps", "6",
                        "generation.n=4", "optim.lr=3e-6"], capsys)
    assert status == 0, err
    assert "train: config change from step 4: generation.n: 2 -> 4" in err, err
    assert "train: config change from step 4: max_steps: 4 -> 6" in err
    start = _starts(a)[-1]
    assert start["from_step"] == 4
    changed = {c["key"]: (c["from"], c["to"]) for c in start["config_changes"]}
    assert set(changed) == {"generation.n", "max_steps", "optim.lr"}
    assert changed["generation.n"] == (2, 4) and changed["max_steps"] == (4, 6)
    assert changed["optim.lr"][1] == 3e-6 and changed["optim.lr"][0] != 3e-6
    assert "n: 4" in (a / "config.yaml").read_text()  # the config the run goes on with
    curve = read_run_dir(a)
    assert {(c["step"], c["key"]) for c in curve.config_changes} == {
        (4, "generation.n"), (4, "max_steps"), (4, "optim.lr")}
    status, err = _cli(["fit", "A"], capsys)
    assert "A changed generation.n from 2 to 4 after step 4" in err, err
    # config.yaml holds the changed config: the next resume lists only what changes then.
    status, err = _cli(["train", "--output-dir", "A", "--resume", "--max-steps", "8", "generation.n=4"],
                       capsys)
    assert status == 0, err
    assert [c["key"] for c in _starts(a)[-1]["config_changes"]] == ["max_steps"]
    assert _starts(a)[-1]["from_step"] == 6


@pytest.mark.parametrize("override, key", [
    ("seed=7", "seed"),
    ("algorithm.loss_type=gspo", "algorithm.loss_type"),
    ("data.heldout_size=2", "data.heldout_size"),
    ("data.synthetic.num_prompts=50", "data.synthetic.num_prompts"),
    ("model.tiny.hidden_size=64", "model.tiny.hidden_size"),
])
def test_a_key_that_cannot_change_mid_run_is_refused(
    two_runs: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], override: str, key: str
) -> None:
    before = _tree(tmp_path)
    status, err = _cli(["train", "--output-dir", "A", "--resume", "--max-steps", "6", override], capsys)
    assert status == 2, err
    want = rf"error: --resume: {re.escape(key)}: .* -> .*: cannot change in a resumed run"
    assert re.search(want, err), err
    assert "max_steps" not in err.split("error:")[1].split("cannot change")[0]  # only the frozen key
    assert _tree(tmp_path) == before


def test_a_checkpoint_without_manifest_is_refused_unless_trusted(
    two_runs: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, _ = two_runs
    manifest = a / "checkpoints" / "step_000004" / MANIFEST_FILE
    manifest.unlink()
    before = _tree(tmp_path)
    for argv in (["train", "--output-dir", "A", "--resume", "--max-steps", "6"],
                 ["train", "--output-dir", "A", "--resume", "A/checkpoints/step_000004", "--max-steps", "6"],
                 ["export", "A/checkpoints/step_000004", "--out", "merged"],
                 ["export", "A", "--out", "merged"]):
        status, err = _cli(argv, capsys)
        assert status == 2, (argv, err)
        assert re.search(r"A/checkpoints/step_000004/manifest\.json: missing, so the checkpoint's files "
                         r"cannot be verified.*--trust-unverified", err), (argv, err)
        assert _tree(tmp_path) == before
    status, err = _cli(["export", "A", "--out", "merged", "--trust-unverified"], capsys)
    assert status == 0 and "unverified" in err, err
    status, err = _cli(["train", "--output-dir", "A", "--resume", "--max-steps", "6", "--trust-unverified"],
                       capsys)
    assert status == 0 and "loading it unverified" in err, err


def test_relative_model_path_is_stored_absolute_and_resumes_from_elsewhere(
    tiny_model: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    os.symlink(tiny_model, work / "m")
    monkeypatch.chdir(work)
    monkeypatch.syspath_prepend(str(HERE))
    cfg = run_config("unused", work / "R", "sync", max_steps=2, **{"checkpoint.every": 2, "eval.every": 2})
    config = write_config(cfg, work / "r.yaml")
    status, err = _cli(["train", "--recipe", "base", "-c", str(config), "--model", "m", "--output-dir", "R"],
                       capsys)
    assert status == 0, err
    saved = (work / "R" / "config.yaml").read_text()
    assert f"name_or_path: {work / 'm'}" in saved, saved
    monkeypatch.chdir(tmp_path)  # elsewhere: `m` means nothing here
    status, err = _cli(["train", "--output-dir", str(work / "R"), "--resume", "--max-steps", "4"], capsys)
    assert status == 0, err
    assert "config change" in err and "model" not in err.split("config change")[1].split("\n")[0]


def test_a_resave_killed_between_its_renames_keeps_one_good_copy(tmp_path: Path) -> None:
    """A process saves step 1, then saves it again and is killed (os._exit) between the rename of
    the old copy aside and the rename of the new one into place."""
    script = f"""
import os, sys
from pathlib import Path
from scalerl.training import checkpoint as ck

run = Path({str(tmp_path)!r})
def save(tag):
    tmp, final = ck.begin_checkpoint(run, 1, None, token=tag)
    tmp.mkdir()
    (tmp / "weights.bin").write_text(tag)
    ck.write_state(tmp, 1, None, {{"tag": tag}})
    return ck.finish_checkpoint(tmp, final, run, None)
save("old")
real = os.replace
calls = []
def replace(src, dst):
    calls.append(1)
    real(src, dst)
    if len(calls) == 1:
        os._exit(9)  # killed between the two renames
ck.os.replace = replace
save("new")
"""
    done = subprocess.run([sys.executable, "-c", script], env={**os.environ, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, check=False)
    assert done.returncode == 9, done.stderr
    found = list_checkpoints(tmp_path)
    assert [s for s, _ in found] == [1]
    assert verify_checkpoint(found[0][1]) and (found[0][1] / "weights.bin").read_text() == "old"
    # The next save puts the old copy back in place first, then proceeds as usual.
    from scalerl.training.checkpoint import begin_checkpoint

    begin_checkpoint(tmp_path, 2, None, token="x")
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert names == ["step_000001"], names
    assert (tmp_path / "checkpoints" / "step_000001" / "weights.bin").read_text() == "old"
