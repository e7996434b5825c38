"""`scalerl train` on the Ray backend as a user runs it (subprocesses attached to this module's Ray
instance): SIGKILL at a random checkpoint and resume with another number of engines; a trainer
rank that dies stops the run with an error naming it, and `--resume` finishes it. The metrics log
continues without a gap or a duplicate and every prompt is trained exactly once."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from distributed.procs import ray_worker_pids
from pipeline.test_kill_resume import MAX_STEPS, tiny_run_config

from scalerl.assembly.warm_start import warm_start_default
from scalerl.config import RunConfig, config_to_yaml
from scalerl.telemetry import read_rows
from scalerl.training.sft import SFTConfig

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

TINY = {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1, "intermediate_size": 64,
        "max_position_embeddings": 256}


@pytest.fixture(scope="module")
def model_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    base = RunConfig.model_validate({"model": {"tiny": TINY}, "data": {"synthetic": {"num_prompts": 60}}})
    cache = tmp_path_factory.mktemp("sft")
    return str(warm_start_default(base, SFTConfig(steps=2, batch_size=4), cache_dir=cache))


def write_config(ray: object, model: str, run_dir: Path, path: Path, mode: str, lora_r: int = 0) -> None:
    cfg = tiny_run_config(model, run_dir).model_dump(mode="json")
    cfg["pipeline"].update(off_policy=mode, k=2)
    if lora_r:
        cfg["model"]["lora"] = {"r": lora_r, "alpha": 2 * lora_r}
        cfg["optim"]["lr"] = 1e-3
        # rewards with variance for a barely trained model, so every step updates and syncs
        cfg["rewards"]["verifiers"] = {"math": "parity_verifier:parity"}
    cfg["distributed"] = {
        "backend": "ray", "address": ray.get_runtime_context().gcs_address,  # type: ignore[attr-defined]
        "num_engines": 2, "trainer_world_size": 2, "engine_num_cpus": 0.5, "trainer_num_cpus": 0.5,
        "timeout_s": 30, "startup_timeout_s": 180,
    }
    path.write_text(config_to_yaml(RunConfig.model_validate(cfg)))


def train(config: Path, *extra: str) -> subprocess.Popen[bytes]:
    # tests/reliability on the path: its parity verifier (a reward with signal at any policy)
    reliability = str(Path(__file__).resolve().parents[1] / "reliability")
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [reliability, os.environ.get("PYTHONPATH")]))}
    cmd = [sys.executable, "-m", "scalerl.cli", "train", "--recipe", "base", "-c", str(config), *extra]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def wait_for(path: Path, proc: subprocess.Popen[bytes], timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if proc.poll() is not None:
            err = proc.stderr.read().decode() if proc.stderr else ""
            raise AssertionError(f"train exited before {path}: {err[-3000:]}")
        assert time.monotonic() < deadline, f"no {path} within {timeout_s} s"
        time.sleep(0.1)


def ckpt(run_dir: Path, step: int) -> Path:
    return run_dir / "checkpoints" / f"step_{step:06d}" / "state.json"


def check_log(run_dir: Path, max_lag: int) -> None:
    rows = read_rows(run_dir / "metrics.jsonl")
    steps = [r["step"] for r in rows if r["kind"] == "step"]
    assert steps == list(range(1, MAX_STEPS + 1)), f"step rows {steps}"
    evals = [r["step"] for r in rows if r["kind"] == "eval"]
    assert evals == sorted(set(evals)) and evals[0] == 0 and evals[-1] == MAX_STEPS
    step_rows = [r for r in rows if r["kind"] == "step"]
    assert all(r["version_lag_max"] <= max_lag for r in step_rows)
    assert all("weight_sync_s" in r and "pool_engines_alive" in r for r in step_rows)


def pipeline_state(run_dir: Path, step: int) -> dict:
    return json.loads(ckpt(run_dir, step).read_text())["extra"]["pipeline"]["generator"]


def test_kill_then_resume_with_other_num_engines(
    ray_cluster: object, model_path: str, tmp_path: Path
) -> None:
    run_dir, config = tmp_path / "run", tmp_path / "run.yaml"
    write_config(ray_cluster, model_path, run_dir, config, mode="sync")
    kill_at = random.Random().choice([2, 4, 6])
    proc = train(config)
    wait_for(ckpt(run_dir, kill_at), proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait()

    resumed = train(config, "distributed.num_engines=1", "--resume")
    _, err = resumed.communicate(timeout=400)
    assert resumed.returncode == 0, err.decode()[-3000:]
    check_log(run_dir, max_lag=0)
    rows = [r for r in read_rows(run_dir / "metrics.jsonl") if r["kind"] == "step"]
    assert rows[-1]["pool_engines_alive"] == 1.0 and rows[0]["pool_engines_alive"] == 2.0
    # Sync rounds of 2 prompts, no filters: the 8 steps consumed the pool's first 16 prompts in its
    # shuffled order, once each, whichever step the first process died after.
    final = pipeline_state(run_dir, MAX_STEPS)
    assert final["outstanding"] == []
    assert final["source"]["epoch"] == 1 and final["source"]["position"] == 2 * MAX_STEPS
    assert len(set(final["source"]["order"][: 2 * MAX_STEPS])) == 2 * MAX_STEPS
    assert final["source"]["order"] == pipeline_state(run_dir, kill_at)["source"]["order"]




def test_dead_trainer_rank_stops_the_run_then_resume(
    ray_cluster: object, model_path: str, tmp_path: Path
) -> None:
    run_dir, config = tmp_path / "run", tmp_path / "run.yaml"
    write_config(ray_cluster, model_path, run_dir, config, mode="pipeline")
    proc = train(config)
    wait_for(ckpt(run_dir, 2), proc)
    pids = ray_worker_pids("TrainerRankWorker")
    assert len(pids) == 2, pids
    os.kill(random.Random().choice(pids), signal.SIGKILL)
    start = time.monotonic()
    _, err = proc.communicate(timeout=120)
    text = err.decode()
    assert proc.returncode != 0 and re.search(r"trainer rank [01] died", text), text[-3000:]
    assert time.monotonic() - start < 30 + 60  # within distributed.timeout_s (and the shutdown)

    resumed = train(config, "--resume")
    _, err = resumed.communicate(timeout=400)
    assert resumed.returncode == 0, err.decode()[-3000:]
    check_log(run_dir, max_lag=2)
    final = pipeline_state(run_dir, MAX_STEPS)
    consumed = final["counters"]["groups_consumed"]
    assert consumed == 2 * MAX_STEPS


def test_lora_on_ray_verifies_every_sync_resumes_and_saves_a_peft_adapter(
    ray_cluster: object, model_path: str, tmp_path: Path
) -> None:
    """`model.lora.r=8` with 2 engine actors and 2 FSDP2 ranks, killed and resumed: every sync of
    the merged weights is fingerprint-verified on both engines, and the checkpoint's `adapter/` is
    a trained peft adapter that `PeftModel.from_pretrained` loads onto the base."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    run_dir, config = tmp_path / "run", tmp_path / "run.yaml"
    write_config(ray_cluster, model_path, run_dir, config, mode="pipeline", lora_r=8)
    proc = train(config)
    wait_for(ckpt(run_dir, 4), proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    resumed = train(config, "--resume")
    _, err = resumed.communicate(timeout=400)
    assert resumed.returncode == 0, err.decode()[-3000:]
    check_log(run_dir, max_lag=2)

    rows = [r for r in read_rows(run_dir / "metrics.jsonl") if r["kind"] == "step"]
    last = rows[-1]
    assert last["version"] >= MAX_STEPS - 2  # the steps trained (pipeline lag at most k = 2)
    assert last["weight_verify_unchecked"] == 0 and last["weight_verify_unverified_tensors"] == 0
    assert last["weight_verify_tensors"] > 0
    # every sync of the merged weights verified (counters carried across the resume)
    assert last["weight_verify_checks"] == last["weight_syncs"] >= MAX_STEPS - 4
    # and every one scored on the probe by both engines as by the trainer's ranks
    assert last["weight_verify_probe_checks"] == last["weight_syncs"]
    assert 0 <= last["weight_verify_probe_gap"] < 1e-3

    adapter = run_dir / "checkpoints" / f"step_{MAX_STEPS:06d}" / "adapter"
    assert json.loads((adapter / "adapter_config.json").read_text())["r"] == 8
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(model_path), adapter)
    lora_b = [p for n, p in model.named_parameters() if "lora_B" in n]
    assert lora_b and any(bool(torch.any(p != 0)) for p in lora_b)  # peft starts B at 0: it trained
