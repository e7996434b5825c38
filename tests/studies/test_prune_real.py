"""`ablate --prune` on a study whose pruned run trains for real on the tiny model: the controller
stops it early through its stop request, its driver honours it (`stopped_by: pruned`), and the
report counts the compute saved."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import numpy as np
from study_helpers import TINY_OVERRIDES, sigmoid

from scalerl.assembly.run import train_run
from scalerl.config import RunConfig, config_to_yaml
from scalerl.scaling.live import forecast_rows
from scalerl.studies.ablate import plan_ablation, run_ablation
from scalerl.studies.fitting import FitSettings
from scalerl.studies.prune import BELOW_LEADER

MAX_STEPS = 30
LEADER = "lr-1e-05"
PER_STEP = 0.002  # the stand-in leader's compute per step


def leader_run(cfg: RunConfig, run_dir: Path) -> int:
    """The leader: a finished run whose held-out curve is a known sigmoid (A 0.7) and whose last
    eval row carries the live forecast of that curve (`forecast_rows`, the code a run logs with)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(config_to_yaml(cfg))
    c = PER_STEP * np.arange(MAX_STEPS + 1)
    y = sigmoid(c, 0.7, 1.6, 0.01, 0.2) + np.random.default_rng(0).normal(0, 0.004, c.size)
    rows: list[dict[str, Any]] = []
    for i in range(MAX_STEPS + 1):
        if i > 0:
            rows.append({"kind": "step", "step": i, "loss": 0.1, "compute_device_hours": float(c[i])})
        rows.append({"kind": "eval", "step": i, "val_pass_rate": float(y[i]),
                     "compute_device_hours": float(c[i])})
    forecast = forecast_rows(rows[:-1], cfg.forecast)
    assert forecast is not None and forecast.status == "ok" and forecast.A_lo is not None
    rows[-1].update(forecast.fields())
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run_dir / "sessions.jsonl").write_text(json.dumps({"event": "start"}) + "\n" + json.dumps(
        {"event": "stop", "step": MAX_STEPS, "stop_reason": "max_steps"}) + "\n")
    return 0


def train(cfg: RunConfig, run_dir: Path, **kw: Any) -> int:
    """The leader is the stand-in above; every other run trains for real (`train_run`)."""
    return leader_run(cfg, Path(run_dir)) if cfg.name == LEADER else train_run(cfg, Path(run_dir), **kw)


def test_a_real_run_far_below_the_leader_is_stopped_early_and_the_compute_saved_is_reported(
    tmp_path: Path, tiny_model: str
) -> None:
    overrides = [o for o in TINY_OVERRIDES if not o.startswith("max_steps=")]
    plan = plan_ablation("scalerl", grid=["optim.lr=1e-5,1.0"], study_dir=tmp_path,
                         overrides=[*overrides, f"max_steps={MAX_STEPS}", f"model.name_or_path={tiny_model}"])
    out = io.StringIO()
    assert run_ablation(plan, FitSettings(x="compute_device_hours", n_boot=50), device="cpu",
                        train_fn=train, out=out, prune_margin=0.02) == 0
    prune = json.loads((tmp_path / "summary.json").read_text())["prune"]
    by = {r["run"]: r for r in prune["runs"]}
    leader, lost = by[LEADER], by["lr-1.0"]
    # The real run learns nothing (pass rate 0: its fit is flagged flat, its A interval near 0),
    # far below the leader's lower bound: stopped by its stop request, before max_steps.
    assert leader["stopped_by"] == "max_steps" and leader["request"] is None
    assert lost["stopped_by"] == "pruned" and prune["n_pruned"] == 1
    req = lost["request"]
    assert req["reason"] == BELOW_LEADER and req["leader"] == LEADER
    assert req["A_hi"] + 0.02 < req["leader_lo"]
    log = (tmp_path / "runs" / "lr-1.0" / "metrics.jsonl").read_text()
    rows = [json.loads(line) for line in log.splitlines()]
    steps = [r for r in rows if r["kind"] == "step"]
    assert 5 <= lost["step"] == steps[-1]["step"] < MAX_STEPS  # the first forecast is logged at step 5
    # Saved: its compute per step so far, over the steps it did not train (independent arithmetic).
    used = steps[-1]["compute_device_hours"]
    assert lost["compute"] == used
    assert abs(lost["saved"] - used * (MAX_STEPS - lost["step"]) / lost["step"]) < 1e-12
    full = leader["compute"] + used * MAX_STEPS / lost["step"]
    assert abs(prune["saved_fraction"] - lost["saved"] / full) < 1e-9 and prune["saved_fraction"] > 0
    assert f"lr-1.0: stopped at step {lost['step']}/{MAX_STEPS} by pruned" in out.getvalue()
    assert "compute saved:" in out.getvalue()
