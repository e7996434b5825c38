"""A 2-rank FSDP2 step is the 1-process `Trainer.step`: loss, gradients, metrics and weights.

One spawn of 2 gloo ranks runs every case (module fixture); the 1-process references run here.
Tolerance: float32 sums taken in another order, so 1e-5 relative (1e-6 absolute) on every
gradient element and metric, as the micro-batch invariance test of the local trainer.
"""

from __future__ import annotations

import math

import pytest
import torch
from fsdp_cases import assert_close_tensors, assert_same_metrics, run_config
from fsdp_jobs import run_ops, step_suite_job

from scalerl.assembly.sections import trainer_settings
from scalerl.distributed import spawn_ranks
from scalerl.training.policy import load_policy

pytestmark = pytest.mark.distributed

LOSSES = ("cispo", "grpo", "gspo")
AGGREGATIONS = ("prompt", "sample", "token", "constant")


def _objective(loss: str, aggregation: str, tis: bool, **kw: object) -> dict[str, object]:
    return dict(loss_type=loss, aggregation=aggregation, eps_max=1.5, entropy_coef=0.01,
                tis={"enabled": tis, "cap": 1.5}, recompute_old_logprobs=tis, **kw)


def _cases() -> dict[str, tuple]:
    """name -> (sharded config, reference config, ops)."""
    cases = {}
    for loss in LOSSES:
        for agg in AGGREGATIONS:
            for tis in (False, True):
                cfg = run_config(**_objective(loss, agg, tis))
                cases[f"{loss}-{agg}-tis{int(tis)}"] = (cfg, cfg, [("grad", 0), ("step", 0)])
    # Micro-batch size inside a rank: 1, 7 (rank 0 has 7 rows, rank 1 has 8: one pass is padding),
    # everything at once; the reference runs the whole batch as one micro-batch.
    for mbs, (loss, agg) in {1: ("cispo", "prompt"), 7: ("gspo", "sample"), 64: ("grpo", "token")}.items():
        ref = run_config(**_objective(loss, agg, False), optim={"micro_batch_size": 64})
        cfg = run_config(**_objective(loss, agg, False), optim={"micro_batch_size": mbs})
        cases[f"mbs{mbs}-{loss}-{agg}"] = (cfg, ref, [("grad", 0), ("step", 0)])
    # Token budgets on ranks (balanced by tokens), packed and padded, against one padded pass.
    for name, optim in {"tokens30-packed": {"micro_batch_tokens": 30},
                        "tokens1-packed": {"micro_batch_tokens": 1},
                        "tokens60-padded": {"micro_batch_tokens": 60, "packing": False}}.items():
        ref = run_config(**_objective("cispo", "prompt", False), optim={"micro_batch_size": 64})
        cfg = run_config(**_objective("cispo", "prompt", False), optim=optim)
        cases[name] = (cfg, ref, [("grad", 0), ("step", 0)])
    # KL to the (sharded) reference model: after one step the policy differs from it.
    for name, kw in {"kl-loss": {"kl_coef": 0.05}, "kl-reward": {"kl_coef": 0.05, "kl_in_reward": True},
                     "kl-unbiased": {"kl_coef": 0.05, "kl_estimator": "unbiased_k3"}}.items():
        cfg = run_config(**_objective("cispo", "prompt", False, **kw))
        cases[name] = (cfg, cfg, [("step", 0), ("grad", 1), ("step", 1)])
    # Gradient checkpointing (sharded) against the plain 1-process step.
    ref = run_config(**_objective("grpo", "prompt", False))
    gc = run_config(model={"gradient_checkpointing": True}, **_objective("grpo", "prompt", False))
    cases["grad-checkpointing"] = (gc, ref, [("grad", 0), ("step", 0), ("step", 1)])
    # The LM head in the model dtype instead of float32.
    plain_head = run_config(model={"fp32_lm_head": False}, **_objective("cispo", "prompt", False))
    cases["model-dtype-head"] = (plain_head, plain_head, [("grad", 0), ("step", 0)])
    # bf16 autocast with the FP32 head (compared with a bf16 tolerance below).
    bf16 = run_config(model={"dtype": "bfloat16"}, **_objective("cispo", "prompt", False))
    cases["bf16-fp32-head"] = (bf16, bf16, [("grad", 0), ("step", 0)])
    # Three AdamW steps (defaults: cispo, prompt aggregation), a zero-variance group in batch 1.
    default = run_config()
    cases["three-steps"] = (default, default, [("step", 0), ("step", 1), ("step", 2)])
    return cases


CASES = _cases()
BF16 = {"bf16-fp32-head"}
# Every pass the meter counts: training, recomputed pi_old, KL reference.
METER_CFG = run_config(**_objective("cispo", "prompt", True, kl_coef=0.05))


@pytest.fixture(scope="module")
def suite() -> dict:
    sharded = {name: (cfg, ops) for name, (cfg, _, ops) in CASES.items()}
    ranks = spawn_ranks(step_suite_job, 2, args=(sharded, run_config(), METER_CFG), timeout_s=120)
    return {"rank0": ranks[0], "rank1": ranks[1]}


@pytest.fixture(scope="module")
def references() -> dict:
    from fsdp_cases import local_trainer

    return {name: run_ops(local_trainer(ref), ops, rank0=True) for name, (_, ref, ops) in CASES.items()}


