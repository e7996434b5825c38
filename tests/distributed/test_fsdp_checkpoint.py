"""Sharded checkpoints: DCP save -> load -> training continues exactly as if never interrupted;
the HF export loads with `from_pretrained`; the local layout's completeness rule and `keep` hold;
a failed save fails on every rank; 2 ranks save, 1 rank resumes."""

from __future__ import annotations

import json

import pytest
import torch
from fsdp_cases import assert_close_tensors, assert_same_metrics, run_config
from fsdp_jobs import checkpoint_job, resume_job
from transformers import AutoModelForCausalLM, AutoTokenizer

from scalerl.distributed import spawn_ranks
from scalerl.training.checkpoint import latest_checkpoint, list_checkpoints

pytestmark = pytest.mark.distributed

CFG = run_config(kl_coef=0.02)  # the reference model is part of the run (it is not checkpointed: frozen)


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> dict:
    run_dir = tmp_path_factory.mktemp("sharded-run")
    ranks = spawn_ranks(checkpoint_job, 2, args=(CFG, str(run_dir)), timeout_s=120)
    return {"dir": run_dir, "rank0": ranks[0], "rank1": ranks[1]}


def test_resumed_run_continues_identically(run):
    for r in ("rank0", "rank1"):
        out = run[r]
        assert out["loaded"]["step"] == 2 and out["loaded"]["version"] == 2
        assert out["loaded"]["extra"] == {"pipeline": {"cursor": 17}}
        for resumed, continued in zip(out["resumed"], out["continued"], strict=True):
            assert_same_metrics(resumed, continued, f"{r} resumed step", rel=0.0, abs_=0.0)
    out = run["rank0"]
    assert_close_tensors(out["weights_after_load"], out["weights_at_2"], "loaded weights", rtol=0, atol=0)
    assert_close_tensors(out["weights_resumed_4"], out["weights_at_4"], "weights at step 4", rtol=0, atol=0)


def test_layout_is_the_local_one_with_dcp_shards(run):
    path = latest_checkpoint(run["dir"])
    assert path is not None and path.name == "step_000006"
    ckpt = run["dir"] / "checkpoints" / "step_000002"
    assert run["rank0"]["path"] == str(ckpt)
    meta = json.loads((ckpt / "state.json").read_text())
    assert meta["step"] == 2 and meta["extra"] == {"pipeline": {"cursor": 17}}
    assert meta["trainer"]["version"] == 2
    assert meta["trainer"]["sharding"] == {"world_size": 2, "optimizer_saved": True}
    assert (ckpt / "dcp" / ".metadata").is_file()
    assert sorted(p.name for p in (ckpt / "rng").iterdir()) == ["rank_00000.pt", "rank_00001.pt"]
    assert (ckpt / "scheduler.pt").is_file()


def test_hf_export_loads_with_from_pretrained(run):
    ckpt = run["dir"] / "checkpoints" / "step_000002"
    model = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(ckpt)
    assert tok.decode(tok.encode("1+2")) == "1+2"
    assert_close_tensors(model.state_dict(), run["rank0"]["weights_at_2"], "HF export", rtol=0, atol=0)


def test_failed_save_fails_on_every_rank_and_leaves_no_checkpoint(run):
    for r in ("rank0", "rank1"):
        message = run[r]["failed_save"]
        assert message is not None and message.startswith("CheckpointRankError")
        assert "rank(s) [1]" in message and "disk full (injected)" in message
    assert run["rank0"]["after_failed_save"] == ["step_000002"]
    # State that is not JSON is refused on every rank before anything is written.
    for r in ("rank0", "rank1"):
        assert "checkpoint state must be JSON" in (run[r]["bad_extra"] or "")
    # The next save works; keep=2 pruned nothing else.
    assert run["rank0"]["after_next_save"] == ["step_000002", "step_000006"]
    assert [s for s, _ in list_checkpoints(run["dir"])] == [2, 6]


def test_two_rank_checkpoint_resumes_on_one_rank(run):
    ckpt = run["dir"] / "checkpoints" / "step_000002"
    (out,) = spawn_ranks(resume_job, 1, args=(CFG, str(ckpt)), timeout_s=120)
    assert out["step"] == 2 and out["version"] == 4
    for got, want in zip(out["metrics"], run["rank0"]["continued"], strict=True):
        assert_same_metrics(got, want, "1-rank resume")
    assert_close_tensors(out["weights"], run["rank0"]["weights_at_4"], "1-rank resume weights")
