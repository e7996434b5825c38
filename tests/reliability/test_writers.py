"""Writers that are atomic and owned: `data synth`, `watch --plot`, `data difficulty`'s work file;
and a malformed row that `--skip` counts rather than crashing on (deep nesting)."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest

from scalerl.cli import main
from scalerl.data.records import PromptRecord

CURVE = "".join(f'{{"step": {i}, "compute_device_hours": {0.1 * i:.1f}, "val_pass_rate": 0.{i}}}\n'
                for i in range(1, 7))


def _cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        status = main(argv)
    except SystemExit as exit_:
        status = int(exit_.code or 0)
    out = capsys.readouterr()
    return status, out.out, out.err


def test_synth_overwrite_keeps_the_old_file_until_the_new_one_is_complete(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The disk fills after two of five rows: the old file is whole, nothing else is left."""
    monkeypatch.chdir(tmp_path)
    assert _cli(["data", "synth", "--n", "4", "--out", "p.jsonl"], capsys)[0] == 0
    old = (tmp_path / "p.jsonl").read_bytes()
    real, written = PromptRecord.to_dict, []

    def full_disk(self: PromptRecord) -> dict[str, object]:
        if len(written) == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        written.append(self.id)
        return real(self)

    monkeypatch.setattr(PromptRecord, "to_dict", full_disk)
    again = ["data", "synth", "--n", "5", "--seed", "1", "--out", "p.jsonl", "--overwrite"]
    status, _, err = _cli(again, capsys)
    assert status == 1 and "No space left on device" in err
    assert (tmp_path / "p.jsonl").read_bytes() == old
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.jsonl"]
    monkeypatch.setattr(PromptRecord, "to_dict", real)
    assert _cli(again, capsys)[0] == 0
    assert len((tmp_path / "p.jsonl").read_text().splitlines()) == 5


def test_watch_plot_says_when_it_wrote_nothing_and_replaces_only_when_told(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "fresh").mkdir()  # a run with no evaluation yet: nothing to fit
    png = tmp_path / "w.png"
    status, out, err = _cli(["watch", str(tmp_path / "fresh"), "--once", "--plot", str(png)], capsys)
    assert status == 0, err
    assert f"plot not written: no curve can be fitted yet ({png} left as it was)" in out
    assert "plot written" not in out and not png.exists()
    png.write_bytes(b"mine")
    status, _, err = _cli(["watch", str(tmp_path / "fresh"), "--once", "--plot", str(png)], capsys)
    assert status == 2 and "--plot" in err and "exists; pass --overwrite" in err
    (tmp_path / "m.jsonl").write_text(CURVE)
    status, out, err = _cli(["watch", str(tmp_path / "m.jsonl"), "--once", "--plot", str(png), "--overwrite"],
                            capsys)
    assert status == 0, err
    assert f"plot written to {png} (1 curve(s))" in out and png.read_bytes()[:4] == b"\x89PNG"


def test_a_deeply_nested_row_is_counted_under_skip(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    rows = tmp_path / "d.jsonl"
    rows.write_text('{"prompt": "1+1?", "answer": "2"}\n' + '{"prompt": ' + "[" * 20000 + "]" * 20000 + "}\n")
    status, out, err = _cli(["data", "check", str(rows), "--skip"], capsys)
    assert status == 0, err
    assert "invalid JSON: 1" in out + err and f"{rows}:2: nested too deeply to parse" in out + err


def test_difficulty_removes_its_work_file_on_late_bad_input(
    tiny_model: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A task without a verifier is found when the engine opens, after the work file was made."""
    rows = tmp_path / "chess.jsonl"
    rows.write_text(json.dumps({"prompt": "e4?", "answer": "e5", "task": "chess"}) + "\n")
    out = tmp_path / "rated.jsonl"
    status, _, err = _cli(["data", "difficulty", str(rows), "--model", tiny_model, "--out", str(out),
                           "--k", "1", "--no-progress", "--device", "cpu"], capsys)
    assert status == 2, err
    assert "chess" in err and "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["chess.jsonl"]