@pytest.mark.parametrize("name", list(CASES))
def test_two_rank_step_equals_one_process_step(suite, references, name):
    got, want = suite["rank0"]["cases"][name], references[name]
    # bf16 rounding depends on the padded shapes: 1-process micro-batch sizes 2 vs 64 already
    # differ by 3e-4 (loss, relative) and 2e-4 (gradients, absolute); sharded vs 1-process: 4e-5, 9e-5.
    tol = {"rel": 2e-3, "abs_": 1e-4} if name in BF16 else {}
    ttol = {"rtol": 2e-2, "atol": 5e-4} if name in BF16 else {}
    ops = CASES[name][2]
    for (kind, number), (m, tensors), (rm, rtensors) in zip(ops, got, want, strict=True):
        what = f"{name} {kind}({number})"
        assert_same_metrics(m, rm, what, **tol)
        assert_close_tensors(tensors, rtensors, what, **ttol)
    if name.startswith("kl-"):
        assert got[1][0]["kl"] > 0 or name == "kl-reward"
    if name == "kl-reward":
        assert math.isnan(got[1][0]["kl"])


@pytest.mark.parametrize("name", list(CASES))
def test_every_rank_returns_the_global_metrics(suite, name):
    for (m0, _), (m1, _) in zip(suite["rank0"]["cases"][name], suite["rank1"]["cases"][name], strict=True):
        assert_same_metrics(m1, m0, f"{name} rank 1 vs rank 0", rel=0.0, abs_=0.0)


def test_full_state_dict_loads_strictly_into_hf_model_and_engine(suite):
    from fsdp_cases import TINY

    from scalerl.config import ModelConfig
    from scalerl.rollout.embedded import EmbeddedEngine

    state = suite["rank0"]["cases"]["three-steps"][-1][1]
    assert all(t.device.type == "cpu" and not hasattr(t, "placements") for t in state.values())
    assert suite["rank1"]["cases"]["three-steps"][-1][1] == {}
    plain = load_policy(ModelConfig(tiny=TINY, init_seed=0), device="cpu").model
    plain.load_state_dict(state, strict=True)
    for name, value in plain.state_dict().items():
        torch.testing.assert_close(value, state[name], rtol=0, atol=0)
    engine = EmbeddedEngine(load_policy(ModelConfig(tiny=TINY, init_seed=1), device="cpu").model)
    engine.update_weights(state, version=3)
    assert engine.version == 3
    for name, value in engine.model.state_dict().items():
        torch.testing.assert_close(value, state[name], rtol=0, atol=0)


def test_a_streamed_sync_gathers_bucket_by_bucket_what_the_full_state_dict_holds(suite):
    from scalerl.distributed.weights import flatten_bucket

    r0, r1 = suite["rank0"]["stream"], suite["rank1"]["stream"]
    full = r0["full"]
    assert r0["sharded_names"] == sorted(full) and r0["dtensors"] > 0  # the same names, from the shards
    assert len(r0["buckets"]) > 2 and [n for b in r0["buckets"] for n, _ in b.entries] == list(full)
    for meta, flat in zip(r0["buckets"], r0["flats"], strict=True):
        torch.testing.assert_close(flat, flatten_bucket(full, meta, torch.device("cpu")), rtol=0, atol=0)
    assert r1["flats"] == [None] * len(r0["buckets"])  # rank 1 only takes part in the all-gathers
    # A broadcast that fails half-way: rank 0 raises once every bucket is gathered; rank 1 finishes,
    # and both ranks train the next step in step (equal global metrics).
    assert r0["failed"] == "engine 1 died" and r0["sent"] == 1 and r1["failed"] is None
    assert_same_metrics(r1["after"], r0["after"], "step after a failed stream", rel=0.0, abs_=0.0)


def test_nonfinite_on_one_rank_skips_the_step_on_every_rank_and_batches_must_match(suite):
    for r in (0, 1):
        out = suite[f"rank{r}"]["nonfinite"]
        assert out["skipped"]["skipped_nonfinite"] == 1.0 and math.isnan(out["skipped"]["loss"])
        assert out["error"] == "rank 1: non-finite policy log-probs"
        assert out["good"]["skipped_nonfinite"] == 0.0
        assert out["bad_steps"] == 1 and out["version"] == 2
        assert out["mismatch"] is not None and "ranks [1] were given a different batch" in out["mismatch"]
        assert out["after_mismatch"]["skipped_nonfinite"] == 0.0
    before, after = suite["rank0"]["nonfinite"]["before"], suite["rank0"]["nonfinite"]["after_skip"]
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_a_rank_meter_counts_the_whole_step(suite):
    from fsdp_jobs import batch, meter_counts

    from scalerl.telemetry.compute import ComputeMeter
    from scalerl.training.trainer import Trainer

    policy = load_policy(METER_CFG.model, device="cpu")
    local = Trainer.from_settings(trainer_settings(METER_CFG), policy, ComputeMeter(1000))
    local.step(batch(0))
    local.step(batch(1))
    want = meter_counts(local)
    assert want["logprob_tokens"] > want["trained_tokens"] > 0
    assert suite["rank0"]["meter"] == want and suite["rank1"]["meter"] == want
