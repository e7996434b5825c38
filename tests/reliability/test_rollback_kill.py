"""SIGKILL a real `scalerl train` right after a rollback on collapse, resume it, and check the run.

The run (tests/pipeline/rollback_helpers.py: a rate x 1e12 from the third update on) collapses at
step 5 and rolls back to step 2 with `rollback.lr_scale` 1e-12. The process is killed once the
rolled-back trajectory has written its checkpoint of step 4; `--resume` must continue it with the
lowered rate (read back from rollback.json), finish at max_steps without another collapse, and
keep the rollback counted once.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from scalerl.assembly.warm_start import warm_start_default
from scalerl.config import RunConfig, config_to_yaml
from scalerl.telemetry import read_rows
from scalerl.training.sft import SFTConfig

HELPERS = Path(__file__).resolve().parents[1] / "pipeline" / "rollback_helpers.py"
sys.path.insert(0, str(HELPERS.parent))
from rollback_helpers import LR, MAX_STEPS, TINY, collapse_config  # noqa: E402


def _train(*args: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, str(HELPERS), "2", "1e12", "--", "train", "--recipe", "base", *args]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


@pytest.mark.slow
@pytest.mark.kill_cycles  # a minute: in `make test-kill-cycles`, not `make test`
def test_sigkill_after_a_rollback_resumes_with_the_lowered_rate(tmp_path: Path) -> None:
    base = RunConfig.model_validate({"model": {"tiny": TINY}, "data": {"synthetic": {"num_prompts": 60}}})
    model = warm_start_default(base, SFTConfig(steps=2, batch_size=4), cache_dir=tmp_path / "cache")
    run = tmp_path / "run"
    config = tmp_path / "run.yaml"
    config.write_text(config_to_yaml(collapse_config(str(model), run, lr_scale=1e-12, nonfinite_steps=2)))

    proc = _train("-c", str(config))
    record, step4 = run / "rollback.json", run / "checkpoints" / "step_000004" / "state.json"
    deadline = time.monotonic() + 240

    def rolled_back_and_saved() -> bool:
        if not (record.is_file() and step4.is_file()):
            return False
        data = json.loads(record.read_text())
        return len(data["events"]) == 1 and data["pending"] is None
    while not rolled_back_and_saved():
        assert proc.poll() is None, proc.stderr.read().decode()[-3000:] if proc.stderr else "exited"
        assert time.monotonic() < deadline, "no rollback and checkpoint within 240 s"
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()

    resumed = _train("-c", str(config), "--resume")
    _, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, err.decode()[-3000:]

    (event,) = json.loads(record.read_text())["events"]
    assert event["step"] == 5 and event["restored_step"] == 2 and event["trigger"] == "nonfinite"
    steps = [r for r in read_rows(run / "metrics.jsonl") if r["kind"] == "step"]
    assert [r["step"] for r in steps] == list(range(1, MAX_STEPS + 1))
    for r in steps[2:]:  # before and after the kill: the lowered rate, no further collapse
        assert r["rollbacks"] == 1 and r["rollback_trigger"] == "nonfinite"
        assert r["lr"] == pytest.approx(LR * 1e-12 * 1e12) and r["skipped_nonfinite"] == 0.0
    sessions = [json.loads(line) for line in (run / "sessions.jsonl").read_text().splitlines()]
    assert [s["event"] for s in sessions] == ["start", "rollback", "start", "stop"]
