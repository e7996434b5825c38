"""`logging.samples_every`: a real run writes readable samples to samples.jsonl, each row's reward
being what the verifier gives its own response text, and a resume drops the rows past the
checkpoint like metrics.jsonl's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scalerl.assembly.run import train_run
from scalerl.rewards import math_reward
from tests.tiny_runs import warm_tiny_model

from .test_kill_resume import tiny_run_config


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return warm_tiny_model(tmp_path_factory)


def _rows(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_samples_are_logged_every_n_steps_as_text(tiny_model: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    cfg = tiny_run_config(str(tiny_model), run_dir)
    cfg.max_steps, cfg.checkpoint.every = 4, 2
    cfg.logging.samples_every, cfg.logging.samples_per_step = 2, 3
    cfg.logging.tensorboard = True
    train_run(cfg, run_dir)
    rows = _rows(run_dir / "samples.jsonl")
    # TensorBoard shows the same rows, one Markdown table per logged step under the text tag `samples`
    tables = _tensorboard_tables(run_dir / "tensorboard")
    assert sorted(tables) == [2, 4]
    for step, table in tables.items():
        shown = [r for r in rows if r["step"] == step]
        assert [(int(t["sample"]), t["prompt_id"], float(t["reward"]), t["response"]) for t in table] == [
            (r["sample"], r["prompt_id"], r["reward"], r["response"].replace("\r", "").replace("\n", "<br>"))
            for r in shown]
    # steps 2 and 4; 2 prompts x 2 samples per step, 3 shown, round-robin over the groups
    assert [(r["step"], r["sample"]) for r in rows] == [(2, 0), (2, 0), (2, 1), (4, 0), (4, 0), (4, 1)]
    step_rows = {r["step"]: r for r in _rows(run_dir / "metrics.jsonl") if r["kind"] == "step"}
    for r in rows:
        assert r["kind"] == "sample" and r["prompt_id"] in step_rows[r["step"]]["prompt_ids"]
        assert isinstance(r["prompt"], str) and r["prompt"] and isinstance(r["response"], str)
        assert r["tokens"] > 0 and r["finish_reason"] in ("stop", "length")
        # the logged reward is the verifier's on the logged text against the sum in the prompt
        assert r["prompt"].startswith("Compute ")
        gold = sum(int(x) for x in r["prompt"].removeprefix("Compute ").split("+"))
        assert r["reward"] == math_reward(r["response"], str(gold))
        assert r["lag"] == step_rows[r["step"]]["train_version"] - r["start_version"] >= 0


def _tensorboard_tables(log_dir: Path) -> dict[int, list[dict[str, str]]]:
    """step -> the rows of the `samples` text's Markdown table, read with TensorBoard's own reader."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir), size_guidance={"tensors": 0})
    acc.Reload()
    out: dict[int, list[dict[str, str]]] = {}
    for event in acc.Tensors("samples/text_summary"):
        lines = event.tensor_proto.string_val[0].decode().split("\n")
        header = _split_cells(lines[0])
        out[event.step] = [dict(zip(header, _split_cells(line), strict=True)) for line in lines[2:]]
    return out


def _split_cells(line: str) -> list[str]:
    """The cells of `| a | b |`, unescaped: a backslash makes the next character literal (a `|` in a
    response is no cell border); each cell loses the one space on either side of its borders."""
    cells: list[str] = []
    cur, i = "", 1  # past the leading `|`
    while i < len(line):
        if line[i] == "\\":
            cur += line[i + 1]
            i += 2
            continue
        if line[i] == "|":
            cells.append(cur[1:-1])
            cur = ""
        else:
            cur += line[i]
        i += 1
    return cells


def test_no_samples_file_when_off(tiny_model: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    cfg = tiny_run_config(str(tiny_model), run_dir)
    cfg.max_steps = 1
    train_run(cfg, run_dir)
    assert not (run_dir / "samples.jsonl").exists()


def test_a_resumed_run_drops_the_samples_past_its_checkpoint(tmp_path: Path) -> None:
    from scalerl.config import LoggingConfig
    from scalerl.telemetry.run import RunTelemetry

    cfg = LoggingConfig(progress=False, samples_every=1)
    with RunTelemetry(tmp_path, cfg, max_steps=4) as tel:
        for step in (1, 2, 3):
            tel.log_samples(step, [{"response": f"r{step}"}])
    with RunTelemetry(tmp_path, cfg, max_steps=4, resume_step=2) as tel:
        tel.log_samples(3, [{"response": "again"}])
    assert [(r["step"], r["response"]) for r in _rows(tmp_path / "samples.jsonl")] == [
        (1, "r1"), (2, "r2"), (3, "again")]
