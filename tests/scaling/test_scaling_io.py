"""Readers: scalerl run directories, JSONL, CSV, W&B chart exports; errors name file:line."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from scalerl.scaling.io import read_curves, read_many, reference_csv, window_mask


def _eval_rows(tmp_path: Path, run_writer: Callable[..., Path], name: str = "run-a", **kw: object) -> Path:
    c = np.linspace(0, 5000, 11)
    return run_writer(tmp_path, name, c, np.linspace(0.3, 0.6, 11), **kw)


def test_run_directory(tmp_path: Path, run_writer: Callable[..., Path]) -> None:
    d = _eval_rows(tmp_path, run_writer, config_name="scalerl-8b-bs2048")
    (curve,) = read_curves(d)
    assert curve.label == "scalerl-8b-bs2048"
    # flops is the default x when the run logs it; device-hours when asked for (or when it does not).
    assert (curve.x_name, curve.y_name) == ("flops", "val_pass_rate")
    assert curve.x.size == 11 and curve.x[0] == 0.0  # step rows were skipped
    assert curve.x[-1] == pytest.approx(5000 * 3.6e18)
    np.testing.assert_array_equal(curve.column("step"), np.arange(11) * 100)
    assert curve.lines[0] == 2 and curve.where(1) == f"{d / 'metrics.jsonl'}:4"
    (by_hours,) = read_curves(d, x="compute_device_hours")
    assert by_hours.x[-1] == pytest.approx(5000)


def test_default_x_is_device_hours_without_flops(tmp_path: Path) -> None:
    log = tmp_path / "m.jsonl"
    log.write_text("".join(json.dumps({"compute_device_hours": h, "val_pass_rate": 0.1 * h}) + "\n"
                           for h in (1, 2, 3)))
    (curve,) = read_curves(log)
    assert curve.x_name == "compute_device_hours" and list(curve.x) == [1.0, 2.0, 3.0]


def test_run_directory_config_recipe(tmp_path: Path, run_writer: Callable[..., Path]) -> None:
    d = _eval_rows(tmp_path, run_writer, config_name="cispo-8b-s1", recipe="cispo-8b")
    (curve,) = read_curves(d)
    assert (curve.label, curve.recipe) == ("cispo-8b-s1", "cispo-8b")
    (again,) = read_many([d, d])[1:]
    assert (again.label, again.recipe) == ("cispo-8b-s1#2", "cispo-8b")


def test_run_directory_without_config_uses_dir_name(tmp_path: Path, run_writer: Callable[..., Path]) -> None:
    d = _eval_rows(tmp_path, run_writer, name="my-run")
    assert read_curves(d)[0].label == "my-run" and read_curves(d)[0].recipe is None
    (d / "config.yaml").write_text(": not yaml : [")
    assert read_curves(d)[0].label == "my-run"


def test_rows_without_y_are_skipped_and_null_y_too(tmp_path: Path) -> None:
    p = tmp_path / "log.jsonl"
    rows = [
        {"kind": "step", "step": 1, "loss": 1.0},
        {"kind": "eval", "compute_device_hours": 10.0, "val_pass_rate": 0.3},
        {"kind": "eval", "compute_device_hours": 20.0, "val_pass_rate": None},
        {"kind": "eval", "compute_device_hours": 30.0, "val_pass_rate": 0.4},
    ]
    p.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    (curve,) = read_curves(p)
    np.testing.assert_array_equal(curve.x, [10.0, 30.0])
    np.testing.assert_array_equal(curve.lines, [2, 4])


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"compute_device_hours": 30, "val_pass_rate": 0.4', r"log\.jsonl:3: malformed JSON"),
        ("[1, 2]", r"log\.jsonl:3: expected a JSON object"),
        ('{"val_pass_rate": 0.4}', r"log\.jsonl:3: row has val_pass_rate but no compute_device_hours"),
        (
            '{"compute_device_hours": 30, "val_pass_rate": "high"}',
            r"log\.jsonl:3: val_pass_rate = 'high' is not",
        ),
        (
            '{"compute_device_hours": 30, "val_pass_rate": NaN}',
            r"log\.jsonl:3: val_pass_rate = nan is not finite",
        ),
        ('{"compute_device_hours": 30, "val_pass_rate": true}', r"log\.jsonl:3: val_pass_rate is a boolean"),
        (
            '{"compute_device_hours": 20, "val_pass_rate": 0.5}',
            r"log\.jsonl:3: compute_device_hours = 20 does not",
        ),
    ],
)
def test_bad_rows_name_file_and_line(tmp_path: Path, line: str, message: str) -> None:
    p = tmp_path / "log.jsonl"
    p.write_text(
        '{"compute_device_hours": 10, "val_pass_rate": 0.3}\n'
        '{"compute_device_hours": 20, "val_pass_rate": 0.35}\n' + line + "\n"
    )
    with pytest.raises(ValueError, match=message):
        read_curves(p)


def test_missing_columns_list_what_exists(tmp_path: Path) -> None:
    p = tmp_path / "log.jsonl"
    p.write_text('{"gpu_h": 1, "acc": 0.3}\n')
    with pytest.raises(ValueError, match=r"none of the default y columns .* \(have: gpu_h, acc\)"):
        read_curves(p)
    with pytest.raises(ValueError, match=r"no x column 'compute' \(have: gpu_h, acc\)"):
        read_curves(p, x="compute", y="acc")
    (curve,) = read_curves(p, x="gpu_h", y="acc")
    assert curve.x_name == "gpu_h"


def test_reference_csv_with_comment_header() -> None:
    (curve,) = read_curves(reference_csv())
    assert (curve.x_name, curve.y_name) == ("compute_gpu_hours", "pass_rate")  # fallback columns
    assert curve.x.size == 34 and curve.lines[0] == 7
    assert curve.label == "scalerl_8b_dense_fig1a"


def test_csv_with_run_column_and_bad_cell(tmp_path: Path) -> None:
    p = tmp_path / "runs.csv"
    p.write_text("run,gpu_hours,acc\na,1,0.1\nb,1,0.2\na,2,0.15\nb,2,\nb,3,0.3\n")
    curves = read_curves(p, x="gpu_hours", y="acc")
    assert [c.label for c in curves] == ["a", "b"]
    np.testing.assert_array_equal(curves[1].x, [1, 3])
    p.write_text("gpu_hours,acc\n1,0.1\n2,oops\n")
    with pytest.raises(ValueError, match=r"runs\.csv:3: acc = 'oops' is not a number"):
        read_curves(p, x="gpu_hours", y="acc")
    p.write_text("gpu_hours,acc\n1,0.1,7\n")
    with pytest.raises(ValueError, match=r"runs\.csv:2: 3 cells"):
        read_curves(p, x="gpu_hours", y="acc")


def test_wandb_chart_export(tmp_path: Path) -> None:
    p = tmp_path / "wandb_export.csv"
    p.write_text(
        "Step,cispo-seed1 - val_pass_rate,cispo-seed1 - val_pass_rate__MIN,cispo-seed1 - val_pass_rate__MAX,"
        "dapo-seed1 - val_pass_rate,dapo-seed1 - val_pass_rate__MIN,dapo-seed1 - val_pass_rate__MAX\n"
        "100,0.31,0.31,0.31,0.30,0.30,0.30\n"
        "200,0.35,0.35,0.35,,,\n"
        "300,0.38,0.38,0.38,0.33,0.33,0.33\n"
    )
    curves = read_curves(p)
    assert [c.label for c in curves] == ["cispo-seed1", "dapo-seed1"]
    assert curves[0].x_name == "Step" and curves[0].y_name == "val_pass_rate"
    np.testing.assert_array_equal(curves[0].y, [0.31, 0.35, 0.38])
    np.testing.assert_array_equal(curves[1].x, [100, 300])
    np.testing.assert_array_equal(curves[1].lines, [2, 4])


def test_wandb_export_without_min_max_columns(tmp_path: Path) -> None:
    p = tmp_path / "export.csv"
    p.write_text("Step,run-1 - reward,run-2 - reward\n10,0.1,0.2\n20,0.3,\n30,0.4,0.5\n")
    curves = read_curves(p, y="reward")
    assert [(c.label, c.x.size) for c in curves] == [("run-1", 3), ("run-2", 2)]
    # A plain CSV that happens to contain " - " in a column name is still a plain CSV.
    q = tmp_path / "plain.csv"
    q.write_text("gpu_hours,reward,note - free text\n1,0.1,a\n2,0.2,b\n")
    (plain,) = read_curves(q, x="gpu_hours", y="reward")
    assert plain.label == "plain" and plain.y_name == "reward"


def test_wandb_export_with_per_run_compute_column(tmp_path: Path) -> None:
    p = tmp_path / "export.csv"
    p.write_text(
        "Step,a - compute_device_hours,a - val_pass_rate,a - val_pass_rate__MIN,a - val_pass_rate__MAX\n"
        "1,10,0.3,0.3,0.3\n2,20,0.4,0.4,0.4\n"
    )
    (curve,) = read_curves(p)
    assert curve.x_name == "compute_device_hours"
    np.testing.assert_array_equal(curve.x, [10, 20])


def test_paths_and_formats(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        read_curves(tmp_path / "nope.csv")
    with pytest.raises(FileNotFoundError, match=r"no metrics\.jsonl"):
        read_curves(tmp_path)
    (tmp_path / "x.parquet").write_text("")
    with pytest.raises(ValueError, match="unknown format"):
        read_curves(tmp_path / "x.parquet")
    (tmp_path / "empty.csv").write_text("# only a comment\n")
    with pytest.raises(ValueError, match="no header row"):
        read_curves(tmp_path / "empty.csv")


def test_read_many_makes_labels_unique() -> None:
    curves = read_many([reference_csv(), reference_csv()])
    assert [c.label for c in curves] == ["scalerl_8b_dense_fig1a", "scalerl_8b_dense_fig1a#2"]


def test_window_mask_on_step(tmp_path: Path, run_writer: Callable[..., Path]) -> None:
    (curve,) = read_curves(_eval_rows(tmp_path, run_writer))
    mask = window_mask(curve, "step", 200, 800)
    np.testing.assert_array_equal(np.flatnonzero(mask), [2, 3, 4, 5, 6, 7, 8])
    with pytest.raises(ValueError, match=r"no column 'epochs'"):
        window_mask(curve, "epochs", 0, 1)
