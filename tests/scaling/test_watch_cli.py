"""`scalerl watch --once` on synthetic folders: a run with a logged forecast, one being written
(torn last line) without one, an empty folder, another framework's CSV; and its bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_live_forecast import eval_rows, write_run

from scalerl.cli import main
from scalerl.config import ForecastConfig
from scalerl.scaling.live import forecast_text


def test_watch_once_shows_every_run_and_its_forecast(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = write_run(tmp_path / "live", eval_rows(8), ForecastConfig())
    last = [r for r in rows if r["kind"] == "eval"][-1]
    old = tmp_path / "old"  # no forecast logged, and a row half-written by its process
    old.mkdir()
    plain = [{k: v for k, v in r.items() if not k.startswith("forecast_")} for r in rows]
    (old / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in plain) + '{"kind": "ev')
    (tmp_path / "fresh").mkdir()
    csv = tmp_path / "verl.csv"
    csv.write_text("step,gpu_hours,reward\n" + "".join(
        f"{r['step']},{r['compute_device_hours']},{r['val_pass_rate']}\n"
        for r in plain if r["kind"] == "eval"))
    png = tmp_path / "w.png"
    paths = [str(tmp_path / n) for n in ("live", "old", "fresh")] + [str(csv)]
    assert main(["watch", *paths, "--once", "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    table = {line.split()[0]: line for line in out.splitlines()[2:6]}
    # The text the run's progress line printed for that row (one function): its interval, and its
    # point only if pinned (this 8-evaluation curve's interval is wider than +-0.02: not pinned).
    assert last["forecast_shown"] != "pinned"
    assert forecast_text(last) in table["live"] and f"{last['forecast_A']:.3f}" not in table["live"]
    assert f"A in [{last['forecast_A_lo']:.3f}, {last['forecast_A_hi']:.3f}]" in table["live"]
    assert "live: logged at step 80 (fit through step 70)" in out
    assert "old: fitted here on 8 evaluations" in out and "verl: fitted here on 8 evaluations" in out
    assert "fresh: no metrics.jsonl yet" in out
    # The folder and the CSV hold the same points: the same forecast, whichever reader.
    assert table["old"].split()[3:] == table["verl"].split()[3:]
    assert png.is_file() and png.stat().st_size > 1000


def test_watch_refuses_a_missing_path(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["watch", str(tmp_path / "nope"), "--once"]) == 2
    assert "no such run folder" in capsys.readouterr().err
