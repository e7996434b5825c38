"""Readers for other frameworks' logs, each on a file that framework's own writer produced:
TensorBoard (torch's SummaryWriter), TRL / transformers (TrainerState.save_to_json), MLflow (its
file store, shipped in tests/scaling/data/mlflow), verl (its LocalLogger's line format). Each is
read by `scalerl fit`, with a FLOPs axis from tokens, and names file:line or file:tag:step on a
bad value."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest

from scalerl.cli import main
from scalerl.scaling.compute_axis import FlopsAxis
from scalerl.scaling.io import read_curves
from scalerl.scaling.logs import detect_format

DATA = Path(__file__).parent / "data"
MLFLOW_EXP = DATA / "mlflow" / "mlruns" / "470258699770668690"
N = 1e6  # --params of the conversions below


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def _reward(step: float, A: float = 0.6) -> float:
    """The curve every log below holds: R0 0.1, A, B 1.5, C_mid 12 steps (written out, not fitted)."""
    return 0.1 + (A - 0.1) / (1 + (12.0 / step) ** 1.5)


# -- TensorBoard ----------------------------------------------------------------------------------


def _write_tensorboard(folder: Path, bad_step: int | None = None) -> None:
    from torch.utils.tensorboard import SummaryWriter

    w = SummaryWriter(log_dir=str(folder))
    for step in range(1, 41):
        w.add_scalar("train/num_tokens", 1000.0 * step, step)
        if step % 4 == 0:
            w.add_scalar("eval/reward", math.nan if step == bad_step else _reward(step), step)
    w.close()


def test_tensorboard_folder_read_by_fit_with_flops_from_tokens(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    _write_tensorboard(tmp_path / "tb" / "grpo")
    assert detect_format(tmp_path / "tb") == "tensorboard"
    (curve,) = read_curves(tmp_path / "tb", x="step", y="eval/reward")
    assert curve.label == "grpo" and list(curve.x) == [4.0 * k for k in range(1, 11)]
    np.testing.assert_allclose(curve.y, [_reward(4.0 * k) for k in range(1, 11)], rtol=1e-6)  # float32
    code, out, err = _run(["fit", str(tmp_path / "tb"), "--y", "eval/reward", "--x", "train/num_tokens",
                           "--params", str(N), "--bootstrap", "0", "--json", "--r0", "0.1"], capsys)
    assert code == 0, err
    (run,) = json.loads(out)["runs"]
    assert run["x"] == "flops" and run["x_conversion"].startswith("flops = train/num_tokens x 8N")
    # 8N per token: x at the first evaluation (step 4, 4000 tokens) = 8 * 1e6 * 4000.
    code, out, err = _run(["fit", str(tmp_path / "tb"), "--y", "eval/reward", "--x", "train/num_tokens",
                           "--params", str(N), "--bootstrap", "0", "--predict-at", str(8e6 * 4000)], capsys)
    assert code == 0, err
    assert "x axis: flops = train/num_tokens x 8N = train/num_tokens x 8e+06" in out
    # The fit (R0 given: the curve's own 0.1) recovers the A the curve was written with.
    assert run["A"] == pytest.approx(0.6, abs=0.01)


def test_tensorboard_bad_value_names_file_tag_step(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _write_tensorboard(tmp_path / "tb", bad_step=12)
    code, _, err = _run(["fit", str(tmp_path / "tb"), "--y", "eval/reward", "--x", "step"], capsys)
    assert code == 2
    (event_file,) = (tmp_path / "tb").glob("events.out.tfevents.*")
    assert f"{event_file}:eval/reward:step 12: eval/reward = nan is not finite" in err


def test_reading_event_files_imports_no_torch(tmp_path: Path) -> None:
    import subprocess
    import sys

    _write_tensorboard(tmp_path / "tb")
    probe = ("import sys; from scalerl.scaling.io import read_curves; "
             f"(c,) = read_curves({str(tmp_path / 'tb')!r}, x='step', y='eval/reward'); "
             "print(c.x.size, any(m.split('.')[0] == 'torch' for m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=180,
                         check=True)
    assert out.stdout.split() == ["10", "False"]


def test_watch_reads_a_tensorboard_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _write_tensorboard(tmp_path / "tb")
    argv = ["watch", str(tmp_path / "tb"), "--once", "--y", "eval/reward", "--x", "step"]
    code, out, err = _run(argv, capsys)
    assert code == 0, err
    row = next(line for line in out.splitlines() if line.startswith("tb "))
    assert " 40 " in row and "0.529" in row  # last step and its reward (_reward(40) = 0.5294)


# -- TRL / transformers trainer_state.json ------------------------------------------------------


def _write_trainer_state(folder: Path, bad_step: int | None = None) -> Path:
    from transformers.trainer_callback import TrainerState

    state = TrainerState(global_step=40, max_steps=40, logging_steps=1, eval_steps=4)
    for step in range(1, 41):
        # The Trainer logs the training metrics of a step, then (every eval_steps) the evaluation.
        state.log_history.append({"loss": 0.5, "num_tokens": 1000.0 * step, "reward": 0.2,
                                  "epoch": step / 40, "step": step})
        if step % 4 == 0:
            value: object = "oops" if step == bad_step else _reward(step)
            state.log_history.append({"eval_reward": value, "eval_loss": 0.4, "epoch": step / 40,
                                      "step": step})
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "trainer_state.json"
    state.save_to_json(str(path))
    return path


def test_trl_trainer_state_with_flops_from_tokens(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _write_trainer_state(tmp_path / "checkpoint-40")
    assert detect_format(path) == "trl" and detect_format(path.parent) == "trl"
    (curve,) = read_curves(path.parent, axis=FlopsAxis.from_tokens("num_tokens", N))
    assert curve.y_name == "eval_reward" and curve.x_name == "flops"  # TRL's eval reward is the default y
    np.testing.assert_allclose(curve.x, [8 * N * 1000.0 * s for s in range(4, 41, 4)])
    np.testing.assert_allclose(curve.y, [_reward(s) for s in range(4, 41, 4)])
    argv = ["fit", str(path), "--x", "num_tokens", "--params", str(N), "--bootstrap", "0"]
    code, out, err = _run(argv, capsys)
    assert code == 0, err
    assert "x axis: flops = num_tokens x 8N" in out


def test_trl_bad_value_names_the_line_of_its_entry(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _write_trainer_state(tmp_path, bad_step=8)
    lines = path.read_text().splitlines()
    bad = next(i for i, ln in enumerate(lines) if '"oops"' in ln)
    start = next(i for i in range(bad, -1, -1) if lines[i].strip() == "{") + 1  # 1-based line of its entry
    code, _, err = _run(["fit", str(path), "--x", "step"], capsys)
    assert code == 2
    assert f"{path}:{start}: eval_reward = 'oops' is not a number" in err


# -- MLflow file store ---------------------------------------------------------------------------


def test_mlflow_experiment_folder_written_by_mlflow(capsys: pytest.CaptureFixture[str]) -> None:
    assert detect_format(MLFLOW_EXP) == "mlflow"
    curves = read_curves(MLFLOW_EXP, x="step", y="eval/reward")
    assert sorted(c.label for c in curves) == ["grpo-seed0", "grpo-seed1"]  # run_name from meta.yaml
    by = {c.label: c for c in curves}
    steps = [4.0 * k for k in range(1, 11)]
    assert list(by["grpo-seed0"].x) == steps
    np.testing.assert_allclose(by["grpo-seed0"].y, [round(_reward(s, 0.6), 4) for s in steps])
    np.testing.assert_allclose(by["grpo-seed1"].y, [round(_reward(s, 0.62), 4) for s in steps])
    code, out, err = _run(["fit", str(MLFLOW_EXP), "--y", "eval/reward", "--x", "train/num_tokens",
                           "--params", str(N), "--bootstrap", "0", "--json", "--r0", "0.1"], capsys)
    assert code == 0, err
    runs = {r["label"]: r for r in json.loads(out)["runs"]}
    assert runs["grpo-seed0"]["x"] == "flops"
    assert runs["grpo-seed0"]["A"] == pytest.approx(0.6, abs=0.01)
    assert runs["grpo-seed1"]["A"] == pytest.approx(0.62, abs=0.01)


def test_mlflow_bad_line_names_its_metric_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    exp = tmp_path / "exp"
    shutil.copytree(MLFLOW_EXP, exp)
    run = next(d for d in exp.iterdir() if d.is_dir())
    f = run / "metrics" / "eval" / "reward"
    lines = f.read_text().splitlines()
    lines[2] = lines[2].split()[0] + " zero 12"
    f.write_text("\n".join(lines) + "\n")
    code, _, err = _run(["fit", str(run), "--y", "eval/reward", "--x", "step"], capsys)
    assert code == 2 and f"{f}:3: not numbers" in err


# -- verl console ---------------------------------------------------------------------------------


def _verl_line(data: dict[str, float], step: int) -> str:
    """verl's LocalLogger line (verl/utils/logger/aggregate_logger.py, concat_dict_to_str):
    ``step:{step}`` then ``{k}:{v:.3f}`` for each number, joined by `` - ``."""
    return " - ".join([f"step:{step}", *(f"{k}:{v:.3f}" for k, v in data.items())])


def _write_verl(path: Path) -> None:
    lines = ["(TaskRunner pid=4242) Training from scratch", "Using dataset gsm8k"]
    for step in range(1, 41):
        data = {"actor/pg_loss": -0.01, "perf/total_num_tokens": 500.0 + step}
        if step % 4 == 0:
            data["val-core/openai/gsm8k/reward/mean@1"] = _reward(step)
        lines.append(f"(TaskRunner pid=4242) {_verl_line(data, step)}")
    path.write_text("\n".join(lines) + "\n")


def test_verl_console_log_per_step_tokens(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "verl.log"
    _write_verl(log)
    assert detect_format(log) == "verl"
    (curve,) = read_curves(log, axis=FlopsAxis.from_tokens("perf/total_num_tokens", N, per_step=True))
    assert curve.y_name == "val-core/openai/gsm8k/reward/mean@1"
    # Per-step counts summed: tokens through step s = sum_{k=1..s} (500 + k) = 500 s + s (s + 1) / 2.
    np.testing.assert_allclose(curve.x, [8 * N * (500 * s + s * (s + 1) / 2) for s in range(4, 41, 4)])
    np.testing.assert_allclose(curve.y, [round(_reward(s), 3) for s in range(4, 41, 4)])
    assert curve.where(0) == f"{log}:6"  # the line of step 4 (two header lines first)
    code, out, err = _run(["fit", str(log), "--x", "perf/total_num_tokens", "--per-step", "--params", str(N),
                           "--bootstrap", "0"], capsys)
    assert code == 0, err and "x axis: flops" in out


def test_verl_cumulative_reading_of_per_step_counts_is_refused(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "verl.log"
    lines = [_verl_line({"perf/total_num_tokens": 600.0 - s, "val-core/x/reward/mean@1": 0.1 * s}, s)
             for s in range(1, 6)]
    log.write_text("\n".join(lines) + "\n")
    code, _, err = _run(["fit", str(log), "--x", "perf/total_num_tokens", "--params", "1e6"], capsys)
    assert code == 2
    assert f"{log}:2: perf/total_num_tokens = 598 goes down" in err and "--per-step" in err


def test_unreadable_log_formats_and_flags(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "verl.log"
    _write_verl(log)
    code, _, err = _run(["fit", str(log), "--gen-tokens", "perf/total_num_tokens"], capsys)
    assert code == 2 and "need --params N" in err
    code, _, err = _run(["fit", str(log), "--params", "1e6"], capsys)
    assert code == 2 and "name the token column with --x" in err
    code, _, err = _run(["fit", str(tmp_path), "--format", "tensorboard"], capsys)
    assert code == 2 and "no TensorBoard event files" in err
