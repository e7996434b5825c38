"""The same step on CUDA as on CPU (skipped without a GPU)."""

from __future__ import annotations

import copy

import pytest
import torch

from scalerl.config import AlgorithmConfig, OptimConfig
from scalerl.training.batch import collate
from scalerl.training.trainer import Trainer


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_cuda_step_matches_cpu(make_policy, make_groups, dtype, tmp_path):
    cpu = make_policy(dtype=dtype)
    groups = make_groups(cpu, n_groups=3, n=4)
    gpu = copy.deepcopy(cpu)
    gpu.model.to("cuda")
    algo = AlgorithmConfig(kl_coef=0.01, entropy_coef=0.001, recompute_old_logprobs=True)
    t_cpu = Trainer(cpu, algo, OptimConfig(micro_batch_size=5))
    t_gpu = Trainer(gpu, algo, OptimConfig(micro_batch_size=5))
    batch = collate(groups, cpu.pad_token_id)
    lp_cpu, lp_gpu = t_cpu.compute_logprobs(batch), t_gpu.compute_logprobs(batch)
    assert lp_gpu.device.type == "cpu"
    tol = 1e-4 if dtype == "float32" else 5e-2
    torch.testing.assert_close(lp_gpu, lp_cpu, atol=tol, rtol=0)
    m_cpu, m_gpu = t_cpu.step(groups), t_gpu.step(groups)
    assert m_gpu["skipped_nonfinite"] == 0.0 and t_gpu.version == 1
    assert m_gpu["loss"] == pytest.approx(m_cpu["loss"], abs=tol)
    path = t_gpu.save(tmp_path, step=1)
    t_gpu.load(path)
    assert all(v.device.type == "cpu" for v in t_gpu.weights_for_engine().values())
