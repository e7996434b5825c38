"""FSDP2 on the tiny MoE with Keep Routing: a 2-rank step equals the 1-process step (routing
replayed on both, the routing metrics summed over ranks), to the FSDP step tests' tolerance."""

from __future__ import annotations

import copy

import pytest
from fsdp_cases import assert_close_tensors, assert_same_metrics, local_trainer, local_weights
from moe_jobs import moe_config, moe_groups, moe_step_job

from scalerl.distributed import spawn_ranks

pytestmark = pytest.mark.distributed


@pytest.mark.timeout(900)
@pytest.mark.parametrize("optim", [{}, {"micro_batch_tokens": 40}], ids=["padded", "packed"])
def test_two_rank_moe_step_with_keep_routing_equals_one_process(optim):
    cfg = moe_config(**optim)
    ranks = spawn_ranks(moe_step_job, 2, args=(cfg,), timeout_s=600)
    ref = local_trainer(moe_config(micro_batch_size=64))
    want = ref.step(copy.deepcopy(moe_groups()))
    assert want["routing_pairs"] > 0 and want["routing_mismatch"] > 0.1  # the sampler routed otherwise
    assert want["routing_unrecorded_pairs"] == 0
    for r in ranks:
        assert_same_metrics(r["metrics"], want, f"rank metrics ({optim})")
    assert_close_tensors(ranks[0]["weights"], local_weights(ref), f"weights ({optim})")
