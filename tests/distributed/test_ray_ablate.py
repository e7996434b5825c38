"""`scalerl ablate --ray`: the variants of a study train concurrently as Ray tasks, and the study's
outputs are those of the sequential study."""

from __future__ import annotations

import io
import json
import time
from pathlib import Path

import pytest
from studies.study_helpers import TINY_OVERRIDES

from scalerl.assembly.warm_start import warm_start_default
from scalerl.config import load_config
from scalerl.studies.ablate import plan_ablation, run_ablation
from scalerl.studies.fitting import FitSettings
from scalerl.studies.ray_runs import RayRuns
from scalerl.training.sft import SFTConfig

pytestmark = pytest.mark.distributed


def test_variants_run_concurrently_on_ray(ray_cluster: object, tmp_path: Path) -> None:
    ray = ray_cluster
    model = warm_start_default(load_config(overrides=TINY_OVERRIDES), SFTConfig(steps=2, batch_size=4),
                               cache_dir=tmp_path / "sft")
    plan = plan_ablation("scalerl", grid=["pipeline.off_policy=sync,pipeline"], study_dir=tmp_path / "study",
                         overrides=[*TINY_OVERRIDES, "max_steps=3", f"model.name_or_path={model}"])
    address = ray.get_runtime_context().gcs_address  # type: ignore[attr-defined]
    with RayRuns(address, num_cpus=1.0) as runs:
        assert run_ablation(plan, FitSettings(), device="cpu", train_fn=runs.train, parallel=2,
                            out=io.StringIO()) == 0
    summary = json.loads((tmp_path / "study" / "summary.json").read_text())
    assert summary["n_completed"] == 2 and summary["failed"] == []
    spans = []
    for name in ("off_policy-sync", "off_policy-pipeline"):
        run_dir = tmp_path / "study" / "runs" / name
        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        assert [r["step"] for r in rows if r["kind"] == "step"] == [1, 2, 3]
        status = json.loads((run_dir / "study_status.json").read_text())
        end = time.mktime(time.strptime(status["finished_at"][:19], "%Y-%m-%dT%H:%M:%S"))
        spans.append((end - status["seconds"], end))
    # The two runs were in flight at the same time.
    assert max(s for s, _ in spans) < min(e for _, e in spans)
