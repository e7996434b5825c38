"""The FSDP2 MoE case (test_fsdp_moe.py): groups sampled by the embedded engine from an MoE with
other weights than the trainer's (so that the recorded routing disagrees with the trainer's own),
and the job the spawned ranks run. Deterministic from its arguments, on every process."""

from __future__ import annotations

import copy
from typing import Any

import torch

from scalerl.assembly.sections import trainer_settings
from scalerl.config import AlgorithmConfig, ModelConfig, OptimConfig, RunConfig, TinyModelConfig
from scalerl.data.records import PromptRecord
from scalerl.distributed import ProcessGroupSpec, ShardedTrainerRank
from scalerl.rollout.embedded import EmbeddedEngine
from scalerl.rollout.protocol import GenerationRequest, SamplingParams
from scalerl.training.batch import ScoredGroup
from scalerl.training.policy import load_policy

MOE = TinyModelConfig(hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=64,
                      max_position_embeddings=128, num_experts=8, num_experts_per_tok=2,
                      moe_intermediate_size=16, shared_expert_intermediate_size=16)


def moe_config(**optim: Any) -> RunConfig:
    return RunConfig(model=ModelConfig(tiny=MOE, init_seed=0),
                     algorithm=AlgorithmConfig(keep_routing=True, recompute_old_logprobs=True),
                     optim=OptimConfig(**({"micro_batch_size": 2} | optim)), generation={"max_new_tokens": 8})


@torch.no_grad()
def moe_groups(n_groups: int = 4, n: int = 4) -> list[ScoredGroup]:
    sampler = load_policy(ModelConfig(tiny=MOE, init_seed=1), device="cpu").model
    engine = EmbeddedEngine(sampler, max_batch_size=8, fp32_lm_head=True, seed=0)
    g = torch.Generator().manual_seed(0)
    requests = [GenerationRequest(f"p{i}", torch.randint(12, 100, (3 + i,), generator=g).tolist(),
                                  SamplingParams(n=n, max_new_tokens=8, seed=i)) for i in range(n_groups)]
    done = engine.generate(requests)
    return [ScoredGroup(PromptRecord(id=f"p{i}", task="toy", prompt="x"),
                        [c for c in done if c.request_id == f"p{i}"], [float(k % 2) for k in range(n)])
            for i in range(n_groups)]


def moe_step_job(spec: ProcessGroupSpec, cfg: RunConfig) -> dict[str, Any]:
    rank = ShardedTrainerRank(cfg.model, trainer_settings(cfg), spec)
    metrics = rank.step(copy.deepcopy(moe_groups()))
    weights = rank.full_state_dict() or {}  # a collective: every rank calls it, rank 0 gets it
    return {"metrics": metrics, "weights": weights}
