"""LoRA on FSDP2 ranks: a 2-rank LoRA step is the 1-process LoRA step (loss, metrics, adapter
gradients and weights), the engines get the merged weights `W + (alpha / r) B A` the local
trainer sends (streamed bucket by bucket and gathered whole, fingerprints included), and a
checkpoint (adapter + optimizer in DCP, `adapter/` in peft's format) resumes exactly.

Tolerance as tests/distributed/test_fsdp_step.py: float32 sums in another order, 1e-5 relative.
"""

from __future__ import annotations

import json

import pytest
import torch
from fsdp_cases import assert_close_tensors, assert_same_metrics, run_config
from fsdp_jobs import run_ops
from lora_jobs import lora_job

from scalerl.assembly.sections import trainer_settings
from scalerl.distributed import spawn_ranks
from scalerl.models.lora import merged_state_dict
from scalerl.rollout.fingerprint import same, state_fingerprints
from scalerl.training.checkpoint import ADAPTER_DIR, load_adapter_weights
from scalerl.training.policy import apply_lora, load_policy
from scalerl.training.trainer import Trainer

pytestmark = pytest.mark.distributed

# KL to the base (adapter disabled) and TIS with recomputed pi_old: every pass of the step.
CFG = run_config(model={"lora": {"r": 8, "alpha": 16.0}}, kl_coef=0.05, eps_max=1.5,
                 tis={"enabled": True, "cap": 1.5}, recompute_old_logprobs=True,
                 optim={"lr": 1e-3}).model_copy(update={"seed": 5})
OPS = [("grad", 0), ("step", 0), ("grad", 1), ("step", 1), ("step", 2)]


def local_lora_trainer(seed: int = CFG.seed) -> Trainer:
    policy = apply_lora(load_policy(CFG.model, device="cpu"), CFG.model.lora, seed=seed)
    return Trainer.from_settings(trainer_settings(CFG), policy)


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> dict:
    run_dir = tmp_path_factory.mktemp("lora-run")
    ranks = spawn_ranks(lora_job, 2, args=(CFG, OPS, str(run_dir)), timeout_s=120)
    local = local_lora_trainer()
    want = run_ops(local, OPS, rank0=True)
    return {"dir": run_dir, "rank0": ranks[0], "rank1": ranks[1], "want": want,
            "merged": merged_state_dict(local.policy.model), "local": local}


def test_two_rank_lora_step_equals_the_one_process_lora_step(run):
    got = run["rank0"]["ops"]
    for (kind, number), (m, tensors), (rm, rtensors) in zip(OPS, got, run["want"], strict=True):
        what = f"lora {kind}({number})"
        assert_same_metrics(m, rm, what)
        assert_close_tensors(tensors, rtensors, what)
        if kind == "grad":  # only the adapter has gradients
            assert tensors and all(".lora_A." in n or ".lora_B." in n for n in tensors), what
    assert got[3][0]["kl"] > 0  # after a step the adapter moved the policy off its base
    for (m1, _), (m0, _) in zip(run["rank1"]["ops"], got, strict=True):
        assert_same_metrics(m1, m0, "lora rank 1 vs rank 0", rel=0.0, abs_=0.0)
    # B moved off zero, the base did not move.
    final, initial = got[-1][1], local_lora_trainer().policy.model.state_dict()
    b = [n for n in final if ".lora_B." in n]
    assert b and all(float(final[n].abs().max()) > 0 for n in b)
    frozen = [n for n in final if ".lora_" not in n]
    assert all(torch.equal(final[n], initial[n]) for n in frozen)


def test_only_the_adapter_is_optimized_and_everything_is_sharded(run):
    from scalerl.telemetry.compute import flop_params

    local = run["local"]
    adapter = sum(p.numel() for p in local.policy.model.parameters() if p.requires_grad)
    n = flop_params(local.policy.model)
    n_adapter = flop_params(local.policy.model, trainable_only=True)
    for r in ("rank0", "rank1"):
        assert run[r]["optimizer_params"] == adapter  # the global numel of the sharded adapter
        assert run[r]["frozen_dtensors"] > 0 and run[r]["adapter_dtensors"] > 0
        # The rank's meter prices LoRA as the local run's: 4N + 2 N_adapter per trained token
        # (N counted on the sharded model: global sizes), generation at the base's N.
        assert run[r]["info"] == (n, n_adapter, 4 * n + 2 * n_adapter, n - n_adapter)


def test_engines_get_the_local_merge_streamed_and_gathered(run):
    want = run["merged"]
    r0 = run["rank0"]
    assert r0["buckets"] > 2
    assert not any(".lora_" in n or ".base_layer." in n for n in r0["streamed"])
    assert_close_tensors(r0["streamed"], want, "streamed merged weights")
    assert_close_tensors(r0["engine_state"], want, "gathered merged weights")
    assert run["rank1"]["streamed"] is None and run["rank1"]["engine_state"] is None
    # The merge really adds the adapter: the merged weights are not the base's.
    base = load_policy(CFG.model, device="cpu").model.state_dict()
    moved = [n for n in want if not torch.equal(want[n], base[n])]
    assert moved and all("proj" in n for n in moved)
    # The sync's fingerprints (what rank 0 reports it sent, checked against each engine) are those
    # of the merged tensors it broadcast; an engine left with the unmerged base (the adapter never
    # reached it: verl#7495) fails them on every adapted layer and only there.
    sent = r0["stream_prints"]
    held = state_fingerprints(r0["streamed"], torch.float32)
    assert set(sent) == set(held) == set(want)
    assert all(same(sent[n], held[n]) for n in sent)
    stale = state_fingerprints(base, torch.float32)
    assert {n for n in sent if not same(sent[n], stale[n])} == set(moved)


def test_checkpoint_holds_the_adapter_and_resumes_exactly(run):
    for r in ("rank0", "rank1"):
        out = run[r]
        assert out["loaded"] == {"step": len([o for o in OPS if o[0] == "step"]), "version": 3}
        assert_same_metrics(out["resumed"], out["continued"], f"{r} resumed step", rel=0.0, abs_=0.0)
    out = run["rank0"]
    assert_close_tensors(out["weights_resumed"], out["weights_continued"], "resumed weights", rtol=0, atol=0)
    ckpt = run["dir"] / "checkpoints" / "step_000003"
    assert out["path"] == str(ckpt)
    assert (ckpt / ADAPTER_DIR / "adapter_config.json").is_file()
    assert not (ckpt / "model.safetensors").exists()
    config = json.loads((ckpt / ADAPTER_DIR / "adapter_config.json").read_text())
    assert config["r"] == 8 and config["lora_alpha"] == 16.0
    # The peft adapter loads into a fresh local LoRA model and gives the sharded run's weights.
    fresh = local_lora_trainer(seed=CFG.seed + 7)
    load_adapter_weights(fresh.policy.model, ckpt)
    want = run["rank0"]["ops"][-1][1]
    assert_close_tensors(dict(fresh.policy.model.state_dict()), want, "peft adapter", rtol=0, atol=0)
